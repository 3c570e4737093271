//! `flowlane blast`: the traffic generator (UDP mode), with loss, reorder and latency accounting
//! of echoes.

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use flowlane_tools::blast::{
    self, BlastConfig, BlastEvent, BlastMode, BlastTick, Echo, FrameSettings, Frames, Mode,
    PcapSource, ReplayMode, Spray, StepReport, StepStart, VerifyAt,
};

use crate::args::usable_cpus;
use crate::args::{
    parse_addr_range, parse_cpu_list, parse_dest_ranges, parse_imix, parse_port_range, parse_rate,
    parse_size_list, print_json, CpuList, DestRanges, Imix, PlaceArgs, Rate, SizeList,
};
use crate::args::{parse_duration, parse_pct};
use crate::live::{latency_line, stop_on_signals, LiveArgs};
use crate::{CmdResult, Failure};
use flowlane_tools::doctor::RunDev;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    /// UDP sockets (sendmmsg); the kernel builds the headers.
    Udp,
    /// Whole frames through an AF_PACKET TX ring on --dev, bypassing the qdisc layer; frames
    /// are built once per flow and patched per packet. Needs CAP_NET_RAW.
    Raw,
    /// Whole frames through AF_XDP sockets on --dev (thread i on TX queue i; copy mode, so
    /// it works on veth; need_wakeup), the UMEM filled once with template frames.
    Xdp,
    /// No socket: a generated XDP program run in live-frames mode (BPF_PROG_TEST_RUN, Linux
    /// 5.18+) stamps each frame and sends it with XDP_TX, no skb per frame — the fastest mode.
    /// One frame size per step (no IMIX). The whole step is one kernel run (each costs ~20 ms
    /// of set-up): the program keeps the deadline and --count itself. With --rate it paces
    /// too (it sends a frame only when one is due on the kernel's clock, so frames leave
    /// evenly; --burst bounds the catch-up after a stall, default 32, 512+ on a busy CPU).
    /// Needs CAP_BPF and CAP_NET_ADMIN. On veth the
    /// peer must run NAPI (an XDP program or GRO on, as `flowlane lab up` sets); frames the
    /// device refused are reported (device_refused) and make the exit code 1.
    XdpLive,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FragOrderArg {
    /// By offset.
    InOrder,
    /// The last fragment first.
    Reverse,
    /// Odd-numbered fragments first, then the even (the kernel selftest ip_defrag's order).
    OddEven,
    /// Shuffled per datagram.
    Random,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FragAttackArg {
    /// The first fragment runs 8 bytes into the second.
    OverlapForward,
    /// The second fragment starts 8 bytes inside the first.
    OverlapBack,
    /// A first fragment of 8 bytes: the UDP header alone (offsets count in 8 bytes, so no
    /// fragment can cut inside it).
    TinyFirst,
    /// The first fragment sent again right after it.
    Duplicate,
    /// The last fragment never sent: a flood of these fills a reassembler's contexts.
    Incomplete,
    /// Teardrop: the second fragment wholly inside the first.
    Teardrop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PcapModeArg {
    /// UDP frames with room for it carry the flowlane header of their flow (the capture's
    /// address and port pairs), checksums made valid; other frames are left out and counted.
    Stamp,
    /// Every frame byte for byte.
    Verbatim,
}

/// Send traffic with exact counts, paced rates, and loss and latency from echoes.
///
/// UDP sockets (default), AF_PACKET or AF_XDP frames, or live XDP frames (--mode). With --echo
/// against `flowlane serve --mode echo`: loss, reordering, duplicates and round-trip latency
/// per flow.
///
/// Every datagram's payload starts with a 16-byte flowlane header (flow id, sequence number,
/// transmit time) when it has room: --size 60 (the smallest IPv4 frame) leaves 18 bytes.
/// Threads are pinned one per CPU (--cpus); each owns a share of the flows, one connected socket
/// per flow, and sends sendmmsg batches. A status line each second; Ctrl-C stops sending, waits
/// for the last echoes (--linger) and prints the summary, including a pktgen-style line.
///
/// Flows: --flows N combine the --from addresses with the --sport ports. RSS-placed flows:
/// --per-queue K picks K source ports for each receive queue of the model (--queues, --key,
/// --reta, ...) so that the 4-tuple hashes there; each flow's queue is in the summary.
///
/// Examples:
///   flowlane blast --to 198.18.0.2:9000 --count 100000
///   flowlane blast --to 198.18.0.2:9000 --rate 50k --duration 2 --echo --json
///   flowlane blast --to 198.18.0.2:9000 --queues 4 --per-queue 2 --size 510 --rate 1Gbit
///   flowlane blast --mode raw --dev veth0 --pcap rx.pcap --dst-mac 02:00:00:00:00:02
///
/// Captures: --pcap FILE (pcap or pcapng, Ethernet) sends a capture's frames on --dev (raw or
/// xdp mode) in the file's order, once — or round and round for --count frames or --duration
/// seconds, at --rate. Stamped (default): each UDP frame with room for it carries the flowlane
/// header of its flow, so `flowlane sink` accounts loss, order and latency per captured flow;
/// --pcap-mode verbatim sends every frame byte for byte. The MACs are set to this interface's
/// and the destination's when --dst-mac or --to names it, else kept as captured.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BlastArgs {
    /// How frames leave.
    #[arg(long, value_enum, default_value_t = ModeArg::Udp)]
    mode: ModeArg,

    /// Interface to send on (raw, xdp and xdp-live modes). Several (a comma list, or --dev
    /// again) send in one run, pktgen's threads per device: sender thread i sends on the
    /// (i mod n)-th, so --cpus must give a multiple of n threads (and --flows at least as
    /// many); each interface then carries the same share of --rate and --count.
    #[arg(long, value_delimiter = ',')]
    dev: Vec<String>,

    /// Destination MAC (raw, xdp and xdp-live modes). Default: the neighbour table's entry for --to on --dev.
    #[arg(long, value_parser = blast::parse_mac)]
    dst_mac: Option<[u8; 6]>,

    /// 802.1Q VLAN tag for raw frames (0-4094).
    #[arg(long, value_parser = clap::value_parser!(u16).range(0..=4094))]
    vlan: Option<u16>,

    /// IPv4 TTL / IPv6 hop limit of the frames (raw, xdp and xdp-live modes; default 64):
    /// `--ttl 1` checks that a router drops what it must not forward.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=255))]
    ttl: Option<u8>,

    /// Destination IP:PORT ([V6]:PORT). Traffic goes only here. With --pcap: optional, only
    /// to find the destination's MAC. Frame modes (raw, xdp) also take ranges, pktgen's
    /// dst_min/dst_max and udp_dst_min/udp_dst_max: a prefix or range in place of the IP and
    /// a range in place of the port (198.18.16.0/20:9000-9009, [2001:2::/64]:9000) — each
    /// flow draws its destination from them (counting up, ports first, or --dst-random) and
    /// keeps it for --flowlen frames. Frames to the range go to the MAC of --to's first
    /// address (or its gateway): a router's, for a flood through it.
    #[arg(long, value_parser = parse_dest_ranges, required_unless_present = "pcap")]
    to: Option<DestRanges>,

    /// With a destination range: draw each destination at random (seeded by --seed) instead
    /// of counting up through the range.
    #[arg(long)]
    dst_random: bool,

    /// Frames a flow sends to one destination before it draws the next (pktgen's flowlen;
    /// default 1: a new destination every frame). Every frame keeps its flow's id and
    /// sequence numbers, so `flowlane sink` accounts loss per flow across destinations, and
    /// counts each destination as a tuple of its own.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    flowlen: Option<u64>,

    /// Source MACs to cycle through per frame: the interface's and the next ones up
    /// (pktgen's src_mac_count; frame modes raw and xdp).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    src_mac_count: Option<u32>,

    /// Destination MACs to cycle through per frame, from the destination's up (pktgen's
    /// dst_mac_count).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    dst_mac_count: Option<u32>,

    /// Send the frames of this capture (pcap or pcapng, Ethernet) instead of built ones
    /// (raw and xdp modes).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["size", "imix", "payload", "flows", "from", "sport", "per_queue", "vlan", "ttl", "echo"])]
    pcap: Option<std::path::PathBuf>,

    /// With --pcap: how its frames are sent.
    #[arg(long, value_enum, default_value_t = PcapModeArg::Stamp, requires = "pcap")]
    pcap_mode: PcapModeArg,

    /// Source address(es): IP, IP-IP or IP/LEN; each must be an address of this host. Default:
    /// the address the route to --to uses.
    #[arg(long, value_parser = parse_addr_range)]
    from: Option<(IpAddr, IpAddr)>,

    /// Source port(s), P or P-P. Default: ports chosen by the kernel (with --per-queue:
    /// 1024-65535 to pick from).
    #[arg(long, value_parser = parse_port_range)]
    sport: Option<(u16, u16)>,

    /// Number of flows (source address × port combinations), spread over the threads.
    #[arg(long, short = 'P', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    flows: u32,

    /// Frame modes (raw, xdp): cut each datagram into IP fragments carrying at most this many
    /// bytes of IP payload (a multiple of 8; IPv4 with DF cleared, IPv6 with a fragment
    /// header), sent back to back. The report and the pktgen line count them
    /// (`(1514byte,3frags)`); `flowlane sink` makes them whole and accounts the datagrams.
    /// UDP mode fragments through the kernel instead: a --size above the path MTU, or
    /// --fragment-datagram.
    #[arg(long, value_name = "BYTES", conflicts_with = "fragment_datagram")]
    fragment_size: Option<usize>,

    /// UDP mode: send --fragment-share of each flow's datagrams with this many payload bytes
    /// (above the path MTU: the kernel fragments them, IP_PMTUDISC_DONT) and the rest whole at
    /// --size, so one flow mixes fragmented and whole datagrams. Every datagram the path MTU
    /// makes the kernel cut is counted, with its fragments, in the report.
    #[arg(long, value_name = "BYTES")]
    fragment_datagram: Option<usize>,

    /// With --fragment-size or --fragment-datagram: the share of each flow's datagrams
    /// fragmented, 0-100 % (spread evenly over its sequence; whole percents with
    /// --fragment-datagram), so one flow mixes fragmented and whole datagrams.
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    fragment_share: Option<f64>,

    /// With --fragment-size: the order a datagram's fragments leave in.
    #[arg(long, value_enum, default_value_t = FragOrderArg::InOrder, requires = "fragment_size")]
    fragment_order: FragOrderArg,

    /// With --fragment-size: cut every datagram cut in a hostile way, to test a device's
    /// reassembly (what it drops and what it accepts; `flowlane sink` counts each by
    /// reason, and drops an overlapping datagram whole, as Linux does for IPv6).
    #[arg(long, value_enum, requires = "fragment_size")]
    fragment_attack: Option<FragAttackArg>,

    /// The first flow id carried in the headers (ids count up from it): two generators
    /// feeding one sink keep their flows apart, e.g. a probe beside a flood.
    #[arg(long, default_value_t = 0)]
    first_id: u16,

    /// Choose the flows' sources at random (distinct) from the --from × --sport ranges instead
    /// of counting up through them; the same --seed gives the same flows.
    #[arg(long)]
    random: bool,

    /// Seed for --random.
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// RSS placement: this many flows for each receive queue of the model.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    per_queue: Option<u64>,

    /// Verify, frame by frame, that the receiving NIC hashed and queued each flow as its own
    /// RSS says (`rss verify` around the run): IF here, or IF@NETNS in a namespace of this
    /// host (a lab's DUT: `fldut@NAME-dut`). The result is printed after the run (JSON: the
    /// last step's `rss_verify`); a disagreement makes the exit code 1.
    #[arg(long, value_name = "IF[@NETNS]")]
    verify_rss: Option<String>,

    #[command(flatten)]
    place: PlaceArgs,

    /// Frame size in bytes, Ethernet FCS excluded (60 = the 64-byte minimum frame): UDP payload
    /// = size − 42 (IPv4) or − 62 (IPv6). Larger than the path MTU means IP fragments (udp
    /// mode). A comma list (60,124,508,1514) is a sweep: one step per size, each with the same
    /// --count/--duration and --rate, and a table at the end; each step's flows carry ids of
    /// their own (step k: ids + k × --flows), so a sink across the sweep reports the steps
    /// apart and finds no duplicates. Default: the smallest frame that
    /// carries the 16-byte flowlane header — 60 for IPv4 (the minimum frame), 78 for IPv6.
    #[arg(long, short = 'l', value_parser = parse_size_list, conflicts_with = "payload")]
    size: Option<SizeList>,

    /// A mix of sizes instead of one: SIZE:WEIGHT pairs, sizes *including* the 4-byte FCS as
    /// IMIX definitions give them. 64:7,594:4,1518:1 (the simple IMIX) sends 60-, 590- and
    /// 1514-byte frames 7:4:1, interleaved; every flow cycles through the mix.
    #[arg(long, value_parser = parse_imix, conflicts_with_all = ["payload", "size"])]
    imix: Option<Imix>,

    /// UDP payload bytes instead of --size.
    #[arg(long)]
    payload: Option<usize>,

    /// Send exactly this many datagrams (in total over all threads), then stop.
    #[arg(long)]
    count: Option<u64>,

    /// Stop sending after this many seconds.
    #[arg(long, short = 't', value_parser = parse_duration)]
    duration: Option<f64>,

    /// Rate over all threads: packets per second (50000, 50k, 1.5M) or line rate (100Mbit,
    /// 10Gbit: frame + 4 FCS + 20 preamble/gap bytes per packet). Default: as fast as possible.
    #[arg(long, short = 'b', value_parser = parse_rate)]
    rate: Option<Rate>,

    /// Most datagrams leaving at once when paced (token bucket depth).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    burst: u32,

    /// When paced, how long a sender woken late may catch up on what fell due (bursts of
    /// --burst back to back): 10ms, 500us, 0 (one burst only). A longer stall gives up the
    /// rest, and the report says how late the senders were woken and how much time was lost.
    /// udp, raw and xdp modes; xdp-live's program catches up one --burst (it runs in the
    /// kernel, never asleep while it sends).
    #[arg(long, default_value = "10ms", value_parser = parse_catch_up)]
    catch_up: f64,

    /// Datagrams per sendmmsg call.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    batch: u64,

    /// CPUs for sender threads, e.g. `0` or `0,2-3`, or `all` (every CPU this process may
    /// use: in a pod, its cpuset). Default: the first CPU it may use.
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Take echoes back (from `flowlane serve --mode echo`) and account them per flow.
    #[arg(long)]
    echo: bool,

    /// With --echo: write the whole round-trip distribution to this file in HdrHistogram's
    /// percentile-distribution text (.hgrm), in microseconds; a name ending in .hlog gets
    /// HdrHistogram's log instead (the compressed interchange form, nanoseconds, lossless).
    #[arg(long, requires = "echo")]
    histogram: Option<std::path::PathBuf>,

    /// With --echo: loss above this percentage of the datagrams sent makes the exit code 1
    /// (e.g. 0 for none at all, 0.1). Whatever it is set to, a run in which no echo at all
    /// came back fails.
    #[arg(long, value_name = "PCT", requires = "echo", value_parser = parse_pct)]
    max_loss: Option<f64>,

    /// With --echo: seconds to wait for the last echoes after sending stops.
    #[arg(long, value_parser = parse_duration, default_value_t = 1.0)]
    linger: f64,

    /// With --echo: receive buffer per flow socket, bytes (default 8 MiB; forced where
    /// CAP_NET_ADMIN allows). Echoes that overflow it are reported as lost at this host.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    rcvbuf: Option<u64>,

    #[command(flatten)]
    shard: crate::shard::ShardArgs,

    #[command(flatten)]
    live: LiveArgs,
}

pub fn run(a: BlastArgs) -> CmdResult {
    let cfg = config(&a)?;
    if let Some(p) = &a.histogram {
        crate::side::check("--histogram", p)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let (mut log, stream) = (a.live.log(), a.live.stream());
    let mut devs: Vec<RunDev> = cfg
        .mode
        .frames()
        .into_iter()
        .flat_map(FrameSettings::devs)
        .map(RunDev::here)
        .collect();
    devs.extend(cfg.verify_rss.as_ref().map(|v| RunDev {
        dev: v.dev.clone(),
        netns: v.netns.clone(),
    }));
    let host = crate::host::before_run(&cfg.cpus, &devs);
    let mut said_host = false;
    let mut report = blast::run(&cfg, &stop, &mut |event| match event {
        BlastEvent::StepStarted(s) => {
            log.line(&banner(&s));
            if !said_host {
                crate::host::say(&mut log, &host);
                said_host = true;
            }
        }
        BlastEvent::Tick(t) => {
            stream.interval(&t);
            if !a.live.quiet {
                log.line(&status(&t))
            }
        }
        BlastEvent::StepDone(r) => {
            if a.live.json || stream.on() {
                for p in &r.problems {
                    errln!("flowlane: {p}");
                }
            } else {
                print_step(&r, &a);
            }
            for e in &r.errors {
                errln!("flowlane: sender {} stopped: {}", e.worker, e.error);
            }
        }
    })
    .map_err(Failure::from_tool)?;
    report.host = Some(host);
    if !(a.live.json || stream.on()) {
        if let Some(v) = report.steps.last().and_then(|s| s.rss_verify.as_deref()) {
            print_verify(v);
        }
    }
    if a.live.json || stream.on() {
        let out = serde_json::to_value(report.json())
            .map_err(|e| Failure::runtime(anyhow::anyhow!("the report as JSON: {e}")))?;
        if stream.on() {
            stream.last(&out)?;
        } else {
            print_json(&out)?;
        }
    } else if report.sweep {
        outln!();
        outln!("size sweep ({} steps):", report.steps.len());
        outln!(
            "  {:>6}  {:>12}  {:>10}  generator",
            "frame",
            "tx pps",
            "Mbps"
        );
        for s in &report.steps {
            outln!(
                "  {:>6}  {:>12.0}  {:>10.1}  {}",
                s.frame_bytes.map_or("imix".into(), |f| f.to_string()),
                s.tx_pps,
                s.mbps,
                match s.generator_limited {
                    Some(true) => "the limit",
                    Some(false) => "kept the rate",
                    None => "-",
                }
            );
        }
    }
    // After the report: a side file that fails must not cost it.
    if a.histogram.is_some() {
        crate::live::write_histogram(a.histogram.as_deref(), report.round_trips().as_ref())?;
    }
    Ok(if report.ok() && !report.steps.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The verification's lines after a run.
fn print_verify(v: &flowlane_tools::verify::VerifyReport) {
    let s = &v.summary;
    outln!(
        "rss verify on {}: {} flows, {} frames; {}",
        v.dev,
        s.flows,
        v.frames,
        if s.compared {
            format!(
                "hash agrees for {} of {}, queue for {} of {}",
                s.hash_agrees, s.flows, s.queue_agrees, s.flows
            )
        } else {
            v.model.clone()
        }
    );
    if let Some(why) = &v.no_nic_hash {
        outln!("  NIC hash not read: {why}");
    }
    for f in &v.flows {
        outln!(
            "  {} -> {}: {} frames on queue {}{}",
            f.src,
            f.dst,
            f.frames,
            f.queue,
            f.expected_queue.map_or(String::new(), |q| format!(
                " (the table's: {q}; {})",
                f.verdict
            ))
        );
    }
    for p in &v.problems {
        outln!("!! rss verify: {p}");
    }
}

/// The mode with its own flags; another mode's flag is refused, saying whose it is.
fn mode(a: &BlastArgs) -> Result<Mode, Failure> {
    let usage = |m: String| Failure::usage(anyhow::anyhow!(m));
    let frame_flags = [
        (!a.dev.is_empty(), "--dev"),
        (a.dst_mac.is_some(), "--dst-mac"),
        (a.vlan.is_some(), "--vlan"),
        (a.ttl.is_some(), "--ttl"),
    ];
    let frames = || match a.dev.split_first() {
        Some((dev, also)) => Ok(FrameSettings {
            dev: dev.clone(),
            dst_mac: a.dst_mac,
            vlan: a.vlan,
            ttl: a.ttl,
            also: also.to_vec(),
        }),
        None => Err(usage(
            "the raw, xdp and xdp-live modes send frames on an interface: give it with --dev"
                .into(),
        )),
    };
    if a.mode != ModeArg::Udp && a.echo {
        return Err(usage(
            "--echo is for --mode udp, which takes echoes on its sockets (frames are counted \
             at the receiver: `flowlane sink`, `flowlane serve`, or the interface counters)"
                .into(),
        ));
    }
    Ok(match a.mode {
        // A capture on UDP sockets is refused by blast itself, with what to use instead.
        ModeArg::Udp if a.pcap.is_some() => Mode::UDP,
        ModeArg::Udp => {
            if let Some((_, flag)) = frame_flags.iter().find(|f| f.0) {
                return Err(usage(format!(
                    "{flag} is for the frame modes (--mode raw, xdp or xdp-live), which build \
                     their own headers; UDP sockets leave by the kernel's route"
                )));
            }
            Mode::Udp {
                echo: a.echo.then(|| Echo {
                    max_loss_pct: a.max_loss,
                    linger_s: a.linger,
                    rcvbuf: a.rcvbuf.map(|b| b as usize),
                }),
            }
        }
        ModeArg::Raw => Mode::Raw(frames()?),
        ModeArg::Xdp => Mode::Xdp(frames()?),
        ModeArg::XdpLive => Mode::XdpLive(frames()?),
    })
}

/// The command line as blast's configuration.
fn config(a: &BlastArgs) -> Result<BlastConfig, Failure> {
    // None only with --pcap (clap asks for --to otherwise).
    let to = a.to.as_ref().map(DestRanges::first);
    let per_frame = a.flowlen.is_some() || a.src_mac_count.is_some() || a.dst_mac_count.is_some();
    let spray = match &a.to {
        Some(d) if d.is_range() || per_frame => Some(Spray {
            dst: d.addrs,
            dport: d.ports,
            random: a.dst_random,
            flowlen: a.flowlen.unwrap_or(1),
            src_macs: a.src_mac_count.unwrap_or(1),
            dst_macs: a.dst_mac_count.unwrap_or(1),
        }),
        _ if a.dst_random => {
            return Err(Failure::usage(anyhow::anyhow!(
                "--dst-random draws from a destination range: give --to one (e.g. \
                 198.18.16.0/20:9000)"
            )))
        }
        _ => None,
    };
    let placement = a.place.placement(a.per_queue, "udp4")?;
    if a.fragment_share.is_some() && a.fragment_size.is_none() && a.fragment_datagram.is_none() {
        return Err(Failure::usage(anyhow::anyhow!(
            "--fragment-share needs what to fragment: --fragment-size (frame modes) or \
             --fragment-datagram (UDP mode)"
        )));
    }
    Ok(BlastConfig {
        metrics: a.live.metrics,
        mode: mode(a)?,
        to,
        from: a.from,
        sport: a.sport,
        flows: a.flows,
        random: a.random,
        seed: a.seed,
        placement,
        verify_rss: a.verify_rss.as_deref().map(|spec| {
            let (dev, netns) = match spec.split_once('@') {
                Some((d, n)) => (d, Some(n.to_string())),
                None => (spec, None),
            };
            VerifyAt {
                dev: dev.into(),
                netns,
            }
        }),
        frames: match (&a.imix, a.payload, &a.size) {
            (Some(m), _, _) => Frames::Imix(m.0.clone()),
            (None, Some(p), _) => Frames::Payload(p),
            (None, None, Some(s)) => Frames::Sizes(s.0.clone()),
            (None, None, None) => Frames::Auto,
        },
        count: a.count,
        duration_s: a.duration,
        rate: a.rate,
        burst: a.burst,
        catch_up_s: a.catch_up,
        batch: a.batch as usize,
        cpus: match &a.cpus {
            Some(c) => usable_cpus(Some(c))?,
            // One sender thread, on the first CPU this process may use.
            None => usable_cpus(None)?.into_iter().take(1).collect(),
        },
        interval_s: a.live.interval,
        spray,
        fragments: a.fragment_size.map(|piece| blast::Fragmenting {
            piece,
            share: a.fragment_share.unwrap_or(100.0) / 100.0,
            order: match a.fragment_order {
                FragOrderArg::InOrder => blast::FragOrder::InOrder,
                FragOrderArg::Reverse => blast::FragOrder::Reverse,
                FragOrderArg::OddEven => blast::FragOrder::OddEven,
                FragOrderArg::Random => blast::FragOrder::Random,
            },
            attack: a.fragment_attack.map(|k| match k {
                FragAttackArg::OverlapForward => blast::FragAttack::OverlapForward,
                FragAttackArg::OverlapBack => blast::FragAttack::OverlapBack,
                FragAttackArg::TinyFirst => blast::FragAttack::TinyFirst,
                FragAttackArg::Duplicate => blast::FragAttack::Duplicate,
                FragAttackArg::Incomplete => blast::FragAttack::Incomplete,
                FragAttackArg::Teardrop => blast::FragAttack::Teardrop,
            }),
        }),
        kernel_fragments: a.fragment_datagram.map(|payload| blast::KernelFragmenting {
            share: a.fragment_share.unwrap_or(100.0) / 100.0,
            payload,
        }),
        first_id: a.first_id,
        sharding: a.shard.sharding()?,
        pcap: a.pcap.as_ref().map(|path| PcapSource {
            path: path.clone(),
            mode: match a.pcap_mode {
                PcapModeArg::Stamp => ReplayMode::Stamp,
                PcapModeArg::Verbatim => ReplayMode::Verbatim,
            },
        }),
    })
}

/// The line a step starts with (on stderr with --json).
fn banner(s: &StepStart) -> String {
    if let Some(r) = &s.replay {
        return format!(
            "flowlane blast ({}): {} of the {} frames of {} ({}{}{}) on {} thread(s) (CPUs {:?}), {}",
            mode_name(s.mode),
            r.frames_used,
            r.frames_in_file,
            r.file,
            match r.mode {
                ReplayMode::Stamp => format!("stamped, {} flow(s)", r.flows),
                ReplayMode::Verbatim => "verbatim".into(),
            },
            if r.macs_rewritten { ", MACs set" } else { ", MACs as captured" },
            r.left_out
                .iter()
                .map(|(why, n)| format!(", {n} left out: {why}"))
                .collect::<String>(),
            s.cpus.len(),
            s.cpus,
            pace(s, "frames"),
        );
    }
    let sizes = match (s.frames.as_slice(), s.payloads.as_slice()) {
        ([frame], [payload]) => format!("{frame}-byte frames ({payload}-byte payload)"),
        (cycle, _) => format!(
            "IMIX of {} frames per cycle, {:.1} bytes on average",
            cycle.len(),
            cycle.iter().sum::<usize>() as f64 / cycle.len().max(1) as f64
        ),
    };
    let to =
        match (&s.spray, s.to) {
            (Some(sp), _) => {
                format!(
            "{}-{} ports {}-{} ({} destinations, {}, {} frame(s) each; MACs: {} source, {} \
             destination)",
            sp.dst.0,
            sp.dst.1,
            sp.dport.0,
            sp.dport.1,
            sp.space(),
            if sp.random { "at random" } else { "counting up" },
            sp.flowlen,
            sp.src_macs,
            sp.dst_macs
        )
            }
            (None, Some(t)) => t.to_string(),
            (None, None) => "the captured destinations".to_string(),
        };
    format!(
        "flowlane blast ({}): {} flow(s) to {to} on {} thread(s) (CPUs {:?}{}), {sizes}, {}{}",
        mode_name(s.mode),
        s.flows,
        s.cpus.len(),
        s.cpus,
        if s.devs.len() > 1 {
            format!("; interfaces {} in turn", s.devs.join(","))
        } else {
            String::new()
        },
        pace(s, "datagrams"),
        if s.echo { ", echoes accounted" } else { "" }
    )
}

/// The rate and count a step was asked for, in words (`50000 pps, 1000 datagrams`).
fn pace(s: &StepStart, unit: &str) -> String {
    let rate = match s.requested_pps {
        Some(p) => format!("{p:.0} pps"),
        None => "unpaced".into(),
    };
    match s.count {
        Some(c) => format!("{rate}, {c} {unit}"),
        None => rate,
    }
}

/// How a mode's frames leave, in words.
fn mode_name(m: BlastMode) -> &'static str {
    match m {
        BlastMode::Udp => "udp",
        BlastMode::Raw => "raw, AF_PACKET TX ring, qdisc bypass",
        BlastMode::Xdp => "xdp, AF_XDP copy mode",
        BlastMode::XdpLive => "xdp-live, XDP_TX of live test-run frames",
    }
}

/// A status line: the interval's rates.
fn status(t: &BlastTick) -> String {
    let secs = t.interval_s.max(1e-9);
    let mut line = format!(
        "{:>7.1}s  tx {:>10.0} pps {:>9.1} Mbps",
        t.elapsed_s,
        t.tx_packets as f64 / secs,
        t.tx_bytes as f64 * 8.0 / secs / 1e6
    );
    if let Some(n) = t.not_back_yet {
        line += &format!(
            "  rx {:>10.0} pps  not back yet {n}",
            t.rx_packets as f64 / secs
        );
    }
    line
}

/// A step's summary as text.
fn print_step(r: &StepReport, a: &BlastArgs) {
    outln!();
    outln!(
        "sent {} datagrams in {:.3} s: {:.0} pps, {:.1} Mbps of {} frames (FCS excluded)",
        r.tx_packets,
        r.duration_s,
        r.tx_pps,
        r.mbps,
        match (r.frame_bytes, &r.replay) {
            (Some(one), _) => format!("{one}-byte"),
            (None, Some(_)) => format!("captured ({:.1}-byte mean)", r.mean_frame()),
            (None, None) => format!("IMIX ({:.1}-byte mean)", r.mean_frame()),
        }
    );
    if let Some(b) = &r.backend {
        outln!("{}", crate::args::backend_line(b));
    }
    if let (Some(d), Some(n)) = (r.device_tx_packets, r.device_refused.filter(|&n| n > 0)) {
        outln!(
            "!! only {d} of {} frames left {}: the device refused {n} (on veth the peer must \
             run NAPI — an XDP program, or GRO on, as `flowlane lab up` sets — and keep up)",
            r.tx_packets,
            a.dev.join(",")
        );
    }
    if r.icmp_errors > 0 {
        outln!(
            "{} ICMP errors came back (e.g. port unreachable: is anything listening at the \
             destination?)",
            r.icmp_errors
        );
    }
    if let Some(req) = r.requested_pps {
        match (
            r.generator_limited,
            &r.generator_limited_reason,
            &r.limited_by,
        ) {
            (Some(true), Some(why), Some(by)) => {
                outln!("requested {req:.0} pps: NOT reached — the {by} was the limit: {why}")
            }
            _ => outln!("requested {req:.0} pps: reached (within 1%)"),
        }
    }
    if let (Some(rx), Some(lost)) = (r.rx_packets, r.lost) {
        outln!(
            "echoes: {rx} received, {lost} lost ({:.4}%), {} reordered, {} duplicates, {} foreign",
            100.0 * lost as f64 / r.tx_packets.max(1) as f64,
            r.reordered.unwrap_or(0),
            r.duplicates.unwrap_or(0),
            r.foreign
        );
        if let Some(own) = r.lost_at_own_socket.filter(|&n| n > 0) {
            outln!(
                "  of the lost, {own} were dropped by this host's own receive buffers (the \
                 generator could not take echoes while sending): not the device's loss"
            );
        }
        if let Some(l) = latency_line(r.latency_ns.as_ref(), "round trip") {
            outln!("{l}");
        }
        for c in r
            .cpu_latency_ns
            .iter()
            .flatten()
            .filter(|_| r.cpu_latency_ns.as_ref().is_some_and(|v| v.len() > 1))
        {
            if let Some(l) = latency_line(c.latency.as_ref(), &format!("  cpu {}", c.cpu)) {
                outln!("{l} ({} echoes)", c.echoes);
            }
        }
    }
    if r.flows.len() <= 16 {
        for f in &r.flows {
            outln!(
                "  flow {:>3} {} -> {}{}: sent {}{}",
                f.id,
                f.src,
                f.dst,
                f.queue.map_or(String::new(), |q| format!(" (queue {q})")),
                f.tx_packets,
                match (f.rx_packets, f.lost, f.reordered) {
                    (Some(b), Some(l), Some(o)) => format!(", back {b}, lost {l}, reordered {o}"),
                    _ => String::new(),
                }
            );
        }
    }
    for p in &r.problems {
        outln!("!! {p}");
    }
    if let Some(c) = r.cpu_ns_per_packet {
        outln!("cost: {c:.0} ns of sender CPU per datagram (thread CPU clocks)");
    }
    outln!("{}", crate::live::pmu_line("datagram", &r.pmu));
    outln!("{}", r.pktgen);
}

/// `--catch-up`: a duration of at most 10 s (a catch-up is a few scheduler slices, not a
/// run's worth of credit).
fn parse_catch_up(s: &str) -> Result<f64, String> {
    let v = parse_duration(s)?;
    if v > 10.0 {
        return Err(format!(
            "`{s}` is longer than a catch-up needs (at most 10s; a few ms covers a late wake-up)"
        ));
    }
    Ok(v)
}
