//! `flowlane http serve` and `flowlane http load`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::anyhow;
use clap::{Args, Subcommand};
use flowlane_tools::http::{
    self, load::HttpLoadTick, serve::HttpServeCounts, HttpLoadConfig, HttpLoadEvent,
    HttpLoadReport, HttpServeConfig, HttpServeEvent, LatencyUs, PoolConfig, UrlConfig,
};

use crate::args::{
    parse_bytes, parse_cpu_list, parse_duration, print_json, usable_cpus, CpuList, PlaceArgs,
};
use crate::live::{stop_on_signals, LiveArgs};
use crate::{CmdResult, Failure};

/// HTTP/1.1 per core: a server and a load generator.
#[derive(Debug, Subcommand)]
pub enum HttpCommand {
    Serve(ServeArgs),
    Load(Box<LoadArgs>),
}

/// Serve HTTP/1.1 with one pinned worker per CPU, each with its own listener.
///
/// Every worker's listener binds the same address with SO_REUSEPORT; a classic BPF program
/// hands each new connection to the worker on the CPU that processed its SYN, so a
/// connection's packets and its worker share a CPU (`missteered` counts the ones that did
/// not, from SO_INCOMING_CPU). Keep-alive and pipelining. What it answers:
///
///   GET /bytes/N        N bytes of a fixed pattern (also any path with size=N in the query)
///   GET /               --default-size bytes
///   POST /echo          the request's body
///   HEAD …              the head only
///
/// Bodies up to --copy-max are written from one prebuilt buffer; larger ones go by sendfile
/// from a memfd holding the pattern, so no byte of them is copied in user space
/// (`sendfile_bytes` counts them). Ctrl-C (or --duration) prints the final summary.
///
/// Each worker keeps its connections in a file table of its own, so the open-file limit
/// (raised to the hard one, said at start) bounds each worker, not the server: 2 CPUs hold
/// twice the limit. --workers-per-cpu N runs N workers on each CPU for N times that (a CPU's
/// workers share its connections by the flow hash): 100 000 connections under a limit of
/// 20 000 take --workers-per-cpu 3 on 2 CPUs.
///
/// Examples:
///   flowlane http serve --bind 198.18.0.2:8080
///   curl -s http://198.18.0.2:8080/bytes/1048576 | wc -c
///   flowlane http serve --bind [::]:8080 --cpus 0-1 --duration 30 --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ServeArgs {
    /// Address to serve on: IP:PORT or [V6]:PORT.
    #[arg(long, default_value = "0.0.0.0:8080")]
    bind: SocketAddr,

    /// CPUs to run workers on, e.g. `0,2-3`. Default: every online CPU.
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Use the kernel's reuseport hash instead of CPU steering (to compare).
    #[arg(long)]
    no_steer: bool,

    /// Workers on each CPU, to hold more connections than the open-file limit: each worker
    /// has a file table of its own, and a CPU's workers share its connections by flow hash.
    #[arg(long, default_value_t = 1, value_name = "N")]
    workers_per_cpu: usize,

    /// Accept queue per listener (the kernel caps it at net.core.somaxconn).
    #[arg(long, default_value_t = 4096)]
    backlog: i32,

    /// Bytes `/` answers.
    #[arg(long, default_value_t = 64)]
    default_size: u64,

    /// Bodies up to this many bytes are written from a buffer; larger ones go by sendfile.
    #[arg(long, default_value_t = 16384)]
    copy_max: usize,

    /// The largest body answered, and echoed by /echo (a memfd this large holds the pattern;
    /// larger asks get 413). At least --copy-max.
    #[arg(long, default_value_t = 16 << 20)]
    max_size: u64,

    /// Seconds a request head begun may take to arrive whole; then 408 and the connection
    /// closes (counted: a client trickling its head cannot hold a connection).
    #[arg(long, value_parser = parse_duration, default_value_t = 10.0)]
    header_timeout: f64,

    /// Seconds a connection may go without a byte in or out before it is closed (0: never;
    /// counted). When a worker's file table is full, its connections idle longest are closed
    /// to make room for new ones (counted as evicted).
    #[arg(long, value_parser = parse_secs0, default_value_t = 60.0)]
    idle_timeout: f64,

    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, short = 'd', value_parser = parse_duration)]
    duration: Option<f64>,

    #[command(flatten)]
    live: LiveArgs,
}

