//! `flowlane blast`: the traffic generator (UDP mode), with loss, reorder and latency accounting
//! of echoes.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::{Args, ValueEnum};
use flowlane_io::sys;
use flowlane_rss::pick::{pick, PickSpec};
use flowlane_rss::Toeplitz;
use flowlane_runtime::blast::{
    packet_ring, xdp_socket, BlastError, BlastJob, BlastReport, Flow, LiveBlaster, RawBlaster,
    RawLink, Sender, UdpBlaster,
};
use flowlane_runtime::{Config, Runtime, Snapshot, StartError};
use flowlane_wire::frame::headers_len;
use flowlane_wire::HEADER_LEN;
use hdrhistogram::Histogram;
use rand::SeedableRng;
use serde_json::{json, Value};

use crate::args::parse_duration;
use crate::args::usable_cpus;
use crate::args::{
    parse_addr_range, parse_cpu_list, parse_endpoint_with_port, parse_imix, parse_port_range,
    parse_rate, parse_size_list, print_json, CpuList, Endpoint, Imix, ModelArgs, Rate, SizeList,
};
use crate::live::{latency_json, latency_line, seconds, stop_on_signals, Log};
use crate::{CmdResult, Failure};

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
    /// One frame size per step (no IMIX), not paced (--rate is refused: each kernel run costs
    /// ~20 ms to set up, so runs last ~200 ms). Needs CAP_BPF and CAP_NET_ADMIN. On veth the
    /// peer must run NAPI (an XDP program or GRO on, as `flowlane lab up` sets); frames the
    /// device refused are reported (device_refused) and make the exit code 1.
    XdpLive,
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
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BlastArgs {
    /// How frames leave.
    #[arg(long, value_enum, default_value_t = ModeArg::Udp)]
    mode: ModeArg,

    /// Interface to send on (raw, xdp and xdp-live modes).
    #[arg(long)]
    dev: Option<String>,

    /// Destination MAC (raw, xdp and xdp-live modes). Default: the neighbour table's entry for --to on --dev.
    #[arg(long, value_parser = parse_mac)]
    dst_mac: Option<[u8; 6]>,

    /// 802.1Q VLAN tag for raw frames (0-4094).
    #[arg(long, value_parser = clap::value_parser!(u16).range(0..=4094))]
    vlan: Option<u16>,

    /// Destination IP:PORT ([V6]:PORT). Traffic goes only here.
    #[arg(long, value_parser = parse_endpoint_with_port)]
    to: Endpoint,

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

    /// With --per-queue: place flows only on these queues (e.g. `0-1`), not on all of them.
    #[arg(long, value_parser = parse_cpu_list, requires = "per_queue")]
    pick_queues: Option<CpuList>,

    #[command(flatten)]
    model: ModelArgs,

    /// Frame size in bytes, Ethernet FCS excluded (60 = the 64-byte minimum frame): UDP payload
    /// = size − 42 (IPv4) or − 62 (IPv6). Larger than the path MTU means IP fragments (udp
    /// mode). A comma list (60,124,508,1514) is a sweep: one step per size, each with the same
    /// --count/--duration and --rate, and a table at the end. Default: the smallest frame that
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

    /// Datagrams per sendmmsg call.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    batch: u64,

    /// CPUs for sender threads, e.g. `0` or `0,2-3`. Default: CPU 0.
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Take echoes back (from `flowlane serve --mode echo`) and account them per flow.
    #[arg(long)]
    echo: bool,

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

    /// Seconds between status lines.
    #[arg(long, short = 'i', value_parser = parse_duration, default_value_t = 1.0)]
    interval: f64,

    /// No status lines.
    #[arg(long)]
    quiet: bool,

    /// Final summary as JSON on stdout (status lines go to stderr).
    #[arg(long, short = 'J')]
    json: bool,
}

/// The source address the kernel would use towards `dst`.
fn route_source(dst: SocketAddr) -> Result<IpAddr, Failure> {
    let any: SocketAddr = if dst.is_ipv4() {
        "0.0.0.0:0"
            .parse()
            .map_err(|e| Failure::runtime(anyhow!("{e}")))?
    } else {
        "[::]:0"
            .parse()
            .map_err(|e| Failure::runtime(anyhow!("{e}")))?
    };
    let s = UdpSocket::bind(any).map_err(|e| Failure::runtime(anyhow!("socket: {e}")))?;
    s.connect(dst)
        .and_then(|()| s.local_addr())
        .map(|a| a.ip())
        .map_err(|e| Failure::usage(anyhow!("no route to {dst}: {e}")))
}

