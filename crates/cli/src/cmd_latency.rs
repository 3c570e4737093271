//! `flowlane latency`: wake-up latency per CPU, as cyclictest measures it, with flowlane's own
//! load beside it on request.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use flowlane_tools::latency::{
    self, CpuLatency, LatencyConfig, LatencyEvent, LatencyPhase, LatencyReport, LoadKind, LoadSpec,
};

use crate::args::{parse_cpu_list, parse_duration, print_json, usable_cpus, CpuList};
use crate::live::{JsonStream, Log};
use crate::{CmdResult, Failure};

/// Measure each CPU's wake-up latency as cyclictest does, with and without a load.
///
/// One thread per CPU (--cpus), pinned, at SCHED_FIFO priority 99 with memory locked, sleeps
/// until an absolute CLOCK_MONOTONIC time every --interval and records how late it woke in an
/// HdrHistogram: min, average, percentiles to p99.999, maximum, and the wake-ups later than
/// --threshold. A line a second per CPU (interval min/avg/max); Ctrl-C prints the summary.
/// Without real-time privilege (CAP_SYS_NICE) it says so, runs at normal priority, and marks
/// every figure so.
///
/// --load runs the measurement twice, without and then with flowlane's own hogs beside it on
/// --load-cpus (cpu: arithmetic; vm: writing through --vm-bytes again and again; io: 1 MiB
/// blocks each followed by fdatasync, in --io-dir) and sets the two side by side — stress's
/// mix without stress. On a virtual machine the hypervisor's own scheduling shows in the
/// maximum: compare hosts, not a VM with bare metal.
///
/// Examples:
///   flowlane latency --duration 30
///   flowlane latency --cpus 1 --interval 1000 --loops 100000 --histogram lat.hgrm
///   flowlane latency --duration 60 --load cpu,vm,io --load-threads 2 --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct LatencyArgs {
    /// The CPUs to measure, a thread on each (default: every CPU this process may use).
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Wake-up interval of the first thread, microseconds (cyclictest -i).
    #[arg(long, default_value_t = 1000)]
    interval: u64,

    /// Each further thread's interval is this much longer, microseconds (cyclictest -d; 0:
    /// all alike).
    #[arg(long, default_value_t = 0)]
    distance: u64,

    /// SCHED_FIFO priority 1-99 (cyclictest -p); 0 runs at normal priority.
    #[arg(long, default_value_t = 99)]
    priority: i32,

    /// Do not lock the process's memory (mlockall, cyclictest -m, is the default).
    #[arg(long)]
    no_mlock: bool,

    /// The PM QoS request held on /dev/cpu_dma_latency while measuring, microseconds: no CPU
    /// enters an idle state slower to leave (0, cyclictest's default: none deeper than
    /// polling).
    #[arg(long, default_value_t = 0, conflicts_with = "no_dma_latency")]
    dma_latency: i32,

    /// Hold no PM QoS request: idle states add their exit latency (cyclictest --laptop).
    #[arg(long)]
    no_dma_latency: bool,

    /// Measure this long, per phase (e.g. 30, 5m; default: until Ctrl-C, or --loops).
    #[arg(long, short = 'd', value_parser = parse_duration)]
    duration: Option<f64>,

    /// Wake-ups per thread, per phase (cyclictest -l).
    #[arg(long, short = 'l')]
    loops: Option<u64>,

    /// Wake-ups later than this count as over the threshold, microseconds.
    #[arg(long, default_value_t = 100)]
    threshold: u64,

    /// Run flowlane's own load beside a second phase: cpu, vm, io, net (comma-separated; net:
    /// a lab with serve and blast steered onto the load CPUs, needs root).
    #[arg(long, value_enum, value_delimiter = ',')]
    load: Vec<LoadArg>,

    /// The CPUs the load's threads run on (default: the measured CPUs).
    #[arg(long, value_parser = parse_cpu_list)]
    load_cpus: Option<CpuList>,

    /// Threads of each load kind per load CPU.
    #[arg(long, default_value_t = 1)]
    load_threads: usize,

    /// Each memory hog's buffer, bytes (stress --vm-bytes).
    #[arg(long, default_value_t = 256 << 20)]
    vm_bytes: usize,

    /// The net load's rate, datagrams per second (default: unpaced).
    #[arg(long, value_parser = crate::args::parse_rate)]
    net_rate: Option<crate::args::Rate>,

    /// Where the io hogs write their files (default: the temporary directory).
    #[arg(long, value_name = "DIR")]
    io_dir: Option<PathBuf>,

    /// Then measure again with the CPUs isolated (`flowlane isolate`: a cpuset partition,
    /// tasks and interrupts moved off) from inside the partition, and undo the isolation —
    /// before and after in one run. Needs root.
    #[arg(long)]
    compare_isolated: bool,

    /// The isolation's state file with --compare-isolated.
    #[arg(long, value_name = "FILE", default_value = flowlane_tools::isolate::STATE)]
    isolate_state: PathBuf,

    /// Write each phase's whole distribution in HdrHistogram's .hgrm text (microseconds): the
    /// first phase to FILE, the loaded one to FILE with `-load` before its extension.
    #[arg(long, value_name = "FILE")]
    histogram: Option<PathBuf>,

    /// Print no live lines.
    #[arg(long)]
    quiet: bool,

    /// Print the report as JSON on stdout (live lines go to stderr).
    #[arg(long, short = 'J', conflicts_with = "json_stream")]
    json: bool,

    /// Print each status line and then the report as one JSON record per line.
    #[arg(long)]
    json_stream: bool,

    /// Serve per-CPU counters and latency histograms in the OpenMetrics text format at this
    /// address while running (e.g. 127.0.0.1:9100).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LoadArg {
    Cpu,
    Vm,
    Io,
    Net,
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

