//! `latency`: what wake-up latency this host gives, per CPU — cyclictest's measurement inside
//! the tester. One thread per measured CPU, pinned, at a real-time priority (SCHED_FIFO 99 by
//! default, memory locked), sleeps until an absolute CLOCK_MONOTONIC time every interval and
//! records how late it woke in an HdrHistogram. With a load (`load`), the same measurement
//! runs twice — without it, then with flowlane's own hogs beside it — and the report sets the
//! two side by side. [`run`] returns the [`LatencyReport`].

mod load;
mod report;
mod worker;

pub use load::{Load, LoadKind, LoadSpec};
pub use report::{CpuLatency, CpuTasks, LatencyPhase, LatencyReport, LoadReport};
pub use worker::{WakeSnapshot, WakeStats};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowlane_runtime::latency::{LatencyShare, Publisher};
use flowlane_runtime::Snapshot;
use serde::{Deserialize, Serialize};

use crate::ToolError;
use worker::{WakeHandles, WakeJob};

/// What a `latency` run measures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyConfig {
    /// The CPUs measured, a thread on each.
    pub cpus: Vec<usize>,
    /// The first thread's wake-up interval, microseconds.
    pub interval_us: u64,
    /// Each further thread's interval is this much longer (cyclictest's `-d`; 0: all alike).
    pub distance_us: u64,
    /// SCHED_FIFO priority, 1–99 (0: normal priority).
    pub priority: i32,
    /// Lock the process's memory (mlockall) before measuring.
    pub lock_memory: bool,
    /// Hold a PM QoS request of this many µs on `/dev/cpu_dma_latency` while measuring (no
    /// deeper idle states; cyclictest holds 0 by default), or none.
    pub dma_latency_us: Option<i32>,
    /// Seconds each phase measures (`None`: `loops`, or until stopped).
    pub duration_s: Option<f64>,
    /// Wake-ups each thread measures per phase (`None`: `duration_s`, or until stopped).
    pub loops: Option<u64>,
    /// Wake-ups later than this count as over the threshold, microseconds.
    pub threshold_us: u64,
    /// Seconds between status lines.
    pub interval_s: f64,
    /// Serve the counters and histograms at this address while running (`--metrics`).
    pub metrics: Option<std::net::SocketAddr>,
    /// A load to run beside the measurement, after a phase without it.
    pub load: Option<LoadSpec>,
    /// Measure again with the CPUs isolated (`isolate`, this state file), inside the
    /// partition, and undo the isolation afterwards.
    #[serde(default)]
    pub compare_isolated: Option<std::path::PathBuf>,
}

/// One CPU over one status interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TickCpu {
    /// The CPU.
    pub cpu: usize,
    /// Wake-ups in the interval.
    pub wakeups: u64,
    /// Smallest latency in it, nanoseconds.
    pub min_ns: Option<u64>,
    /// Mean, nanoseconds.
    pub avg_ns: Option<u64>,
    /// Largest, nanoseconds.
    pub max_ns: Option<u64>,
    /// Wake-ups over the threshold so far in the phase.
    pub over_threshold: u64,
}

/// A status line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LatencyTick {
    /// The phase (`no load`, `load: cpu+vm`).
    pub phase: String,
    /// Seconds since the phase began.
    pub elapsed_s: f64,
    /// Per CPU.
    pub cpus: Vec<TickCpu>,
}

/// What a run tells while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum LatencyEvent {
    /// A phase starts.
    Phase {
        /// Its name.
        name: String,
        /// The policy the threads asked for.
        priority: i32,
    },
    /// A status line.
    Tick(LatencyTick),
}

