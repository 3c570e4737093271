//! `flowlane rfc2544`: throughput, latency, frame loss and back-to-back per frame size.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;
use flowlane_tools::blast;
use flowlane_tools::rfc2544::{
    self, Endpoint, LabRun, Rfc2544Config, Rfc2544Event, Rfc2544Report, SizeSpec, Tests,
    TrialRecord,
};

use crate::args::{parse_duration, parse_imix, parse_rate, parse_size_list, print_json};
use crate::args::{Imix, SizeList};
use crate::live::{stop_on_signals, Log};
use crate::{CmdResult, Failure};
use flowlane_tools::doctor::RunDev;

mod page;

/// RFC 2544 §26 against a DUT: throughput (NDR, PDR), latency, frame loss rate, back-to-back.
///
/// For each frame size (64 128 256 512 1024 1280 1518 bytes with FCS, as RFC 2544 counts
/// them), the tester first measures its own ceiling: frames sent as fast as it can into a veth
/// pair made for the purpose, whose far end drops every frame. Without --line-rate that
/// ceiling is the maximum rate (on veth there is no line rate), and the report says so. Then:
///
///   throughput   the highest rate with no loss (NDR) and with at most --loss-tolerance (PDR):
///                a search aimed at what the DUT forwarded, halving where that does not help,
///                to --resolution, each trial --trial-secs, a confirming trial of
///                --confirm-secs at the answer, --pause between trials, learning frames first
///   latency      --latency-trials trials at the NDR rate: p50/p99/p99.9/max of the one-way
///                latency of every frame (the generator stamps each one), and their means
///   loss         from 100 % of the maximum rate down in 10 % steps, until two trials in a
///                row lose nothing
///   b2b          the longest burst at the maximum rate with no loss, --b2b-trials times, and
///                RFC 9004's implied and corrected DUT buffer time
///
/// The generator is blast's live-frames mode on --cpu (an XDP program that stamps, paces and
/// sends every frame; IMIX uses AF_XDP), the receiver a sink on the receiving interface
/// (AF_XDP: frames taken in XDP, so that on veth, where the receive path runs on the DUT's
/// CPU, the receiver costs the DUT little; --rx-backend af-packet otherwise); both run in
/// this process. After each trial's last frame the sink counts on until nothing has arrived
/// for 0.1 s (at most --drain), so frames a DUT still held are counted, not lost. A trial
/// that did not get its rate, ran within 80 % of the ceiling, or whose sink overflowed is
/// marked tester-limited: its rate is a lower bound, never the DUT's figure. Frames the DUT's
/// queue refused count as the DUT's loss.
///
/// Where: --lab NAME uses the line lab (`flowlane lab up --topology line`): frames leave
/// the generator's flgen (in NAME-gen) for the sink's address and are received on the
/// sink's flsink (in NAME-sink); the DUT is the kernel (`--kernel route`) or `flowlane
/// forward` in NAME-dut. Or cable it as a hardware tester is: --tx-dev A --rx-dev B --to IP
/// (optionally in namespaces). In a lab that steers with software RSS (the default) the
/// DUT's per-CPU queue (`lab up --cpu-queue`, 16 384 frames) is part of what it buffers: a
/// 2 s trial a little above its rate can pass. Longer trials, or a shorter queue, tell what it
/// carries for good. On a VM a `tc tbf` on the DUT re-arms a timer for every frame that
/// waits, which caps what the DUT takes in (~52 k frames/s here; BENCHMARKS.md).
///
/// Exit code: 0 the run completed; 1 it could not (or a size found no rate at all); 2 usage.
///
/// Examples:
///   flowlane lab up --topology line --kernel route
///   flowlane rfc2544 --lab flowlane
///   flowlane rfc2544 --lab flowlane --tests throughput --sizes 64,1518 --html report.html
///   flowlane rfc2544 --tx-dev enp1s0f0 --rx-dev enp1s0f1 --to 198.18.1.2 --line-rate 10G
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct Rfc2544Args {
    /// The line lab to test in (the generator's flgen in NAME-gen, the sink's flsink in
    /// NAME-sink).
    #[arg(long, conflicts_with_all = ["tx_dev", "rx_dev"])]
    lab: Option<String>,

    /// Generator interface (without --lab).
    #[arg(long, requires_all = ["rx_dev", "to"])]
    tx_dev: Option<String>,

    /// Receiving interface (without --lab).
    #[arg(long, requires = "tx_dev")]
    rx_dev: Option<String>,

    /// Network namespace of --tx-dev (`ip netns` name).
    #[arg(long, requires = "tx_dev")]
    tx_netns: Option<String>,

    /// Network namespace of --rx-dev.
    #[arg(long, requires = "tx_dev")]
    rx_netns: Option<String>,

    /// Destination address (through the DUT), IP or IP:PORT (port 9 by default). With
    /// --lab: the sink's address.
    #[arg(long)]
    to: Option<String>,

    /// IPv6 (with --lab: the sink's IPv6 address).
    #[arg(long)]
    ipv6: bool,

    /// Next hop's MAC. Default: the neighbour table's entry on the generator's interface.
    #[arg(long, value_parser = blast::parse_mac)]
    dst_mac: Option<[u8; 6]>,

    /// Tests to run, comma-separated: throughput, latency, loss, b2b (default: all four),
    /// and probe-under-flood (not RFC 2544's; asked by name, with --flood-to).
    #[arg(long, value_delimiter = ',', value_enum)]
    tests: Vec<TestArg>,

    /// probe-under-flood: the flood's destinations, PREFIX:PORTS as `blast --to` takes them
    /// (198.18.128.0/17:9000-9015) — addresses the DUT routes out towards --rx-dev, e.g. a
    /// large table via the sink. Each flood frame goes to a random one (AF_XDP, one thread on
    /// --cpu) while a probe flow sends to --to at --probe-rate (AF_PACKET, the same CPU); the
    /// sink times the probe alone. One trial of --confirm-secs per flood rate and size.
    #[arg(long, value_parser = crate::args::parse_dest_ranges)]
    flood_to: Option<crate::args::DestRanges>,

    /// probe-under-flood: flood rates, comma-separated: 0 (the probe alone: the baseline),
    /// a rate (500k), or max (as fast as the flood's generator goes). Default: 0,max.
    #[arg(long, value_delimiter = ',', value_parser = parse_flood_rate)]
    flood_rates: Vec<FloodRate>,

    /// probe-under-flood: flows of the flood (each moves through the destinations).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65534))]
    flood_flows: u32,

    /// probe-under-flood: the probe's rate, frames per second.
    #[arg(long, default_value = "1000", value_parser = crate::args::parse_rate)]
    probe_rate: crate::args::Rate,

    /// Frame sizes with FCS. Default: 64,128,256,512,1024,1280,1518 (IPv6: 82 for 64, the
    /// smallest frame that carries IPv6, UDP and flowlane's header). Up to 9018 where the
    /// interfaces carry it (MTU 9000; frames above a page go out through an AF_PACKET ring,
    /// and the receiver must be --rx-backend af-packet).
    #[arg(long, value_parser = parse_size_list, conflicts_with = "imix")]
    sizes: Option<SizeList>,

    /// One IMIX instead of sizes: SIZE:WEIGHT pairs with FCS, e.g. 64:7,594:4,1518:1.
    #[arg(long, value_parser = parse_imix)]
    imix: Option<Imix>,

    /// Flows (source ports); with --per-queue, placed on the DUT's RSS queues instead.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    flows: u32,

    /// This many flows on each of the DUT's RSS queues, chosen by the picker (no other
    /// tester places flows on queues): with --lab by the lab's key and table; with
    /// --tx-dev/--rx-dev by the DUT's RSS, read with --rss-dev or given with --reta <(ssh DUT
    /// ethtool -x IF) or --key/--queues. Without it, in a lab with software RSS and one flow,
    /// that flow goes to a queue whose CPU is not --cpu (the generator's). On a small machine,
    /// --pick-queues keeps the DUT's forwarding off the generator's CPU (on veth a queue's work
    /// runs on its CPU).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    per_queue: Option<u64>,

    #[command(flatten)]
    place: crate::args::PlaceArgs,

    /// The link's line rate (10G, 25Gbit, …): the maximum rate per size. Default: the
    /// generator's measured maximum (veth has no line rate).
    #[arg(long, value_parser = parse_line_rate)]
    line_rate: Option<f64>,

    /// Seconds per search trial.
    #[arg(long, value_parser = parse_duration, default_value_t = 2.0)]
    trial_secs: f64,

    /// Seconds of the confirming, latency trials.
    #[arg(long, value_parser = parse_duration, default_value_t = 10.0)]
    confirm_secs: f64,

    /// Seconds between trials.
    #[arg(long, value_parser = parse_duration, default_value_t = 1.0)]
    pause: f64,

    /// At most this many seconds of counting after each trial's last frame, for frames the DUT
    /// still holds (RFC 2544 §23 waits 2 s); the wait ends once nothing has arrived for 0.1 s,
    /// so a DUT with shallow queues costs ~0.1 s a trial. Each trial reports how long it took
    /// (drained_s)
    #[arg(long, value_parser = parse_duration, default_value_t = 2.0)]
    drain: f64,

    /// Learning frames before each size's first trial (RFC 2544 §23).
    #[arg(long, default_value_t = 100)]
    learning_frames: u64,

    /// Search resolution, percent: the search ends when the highest rate that passed is
    /// within this share below the lowest that failed (not a share of the maximum: a DUT of
    /// 30 000 frames/s behind a 7 M/s generator is found to 300).
    #[arg(long, default_value_t = 1.0)]
    resolution: f64,

    /// The PDR's loss tolerance, percent.
    #[arg(long, default_value_t = 0.5)]
    loss_tolerance: f64,

    /// Most search trials per size.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(2..=100))]
    max_trials: u32,

    /// Search by halving only (as TRex's NDR bench and most testers do), not aimed at the
    /// rate the DUT forwarded in the last failed trial: more trials, for comparison.
    #[arg(long)]
    halving_only: bool,

    /// Latency trials per size.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    latency_trials: u32,

    /// Back-to-back searches per size.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    b2b_trials: u32,

    /// The longest burst tried, in seconds at the maximum rate.
    #[arg(long, value_parser = parse_duration, default_value_t = 2.0)]
    b2b_max_secs: f64,

    /// The generator's CPU.
    #[arg(long, default_value_t = 0)]
    cpu: usize,

    /// The sink's CPU. Default: the last usable one.
    #[arg(long)]
    sink_cpu: Option<usize>,

    /// Most frames the paced generator sends at once to catch up after a stall.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1024))]
    burst: u32,

    /// How the sink reads what the DUT forwarded: af-xdp (frames taken in XDP, no socket
    /// buffer made) or af-packet (a copy of every frame; the kernel's own path still runs —
    /// for a receiving interface whose XDP hook is taken). On veth the receive path runs on
    /// the DUT's CPU, so what the receiver costs is lost to the DUT: on the line lab the
    /// kernel DUT's zero-loss rate reads ~1.5× higher with af-xdp.
    #[arg(long, value_enum, default_value_t = crate::cmd_sink::BackendArg::AfXdp)]
    rx_backend: crate::cmd_sink::BackendArg,

    /// Also write the trials as CSV to this file.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,

    /// Also write a self-contained HTML report with charts to this file.
    #[arg(long)]
    html: Option<std::path::PathBuf>,

    /// No line per trial.
    #[arg(long)]
    quiet: bool,

    /// The report as JSON on stdout (trial lines go to stderr); its schema is
    /// docs/rfc2544.schema.json.
    #[arg(long, short = 'J')]
    json: bool,
}

