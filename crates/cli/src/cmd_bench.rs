//! `flowlane bench`: the RSS scaling experiment in one command — flows placed on RSS buckets,
//! one pinned server worker per CPU, and for k = 1..N active buckets the seed's five numbers,
//! per-worker counts, steering checks, CPU use and latency; a table as it goes, then
//! `report.json` and a self-contained `report.html`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Context};
use clap::{Args, ValueEnum};
use flowlane_lab::setup::{self, LabConfig, Steer, DUT_IF, GEN_IF, LAB_DUT_V4};
use flowlane_lab::{DevCounters, Netns};
use flowlane_rss::Key;
use serde_json::{json, Value};

use crate::args::usable_cpus;
use crate::args::{parse_duration, parse_rate, Rate};
use crate::args::{parse_key, print_json};
use crate::cmd_lab::{config, SteerArg};
use crate::live::stop_on_signals;
use crate::report;
use crate::{CmdResult, Failure};
use flowlane_tools::blast::StepReport;
use flowlane_tools::serve::ServeReport;

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

    /// Frame size without FCS (60: the minimum frame, an 18-byte UDP payload — the smallest
    /// frame of the FreeBSD experiment).
    #[arg(long, short = 'l', default_value_t = 60, value_parser = clap::value_parser!(u64).range(60..=1514))]
    size: u64,

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
    if a == 0 || a > b || b > 64 {
        return Err(bad());
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

/// Takes a lab this run made down again, however the run ends.
struct LabGuard {
    name: Option<String>,
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Some(n) = self.name.take() {
            if let Err(e) = setup::down(&n) {
                eprintln!("flowlane: taking the lab down: {e}");
            }
        }
    }
}

/// Where one step runs.
struct Target {
    /// Namespaces (gen, dut) — none for loopback.
    lab: Option<(Netns, Netns, LabConfig)>,
    /// Server address.
    to: String,
    ncpus: u32,
    /// The CPUs serve's workers run on (online and allowed to this process); `ncpus` of them.
    cpus: Vec<usize>,
    buckets: u32,
}

/// Per-CPU busy and total jiffies from /proc/stat.
fn cpu_times() -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            let total: u64 = v.iter().take(8).sum();
            let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
            (total - idle.min(total), total)
        })
        .collect()
}

/// Starts `flowlane serve` and waits until its workers are bound (the banner on stderr).
fn start_serve(cmd: &mut Command) -> Result<(Child, std::thread::JoinHandle<String>), Failure> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Failure::runtime(anyhow!("starting flowlane serve: {e}")))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| Failure::runtime(anyhow!("serve: no stderr")))?;
    let mut lines = BufReader::new(stderr).lines();
    let banner = lines.next().and_then(Result::ok).unwrap_or_default();
    if !banner.starts_with("flowlane serve:") {
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let _ = child.kill();
        let _ = child.wait();
        return Err(Failure::runtime(anyhow!(
            "flowlane serve did not start: {banner} {}",
            rest.join(" ")
        )));
    }
    let rest =
        std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"));
    Ok((child, rest))
}

/// Stops serve with SIGINT (it prints its summary) and reads its report: the typed JSON
/// contract, so a field that goes missing fails here instead of reading as zero.
fn stop_serve(
    mut child: Child,
    rest: std::thread::JoinHandle<String>,
) -> Result<ServeReport, Failure> {
    // kill(2), not the `kill` program; if the signal cannot be sent the child is killed, so
    // the wait below always ends.
    if flowlane_io::sys::signal_process(child.id(), flowlane_io::sys::Signal::Interrupt).is_err() {
        let _ = child.kill();
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Failure::runtime(anyhow!("waiting for serve: {e}")))?;
    let err = rest.join().unwrap_or_default();
    serde_json::from_slice(&out.stdout)
        .map_err(|e| Failure::runtime(anyhow!("serve's summary is not JSON ({e}): {err}")))
}

fn counters(ns: &Netns, ifname: &str) -> Result<flowlane_lab::counters::IfCounters, Failure> {
    let d: DevCounters = ns.dev().map_err(|e| Failure::runtime(anyhow!(e)))?;
    d.ifaces
        .get(ifname)
        .copied()
        .ok_or_else(|| Failure::runtime(anyhow!("no interface {ifname} in {}", ns.name())))
}

