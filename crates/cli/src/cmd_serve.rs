//! `flowlane serve`: the RSS-aware UDP echo/sink server.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use flowlane_tools::serve::{self, ServeConfig, ServeCounts, ServeEvent, ServeMode, ServeStart};

use crate::args::parse_duration;
use crate::args::usable_cpus;
use crate::args::{parse_cpu_list, print_json, CpuList};
use crate::live::{stop_on_signals, Log};
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

    /// Steer by the software Toeplitz hash of each datagram's 4-tuple instead of the CPU:
    /// bucket b's queue q goes to worker q mod workers (in --cpus order), so a datagram the
    /// kernel reassembled on whatever CPU its fragments came in on (NICs hash fragments on
    /// the addresses only) still reaches its flow's worker — FreeBSD's re-dispatch after
    /// `ip_reass`. The key and table: --rss-dev IF (the receiving interface's), or --key,
    /// --reta, --queues. CPU-based `missteered` counts then show what the hash moved.
    #[arg(long, conflicts_with = "no_steer")]
    steer_hash: bool,

    /// With --steer-hash: take the key and table of this interface (read as `rss show`).
    #[arg(long, value_name = "IF", requires = "steer_hash")]
    rss_dev: Option<String>,

    #[command(flatten)]
    model: crate::args::ModelArgs,

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
    #[arg(long, short = 'J', conflicts_with = "json_stream")]
    json: bool,

    /// Newline-delimited JSON on stdout: `{"interval": …}` each interval, then
    /// `{"final": …}` holding the same report --json prints (the live table goes to stderr).
    #[arg(long)]
    json_stream: bool,

    /// Serve the workers' counters in the OpenMetrics text format (Prometheus) at ADDR while
    /// running, e.g. 127.0.0.1:9464: `flowlane_<role>_<counter>_total{worker,cpu}`.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,

    #[command(flatten)]
    shard: crate::shard::ShardArgs,
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

/// `--steer-hash`'s key and buckets (each bucket's queue), from the interface or the model
/// flags.
fn hash_steer(a: &ServeArgs) -> Result<Option<flowlane_tools::serve::HashSteer>, Failure> {
    a.model.only_with(a.steer_hash, "--steer-hash")?;
    if !a.steer_hash {
        return Ok(None);
    }
    let nic = crate::args::read_nic(a.rss_dev.as_deref())?;
    let m = a.model.build_for(nic.as_ref())?;
    let buckets: Vec<u32> = match &m.queue {
        flowlane_rss::queue::QueueModel::Reta(r) => {
            r.entries().iter().map(|&q| u32::from(q)).collect()
        }
        flowlane_rss::queue::QueueModel::Modulo(n) => (0..*n).collect(),
        _ => {
            return Err(Failure::usage(anyhow::anyhow!(
                "--steer-hash follows an indirection table or a modulo (--model reta or modulo)"
            )))
        }
    };
    if buckets.len() > flowlane_io::udp::HASH_STEERING_MAX_BUCKETS {
        return Err(Failure::usage(anyhow::anyhow!(
            "--steer-hash takes at most {} buckets; the table has {}",
            flowlane_io::udp::HASH_STEERING_MAX_BUCKETS,
            buckets.len()
        )));
    }
    Ok(Some(flowlane_tools::serve::HashSteer {
        key: m.key.as_bytes().to_vec(),
        buckets,
    }))
}

