//! `flowlane serve`: the RSS-aware UDP echo/sink server.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::{Args, ValueEnum};
use flowlane_io::udp::{self, GroupConfig, GroupError, Steering};
use flowlane_io::SysError;
use flowlane_runtime::serve::{Mode, ServeWorker, SourceCounts};
use flowlane_runtime::{Config, Runtime, Snapshot, StartError};
use serde_json::{json, Value};

use crate::args::parse_duration;
use crate::args::usable_cpus;
use crate::args::{parse_cpu_list, print_json, CpuList};
use crate::live::{seconds, stop_on_signals, Log};
use crate::{CmdResult, Failure};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    /// Send every datagram back to its source, unchanged.
    Echo,
    /// Count and drop.
    Sink,
}

/// Serve UDP with one worker per CPU, each pinned and owning its own socket.
///
/// All workers bind the same address with SO_REUSEPORT; a classic BPF program then hands each
/// datagram to the socket of the worker on the CPU that processed it (`cpu-bpf` steering), so a
/// flow is received, handled and answered on one core. If the program is refused, the kernel's
/// reuseport hash is used and the output says so. Each worker counts the datagrams the kernel
/// dropped because its socket buffer was full (`drops`, the socket's drop counter) and, with an eBPF socket
/// filter, the datagrams it got that the kernel processed on another CPU (`missteered`: 0 when
/// steering works; compare with --no-steer).
///
/// Ctrl-C (or --duration) ends the run and prints the final summary.
///
/// Examples:
///   flowlane serve --bind 198.18.0.2:8080
///   flowlane serve --bind [::]:8080 --mode sink --cpus 0,2-3 --duration 10 --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ServeArgs {
    /// Address to serve on: IP:PORT or [V6]:PORT. The port must be given (not 0): every
    /// worker's socket of the SO_REUSEPORT group binds the same one.
    #[arg(long, value_parser = parse_bind)]
    bind: SocketAddr,

    /// What to do with each datagram.
    #[arg(long, value_enum, default_value_t = ModeArg::Echo)]
    mode: ModeArg,

    /// CPUs to run workers on, e.g. `0,2-3`. Default: every online CPU.
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Datagrams per poll round (NAPI-style quota); a full round polls again at once, a short
    /// one sleeps until the socket is readable.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    budget: u64,

    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, short = 't', value_parser = parse_duration)]
    duration: Option<f64>,

    /// Seconds between live table rows.
    #[arg(long, short = 'i', value_parser = parse_duration, default_value_t = 1.0)]
    interval: f64,

    /// Receive buffer to request per socket, in bytes. With CAP_NET_ADMIN it is forced
    /// (SO_RCVBUFFORCE); otherwise the kernel caps it at net.core.rmem_max. The kernel doubles
    /// it for bookkeeping; the granted size is printed.
    #[arg(long, default_value_t = 4 << 20)]
    rcvbuf: usize,

    /// Send buffer to request per socket, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    sndbuf: usize,

    /// Use the kernel's reuseport hash instead of CPU steering (to compare).
    #[arg(long)]
    no_steer: bool,

    /// Receive with UDP_GRO: the kernel may coalesce a flow's datagrams into one receive
    /// (counted one by one; echoed as GSO segments of the size they came in). Needs a GRO path
    /// (e.g. veth with GRO on); probed at start, turned off with a notice where missing.
    #[arg(long)]
    gro: bool,

    /// Echo with UDP_SEGMENT (GSO): runs of equal-size datagrams (up to 1452 bytes) from one
    /// source in a batch go back as one send that the kernel splits. Probed at start.
    #[arg(long)]
    gso: bool,

    /// Latency mode: spin up to USEC microseconds on the socket before sleeping, with
    /// SO_BUSY_POLL (and SO_PREFER_BUSY_POLL, SO_BUSY_POLL_BUDGET where the kernel has them) so
    /// each check also polls the device queue. Costs a core's worth of CPU per busy worker.
    #[arg(long, value_name = "USEC", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    busy_poll: Option<u32>,

    /// Do not attach the mis-steering detector (an eBPF socket filter per worker; it costs a
    /// few tens of nanoseconds per datagram). `missteered` is then reported as unknown.
    #[arg(long)]
    no_detect: bool,

    /// Count datagrams per source address in each worker (JSON: `workers[].sources`): which
    /// worker got which flow. Costs a hash-map update per datagram.
    #[arg(long)]
    by_source: bool,

    /// With an IPv6 address: accept IPv6 only (no IPv4-mapped clients).
    #[arg(long)]
    v6only: bool,

    /// No live table (the final summary is still printed).
    #[arg(long)]
    quiet: bool,

    /// Final summary as JSON on stdout (the live table goes to stderr).
    #[arg(long, short = 'J')]
    json: bool,
}

