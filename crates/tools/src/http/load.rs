//! `http load`: one pinned worker per CPU, each with its own connections and event loop; the
//! pools' connections and rates are split evenly between them. Reports requests, bytes,
//! latency from the intended and the actual send (merged HdrHistograms), errors by class, the
//! file limit it got, and memory per connection.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::load_worker::{
    ClientWorker, HttpLoadSnapshot, HttpLoadStats, LoadPlan, PoolLatency, PoolPlan, WorkerEnd,
    READ_BUF,
};
use flowlane_runtime::latency::LatencyShare;
use flowlane_runtime::{Config, Runtime, StopRule, WorkerSnapshot};
use flowlane_wire::http as h;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::config::{prefix_addresses, resolve, HttpLoadConfig, PoolConfig};
use crate::{ToolError, WorkerError};

/// The largest request body a pool may send (each request is kept whole in memory).
pub const MAX_REQUEST_BODY: u64 = 64 << 20;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LatencyUs {
    /// Answers measured.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th.
    pub p99: f64,
    /// 99.9th.
    pub p999: f64,
    /// 99.99th.
    pub p9999: f64,
    /// 99.999th.
    pub p99999: f64,
    /// Largest.
    pub max: f64,
}

impl LatencyUs {
    /// Percentiles of a nanosecond histogram (`None` when empty).
    pub fn of(h: &Histogram<u64>) -> Option<LatencyUs> {
        if h.is_empty() {
            return None;
        }
        let us = |ns: u64| (ns as f64 / 1000.0 * 1000.0).round() / 1000.0;
        Some(LatencyUs {
            count: h.len(),
            mean: (h.mean() / 1000.0 * 1000.0).round() / 1000.0,
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            p9999: us(h.value_at_quantile(0.9999)),
            p99999: us(h.value_at_quantile(0.99999)),
            max: us(h.max()),
        })
    }
}

/// Counters of a run (cumulative, or over an interval).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct HttpLoadCounts {
    /// Connections established.
    pub connects: u64,
    /// Connections closed.
    pub closes: u64,
    /// Requests sent in full.
    pub requests: u64,
    /// Complete answers.
    pub responses: u64,
    /// Answers by status class.
    pub status_1xx: u64,
    /// 2xx.
    pub status_2xx: u64,
    /// 3xx.
    pub status_3xx: u64,
    /// 4xx.
    pub status_4xx: u64,
    /// 5xx.
    pub status_5xx: u64,
    /// Bytes read.
    pub rx_bytes: u64,
    /// Reads (and drops of body bytes in the kernel) that returned bytes.
    #[serde(default)]
    pub reads: u64,
    /// Batch waits made (`--batch-wait`).
    #[serde(default)]
    pub batch_waits: u64,
    /// Time spent in them, nanoseconds.
    #[serde(default)]
    pub batch_wait_ns: u64,
    /// Answers whose latency ended at the kernel's receive timestamp of their last segment
    /// (with batch waits; the others end when read).
    #[serde(default)]
    pub stamped: u64,
    /// Body bytes read.
    pub body_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Connects refused.
    pub refused: u64,
    /// Connects that failed otherwise (or timed out).
    pub connect_errors: u64,
    /// Connections reset with a request in flight.
    pub resets: u64,
    /// Connections the server closed before the answer was complete.
    pub closed_early: u64,
    /// Requests without a complete answer within the timeout.
    pub timeouts: u64,
    /// Answers that could not be parsed.
    pub parse_errors: u64,
    /// Answers complete before their request was sent in full (the server answered early);
    /// the connection was closed after each.
    #[serde(default)]
    pub early_answers: u64,
    /// CPU time the workers' threads used in their loops, nanoseconds.
    pub cpu_ns: u64,
}

impl HttpLoadCounts {
    /// Every error: connects refused or failed, resets, early closes, timeouts, parse
    /// errors, and 4xx/5xx answers.
    pub fn errors(&self) -> u64 {
        self.refused
            + self.connect_errors
            + self.resets
            + self.closed_early
            + self.timeouts
            + self.parse_errors
            + self.status_4xx
            + self.status_5xx
    }
}

impl From<&WorkerSnapshot<HttpLoadSnapshot>> for HttpLoadCounts {
    fn from(w: &WorkerSnapshot<HttpLoadSnapshot>) -> Self {
        let s = &w.role;
        HttpLoadCounts {
            cpu_ns: w.looped.cpu_ns,
            connects: s.connects,
            closes: s.closes,
            requests: s.requests,
            responses: s.responses,
            status_1xx: s.status_1xx,
            status_2xx: s.status_2xx,
            status_3xx: s.status_3xx,
            status_4xx: s.status_4xx,
            status_5xx: s.status_5xx,
            reads: s.reads,
            batch_waits: s.batch_waits,
            batch_wait_ns: s.batch_wait_ns,
            stamped: s.stamped,
            rx_bytes: s.rx_bytes,
            body_bytes: s.body_bytes,
            tx_bytes: s.tx_bytes,
            refused: s.refused,
            connect_errors: s.connect_errors,
            resets: s.resets,
            closed_early: s.closed_early,
            timeouts: s.timeouts,
            parse_errors: s.parse_errors,
            early_answers: s.early_answers,
        }
    }
}

/// One pool's latency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PoolReport {
    /// Its name.
    pub name: String,
    /// `closed-loop` or `constant-rate`.
    pub mode: String,
    /// Connections asked.
    pub connections: usize,
    /// Where its connections were placed on the receiver's RSS queues (`--per-queue`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<super::place::PoolPlacement>,
    /// Requests per second asked (constant rate).
    pub rate: Option<f64>,
    /// Answers its rates count: all, or with ramps those to requests sent in the steady
    /// phase (the ones its latency is measured on).
    pub answers: u64,
    /// Those answers per second of the steady phase (`steady_s`).
    pub requests_per_s: f64,
    /// Their body bytes per second.
    pub body_bytes_per_s: f64,
    /// From the intended send time (closed loop: the actual one) to the complete answer.
    pub latency: Option<LatencyUs>,
    /// From the actual send.
    pub latency_actual: Option<LatencyUs>,
    /// Constant rate: how late requests left.
    pub send_lag: Option<LatencyUs>,
    /// `latency` by status class (`1xx` … `5xx`, classes seen only).
    pub by_class: Vec<(String, LatencyUs)>,
    /// `latency`'s whole distribution (nanoseconds) in HdrHistogram's compressed interchange
    /// form (`HISTFAAA…`, base64), so `merge` joins shards without losing a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_histogram: Option<String>,
    /// `latency_actual`'s, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_actual_histogram: Option<String>,
    /// `send_lag`'s, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_lag_histogram: Option<String>,
    /// `by_class`'s, likewise, by class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_class_histograms: Vec<(String, String)>,
}