pub fn run(a: ServeArgs) -> CmdResult {
    let cfg = ServeConfig {
        metrics: a.metrics,
        bind: a.bind,
        mode: match a.mode {
            ModeArg::Echo => ServeMode::Echo,
            ModeArg::Sink => ServeMode::Sink,
        },
        cpus: usable_cpus(a.cpus.as_ref())?,
        budget: a.budget as usize,
        duration_s: a.duration,
        interval_s: a.interval,
        rcvbuf: a.rcvbuf,
        sndbuf: a.sndbuf,
        steer: !a.no_steer,
        hash_steer: hash_steer(&a)?,
        gro: a.gro,
        gso: a.gso,
        busy_poll_us: a.busy_poll,
        detect: !a.no_detect,
        by_source: a.by_source,
        v6only: a.v6only,
        sharding: a.shard.sharding()?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let mut log = Log::new(a.json || a.json_stream);
    let stream = crate::live::JsonStream::new(a.json_stream);
    let mut detected = true;
    let host = crate::host::before_run(&cfg.cpus, &[]);
    let mut report = serve::run(&cfg, &stop, &mut |event| match event {
        ServeEvent::Started(s) => {
            detected = s.detector_off.is_none();
            log.line(&banner(&cfg, &s));
            crate::host::say(&mut log, &host);
            if let Some(why) = &s.detector_off {
                log.line(&format!("mis-steering detector {why}"));
            }
            for n in &s.notices {
                log.line(&format!("notice: {n}"));
            }
            if !a.quiet {
                log.line(&header());
            }
        }
        ServeEvent::Tick(t) if !a.quiet || a.json_stream => {
            stream.interval(&t);
            if a.quiet {
                return;
            }
            // Each live row carries the time since the start, as iperf's intervals do.
            let at = format!("{:.1}s", t.elapsed_s);
            for (cpu, c) in &t.workers {
                log.line(&row(&at, &cpu.to_string(), c, t.interval_s, detected));
            }
            log.line(&row(&at, "total", &t.total, t.interval_s, detected));
        }
        ServeEvent::Tick(_) => {}
    })
    .map_err(Failure::from_tool)?;
    report.host = Some(host);
    if a.json {
        print_json(&report)?;
    } else if stream.on() {
        stream.last(&report)?;
    } else {
        outln!();
        outln!(
            "summary over {:.3} s (steering {}):",
            report.duration_s,
            report.steering
        );
        outln!("{}", header());
        for w in &report.workers {
            outln!(
                "{}",
                row(
                    "all",
                    &w.cpu.to_string(),
                    &w.counts,
                    report.duration_s,
                    detected
                )
            );
        }
        outln!(
            "{}",
            row("all", "total", &report.total, report.duration_s, detected)
        );
        let cost: Vec<String> = report
            .workers
            .iter()
            .map(|w| match w.counts.cpu_ns_per_packet {
                Some(n) => format!("cpu {} {n:.0} ns", w.cpu),
                None => format!("cpu {} -", w.cpu),
            })
            .collect();
        outln!(
            "cost: worker CPU time per datagram received (thread CPU clock): {}",
            cost.join(", ")
        );
        outln!("{}", crate::live::pmu_line("datagram", &report.pmu));
        if report.total.fragmented > 0 {
            let per: Vec<String> = report
                .workers
                .iter()
                .map(|w| format!("cpu {} {}", w.cpu, w.counts.fragmented))
                .collect();
            outln!(
                "fragmented: {} datagrams arrived in IP fragments, reassembled by the kernel \
                 (IP_RECVFRAGSIZE): {}",
                report.total.fragmented,
                per.join(", ")
            );
        }
        if let (Some(m), Some(lo), Some(hi)) = (
            report.total.missteered.filter(|&m| m > 0),
            report.total.missteered_received_min,
            report.total.missteered_received_max,
        ) {
            outln!(
                "missteer@sk: {m} datagrams the kernel processed on another CPU, counted as \
                 they reached the socket (before its buffer could drop them); the workers \
                 received between {lo} and {hi} of them"
            );
        }
    }
    Ok(crate::live::workers_exit(&report.errors))
}

/// The first line, once every worker is bound and polling (with --json on stderr: callers
/// such as bench wait for it before they send).
fn banner(cfg: &ServeConfig, s: &ServeStart) -> String {
    format!(
        "flowlane serve: {} on {} worker(s) (CPUs {:?}), mode {:?}, steering {}{}, rcvbuf {} B, sndbuf {} B{}",
        cfg.bind,
        s.cpus.len(),
        s.cpus,
        cfg.mode,
        s.steering,
        s.steering_reason
            .as_ref()
            .map_or(String::new(), |r| format!(" ({r})")),
        s.rcvbuf,
        s.sndbuf,
        if s.drop_counter {
            ""
        } else {
            ", socket drop counter unavailable"
        }
    )
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
fn row(at: &str, label: &str, d: &ServeCounts, secs: f64, detected: bool) -> String {
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
        match d.missteered {
            Some(m) if detected => m.to_string(),
            _ => "-".into(),
        },
        d.batch_fill
    )
}