/// Load an HTTP/1.1 server from one pinned worker per CPU, each with its own event loop.
///
/// Each worker owns its connections; there is no accept or dispatch thread. Closed loop (the default, as wrk): each connection sends its next request when the last
/// answer came. Constant rate (-R, as wrk2): requests are scheduled at intended times spread
/// over the connections; one whose connection is still busy leaves when it is free, and its
/// latency counts from the intended time — a stalled server cannot hide behind the requests it
/// held back. Both latencies are reported (from the intended and from the actual send), with
/// the tool's own send lag; nothing is corrected after the fact.
///
/// The soft open-file limit is raised to the hard one (said at start). More connections than
/// one file table holds are spread over file tables of their own, one per worker (the limit
/// bounds each table, not the process), with as many workers per CPU as that takes: 100 000
/// connections under a limit of 20 000 run 3 workers on each of 2 CPUs. New connections are
/// paced (--connect-window per worker) so the server's accept queue does not overflow.
/// --source binds connections to the addresses of a prefix in turn (IP_BIND_ADDRESS_NO_PORT);
/// make the prefix local first: `ip route add local 198.18.128.0/17 dev lo`.
///
/// --per-queue K places K connections on each receive queue of the server's NIC, by its RSS
/// (read from --rss-dev IF, or modelled with --key/--reta/--queues as `pick` does): where the
/// NIC hashes TCP on the 4-tuple each connection binds source ports the picker chose for its
/// queue (32 of them, used in turn, so that a reconnect never waits for its own TIME_WAIT);
/// where it hashes the addresses only (--two-tuple, or the interface says so) each
/// connection gets a source address of --source of its own and the ports do not matter.
/// The report says which queues were filled and how.
///
/// A scenario file (--scenario, TOML) holds several pools, each with its target, addresses,
/// connections, weighted URLs with response sizes, rate or think time, body size and
/// keep-alive, and the phases (ramp_up_s, duration_s, ramp_down_s); see docs/http.md.
///
/// Exit status: 0, or 1 when errors exceed --max-errors, no request was answered at all (the
/// first error says why), or a worker failed.
///
/// Examples:
///   flowlane http load http://198.18.0.2:8080/bytes/64 -c 100 -d 10
///   flowlane http load http://198.18.0.2:8080/ -c 1000 -R 20000 -d 30 --csv rate.csv
///   flowlane http load --scenario mix.toml --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct LoadArgs {
    /// The URL (http:// only). Not with --scenario.
    #[arg(required_unless_present = "scenario")]
    url: Option<String>,

    /// Concurrent connections (default 10; with --per-queue K: K for each queue).
    #[arg(long, short = 'c')]
    connections: Option<usize>,

    /// RSS placement: this many connections on each receive queue of the server's NIC.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65536), conflicts_with = "scenario")]
    per_queue: Option<u64>,

    #[command(flatten)]
    place: PlaceArgs,

    /// Workers (threads), one per CPU, on the first usable CPUs. Default: every CPU. `-t` is
    /// wrk's spelling for threads here; elsewhere in flowlane `-t` is a duration.
    #[arg(long, short = 't', conflicts_with = "cpus")]
    threads: Option<usize>,

    /// CPUs to run workers on, e.g. `0,2-3`.
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Seconds of full load. `-d` as in wrk (the other commands take `--duration`/`-t`).
    #[arg(long, short = 'd', value_parser = parse_duration, default_value_t = 10.0)]
    duration: f64,

    /// Constant rate: requests per second over all connections (default: closed loop).
    #[arg(long, short = 'R')]
    rate: Option<f64>,

    /// Ask flowlane's server for this response size (adds size=N to the query).
    #[arg(long)]
    size: Option<u64>,

    /// Request body bytes (the method becomes POST unless --method says otherwise).
    #[arg(long, default_value_t = 0)]
    body_size: u64,

    /// Request method.
    #[arg(long)]
    method: Option<String>,

    /// Closed loop: milliseconds between an answer and the next request.
    #[arg(long, default_value_t = 0.0)]
    think_ms: f64,

    /// One request per connection (Connection: close) instead of keep-alive.
    #[arg(long)]
    no_keepalive: bool,

    /// Source addresses from this prefix, used in turn (must be local).
    #[arg(long)]
    source: Option<String>,

    /// How many addresses of --source to use (default: all, up to 65 536).
    #[arg(long)]
    source_count: Option<usize>,

    /// Seconds over which connections and rate grow to full (latency is measured after it).
    #[arg(long, value_parser = parse_secs0, default_value_t = 0.0)]
    ramp_up: f64,

    /// Seconds over which the rate falls to zero at the end.
    #[arg(long, value_parser = parse_secs0, default_value_t = 0.0)]
    ramp_down: f64,

    /// Seconds to wait for answers in flight at the end (they then count as unanswered).
    #[arg(long, value_parser = parse_secs0, default_value_t = 2.0)]
    drain: f64,

    /// Seconds after which a request without a complete answer is a timeout.
    #[arg(long, value_parser = parse_duration, default_value_t = 10.0)]
    timeout: f64,

    /// Connects in progress at once, per worker.
    #[arg(long, default_value_t = 128)]
    connect_window: usize,

    /// Busy polling: after a round with no work, keep polling this long before sleeping
    /// (e.g. 50us; default 0, sleep at once; with --scenario it replaces the file's). Spends
    /// client CPU (up to a whole core per worker) so the server never has to wake the client;
    /// on one host that can raise the server's requests/s at the cost of requests per client
    /// CPU second.
    #[arg(long, value_parser = parse_secs0)]
    busy_poll: Option<f64>,

    /// The most one read (or one drop of body bytes) takes while a worker has 64 or more
    /// answers outstanding, e.g. 4k (default: the whole 64 KiB buffer; 256 B up to 64 KiB).
    /// Large bodies are dropped in the kernel either way; smaller reads free receive space
    /// sooner, so on one host more of the server's sending runs in the client's system calls
    /// (more client CPU per answer). With fewer outstanding, reads stay whole: the server is
    /// then waiting for the next requests.
    #[arg(long, value_parser = parse_bytes)]
    read_size: Option<usize>,

    /// Batch waits: in a closed loop with 64 or more answers outstanding (and answers under
    /// 16 KiB), a worker about to sleep first waits up to this long, e.g. 500us (default 0,
    /// none; up to 10ms; with --scenario it replaces the file's). Each wait is steered so the
    /// wake after it finds 50-80 % of what was outstanding ready, so the worker wakes to a
    /// batch of answers: fewer client wake-ups, more answers per client CPU second.
    /// An answer read right after a wait has its latency end when the kernel received its
    /// last segment (its receive timestamp), not when the client got round to reading it.
    #[arg(long, value_parser = parse_secs0)]
    batch_wait: Option<f64>,

    /// Fail (exit 1) when errors (connect, reset, timeout, parse, 4xx and 5xx answers)
    /// exceed this: a count (`100`) or a share of the requests sent (`0.5%`). Default: 1% —
    /// a run whose answers are all errors never passes.
    #[arg(long, value_parser = parse_error_budget)]
    max_errors: Option<ErrorBudget>,

    /// The most memory the latency histograms may take, MiB (with --scenario it replaces the
    /// file's). Each pool keeps two on every worker holding its connections (three at a
    /// constant rate), grown as latencies come up to the run's longest; the bound is checked
    /// before the run and printed at its start. Default: half of the memory available.
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    max_memory: Option<u64>,

    /// A scenario file (TOML) with pools and phases; plain flags then only set workers.
    #[arg(long)]
    scenario: Option<std::path::PathBuf>,

    /// Write one CSV row per status interval to this file.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,

    /// Write the whole latency distribution (from the intended send time, all pools) to this
    /// file in HdrHistogram's percentile-distribution text (.hgrm), in microseconds; a name ending in .hlog gets
    /// HdrHistogram's log instead (the compressed interchange form, nanoseconds, lossless).
    #[arg(long)]
    histogram: Option<std::path::PathBuf>,

    #[command(flatten)]
    shard: crate::shard::ShardArgs,

    #[command(flatten)]
    live: LiveArgs,
}