/// Flows with their RSS queue (when placed).
fn make_flows(a: &BlastArgs, dst: SocketAddr) -> Result<Vec<(Flow, Option<u32>)>, Failure> {
    let (lo, hi) = match a.from {
        Some(r) => r,
        None => {
            let s = route_source(dst)?;
            (s, s)
        }
    };
    if lo.is_ipv4() != dst.is_ipv4() {
        return Err(Failure::usage(anyhow!(
            "--from and --to are different address families"
        )));
    }
    if let Some(k) = a.per_queue {
        let model = a.model.build()?;
        let spec = PickSpec {
            src_addrs: (lo, hi),
            dst: dst.ip(),
            src_ports: a.sport.unwrap_or((1024, 65535)),
            dst_port: dst.port(),
            hash_ports: true,
            queues: a
                .pick_queues
                .as_ref()
                .map(|q| q.0.iter().map(|&x| x as u32).collect())
                .unwrap_or_default(),
            per_queue: Some(k),
        };
        let hasher = Toeplitz::new(&a.model.key);
        let r = pick(&hasher, &model, &spec).map_err(Failure::usage)?;
        let mut flows = Vec::new();
        for q in &r.queues {
            if (q.tuples.len() as u64) < k {
                return Err(Failure::usage(anyhow!(
                    "queue {} is reached by only {} flows in the source range; widen --from or \
                     --sport",
                    q.queue,
                    q.tuples.len()
                )));
            }
        }
        // Interleaved (queue 0's first flow, queue 1's first, …, queue 0's second, …), so that
        // each sending thread's contiguous share of the flows covers every queue: which CPU
        // sends a flow says nothing about where it should be received.
        let interleaved = (0..k as usize).flat_map(|i| {
            r.queues
                .iter()
                .filter_map(move |q| q.tuples.get(i).map(|p| (q.queue, p)))
        });
        for (queue, p) in interleaved {
            let Some((sport, _)) = p.tuple.ports() else {
                continue;
            };
            let id = u16::try_from(flows.len())
                .map_err(|_| Failure::usage(anyhow!("at most 65536 flows")))?;
            let src = SocketAddr::new(p.tuple.src(), sport);
            flows.push((Flow { id, src, dst }, Some(queue)));
        }
        return Ok(flows);
    }
    let naddr = pick_span(lo, hi);
    let (plo, phi) = a.sport.unwrap_or((0, 0));
    let nport = (phi - plo) as u64 + 1;
    let n = a.flows as u64;
    if a.sport.is_some() && n > naddr.saturating_mul(nport) {
        return Err(Failure::usage(anyhow!(
            "{n} flows need {n} distinct (address, port) sources; the ranges give {}",
            naddr.saturating_mul(nport)
        )));
    }
    let space = naddr.saturating_mul(nport);
    // Source i of the ranges: address i / nport, port i % nport.
    let order: Vec<u64> = if a.random {
        if n > space {
            return Err(Failure::usage(anyhow!(
                "--random picks {n} distinct sources; the ranges give {space}: widen --from or \
                 --sport"
            )));
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed);
        let space = usize::try_from(space).unwrap_or(usize::MAX);
        rand::seq::index::sample(&mut rng, space, n as usize)
            .into_iter()
            .map(|i| i as u64)
            .collect()
    } else {
        (0..n).collect()
    };
    let base = flowlane_rss::pick::addr_to_u128(lo);
    order
        .into_iter()
        .enumerate()
        .map(|(id, i)| {
            let port = if a.sport.is_some() {
                plo + (i % nport) as u16
            } else {
                0
            };
            let addr_i = (i / nport) % naddr;
            let v = base + addr_i as u128;
            let src = match lo {
                IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from(v as u32)),
                IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(v)),
            };
            Ok((
                Flow {
                    id: id as u16,
                    src: SocketAddr::new(src, port),
                    dst,
                },
                None,
            ))
        })
        .collect()
}

/// Addresses in an inclusive range (capped at u64).
fn pick_span(lo: IpAddr, hi: IpAddr) -> u64 {
    let d = flowlane_rss::pick::addr_to_u128(hi) - flowlane_rss::pick::addr_to_u128(lo);
    u64::try_from(d).map_or(u64::MAX, |d| d.saturating_add(1))
}

/// Splits `total` into `parts` shares that add up exactly.
fn split(total: u64, parts: usize, i: usize) -> u64 {
    let p = parts.max(1) as u64;
    total / p + u64::from((i as u64) < total % p)
}

/// What every step of a run shares, resolved once from the command line.
struct Plan {
    dst: SocketAddr,
    /// Frame bytes around the UDP payload.
    hdrs: usize,
    flows: Vec<(Flow, Option<u32>)>,
    link: Option<RawLink>,
    cpus: Vec<usize>,
    duration: Option<Duration>,
    interval: Duration,
    linger: Duration,
}

/// The default frame size: the smallest that carries the flowlane header — the 60-byte
/// minimum frame for IPv4 (18 bytes of payload), 14 + 40 + 8 + 16 = 78 bytes for IPv6.
fn default_size(v6: bool) -> usize {
    if v6 {
        14 + 40 + 8 + HEADER_LEN
    } else {
        60
    }
}