/// Memory of the load process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Memory {
    /// Resident set before any connection, KiB.
    pub rss_start_kib: u64,
    /// When the most connections were open, KiB.
    pub rss_connected_kib: u64,
    /// Connections open then.
    pub connections_then: u64,
    /// (rss_connected − rss_start) / connections_then: the process's bytes per connection
    /// (user space only; the kernel's socket memory is not in it).
    pub per_connection_bytes: u64,
    /// At the first status line of the steady phase and at its last, KiB: a long run whose
    /// memory grows shows it here.
    pub rss_steady_first_kib: u64,
    /// At the last status line of the steady phase.
    pub rss_steady_last_kib: u64,
    /// The most the latency histograms could take, bytes ([`histogram_bound`]).
    #[serde(default)]
    pub histograms_max_bytes: u64,
    /// What they were allowed (`--max-memory`, or half of the memory available at the start).
    #[serde(default)]
    pub budget_bytes: u64,
    /// Seconds the workers' set-up ran past the planned start (0: none); a set-up that outlasts
    /// the run leaves no time to send in.
    #[serde(default)]
    pub setup_late_s: f64,
}

/// The most the latency histograms of a run may take, bytes: per pool, two (from the intended
/// send and from the actual one; a third at a constant rate, the send lag) on every worker
/// holding some of its connections and once more merged at the end, each grown for the
/// longest latency the run can record (`longest`); an empty pair on the other workers; and
/// the run's total. (An answer class other than 2xx, once seen, adds one of its own.)
fn histogram_bound(cfg: &HttpLoadConfig, per_pool: &[Vec<PoolPlan>], longest: Duration) -> u64 {
    use crate::http::load_worker::histogram_bytes;
    let (full, empty) = (histogram_bytes(ns(longest)), histogram_bytes(2));
    let n = per_pool.first().map_or(0, Vec::len) as u64;
    let pools: u64 = cfg
        .pools
        .iter()
        .zip(per_pool)
        .map(|(p, plans)| {
            let holders = plans.iter().filter(|w| w.conns > 0).count() as u64;
            let k = 2 + u64::from(p.rate.is_some());
            (holders + 1) * k * full + (n - holders) * 2 * empty
        })
        .sum();
    pools + 2 * full
}

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

/// `MemAvailable` of /proc/meminfo, bytes.
fn mem_available() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `12.3 MiB`.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// What a load run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HttpLoadReport {
    /// Workers' CPUs.
    pub cpus: Vec<usize>,
    /// Seconds from start to the last answer waited for.
    pub duration_s: f64,
    /// The seconds the rates are over: the steady phase, or as much of it as ran when the run
    /// was stopped sooner.
    pub steady_s: f64,
    /// Answers per second of the steady phase: every answer (with ramps, those to requests
    /// sent in the steady phase) over `steady_s`.
    pub requests_per_s: f64,
    /// Body bytes per second, same span.
    pub body_bytes_per_s: f64,
    /// Counters over the whole run.
    pub total: HttpLoadCounts,
    /// Requests sent whose answer never came (in flight at the end, timed out, reset).
    pub unanswered: u64,
    /// Errors (see `HttpLoadCounts::errors`).
    pub errors: u64,
    /// The error limit as a count, when one was given.
    pub max_errors: Option<u64>,
    /// The error limit as a share of the requests sent (0–1), when no count was given.
    #[serde(default)]
    pub max_error_share: Option<f64>,
    /// False when errors exceeded `max_errors`, no request was answered, or a worker failed.
    pub passed: bool,
    /// Why the run failed (besides `worker_errors`), in words.
    pub failures: Vec<String>,
    /// The first error any worker met, in words (the counters say how many, this says why).
    pub first_error: Option<String>,
    /// Per pool.
    pub pools: Vec<PoolReport>,
    /// Every pool's latency merged.
    pub latency: Option<LatencyUs>,
    /// The whole latency distribution (nanoseconds) of every pool, from the intended send
    /// time, for `--histogram` (not in the JSON).
    #[serde(skip)]
    pub histogram: Option<hdrhistogram::Histogram<u64>>,
    /// That distribution in HdrHistogram's compressed interchange form (`HISTFAAA…`,
    /// base64), so `merge` joins shards without losing a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_histogram: Option<String>,
    /// With `--shard` or `--start-at`: which shard of the run this is, and when it started by
    /// which clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::ShardReport>,
    /// Open-file limit (soft) after raising it to the hard one.
    pub nofile: u64,
    /// Workers run: one per CPU, or more when the connections need more file tables.
    #[serde(default)]
    pub workers: usize,
    /// When the connections did not fit in one file table: each worker had a table of its
    /// own, of this many files (the open-file limit bounds each table, not the process).
    #[serde(default)]
    pub files_per_worker: Option<u64>,
    /// Memory.
    pub memory: Memory,
    /// CPU time the load process used, seconds (user + system).
    pub cpu_s: f64,
    /// Busy polling asked for, microseconds (0: none).
    #[serde(default)]
    pub busy_poll_us: f64,
    /// Longest batch wait asked for, microseconds (0: none).
    #[serde(default)]
    pub batch_wait_us: f64,
    /// Poll rounds that found nothing and polled again instead of sleeping (busy polling).
    #[serde(default)]
    pub loop_spins: u64,
    /// Times the workers slept on readiness.
    #[serde(default)]
    pub loop_sleeps: u64,
    /// Answers per second of that CPU time.
    pub responses_per_cpu_s: f64,
    /// How long the workers' CPUs were busy meanwhile, seconds (`/proc/stat`: user, system,
    /// irq, softirq and steal, whatever ran there; `None` if it could not be read). Unlike
    /// `cpu_s` it holds the receive work for this client's packets that its CPUs did while it
    /// slept — charged to no process, and where a NIC or RPS hands a client's packets to its
    /// CPUs, much of what the client costs.
    #[serde(default)]
    pub cpus_busy_s: Option<f64>,
    /// Answers per second of that busy time.
    #[serde(default)]
    pub responses_per_busy_cpu_s: Option<f64>,
    /// The workers' own CPU time (their loops only) per answer, nanoseconds.
    pub worker_cpu_ns_per_response: Option<f64>,
    /// What each packet cost in cycles, instructions and cache misses, or why not known.
    #[serde(default)]
    pub pmu: crate::PmuCost,
    /// Workers that stopped on an error.
    pub worker_errors: Vec<WorkerError>,
    /// The host's conditions when it ran (`doctor`'s rules for its CPUs and interfaces),
    /// read by the caller before the run; none when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::doctor::DoctorReport>,
}

/// One status interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct HttpLoadTick {
    /// Since start.
    pub elapsed_s: f64,
    /// This interval.
    pub interval_s: f64,
    /// Over the interval.
    pub delta: HttpLoadCounts,
    /// Connections open now.
    pub open: u64,
    /// Resident set now, KiB.
    pub rss_kib: u64,
}

/// Known at start.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpLoadStart {
    /// Workers' CPUs.
    pub cpus: Vec<usize>,
    /// Workers (more than CPUs when the connections need more file tables).
    pub workers: usize,
    /// Each worker's own file table holds this many files (`None`: they share the process's).
    pub files_per_worker: Option<u64>,
    /// Connections asked, all pools.
    pub connections: usize,
    /// Open-file limit got.
    pub nofile: u64,
    /// Hard limit.
    pub nofile_hard: u64,
    /// The most the latency histograms could take, bytes.
    pub histograms_max_bytes: u64,
    /// What they are allowed, bytes.
    pub budget_bytes: u64,
}

/// Status from a running load.
#[derive(Debug, Clone, PartialEq)]
pub enum HttpLoadEvent {
    /// Workers are going.
    Started(HttpLoadStart),
    /// One interval.
    Tick(HttpLoadTick),
}