/// Seconds as whole nanoseconds' worth of microseconds (`200us` is 200, not 199.99…).
fn micros(secs: f64) -> f64 {
    (secs * 1e9).round() / 1e3
}

fn parse_secs0(s: &str) -> Result<f64, String> {
    if s.trim() == "0" {
        return Ok(0.0);
    }
    parse_duration(s)
}

pub fn run(c: HttpCommand) -> CmdResult {
    match c {
        HttpCommand::Serve(a) => serve(a),
        HttpCommand::Load(a) => load(*a),
    }
}

fn serve(a: ServeArgs) -> CmdResult {
    let cfg = HttpServeConfig {
        metrics: a.live.metrics,
        bind: a.bind,
        cpus: usable_cpus(a.cpus.as_ref())?,
        steer: !a.no_steer,
        workers_per_cpu: a.workers_per_cpu,
        backlog: a.backlog,
        default_size: a.default_size,
        copy_max: a.copy_max,
        max_size: a.max_size,
        header_timeout_s: a.header_timeout,
        idle_timeout_s: a.idle_timeout,
        duration_s: a.duration,
        interval_s: a.live.interval,
        ..HttpServeConfig::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let (mut log, stream) = (a.live.log(), a.live.stream());
    let quiet = a.live.quiet;
    let host = crate::host::before_run(&cfg.cpus, &[]);
    let mut report = http::serve::run(&cfg, &stop, &mut |e| match e {
        HttpServeEvent::Started(s) => {
            log.line(&format!(
                "flowlane http serve: http://{} on {} worker(s) (CPUs {:?}{}), steering {}{}, open-file limit {} {}",
                s.bind,
                s.cpus.len() * s.workers_per_cpu,
                s.cpus,
                if s.workers_per_cpu > 1 {
                    format!(", {} each", s.workers_per_cpu)
                } else {
                    String::new()
                },
                s.steering,
                s.steering_reason.map_or(String::new(), |r| format!(" ({r})")),
                s.nofile,
                s.own_files_refused.map_or("per worker".into(), |r| format!(
                    "for all workers (file tables of their own refused: {r})"
                ))
            ));
            crate::host::say(&mut log, &host);
            if !quiet {
                log.line(&serve_header());
            }
        }
        HttpServeEvent::Tick(t) => {
            stream.interval(&t);
            if !quiet {
                log.line(&serve_row(&format!("{:.1}s", t.elapsed_s), t.open, &t.delta, t.interval_s));
            }
        }
    })
    .map_err(Failure::from_tool)?;
    report.host = Some(host);
    if a.live.json {
        print_json(&report)?;
    } else if stream.on() {
        stream.last(&report)?;
    } else {
        outln!(
            "\nsummary over {:.3} s (steering {}):",
            report.duration_s,
            report.steering
        );
        outln!("{}", serve_header());
        let open = report.total.accepted.saturating_sub(report.total.closed);
        outln!(
            "{}",
            serve_row("all", open, &report.total, report.duration_s)
        );
        let t = &report.total;
        outln!(
            "  closed by the server: {} heads overdue (408, --header-timeout {} s), {} idle \
             (--idle-timeout {}), {} evicted for room (file table full)",
            t.header_timeouts,
            cfg.header_timeout_s,
            t.idle_closed,
            if cfg.idle_timeout_s > 0.0 {
                format!("{} s", cfg.idle_timeout_s)
            } else {
                "off".into()
            },
            t.evicted
        );
        outln!("  {}", crate::live::pmu_line("request", &report.pmu));
        for w in &report.workers {
            outln!(
                "  cpu {}{}: {} connections ({} missteered), {} requests, {} ns of worker CPU each",
                w.cpu,
                if report.workers_per_cpu > 1 {
                    format!(" worker {}", w.slot)
                } else {
                    String::new()
                },
                w.counts.accepted,
                w.counts.missteered,
                w.counts.requests,
                w.counts
                    .cpu_ns_per_request()
                    .map_or("-".into(), |n| format!("{n:.0}"))
            );
        }
    }
    Ok(crate::live::workers_exit(&report.errors))
}

fn serve_header() -> String {
    format!(
        "{:>7} {:>8} {:>9} {:>11} {:>10} {:>10} {:>8} {:>8} {:>9}",
        "time", "open", "accepted", "requests", "req/s", "tx MB/s", "4xx/5xx", "errors", "missteer"
    )
}

fn serve_row(at: &str, open: u64, c: &HttpServeCounts, secs: f64) -> String {
    let secs = secs.max(1e-9);
    format!(
        "{:>7} {:>8} {:>9} {:>11} {:>10.0} {:>10.1} {:>8} {:>8} {:>9}",
        at,
        open,
        c.accepted,
        c.requests,
        c.requests as f64 / secs,
        c.tx_bytes as f64 / secs / 1e6,
        c.status_4xx + c.status_5xx,
        c.parse_errors + c.io_errors + c.accept_errors,
        c.missteered
    )
}

fn load_config(a: &LoadArgs) -> Result<HttpLoadConfig, Failure> {
    let cpus = match a.threads {
        Some(0) => return Err(Failure::usage(anyhow!("--threads must be at least 1"))),
        Some(n) => {
            let all = usable_cpus(None)?;
            if n > all.len() {
                return Err(Failure::usage(anyhow!(
                    "--threads {n}: only {} CPUs are usable here (one worker per CPU)",
                    all.len()
                )));
            }
            all[..n].to_vec()
        }
        None => usable_cpus(a.cpus.as_ref())?,
    };
    let mut cfg = if let Some(path) = &a.scenario {
        if a.url.is_some() {
            return Err(Failure::usage(anyhow!(
                "give a URL or --scenario, not both"
            )));
        }
        let text = flowlane_tools::input::read_text(
            "--scenario",
            path,
            flowlane_tools::input::SCENARIO,
            None,
        )
        .map_err(Failure::from_tool)?;
        HttpLoadConfig::from_toml(&text).map_err(Failure::from_tool)?
    } else {
        let url = a.url.as_deref().unwrap_or_default();
        let (target, path) = http::split_url(url).map_err(Failure::from_tool)?;
        let flow = if target.starts_with('[') {
            "tcp6"
        } else {
            "tcp4"
        };
        let placement = a.place.placement(a.per_queue, flow)?;
        let connections = match (&placement, a.connections) {
            (_, Some(c)) => c,
            (Some(p), None) => {
                let queues = if p.queues.is_empty() {
                    p.model.build().map_err(Failure::from_tool)?.queues() as usize
                } else {
                    p.queues.len()
                };
                p.per_queue as usize * queues
            }
            (None, None) => 10,
        };
        HttpLoadConfig {
            metrics: a.live.metrics,
            pools: vec![PoolConfig {
                name: "default".into(),
                target,
                urls: vec![UrlConfig {
                    path,
                    weight: 1,
                    size: a.size,
                }],
                connections,
                rate: a.rate,
                think_ms: a.think_ms,
                body_size: a.body_size,
                method: a.method.clone(),
                keep_alive: !a.no_keepalive,
                source: a.source.clone(),
                source_count: a.source_count,
                placement,
            }],
            cpus: Vec::new(),
            ramp_up_s: a.ramp_up,
            duration_s: a.duration,
            ramp_down_s: a.ramp_down,
            drain_s: a.drain,
            timeout_s: a.timeout,
            connect_window: a.connect_window,
            interval_s: a.live.interval,
            busy_poll_us: a.busy_poll.map_or(0.0, micros),
            read_size: a.read_size.unwrap_or(0),
            batch_wait_us: a.batch_wait.map_or(0.0, micros),
            max_errors: None,
            max_error_share: None,
            max_memory: None,
            sharding: Default::default(),
        }
    };
    cfg.sharding = a.shard.sharding()?;
    if let Some(m) = a.max_memory {
        cfg.max_memory = Some(m << 20);
    }
    if cfg.cpus.is_empty() {
        cfg.cpus = cpus;
    }
    // A scenario's own limit stands; the command line's applies where it sets none.
    if cfg.max_errors.is_none() && cfg.max_error_share.is_none() {
        match a.max_errors {
            Some(ErrorBudget::Count(n)) => cfg.max_errors = Some(n),
            Some(ErrorBudget::Share(s)) => cfg.max_error_share = Some(s),
            None => {}
        }
    }
    if a.scenario.is_some() {
        if let Some(b) = a.busy_poll {
            cfg.busy_poll_us = micros(b);
        }
        if let Some(n) = a.read_size {
            cfg.read_size = n;
        }
        if let Some(b) = a.batch_wait {
            cfg.batch_wait_us = micros(b);
        }
        cfg.metrics = a.live.metrics.or(cfg.metrics);
    }
    Ok(cfg)
}

/// `--max-errors`: a count, or a share of the requests sent.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ErrorBudget {
    Count(u64),
    Share(f64),
}

