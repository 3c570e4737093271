//! `flowlane sink`: count and account the frames an interface receives (raw and xdp blasts).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::Args;
use flowlane_io::sys::{self, packet};
use flowlane_runtime::sink::{SinkReport, SinkStop, SinkWorker};
use flowlane_runtime::{Config, Runtime, StartError};
use serde_json::{json, Value};

use crate::args::parse_duration;
use crate::args::print_json;
use crate::args::{usable_cpus, CpuList};
use crate::live::{latency_json, latency_line, seconds, stop_on_signals, Log};
use crate::{CmdResult, Failure};

/// Receive an interface's frames and account flowlane traffic per flow: loss, order, latency.
///
/// Per flow: frames received, lost, reordered and duplicated (from the header's sequence
/// numbers), and one-way latency — the header's transmit time against this host's clock, so
/// sender and sink must share the clock (one host, e.g. two namespaces). The counterpart of
/// `flowlane blast --mode raw|xdp`; it also counts what is not flowlane traffic.
///
/// Frames are read from an AF_PACKET RX ring (a copy of every frame the interface receives;
/// frames this host sends on it are ignored), so the kernel's own path still runs: the sink
/// watches, it does not take packets away. Needs CAP_NET_RAW.
///
/// What is counted where: `malformed` (headers cut short or inconsistent, or a wrong UDP
/// checksum where one can be checked), `foreign` (UDP to the watched port without the flowlane
/// header), `other` (not IP/UDP, fragments, other ports), `ring drops` (frames the kernel could
/// not copy in because the ring was full: the sink was the limit). Lost counts the gaps below
/// each flow's highest sequence number; frames lost after a flow's last one cannot be seen.
///
/// Examples:
///   flowlane sink --dev veth1 --port 9000 --duration 10
///   flowlane sink --dev veth1 --count 100000 --json
///   flowlane sink --dev veth1 --idle 2       # stop 2 s after the traffic stops
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct SinkArgs {
    /// Interface to receive on.
    #[arg(long)]
    dev: String,

    /// Account only UDP to this destination port (others are counted as `other`).
    #[arg(long)]
    port: Option<u16>,

    /// Stop after this many flowlane frames.
    #[arg(long)]
    count: Option<u64>,

    /// Stop after this many seconds.
    #[arg(long, short = 't', value_parser = parse_duration)]
    duration: Option<f64>,

    /// Stop once no frame came for this many seconds (after the first one).
    #[arg(long, value_parser = parse_duration)]
    idle: Option<f64>,

    /// CPU to pin the sink to. Default: the last online CPU (blast defaults to CPU 0).
    #[arg(long)]
    cpu: Option<usize>,

    /// Slots in the receive ring (each holds one frame of the interface's MTU).
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(64..=1_048_576))]
    ring: u64,

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

