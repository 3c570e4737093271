//! `--metrics ADDR`: the running workers' counters in the OpenMetrics text format, encoded by
//! the kept `prometheus-client` crate from the same per-worker counters the reports are made
//! of (read at each scrape, nothing copied in the packet path). One thread answers
//! `GET /metrics` (any path) with a small blocking HTTP/1.1 server: scrapes are rare, and it
//! must not share a worker's loop.
//!
//! Names: `flowlane_<role>_<counter>_total` with labels `worker` and `cpu`, and the loop's own
//! (`flowlane_loop_rounds_total`, `flowlane_loop_cpu_ns_total`, …); `flowlane_up` is 1. The
//! hardware counters (`flowlane_loop_pmu_*`) are left out where the machine has no PMU.
//!
//! Rates: packets, bytes, requests, answers, forwarded frames and connections per second over
//! the last whole second, per worker (`flowlane_<role>_<counter>_per_second`, gauges), sampled
//! by the endpoint's own thread — for a dashboard without PromQL; `rate()` over the counters
//! says the same. Latency, where the role measures it (sink one-way, blast echo round trips,
//! HTTP load from the intended send): a histogram per worker
//! (`flowlane_<role>_<what>_seconds`, buckets 1 µs … 10 s in 1-2-5 steps) from the copy each
//! worker publishes at most five times a second ([`flowlane_runtime::latency`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use std::sync::Mutex;

use flowlane_runtime::latency::LatencyShare;
use flowlane_runtime::{Counters, Snapshot, WorkerCounters};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::NoLabelSet;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::ToolError;

/// The loop counters every role has (the rest are the role's).
const LOOP: [&str; 9] = [
    "rounds",
    "full_rounds",
    "busy_rounds",
    "sleeps",
    "spins",
    "cpu_ns",
    "pmu_cycles",
    "pmu_instructions",
    "pmu_llc_misses",
];

/// A latency histogram per worker, to export.
#[derive(Debug, Clone)]
pub struct LatencyExport {
    /// What is timed, in the metric's name (`one_way_latency` → `flowlane_sink_one_way_latency_seconds`).
    pub what: &'static str,
    /// The metric's help text.
    pub help: &'static str,
    /// Per worker, in worker order.
    pub shares: Vec<LatencyShare>,
}

/// Bucket bounds, seconds: 1 µs … 10 s in 1-2-5 steps.
fn bounds() -> Vec<f64> {
    let mut b = Vec::new();
    let mut decade = 1e-6;
    while decade < 20.0 {
        for m in [1.0, 2.0, 5.0] {
            if m * decade <= 10.0 + 1e-9 {
                b.push(m * decade);
            }
        }
        decade *= 10.0;
    }
    b
}

/// A histogram of nanoseconds as Prometheus buckets of seconds: (sum, count, per-bucket
/// counts — not cumulative — ending with +Inf). Each recorded value counts at its highest
/// equivalent value (HdrHistogram keeps 3 significant digits), as the reports' percentiles
/// do: one recorded right on a bound lands in the next bucket, never in one below what it may
/// have been. The sum uses the median equivalent value, as HdrHistogram's own mean does.
pub fn buckets(h: &hdrhistogram::Histogram<u64>) -> (f64, u64, Vec<(f64, u64)>) {
    let bounds = bounds();
    let mut counts: Vec<(f64, u64)> = bounds.iter().map(|&b| (b, 0)).collect();
    counts.push((f64::INFINITY, 0));
    let mut sum = 0.0;
    for v in h.iter_recorded() {
        let n = v.count_at_value();
        let secs = v.value_iterated_to() as f64 / 1e9;
        sum += h.median_equivalent(v.value_iterated_to()) as f64 / 1e9 * n as f64;
        let i = bounds.partition_point(|&b| b < secs);
        if let Some(c) = counts.get_mut(i) {
            c.1 += n;
        }
    }
    (sum, h.len(), counts)
}

/// Counters also served as a rate per second.
fn rated(name: &str) -> bool {
    name.ends_with("packets")
        || name.ends_with("bytes")
        || matches!(
            name,
            "requests" | "responses" | "forwarded" | "connects" | "accepted"
        )
}

/// Per worker, per counter: its rate over the last whole second (`None` before the first).
type Rates = Arc<Mutex<Option<Vec<Vec<f64>>>>>;