/// The resident set of this process, KiB (`VmRSS` of /proc/self/status; 0 if unreadable).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// A pool read into what each of `n` workers runs.
/// A pool's connections per worker of `n`: an equal share each, and the remainder one each to
/// the workers from `offset` on (modulo `n`). The offset runs on over the pools (the
/// connections before), so pools of fewer connections than workers spread over all of them:
/// 3 000 pools of one connection used to land all on the first worker.
fn shares(connections: usize, n: usize, offset: usize) -> impl Iterator<Item = usize> {
    let n = n.max(1);
    let (each, rest) = (connections / n, connections % n);
    (0..n).map(move |w| each + usize::from((w + n - offset % n) % n < rest))
}

/// Each pool's offset for [`shares`]: the connections of the pools before it, modulo `n`.
fn offsets(cfg: &HttpLoadConfig, n: usize) -> impl Iterator<Item = usize> + '_ {
    cfg.pools.iter().scan(0usize, move |before, p| {
        let at = *before;
        *before = (at + cfg.conns(p)) % n.max(1);
        Some(at)
    })
}

/// The most connections any worker of `n` holds.
fn most_per_worker(cfg: &HttpLoadConfig, n: usize) -> usize {
    let mut per = vec![0usize; n.max(1)];
    for (p, off) in cfg.pools.iter().zip(offsets(cfg, n)) {
        for (t, c) in per.iter_mut().zip(shares(cfg.conns(p), n, off)) {
            *t += c;
        }
    }
    per.into_iter().max().unwrap_or(0)
}

/// A pool's plans for `n` workers. A shard (`shard`) takes its share of the pool's
/// connections (placed as the whole run places them, then its contiguous part), of its rate
/// in proportion, and its contiguous part of the source addresses: shards never share a
/// source address, and together run what one run would.
fn plans(
    p: &PoolConfig,
    n: usize,
    offset: usize,
    shard: crate::shard::Shard,
) -> Result<Vec<PoolPlan>, ToolError> {
    if p.connections == 0 {
        return Err(ToolError::usage(format!(
            "pool {:?}: connections must be at least 1",
            p.name
        )));
    }
    let part = shard.part(p.connections);
    if part.is_empty() {
        return Err(ToolError::usage(format!(
            "pool {:?}: {} connections give shard {shard} none: at least as many connections \
             as shards",
            p.name, p.connections
        )));
    }
    if p.urls.is_empty() {
        return Err(ToolError::usage(format!("pool {:?}: no URL", p.name)));
    }
    if let Some(r) = p.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(ToolError::usage(format!(
                "pool {:?}: rate must be a positive number",
                p.name
            )));
        }
    }
    // Each request is built whole (head and body) once at start.
    if p.body_size > MAX_REQUEST_BODY {
        return Err(ToolError::usage(format!(
            "pool {:?}: body_size is at most {MAX_REQUEST_BODY} bytes, not {}",
            p.name, p.body_size
        )));
    }
    if !(p.think_ms.is_finite() && p.think_ms >= 0.0) {
        return Err(ToolError::usage(format!(
            "pool {:?}: think_ms must be ≥ 0",
            p.name
        )));
    }
    let target = resolve(&p.target)?;
    let all_sources = match &p.source {
        Some(prefix) => {
            let v = prefix_addresses(prefix, p.source_count)?;
            check_local(&v, prefix)?;
            v
        }
        None => Vec::new(),
    };
    let sources = match all_sources.is_empty() || shard.whole() {
        true => all_sources.clone(),
        false => shard
            .take(&all_sources, "source addresses")
            .map_err(|e| ToolError::usage(format!("pool {:?}: {}", p.name, e.message)))?
            .to_vec(),
    };
    let port_range = local_port_range();
    if let Some((lo, hi)) = port_range {
        ports_enough(p, part.len(), sources.len(), lo, hi)?;
    }
    let placed = match &p.placement {
        Some(pl) => {
            if !pl.hash_ports && sources.is_empty() {
                return Err(ToolError::usage(format!(
                    "pool {:?}: placed on the 2-tuple, connections differ by source address \
                     only: give them a prefix (--source PREFIX; in a scenario: source)",
                    p.name
                )));
            }
            let from = if all_sources.is_empty() {
                vec![crate::blast::route_source(target)?]
            } else {
                all_sources.clone()
            };
            let (lo, hi) = port_range.unwrap_or((32768, 60999));
            let ports = (
                u16::try_from(lo).unwrap_or(u16::MAX),
                u16::try_from(hi).unwrap_or(u16::MAX),
            );
            let mut placed = super::place::place(pl, target, &from, ports, p.connections)
                .map_err(|e| ToolError::usage(format!("pool {:?}: {e}", p.name)))?;
            placed.per_conn = placed.per_conn.get(part.clone()).unwrap_or(&[]).to_vec();
            placed.queue_of = placed.queue_of.get(part.clone()).unwrap_or(&[]).to_vec();
            Some(Arc::new(placed))
        }
        None => None,
    };
    let method = p.method.clone().unwrap_or_else(|| {
        if p.body_size > 0 {
            "POST".into()
        } else {
            "GET".into()
        }
    });
    if !method.bytes().all(|b| b.is_ascii_uppercase()) || method.is_empty() {
        return Err(ToolError::usage(format!(
            "pool {:?}: method {method:?} is not an HTTP method",
            p.name
        )));
    }
    let mut cum = 0u64;
    let mut requests = Vec::new();
    for u in &p.urls {
        if !u.path.starts_with('/') || u.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(ToolError::usage(format!(
                "pool {:?}: URL path {:?} must start with / and hold no spaces",
                p.name, u.path
            )));
        }
        let path = match u.size {
            Some(s) => format!(
                "{}{}size={s}",
                u.path,
                if u.path.contains('?') { '&' } else { '?' }
            ),
            None => u.path.clone(),
        };
        let mut bytes = Vec::new();
        h::write_request_head(
            &mut bytes,
            &method,
            &p.target,
            &path,
            p.body_size,
            p.keep_alive,
        );
        bytes.extend_from_slice(&h::body(usize::try_from(p.body_size).unwrap_or(usize::MAX)));
        cum += u64::from(u.weight.max(1));
        requests.push((Arc::<[u8]>::from(bytes), cum));
    }
    let mut out = Vec::with_capacity(n);
    let mut first = 0;
    for conns in shares(part.len(), n, offset) {
        out.push(PoolPlan {
            target,
            sources: sources.clone(),
            placed: placed.clone(),
            conns,
            first,
            requests: requests.clone(),
            head_method: method == "HEAD",
            rate: p.rate.map(|r| r * conns as f64 / p.connections as f64),
            think: Duration::from_secs_f64(p.think_ms / 1000.0),
            keep_alive: p.keep_alive,
        });
        first += conns;
    }
    Ok(out)
}

/// Files a worker keeps besides its connections at the least (its epoll and timer
/// descriptors, and what the process had open when the worker copied its table), with room
/// to spare.
const FILES_BESIDES: u64 = 64;

/// Files a worker keeps besides its connections: [`FILES_BESIDES`], or more where the caller
/// (a program using the library) has many open — a worker's table starts as a copy of its.
fn files_besides() -> u64 {
    let open = std::fs::read_dir("/proc/thread-self/fd").map_or(0, |d| d.count() as u64);
    FILES_BESIDES.max(open + 32)
}

