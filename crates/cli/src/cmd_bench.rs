//! `flowlane bench`: the RSS scaling experiment in one command — flows placed on RSS buckets,
//! one pinned server worker per CPU, and for k = 1..N active buckets the seed's five numbers,
//! per-worker counts, steering checks, CPU use and latency; a table as it goes, then
//! `report.json` and a self-contained `report.html`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::anyhow;
use clap::{Args, ValueEnum};
use flowlane_lab::setup::{self, Steer};
use flowlane_rss::Key;
use flowlane_tools::bench::{self, BenchConfig, BenchEvent, BenchStep, BenchTarget};

use crate::args::usable_cpus;
use crate::args::{parse_duration, parse_rate, Rate};
use crate::args::{parse_key, print_json};
use crate::cmd_lab::{config, LabSymmetricArg, SteerArg};
use crate::live::stop_on_signals;
use crate::report;
use crate::{CmdResult, Failure};

/// The main job: does this host scale per core? Packets per second by active RSS buckets.
///
/// Reproduces the RSS scaling experiment: how packets per second grow with the number of RSS
/// buckets (receive queues) in use, and where packets go missing.
///
/// In the lab (`flowlane lab`, brought up for the run and taken down after, unless it was
/// already up): `flowlane serve` runs in the DUT namespace with one pinned worker per CPU;
/// `flowlane blast` runs in the generator namespace with --per-bucket flows placed on each
/// active bucket by the RSS picker (same key and table as the lab's software RSS). Step k uses
/// buckets 0..k-1, as the FreeBSD RSS experiment ran 1, 2, 3, 4 client processes. Each step
/// records that experiment's five numbers:
///
///   sent        frames the client's interface sent     (generator end flgen, tx_packets)
///   received    frames the server's interface received (DUT end fldut, rx_packets)
///   seen        datagrams the server program read           (serve, all workers)
///   echoed      datagrams it sent back                      (serve)
///   back        echoes the client program received          (blast)
///
/// plus each worker's share against what its buckets were sent, mis-steered datagrams (eBPF
/// detector), socket drops, software-RSS CPU queue drops (qdrops: frames a full cpumap queue
/// dropped, from the lab's XDP counters), CPU use per core (/proc/stat) and round-trip
/// percentiles. A number that does not add up — including a datagram lost where no counter
/// shows — is reported as a problem (and the exit code is 1).
///
/// Without root: `--loopback` runs the same steps on 127.0.0.1 in this namespace (no
/// interfaces, no steering: not RSS-faithful, labelled so).
///
/// Examples:
///   sudo flowlane bench                         # buckets 1..CPUs, 5 s steps, ./flowlane-report/
///   sudo flowlane bench --buckets 1..2 --step-secs 2 --mode both
///   flowlane bench --loopback --step-secs 1
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// Steps: `1..N` (k = 1, 2, …, N active buckets) or `N` (that one step). Default: 1..CPUs.
    #[arg(long, value_parser = parse_buckets)]
    buckets: Option<(u32, u32)>,

    /// echo: the server echoes and the client takes the echoes back; sink: one way; both: a
    /// sink step and an echo step for each k.
    #[arg(long, value_enum, default_value_t = BenchMode::Echo)]
    mode: BenchMode,

    /// Frame size without FCS (60: the minimum frame, an 18-byte UDP payload). The FreeBSD
    /// RSS experiment sent 510-byte datagrams (`udp-clt -s 510`): `--size 552`, or
    /// `--freebsd-payload`.
    #[arg(long, short = 'l', default_value_t = 60, value_parser = clap::value_parser!(u64).range(60..=1514))]
    size: u64,

    /// The FreeBSD RSS experiment's datagrams: 510-byte UDP payloads (552-byte frames over
    /// IPv4), as `udp-clt -s 510` sent them. With --two-tuple, its whole setup.
    #[arg(long, conflicts_with = "size")]
    freebsd_payload: bool,

    /// Hash addresses only (the 2-tuple), as FreeBSD hashes UDP by default and NICs hash
    /// fragments: the lab's steering does, and the picker gives each client flow a source
    /// address of its own (added to the generator for the run), as the experiment ran "four
    /// couples of udp-clt, each from different IP addresses".
    #[arg(long)]
    two_tuple: bool,

    /// Seconds of traffic per step.
    #[arg(long, value_parser = parse_duration, default_value_t = 5.0)]
    step_secs: f64,

    /// Flows per active bucket.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=64))]
    per_bucket: u64,

    /// Client rate per step, as blast takes it: packets per second (50000, 50k, 1.5M) or a
    /// line rate (100Mbit, 10Gbit). Default: as fast as it can.
    #[arg(long, short = 'b', value_parser = parse_rate)]
    rate: Option<Rate>,

    /// How the server hands datagrams to its workers: cpu (by the CPU the kernel processed
    /// each on, serve's default), hash (by the datagram's own Toeplitz bucket under the lab's
    /// key and table, `serve --steer-hash`: FreeBSD's re-steering), or both (a step of each
    /// per k). Default: both with --fragment-share, else cpu.
    #[arg(long, value_enum)]
    serve_steer: Option<ServeSteerArg>,

    /// Mixed flows, as in the FreeBSD RSS write-up: this share of each client flow's datagrams (0-100 %, whole
    /// percents) is sent with --fragment-datagram payload bytes, above the lab's MTU, so the
    /// client's kernel fragments them; the lab steers fragments by the 2-tuple, whole
    /// datagrams by the 4-tuple. Each step then shows where the reassembled datagrams went
    /// (misplaced, split flows, reordered echoes) against both kernels' counters (Ip:
    /// FragOKs, FragCreates, ReasmReqds, ReasmOKs, ReasmFails).
    #[arg(long, value_name = "PCT", value_parser = crate::args::parse_pct)]
    fragment_share: Option<f64>,

    /// With --fragment-share: the long datagrams' UDP payload bytes (3000: three fragments at
    /// MTU 1500).
    #[arg(
        long,
        value_name = "BYTES",
        default_value_t = 3000,
        requires = "fragment_share"
    )]
    fragment_datagram: usize,

    /// Directory for report.json and report.html.
    #[arg(long, default_value = "flowlane-report")]
    out: PathBuf,

    /// Lab name (an existing lab of this name is used as it is).
    #[arg(long, default_value = "flowlane")]
    name: String,

    /// Receive steering for a lab this run brings up.
    #[arg(long, value_enum, default_value_t = SteerArg::Rss)]
    steer: SteerArg,

    /// RSS key for a lab this run brings up.
    #[arg(long, value_parser = parse_key, default_value = "microsoft")]
    key: Key,

    /// Symmetric hashing for a lab this run brings up (its steering and the flows' placement
    /// alike), as `ethtool -X DEV xfrm symmetric-xor` sets a NIC. A lab that is up is used as
    /// it was made (`lab status` says how).
    #[arg(long, value_enum, default_value_t = LabSymmetricArg::Off)]
    symmetric: LabSymmetricArg,

    /// Run on 127.0.0.1 without namespaces (no root needed; not RSS-faithful).
    #[arg(long)]
    loopback: bool,

    /// Leave a lab this run brought up in place afterwards.
    #[arg(long)]
    keep_lab: bool,

    /// Print the report as JSON on stdout (the table goes to stderr).
    #[arg(long, short = 'J')]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ServeSteerArg {
    Cpu,
    Hash,
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BenchMode {
    Echo,
    Sink,
    Both,
}