/// The lab's software-RSS counts per CPU (None: loopback, or steering other than rss).
fn steer_counts(t: &Target) -> Result<Option<Vec<setup::SteerCount>>, Failure> {
    match &t.lab {
        Some((_, d, c)) if c.steer == Steer::Rss => {
            setup::steer_counts(d).map_err(|e| Failure::runtime(anyhow!(e)))
        }
        _ => Ok(None),
    }
}

/// Frames each CPU's software-RSS queue dropped between two readings: handed to the queue but
/// never taken off it (the step is over, so none is still waiting).
fn queue_drops(
    before: &Option<Vec<setup::SteerCount>>,
    after: &Option<Vec<setup::SteerCount>>,
) -> Option<BTreeMap<u64, u64>> {
    let (b, a) = (before.as_ref()?, after.as_ref()?);
    Some(
        a.iter()
            .map(|x| {
                let y = b.iter().find(|y| y.cpu == x.cpu);
                // Saturating: a lab taken down and up again meanwhile starts from zero.
                let redirected = x.redirected.saturating_sub(y.map_or(0, |y| y.redirected));
                let arrived = x.arrived.saturating_sub(y.map_or(0, |y| y.arrived));
                (x.cpu as u64, redirected.saturating_sub(arrived))
            })
            .collect(),
    )
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A UDP port on 127.0.0.1 that is free now (the kernel's pick for port 0).
fn free_loopback_port() -> Result<u16, Failure> {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|e| Failure::runtime(anyhow!("no free UDP port on 127.0.0.1: {e}")))
}

/// Runs `attempt` on the server address `to` (`127.0.0.1:PORT`); when its server could not
/// bind because another program took the port meanwhile, moves `to` to a port `pick` finds
/// free and tries again, at most three times in all.
fn with_free_port<T>(
    to: &mut String,
    mut attempt: impl FnMut(&str) -> Result<T, Failure>,
    mut pick: impl FnMut() -> Result<u16, Failure>,
) -> Result<T, Failure> {
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt(to) {
            Err(f) if tries < 3 && format!("{:#}", f.err).contains("already in use") => {
                let port = pick()?;
                eprintln!("{to} was taken before the server could bind it: using port {port}");
                *to = format!("127.0.0.1:{port}");
            }
            r => return r,
        }
    }
}