/// At most this many workers per CPU (each a file table).
const MAX_WORKERS_PER_CPU: usize = 64;

/// How the connections are spread over file tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tables {
    /// Workers to run (a multiple of the CPUs).
    workers: usize,
    /// Whether each worker has a file table of its own.
    own_files: bool,
}

/// One worker per CPU sharing the process's file table when the connections fit in it; else
/// each worker gets a table of its own (the limit bounds each table), and as many workers per
/// CPU as it takes for every worker's share to fit in one.
fn file_tables(
    cfg: &HttpLoadConfig,
    nofile: u64,
    hard: u64,
    besides: u64,
) -> Result<Tables, ToolError> {
    let cpus = cfg.cpus.len();
    let connections: usize = cfg.pools.iter().map(|p| cfg.conns(p)).sum();
    if nofile == 0 || connections as u64 + besides <= nofile {
        return Ok(Tables {
            workers: cpus,
            own_files: false,
        });
    }
    let room = nofile.saturating_sub(besides);
    (1..=MAX_WORKERS_PER_CPU)
        .map(|k| cpus * k)
        .find(|&w| most_per_worker(cfg, w) as u64 <= room)
        .map(|workers| Tables {
            workers,
            own_files: true,
        })
        .ok_or_else(|| {
            // The shares are even within one connection per worker, whatever the pools.
            let most = room * (cpus * MAX_WORKERS_PER_CPU) as u64;
            ToolError::usage(format!(
                "{connections} connections need as many open files: with {MAX_WORKERS_PER_CPU} \
                 workers per CPU on {cpus} CPU(s), each with a file table of {nofile} (hard \
                 limit {hard}; root without CAP_SYS_RESOURCE cannot raise it), ask for at most \
                 {most}, or give more CPUs"
            ))
        })
}

/// The local ports connects choose from (`net.ipv4.ip_local_port_range` of this namespace).
fn local_port_range() -> Option<(u32, u32)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = s.split_whitespace().map(|v| v.parse::<u32>().ok());
    match (it.next()??, it.next()??) {
        (lo, hi) if lo <= hi => Some((lo, hi)),
        _ => None,
    }
}

/// A pool's connections each need a local port of their source address for its target: more
/// than the range holds per address cannot connect (the kernel says "Cannot assign requested
/// address"), so say it before the run, with the number of addresses that would do.
fn ports_enough(
    p: &PoolConfig,
    conns: usize,
    sources: usize,
    lo: u32,
    hi: u32,
) -> Result<(), ToolError> {
    let ports = (hi - lo + 1) as usize;
    let from = sources.max(1);
    if conns <= ports * from {
        return Ok(());
    }
    let need = conns.div_ceil(ports);
    let have = if sources == 0 {
        "one source address gives".to_string()
    } else {
        format!("{sources} source addresses give")
    };
    Err(ToolError::usage(format!(
        "pool {:?}: {} connections to {} need as many local ports, and {have} {} ({ports} an \
         address: net.ipv4.ip_local_port_range {lo} {hi}): give at least {need} source \
         addresses (--source PREFIX --source-count {need}; in a scenario: source, source_count)",
        p.name,
        conns,
        p.target,
        ports * from
    )))
}

/// Source addresses must be local; the first and the last are tried.
fn check_local(v: &[std::net::IpAddr], prefix: &str) -> Result<(), ToolError> {
    for ip in [v.first(), v.last()].into_iter().flatten() {
        if std::net::TcpListener::bind((*ip, 0)).is_err() {
            return Err(ToolError::usage(format!(
                "source address {ip} (of {prefix}) is not local: route the prefix to this host with \
                 `ip route add local {prefix} dev lo` (flowlane lab does this for its client prefix)"
            )));
        }
    }
    Ok(())
}

/// How long after planning the load starts: the workers' set-up before their first request
/// (phase boundaries are measured from the plan's moment plus this).
const START_LEAD: Duration = Duration::from_millis(50);

/// Runs the load; `on_event` hears the start and each interval. Four steps: the plan (every
/// setting checked, the phases, the workers and their file tables, the memory bound), the
/// start (workers made, connections not yet opened), the watch (the session, memory read each
/// interval) and the report.
pub fn run(
    cfg: &HttpLoadConfig,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(HttpLoadEvent),
) -> Result<HttpLoadReport, ToolError> {
    cfg.sharding.check()?;
    let mut p = plan(cfg)?;
    // A shard waits for the agreed start (planned and checked before it).
    let shard = cfg.sharding.start(stop)?.filter(|_| cfg.sharding.asked());
    if cfg.sharding.start_at_ns.is_some() {
        // The phases begin from the start, as `plan` sets them from its own moment.
        p.load.start = Instant::now() + START_LEAD;
    }
    let cpu0 = flowlane_io::os::process_cpu_ns().unwrap_or(0);
    let busy0 = flowlane_lab::counters::busy_jiffies(&cfg.cpus);
    let (mut rt, shares, setup_late) = start(cfg, &p, stop)?;
    // After the workers made their buffers, before any connection.
    let rss_start = rss_kib();
    on_event(HttpLoadEvent::Started(HttpLoadStart {
        cpus: cfg.cpus.clone(),
        workers: p.workers,
        files_per_worker: p.own_files.then_some(p.nofile),
        connections: p.connections,
        nofile: p.nofile,
        nofile_hard: p.nofile_hard,
        histograms_max_bytes: p.histograms_max,
        budget_bytes: p.budget,
    }));
    let w = watch(cfg, &p, &mut rt, shares, stop, rss_start, on_event)?;
    let ran = Ran {
        cpu_s: flowlane_io::os::process_cpu_ns()
            .unwrap_or(0)
            .saturating_sub(cpu0) as f64
            / 1e9,
        cpus_busy_s: busy0
            .zip(flowlane_lab::counters::busy_jiffies(&cfg.cpus))
            .map(|(a, b)| b.saturating_sub(a) as f64 / flowlane_io::os::clock_ticks_per_s() as f64),
        rss_start,
        setup_late,
        pmu_unavailable: rt.pmu_unavailable(),
    };
    let mut r = report(cfg, &p, w, &ran);
    r.shard = shard;
    Ok(r)
}

/// A run's settings, checked and resolved once.
struct Plan {
    interval: Duration,
    ramp_up: Duration,
    steady: Duration,
    workers: usize,
    worker_cpus: Vec<usize>,
    /// Each pool's share per worker.
    per_pool: Vec<Vec<PoolPlan>>,
    load: LoadPlan,
    connections: usize,
    nofile: u64,
    nofile_hard: u64,
    /// Files the process holds besides the connections.
    besides: u64,
    own_files: bool,
    histograms_max: u64,
    budget: u64,
}