/// `1..4` or `3`.
fn parse_buckets(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("`{s}` is not a bucket range like 1..4 (or a single count like 2)");
    let (a, b) = match s.split_once("..") {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (s.trim(), s.trim()),
    };
    let a: u32 = a.parse().map_err(|_| bad())?;
    let b: u32 = b.parse().map_err(|_| bad())?;
    if a == 0 || a > b {
        return Err(bad());
    }
    if b > 64 {
        return Err(format!(
            "`{s}`: at most 64 buckets (the lab's queues, and the steering table's width)"
        ));
    }
    Ok((a, b))
}

/// `--out` can take the report: the directory exists or can be made, and a file can be written
/// in it (tried, then removed).
fn check_writable(dir: &std::path::Path) -> Result<(), Failure> {
    let probe = dir.join(format!(".flowlane-write-test-{}", std::process::id()));
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&probe, b""))
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| {
            Failure::usage(anyhow!(
                "--out {}: cannot write the report there ({e}); choose another directory",
                dir.display()
            ))
        })
}

fn row_header() -> String {
    format!(
        "{:>4} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5}  {:>9} {:>7} {:>7}  {}",
        "mode",
        "bkts",
        "sent",
        "received",
        "seen",
        "echoed",
        "back",
        "seen pps",
        "eff",
        "p99 µs",
        "drops",
        "qdrops",
        "per worker (got/expected, worker CPU per packet)"
    )
}