pub fn run(a: SinkArgs) -> CmdResult {
    let mtu: usize = std::fs::read_to_string(format!("/sys/class/net/{}/mtu", a.dev))
        .ok()
        .and_then(|m| m.trim().parse().ok())
        .ok_or_else(|| {
            Failure::usage(anyhow!(
                "no interface `{}` here (see `ip link`; in a namespace, run inside it)",
                a.dev
            ))
        })?;
    let ifindex = packet::ifindex(&a.dev).map_err(|e| Failure::usage(anyhow!("{}: {e}", a.dev)))?;
    let cpu = match a.cpu {
        Some(c) => usable_cpus(Some(&CpuList(vec![c])))?[0],
        // The last usable CPU: senders default to the first.
        None => usable_cpus(None)?.last().copied().unwrap_or(0),
    };
    if a.count == Some(0) {
        return Err(Failure::usage(anyhow!("--count must be at least 1")));
    }
    let duration = a.duration.map(|d| seconds("--duration", d)).transpose()?;
    let idle = a.idle.map(|d| seconds("--idle", d)).transpose()?;
    let interval = seconds("--interval", a.interval)?;
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let start_ns = sys::monotonic_ns();
    let rules = SinkStop {
        count: a.count,
        deadline_ns: duration.map(|d| start_ns.saturating_add(d.as_nanos() as u64)),
        idle_ns: idle.map(|d| d.as_nanos() as u64),
    };
    let report: Arc<Mutex<Option<SinkReport>>> = Arc::new(Mutex::new(None));
    let report2 = report.clone();
    let (port, slots) = (a.port, a.ring as usize);
    // Room for a VLAN tag besides the Ethernet header.
    let max_frame = mtu + 18;
    let mut rt = Runtime::start(
        &Config {
            cpus: vec![cpu],
            budget: 256,
            wait_ms: 50,
        },
        stop.clone(),
        move |_, _| {
            let ring = packet::RxRing::open(ifindex, slots, max_frame)?;
            Ok::<_, sys::SysError>(SinkWorker::new(ring, port, rules, report2.clone()))
        },
    )
    .map_err(|e| match e {
        StartError::Open(ref err) if err.source.kind() == std::io::ErrorKind::PermissionDenied => {
            Failure::usage(anyhow!(
                "{e}: the sink needs CAP_NET_RAW (run as root or grant the capability)"
            ))
        }
        StartError::Pin { .. } => Failure::usage(anyhow!(e.to_string())),
        _ => Failure::runtime(anyhow!(e.to_string())),
    })?;
    let mut log = Log::new(a.json);
    log.line(&format!(
        "flowlane sink: {} (MTU {mtu}), {}, CPU {cpu}, ring of {slots} frames",
        a.dev,
        match a.port {
            Some(p) => format!("UDP port {p}"),
            None => "any UDP port".into(),
        }
    ));
    rt.go();
    let t0 = Instant::now();
    let (mut prev, mut prev_t, mut next) = (Default::default(), t0, t0 + interval);
    while !rt.finished() && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
        let now = Instant::now();
        if now >= next && !a.quiet {
            let cur: flowlane_runtime::Snapshot =
                rt.stats().first().map(|s| s.snapshot()).unwrap_or_default();
            let d = cur.since(&prev);
            let secs = now.duration_since(prev_t).as_secs_f64().max(1e-9);
            log.line(&format!(
                "{:>7.1}s  rx {:>10.0} pps {:>9.1} Mbps  ring drops {}  malformed {}  foreign {}",
                now.duration_since(t0).as_secs_f64(),
                d.rx_packets as f64 / secs,
                d.rx_bytes as f64 * 8.0 / secs / 1e6,
                cur.socket_drops,
                cur.malformed,
                cur.foreign
            ));
            (prev, prev_t) = (cur, now);
            next += interval;
        }
    }
    rt.join();
    let errors = rt.errors();
    let Some(r) = report.lock().ok().and_then(|mut g| g.take()) else {
        let why = errors.first().map_or("no report".into(), |e| e.1.clone());
        return Err(Failure::runtime(anyhow!("the sink stopped: {why}")));
    };
    let v = summary_json(&r);
    if a.json {
        print_json(&v)?;
    } else {
        print_summary(&v, &r);
    }
    for (_, e) in &errors {
        eprintln!("flowlane: sink stopped: {e}");
    }
    Ok(if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn summary_json(r: &SinkReport) -> Value {
    let c = &r.book.counts;
    let secs = r.window_ns.1.saturating_sub(r.window_ns.0) as f64 / 1e9;
    let (_, lost, reordered, duplicates) = r.book.totals();
    let flows: Vec<Value> = r
        .book
        .seen_flows()
        .map(|(id, f)| {
            json!({
                "id": id,
                "src": f.src.map(|s| s.to_string()),
                "dst": f.dst.map(|s| s.to_string()),
                "rx_packets": f.seq.unique + f.seq.duplicates,
                "lost": f.seq.lost(None),
                "reordered": f.seq.reordered,
                "duplicates": f.seq.duplicates,
                "highest_seq": f.seq.expected().checked_sub(1),
            })
        })
        .collect();
    json!({
        "rx_packets": c.frames,
        "rx_bytes": c.bytes,
        "flowlane_packets": c.flowlane,
        "lost": lost,
        "reordered": reordered,
        "duplicates": duplicates,
        "foreign": c.foreign,
        "other": c.other,
        "malformed": c.malformed + c.bad_checksum,
        "bad_checksum": c.bad_checksum,
        "truncated": c.truncated,
        "ring_drops": r.ring_drops,
        "clock_skew": c.clock_skew,
        "duration_s": (secs * 1000.0).round() / 1000.0,
        "rx_pps": if secs > 0.0 { (c.frames as f64 / secs).round() } else { 0.0 },
        "latency_ns": latency_json(Some(&r.book.latency), "one-way"),
        "flows": flows,
    })
}

fn print_summary(v: &Value, r: &SinkReport) {
    let c = &r.book.counts;
    println!();
    println!(
        "received {} frames ({} bytes) in {} s: {} pps",
        c.frames, c.bytes, v["duration_s"], v["rx_pps"]
    );
    println!(
        "flowlane: {} frames in {} flow(s): lost {}, reordered {}, duplicates {}",
        c.flowlane,
        v["flows"].as_array().map_or(0, Vec::len),
        v["lost"],
        v["reordered"],
        v["duplicates"]
    );
    println!(
        "not accounted: {} malformed ({} bad checksum), {} foreign, {} other, {} truncated",
        v["malformed"], c.bad_checksum, c.foreign, c.other, c.truncated
    );
    if r.ring_drops > 0 {
        println!(
            "{} frames were dropped because the ring was full: the sink, not the path, lost them \
             (a larger --ring, or a less busy CPU)",
            r.ring_drops
        );
    }
    if c.clock_skew > 0 {
        println!(
            "{} frames were stamped after they arrived: the sender's clock is not this host's, \
             latency is not meaningful",
            c.clock_skew
        );
    }
    if let Some(l) = latency_line(
        flowlane_tools::Latency::of(Some(&r.book.latency), "one-way").as_ref(),
        "one-way (send → sink)",
    ) {
        println!("{l}");
    }
    if let Some(flows) = v["flows"].as_array().filter(|f| f.len() <= 16) {
        for f in flows {
            println!(
                "  flow {:>3} {} -> {}: received {}, lost {}, reordered {}, duplicates {}",
                f["id"],
                f["src"].as_str().unwrap_or("?"),
                f["dst"].as_str().unwrap_or("?"),
                f["rx_packets"],
                f["lost"],
                f["reordered"],
                f["duplicates"]
            );
        }
    }
}