/// The plan: every setting checked, the phases, the workers (a file table each where the
/// connections need it) and each pool's share of them, and the histograms' memory bound
/// against `--max-memory`.
fn plan(cfg: &HttpLoadConfig) -> Result<Plan, ToolError> {
    let interval = crate::seconds("interval", cfg.interval_s)?;
    let steady = crate::seconds("duration", cfg.duration_s)?;
    let opt = |what: &str, v: f64| -> Result<Duration, ToolError> {
        if v == 0.0 {
            Ok(Duration::ZERO)
        } else {
            crate::seconds(what, v)
        }
    };
    let (ramp_up, ramp_down) = (
        opt("ramp-up", cfg.ramp_up_s)?,
        opt("ramp-down", cfg.ramp_down_s)?,
    );
    let (drain, timeout) = (
        opt("drain", cfg.drain_s)?,
        crate::seconds("timeout", cfg.timeout_s)?,
    );
    if !(0.0..=1e6).contains(&cfg.busy_poll_us) {
        return Err(ToolError::usage(format!(
            "busy poll {} µs: give 0 (sleep when idle) up to 1 s, e.g. 50us",
            cfg.busy_poll_us
        )));
    }
    if !(0.0..=10_000.0).contains(&cfg.batch_wait_us) {
        return Err(ToolError::usage(format!(
            "batch wait {} µs: give 0 (none) up to 10 ms, e.g. 500us",
            cfg.batch_wait_us
        )));
    }
    if cfg.busy_poll_us > 0.0 && cfg.batch_wait_us > 0.0 {
        return Err(ToolError::usage(
            "busy polling and batch waits pull against each other (one never sleeps, the other \
             sleeps on purpose): give one of them",
        ));
    }
    if cfg.batch_wait_us > 0.0 && cfg.pools.iter().any(|p| p.rate.is_some()) {
        return Err(ToolError::usage(
            "batch waits apply only when every pool is a closed loop (at a constant rate each \
             request's intended time decides when it goes): drop --batch-wait or the rate",
        ));
    }
    if cfg.read_size != 0 && !(256..=READ_BUF).contains(&cfg.read_size) {
        return Err(ToolError::usage(format!(
            "read size {} B: give 256 B up to {} KiB (0: the whole buffer)",
            cfg.read_size,
            READ_BUF / 1024
        )));
    }
    if cfg.cpus.is_empty() || cfg.pools.is_empty() {
        return Err(ToolError::usage("no CPUs or no pools to run"));
    }
    let connections: usize = cfg.pools.iter().map(|p| cfg.conns(p)).sum();
    let (nofile, hard) = flowlane_io::os::raise_nofile_limit().unwrap_or((0, 0));
    let besides = files_besides();
    let tables = file_tables(cfg, nofile, hard, besides)?;
    let n = tables.workers;
    // Worker `i` runs on `cfg.cpus[i % cpus]`: the extra workers of a CPU come after one on
    // every CPU, so each CPU gets its share.
    let worker_cpus: Vec<usize> = (0..n).map(|i| cfg.cpus[i % cfg.cpus.len()]).collect();
    let per_pool: Vec<Vec<PoolPlan>> = cfg
        .pools
        .iter()
        .zip(offsets(cfg, n))
        .map(|(p, off)| plans(p, n, off, cfg.sharding.shard))
        .collect::<Result<_, _>>()?;
    let longest = ramp_up + steady + ramp_down + drain + timeout;
    let histograms_max = histogram_bound(cfg, &per_pool, longest);
    let budget = cfg
        .max_memory
        .or_else(|| mem_available().map(|m| m / 2))
        .unwrap_or(u64::MAX);
    if histograms_max > budget {
        return Err(ToolError::usage(format!(
            "{} pool(s) on {n} worker(s) could take {} of latency histograms (two per pool on \
             each worker holding its connections, three at a constant rate, each up to {} for \
             latencies to {:.0} s), more than the {} allowed (--max-memory; default: half of \
             the memory available): give fewer pools or a shorter run or --timeout, or raise \
             --max-memory",
            cfg.pools.len(),
            mib(histograms_max),
            mib(super::load_worker::histogram_bytes(ns(longest))),
            longest.as_secs_f64(),
            mib(budget)
        )));
    }
    let load = LoadPlan {
        start: Instant::now() + START_LEAD,
        ramp_up,
        steady,
        ramp_down,
        drain,
        timeout,
        connect_window: cfg.connect_window.max(1),
        read_size: cfg.read_size,
        batch_wait: Duration::from_nanos((cfg.batch_wait_us * 1e3) as u64),
    };
    Ok(Plan {
        interval,
        ramp_up,
        steady,
        workers: n,
        worker_cpus,
        per_pool,
        load,
        connections,
        nofile,
        nofile_hard: hard,
        besides,
        own_files: tables.own_files,
        histograms_max,
        budget,
    })
}

type LoadRuntime = Runtime<HttpLoadStats, WorkerEnd>;

/// The start: one worker per planned slot, made (pools, buffers, latency shares) before the
/// gate opens; what their making took past the planned start is returned, time the run lost.
fn start(
    cfg: &HttpLoadConfig,
    p: &Plan,
    stop: &Arc<AtomicBool>,
) -> Result<(LoadRuntime, Vec<LatencyShare>, Duration), ToolError> {
    // `--metrics`: each worker's latency, published as it goes.
    let shares: Vec<LatencyShare> = (0..p.workers).map(|_| LatencyShare::new()).collect();
    let (shares2, timed) = (shares.clone(), cfg.metrics.is_some());
    let rt_cfg = Config {
        cpus: p.worker_cpus.clone(),
        budget: 512,
        wait_ms: 20,
        busy_poll: Duration::from_nanos((cfg.busy_poll_us * 1e3) as u64),
        own_files: p.own_files,
    };
    let (per_pool, load) = (p.per_pool.clone(), p.load.clone());
    let mut rt: LoadRuntime = Runtime::start(&rt_cfg, stop.clone(), move |idx, _cpu| {
        let pools = per_pool.iter().map(|w| w[idx].clone()).collect();
        let w = ClientWorker::new(pools, load.clone(), 0x9e37_79b9_7f4a_7c15 ^ idx as u64)?;
        Ok::<_, flowlane_io::SysError>(match shares2.get(idx).filter(|_| timed) {
            Some(s) => w.with_latency_share(s.clone()),
            None => w,
        })
    })
    .map_err(|e| crate::error::start_error(e, |_, m| ToolError::runtime(m)))?;
    let setup_late = Instant::now().saturating_duration_since(p.load.start);
    if p.own_files {
        if let Some(why) = rt.own_files_refused() {
            rt.join();
            return Err(ToolError::usage(format!(
                "{} connections need file tables of their own (one holds {} files), and this \
                 system refuses them ({why}: a seccomp filter, as containers have, forbids \
                 unshare): ask for at most {}",
                p.connections,
                p.nofile,
                p.nofile.saturating_sub(p.besides)
            )));
        }
    }
    Ok((rt, shares, setup_late))
}

/// What the watch saw: the session's end and the memory as the connections opened and over
/// the steady phase.
struct Watched {
    end: flowlane_runtime::SessionEnd<HttpLoadSnapshot, WorkerEnd>,
    /// Most connections open at once, and the resident memory then.
    peak: u64,
    rss_at_peak: u64,
    /// Resident memory at the first and the last tick of the steady phase.
    steady_first: u64,
    steady_last: u64,
}