/// `--bind`: an address with a port other than 0. With port 0 each worker would get a port of
/// its own from the kernel, so no client could reach them all at one address.
fn parse_bind(s: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s
        .parse()
        .map_err(|_| format!("`{s}` is not IP:PORT (write IPv6 as [2001:2::2]:9000)"))?;
    if addr.port() == 0 {
        return Err(format!(
            "`{s}`: port 0 would give each worker its own random port; name one port for all \
             of them, e.g. {}",
            SocketAddr::new(addr.ip(), 9000)
        ));
    }
    Ok(addr)
}

pub fn run(a: ServeArgs) -> CmdResult {
    let cpus = usable_cpus(a.cpus.as_ref())?;
    let interval = seconds("--interval", a.interval)?;
    let duration = a.duration.map(|d| seconds("--duration", d)).transpose()?;
    let mode = match a.mode {
        ModeArg::Echo => Mode::Echo,
        ModeArg::Sink => Mode::Sink,
    };
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let gcfg = GroupConfig {
        addr: a.bind,
        cpus: cpus.clone(),
        rcvbuf: Some(a.rcvbuf),
        sndbuf: Some(a.sndbuf),
        v6only: a.v6only,
        steer: !a.no_steer,
    };
    // Worker 0 hands a clone of its socket back so steering can be attached once all are bound.
    let first: Arc<Mutex<Option<std::net::UdpSocket>>> = Arc::new(Mutex::new(None));
    let rxq_ovfl = Arc::new(AtomicBool::new(true));
    // Why the detector is off, if it is (first failure wins; the run goes on without it).
    let no_detect: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(
        a.no_detect.then(|| "turned off (--no-detect)".to_string()),
    ));
    // Start-up notices (a feature turned off, and why), said once each.
    let notices: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let (f2, o2, g2, d2, n2) = (
        first.clone(),
        rxq_ovfl.clone(),
        gcfg.clone(),
        no_detect.clone(),
        notices.clone(),
    );
    let detect = !a.no_detect;
    let source_counts: Vec<SourceCounts> = cpus.iter().map(|_| Arc::default()).collect();
    let (sc2, by_source) = (source_counts.clone(), a.by_source);
    let (want_gro, want_gso, busy_poll, budget) = (a.gro, a.gso, a.busy_poll, a.budget as usize);
    let echo = mode == Mode::Echo;
    let batch = a.budget.min(64) as usize;
    let rt_cfg = Config {
        cpus: cpus.clone(),
        budget: a.budget as usize,
        wait_ms: 100,
    };
    let mut rt = Runtime::start(&rt_cfg, stop.clone(), move |idx, cpu| {
        let sock = udp::bind_one(&g2)?;
        if flowlane_io::sys::socket_drops(&sock).is_err() {
            o2.store(false, Ordering::Relaxed);
        }
        if idx == 0 {
            let c = sock.try_clone().map_err(|source| {
                GroupError::Sys(SysError {
                    call: "dup",
                    source,
                })
            })?;
            if let Ok(mut g) = f2.lock() {
                *g = Some(c);
            }
        }
        let mut det = None;
        if detect {
            match udp::MissteerDetector::attach(&sock, cpu) {
                Ok(d) => det = Some(d),
                Err(e) => {
                    if let Ok(mut g) = d2.lock() {
                        g.get_or_insert_with(|| format!("unavailable: {e}"));
                    }
                }
            }
        }
        let notice = |msg: String| {
            if let Ok(mut n) = n2.lock() {
                if !n.contains(&msg) {
                    n.push(msg);
                }
            }
        };
        // GSO is needed to echo a GRO buffer with its datagram boundaries intact.
        let gso_ok = (want_gso || (want_gro && echo))
            && match udp::probe_gso(&sock) {
                Ok(()) => true,
                Err(e) => {
                    notice(format!("GSO off: the kernel refused UDP_SEGMENT ({e})"));
                    false
                }
            };
        let gro_ok = want_gro
            && (!echo || gso_ok)
            && match udp::enable_gro(&sock) {
                Ok(()) => true,
                Err(e) => {
                    notice(format!("GRO off: the kernel refused UDP_GRO ({e})"));
                    false
                }
            };
        if want_gro && echo && !gso_ok {
            notice("GRO off: echoing coalesced datagrams needs GSO".into());
        }
        let mut w = ServeWorker::new(sock, cpu, mode, batch);
        if let Some(us) = busy_poll {
            match udp::set_busy_poll(w.socket(), us, budget) {
                Ok(true) => {}
                Ok(false) => {
                    notice("busy poll without SO_PREFER_BUSY_POLL (kernel older than 5.11)".into())
                }
                Err(e) => notice(format!(
                    "SO_BUSY_POLL refused ({e}); spinning in user space only"
                )),
            }
            w = w.with_busy_poll(us);
        }
        if gro_ok {
            w = w.with_gro();
        }
        if gso_ok && want_gso {
            w = w.with_gso();
        }
        if by_source {
            w = w.with_source_counts(sc2[idx].clone());
        }
        Ok(match det {
            Some(d) => w.with_detector(d),
            None => w,
        })
    })
    .map_err(|e| match e {
        // A CPU that cannot be used, a busy port, a missing privilege or an address that is not
        // here: the user can fix the command line (exit 2). Anything else is a runtime failure.
        StartError::Pin { .. }
        | StartError::Open(
            GroupError::AddrInUse(_)
            | GroupError::PermissionDenied(_)
            | GroupError::AddrNotAvailable(_),
        ) => Failure::usage(anyhow!(e.to_string())),
        _ => Failure::runtime(anyhow!(e.to_string())),
    })?;
    let member = first.lock().ok().and_then(|mut g| g.take());
    let (steering, bufs) = match &member {
        Some(s) => (
            udp::attach_steering(s, &cpus, gcfg.steer),
            udp::buffer_sizes(s).ok(),
        ),
        None => (
            Steering::ReuseportHash {
                reason: "no socket".into(),
            },
            None,
        ),
    };
    drop(member);
    let (rcvbuf, sndbuf) = bufs.unwrap_or((0, 0));
    let detector_off = no_detect.lock().ok().and_then(|g| g.clone());
    let detected = detector_off.is_none();
    let mut log = Log::new(a.json);
    log.line(&format!(
        "flowlane serve: {} on {} worker(s) (CPUs {:?}), mode {:?}, steering {}{}, rcvbuf {} B, sndbuf {} B{}",
        a.bind,
        cpus.len(),
        cpus,
        a.mode,
        steering.name(),
        match &steering {
            Steering::ReuseportHash { reason } => format!(" ({reason})"),
            Steering::CpuBpf => String::new(),
        },
        rcvbuf,
        sndbuf,
        if rxq_ovfl.load(Ordering::Relaxed) { "" } else { ", socket drop counter unavailable" }
    ));
    if let Some(why) = &detector_off {
        log.line(&format!("mis-steering detector {why}"));
    }
    let notices: Vec<String> = notices.lock().map(|n| n.clone()).unwrap_or_default();
    for n in &notices {
        log.line(&format!("notice: {n}"));
    }
    rt.go();
    let start = Instant::now();
    let deadline = duration.and_then(|d| start.checked_add(d));
    let mut prev: Vec<Snapshot> = rt.stats().iter().map(|s| s.snapshot()).collect();
    let mut prev_t = start;
    let mut next = start + interval;
    if !a.quiet {
        log.line(&header());
    }
    while !stop.load(Ordering::Relaxed) && !rt.stopping() {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break;
        }
        if now >= next {
            let cur: Vec<Snapshot> = rt.stats().iter().map(|s| s.snapshot()).collect();
            let secs = now.duration_since(prev_t).as_secs_f64();
            if !a.quiet {
                let mut total = Snapshot::default();
                // Each live row carries the time since the start, as iperf's intervals do.
                let at = format!("{:.1}s", now.duration_since(start).as_secs_f64());
                for (i, (c, p)) in cur.iter().zip(&prev).enumerate() {
                    let d = c.since(p);
                    total = total.plus(&d);
                    log.line(&row(&at, &cpus[i].to_string(), &d, secs, detected));
                }
                log.line(&row(&at, "total", &total, secs, detected));
            }
            prev = cur;
            prev_t = now;
            next += interval;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    rt.join();
    let elapsed = start.elapsed().as_secs_f64();
    let finals: Vec<Snapshot> = rt.stats().iter().map(|s| s.snapshot()).collect();
    let total = finals.iter().fold(Snapshot::default(), |t, s| t.plus(s));
    let errors = rt.errors();
    // Counters as the runtime defines them, plus the derived batch fill. Without the detector
    // `missteered` is null, never a fake 0.
    let worker_json = |cpu: Option<usize>, s: &Snapshot| {
        let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
        if let Some(o) = v.as_object_mut() {
            if let Some(c) = cpu {
                o.insert("cpu".into(), json!(c));
            }
            if detected {
                // The filter counts a datagram as it reaches the socket, before the socket's
                // buffer can drop it: of those, the worker received at least all but the
                // socket's drops and at most what it received at all.
                o.insert(
                    "missteered_received_min".into(),
                    json!(s.missteered.saturating_sub(s.socket_drops)),
                );
                o.insert(
                    "missteered_received_max".into(),
                    json!(s.missteered.min(s.rx_packets)),
                );
            } else {
                o.insert("missteered".into(), Value::Null);
                o.insert("missteered_received_min".into(), Value::Null);
                o.insert("missteered_received_max".into(), Value::Null);
            }
            o.insert(
                "batch_fill".into(),
                json!((s.batch_fill() * 100.0).round() / 100.0),
            );
        }
        v
    };
    if a.json {
        let t = worker_json(None, &total);
        print_json(&json!({
            "workers": cpus.iter().zip(&finals).zip(&source_counts).map(|((&c, s), sc)| {
                let mut w = worker_json(Some(c), s);
                if let (Some(o), Some(counts)) = (w.as_object_mut(), sc.lock().ok().and_then(|mut g| g.take())) {
                    let mut v: Vec<(SocketAddr, u64)> = counts.into_iter().collect();
                    v.sort();
                    o.insert("sources".into(), v.iter().map(|(a, n)| json!({"src": a.to_string(), "packets": n})).collect::<Value>());
                }
                w
            }).collect::<Vec<_>>(),
            "total": t,
            "duration_s": (elapsed * 1000.0).round() / 1000.0,
            "steering": steering.name(),
            "steering_reason": match &steering { Steering::ReuseportHash { reason } => Some(reason.clone()), Steering::CpuBpf => None },
            "missteer_detector": detector_off.clone().unwrap_or_else(|| "ebpf".into()),
            "mode": format!("{:?}", a.mode).to_lowercase(),
            "bind": a.bind.to_string(),
            "gro": a.gro && !notices.iter().any(|n| n.starts_with("GRO off")),
            "gso": a.gso && !notices.iter().any(|n| n.starts_with("GSO off")),
            "busy_poll_us": a.busy_poll,
            "notices": notices,
            "rcvbuf": rcvbuf,
            "sndbuf": sndbuf,
            "errors": errors.iter().map(|(w, e)| json!({"worker": w, "error": e})).collect::<Vec<_>>(),
        }))?;
    } else {
        println!();
        println!(
            "summary over {elapsed:.3} s (steering {}):",
            steering.name()
        );
        println!("{}", header());
        for (c, s) in cpus.iter().zip(&finals) {
            println!("{}", row("all", &c.to_string(), s, elapsed, detected));
        }
        println!("{}", row("all", "total", &total, elapsed, detected));
        if detected && total.missteered > 0 {
            println!(
                "missteer@sk: datagrams the kernel processed on another CPU, counted as they \
                 reached the socket (before its buffer could drop them); the workers received \
                 between {} and {} of them",
                total.missteered.saturating_sub(total.socket_drops),
                total.missteered.min(total.rx_packets)
            );
        }
    }
    for (w, e) in &errors {
        eprintln!("flowlane: worker {w} stopped: {e}");
    }
    Ok(if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn header() -> String {
    format!(
        "{:>7} {:>6} {:>12} {:>14} {:>10} {:>9} {:>12} {:>10} {:>11} {:>6}",
        "time",
        "cpu",
        "rx pkts",
        "rx bytes",
        "rx pps",
        "rx Mbps",
        "echoed",
        "drops",
        "missteer@sk",
        "fill"
    )
}

/// One table row: `at` the time since the start (`all` in the summary), `label` the CPU.
fn row(at: &str, label: &str, d: &Snapshot, secs: f64, detected: bool) -> String {
    let secs = secs.max(1e-9);
    format!(
        "{:>7} {:>6} {:>12} {:>14} {:>10.0} {:>9.1} {:>12} {:>10} {:>11} {:>6.1}",
        at,
        label,
        d.rx_packets,
        d.rx_bytes,
        d.rx_packets as f64 / secs,
        d.rx_bytes as f64 * 8.0 / secs / 1e6,
        d.tx_packets,
        d.socket_drops,
        if detected {
            d.missteered.to_string()
        } else {
            "-".into()
        },
        d.batch_fill()
    )
}