/// Checks the configuration (usage errors, exit 2).
fn check(a: &LatencyConfig) -> Result<(), ToolError> {
    if a.cpus.is_empty() {
        return Err(ToolError::usage("no CPU to measure"));
    }
    if !(1..=10_000_000).contains(&a.interval_us) {
        return Err(ToolError::usage(
            "--interval is 1 µs to 10 s (cyclictest's default is 1000 µs)",
        ));
    }
    if a.distance_us > 10_000_000 {
        return Err(ToolError::usage("--distance is at most 10 s"));
    }
    if !(0..=99).contains(&a.priority) {
        return Err(ToolError::usage(
            "--priority is 1 to 99 (SCHED_FIFO), or 0 for normal priority",
        ));
    }
    if a.loops == Some(0) {
        return Err(ToolError::usage("--loops must be at least 1"));
    }
    if let Some(d) = a.duration_s {
        crate::seconds("duration", d)?;
    }
    crate::seconds("interval", a.interval_s)?;
    if let Some(l) = &a.load {
        if l.kinds.is_empty() || l.cpus.is_empty() {
            return Err(ToolError::usage("--load needs a kind and a CPU to run on"));
        }
        if l.threads > 64 {
            return Err(ToolError::usage("--load-threads is at most 64 per CPU"));
        }
        // Every memory hog's buffer must fit in half of this machine's memory.
        let total = (l.vm_bytes as u64)
            .saturating_mul(l.threads.max(1) as u64)
            .saturating_mul(l.cpus.len() as u64);
        let half = mem_total_bytes().map(|m| m / 2);
        if l.kinds.contains(&LoadKind::Vm) && (l.vm_bytes < 4096 || half.is_some_and(|h| total > h))
        {
            return Err(ToolError::usage(format!(
                "--vm-bytes: {} hogs of {} bytes need {total} bytes; give 4 KiB to a size that \
                 keeps them within half of this machine's memory ({} bytes)",
                l.threads.max(1) * l.cpus.len(),
                l.vm_bytes,
                half.map_or("unknown".into(), |h| h.to_string())
            )));
        }
    }
    Ok(())
}

/// `MemTotal` of /proc/meminfo, bytes.
fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb.saturating_mul(1024))
}