/// The watch: the session, a tick each interval with the counters and the resident memory,
/// `--metrics` served while it runs.
fn watch(
    cfg: &HttpLoadConfig,
    p: &Plan,
    rt: &mut LoadRuntime,
    shares: Vec<LatencyShare>,
    stop: &Arc<AtomicBool>,
    rss_start: u64,
    on_event: &mut dyn FnMut(HttpLoadEvent),
) -> Result<Watched, ToolError> {
    let rule = StopRule {
        external: stop.clone(),
        deadline: None,
    };
    let (mut peak, mut rss_at_peak) = (0u64, rss_start);
    let (mut steady_first, mut steady_last) = (0u64, 0u64);
    let steady_span = (p.ramp_up + START_LEAD, p.ramp_up + p.steady + START_LEAD);
    let interval = p.interval;
    let _metrics = cfg
        .metrics
        .map(|a| {
            let latency = crate::metrics::LatencyExport {
                what: "latency",
                help: "from each request's intended send to its whole answer, per worker",
                shares,
            };
            crate::metrics::Exporter::start_with(
                a,
                "http_load",
                &p.worker_cpus,
                rt.stats(),
                Some(latency),
            )
        })
        .transpose()?;
    let end = rt.session(Some(interval), &rule, &mut |t| {
        let total = t.total().role;
        let open = total.connects.saturating_sub(total.closes);
        let rss = rss_kib();
        if open > peak {
            peak = open;
            rss_at_peak = rss;
        }
        if t.elapsed >= steady_span.0 && t.elapsed <= steady_span.1 + interval / 2 {
            if steady_first == 0 {
                steady_first = rss;
            }
            steady_last = rss;
        }
        on_event(HttpLoadEvent::Tick(HttpLoadTick {
            elapsed_s: t.elapsed.as_secs_f64(),
            interval_s: t.interval.as_secs_f64(),
            delta: HttpLoadCounts::from(&t.delta()),
            open,
            rss_kib: rss,
        }));
    });
    Ok(Watched {
        end,
        peak,
        rss_at_peak,
        steady_first,
        steady_last,
    })
}

/// What the report needs from around the session: CPU time, memory at the start, how late
/// the workers were made, and why hardware counters are missing, if they are.
struct Ran {
    cpu_s: f64,
    cpus_busy_s: Option<f64>,
    rss_start: u64,
    setup_late: Duration,
    pmu_unavailable: Option<String>,
}

/// The report: the workers' histograms merged per pool, rates over the steady phase, the
/// error budget judged.
fn report(cfg: &HttpLoadConfig, p: &Plan, w: Watched, ran: &Ran) -> HttpLoadReport {
    let Watched {
        end,
        peak,
        rss_at_peak,
        steady_first,
        steady_last,
    } = w;
    let (n, nofile, cpu_s, cpus_busy_s) = (p.workers, p.nofile, ran.cpu_s, ran.cpus_busy_s);
    let (rss_start, setup_late, steady) = (ran.rss_start, ran.setup_late, p.steady);
    let looped = end.total().looped;
    let total = HttpLoadCounts::from(&end.total());
    let mut lat: Vec<PoolLatency> = cfg.pools.iter().map(|_| PoolLatency::new()).collect();
    let mut first_error = None;
    // Each worker's histograms come back through the join.
    for v in end.reports.into_iter().flatten() {
        for (a, b) in lat.iter_mut().zip(&v.latency) {
            a.merge(b);
        }
        first_error = first_error.or(v.first_error);
    }
    let mut all = PoolLatency::new();
    for l in &lat {
        all.merge(l);
    }
    // Rates over the steady phase: the answers the latency is measured on (all of them; with
    // ramps, those to requests sent in the steady phase) over its length, or over as much of
    // it as ran when the run was stopped sooner (Ctrl-C).
    let secs = end.elapsed.as_secs_f64();
    let span_s = steady
        .as_secs_f64()
        .min(secs - p.ramp_up.as_secs_f64())
        .max(1e-9);
    let span_resp: u64 = lat.iter().map(|l| l.answers).sum();
    let span_body: u64 = lat.iter().map(|l| l.body_bytes).sum();
    let errors = total.errors();
    let worker_errors: Vec<WorkerError> = end
        .errors
        .into_iter()
        .map(|(worker, error)| WorkerError {
            worker,
            error: error.to_string(),
        })
        .collect();
    let mut failures = Vec::new();
    let share = match cfg.max_errors {
        Some(m) => {
            if errors > m {
                failures.push(format!("{errors} errors, more than --max-errors {m}"));
            }
            None
        }
        None => {
            let share = cfg
                .max_error_share
                .unwrap_or(super::config::DEFAULT_MAX_ERROR_SHARE);
            if errors as f64 > share * total.requests as f64 {
                failures.push(format!(
                    "{errors} errors in {} requests, more than --max-errors {}% of them \
                     (the default; set --max-errors to a count or a share)",
                    total.requests,
                    share * 100.0
                ));
            }
            Some(share)
        }
    };
    if total.responses == 0 {
        failures.push(no_answers(cfg, &total, first_error.as_deref(), setup_late));
    }
    let passed = worker_errors.is_empty() && failures.is_empty();
    HttpLoadReport {
        host: None,
        cpus: cfg.cpus.clone(),
        duration_s: (secs * 1000.0).round() / 1000.0,
        steady_s: span_s,
        requests_per_s: span_resp as f64 / span_s,
        body_bytes_per_s: span_body as f64 / span_s,
        unanswered: total.requests.saturating_sub(total.responses),
        errors,
        max_errors: cfg.max_errors,
        max_error_share: share,
        passed,
        failures,
        first_error,
        pools: cfg
            .pools
            .iter()
            .zip(&lat)
            .zip(&p.per_pool)
            .map(|((p, l), plans)| PoolReport {
                name: p.name.clone(),
                mode: if p.rate.is_some() {
                    "constant-rate"
                } else {
                    "closed-loop"
                }
                .into(),
                connections: cfg.conns(p),
                placement: plans
                    .iter()
                    .find_map(|w| w.placed.as_ref())
                    .map(|x| x.summary.clone()),
                rate: p
                    .rate
                    .map(|r| r * cfg.conns(p) as f64 / p.connections.max(1) as f64),
                answers: l.answers,
                requests_per_s: l.answers as f64 / span_s,
                body_bytes_per_s: l.body_bytes as f64 / span_s,
                latency: LatencyUs::of(&l.intended),
                latency_actual: LatencyUs::of(&l.actual),
                send_lag: l.lag.as_ref().and_then(LatencyUs::of),
                latency_histogram: crate::report::encode_histogram(&l.intended),
                latency_actual_histogram: crate::report::encode_histogram(&l.actual),
                send_lag_histogram: l.lag.as_ref().and_then(crate::report::encode_histogram),
                by_class: l
                    .classes()
                    .iter()
                    .enumerate()
                    .filter_map(|(i, hc)| {
                        hc.as_ref()
                            .and_then(LatencyUs::of)
                            .map(|x| (format!("{}xx", i + 1), x))
                    })
                    .collect(),
                by_class_histograms: l
                    .classes()
                    .iter()
                    .enumerate()
                    .filter_map(|(i, hc)| {
                        hc.as_ref()
                            .and_then(crate::report::encode_histogram)
                            .map(|x| (format!("{}xx", i + 1), x))
                    })
                    .collect(),
            })
            .collect(),
        latency: LatencyUs::of(&all.intended),
        histogram: Some(all.intended.clone()).filter(|h| !h.is_empty()),
        latency_histogram: crate::report::encode_histogram(&all.intended),
        shard: None,
        nofile,
        workers: n,
        files_per_worker: p.own_files.then_some(nofile),
        memory: Memory {
            rss_start_kib: rss_start,
            rss_connected_kib: rss_at_peak,
            connections_then: peak,
            per_connection_bytes: (rss_at_peak.saturating_sub(rss_start) * 1024)
                .checked_div(peak)
                .unwrap_or(0),
            rss_steady_first_kib: steady_first,
            rss_steady_last_kib: steady_last,
            histograms_max_bytes: p.histograms_max,
            budget_bytes: p.budget,
            setup_late_s: setup_late.as_secs_f64(),
        },
        cpu_s: (cpu_s * 1000.0).round() / 1000.0,
        busy_poll_us: cfg.busy_poll_us,
        batch_wait_us: cfg.batch_wait_us,
        loop_spins: looped.spins,
        loop_sleeps: looped.sleeps,
        worker_cpu_ns_per_response: crate::ns_per(total.cpu_ns, total.responses),
        pmu: crate::PmuCost::of(&looped, total.responses, ran.pmu_unavailable.clone()),
        responses_per_cpu_s: if cpu_s > 0.0 {
            total.responses as f64 / cpu_s
        } else {
            0.0
        },
        cpus_busy_s,
        responses_per_busy_cpu_s: cpus_busy_s
            .filter(|b| *b > 0.0)
            .map(|b| total.responses as f64 / b),
        total,
        worker_errors,
    }
}