/// The steps of a run: each a cycle of frame sizes (FCS excluded) — one size, an IMIX
/// sequence, or one step per size of a sweep.
fn steps(a: &BlastArgs, hdrs: usize, v6: bool) -> Result<Vec<Vec<usize>>, Failure> {
    let steps: Vec<Vec<usize>> = match (&a.imix, a.payload) {
        (Some(m), _) => vec![m.sequence()],
        (None, Some(p)) => vec![vec![p + hdrs]],
        (None, None) => match &a.size {
            Some(sizes) => sizes.0.iter().map(|&s| vec![s]).collect(),
            None => vec![vec![default_size(v6)]],
        },
    };
    let max_payload = if v6 { 65_527 } else { 65_507 };
    let family = if v6 { "IPv6" } else { "IPv4" };
    for &frame in steps.iter().flatten() {
        if frame < hdrs {
            return Err(Failure::usage(anyhow!(
                "a {frame}-byte frame is below the {hdrs} bytes of Ethernet, {family} and UDP \
                 headers"
            )));
        }
        let payload = frame - hdrs;
        if payload > max_payload {
            return Err(Failure::usage(anyhow!(
                "a UDP payload of {payload} bytes is more than an IP datagram can carry \
                 ({max_payload})"
            )));
        }
        if a.echo && payload < HEADER_LEN {
            return Err(Failure::usage(anyhow!(
                "--echo needs the {HEADER_LEN}-byte flowlane header in every payload: frames of \
                 {} bytes or more",
                hdrs + HEADER_LEN
            )));
        }
    }
    Ok(steps)
}