fn row(s: &BenchStep) -> String {
    let f = &s.five;
    let show = |v: Option<u64>| v.map_or("-".into(), |x| x.to_string());
    let workers: Vec<String> = s
        .workers
        .iter()
        .map(|w| {
            let cost = w
                .cpu_ns_per_packet
                .map_or(String::new(), |n| format!(" ({n:.0} ns/pkt)"));
            format!("cpu{} {}/{}{cost}", w.cpu, w.rx_packets, w.expected)
        })
        .collect();
    format!(
        "{:>4} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>5}  {:>9} {:>7} {:>7}  {}",
        s.mode,
        s.buckets,
        show(f.client_sent),
        show(f.server_received),
        f.server_seen,
        show(f.server_echoed),
        show(f.client_back),
        s.pps.server_seen,
        s.scaling_efficiency
            .map_or("-".into(), |e| format!("{e:.2}")),
        s.latency_ns
            .as_ref()
            .map_or("-".into(), |l| format!("{:.1}", l.p99 as f64 / 1e3)),
        s.socket_drops,
        show(s.queue_drops),
        workers.join("  ")
    )
}

/// The line under a row of mixed flows: where the fragmented datagrams went, by the programs
/// and by both kernels.
fn fragments_line(s: &BenchStep) -> Option<String> {
    let f = s.fragments.as_ref()?;
    let per: Vec<String> = s
        .workers
        .iter()
        .zip(&f.worker_fragmented)
        .map(|(w, n)| format!("cpu{} {n}", w.cpu))
        .collect();
    Some(format!(
        "      steering {}: {} of {} datagrams sent fragmented ({} fragments; client kernel \
         FragOKs {}, FragCreates {}); server kernel ReasmReqds {}, ReasmOKs {}, ReasmFails {}; \
         workers got {} fragmented ({}); misplaced {}, missteered {}, split flows {}{}",
        s.steering,
        f.sent_datagrams,
        s.client_program_sent,
        f.sent_fragments,
        f.client_frag_oks,
        f.client_frag_creates,
        f.server_reasm_reqds,
        f.server_reasm_oks,
        f.server_reasm_fails,
        f.server_fragmented,
        per.join(", "),
        s.misplaced,
        s.missteered,
        f.split_flows,
        s.reordered
            .map_or(String::new(), |r| format!(", echoes reordered {r}")),
    ))
}

/// The line under a row where the client's interface sent more frames than the client
/// program: the difference is other traffic on the link, not bench's datagrams.
fn other_frames_note(s: &BenchStep) -> Option<String> {
    let other = s.link_other_frames.filter(|&o| o > 0)?;
    Some(format!(
        "      sent − client program's {} = {other} frame(s) on the link that were not bench \
         traffic (neighbour discovery, IPv6 router solicitations, …): counted by the \
         interfaces, never by the programs",
        s.client_program_sent
    ))
}