/// Why a run with no answer at all failed: a run that measured nothing is a failure whatever
/// `--max-errors` says.
fn no_answers(
    cfg: &HttpLoadConfig,
    t: &HttpLoadCounts,
    first: Option<&str>,
    setup_late: Duration,
) -> String {
    let mut targets: Vec<&str> = cfg.pools.iter().map(|p| p.target.as_str()).collect();
    targets.sort_unstable();
    targets.dedup();
    let targets = targets.join(", ");
    let why = first
        .map(|e| format!(" (the first: {e})"))
        .unwrap_or_default();
    if t.requests == 0 && t.connects + t.refused + t.connect_errors == 0 && !setup_late.is_zero() {
        return format!(
            "no answers: no connection was tried — the workers' set-up ran {:.2} s past the \
             planned start, and the run ({:.1} s of sending) had no time left: give fewer pools \
             or connections, or a longer run",
            setup_late.as_secs_f64(),
            cfg.ramp_up_s + cfg.duration_s + cfg.ramp_down_s
        );
    }
    if t.connects == 0 && t.refused > 0 && t.connect_errors == 0 {
        format!(
            "no answers: all {} connects were refused — is a server listening at {targets}?",
            t.refused
        )
    } else if t.connects == 0 && t.refused + t.connect_errors > 0 {
        format!(
            "no answers: no connection to {targets} could be made ({} refused, {} failed otherwise){why}",
            t.refused, t.connect_errors
        )
    } else if t.requests == 0 && t.tx_bytes > 0 {
        format!(
            "no answers: {} connections made and {} bytes sent, but no request was sent in \
             full in the run (a large body? give a longer run or a smaller --body-size){why}",
            t.connects, t.tx_bytes
        )
    } else if t.requests == 0 {
        format!(
            "no answers: {} connections made, but no request was sent in the run{why}",
            t.connects
        )
    } else {
        format!(
            "no answers: {} requests sent to {targets}, none answered in the run{why}",
            t.requests
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::Shard;

    fn cfg(cpus: usize, pools: &[usize]) -> HttpLoadConfig {
        let mut text = format!(
            "duration_s = 1\ncpus = {:?}\n",
            (0..cpus).collect::<Vec<_>>()
        );
        for (i, c) in pools.iter().enumerate() {
            text += &format!(
                "[[pools]]\nname = \"p{i}\"\ntarget = \"198.18.0.1:80\"\nconnections = {c}\nurls = [{{ path = \"/\" }}]\n"
            );
        }
        HttpLoadConfig::from_toml(&text).expect("config")
    }

    fn tables(workers: usize, own_files: bool) -> Tables {
        Tables { workers, own_files }
    }

    #[test]
    fn connections_that_fit_one_file_table_share_it() {
        assert_eq!(
            file_tables(&cfg(2, &[19_000]), 20_000, 20_000, FILES_BESIDES).ok(),
            Some(tables(2, false))
        );
        assert_eq!(
            file_tables(&cfg(1, &[19_936]), 20_000, 20_000, FILES_BESIDES).ok(),
            Some(tables(1, false))
        );
        // An unknown limit: one table, and the kernel says when it is full.
        assert_eq!(
            file_tables(&cfg(2, &[500_000]), 0, 0, FILES_BESIDES).ok(),
            Some(tables(2, false))
        );
    }

    #[test]
    fn more_connections_get_tables_of_their_own_and_workers_enough_to_hold_them() {
        // 30 000 on 2 CPUs: 15 000 a worker fits its own table.
        assert_eq!(
            file_tables(&cfg(2, &[30_000]), 20_000, 20_000, FILES_BESIDES).ok(),
            Some(tables(2, true))
        );
        // 100 000 on 2 CPUs: 3 workers a CPU, 16 667 each.
        assert_eq!(
            file_tables(&cfg(2, &[100_000]), 20_000, 20_000, FILES_BESIDES).ok(),
            Some(tables(6, true))
        );
        // Each pool's share is rounded up: 2 pools of 19 937 on 1 CPU need 3 tables, not 2.
        assert_eq!(
            file_tables(&cfg(1, &[19_937, 19_937]), 20_000, 20_000, FILES_BESIDES).ok(),
            Some(tables(3, true))
        );
        for (cpus, conns, nofile) in [(2, 100_000, 20_000), (1, 1000, 300), (3, 150_000, 1024)] {
            let t = file_tables(&cfg(cpus, &[conns]), nofile, nofile, FILES_BESIDES).expect("fits");
            assert!(conns.div_ceil(t.workers) as u64 + FILES_BESIDES <= nofile);
            assert!(
                t.workers == cpus
                    || conns.div_ceil(t.workers - cpus) as u64 + FILES_BESIDES > nofile,
                "the fewest workers that hold them: {t:?}"
            );
        }
    }

    #[test]
    fn where_own_file_tables_are_refused_more_than_one_holds_is_a_usage_error() {
        // Under a seccomp filter refusing unshare (as in a container), on a thread of its own.
        std::thread::spawn(|| {
            flowlane_io::os::refuse_unshare_here().expect("seccomp filter");
            let (nofile, _) = flowlane_io::os::raise_nofile_limit().expect("limit");
            // More than one table holds, to a port nobody listens on: it must stop before.
            let mut c = cfg(2, &[nofile as usize + 1000]);
            c.pools[0].target = "127.0.0.1:1".into();
            let stop = Arc::new(AtomicBool::new(false));
            let e = run(&c, &stop, &mut |_| {}).expect_err("refused");
            let text = e.to_string();
            assert!(
                text.contains("refuses") && text.contains("unshare"),
                "{text}"
            );
            // What one table holds besides the caller's own files (64 at least).
            let most: u64 = text
                .rsplit("at most ")
                .next()
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("a number: {text}"));
            assert!(
                most <= nofile - FILES_BESIDES && most + 1000 > nofile,
                "{text}"
            );
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn a_caller_with_many_files_open_leaves_workers_less_room() {
        let base = files_besides();
        assert!(base >= FILES_BESIDES);
        let held: Vec<std::fs::File> = (0..200)
            .map(|_| std::fs::File::open("/proc/self/stat").expect("open"))
            .collect();
        assert!(
            files_besides() >= 200 + 32,
            "{} with 200 more open",
            files_besides()
        );
        drop(held);
    }

    #[test]
    fn more_connections_than_local_ports_name_the_addresses_that_would_do() {
        let c = cfg(1, &[100_000]);
        let p = &c.pools[0];
        // The default range, 28 232 ports an address.
        let e =
            ports_enough(p, p.connections, 0, 32768, 60999).expect_err("one address is not enough");
        let text = e.to_string();
        assert!(text.contains("one source address gives 28232"), "{text}");
        assert!(text.contains("--source-count 4"), "{text}");
        let e = ports_enough(p, p.connections, 3, 32768, 60999).expect_err("three are not enough");
        assert!(
            e.to_string().contains("3 source addresses give 84696"),
            "{e}"
        );
        assert!(ports_enough(p, p.connections, 4, 32768, 60999).is_ok());
        // Exactly the range fits.
        assert!(ports_enough(&cfg(1, &[100]).pools[0], 100, 0, 1000, 1099).is_ok());
        assert!(ports_enough(&cfg(1, &[101]).pools[0], 101, 0, 1000, 1099).is_err());
    }

    #[test]
    fn more_than_every_table_may_hold_is_a_usage_error_that_names_the_most() {
        let e = file_tables(&cfg(1, &[10_000]), 100, 100, FILES_BESIDES).expect_err("too many");
        let text = e.to_string();
        assert!(text.contains("at most 2304,"), "{text}");
        // …and that many do fit, one more does not.
        assert!(file_tables(&cfg(1, &[2304]), 100, 100, FILES_BESIDES).is_ok());
        assert!(file_tables(&cfg(1, &[2305]), 100, 100, FILES_BESIDES).is_err());
        // With pools, what it names fits however they are split.
        let e = file_tables(&cfg(1, &[5000, 5000]), 100, 100, FILES_BESIDES).expect_err("too many");
        assert!(e.to_string().contains("at most 2304,"), "{e}");
        for a in [1, 63, 64, 65, 1000, 2112, 2303] {
            assert!(
                file_tables(&cfg(1, &[a, 2304 - a]), 100, 100, FILES_BESIDES).is_ok(),
                "{a}"
            );
        }
        // 20 001 pools of one connection: 10 001 a worker on 2 CPUs (it said "at most 0").
        let many = cfg(2, &[1; 20_001]);
        assert_eq!(
            file_tables(&many, 20_000, 20_000, FILES_BESIDES).ok(),
            Some(tables(2, true))
        );
    }

    #[test]
    fn the_histograms_bound_counts_each_holder_and_the_merge() {
        use crate::http::load_worker::histogram_bytes;
        let c = cfg(2, &[1, 4]);
        let per: Vec<Vec<PoolPlan>> = c
            .pools
            .iter()
            .zip(offsets(&c, 2))
            .map(|(p, off)| plans(p, 2, off, Shard::WHOLE).expect("plans"))
            .collect();
        let longest = Duration::from_secs(13);
        let (full, empty) = (histogram_bytes(13_000_000_000), histogram_bytes(2));
        // 1 connection: one holder (+ the merge), an empty pair on the other worker; 4: two.
        let want = 2 * 2 * full + 2 * empty + 3 * 2 * full + 2 * full;
        assert_eq!(histogram_bound(&c, &per, longest), want);
        // Grown to 13 s, a histogram's counters: 24 buckets of 1 024, in a vector of 32 768.
        assert_eq!(full, 32_768 * 8);
        assert_eq!(empty, 2048 * 8);
    }

    #[test]
    fn a_set_up_that_outlasts_the_run_is_the_reason_given() {
        let c = cfg(1, &[3000]);
        let none = HttpLoadCounts::default();
        let why = no_answers(&c, &none, None, Duration::from_millis(1500));
        assert!(
            why.contains("set-up ran 1.50 s past the planned start"),
            "{why}"
        );
        // Connections made but no request sent is another story, told as before.
        let made = HttpLoadCounts {
            connects: 5,
            ..HttpLoadCounts::default()
        };
        let why = no_answers(&c, &made, None, Duration::ZERO);
        assert!(why.contains("5 connections made"), "{why}");
    }

    #[test]
    fn pools_smaller_than_the_workers_spread_over_all_of_them() {
        // 3 000 pools of one connection on 2 workers: 1 500 each, not 3 000 on the first.
        let c = cfg(2, &[1; 3000]);
        assert_eq!(most_per_worker(&c, 2), 1500);
        let mut per = [0usize; 2];
        for (p, off) in c.pools.iter().zip(offsets(&c, 2)) {
            let plans = plans(p, 2, off, Shard::WHOLE).expect("plans");
            assert_eq!(plans.iter().map(|w| w.conns).sum::<usize>(), 1);
            for (t, w) in per.iter_mut().zip(&plans) {
                *t += w.conns;
            }
        }
        assert_eq!(per, [1500, 1500]);
        // Uneven pools: each is whole, and no worker holds more than one above another.
        let c = cfg(3, &[5, 7, 1, 1, 2, 10]);
        let mut per = [0usize; 3];
        for (p, off) in c.pools.iter().zip(offsets(&c, 3)) {
            let s: Vec<usize> = shares(p.connections, 3, off).collect();
            assert_eq!(s.iter().sum::<usize>(), p.connections);
            for (t, w) in per.iter_mut().zip(&s) {
                *t += w;
            }
        }
        assert_eq!(per, [9, 9, 8]);
        assert_eq!(most_per_worker(&c, 3), 9);
    }

    /// Shards of a pool: their connections, rates and source addresses add up to the
    /// whole pool's, and no two shards share a source address.
    #[test]
    fn shards_split_connections_rate_and_sources() {
        let mut c = cfg(2, &[10]);
        c.pools[0].rate = Some(1000.0);
        c.pools[0].source = Some("127.0.0.0/28".into());
        c.pools[0].source_count = Some(7);
        let mut seen = Vec::new();
        let (mut conns, mut rate) = (0, 0.0);
        for i in 0..3 {
            let shard = Shard::new(i, 3).expect("shard");
            let plans = plans(&c.pools[0], 2, 0, shard).expect("plans");
            conns += plans.iter().map(|w| w.conns).sum::<usize>();
            rate += plans.iter().filter_map(|w| w.rate).sum::<f64>();
            let s = &plans[0].sources;
            assert!(plans.iter().all(|w| &w.sources == s));
            assert!(
                s.iter().all(|a| !seen.contains(a)),
                "{s:?} against {seen:?}"
            );
            seen.extend(s.iter().copied());
        }
        assert_eq!(conns, 10);
        assert!((rate - 1000.0).abs() < 1e-6, "{rate}");
        assert_eq!(seen.len(), 7);
        // More shards than connections leaves one empty: refused.
        assert!(plans(&c.pools[0], 2, 0, Shard::new(0, 11).expect("shard")).is_err());
    }
}
