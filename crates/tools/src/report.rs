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

/// A worker that stopped with an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerError {
    /// The worker's index.
    pub worker: usize,
    /// What it said.
    pub error: String,
}
