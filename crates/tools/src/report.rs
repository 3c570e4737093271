//! Report pieces several roles share.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency percentiles in nanoseconds, from an HdrHistogram of every measured packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
    /// What was timed: `round-trip` or `one-way`.
    pub kind: String,
}

impl Latency {
    /// The percentiles of `h` (`None` when nothing was measured).
    pub fn of(h: Option<&Histogram<u64>>, kind: &str) -> Option<Latency> {
        let h = h.filter(|h| !h.is_empty())?;
        Some(Latency {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            kind: kind.to_string(),
        })
    }
}

/// Nanoseconds of CPU time per item (packet, request), to 0.1 ns; `None` when there was none.
pub fn ns_per(cpu_ns: u64, items: u64) -> Option<f64> {
    (items > 0).then(|| (cpu_ns as f64 / items as f64 * 10.0).round() / 10.0)
}

/// What each packet cost in the CPU's own terms, from the workers' hardware counters (cycles,
/// instructions, last-level cache misses over their loops), or why that is not known here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PmuCost {
    /// CPU cycles per packet.
    pub cycles_per_packet: Option<f64>,
    /// Instructions per packet.
    pub instructions_per_packet: Option<f64>,
    /// Instructions per cycle.
    pub ipc: Option<f64>,
    /// Last-level cache misses per packet.
    pub llc_misses_per_packet: Option<f64>,
    /// Why the counters could not be read (no PMU, `perf_event_paranoid`, a capability).
    pub unavailable: Option<String>,
}

impl PmuCost {
    /// From the workers' loop counters over `packets`; `unavailable` from the runtime.
    pub fn of(
        l: &flowlane_runtime::LoopSnapshot,
        packets: u64,
        unavailable: Option<String>,
    ) -> PmuCost {
        if unavailable.is_some() {
            return PmuCost {
                unavailable,
                ..PmuCost::default()
            };
        }
        let per = |v: u64| ns_per(v, packets);
        PmuCost {
            cycles_per_packet: per(l.pmu_cycles),
            instructions_per_packet: per(l.pmu_instructions),
            ipc: (l.pmu_cycles > 0)
                .then(|| (l.pmu_instructions as f64 / l.pmu_cycles as f64 * 100.0).round() / 100.0),
            llc_misses_per_packet: per(l.pmu_llc_misses),
            unavailable: None,
        }
    }
}

/// A worker that stopped with an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerError {
    /// The worker's index.
    pub worker: usize,
    /// What it said.
    pub error: String,
}
