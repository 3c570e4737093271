//! `http serve`: one pinned worker per CPU, each with its own `SO_REUSEPORT` listener; the
//! classic BPF program `serve` uses for UDP picks the listener of the worker on the CPU that
//! processed the SYN, so a connection's packets and its worker share a CPU. Answers
//! `GET /bytes/N` (or `size=N` in the query) with N bytes of the pattern, `/echo` with the
//! request's body, `/` with the default size.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::serve_worker::{Bodies, HttpServeSnapshot, HttpServeStats, ServerConfig, ServerWorker};
use flowlane_io::tcp::{self, GroupError, ListenConfig, Steering};
use flowlane_runtime::{Config, Runtime, StopRule, WorkerSnapshot};
use serde::{Deserialize, Serialize};

use crate::{ToolError, WorkerError};

/// The largest body the server can be asked to hold (the memfd it sends from).
pub const MAX_BODY: u64 = 256 << 20;
/// The largest body copied from a buffer rather than sent by `sendfile`.
pub const COPY_MAX: u64 = 1 << 20;

/// What to serve.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HttpServeConfig {
    /// Address every worker's listener binds.
    pub bind: SocketAddr,
    /// One worker per CPU, in this order.
    pub cpus: Vec<usize>,
    /// Workers on each CPU (more than one only to hold more connections than one file table
    /// may: each worker has a table of its own); the CPU's workers share its connections by
    /// the flow hash.
    #[serde(default = "one")]
    pub workers_per_cpu: usize,
    /// Steer connections to the worker on the CPU that processed their SYN (else the
    /// kernel's reuseport hash).
    pub steer: bool,
    /// Accept queue length per listener (capped by `net.core.somaxconn`).
    pub backlog: i32,
    /// Bytes `/` answers.
    pub default_size: u64,
    /// Bodies up to this many bytes are written from a buffer; larger ones go by `sendfile`.
    pub copy_max: usize,
    /// The largest body answered (a memfd of this size is made; larger asks get 413).
    pub max_size: u64,
    /// Longest request head accepted (431 beyond).
    pub max_head: usize,
    /// Seconds a request head begun may take to arrive whole (else 408 and the connection is
    /// closed: a client trickling a head cannot hold a connection).
    #[serde(default = "header_timeout")]
    pub header_timeout_s: f64,
    /// Seconds a connection may go without a byte in or out before it is closed (0: never).
    /// Besides, when the file table is full, the connections idle longest make room.
    #[serde(default = "idle_timeout")]
    pub idle_timeout_s: f64,
    /// Run this long (seconds); `None`: until stopped.
    pub duration_s: Option<f64>,
    /// Status interval, seconds.
    pub interval_s: f64,
    /// Serve the workers' counters in the OpenMetrics text format at this address while
    /// running (`--metrics`).
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
}

fn one() -> usize {
    1
}
fn header_timeout() -> f64 {
    10.0
}
fn idle_timeout() -> f64 {
    60.0
}

/// At most this many workers per CPU.
pub const MAX_WORKERS_PER_CPU: usize = 64;

impl Default for HttpServeConfig {
    fn default() -> Self {
        HttpServeConfig {
            workers_per_cpu: 1,
            metrics: None,
            bind: SocketAddr::from(([0, 0, 0, 0], 8080)),
            cpus: vec![0],
            steer: true,
            backlog: 4096,
            default_size: 64,
            copy_max: 16 * 1024,
            max_size: 16 << 20,
            max_head: 16 * 1024,
            header_timeout_s: header_timeout(),
            idle_timeout_s: idle_timeout(),
            duration_s: None,
            interval_s: 1.0,
        }
    }
}

/// A server's counters (cumulative, or over one interval).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct HttpServeCounts {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections closed.
    pub closed: u64,
    /// Accepted connections whose packets were processed on another CPU (SO_INCOMING_CPU).
    pub missteered: u64,
    /// Requests read.
    pub requests: u64,
    /// 2xx answers.
    pub status_2xx: u64,
    /// 4xx answers (bad request, not found, too large, head too large).
    pub status_4xx: u64,
    /// 5xx answers (not implemented).
    pub status_5xx: u64,
    /// Bytes read.
    pub rx_bytes: u64,
    /// Request body bytes read.
    pub body_rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Of those, body bytes sent by `sendfile` (no user-space copy).
    pub sendfile_bytes: u64,
    /// Heads that could not be parsed.
    pub parse_errors: u64,
    /// Connections reset or failed while reading or writing.
    pub io_errors: u64,
    /// Accepts refused for want of descriptors or memory.
    pub accept_errors: u64,
    /// Connections whose request head was not whole within the header timeout (408).
    #[serde(default)]
    pub header_timeouts: u64,
    /// Connections closed after the idle timeout.
    #[serde(default)]
    pub idle_closed: u64,
    /// Idle connections closed to make room in a full file table.
    #[serde(default)]
    pub evicted: u64,
    /// CPU time the workers' threads used in their loops, nanoseconds.
    pub cpu_ns: u64,
}