fn opt_us(ns: Option<u64>) -> String {
    ns.map_or("-".into(), us)
}

fn header() -> String {
    format!(
        "{:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8}",
        "cpu",
        "wakeups",
        "min µs",
        "avg µs",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "p99.99",
        "p99.999",
        "max µs",
        "over",
        "overruns"
    )
}

fn row(c: &CpuLatency) -> String {
    format!(
        "{:>6} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8}",
        c.cpu.map_or("all".into(), |c| c.to_string()),
        c.wakeups,
        us(c.min_ns),
        us(c.avg_ns),
        us(c.p50_ns),
        us(c.p99_ns),
        us(c.p999_ns),
        us(c.p9999_ns),
        us(c.p99999_ns),
        us(c.max_ns),
        c.over_threshold,
        c.overruns
    )
}

/// `FILE` for the first phase, `FILE-load.EXT` for a loaded one, `-isolated` before the
/// extension for the phases inside an isolation.
fn phase_path(path: &std::path::Path, p: &LatencyPhase) -> PathBuf {
    let tag = match (p.name.starts_with("isolated"), p.load.is_some()) {
        (false, false) => return path.to_path_buf(),
        (false, true) => "load",
        (true, false) => "isolated",
        (true, true) => "isolated-load",
    };
    let stem = path.file_stem().map_or_else(
        || "latency".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    let name = match path.extension() {
        Some(e) => format!("{stem}-{tag}.{}", e.to_string_lossy()),
        None => format!("{stem}-{tag}"),
    };
    path.with_file_name(name)
}

pub fn run(a: LatencyArgs) -> CmdResult {
    let cpus = usable_cpus(a.cpus.as_ref())?;
    let load = if a.load.is_empty() {
        if a.load_cpus.is_some() || a.io_dir.is_some() {
            return Err(Failure::usage(anyhow::anyhow!(
                "--load-cpus and --io-dir shape a load: give --load cpu,vm,io"
            )));
        }
        None
    } else {
        Some(LoadSpec {
            kinds: a
                .load
                .iter()
                .map(|k| match k {
                    LoadArg::Cpu => LoadKind::Cpu,
                    LoadArg::Vm => LoadKind::Vm,
                    LoadArg::Io => LoadKind::Io,
                    LoadArg::Net => LoadKind::Net,
                })
                .collect(),
            cpus: match &a.load_cpus {
                Some(c) => usable_cpus(Some(c))?,
                None => cpus.clone(),
            },
            threads: a.load_threads,
            vm_bytes: a.vm_bytes,
            io_dir: a.io_dir.clone(),
            net_rate: a.net_rate.map(|r| r.pps(60.0)),
        })
    };
    if a.duration.is_none() && a.loops.is_none() && (load.is_some() || a.compare_isolated) {
        return Err(Failure::usage(anyhow::anyhow!(
            "--load and --compare-isolated compare phases: give each a --duration or --loops"
        )));
    }
    let cfg = LatencyConfig {
        cpus: cpus.clone(),
        interval_us: a.interval,
        distance_us: a.distance,
        priority: a.priority,
        lock_memory: !a.no_mlock,
        dma_latency_us: (!a.no_dma_latency).then_some(a.dma_latency),
        duration_s: a.duration,
        loops: a.loops,
        threshold_us: a.threshold,
        interval_s: 1.0,
        metrics: a.metrics,
        load,
        compare_isolated: a.compare_isolated.then(|| a.isolate_state.clone()),
    };
    let stop = Arc::new(AtomicBool::new(false));
    crate::live::stop_on_signals(&stop)?;
    let mut log = Log::new(a.json || a.json_stream);
    let stream = JsonStream::new(a.json_stream);
    let host = crate::host::before_run(&cpus, &[]);
    let mut report = latency::run(&cfg, &stop, &mut |e| match e {
        LatencyEvent::Phase { name, priority } => {
            if !a.quiet {
                log.line(&format!(
                    "flowlane latency: {name}: {} thread(s) on CPUs {}, every {} µs{}, {}, \
                     threshold {} µs",
                    cpus.len(),
                    flowlane_runtime::cpus::format_cpu_list(&cpus),
                    a.interval,
                    if a.distance > 0 {
                        format!(" (+{} µs per thread)", a.distance)
                    } else {
                        String::new()
                    },
                    if priority > 0 {
                        format!("SCHED_FIFO {priority}")
                    } else {
                        "normal priority".into()
                    },
                    a.threshold
                ));
                crate::host::say(&mut log, &host);
            }
        }
        LatencyEvent::Tick(t) => {
            stream.interval(&t);
            if a.quiet {
                return;
            }
            for c in &t.cpus {
                log.line(&format!(
                    "{:>6.1}s cpu {:>3}  wakeups {:>7}  min {:>7}  avg {:>7}  max {:>8} µs  over \
                     {}",
                    t.elapsed_s,
                    c.cpu,
                    c.wakeups,
                    opt_us(c.min_ns),
                    opt_us(c.avg_ns),
                    opt_us(c.max_ns),
                    c.over_threshold
                ));
            }
        }
    })
    .map_err(Failure::from_tool)?;
    report.host = Some(host);
    let mut side = crate::side::Writes::default();
    if let Some(path) = &a.histogram {
        for p in &report.phases {
            match &p.histogram {
                Some(h) if !h.is_empty() => {
                    side.write("--histogram", &phase_path(path, p), flowlane_tools::hgrm(h))
                }
                _ => side.nothing("--histogram", path, "no wake-up was measured"),
            }
        }
    }
    if a.json {
        print_json(&report)?;
    } else if stream.on() {
        stream.last(&report)?;
    } else {
        summary(&report);
    }
    side.done()?;
    Ok(if report.interrupted {
        ExitCode::from(crate::live::INTERRUPTED)
    } else {
        ExitCode::SUCCESS
    })
}

fn summary(r: &LatencyReport) {
    if let Some(why) = &r.not_realtime {
        outln!(
            "NOT REAL-TIME: the threads ran at normal priority ({why}); these figures include \
             the scheduler's fairness, not only the wake-up path (run as root, or grant \
             CAP_SYS_NICE)"
        );
    }
    if let Some(why) = &r.memory_not_locked {
        outln!("memory not locked: {why}");
    }
    if let Some(why) = &r.dma_latency_not_held {
        outln!("no PM QoS request held (idle states add their exit latency): {why}");
    }
    let yes = |b: bool| if b { "yes" } else { "no" };
    for i in &r.isolation {
        let irqs: Vec<String> = i.irqs.iter().take(8).map(|n| n.to_string()).collect();
        outln!(
            "cpu {} isolation: isolcpus {}, nohz_full {}, rcu_nocbs {}, isolated {}; {} IRQs \
             allowed on it{}",
            i.cpu,
            yes(i.isolcpus),
            yes(i.nohz_full),
            yes(i.rcu_nocbs),
            yes(i.isolated),
            i.irqs.len(),
            if irqs.is_empty() {
                String::new()
            } else {
                format!(
                    " ({}{})",
                    irqs.join(","),
                    if i.irqs.len() > 8 { ",…" } else { "" }
                )
            }
        );
    }
    for p in &r.phases {
        outln!();
        outln!("{} ({:.1} s):", p.name, p.duration_s);
        for o in p
            .runnable_others
            .iter()
            .filter(|o| o.samples_with_others > 0)
        {
            outln!(
                "  cpu {}: other processes' tasks runnable there in {} of {} samples: {}",
                o.cpu,
                o.samples_with_others,
                o.samples,
                o.tasks.join(", ")
            );
        }
        outln!("{}", header());
        for c in &p.cpus {
            outln!("{}", row(c));
        }
        if p.cpus.len() > 1 {
            outln!("{}", row(&p.total));
        }
        if let Some(l) = &p.load {
            outln!(
                "load: {} on CPUs {} ({} thread(s) each): {} cpu loops, {} MiB written to \
                 memory, {} MiB to disk",
                l.kinds.join("+"),
                flowlane_runtime::cpus::format_cpu_list(&l.cpus),
                l.threads,
                l.cpu_loops,
                l.vm_bytes_written >> 20,
                l.io_bytes_written >> 20
            );
            if let (Some(sent), Some(got)) = (l.net_sent, l.net_received) {
                outln!(
                    "net load: blast sent {sent} datagrams through its lab, serve received {got}{}",
                    l.net_error
                        .as_ref()
                        .map_or(String::new(), |e| format!(" (stopped: {e})"))
                );
            }
        }
    }
    if let Some(i) = &r.isolated {
        outln!();
        outln!(
            "isolated CPUs {} for the later phases: {} tasks and {} interrupts moved off \
             ({} tasks, {} interrupts could not move); undone: {}",
            flowlane_runtime::cpus::format_cpu_list(&i.cpus),
            i.tasks_moved,
            i.irqs_moved.len(),
            i.tasks_stayed,
            i.irqs_stayed.len(),
            r.undone
                .as_ref()
                .map_or("no".to_string(), |u| if u.problems.is_empty() {
                    "everything restored".to_string()
                } else {
                    u.problems.join("; ")
                })
        );
    }
    let pairs: Vec<(&LatencyPhase, &LatencyPhase)> = match r.phases.as_slice() {
        [a, b] => vec![(a, b)],
        [a, b, c, d] => vec![(a, b), (a, c), (b, d)],
        _ => Vec::new(),
    };
    for (quiet, loaded) in pairs {
        outln!();
        outln!("{} → {}, per CPU:", quiet.name, loaded.name);
        for (a, b) in quiet.cpus.iter().zip(&loaded.cpus) {
            outln!(
                "  cpu {}: avg {} → {} µs, p99 {} → {} µs, max {} → {} µs, over {} → {}",
                a.cpu.unwrap_or(0),
                us(a.avg_ns),
                us(b.avg_ns),
                us(a.p99_ns),
                us(b.p99_ns),
                us(a.max_ns),
                us(b.max_ns),
                a.over_threshold,
                b.over_threshold
            );
        }
    }
}