/// Runs the phases: without the load, then (when asked) with it.
pub fn run(
    a: &LatencyConfig,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(LatencyEvent),
) -> Result<LatencyReport, ToolError> {
    check(a)?;
    let isolation = crate::doctor::cpu_isolation(std::path::Path::new("/"), &a.cpus);
    let (memory_locked, memory_not_locked) = if a.lock_memory {
        match flowlane_io::os::lock_memory() {
            Ok(()) => (true, None),
            Err(e) => (false, Some(e.to_string())),
        }
    } else {
        (false, Some("not asked (--no-mlock)".into()))
    };
    let (_qos, dma_latency_us, dma_latency_not_held) = match a.dma_latency_us {
        Some(us) => match flowlane_io::os::hold_cpu_dma_latency(us) {
            Ok(g) => (Some(g), Some(us), None),
            Err(e) => (None, None, Some(format!("/dev/cpu_dma_latency: {e}"))),
        },
        None => (None, None, Some("not asked (--no-dma-latency)".into())),
    };
    let handles: Vec<WakeHandles> = a.cpus.iter().map(|_| WakeHandles::default()).collect();
    let shares: Vec<LatencyShare> = a.cpus.iter().map(|_| LatencyShare::new()).collect();
    let _exporter = match a.metrics {
        Some(addr) => {
            let stats: Vec<_> = handles.iter().map(|h| h.stats.clone()).collect();
            Some(crate::metrics::Exporter::start_with(
                addr,
                "latency",
                &a.cpus,
                &stats,
                Some(crate::metrics::LatencyExport {
                    what: "wakeup_latency",
                    help: "How late each thread woke after its absolute timer expired",
                    shares: shares.clone(),
                }),
            )?)
        }
        None => None,
    };
    let mut phases = Vec::new();
    let mut realtime: Option<Result<i32, String>> = None;
    let loads: Vec<Option<&LoadSpec>> = match &a.load {
        Some(l) => vec![None, Some(l)],
        None => vec![None],
    };
    let mut plan: Vec<(bool, Option<&LoadSpec>)> = loads.iter().map(|&l| (false, l)).collect();
    if a.compare_isolated.is_some() {
        plan.extend(loads.iter().map(|&l| (true, l)));
    }
    let mut isolated: Option<crate::isolate::IsolateReport> = None;
    let mut undone: Option<crate::isolate::UndoReport> = None;
    let mut failure = None;
    for (iso, load) in plan {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if iso && isolated.is_none() {
            let state = a
                .compare_isolated
                .as_deref()
                .unwrap_or(std::path::Path::new(crate::isolate::STATE));
            let r = crate::isolate::isolate(&a.cpus, state)?;
            // v1: each measuring thread joins the isolated cpuset itself, and a load's
            // threads stay with the rest of the system. v2's partition takes whole
            // processes: this one joins it, its load with it.
            if crate::isolate::isolated_tasks(&r).is_none() {
                if let Err(e) = crate::isolate::join(&crate::isolate::isolated_procs(&r)) {
                    failure = Some(e);
                    isolated = Some(r);
                    break;
                }
            }
            isolated = Some(r);
        }
        let base = match load {
            None => "no load".to_string(),
            Some(l) => format!(
                "load: {}",
                l.kinds
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join("+")
            ),
        };
        let name = if iso {
            format!("isolated, {base}")
        } else {
            base
        };
        on_event(LatencyEvent::Phase {
            name: name.clone(),
            priority: a.priority,
        });
        let running = match load.map(Load::start).transpose() {
            Ok(r) => r,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let join = isolated
            .as_ref()
            .filter(|_| iso)
            .and_then(crate::isolate::isolated_tasks);
        let (phase, rt) = match phase(a, &name, join, &handles, &shares, stop, on_event) {
            Ok(p) => p,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let mut phase = phase;
        phase.load = running.map(Load::finish);
        realtime.get_or_insert(rt);
        phases.push(phase);
    }
    // The host as it was: out of the partition, then the isolation undone — whatever
    // happened above.
    if let Some(r) = &isolated {
        let _ = crate::isolate::join(&crate::isolate::root_procs(r));
        let state = a
            .compare_isolated
            .as_deref()
            .unwrap_or(std::path::Path::new(crate::isolate::STATE));
        undone = Some(crate::isolate::undo(state)?);
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let rt = realtime.unwrap_or(Err("nothing measured".into()));
    Ok(LatencyReport {
        realtime_priority: rt.as_ref().ok().copied(),
        not_realtime: rt.err(),
        memory_locked,
        memory_not_locked,
        dma_latency_us,
        dma_latency_not_held,
        interval_us: a.interval_us,
        distance_us: a.distance_us,
        threshold_us: a.threshold_us,
        isolation,
        isolated,
        undone,
        phases,
        interrupted: stop.load(Ordering::Relaxed),
        host: None,
    })
}

/// One phase: a thread per CPU until the duration, the loop count or a stop; status lines
/// meanwhile. Returns the phase and the policy the threads got (the first refusal, if any).
///
/// Long: the threads' jobs, their start, the status loop and the merge of their histograms,
/// in the order they happen.
fn phase(
    a: &LatencyConfig,
    name: &str,
    join_tasks: Option<std::path::PathBuf>,
    handles: &[WakeHandles],
    shares: &[LatencyShare],
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(LatencyEvent),
) -> Result<(LatencyPhase, Result<i32, String>), ToolError> {
    let start = flowlane_io::os::monotonic_ns();
    // The threads' first wake-ups are due 10 ms from now: time to pin and raise priority.
    let first = start + 10_000_000;
    let deadline = a.duration_s.map(|d| first + (d * 1e9) as u64);
    let base: Vec<_> = handles.iter().map(|h| h.stats.snapshot()).collect();
    let phase_stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let results = std::thread::scope(|s| {
        let threads: Vec<_> = a
            .cpus
            .iter()
            .enumerate()
            .map(|(i, &cpu)| {
                let job = WakeJob {
                    cpu,
                    interval_ns: (a.interval_us + i as u64 * a.distance_us) * 1000,
                    first_ns: first,
                    deadline_ns: deadline,
                    loops: a.loops,
                    priority: a.priority,
                    threshold_ns: a.threshold_us.saturating_mul(1000),
                    join_tasks: join_tasks.clone(),
                };
                let (h, ps) = (&handles[i], &phase_stop);
                // Copies of the histogram only for `--metrics`: each is a pass over its
                // counters on the measuring thread.
                let publisher = match a.metrics {
                    Some(_) => Publisher::to(shares[i].clone()),
                    None => Publisher::default(),
                };
                std::thread::Builder::new()
                    .name(format!("flowlane-latency-{cpu}"))
                    .spawn_scoped(s, move || {
                        worker::measure(&job, ps, &h.stats, &h.extremes, publisher)
                    })
            })
            .collect();
        // Status lines until every thread is done.
        let mut last = base.clone();
        let mut others: Vec<CpuTasks> = a
            .cpus
            .iter()
            .map(|&cpu| CpuTasks {
                cpu,
                samples: 0,
                samples_with_others: 0,
                tasks: Vec::new(),
            })
            .collect();
        let sample = |others: &mut Vec<CpuTasks>| {
            for o in others.iter_mut() {
                let (names, n) =
                    crate::doctor::runnable_others(std::path::Path::new("/"), o.cpu, 16);
                o.samples += 1;
                o.samples_with_others += u64::from(n > 0);
                for t in names {
                    if o.tasks.len() < 16 && !o.tasks.contains(&t) {
                        o.tasks.push(t);
                    }
                }
            }
        };
        let mut next_tick = Duration::from_secs_f64(a.interval_s);
        loop {
            let done = threads
                .iter()
                .all(|t| t.as_ref().map_or(true, |t| t.is_finished()));
            if done {
                break;
            }
            if stop.load(Ordering::Relaxed) {
                phase_stop.store(true, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(20));
            if t0.elapsed() >= next_tick {
                next_tick += Duration::from_secs_f64(a.interval_s);
                let now: Vec<_> = handles.iter().map(|h| h.stats.snapshot()).collect();
                let cpus = a
                    .cpus
                    .iter()
                    .enumerate()
                    .map(|(i, &cpu)| {
                        let d = now[i].role.since(&last[i].role);
                        let ext = handles[i].extremes.take();
                        TickCpu {
                            cpu,
                            wakeups: d.wakeups,
                            min_ns: ext.map(|e| e.0),
                            avg_ns: (d.wakeups > 0).then(|| d.latency_ns / d.wakeups),
                            max_ns: ext.map(|e| e.1),
                            over_threshold: now[i]
                                .role
                                .over_threshold
                                .saturating_sub(base[i].role.over_threshold),
                        }
                    })
                    .collect();
                last = now;
                sample(&mut others);
                on_event(LatencyEvent::Tick(LatencyTick {
                    phase: name.to_string(),
                    elapsed_s: t0.elapsed().as_secs_f64(),
                    cpus,
                }));
            }
        }
        sample(&mut others);
        let joined: Vec<_> = threads
            .into_iter()
            .map(|t| {
                t.map_err(|e| format!("cannot start a thread: {e}"))?
                    .join()
                    .map_err(|_| "a measuring thread panicked".to_string())?
            })
            .collect();
        (joined, others)
    });
    let (results, others) = results;
    let mut total = worker::new_histogram();
    let mut cpus = Vec::new();
    let mut realtime: Option<Result<i32, String>> = None;
    for (i, r) in results.into_iter().enumerate() {
        let r = r.map_err(ToolError::runtime)?;
        let d = handles[i].stats.snapshot().role.since(&base[i].role);
        let _ = total.add(&r.histogram);
        cpus.push(CpuLatency::of(
            Some(a.cpus[i]),
            Some(a.interval_us + i as u64 * a.distance_us),
            &r.histogram,
            d.over_threshold,
            d.overruns,
        ));
        // The first refusal names the run's policy: one thread refused is a mixed run.
        match (&realtime, r.realtime) {
            (None, x) | (Some(Ok(_)), x @ Err(_)) => realtime = Some(x),
            _ => {}
        }
    }
    let over: u64 = cpus.iter().map(|c| c.over_threshold).sum();
    let overruns: u64 = cpus.iter().map(|c| c.overruns).sum();
    Ok((
        LatencyPhase {
            name: name.to_string(),
            duration_s: (t0.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
            total: CpuLatency::of(None, None, &total, over, overruns),
            cpus,
            load: None,
            runnable_others: others,
            histogram: Some(total),
        },
        realtime.unwrap_or(Err("no thread ran".into())),
    ))
}