struct Workers<S: Counters> {
    role: &'static str,
    cpus: Vec<usize>,
    stats: Vec<Arc<WorkerCounters<S>>>,
    rates: Rates,
    latency: Option<LatencyExport>,
}

impl<S: Counters> std::fmt::Debug for Workers<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Workers({}, {} workers)", self.role, self.stats.len())
    }
}

impl<S: Counters> Collector for Workers<S> {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let up = ConstGauge::new(1i64);
        up.encode(encoder.encode_descriptor(
            "flowlane_up",
            "1 while the run goes on",
            None,
            up.metric_type(),
        )?)?;
        // Every worker's counters, read once per scrape.
        let snaps: Vec<Vec<(&'static str, u64)>> =
            self.stats.iter().map(|s| s.snapshot().fields()).collect();
        let Some(first) = snaps.first() else {
            return Ok(());
        };
        for (i, &(name, _)) in first.iter().enumerate() {
            // Hardware counters read 0 on every worker only where there is no PMU (the report
            // says why): leave them out rather than export a zero that means "unknown".
            if name.starts_with("pmu_") && snaps.iter().all(|s| s.get(i).is_none_or(|f| f.1 == 0)) {
                continue;
            }
            let metric = if LOOP.contains(&name) {
                format!("flowlane_loop_{name}")
            } else {
                format!("flowlane_{}_{name}", self.role)
            };
            let help = format!("{name}, per worker (the JSON report's field of this name)");
            let mut m = encoder.encode_descriptor(
                &metric,
                &help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (w, snap) in snaps.iter().enumerate() {
                let value = snap.get(i).map_or(0, |f| f.1);
                ConstCounter::new(value).encode(m.encode_family(&self.labels(w))?)?;
            }
        }
        let rates = self.rates.lock().ok().and_then(|g| g.clone());
        if let Some(rates) = rates {
            for (i, &(name, _)) in first.iter().enumerate().filter(|(_, f)| rated(f.0)) {
                let metric = format!("flowlane_{}_{name}_per_second", self.role);
                let help = format!("{name} per second over the last whole second, per worker");
                let mut m = encoder.encode_descriptor(
                    &metric,
                    &help,
                    None,
                    prometheus_client::metrics::MetricType::Gauge,
                )?;
                for (w, r) in rates.iter().enumerate() {
                    let v = r.get(i).copied().unwrap_or(0.0);
                    ConstGauge::new(v).encode(m.encode_family(&self.labels(w))?)?;
                }
            }
        }
        if let Some(l) = &self.latency {
            let metric = format!("flowlane_{}_{}_seconds", self.role, l.what);
            let mut m = encoder.encode_descriptor(
                &metric,
                l.help,
                None,
                prometheus_client::metrics::MetricType::Histogram,
            )?;
            for (w, share) in l.shares.iter().enumerate() {
                let Some(h) = share.read() else { continue };
                let (sum, count, b) = buckets(&h);
                m.encode_family(&self.labels(w))?
                    .encode_histogram::<NoLabelSet>(sum, count, &b, None)?;
            }
        }
        Ok(())
    }
}

impl<S: Counters> Workers<S> {
    fn labels(&self, w: usize) -> [(String, String); 2] {
        [
            ("worker".to_string(), w.to_string()),
            (
                "cpu".to_string(),
                self.cpus.get(w).copied().unwrap_or(0).to_string(),
            ),
        ]
    }
}

/// A metrics endpoint while it lives.
#[derive(Debug)]
pub struct Exporter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The address it listens on.
    pub addr: SocketAddr,
}

impl Exporter {
    /// Serves the workers' counters at `addr` until dropped.
    pub fn start<S: Counters>(
        addr: SocketAddr,
        role: &'static str,
        cpus: &[usize],
        stats: &[Arc<WorkerCounters<S>>],
    ) -> Result<Exporter, ToolError> {
        Exporter::start_with(addr, role, cpus, stats, None)
    }

