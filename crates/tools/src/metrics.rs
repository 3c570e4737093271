//! `--metrics ADDR`: the running workers' counters in the OpenMetrics text format, encoded by
//! the kept `prometheus-client` crate from the same per-worker counters the reports are made
//! of (read at each scrape, nothing copied in the packet path). One thread answers
//! `GET /metrics` (any path) with a small blocking HTTP/1.1 server: scrapes are rare, and it
//! must not share a worker's loop.
//!
//! Names: `flowlane_<role>_<counter>_total` with labels `worker` and `cpu`, and the loop's own
//! (`flowlane_loop_rounds_total`, `flowlane_loop_cpu_ns_total`, …); `flowlane_up` is 1. The
//! hardware counters (`flowlane_loop_pmu_*`) are left out where the machine has no PMU.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use flowlane_runtime::{Counters, Snapshot, WorkerCounters};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::ToolError;

/// The loop counters every role has (the rest are the role's).
const LOOP: [&str; 8] = [
    "rounds",
    "full_rounds",
    "busy_rounds",
    "sleeps",
    "cpu_ns",
    "pmu_cycles",
    "pmu_instructions",
    "pmu_llc_misses",
];

struct Workers<S: Counters> {
    role: &'static str,
    cpus: Vec<usize>,
    stats: Vec<Arc<WorkerCounters<S>>>,
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
                let labels = [
                    ("worker".to_string(), w.to_string()),
                    (
                        "cpu".to_string(),
                        self.cpus.get(w).copied().unwrap_or(0).to_string(),
                    ),
                ];
                ConstCounter::new(value).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
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
        let listener = TcpListener::bind(addr).map_err(|e| {
            ToolError::usage(format!(
                "--metrics {addr}: cannot listen ({e}); choose a free address and port"
            ))
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        listener
            .set_nonblocking(true)
            .map_err(|e| ToolError::runtime(format!("--metrics: {e}")))?;
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Workers {
            role,
            cpus: cpus.to_vec(),
            stats: stats.to_vec(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("flowlane-metrics".into())
            .spawn(move || {
                while !s2.load(Ordering::Relaxed) {
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