pub fn run(a: BlastArgs) -> CmdResult {
    let port = a.to.port.unwrap_or(0);
    let dst = SocketAddr::new(a.to.addr, port);
    if port == 0 {
        return Err(Failure::usage(anyhow!("--to needs a port other than 0")));
    }
    let v6 = dst.is_ipv6();
    let raw = a.mode != ModeArg::Udp;
    let hdrs = headers_len(v6, raw && a.vlan.is_some());
    if a.mode == ModeArg::XdpLive && a.rate.is_some() {
        return Err(Failure::usage(anyhow!(
            "--mode xdp-live cannot pace: each kernel run of the program costs ~20 ms to set up, \
             so frames leave in runs of ~200 ms at full speed. Use --mode xdp or raw with --rate \
             (or --count/--duration to bound an xdp-live run)"
        )));
    }
    if raw && a.echo {
        return Err(Failure::usage(anyhow!(
            "--echo takes echoes on UDP sockets: use --mode udp (raw and xdp frames are counted \
             at the receiver: `flowlane sink`, `flowlane serve`, or the interface counters)"
        )));
    }
    let steps = steps(&a, hdrs, v6)?;
    let duration = a.duration.map(|d| seconds("--duration", d)).transpose()?;
    let interval = seconds("--interval", a.interval)?;
    let linger = seconds("--linger", a.linger)?;
    if a.count == Some(0) {
        return Err(Failure::usage(anyhow!("--count must be at least 1")));
    }
    if steps.len() > 1 && a.count.is_none() && duration.is_none() {
        return Err(Failure::usage(anyhow!(
            "a size sweep needs --count or --duration: each step runs that long"
        )));
    }
    let cpus = match &a.cpus {
        Some(c) => usable_cpus(Some(c))?,
        // One sender thread, on the first CPU this process may use.
        None => usable_cpus(None)?.into_iter().take(1).collect(),
    };
    let mut flows = make_flows(&a, dst)?;
    let link = if raw {
        // Frames need real source ports: the kernel does not choose them here.
        for (f, _) in flows.iter_mut().filter(|(f, _)| f.src.port() == 0) {
            f.src.set_port(10_000 + f.id % 50_000);
        }
        let largest = steps.iter().flatten().copied().max().unwrap_or(hdrs);
        Some(raw_link(&a, dst, largest)?)
    } else {
        None
    };
    // Never more threads than flows: a thread needs a flow to send on.
    let nthreads = cpus.len().min(flows.len()).max(1);
    let plan = Plan {
        dst,
        hdrs,
        flows,
        link,
        cpus: cpus.into_iter().take(nthreads).collect(),
        duration,
        interval,
        linger,
    };
    for frames in &steps {
        if let Some(r) = a.rate {
            check_line_rate(a.dev.as_deref(), dst, frames, r.pps(mean(frames)))?;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let mut log = Log::new(a.json);
    let mut done = Vec::new();
    let mut failed = false;
    for frames in &steps {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let (mut summary, errors) = run_step(&a, &plan, frames, &stop, &mut log)?;
        summary.judge(&a);
        if !a.json {
            summary.print(&a);
        }
        for (w, e) in &errors {
            eprintln!("flowlane: sender {w} stopped: {e}");
        }
        let broken = !errors.is_empty() || summary.device_refused().is_some_and(|r| r > 0);
        if a.json {
            for p in &summary.problems {
                eprintln!("flowlane: {p}");
            }
        }
        failed |= broken || !summary.problems.is_empty();
        done.push(summary);
        if broken {
            break;
        }
    }
    if a.json {
        match done.as_slice() {
            [one] if steps.len() == 1 => print_json(&one.json(&a))?,
            all => print_json(&json!({
                "sweep": all.iter().map(|s| s.json(&a)).collect::<Vec<_>>(),
            }))?,
        }
    } else if steps.len() > 1 {
        println!();
        println!("size sweep ({} steps):", done.len());
        println!(
            "  {:>6}  {:>12}  {:>10}  generator",
            "frame", "tx pps", "Mbps"
        );
        for s in &done {
            println!(
                "  {:>6}  {:>12.0}  {:>10.1}  {}",
                s.frame_desc(),
                s.tx_pps,
                s.mbps(),
                match &s.limited {
                    Some((true, _)) => "the limit",
                    Some((false, _)) => "kept the rate",
                    None => "-",
                }
            );
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Mean of a size cycle.
fn mean(frames: &[usize]) -> f64 {
    frames.iter().sum::<usize>() as f64 / frames.len().max(1) as f64
}

/// One step: every thread sends its share with the frame sizes `frames` (a cycle per flow).
fn run_step(
    a: &BlastArgs,
    plan: &Plan,
    frames: &[usize],
    stop: &Arc<AtomicBool>,
    log: &mut Log,
) -> Result<(Summary, Vec<(usize, String)>), Failure> {
    let nthreads = plan.cpus.len();
    let flows = &plan.flows;
    let requested_pps = a.rate.map(|r| r.pps(mean(frames)));
    let start_ns = sys::monotonic_ns();
    let deadline_ns = plan
        .duration
        .map(|d| start_ns.saturating_add(d.as_nanos() as u64));
    let reports: Vec<Arc<Mutex<Option<BlastReport>>>> =
        (0..nthreads).map(|_| Arc::new(Mutex::new(None))).collect();
    let payloads: Vec<usize> = frames.iter().map(|f| f - plan.hdrs).collect();
    // Worker w gets a contiguous share of the flows (ids stay contiguous per worker).
    let jobs: Vec<BlastJob> = (0..nthreads)
        .map(|w| {
            let per = flows.len() / nthreads;
            let extra = flows.len() % nthreads;
            let from = w * per + w.min(extra);
            let to = from + per + usize::from(w < extra);
            BlastJob {
                flows: flows[from..to].iter().map(|(f, _)| *f).collect(),
                payloads: payloads.clone(),
                overhead: plan.hdrs,
                quota: a.count.map(|c| split(c, nthreads, w)),
                pps: requested_pps.map(|p| p / nthreads as f64),
                burst: a.burst,
                batch: a.batch as usize,
                echo: a.echo,
                linger: plan.linger,
                rcvbuf: a.rcvbuf.map(|b| b as usize),
                deadline_ns,
            }
        })
        .collect();
    let (jobs2, reports2) = (jobs.clone(), reports.clone());
    let rt_cfg = Config {
        cpus: plan.cpus.clone(),
        budget: a.batch as usize,
        wait_ms: 50,
    };
    let (mode, link) = (a.mode, plan.link.clone());
    // The step's own stop flag (the runtime raises it when the step ends); a signal (`stop`)
    // is passed on to it below.
    let step_stop = Arc::new(AtomicBool::new(false));
    let mut rt = Runtime::start(&rt_cfg, step_stop.clone(), move |idx, _cpu| {
        let (job, report) = (jobs2[idx].clone(), reports2[idx].clone());
        let src = job.flows.first().map(|f| f.src);
        let sock_err = |error| BlastError::Socket {
            src: src.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            error,
        };
        match (&link, mode) {
            (Some(l), ModeArg::XdpLive) => {
                LiveBlaster::new(job, l, report).map(|r| Sender::Live(Box::new(r)))
            }
            (Some(l), ModeArg::Xdp) => {
                let x = xdp_socket(l, idx as u32).map_err(sock_err)?;
                RawBlaster::new(job, l, x, report).map(|r| Sender::Xdp(Box::new(r)))
            }
            (Some(l), _) => {
                let ring = packet_ring(l).map_err(sock_err)?;
                RawBlaster::new(job, l, ring, report).map(|r| Sender::Raw(Box::new(r)))
            }
            (None, _) => UdpBlaster::new(job, report).map(|u| Sender::Udp(Box::new(u))),
        }
    })
    .map_err(|e| match e {
        StartError::Pin { .. } => Failure::usage(anyhow!(e.to_string())),
        StartError::Open(BlastError::Socket { ref error, .. })
            if (error.call.contains("AF_PACKET") || error.call.contains("AF_XDP"))
                && error.source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            Failure::usage(anyhow!(
                "{e}: raw and xdp modes need CAP_NET_RAW (run as root or grant the capability)"
            ))
        }
        StartError::Open(BlastError::Socket { ref error, .. })
            if error.call.starts_with("bpf(")
                && error.source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            Failure::usage(anyhow!(
                "{e}: xdp-live mode loads a BPF program and needs CAP_BPF and CAP_NET_ADMIN \
                 (run as root)"
            ))
        }
        StartError::Open(BlastError::Socket { ref error, .. })
            if matches!(
                error.source.kind(),
                std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::AddrInUse
                    | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            Failure::usage(anyhow!(
                "{e} (is --from an address of this host, and are the ports free?)"
            ))
        }
        // A job that cannot be built (e.g. a frame larger than a ring slot) is the command
        // line's to fix.
        StartError::Open(BlastError::Job(_)) => Failure::usage(anyhow!(e.to_string())),
        _ => Failure::runtime(anyhow!(e.to_string())),
    })?;
    let sizes = if frames.len() == 1 {
        format!("{}-byte frames ({}-byte payload)", frames[0], payloads[0])
    } else {
        format!(
            "IMIX of {} frames per cycle, {:.1} bytes on average",
            frames.len(),
            mean(frames)
        )
    };
    log.line(&format!(
        "flowlane blast ({}): {} flow(s) to {} on {} thread(s) (CPUs {:?}), {sizes}, {}{}{}",
        match a.mode {
            ModeArg::Udp => "udp",
            ModeArg::Raw => "raw, AF_PACKET TX ring, qdisc bypass",
            ModeArg::Xdp => "xdp, AF_XDP copy mode",
            ModeArg::XdpLive => "xdp-live, XDP_TX of live test-run frames",
        },
        flows.len(),
        plan.dst,
        nthreads,
        plan.cpus,
        match requested_pps {
            Some(p) => format!("{p:.0} pps"),
            None => "unpaced".into(),
        },
        match a.count {
            Some(c) => format!(", {c} datagrams"),
            None => String::new(),
        },
        if a.echo { ", echoes accounted" } else { "" }
    ));
    // xdp-live frames are handed to the driver with nothing to say whether it took them (veth
    // without NAPI on the peer drops them uncounted); the device's own transmit counter says.
    let dev_tx = || -> Option<u64> {
        let dev = a.dev.as_deref().filter(|_| a.mode == ModeArg::XdpLive)?;
        std::fs::read_to_string(format!("/sys/class/net/{dev}/statistics/tx_packets"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let dev_tx_before = dev_tx();
    rt.go();
    let t0 = Instant::now();
    let mut prev = Snapshot::default();
    let mut prev_t = t0;
    let mut next = t0 + plan.interval;
    while !rt.finished() && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
        let now = Instant::now();
        if now >= next && !a.quiet {
            let cur = total(&rt);
            let d = cur.since(&prev);
            let secs = now.duration_since(prev_t).as_secs_f64().max(1e-9);
            let mut line = format!(
                "{:>7.1}s  tx {:>10.0} pps {:>9.1} Mbps",
                now.duration_since(t0).as_secs_f64(),
                d.tx_packets as f64 / secs,
                d.tx_bytes as f64 * 8.0 / secs / 1e6
            );
            if a.echo {
                line += &format!(
                    "  rx {:>10.0} pps  not back yet {}",
                    d.rx_packets as f64 / secs,
                    cur.tx_packets.saturating_sub(cur.rx_packets)
                );
            }
            log.line(&line);
            prev = cur;
            prev_t = now;
            next += plan.interval;
        }
    }
    step_stop.store(true, Ordering::Relaxed);
    rt.join();
    let errors = rt.errors();
    let t = total(&rt);
    let reports: Vec<BlastReport> = reports
        .iter()
        .filter_map(|r| r.lock().ok().and_then(|mut g| g.take()))
        .collect();
    let mut summary = Summary::new(a, flows, &reports, &t, frames, requested_pps, errors.len());
    if let (Some(b), Some(e)) = (dev_tx_before, dev_tx()) {
        summary.device_tx = Some(e.saturating_sub(b));
    }
    Ok((summary, errors))
}

fn total(rt: &Runtime) -> Snapshot {
    rt.stats()
        .iter()
        .fold(Snapshot::default(), |t, s| t.plus(&s.snapshot()))
}

/// Everything the final report says, computed once for text and JSON.
struct Summary {
    tx: u64,
    tx_bytes: u64,
    rx: u64,
    lost: u64,
    reordered: u64,
    duplicates: u64,
    foreign: u64,
    tx_full: u64,
    icmp_errors: u64,
    own_drops: u64,
    secs: f64,
    tx_pps: f64,
    rx_pps: f64,
    /// The step's frame sizes (one, or an IMIX cycle).
    frames: Vec<usize>,
    requested_pps: Option<f64>,
    limited: Option<(bool, String)>,
    rtt: Option<Histogram<u64>>,
    flows: Vec<Value>,
    errors: usize,
    /// xdp-live: frames the device's transmit counter grew by during the step.
    device_tx: Option<u64>,
    /// What makes the step a failure (exit 1), in words; empty: it did what was asked.
    problems: Vec<String>,
}

impl Summary {
    fn new(
        a: &BlastArgs,
        flows: &[(Flow, Option<u32>)],
        reports: &[BlastReport],
        t: &Snapshot,
        frames: &[usize],
        requested_pps: Option<f64>,
        errors: usize,
    ) -> Summary {
        // The send window: first to last datagram over all threads.
        let first = reports
            .iter()
            .map(|r| r.tx_window_ns.0)
            .filter(|&x| x > 0)
            .min();
        let last = reports.iter().map(|r| r.tx_window_ns.1).max();
        let secs = match (first, last) {
            (Some(f), Some(l)) if l > f => (l - f) as f64 / 1e9,
            _ => 0.0,
        };
        let mut rtt: Option<Histogram<u64>> = None;
        let (mut lost, mut reordered, mut duplicates) = (0, 0, 0);
        let mut flow_json = Vec::new();
        for r in reports {
            if let Some(h) = &r.rtt_ns {
                match rtt.as_mut() {
                    Some(all) => {
                        let _ = all.add(h);
                    }
                    None => rtt = Some(h.clone()),
                }
            }
            for f in &r.flows {
                let queue = flows
                    .iter()
                    .find(|(x, _)| x.id == f.flow.id)
                    .and_then(|(_, q)| *q);
                let mut v = json!({
                    "id": f.flow.id,
                    "src": f.flow.src.to_string(),
                    "dst": f.flow.dst.to_string(),
                    "queue": queue,
                    "tx_packets": f.sent,
                });
                if a.echo {
                    let l = f.rx.lost(Some(f.sent));
                    lost += l;
                    reordered += f.rx.reordered;
                    duplicates += f.rx.duplicates;
                    if let Some(o) = v.as_object_mut() {
                        o.insert("rx_packets".into(), json!(f.rx.unique + f.rx.duplicates));
                        o.insert("lost".into(), json!(l));
                        o.insert("reordered".into(), json!(f.rx.reordered));
                        o.insert("duplicates".into(), json!(f.rx.duplicates));
                    }
                }
                flow_json.push(v);
            }
        }
        let tx_pps = if secs > 0.0 {
            t.tx_packets as f64 / secs
        } else {
            0.0
        };
        let limited = requested_pps.map(|req| {
            // One packet's worth of slack: a window of n packets spans n−1 intervals.
            let achieved = if t.tx_packets > 1 && secs > 0.0 {
                (t.tx_packets - 1) as f64 / secs
            } else {
                req
            };
            if achieved >= 0.99 * req {
                (false, String::new())
            } else if t.tx_full > 0 {
                (
                    true,
                    format!(
                        "the kernel refused datagrams {} times (socket buffer full): the path \
                         below the socket, not pacing, set the rate",
                        t.tx_full
                    ),
                )
            } else {
                (
                    true,
                    format!(
                        "the sending threads could not keep up: CPU-bound, or woken too late \
                         for a bucket of --burst {} datagrams to carry the rate (a loaded CPU \
                         wakes a thread every few ms); add --cpus, a larger --burst or --batch",
                        a.burst
                    ),
                )
            }
        });
        Summary {
            tx: t.tx_packets,
            tx_bytes: t.tx_bytes,
            rx: t.rx_packets,
            lost,
            reordered,
            duplicates,
            foreign: t.foreign,
            tx_full: t.tx_full,
            icmp_errors: t.icmp_errors,
            own_drops: t.socket_drops,
            secs,
            tx_pps,
            rx_pps: if secs > 0.0 {
                t.rx_packets as f64 / secs
            } else {
                0.0
            },
            frames: frames.to_vec(),
            requested_pps,
            limited,
            rtt,
            flows: flow_json,
            errors,
            device_tx: None,
            problems: Vec::new(),
        }
    }

    /// What failed in this step, in words (see [`Summary::problems`]): sender errors, frames
    /// the device refused, a requested rate not reached (saying whether the generator or the
    /// path below it was the limit), no echo at all, loss above --max-loss.
    fn judge(&mut self, a: &BlastArgs) {
        let mut p = Vec::new();
        if self.errors > 0 {
            p.push(format!(
                "{} sender thread(s) stopped with an error",
                self.errors
            ));
        }
        if let Some(r) = self.device_refused().filter(|&r| r > 0) {
            p.push(format!("the device refused {r} frames"));
        }
        if let (Some(req), Some((true, why))) = (self.requested_pps, &self.limited) {
            let by = if self.tx_full > 0 {
                "the path"
            } else {
                "the generator"
            };
            p.push(format!(
                "requested {req:.0} pps, sent {:.0} pps: {by} was the limit ({why})",
                self.tx_pps
            ));
        }
        if a.echo && self.tx > 0 {
            let pct = 100.0 * self.lost as f64 / self.tx as f64;
            if self.lost >= self.tx {
                p.push(format!(
                    "no echo came back of {} datagrams sent{} (is `flowlane serve --mode echo` \
                     running at the destination?)",
                    self.tx,
                    if self.foreign > 0 {
                        format!(" ({} replies were not flowlane echoes)", self.foreign)
                    } else {
                        String::new()
                    }
                ));
            } else if let Some(max) = a.max_loss.filter(|&m| pct > m) {
                p.push(format!(
                    "{pct:.4}% of the datagrams were lost, above --max-loss {max}%"
                ));
            }
        }
        self.problems = p;
    }

    /// Which part set the rate when a requested rate was not reached: `generator` (the
    /// sending threads could not keep up) or `path` (the kernel refused datagrams).
    fn limited_by(&self) -> Option<&'static str> {
        match &self.limited {
            Some((true, _)) if self.tx_full > 0 => Some("path"),
            Some((true, _)) => Some("generator"),
            _ => None,
        }
    }

    /// Frames the generator released that the device did not transmit (xdp-live only; other
    /// traffic on the device can hide a shortfall, never make one up).
    fn device_refused(&self) -> Option<u64> {
        self.device_tx.map(|d| self.tx.saturating_sub(d))
    }

    /// Megabits per second of frames (FCS excluded) over the send window.
    fn mbps(&self) -> f64 {
        if self.secs > 0.0 {
            self.tx_bytes as f64 * 8.0 / self.secs / 1e6
        } else {
            0.0
        }
    }

    /// `60`, or `imix` for a mix.
    fn frame_desc(&self) -> String {
        match self.frames.as_slice() {
            [one] => one.to_string(),
            _ => "imix".into(),
        }
    }

    fn pktgen_line(&self) -> String {
        let usec = (self.secs * 1e6).round() as u64;
        let bps = (self.mbps() * 1e6).round() as u64;
        // pktgen's result line; "OK" only for a step that did what was asked.
        format!(
            "{}: {usec} usec, {} ({}byte,0frags) {:.0}pps {}Mb/sec ({bps}bps) errors: {}",
            if self.problems.is_empty() {
                "OK"
            } else {
                "FAIL"
            },
            self.tx,
            // A mix reports its mean frame, as a line rate computation would use it.
            mean(&self.frames).round(),
            self.tx_pps,
            bps / 1_000_000,
            self.errors as u64 + self.device_refused().unwrap_or(0)
        )
    }

    fn json(&self, a: &BlastArgs) -> Value {
        let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({
            "tx_packets": self.tx,
            "tx_bytes": self.tx_bytes,
            "rx_packets": if a.echo { json!(self.rx) } else { Value::Null },
            "lost": if a.echo { json!(self.lost) } else { Value::Null },
            "reordered": if a.echo { json!(self.reordered) } else { Value::Null },
            "duplicates": if a.echo { json!(self.duplicates) } else { Value::Null },
            "foreign": self.foreign,
            "tx_full": self.tx_full,
            "icmp_errors": self.icmp_errors,
            "lost_at_own_socket": if a.echo { json!(self.own_drops) } else { Value::Null },
            "duration_s": r3(self.secs),
            "tx_pps": self.tx_pps.round(),
            "rx_pps": if a.echo { json!(self.rx_pps.round()) } else { Value::Null },
            "requested_pps": self.requested_pps.map(|p| p.round()),
            "generator_limited": self.limited.as_ref().map(|l| l.0),
            "generator_limited_reason": self.limited.as_ref().filter(|l| l.0).map(|l| l.1.clone()),
            "limited_by": self.limited_by(),
            "problems": self.problems,
            "frame_bytes": match self.frames.as_slice() {
                [one] => json!(one),
                _ => Value::Null,
            },
            "imix_frame_bytes": match self.frames.as_slice() {
                [_] => Value::Null,
                cycle => json!(cycle),
            },
            "mbps": (self.mbps() * 10.0).round() / 10.0,
            "latency_ns": latency_json(self.rtt.as_ref(), "round-trip"),
            "pktgen": self.pktgen_line(),
            "device_tx_packets": self.device_tx,
            "device_refused": self.device_refused(),
            "flows": self.flows,
        })
    }

    fn print(&self, a: &BlastArgs) {
        println!();
        println!(
            "sent {} datagrams in {:.3} s: {:.0} pps, {:.1} Mbps of {} frames (FCS excluded)",
            self.tx,
            self.secs,
            self.tx_pps,
            self.mbps(),
            match self.frames.as_slice() {
                [one] => format!("{one}-byte"),
                cycle => format!("IMIX ({:.1}-byte mean)", mean(cycle)),
            }
        );
        if let (Some(d), Some(r)) = (self.device_tx, self.device_refused().filter(|&r| r > 0)) {
            println!(
                "!! only {d} of {} frames left {}: the device refused {r} (on veth the peer must \
                 run NAPI — an XDP program, or `ethtool -K PEER gro on` — and keep up)",
                self.tx,
                a.dev.as_deref().unwrap_or("the device")
            );
        }
        if self.icmp_errors > 0 {
            println!(
                "{} ICMP errors came back (e.g. port unreachable: is anything listening at the \
                 destination?)",
                self.icmp_errors
            );
        }
        if let Some(req) = self.requested_pps {
            match &self.limited {
                Some((true, why)) => println!(
                    "requested {req:.0} pps: NOT reached — the generator was the limit: {why}"
                ),
                _ => println!("requested {req:.0} pps: reached (within 1%)"),
            }
        }
        if a.echo {
            println!(
                "echoes: {} received, {} lost ({:.4}%), {} reordered, {} duplicates, {} foreign",
                self.rx,
                self.lost,
                100.0 * self.lost as f64 / self.tx.max(1) as f64,
                self.reordered,
                self.duplicates,
                self.foreign
            );
            if self.own_drops > 0 {
                println!(
                    "  of the lost, {} were dropped by this host's own receive buffers (the \
                     generator could not take echoes while sending): not the device's loss",
                    self.own_drops
                );
            }
            if let Some(l) = latency_line(self.rtt.as_ref(), "round trip") {
                println!("{l}");
            }
        }
        if self.flows.len() <= 16 {
            for f in &self.flows {
                println!(
                    "  flow {:>3} {} -> {}{}: sent {}{}",
                    f["id"],
                    f["src"].as_str().unwrap_or(""),
                    f["dst"].as_str().unwrap_or(""),
                    match f["queue"].as_u64() {
                        Some(q) => format!(" (queue {q})"),
                        None => String::new(),
                    },
                    f["tx_packets"],
                    if a.echo {
                        format!(
                            ", back {}, lost {}, reordered {}",
                            f["rx_packets"], f["lost"], f["reordered"]
                        )
                    } else {
                        String::new()
                    }
                );
            }
        }
        for p in &self.problems {
            println!("!! {p}");
        }
        println!("{}", self.pktgen_line());
    }
}

/// A percentage, 0 to 100.
fn parse_pct(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a percentage from 0 to 100")),
    }
}

/// `aa:bb:cc:dd:ee:ff`.
fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || format!("`{s}` is not a MAC address like 02:00:00:00:00:01");
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut m = [0u8; 6];
    for (o, p) in m.iter_mut().zip(parts) {
        *o = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(m)
}

/// Resolves what raw mode needs about `dev`: index, MACs, MTU check.
fn raw_link(a: &BlastArgs, dst: SocketAddr, frame: usize) -> Result<RawLink, Failure> {
    let dev = a
        .dev
        .as_deref()
        .ok_or_else(|| Failure::usage(anyhow!("--mode raw, xdp and xdp-live need --dev IFACE")))?;
    let sys_path = format!("/sys/class/net/{dev}");
    let read = |f: &str| std::fs::read_to_string(format!("{sys_path}/{f}"));
    let mac_text = read("address").map_err(|_| {
        Failure::usage(anyhow!(
            "no interface `{dev}` here (see `ip link`; in a namespace, run inside it)"
        ))
    })?;
    let src_mac = parse_mac(mac_text.trim()).map_err(|e| Failure::runtime(anyhow!(e)))?;
    let mtu: usize = read("mtu")
        .ok()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(1500);
    let max = mtu + 14 + if a.vlan.is_some() { 4 } else { 0 };
    if frame > max {
        return Err(Failure::usage(anyhow!(
            "a {frame}-byte frame is above what {dev} carries (MTU {mtu}: at most {max} bytes \
             without FCS)"
        )));
    }
    let ifindex = sys::packet::ifindex(dev).map_err(|e| Failure::usage(anyhow!("{dev}: {e}")))?;
    let dst_mac = match a.dst_mac {
        Some(m) => m,
        None => {
            let out = flowlane_lab::ip(&["neigh", "show", "to", &dst.ip().to_string(), "dev", dev])
                .map_err(|e| Failure::runtime(anyhow!(e)))?;
            let mac = out
                .split_whitespace()
                .skip_while(|w| *w != "lladdr")
                .nth(1)
                .and_then(|m| parse_mac(m).ok());
            mac.ok_or_else(|| {
                Failure::usage(anyhow!(
                    "no neighbour entry for {} on {dev}: give --dst-mac, or let the kernel \
                     resolve it first (e.g. ping it once)",
                    dst.ip()
                ))
            })?
        }
    };
    Ok(RawLink {
        ifindex,
        src_mac,
        dst_mac,
        vlan: a.vlan,
        max_frame: frame,
        qdisc_bypass: true,
    })
}

/// Refuses a rate above what the egress link can carry, when the link reports a speed (veth says
/// 10 Gb/s; loopback says nothing and is not checked).
fn check_line_rate(
    dev: Option<&str>,
    dst: SocketAddr,
    frames: &[usize],
    pps: f64,
) -> Result<(), Failure> {
    let frame = mean(frames);
    let dev = match dev {
        Some(d) => d.to_string(),
        None => {
            let Ok(route) = flowlane_lab::ip(&["route", "get", &dst.ip().to_string()]) else {
                return Ok(());
            };
            match route.split_whitespace().skip_while(|w| *w != "dev").nth(1) {
                Some(d) => d.to_string(),
                None => return Ok(()),
            }
        }
    };
    let speed_mbps: Option<f64> = std::fs::read_to_string(format!("/sys/class/net/{dev}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|&s| s > 0.0);
    if let Some(mbps) = speed_mbps {
        let max = mbps * 1e6 / ((frame + 24.0) * 8.0);
        if pps > max * 1.0001 {
            return Err(Failure::usage(anyhow!(
                "--rate {pps:.0} pps is more than {dev} ({mbps:.0} Mb/s) can carry with \
                 {frame:.0}-byte frames: at most {max:.0} pps (frame + 4 FCS + 20 preamble/gap)"
            )));
        }
    }
    Ok(())
}