/// Long: flags → configuration, then each event printed as the run goes and the report written;
/// the work is `tools::bench::run`'s.
pub fn run(a: BenchArgs) -> CmdResult {
    // Everything the command line says is checked before a lab is built: a run should not
    // fail after minutes for a typo.
    if !a.loopback {
        setup::check_name(&a.name).map_err(|e| Failure::usage(anyhow!(e)))?;
    } else if a.two_tuple {
        return Err(Failure::usage(anyhow!(
            "--two-tuple shapes a lab's steering and placement; --loopback has no steering"
        )));
    } else if a.symmetric != LabSymmetricArg::Off {
        return Err(Failure::usage(anyhow!(
            "--symmetric shapes a lab's steering and placement; --loopback has no steering"
        )));
    }
    check_writable(&a.out)?;
    let cpus = usable_cpus(None)?;
    let ncpus = cpus.len() as u32;
    // 510-byte payload + 8 UDP + 20 IPv4 + 14 Ethernet.
    let frame_bytes = if a.freebsd_payload {
        552
    } else {
        a.size as usize
    };
    let cfg = BenchConfig {
        target: if a.loopback {
            BenchTarget::Loopback {
                key: a.key.to_hex(),
            }
        } else {
            let queues = a.buckets.map_or(ncpus, |b| b.1);
            let mut config = config(
                &a.name,
                Some(queues),
                Steer::from(a.steer),
                &a.key,
                a.two_tuple,
            );
            config.symmetric = a.symmetric.into();
            BenchTarget::Lab {
                config,
                keep: a.keep_lab,
            }
        },
        buckets: a.buckets,
        mode: match a.mode {
            BenchMode::Echo => bench::BenchMode::Echo,
            BenchMode::Sink => bench::BenchMode::Sink,
            BenchMode::Both => bench::BenchMode::Both,
        },
        frame_bytes,
        step_secs: a.step_secs,
        per_bucket: a.per_bucket,
        rate: a.rate,
        cpus,
        serve_steering: match (a.serve_steer, a.fragment_share) {
            (Some(ServeSteerArg::Cpu), _) | (None, None) => bench::ServeSteering::Cpu,
            (Some(ServeSteerArg::Hash), _) => bench::ServeSteering::Hash,
            (Some(ServeSteerArg::Both), _) | (None, Some(_)) => bench::ServeSteering::Both,
        },
        fragments: a.fragment_share.map(|p| bench::BenchFragments {
            share: p / 100.0,
            payload: a.fragment_datagram,
        }),
    };
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let say = |s: &str| {
        if a.json {
            errln!("{s}");
        } else {
            outln!("{s}");
        }
    };
    let mut lab_line = None;
    let rep = bench::run(&cfg, &stop, &mut |event| match event {
        BenchEvent::Lab { config: c, created } => {
            if created {
                errln!(
                    "lab {} is up: {} queues, steering {}",
                    c.name,
                    c.queues,
                    c.steer.name()
                );
            } else {
                errln!(
                    "using lab {} as it is ({} queues, steering {})",
                    c.name,
                    c.queues,
                    c.steer.name()
                );
            }
            lab_line = Some(format!("lab {} (steering {})", c.name, c.steer.name()));
        }
        BenchEvent::Started {
            buckets,
            workers,
            checks,
        } => {
            say(&format!(
                "flowlane bench: {} — steps {}..{} buckets × {} flows each, {} s per step, {}-byte \
                 frames, {workers} server workers",
                lab_line.clone().unwrap_or_else(|| {
                    "LOOPBACK 127.0.0.1 (not RSS-faithful: no NIC queues, no steering)".into()
                }),
                buckets.0,
                buckets.1,
                a.per_bucket,
                a.step_secs,
                frame_bytes,
            ));
            if let Some(line) = checks.line() {
                say(&line);
            }
            say(&row_header());
        }
        BenchEvent::PortMoved { from, to } => {
            errln!("{from} was taken before the server could bind it: using {to}")
        }
        BenchEvent::Step(s) => {
            say(&row(&s));
            if let Some(note) = other_frames_note(&s) {
                say(&note);
            }
            if let Some(line) = fragments_line(&s) {
                say(&line);
            }
            for p in &s.problems {
                say(&format!("     !! {p}"));
            }
        }
    })
    .map_err(Failure::from_tool)?;
    let jpath = a.out.join("report.json");
    let hpath = a.out.join("report.html");
    // The report's files after the run, each tried; a failure is said after the report is
    // printed (checked writable before the run, the directory can still fill up).
    let mut side = crate::side::Writes::default();
    side.write(
        "--out",
        &jpath,
        serde_json::to_string_pretty(&rep).map_err(Failure::runtime)?,
    );
    side.write("--out", &hpath, report::html(&rep));
    if a.json {
        print_json(&rep)?;
    } else {
        outln!(
            "report: {} and {}{}",
            jpath.display(),
            hpath.display(),
            if rep.problems.is_empty() {
                String::new()
            } else {
                format!(
                    " — {} problem(s), listed above and in the report",
                    rep.problems.len()
                )
            }
        );
    }
    side.done()?;
    Ok(if rep.interrupted {
        ExitCode::from(crate::live::INTERRUPTED)
    } else if rep.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