/// A line rate in bits per second: `10G`, `25Gbit`, `100M`, `1e9` (a bare number is bits).
fn parse_line_rate(s: &str) -> Result<f64, String> {
    let t = s.trim().to_ascii_lowercase();
    if t.ends_with("pps") {
        return Err(format!(
            "`{s}`: --line-rate is a bit rate (10G, 25Gbit), not packets per second"
        ));
    }
    let with_unit = if t.ends_with("bit") || t.ends_with("bps") {
        t
    } else {
        format!("{t}bit")
    };
    match parse_rate(&with_unit)? {
        blast::Rate::Bps(b) => Ok(b),
        blast::Rate::Pps(_) => Err(format!("`{s}` is not a bit rate")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TestArg {
    Throughput,
    Latency,
    Loss,
    B2b,
    ProbeUnderFlood,
}

/// A flood rate: `None` unpaced (`max`), else frames per second (0: no flood).
#[derive(Debug, Clone, Copy, PartialEq)]
struct FloodRate(Option<f64>);

fn parse_flood_rate(s: &str) -> Result<FloodRate, String> {
    if s.trim() == "max" {
        return Ok(FloodRate(None));
    }
    if s.trim() == "0" {
        return Ok(FloodRate(Some(0.0)));
    }
    match crate::args::parse_rate(s)? {
        crate::args::Rate::Pps(p) => Ok(FloodRate(Some(p))),
        _ => Err(format!(
            "`{s}`: a flood rate is frames per second (500k), 0 or max"
        )),
    }
}

fn config(a: &Rfc2544Args) -> Result<Rfc2544Config, Failure> {
    let port_of = |s: &str| -> Result<std::net::SocketAddr, Failure> {
        let e = crate::args::parse_endpoint(s).map_err(|e| Failure::usage(anyhow::anyhow!(e)))?;
        Ok(std::net::SocketAddr::new(e.addr, e.port.unwrap_or(9)))
    };
    let tx_cpu = crate::args::usable_cpus(Some(&crate::args::CpuList(vec![a.cpu])))?[0];
    let mut c = if let Some(lab) = &a.lab {
        if let Some(flag) = a.place.given() {
            return Err(Failure::usage(anyhow::anyhow!(
                "{flag}: --lab places flows by the lab's own key and table"
            )));
        }
        Rfc2544Config::in_lab(&LabRun {
            lab: lab.clone(),
            ipv6: a.ipv6,
            to: a.to.as_deref().map(port_of).transpose()?,
            flows: a.flows,
            per_queue: a.per_queue,
            queues: a
                .place
                .pick_queues
                .as_ref()
                .map(|q| q.0.iter().map(|&x| x as u32).collect())
                .unwrap_or_default(),
            tx_cpu,
        })
        .map_err(Failure::from_tool)?
    } else {
        let (Some(t), Some(r), Some(to)) = (&a.tx_dev, &a.rx_dev, &a.to) else {
            return Err(Failure::usage(anyhow::anyhow!(
                "say where: --lab NAME, or --tx-dev A --rx-dev B --to IP"
            )));
        };
        let mut c = Rfc2544Config::new(
            Endpoint {
                netns: a.tx_netns.clone(),
                dev: t.clone(),
            },
            Endpoint {
                netns: a.rx_netns.clone(),
                dev: r.clone(),
            },
            port_of(to)?,
        );
        c.flows = a.flows;
        c.tx_cpu = tx_cpu;
        let flow = if c.to.is_ipv4() { "udp4" } else { "udp6" };
        c.placement = a.place.placement(a.per_queue, flow)?;
        c
    };
    c.dst_mac = a.dst_mac;
    if !a.tests.is_empty() {
        c.tests = Tests {
            throughput: a.tests.contains(&TestArg::Throughput),
            latency: a.tests.contains(&TestArg::Latency),
            frame_loss: a.tests.contains(&TestArg::Loss),
            back_to_back: a.tests.contains(&TestArg::B2b),
            probe_under_flood: a.tests.contains(&TestArg::ProbeUnderFlood),
        };
    }
    if let Some(d) = &a.flood_to {
        let mut f = rfc2544::FloodSpec::new(d.addrs, d.ports);
        f.flows = a.flood_flows;
        if !a.flood_rates.is_empty() {
            f.rates = a.flood_rates.iter().map(|r| r.0).collect();
        }
        f.probe_pps = match a.probe_rate {
            crate::args::Rate::Pps(p) => p,
            _ => {
                return Err(Failure::usage(anyhow::anyhow!(
                    "--probe-rate is frames per second (1000, 10k)"
                )))
            }
        };
        c.flood = Some(f);
    } else if !a.flood_rates.is_empty() {
        return Err(Failure::usage(anyhow::anyhow!(
            "--flood-rates is for the probe-under-flood test: give --flood-to too"
        )));
    }
    if let Some(s) = &a.sizes {
        c.sizes = SizeSpec::List(s.0.clone());
    }
    if let Some(m) = &a.imix {
        c.sizes = SizeSpec::Imix(m.0.clone());
    }
    c.line_rate_bps = a.line_rate;
    c.trial_s = a.trial_secs;
    c.confirm_s = a.confirm_secs;
    c.pause_s = a.pause;
    c.drain_s = a.drain;
    c.learning_frames = a.learning_frames;
    c.resolution = a.resolution / 100.0;
    c.loss_tolerance_pct = a.loss_tolerance;
    c.max_trials = a.max_trials;
    c.halving_only = a.halving_only;
    c.latency_trials = a.latency_trials;
    c.b2b_trials = a.b2b_trials;
    c.b2b_max_s = a.b2b_max_secs;
    c.rx_cpu = match a.sink_cpu {
        Some(s) => crate::args::usable_cpus(Some(&crate::args::CpuList(vec![s])))?[0],
        None => crate::args::usable_cpus(None)?.last().copied().unwrap_or(0),
    };
    c.burst = a.burst;
    c.rx_backend = a.rx_backend.into();
    Ok(c)
}

/// `  64 B  throughput search  1234567 pps → 1230000 offered  1229000 received  loss 0.081 %  fail`
pub fn trial_line(t: &TrialRecord) -> String {
    // Search trials are the plain ones; the others say what they are, as the JSON does.
    let kind = match t.kind {
        rfc2544::search::TrialKind::Search => "",
        k => k.name(),
    };
    let rate = if t.rate_pps > 0.0 {
        format!("{:>10.0} pps", t.rate_pps)
    } else {
        format!("{:>14}", "max")
    };
    let mut s = format!(
        "{:>6.0} B  {:<11} {:<7} {rate}  offered {:>10.0}  sent {:>10}  received {:>10}  loss \
         {:>7.3} %  {}",
        t.frame_bytes,
        t.test.name(),
        kind,
        t.offered_pps,
        t.sent,
        t.received,
        100.0 * t.loss,
        t.verdict
    );
    if t.refused > 0 {
        s.push_str(&format!("  (DUT queue refused {})", t.refused));
    }
    if t.drained_s > 0.3 {
        // The DUT held frames well after the generator stopped.
        s.push_str(&format!("  (drained {:.2} s)", t.drained_s));
    }
    if t.receiver_dropped > 0 {
        s.push_str(&format!("  (receiver dropped {})", t.receiver_dropped));
    }
    if !t.tester_limited.is_empty() {
        s.push_str(&format!(
            "  TESTER-LIMITED: {}",
            t.tester_limited.join("; ")
        ));
    }
    s
}

pub fn run(a: Rfc2544Args) -> CmdResult {
    let cfg = config(&a)?;
    // Refused before the banner speaks of it (a queue that does not exist, say).
    rfc2544::check(&cfg).map_err(Failure::from_tool)?;
    if let Some(p) = &a.csv {
        crate::side::check("--csv", p)?;
    }
    if let Some(p) = &a.html {
        crate::side::check("--html", p)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let mut log = Log::new(a.json);
    let host = crate::host::before_run(
        &[cfg.tx_cpu, cfg.rx_cpu],
        &[&cfg.tx, &cfg.rx].map(|e| RunDev {
            dev: e.dev.clone(),
            netns: e.netns.clone(),
        }),
    );
    let placed = cfg.placement.as_ref().map_or(String::new(), |p| {
        let queues = if p.queues.is_empty() {
            "every queue".to_string()
        } else {
            let q: Vec<String> = p.queues.iter().map(u32::to_string).collect();
            format!("queue {}", q.join(", "))
        };
        let why = if cfg.placement_default {
            " (by default: off the generator's CPU)"
        } else {
            ""
        };
        format!(
            "; flows placed on the DUT's RSS {queues}, {} each{why}",
            p.per_queue
        )
    });
    log.line(&format!(
        "flowlane rfc2544: {} → DUT → {} to {}, generator on CPU {}, sink ({}) on CPU {}{placed}",
        cfg.tx.dev,
        cfg.rx.dev,
        cfg.to,
        cfg.tx_cpu,
        cfg.rx_backend.name(),
        cfg.rx_cpu
    ));
    crate::host::say(&mut log, &host);
    let quiet = a.quiet;
    let mut r = rfc2544::run(&cfg, &stop, &mut |e| match e {
        Rfc2544Event::Size { frame_bytes, max } => log.line(&format!(
            "size {frame_bytes:.0} B: maximum {:.0} pps ({}; generator ceiling {:.0} pps)",
            max.pps,
            max.source,
            max.ceiling_pps.unwrap_or(0.0)
        )),
        Rfc2544Event::Trial(t) if !quiet => log.line(&trial_line(&t)),
        Rfc2544Event::Trial(_) => {}
        Rfc2544Event::Flood(p) if !quiet => log.line(&flood_line(&p)),
        Rfc2544Event::Flood(_) => {}
    })
    .map_err(Failure::from_tool)?;
    r.host = Some(host);
    // The report first: a side file that fails to write must not cost it.
    if a.json {
        print_json(&r)?;
    } else {
        summary(&r);
    }
    let mut side = crate::side::Writes::default();
    if let Some(p) = &a.csv {
        side.write("--csv", p, csv(&r));
    }
    if let Some(p) = &a.html {
        side.write("--html", p, page::html(&r));
    }
    side.done()?;
    if r.interrupted {
        // What was measured is printed (marked interrupted); the job was not done.
        return Ok(ExitCode::from(crate::live::INTERRUPTED));
    }
    let found_nothing = r.sizes.iter().any(|s| {
        s.throughput
            .as_ref()
            .is_some_and(|t| t.ndr.pps <= 0.0 && t.pdr.pps <= 0.0)
    });
    Ok(if r.sizes.is_empty() || found_nothing {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn summary(r: &Rfc2544Report) {
    outln!();
    outln!(
        "{:>7}  {:>12} {:>9} {:>7}  {:>12}  {:>10} {:>10}  {:>12}  notes",
        "size",
        "NDR pps",
        "Gbit/s",
        "% max",
        "PDR pps",
        "p50 µs",
        "p99 µs",
        "b2b frames"
    );
    for s in &r.sizes {
        let mut notes = vec![format!("max {}", s.max.source)];
        let (ndr, gbps, pct, pdr) = match &s.throughput {
            Some(t) => {
                if t.ndr.tester_limited {
                    notes.push(format!(
                        "tester-limited: the DUT lost nothing at the {:.0} pps delivered; its \
                         throughput is at least that, not known beyond",
                        t.ndr.delivered_pps
                    ));
                }
                if !t.ndr.confirmed {
                    notes.push("NDR not confirmed".into());
                }
                (
                    if t.ndr.tester_limited {
                        format!(">={:.0}", t.ndr.delivered_pps)
                    } else {
                        format!("{:.0}", t.ndr.pps)
                    },
                    format!("{:.3}", t.ndr_line_bps / 1e9),
                    format!("{:.1}", t.ndr_pct_of_max),
                    format!("{:.0}", t.pdr.pps),
                )
            }
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let (p50, p99) = s.latency.as_ref().map_or(("-".into(), "-".into()), |l| {
            (
                format!("{:.1}", l.mean_p50_ns / 1e3),
                format!("{:.1}", l.mean_p99_ns / 1e3),
            )
        });
        let b2b = s.back_to_back.as_ref().map_or("-".into(), |b| {
            if let Some(n) = &b.note {
                if b.bursts.is_empty() {
                    notes.push(n.clone());
                }
            }
            if let Some(t) = &b.tester_limited {
                notes.push(format!("back-to-back: {t}"));
            }
            if b.bursts.is_empty() {
                "-".into()
            } else {
                format!("{:.0}", b.mean_frames)
            }
        });
        outln!(
            "{:>7.0}  {ndr:>12} {gbps:>9} {pct:>7}  {pdr:>12}  {p50:>10} {p99:>10}  {b2b:>12}  {}",
            s.frame_bytes,
            notes.join("; ")
        );
    }
    for s in &r.sizes {
        for p in s.probe_under_flood.iter().flatten() {
            outln!("{:>7.0}  {}", s.frame_bytes, flood_line(p));
        }
    }
    outln!(
        "{} trials in {:.0} s{}",
        r.trials.len(),
        r.duration_s,
        if r.interrupted { " (interrupted)" } else { "" }
    );
}

/// A probe-under-flood point in one line.
fn flood_line(p: &rfc2544::FloodPoint) -> String {
    let flood = match p.flood_rate_pps {
        Some(0.0) => "no flood (the probe alone)".to_string(),
        r => format!(
            "flood {} → {:.0} pps sent, {:.0} pps forwarded ({} destinations)",
            r.map_or("unpaced".into(), |r| format!("{r:.0} pps asked")),
            p.flood_offered_pps,
            p.flood_forwarded_pps,
            p.flood_destinations
        ),
    };
    let lat = p
        .probe_latency_ns
        .as_ref()
        .map_or("no latency".into(), |l| {
            format!(
                "p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
                l.p50 as f64 / 1e3,
                l.p99 as f64 / 1e3,
                l.max as f64 / 1e3
            )
        });
    format!(
        "probe-under-flood: {flood}; probe {} of {} back, {} lost ({:.3} %), {lat}{}",
        p.probe_received,
        p.probe_sent,
        p.probe_lost,
        100.0 * p.probe_lost as f64 / p.probe_sent.max(1) as f64,
        if p.tester_limited.is_empty() {
            String::new()
        } else {
            format!(" [tester-limited: {}]", p.tester_limited)
        }
    )
}

/// Every trial, one CSV row each.
pub fn csv(r: &Rfc2544Report) -> String {
    let mut s = String::from(
        "test,kind,frame_bytes,rate_pps,offered_pps,sent,refused,received,receiver_dropped,\
         loss_pct,duplicates,reordered,secs,drained_s,p50_ns,p99_ns,p999_ns,max_ns,verdict,\
         tester_limited\n",
    );
    for t in &r.trials {
        let l = t.latency_ns.as_ref();
        let lat =
            |f: fn(&flowlane_tools::Latency) -> u64| l.map_or(String::new(), |l| f(l).to_string());
        s.push_str(&format!(
            "{},{},{},{:.0},{:.0},{},{},{},{},{:.6},{},{},{:.3},{:.3},{},{},{},{},{},\"{}\"\n",
            t.test.name(),
            t.kind.name(),
            t.frame_bytes,
            t.rate_pps,
            t.offered_pps,
            t.sent,
            t.refused,
            t.received,
            t.receiver_dropped,
            100.0 * t.loss,
            t.duplicates,
            t.reordered,
            t.secs,
            t.drained_s,
            lat(|l| l.p50),
            lat(|l| l.p99),
            lat(|l| l.p999),
            lat(|l| l.max),
            t.verdict,
            t.tester_limited.join("; ").replace('"', "'")
        ));
    }
    s
}
