//! What `latency` reports: the JSON contract (`flowlane latency --json`).

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// One CPU's wake-ups over a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CpuLatency {
    /// The CPU (`None` in a phase's total over all of them).
    pub cpu: Option<usize>,
    /// Its wake-up interval, microseconds.
    pub interval_us: Option<u64>,
    /// Wake-ups measured.
    pub wakeups: u64,
    /// Smallest latency, nanoseconds.
    pub min_ns: u64,
    /// Mean, nanoseconds.
    pub avg_ns: u64,
    /// Percentiles, nanoseconds (HdrHistogram, 3 significant digits; each the highest value
    /// equivalent to the one recorded).
    pub p50_ns: u64,
    /// 90th.
    pub p90_ns: u64,
    /// 99th.
    pub p99_ns: u64,
    /// 99.9th.
    pub p999_ns: u64,
    /// 99.99th.
    pub p9999_ns: u64,
    /// 99.999th.
    pub p99999_ns: u64,
    /// Largest, nanoseconds.
    pub max_ns: u64,
    /// Wake-ups later than the threshold.
    pub over_threshold: u64,
    /// Periods skipped because a wake-up came after the next was due.
    pub overruns: u64,
}

impl CpuLatency {
    /// The figures of `h` (all zero when it is empty).
    pub fn of(
        cpu: Option<usize>,
        interval_us: Option<u64>,
        h: &Histogram<u64>,
        over_threshold: u64,
        overruns: u64,
    ) -> CpuLatency {
        let empty = h.is_empty();
        let q = |x: f64| if empty { 0 } else { h.value_at_quantile(x) };
        CpuLatency {
            cpu,
            interval_us,
            wakeups: h.len(),
            min_ns: if empty { 0 } else { h.min() },
            avg_ns: if empty { 0 } else { h.mean().round() as u64 },
            p50_ns: q(0.5),
            p90_ns: q(0.9),
            p99_ns: q(0.99),
            p999_ns: q(0.999),
            p9999_ns: q(0.9999),
            p99999_ns: q(0.99999),
            max_ns: if empty { 0 } else { h.max() },
            over_threshold,
            overruns,
        }
    }
}

/// What ran beside the measurement in a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LoadReport {
    /// The loads, as asked (`cpu`, `vm`, `io`).
    pub kinds: Vec<String>,
    /// The CPUs their threads ran on.
    pub cpus: Vec<usize>,
    /// Threads per kind and CPU.
    pub threads: usize,
    /// Work the CPU hogs did: arithmetic loops of 1 024 steps.
    pub cpu_loops: u64,
    /// Bytes the memory hogs wrote (each through a buffer of `vm_bytes`).
    pub vm_bytes_written: u64,
    /// Each memory hog's buffer, bytes.
    pub vm_bytes: u64,
    /// Bytes the disk hogs wrote, each 1 MiB block followed by fdatasync.
    pub io_bytes_written: u64,
    /// Where the disk hogs wrote (a file each, removed after).
    pub io_dir: Option<String>,
    /// The net load: datagrams blast sent through its lab.
    #[serde(default)]
    pub net_sent: Option<u64>,
    /// The net load: datagrams serve's workers received.
    #[serde(default)]
    pub net_received: Option<u64>,
    /// The net load stopped on this error (its counts are what it did until then).
    #[serde(default)]
    pub net_error: Option<String>,
}

/// One phase: the measurement with or without the load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LatencyPhase {
    /// `no load`, or the load's kinds (`load: cpu+vm`).
    pub name: String,
    /// Seconds it lasted.
    pub duration_s: f64,
    /// Per measured CPU.
    pub cpus: Vec<CpuLatency>,
    /// Over all of them.
    pub total: CpuLatency,
    /// What ran beside it (`None`: nothing of flowlane's).
    pub load: Option<LoadReport>,
    /// Per measured CPU, tasks of other processes found runnable there (sampled each status
    /// line and at the end): the competition an isolated CPU would not have.
    #[serde(default)]
    pub runnable_others: Vec<CpuTasks>,
    /// All latencies of the phase (for `--histogram`).
    #[serde(skip)]
    pub histogram: Option<Histogram<u64>>,
}

/// Other processes' tasks seen runnable on one CPU during a phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CpuTasks {
    /// The CPU.
    pub cpu: usize,
    /// Samples taken.
    pub samples: u64,
    /// Samples that found at least one.
    pub samples_with_others: u64,
    /// Their names, `comm(tid)`, the first 16 distinct.
    pub tasks: Vec<String>,
}

/// The report of a `latency` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LatencyReport {
    /// The threads ran under SCHED_FIFO at this priority (`None`: at normal priority).
    pub realtime_priority: Option<i32>,
    /// Why they did not run real-time, when they did not (say so before trusting a figure).
    pub not_realtime: Option<String>,
    /// The process's memory was locked (mlockall).
    pub memory_locked: bool,
    /// Why it was not, when it was not.
    pub memory_not_locked: Option<String>,
    /// The PM QoS request held on `/dev/cpu_dma_latency` while measuring, µs (cyclictest's
    /// default: 0, no idle state deeper than polling).
    pub dma_latency_us: Option<i32>,
    /// Why none was held, when none was (idle states then add their exit latency).
    pub dma_latency_not_held: Option<String>,
    /// The base wake-up interval, microseconds.
    pub interval_us: u64,
    /// Each further thread's interval is this much longer (cyclictest's `-d`), microseconds.
    pub distance_us: u64,
    /// Wake-ups later than this count as over the threshold, microseconds.
    pub threshold_us: u64,
    /// Each measured CPU's isolation when the run began (boot parameters, the kernel's
    /// isolated set, IRQs allowed on it).
    #[serde(default)]
    pub isolation: Vec<crate::doctor::CpuIsolation>,
    /// With `--compare-isolated`: what isolating the CPUs did (the later phases ran inside
    /// the partition).
    #[serde(default)]
    pub isolated: Option<crate::isolate::IsolateReport>,
    /// And what undoing it restored.
    #[serde(default)]
    pub undone: Option<crate::isolate::UndoReport>,
    /// The phases in the order they ran: without the load first when one was asked.
    pub phases: Vec<LatencyPhase>,
    /// Stopped early (Ctrl-C).
    pub interrupted: bool,
    /// The host's conditions for the run (`doctor`'s rules for the measured CPUs).
    #[serde(default)]
    pub host: Option<crate::doctor::DoctorReport>,
}