/// One step: serve, then blast for `secs`, then the numbers.
fn step(a: &BenchArgs, t: &Target, k: u32, echo: bool) -> Result<Value, Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::runtime(anyhow!("own path: {e}")))?;
    let exe = exe.to_string_lossy().to_string();
    let all_cpus = flowlane_runtime::cpus::format_cpu_list(&t.cpus);
    let mode = if echo { "echo" } else { "sink" };
    let mut serve_cmd = match &t.lab {
        Some((_, dut, _)) => dut.command(&exe),
        None => Command::new(&exe),
    };
    serve_cmd.args([
        "serve", "--bind", &t.to, "--mode", mode, "--cpus", &all_cpus,
    ]);
    serve_cmd.args(["--json", "--quiet", "--by-source"]);
    // Counters before the server starts and after it stops: nothing crosses the link outside
    // the step, and no early return can leave a server running.
    let before = match &t.lab {
        Some((g, d, _)) => Some((counters(g, GEN_IF)?, counters(d, DUT_IF)?)),
        None => None,
    };
    let steer0 = steer_counts(t)?;
    let (serve, rest) = start_serve(&mut serve_cmd)?;
    let cpu0 = cpu_times();
    let threads = k.min(t.ncpus);
    let mut blast_cmd = match &t.lab {
        Some((g, _, _)) => g.command(&exe),
        None => Command::new(&exe),
    };
    let key = match &t.lab {
        Some((_, _, c)) => c.key.clone(),
        None => a.key.to_hex(),
    };
    blast_cmd
        .args(["blast", "--to", &t.to, "--queues", &t.buckets.to_string()])
        .args(["--per-queue", &a.per_bucket.to_string()])
        .args(["--pick-queues", &format!("0-{}", k - 1)])
        .args(["--key", &key, "--size", &a.size.to_string()])
        .args(["--duration", &a.step_secs.to_string()])
        .args([
            "--cpus",
            &flowlane_runtime::cpus::format_cpu_list(&t.cpus[..threads as usize]),
        ])
        .args(["--json", "--quiet"]);
    if t.lab.is_none() {
        blast_cmd.args(["--from", "127.0.0.1"]);
    }
    if echo {
        blast_cmd.args(["--echo", "--linger", "0.5"]);
    }
    if let Some(r) = a.rate {
        blast_cmd.args(["--rate", &r.to_string()]);
    }
    let t0 = Instant::now();
    let out = blast_cmd.output();
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu1 = cpu_times();
    // Datagrams still queued on the server's sockets when it stops would count as lost with
    // no counter to show it: give the workers a moment to read what the client sent last (an
    // overloaded socket holds a few hundred, read in well under a millisecond).
    std::thread::sleep(std::time::Duration::from_millis(100));
    let srv = stop_serve(serve, rest)?;
    let after = match &t.lab {
        Some((g, d, _)) => Some((counters(g, GEN_IF)?, counters(d, DUT_IF)?)),
        None => None,
    };
    let qdrops = queue_drops(&steer0, &steer_counts(t)?);
    let out = out.map_err(|e| Failure::runtime(anyhow!("running flowlane blast: {e}")))?;
    // Exit 1 with a summary is a step blast judged (a rate not reached, loss): bench does its
    // own accounting of those. Anything else is a run that did not happen.
    // The typed contract: a field blast stopped writing fails here, never reads as zero.
    let summary = serde_json::from_slice::<StepReport>(&out.stdout);
    let b: StepReport = match (out.status.code(), summary) {
        (Some(0 | 1), Ok(b)) => b,
        (code, summary) => {
            return Err(Failure::runtime(anyhow!(
                "flowlane blast failed in step {k} (exit {code:?}{}): {}",
                summary
                    .err()
                    .map_or(String::new(), |e| format!(", summary not JSON: {e}")),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };

    // Where each flow should land: its bucket's CPU (the lab's table; loopback: bucket mod CPUs).
    let queue_cpu = |q: u64| -> u64 {
        match &t.lab {
            Some((_, _, c)) => c.queue_cpus.get(q as usize).copied().unwrap_or(0) as u64,
            None => t.cpus[(q % t.ncpus as u64) as usize] as u64,
        }
    };
    let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
    // Each flow's bucket CPU, by source address.
    let mut flow_cpu: BTreeMap<String, u64> = BTreeMap::new();
    for f in &b.flows {
        let q = f.queue.ok_or_else(|| {
            Failure::runtime(anyhow!(
                "blast placed flow {} on no queue (bench asks for RSS placement)",
                f.id
            ))
        })?;
        *expected.entry(queue_cpu(u64::from(q))).or_default() += f.tx_packets;
        flow_cpu.insert(f.src.clone(), queue_cpu(u64::from(q)));
    }
    let flows = &b.flows;
    let mut workers = Vec::new();
    let mut misplaced = 0u64;
    for w in &srv.workers {
        let cpu = w.cpu as u64;
        let got = w.counts.rx_packets;
        let exp = expected.get(&cpu).copied().unwrap_or(0);
        // Datagrams of a flow whose bucket belongs to another CPU.
        for s in w.sources.iter().flatten() {
            if flow_cpu.get(&s.src).is_some_and(|&c| c != cpu) {
                misplaced += s.packets;
            }
        }
        workers.push(json!({
            "cpu": cpu,
            "rx_packets": got,
            "expected": exp,
            "echoed": w.counts.tx_packets,
            "missteered": w.counts.missteered,
            "socket_drops": w.counts.socket_drops,
            "queue_drops": qdrops.as_ref().map(|q| q.get(&cpu).copied().unwrap_or(0)),
        }));
    }
    let (seen, echoed) = (srv.total.rx_packets, srv.total.tx_packets);
    let prog_sent = b.tx_packets;
    let back = match (echo, b.rx_packets) {
        (false, _) => 0,
        (true, Some(n)) => n,
        (true, None) => {
            return Err(Failure::runtime(anyhow!(
                "blast ran with echoes but reported no echo count"
            )))
        }
    };
    let (iface_sent, iface_rx, iface_rx_dropped, iface_back) = match (before, after) {
        (Some((g0, d0)), Some((g1, d1))) => (
            Some(g1.tx_packets - g0.tx_packets),
            Some(d1.rx_packets - d0.rx_packets),
            Some(d1.rx_dropped - d0.rx_dropped),
            Some(g1.rx_packets - g0.rx_packets),
        ),
        _ => (None, None, None, None),
    };
    let busy: Vec<f64> = cpu0
        .iter()
        .zip(&cpu1)
        .map(|(x, y)| {
            let total = y.1.saturating_sub(x.1).max(1) as f64;
            (y.0.saturating_sub(x.0) as f64 / total * 1000.0).round() / 10.0
        })
        .collect();
    let secs = Some(b.duration_s).filter(|&s| s > 0.0).unwrap_or(elapsed);
    let pps = |x: u64| (x as f64 / secs).round() as u64;
    let missteered: u64 = workers.iter().map(|w| n(&w["missteered"])).sum();
    let drops: u64 = workers.iter().map(|w| n(&w["socket_drops"])).sum();
    let qdrops_total: Option<u64> = qdrops.as_ref().map(|q| q.values().sum());
    // Where the datagrams the server never saw went, as far as counters show: its sockets'
    // and CPU queues' drops, its interface's, and frames the client's interface sent that
    // the server's never received.
    let lost = prog_sent.saturating_sub(seen);
    let counted = drops
        + qdrops_total.unwrap_or(0)
        + iface_rx_dropped.unwrap_or(0)
        + iface_sent
            .zip(iface_rx)
            .map_or(0, |(s, r)| s.saturating_sub(r));
    let unexplained = lost.saturating_sub(counted);

    // The checks: what must add up.
    let mut problems = Vec::new();
    if let Some(rx) = iface_rx {
        if seen > rx {
            problems.push(format!(
                "the server program saw {seen} datagrams but its interface received only {rx}"
            ));
        }
    }
    if let Some(sent) = iface_sent {
        if sent < prog_sent {
            problems.push(format!(
                "the client says it sent {prog_sent} but its interface sent {sent}"
            ));
        }
    }
    if echo && back > echoed {
        problems.push(format!(
            "the client got {back} echoes back but the server echoed only {echoed}"
        ));
    }
    if echo && echoed > seen {
        problems.push(format!(
            "the server echoed {echoed} of {seen} datagrams seen"
        ));
    }
    if misplaced > 0 && t.lab.is_some() {
        problems.push(format!(
            "{misplaced} datagrams landed on a worker other than their bucket's (steering: {})",
            match &t.lab {
                Some((_, _, c)) => c.steer.name(),
                None => "loopback, none",
            }
        ));
    }
    if missteered > 0 {
        problems.push(format!(
            "{missteered} datagrams reached a worker after the kernel processed them on another CPU"
        ));
    }
    if unexplained > 0 {
        problems.push(format!(
            "{unexplained} of {lost} datagrams lost where no counter shows: the server's socket \
             drops ({drops}), CPU queue drops ({}), interface drops ({}) and link loss account \
             for {counted}",
            qdrops_total.map_or("not measured".into(), |q| q.to_string()),
            iface_rx_dropped.map_or("not measured".into(), |q| q.to_string()),
        ));
    }
    Ok(json!({
        "mode": mode,
        "buckets": k,
        "flows": flows.len(),
        "client_threads": threads,
        "duration_s": (secs * 1000.0).round() / 1000.0,
        "five": {
            "client_sent": iface_sent,
            "server_received": iface_rx,
            "server_seen": seen,
            "server_echoed": if echo { json!(echoed) } else { Value::Null },
            "client_back": if echo { json!(back) } else { Value::Null },
        },
        "client_program_sent": prog_sent,
        "link_other_frames": iface_sent.map(|sent| sent.saturating_sub(prog_sent)),
        "client_iface_back": if echo { json!(iface_back) } else { Value::Null },
        "server_iface_rx_dropped": iface_rx_dropped,
        "pps": {
            "sent": pps(prog_sent),
            "server_seen": pps(seen),
            "echoed": if echo { json!(pps(echoed)) } else { Value::Null },
            "back": if echo { json!(pps(back)) } else { Value::Null },
        },
        "lost": lost,
        "lost_unexplained": unexplained,
        "workers": workers,
        "misplaced": misplaced,
        "missteered": missteered,
        "socket_drops": drops,
        "queue_drops": qdrops_total,
        "cpu_busy_pct": busy,
        "latency_ns": if echo { json!(b.latency_ns) } else { Value::Null },
        "problems": problems,
    }))
}

fn row_header() -> String {
    format!(
        "{:>4} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  {:>9} {:>7} {:>7}  {}",
        "mode",
        "bkts",
        "sent",
        "received",
        "seen",
        "echoed",
        "back",
        "seen pps",
        "p99 µs",
        "drops",
        "qdrops",
        "per worker (got/expected)"
    )
}

fn row(s: &Value) -> String {
    let f = &s["five"];
    // Numbers as strings: a `serde_json::Value` ignores the width of `{:>11}`, and the
    // columns drifted.
    let show = |v: &Value| match (v.as_u64(), v.as_f64()) {
        (Some(x), _) => x.to_string(),
        (None, Some(x)) => format!("{x:.0}"),
        _ => "-".into(),
    };
    let workers: Vec<String> = s["workers"]
        .as_array()
        .map(|w| {
            w.iter()
                .map(|w| format!("cpu{} {}/{}", w["cpu"], w["rx_packets"], w["expected"]))
                .collect()
        })
        .unwrap_or_default();
    format!(
        "{:>4} {:>5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}  {:>9} {:>7} {:>7}  {}",
        s["mode"].as_str().unwrap_or("?"),
        show(&s["buckets"]),
        show(&f["client_sent"]),
        show(&f["server_received"]),
        show(&f["server_seen"]),
        show(&f["server_echoed"]),
        show(&f["client_back"]),
        show(&s["pps"]["server_seen"]),
        s["latency_ns"]["p99"]
            .as_u64()
            .map_or("-".into(), |p| format!("{:.1}", p as f64 / 1e3)),
        show(&s["socket_drops"]),
        show(&s["queue_drops"]),
        workers.join("  ")
    )
}

/// The line under a row where the client's interface sent more frames than the client
/// program: the difference is other traffic on the link, not bench's datagrams.
fn other_frames_note(s: &Value) -> Option<String> {
    let other = s["link_other_frames"].as_u64().filter(|&o| o > 0)?;
    Some(format!(
        "      sent − client program's {} = {other} frame(s) on the link that were not bench \
         traffic (neighbour discovery, IPv6 router solicitations, …): counted by the \
         interfaces, never by the programs",
        s["client_program_sent"]
    ))
}

pub fn run(a: BenchArgs) -> CmdResult {
    if !(a.step_secs > 0.0 && a.step_secs <= 3600.0) {
        return Err(Failure::usage(anyhow!(
            "--step-secs must be between 0 and 3600 seconds"
        )));
    }
    // Everything the command line says is checked before a lab is built: a run should not
    // fail after minutes for a typo.
    if !a.loopback {
        setup::check_name(&a.name).map_err(|e| Failure::usage(anyhow!(e)))?;
    }
    check_writable(&a.out)?;
    let cpus = usable_cpus(None)?;
    let ncpus = cpus.len() as u32;
    let root = flowlane_lab::can_create_namespaces();
    if !a.loopback && !root {
        return Err(Failure::usage(anyhow!(
            "flowlane bench builds a lab in network namespaces and needs root (CAP_SYS_ADMIN and \
             CAP_NET_ADMIN): run it with sudo — or run `flowlane bench --loopback` for the same \
             steps on 127.0.0.1 (no interfaces or steering: not RSS-faithful)"
        )));
    }
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let mut guard = LabGuard { name: None };
    let mut target = if a.loopback {
        Target {
            lab: None,
            to: format!("127.0.0.1:{}", free_loopback_port()?),
            ncpus,
            cpus: cpus.clone(),
            buckets: a.buckets.map_or(ncpus, |b| b.1),
        }
    } else {
        let cfg = match setup::saved(&a.name) {
            Some(c)
                if setup::status(&a.name)
                    .map(|s| s.namespaces.iter().all(|n| n.1))
                    .unwrap_or(false) =>
            {
                eprintln!(
                    "using lab {} as it is ({} queues, steering {})",
                    c.name,
                    c.queues,
                    c.steer.name()
                );
                c
            }
            _ => {
                let queues = a.buckets.map_or(ncpus, |b| b.1);
                let c = config(&a.name, Some(queues), Steer::from(a.steer), &a.key, false);
                setup::up(&c).map_err(|e| Failure::runtime(anyhow!(e)))?;
                if !a.keep_lab {
                    guard.name = Some(c.name.clone());
                }
                eprintln!(
                    "lab {} is up: {} queues, steering {}",
                    c.name,
                    c.queues,
                    c.steer.name()
                );
                c
            }
        };
        if let Some((_, hi)) = a.buckets {
            if hi > cfg.queues {
                return Err(Failure::usage(anyhow!(
                    "lab {} has {} buckets; --buckets asks for {hi} (take it down, or ask for fewer)",
                    cfg.name,
                    cfg.queues
                )));
            }
        }
        // Software RSS hands each bucket to its CPU: a worker must be able to run there.
        if let Some(&c) = cfg
            .queue_cpus
            .iter()
            .find(|&&c| !cpus.contains(&(c as usize)))
        {
            return Err(Failure::usage(anyhow!(
                "lab {} steers a bucket to CPU {c}, which this process may not use (usable CPUs: \
                 {}); run bench without a CPU restriction",
                cfg.name,
                flowlane_runtime::cpus::format_cpu_list(&cpus)
            )));
        }
        Target {
            to: format!("{LAB_DUT_V4}:9000"),
            ncpus,
            cpus: cpus.clone(),
            buckets: cfg.queues,
            lab: Some((
                Netns::existing(&cfg.gen_ns()),
                Netns::existing(&cfg.dut_ns()),
                cfg,
            )),
        }
    };
    let (lo, hi) = a.buckets.unwrap_or((1, target.buckets));
    let modes: Vec<bool> = match a.mode {
        BenchMode::Echo => vec![true],
        BenchMode::Sink => vec![false],
        BenchMode::Both => vec![false, true],
    };
    let say = |s: &str| {
        if a.json {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    say(&format!(
        "flowlane bench: {} — steps {lo}..{hi} buckets × {} flows each, {} s per step, {}-byte \
         frames, {} server workers",
        match &target.lab {
            Some((_, _, c)) => format!("lab {} (steering {})", c.name, c.steer.name()),
            None => "LOOPBACK 127.0.0.1 (not RSS-faithful: no NIC queues, no steering)".into(),
        },
        a.per_bucket,
        a.step_secs,
        a.size,
        ncpus
    ));
    say(&row_header());
    let mut steps = Vec::new();
    'outer: for k in lo..=hi {
        for &echo in &modes {
            if stop.load(Ordering::Relaxed) {
                break 'outer;
            }
            let s = if a.loopback {
                // The port was free when picked, but another program can take it before the
                // step's server binds it: then the step runs again on a new one.
                let (ncpus, buckets) = (target.ncpus, target.buckets);
                let cpus = target.cpus.clone();
                with_free_port(
                    &mut target.to,
                    |to| {
                        let t = Target {
                            lab: None,
                            to: to.to_string(),
                            ncpus,
                            cpus: cpus.clone(),
                            buckets,
                        };
                        step(&a, &t, k, echo)
                    },
                    free_loopback_port,
                )?
            } else {
                step(&a, &target, k, echo)?
            };
            say(&row(&s));
            if let Some(note) = other_frames_note(&s) {
                say(&note);
            }
            for p in s["problems"].as_array().into_iter().flatten() {
                say(&format!("     !! {}", p.as_str().unwrap_or("")));
            }
            steps.push(s);
        }
    }
    let problems: Vec<Value> = steps
        .iter()
        .flat_map(|s| s["problems"].as_array().cloned().unwrap_or_default())
        .collect();
    let lab_json = match &target.lab {
        Some((_, _, c)) => json!({
            "name": c.name,
            "queues": c.queues,
            "steer": c.steer.name(),
            "key": c.key,
            "reta_size": c.reta.len(),
            "hash": if c.ports { "4-tuple" } else { "2-tuple" },
        }),
        None => Value::Null,
    };
    let rep = json!({
        "schema": "flowlane-bench-report/1",
        "flowlane_version": env!("CARGO_PKG_VERSION"),
        "created_unix": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "host": {
            "cpus": ncpus,
            "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        },
        "rss_faithful": target.lab.is_some(),
        "lab": lab_json,
        "frame_bytes": a.size,
        "step_secs": a.step_secs,
        "per_bucket": a.per_bucket,
        "steps": steps,
        "problems": problems,
        "interrupted": stop.load(Ordering::Relaxed),
    });
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("creating {}", a.out.display()))
        .map_err(Failure::runtime)?;
    let jpath = a.out.join("report.json");
    let hpath = a.out.join("report.html");
    std::fs::write(
        &jpath,
        serde_json::to_string_pretty(&rep).map_err(Failure::runtime)?,
    )
    .with_context(|| format!("writing {}", jpath.display()))
    .map_err(Failure::runtime)?;
    std::fs::write(&hpath, report::html(&rep))
        .with_context(|| format!("writing {}", hpath.display()))
        .map_err(Failure::runtime)?;
    drop(guard);
    if a.json {
        print_json(&rep)?;
    } else {
        println!(
            "report: {} and {}{}",
            jpath.display(),
            hpath.display(),
            if problems.is_empty() {
                String::new()
            } else {
                format!(
                    " — {} problem(s), listed above and in the report",
                    problems.len()
                )
            }
        );
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How `step` fails when serve finds its port taken: serve's own message for it (the
    /// banner `start_serve` quotes), so the match on it breaks here if that message changes.
    fn busy(to: &str) -> Failure {
        let addr = to.parse().expect("test input is valid");
        let msg = flowlane_io::udp::GroupError::AddrInUse(addr);
        Failure::runtime(anyhow!(
            "flowlane serve did not start: flowlane: error: {msg}"
        ))
    }

    #[test]
    fn a_step_whose_port_was_taken_runs_again_on_a_new_one() {
        let mut to = "127.0.0.1:5000".to_string();
        let mut seen = Vec::new();
        let mut ports = [5001u16, 5002].into_iter();
        let r = with_free_port(
            &mut to,
            |t| {
                seen.push(t.to_string());
                if seen.len() < 3 {
                    Err(busy(t))
                } else {
                    Ok(7)
                }
            },
            || Ok(ports.next().expect("two picks at most")),
        );
        assert_eq!(r.ok(), Some(7));
        assert_eq!(seen, ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]);
        assert_eq!(
            to, "127.0.0.1:5002",
            "later steps keep the port that worked"
        );
    }

    #[test]
    fn three_taken_ports_or_another_failure_end_the_run() {
        let mut to = "127.0.0.1:5000".to_string();
        let mut n = 0;
        let mut next = 6000u16;
        let r: Result<(), Failure> = with_free_port(
            &mut to,
            |t| {
                n += 1;
                Err(busy(t))
            },
            || {
                next += 1;
                Ok(next)
            },
        );
        assert_eq!(n, 3);
        assert_eq!(to, "127.0.0.1:6002");
        assert!(format!("{:#}", r.expect_err("fails").err).contains("already in use"));

        let mut calls = 0;
        let r: Result<(), Failure> = with_free_port(
            &mut to,
            |_| {
                calls += 1;
                Err(Failure::runtime(anyhow!("flowlane blast failed in step 1")))
            },
            || panic!("no new port for other failures"),
        );
        assert_eq!(calls, 1);
        assert!(r.is_err());
    }
}