impl HttpServeCounts {
    /// Worker CPU nanoseconds per request read.
    pub fn cpu_ns_per_request(&self) -> Option<f64> {
        crate::ns_per(self.cpu_ns, self.requests)
    }
}

impl From<&WorkerSnapshot<HttpServeSnapshot>> for HttpServeCounts {
    fn from(w: &WorkerSnapshot<HttpServeSnapshot>) -> Self {
        let s = &w.role;
        HttpServeCounts {
            cpu_ns: w.looped.cpu_ns,
            accepted: s.accepted,
            closed: s.closed,
            missteered: s.missteered,
            requests: s.requests,
            status_2xx: s.status_2xx,
            status_4xx: s.status_4xx,
            status_5xx: s.status_5xx,
            rx_bytes: s.rx_bytes,
            body_rx_bytes: s.body_rx_bytes,
            tx_bytes: s.tx_bytes,
            sendfile_bytes: s.sendfile_bytes,
            parse_errors: s.parse_errors,
            io_errors: s.io_errors,
            accept_errors: s.accept_errors,
            header_timeouts: s.header_timeouts,
            idle_closed: s.idle_closed,
            evicted: s.evicted,
        }
    }
}

/// One worker's share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HttpServeWorker {
    /// Its CPU.
    pub cpu: usize,
    /// Its place among the CPU's workers (0 unless `workers_per_cpu` > 1).
    #[serde(default)]
    pub slot: usize,
    /// Its counters.
    pub counts: HttpServeCounts,
}

/// What a server did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HttpServeReport {
    /// Address served.
    pub bind: String,
    /// `cpu-bpf` or `reuseport-hash`.
    pub steering: String,
    /// Why the kernel's hash steers, when it does.
    pub steering_reason: Option<String>,
    /// Seconds served.
    pub duration_s: f64,
    /// Per worker.
    pub workers: Vec<HttpServeWorker>,
    /// All workers.
    pub total: HttpServeCounts,
    /// Requests per second over the run.
    pub requests_per_s: f64,
    /// Worker CPU nanoseconds per request (all workers).
    pub cpu_ns_per_request: Option<f64>,
    /// Bodies up to this size were copied from a buffer; larger ones sent by `sendfile`.
    pub copy_max: usize,
    /// The largest body answered.
    pub max_size: u64,
    /// The open-file limit in force (soft; raised to the hard one at start): each worker has
    /// a file table of its own and may hold this many files.
    pub nofile: u64,
    /// Workers on each CPU.
    #[serde(default = "one")]
    pub workers_per_cpu: usize,
    /// Why the workers share the process's file table after all (the system refused tables
    /// of their own: a seccomp filter, as containers have); then `nofile` bounds them all.
    #[serde(default)]
    pub own_files_refused: Option<String>,
    /// What each packet cost in cycles, instructions and cache misses, or why not known.
    #[serde(default)]
    pub pmu: crate::PmuCost,
    /// Workers that stopped on an error.
    pub errors: Vec<WorkerError>,
    /// The host's conditions when it ran (`doctor`'s rules for its CPUs and interfaces),
    /// read by the caller before the run; none when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::doctor::DoctorReport>,
}

/// Known once every listener is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpServeStart {
    /// The address.
    pub bind: SocketAddr,
    /// Workers' CPUs.
    pub cpus: Vec<usize>,
    /// Steering in force, and why not when not.
    pub steering: String,
    /// Why not CPU steering.
    pub steering_reason: Option<String>,
    /// Open-file limit (of each worker's own file table).
    pub nofile: u64,
    /// Workers on each CPU.
    pub workers_per_cpu: usize,
    /// Why the workers share the process's file table (`None`: each has its own).
    pub own_files_refused: Option<String>,
}

/// One status interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct HttpServeTick {
    /// Since start.
    pub elapsed_s: f64,
    /// This interval.
    pub interval_s: f64,
    /// Over the interval.
    pub delta: HttpServeCounts,
    /// Connections open now.
    pub open: u64,
}

/// Status from a running server.
#[derive(Debug, Clone, PartialEq)]
pub enum HttpServeEvent {
    /// Listening: clients may connect.
    Started(HttpServeStart),
    /// One interval.
    Tick(HttpServeTick),
}