fn parse_error_budget(s: &str) -> Result<ErrorBudget, String> {
    match s.strip_suffix('%') {
        Some(p) => match p.trim().parse::<f64>() {
            Ok(v) if (0.0..=100.0).contains(&v) => Ok(ErrorBudget::Share(v / 100.0)),
            _ => Err(format!("`{s}`: a share is a percentage from 0% to 100%")),
        },
        None => s
            .parse()
            .map(ErrorBudget::Count)
            .map_err(|_| format!("`{s}`: give a count of errors (100) or a share (0.5%)")),
    }
}

const CSV_HEAD: &str = "elapsed_s,interval_s,open,requests,responses,responses_per_s,body_bytes_per_s,status_2xx,errors,rss_kib";

fn csv_row(t: &HttpLoadTick) -> String {
    let s = t.interval_s.max(1e-9);
    format!(
        "{:.3},{:.3},{},{},{},{:.1},{:.0},{},{},{}",
        t.elapsed_s,
        t.interval_s,
        t.open,
        t.delta.requests,
        t.delta.responses,
        t.delta.responses as f64 / s,
        t.delta.body_bytes as f64 / s,
        t.delta.status_2xx,
        t.delta.errors(),
        t.rss_kib
    )
}

fn load(a: LoadArgs) -> CmdResult {
    let cfg = load_config(&a)?;
    if let Some(p) = &a.histogram {
        crate::side::check("--histogram", p)?;
    }
    let mut csv = match &a.csv {
        Some(p) => {
            crate::side::check("--csv", p)?;
            let mut f = std::fs::File::create(p)
                .map_err(|e| Failure::usage(anyhow!("cannot write {}: {e}", p.display())))?;
            writeln!(f, "{CSV_HEAD}")
                .map_err(|e| Failure::runtime(anyhow!("{}: {e}", p.display())))?;
            Some(f)
        }
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let (mut log, stream) = (a.live.log(), a.live.stream());
    let quiet = a.live.quiet;
    let mut csv_err = None;
    let host = crate::host::before_run(&cfg.cpus, &[]);
    let mut report = http::load::run(&cfg, &stop, &mut |e| match e {
        HttpLoadEvent::Started(s) => {
            log.line(&format!(
                "flowlane http load: {} connection(s) in {} pool(s) on {} worker(s) (CPUs {:?}); open-file limit {} (hard {}){}",
                s.connections,
                cfg.pools.len(),
                s.workers,
                s.cpus,
                s.nofile,
                s.nofile_hard,
                own_tables(s.workers, s.cpus.len(), s.files_per_worker)
            ));
            crate::host::say(&mut log, &host);
            log.line(&format!(
                "latency histograms: at most {:.1} MiB (allowed {:.1} MiB)",
                s.histograms_max_bytes as f64 / f64::from(1 << 20),
                s.budget_bytes as f64 / f64::from(1 << 20)
            ));
            if !quiet {
                log.line(&format!(
                    "{:>7} {:>8} {:>10} {:>10} {:>10} {:>8} {:>9}",
                    "time", "open", "answers", "req/s", "MB/s", "errors", "rss MiB"
                ));
            }
        }
        HttpLoadEvent::Tick(t) => {
            stream.interval(&t);
            if let Some(f) = csv.as_mut() {
                if let Err(e) = writeln!(f, "{}", csv_row(&t)) {
                    csv_err.get_or_insert(e);
                }
            }
            if !quiet {
                let s = t.interval_s.max(1e-9);
                log.line(&format!(
                    "{:>7} {:>8} {:>10} {:>10.0} {:>10.2} {:>8} {:>9.1}",
                    format!("{:.1}s", t.elapsed_s),
                    t.open,
                    t.delta.responses,
                    t.delta.responses as f64 / s,
                    t.delta.body_bytes as f64 / s / 1e6,
                    t.delta.errors(),
                    t.rss_kib as f64 / 1024.0
                ));
            }
        }
    })
    .map_err(Failure::from_tool)?;
    report.host = Some(host);
    if a.live.json {
        print_json(&report)?;
    } else if stream.on() {
        stream.last(&report)?;
    } else {
        out!("{}", summary(&report));
    }
    // After the report: a side file that fails must not cost it.
    if let Some(e) = csv_err {
        return Err(Failure::runtime(anyhow!(
            "writing the CSV file: {e} (the report above is complete)"
        )));
    }
    crate::live::write_histogram(a.histogram.as_deref(), report.histogram.as_ref())?;
    for e in &report.worker_errors {
        errln!("flowlane: worker {} stopped: {}", e.worker, e.error);
    }
    if !report.passed {
        for f in &report.failures {
            errln!("flowlane: FAIL: {f}");
        }
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn lat_line(label: &str, l: &LatencyUs) -> String {
    format!(
        "  {label:<18} p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  p99.999 {:.1}  max {:.1} µs\n",
        l.p50, l.p90, l.p99, l.p999, l.p9999, l.p99999, l.max
    )
}

/// Long: the summary's sections (rates, latency per pool and class, errors, memory, CPU)
/// written in the order they print.
fn summary(r: &HttpLoadReport) -> String {
    let t = &r.total;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nsummary: {} answers in {:.3} s; {:.0} requests/s, {:.2} MB/s of bodies over the {:.1} s of full load",
        t.responses,
        r.duration_s,
        r.requests_per_s,
        r.body_bytes_per_s / 1e6,
        r.steady_s
    );
    let _ = writeln!(
        s,
        "  status: 2xx {}  3xx {}  4xx {}  5xx {}  (1xx {})",
        t.status_2xx, t.status_3xx, t.status_4xx, t.status_5xx, t.status_1xx
    );
    let _ = writeln!(
        s,
        "  errors: {} — refused {}, connect {}, reset {}, closed early {}, timeout {}, parse {}, 4xx/5xx {}; unanswered {}",
        r.errors,
        t.refused,
        t.connect_errors,
        t.resets,
        t.closed_early,
        t.timeouts,
        t.parse_errors,
        t.status_4xx + t.status_5xx,
        r.unanswered
    );
    if let Some(e) = &r.first_error {
        let _ = writeln!(s, "  first error: {e}");
    }
    for p in &r.pools {
        let _ = writeln!(
            s,
            "  pool {} ({}, {} connections{}): {:.0} requests/s, {:.2} MB/s of bodies ({} answers)",
            p.name,
            p.mode,
            p.connections,
            p.rate
                .map_or(String::new(), |x| format!(", {x} requests/s asked")),
            p.requests_per_s,
            p.body_bytes_per_s / 1e6,
            p.answers
        );
        if let Some(pl) = &p.placement {
            let _ = writeln!(
                s,
                "    placed: {} connections on each of queues {:?} by the {} ({}; {} source \
                 address(es))",
                pl.per_queue,
                pl.queues,
                pl.by,
                if pl.by == "4-tuple" {
                    format!(
                        "source ports chosen, at least {} per connection",
                        pl.least_candidates
                    )
                } else {
                    "source addresses chosen, ports the kernel's".to_string()
                },
                pl.addresses
            );
        }
        if let Some(l) = &p.latency {
            let label = if p.rate.is_some() {
                "from intended"
            } else {
                "latency"
            };
            s.push_str(&lat_line(label, l));
        }
        if p.rate.is_some() {
            if let Some(l) = &p.latency_actual {
                s.push_str(&lat_line("from actual send", l));
            }
            if let Some(l) = &p.send_lag {
                s.push_str(&lat_line("send lag", l));
            }
        }
        for (class, l) in p.by_class.iter().filter(|(c, _)| c != "2xx") {
            s.push_str(&lat_line(class, l));
        }
    }
    let _ = writeln!(s, "  {}", crate::live::pmu_line("answer", &r.pmu));
    let m = &r.memory;
    let _ = writeln!(
        s,
        "  memory: {:.1} MiB at start, {:.1} MiB with {} connections open ({} B each, user space); steady phase {:.1} → {:.1} MiB",
        m.rss_start_kib as f64 / 1024.0,
        m.rss_connected_kib as f64 / 1024.0,
        m.connections_then,
        m.per_connection_bytes,
        m.rss_steady_first_kib as f64 / 1024.0,
        m.rss_steady_last_kib as f64 / 1024.0
    );
    let _ = writeln!(
        s,
        "  CPU: {:.2} s used, {:.0} answers per CPU second ({} ns of worker-loop CPU per answer); open-file limit {}{}",
        r.cpu_s,
        r.responses_per_cpu_s,
        r.worker_cpu_ns_per_response.map_or("-".into(), |n| format!("{n:.0}")),
        r.nofile,
        own_tables(r.workers, r.cpus.len(), r.files_per_worker)
    );
    if let (Some(b), Some(per)) = (r.cpus_busy_s, r.responses_per_busy_cpu_s) {
        let _ = writeln!(
            s,
            "  its CPUs busy: {b:.2} s, {per:.0} answers per busy CPU second (all that ran there, with interrupts and softirqs: the receive work for its packets done while it slept counts here, not above)"
        );
    }
    if r.total.responses > 0 {
        let _ = writeln!(
            s,
            "  reads: {:.1} per answer ({:.0} B each on average)",
            r.total.reads as f64 / r.total.responses as f64,
            r.total.rx_bytes as f64 / r.total.reads.max(1) as f64
        );
    }
    if r.batch_wait_us > 0.0 {
        let _ = writeln!(
            s,
            "  batch waits up to {:.0} µs: {} made, {:.1} µs on average; {} of {} answers read right after one, their latency ending at the kernel's receipt of their last segment (the rest: when read)",
            r.batch_wait_us,
            r.total.batch_waits,
            r.total.batch_wait_ns as f64 / r.total.batch_waits.max(1) as f64 / 1e3,
            r.total.stamped,
            r.total.responses
        );
    }
    if r.busy_poll_us > 0.0 {
        let _ = writeln!(
            s,
            "  busy polling {:.0} µs: {} rounds polled again instead of sleeping, {} sleeps",
            r.busy_poll_us, r.loop_spins, r.loop_sleeps
        );
    }
    s
}

/// What the start line and the summary add when the workers have file tables of their own.
fn own_tables(workers: usize, cpus: usize, files: Option<u64>) -> String {
    match files {
        None => String::new(),
        Some(f) => format!(
            "; {} worker(s) per CPU, each with a file table of its own ({f} files)",
            workers.div_ceil(cpus.max(1))
        ),
    }
}