    /// [`Exporter::start`], with the workers' latency histograms too.
    pub fn start_with<S: Counters>(
        addr: SocketAddr,
        role: &'static str,
        cpus: &[usize],
        stats: &[Arc<WorkerCounters<S>>],
        latency: Option<LatencyExport>,
    ) -> Result<Exporter, ToolError> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            ToolError::usage(format!(
                "--metrics {addr}: cannot listen ({e}); choose a free address and port"
            ))
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        listener
            .set_nonblocking(true)
            .map_err(|e| ToolError::runtime(format!("--metrics: {e}")))?;
        let rates: Rates = Arc::new(Mutex::new(None));
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Workers {
            role,
            cpus: cpus.to_vec(),
            stats: stats.to_vec(),
            rates: rates.clone(),
            latency,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let sampled = stats.to_vec();
        let thread = std::thread::Builder::new()
            .name("flowlane-metrics".into())
            .spawn(move || {
                let read = || -> Vec<Vec<u64>> {
                    sampled
                        .iter()
                        .map(|s| s.snapshot().fields().iter().map(|f| f.1).collect())
                        .collect()
                };
                let (mut prev, mut at) = (read(), std::time::Instant::now());
                while !s2.load(Ordering::Relaxed) {
                    if at.elapsed() >= Duration::from_secs(1) {
                        let (now, t) = (read(), std::time::Instant::now());
                        let secs = t.duration_since(at).as_secs_f64();
                        let r: Vec<Vec<f64>> = now
                            .iter()
                            .zip(&prev)
                            .map(|(n, p)| {
                                n.iter()
                                    .zip(p)
                                    .map(|(a, b)| a.saturating_sub(*b) as f64 / secs)
                                    .collect()
                            })
                            .collect();
                        if let Ok(mut g) = rates.lock() {
                            *g = Some(r);
                        }
                        (prev, at) = (now, t);
                    }
                    match listener.accept() {
                        Ok((conn, _)) => answer(conn, &registry),
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .map_err(|e| ToolError::runtime(format!("--metrics: cannot start its thread: {e}")))?;
        Ok(Exporter {
            stop,
            thread: Some(thread),
            addr,
        })
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request head (bounded in size and time) and answers it with the metrics.
fn answer(mut conn: TcpStream, registry: &Registry) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = [0u8; 8192];
    let mut have = 0;
    let complete = loop {
        match conn.read(&mut buf[have..]) {
            Ok(0) | Err(_) => break false,
            Ok(n) => have += n,
        }
        match flowlane_wire::http::parse_request(&buf[..have]) {
            Ok(Some(_)) => break true,
            Ok(None) if have < buf.len() => {}
            _ => break false,
        }
    };
    let (status, body) = if complete {
        let mut body = String::new();
        match prometheus_client::encoding::text::encode(&mut body, registry) {
            Ok(()) => ("200 OK", body),
            Err(e) => (
                "500 Internal Server Error",
                format!("encoding failed: {e}\n"),
            ),
        }
    } else {
        ("400 Bad Request", "send GET /metrics\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nanoseconds_become_second_buckets_in_1_2_5_steps() {
        let b = bounds();
        assert_eq!(b.len(), 22, "{b:?}");
        assert!(
            (b[0] - 1e-6).abs() < 1e-15 && (b[21] - 10.0).abs() < 1e-9,
            "{b:?}"
        );
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 100_000_000_000, 3)
            .expect("histogram");
        // 500 ns, 1.5 µs twice, exactly 2 ms, 20 s (beyond the last bound).
        for v in [500, 1_500, 1_500, 2_000_000, 20_000_000_000] {
            h.record(v).expect("record");
        }
        let (sum, count, counts) = buckets(&h);
        assert_eq!(count, 5);
        assert_eq!(counts.len(), 23);
        let at = |bound: f64| {
            counts
                .iter()
                .find(|c| (c.0 - bound).abs() < bound * 1e-9)
                .map(|c| c.1)
        };
        assert_eq!(at(1e-6), Some(1), "500 ns");
        assert_eq!(at(2e-6), Some(2), "1.5 µs");
        // Counted at its highest equivalent value (2.0005 ms at 3 digits): a value on a
        // bound goes to the next bucket, never to one below what it may have been.
        assert_eq!(at(2e-3), Some(0), "2 ms on its bound");
        assert_eq!(at(5e-3), Some(1), "2 ms on its bound");
        assert_eq!(counts.last(), Some(&(f64::INFINITY, 1)), "20 s");
        assert_eq!(counts.iter().map(|c| c.1).sum::<u64>(), 5);
        assert!((sum - 20.002_003_5).abs() < 0.05, "{sum}");
        assert!(rated("rx_packets") && rated("tx_bytes") && rated("requests"));
        assert!(!rated("socket_drops") && !rated("missteered"));
    }
}