/// Serves until the duration is over or `stop` is set.
///
/// Long: the listeners, the bodies, the steering attached once every worker is bound, the
/// session and the report, in the order they happen.
pub fn run(
    cfg: &HttpServeConfig,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(HttpServeEvent),
) -> Result<HttpServeReport, ToolError> {
    let interval = crate::seconds("interval", cfg.interval_s)?;
    let duration = cfg
        .duration_s
        .map(|d| crate::seconds("duration", d))
        .transpose()?;
    if cfg.bind.port() == 0 {
        return Err(ToolError::usage(
            "bind: name a port (0 would give each worker its own)",
        ));
    }
    // The body file and its copy are made in memory at start: bound them.
    if cfg.max_size > MAX_BODY || cfg.copy_max as u64 > COPY_MAX {
        return Err(ToolError::usage(format!(
            "--max-size is at most {MAX_BODY} bytes and --copy-max at most {COPY_MAX} (asked {} and {})",
            cfg.max_size, cfg.copy_max
        )));
    }
    if cfg.max_size < cfg.copy_max as u64 {
        return Err(ToolError::usage(format!(
            "--max-size {} is below --copy-max {}: bodies up to --copy-max are written from a \
             buffer, so the largest body is at least that; give a --max-size of at least {} or a \
             smaller --copy-max",
            cfg.max_size, cfg.copy_max, cfg.copy_max
        )));
    }
    let header_timeout = crate::seconds("header timeout", cfg.header_timeout_s)?;
    let idle_timeout = match cfg.idle_timeout_s {
        0.0 => None,
        t => Some(crate::seconds("idle timeout", t)?),
    };
    if cfg.cpus.is_empty() {
        return Err(ToolError::usage("no CPUs to run workers on"));
    }
    let per_cpu = cfg.workers_per_cpu;
    if !(1..=MAX_WORKERS_PER_CPU).contains(&per_cpu) {
        return Err(ToolError::usage(format!(
            "workers per CPU: give 1 up to {MAX_WORKERS_PER_CPU}, not {per_cpu}"
        )));
    }
    let nofile = flowlane_io::os::raise_nofile_limit()
        .map(|(soft, _)| soft)
        .unwrap_or(0);
    let bodies = Arc::new(
        Bodies::new(cfg.copy_max, cfg.max_size)
            .map_err(|e| ToolError::runtime(format!("cannot make the body file: {e}")))?,
    );
    let lcfg = ListenConfig {
        addr: cfg.bind,
        backlog: cfg.backlog,
        v6only: false,
    };
    // Workers in rounds over the CPUs (worker i on cpus[i % m]), the order the steering
    // program expects.
    let m = cfg.cpus.len();
    let worker_cpus: Vec<usize> = (0..m * per_cpu).map(|i| cfg.cpus[i % m]).collect();
    let last = worker_cpus.len() - 1;
    // The last worker to bind attaches steering to the whole group: its listener lives in its
    // own file table, so it is the one thread that can name it.
    let steering_slot: Arc<std::sync::Mutex<Option<Steering>>> = Arc::default();
    let (slot2, cpus2, steer) = (steering_slot.clone(), cfg.cpus.clone(), cfg.steer);
    let scfg = ServerConfig {
        default_size: cfg.default_size,
        max_head: cfg.max_head,
        header_timeout,
        idle_timeout,
    };
    let rt_cfg = Config {
        cpus: worker_cpus.clone(),
        budget: 256,
        wait_ms: 100,
        busy_poll: std::time::Duration::ZERO,
        // Each worker's connections count against its own table, not one for the process.
        own_files: true,
    };
    // The workers' tables are copies of this one; the runtime drops `make`, and with it the
    // last reference to the body memfd, here after the join, so it is closed here too.
    let mut rt: Runtime<HttpServeStats> = Runtime::start(&rt_cfg, stop.clone(), move |idx, cpu| {
        let l = tcp::listen_one(&lcfg)?;
        if idx == last {
            let st = tcp::attach_spread_steering(&l, &cpus2, per_cpu, steer);
            if let Ok(mut g) = slot2.lock() {
                *g = Some(st);
            }
        }
        ServerWorker::new(l, cpu, bodies.clone(), scfg.clone()).map_err(GroupError::Sys)
    })
    .map_err(|e| crate::error::start_error(e, crate::error::group_open))?;
    let own_files_refused = rt.own_files_refused();
    let steering = steering_slot
        .lock()
        .ok()
        .and_then(|mut g| g.take())
        .unwrap_or_else(|| Steering::ReuseportHash {
            reason: "no socket to attach to".into(),
        });
    let steering_reason = match &steering {
        Steering::ReuseportHash { reason } => Some(reason.clone()),
        Steering::CpuBpf | Steering::HashBpf => None,
    };
    on_event(HttpServeEvent::Started(HttpServeStart {
        bind: cfg.bind,
        cpus: cfg.cpus.clone(),
        steering: steering.name().into(),
        steering_reason: steering_reason.clone(),
        nofile,
        workers_per_cpu: per_cpu,
        own_files_refused: own_files_refused.clone(),
    }));
    let rule = StopRule {
        external: stop.clone(),
        deadline: duration,
    };
    let _metrics = cfg
        .metrics
        .map(|a| crate::metrics::Exporter::start(a, "http_serve", &worker_cpus, rt.stats()))
        .transpose()?;
    let end = rt.session(Some(interval), &rule, &mut |t| {
        let total = t.total();
        on_event(HttpServeEvent::Tick(HttpServeTick {
            elapsed_s: t.elapsed.as_secs_f64(),
            interval_s: t.interval.as_secs_f64(),
            delta: HttpServeCounts::from(&t.delta()),
            open: total.role.accepted.saturating_sub(total.role.closed),
        }))
    });
    rt.join();
    let secs = end.elapsed.as_secs_f64();
    let total = HttpServeCounts::from(&end.total());
    Ok(HttpServeReport {
        host: None,
        bind: cfg.bind.to_string(),
        steering: steering.name().into(),
        steering_reason,
        duration_s: (secs * 1000.0).round() / 1000.0,
        workers: worker_cpus
            .iter()
            .zip(&end.finals)
            .enumerate()
            .map(|(i, (&cpu, s))| HttpServeWorker {
                cpu,
                slot: i / m,
                counts: HttpServeCounts::from(s),
            })
            .collect(),
        cpu_ns_per_request: total.cpu_ns_per_request(),
        pmu: crate::PmuCost::of(&end.total().looped, total.requests, rt.pmu_unavailable()),
        requests_per_s: if secs > 0.0 {
            total.requests as f64 / secs
        } else {
            0.0
        },
        total,
        copy_max: cfg.copy_max,
        max_size: cfg.max_size,
        nofile,
        workers_per_cpu: per_cpu,
        own_files_refused,
        errors: end
            .errors
            .into_iter()
            .map(|(worker, error)| WorkerError {
                worker,
                error: error.to_string(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These tests count the body memfds of the process's table: one at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The body memfds this thread's file table holds.
    fn body_files_here() -> usize {
        std::fs::read_dir("/proc/thread-self/fd")
            .map(|d| {
                d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .filter(|p| p.to_string_lossy().contains("flowlane-http-body"))
                    .count()
            })
            .unwrap_or(0)
    }

    #[test]
    fn a_run_leaves_no_file_open_in_the_callers_table() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        // Workers copy the caller's table: whatever they drop last must still be closed here.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let cfg = HttpServeConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], port)),
            cpus: vec![0, 0],
            duration_s: Some(0.2),
            interval_s: 0.1,
            ..HttpServeConfig::default()
        };
        let before = body_files_here();
        let stop = Arc::new(AtomicBool::new(false));
        let r = run(&cfg, &stop, &mut |_| {}).expect("serves");
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.own_files_refused, None);
        assert_eq!(body_files_here(), before, "the body memfd left open");
    }

    #[test]
    fn where_own_file_tables_are_refused_it_serves_from_the_shared_one_and_says_why() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::spawn(|| {
            flowlane_io::os::refuse_unshare_here().expect("seccomp filter");
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            let port = l.local_addr().expect("addr").port();
            drop(l);
            let cfg = HttpServeConfig {
                bind: SocketAddr::from(([127, 0, 0, 1], port)),
                cpus: vec![0],
                // A bound only: the client stops the server once it has its answer.
                duration_s: Some(30.0),
                interval_s: 0.2,
                ..HttpServeConfig::default()
            };
            let stop = Arc::new(AtomicBool::new(false));
            let stop2 = stop.clone();
            let client = std::thread::spawn(move || {
                use std::io::{Read, Write};
                let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
                loop {
                    if let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                        c.write_all(b"GET /bytes/5 HTTP/1.0\r\n\r\n").expect("send");
                        let mut got = Vec::new();
                        c.read_to_end(&mut got).expect("answer");
                        stop2.store(true, std::sync::atomic::Ordering::Relaxed);
                        return got;
                    }
                    if std::time::Instant::now() > until {
                        stop2.store(true, std::sync::atomic::Ordering::Relaxed);
                        panic!("never listening");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            });
            let r = run(&cfg, &stop, &mut |_| {}).expect("serves regardless");
            let got = client.join().expect("client");
            assert!(got.ends_with(&flowlane_wire::http::body(5)), "{got:?}");
            assert_eq!(r.total.requests, 1);
            let why = r.own_files_refused.expect("a reason");
            assert!(why.contains("unshare"), "{why}");
        })
        .join()
        .expect("test thread");
    }
}
