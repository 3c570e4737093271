//! `serve`: the RSS-aware UDP echo/sink server. One pinned worker per CPU, each with its own
//! socket of a SO_REUSEPORT group; a generated program hands each datagram to the worker on the
//! CPU that processed it; an eBPF filter counts the datagrams that reached a worker from
//! another CPU. [`run`] starts the workers, reports status each interval as a [`ServeEvent`],
//! and returns the [`ServeReport`] when the duration is over or `stop` is set.

mod config;
mod report;
pub mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use flowlane_io::udp::{self, GroupConfig, Steering};
use flowlane_runtime::{Config, Runtime, StopRule};
use worker::{Mode, ServeStats, ServeWorker, SourceCounts};

pub use config::{HashSteer, ServeConfig, ServeMode};
pub use report::{ServeCounts, ServeReport, ServeWorkerReport, SourceCount, WorkerError};

use crate::ToolError;

/// What is known once every worker is bound and polling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeStart {
    /// One worker per CPU, in this order.
    pub cpus: Vec<usize>,
    /// `cpu-bpf` or `reuseport-hash`.
    pub steering: String,
    /// Why the kernel's hash steers, when it does.
    pub steering_reason: Option<String>,
    /// Receive buffer granted, bytes.
    pub rcvbuf: usize,
    /// Send buffer granted, bytes.
    pub sndbuf: usize,
    /// Whether the socket drop counter (SO_MEMINFO) can be read.
    pub drop_counter: bool,
    /// Why the mis-steering detector is off, if it is.
    pub detector_off: Option<String>,
    /// Features turned off at start, and why.
    pub notices: Vec<String>,
}

/// Counters over one status interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ServeTick {
    /// Seconds since the workers started.
    pub elapsed_s: f64,
    /// Seconds this interval lasted.
    pub interval_s: f64,
    /// (CPU, counters over the interval) per worker.
    pub workers: Vec<(usize, ServeCounts)>,
    /// All workers over the interval.
    pub total: ServeCounts,
}

/// Status from a running server.
#[derive(Debug, Clone, PartialEq)]
pub enum ServeEvent {
    /// Every worker is bound and polling: clients may send.
    Started(ServeStart),
    /// One interval's counters.
    Tick(ServeTick),
}

/// Runs the server until `cfg.duration_s` is over or `stop` is set (e.g. by Ctrl-C);
/// `on_event` hears the start and each interval. Errors: a CPU that cannot be used, a busy
/// port or an address that is not here (usage), a missing privilege, anything else (runtime).
/// A worker that fails while running ends up in the report's `errors`.
pub fn run(
    cfg: &ServeConfig,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ServeEvent),
) -> Result<ServeReport, ToolError> {
    let interval = crate::seconds("interval", cfg.interval_s)?;
    let duration = cfg
        .duration_s
        .map(|d| crate::seconds("duration", d))
        .transpose()?;
    if cfg.bind.port() == 0 {
        return Err(ToolError::usage(format!(
            "bind {}: port 0 would give each worker its own random port; name one port",
            cfg.bind
        )));
    }
    // A shard serves its part of --cpus (the receive queues those CPUs process); its sockets
    // join the one SO_REUSEPORT group after the earlier shards' (so the group's order is the
    // whole list's) and the steering program covers the whole list.
    cfg.sharding.check()?;
    let whole = cfg.cpus.clone();
    let part = cfg.sharding.shard.part(whole.len());
    let local = ServeConfig {
        cpus: cfg.sharding.shard.take(&whole, "CPUs (--cpus)")?.to_vec(),
        ..cfg.clone()
    };
    let cfg = &local;
    let shard = cfg.sharding.start(stop)?.filter(|_| cfg.sharding.asked());
    if part.start > 0 {
        wait_for_earlier_shards(cfg.bind, part.start, stop)?;
    }
    let started = Startup::start(cfg, &whole, stop)?;
    let Startup {
        mut rt,
        steering,
        rcvbuf,
        sndbuf,
        drop_counter,
        detector_off,
        notices,
    } = started;
    let detected = detector_off.is_none();
    let (steering_name, steering_reason) = match &steering {
        Steering::ReuseportHash { reason } => (steering.name().to_string(), Some(reason.clone())),
        Steering::CpuBpf | Steering::HashBpf => (steering.name().to_string(), None),
    };
    on_event(ServeEvent::Started(ServeStart {
        cpus: cfg.cpus.clone(),
        steering: steering_name.clone(),
        steering_reason: steering_reason.clone(),
        rcvbuf,
        sndbuf,
        drop_counter,
        detector_off: detector_off.clone(),
        notices: notices.clone(),
    }));
    let rule = StopRule {
        external: stop.clone(),
        deadline: duration,
    };
    let _metrics = cfg
        .metrics
        .map(|a| crate::metrics::Exporter::start(a, "serve", &cfg.cpus, rt.stats()))
        .transpose()?;
    let end = rt.session(Some(interval), &rule, &mut |t| {
        on_event(ServeEvent::Tick(ServeTick {
            elapsed_s: t.elapsed.as_secs_f64(),
            interval_s: t.interval.as_secs_f64(),
            workers: cfg
                .cpus
                .iter()
                .zip(t.deltas)
                .map(|(&cpu, d)| (cpu, ServeCounts::from_snapshot(d, detected)))
                .collect(),
            total: ServeCounts::from_snapshot(&t.delta(), detected),
        }))
    });
    let elapsed = end.elapsed.as_secs_f64();
    let (finals, total) = (&end.finals, end.total());
    let workers = cfg
        .cpus
        .iter()
        .zip(finals)
        .zip(end.reports.iter())
        .map(|((&cpu, s), sc)| ServeWorkerReport {
            cpu,
            counts: ServeCounts::from_snapshot(s, detected),
            // Each worker's counts by source come back through the join.
            sources: sc.clone().map(|counts| {
                let mut v: Vec<_> = counts.into_iter().collect();
                v.sort();
                v.into_iter()
                    .map(|(a, n)| SourceCount {
                        src: a.to_string(),
                        packets: n,
                    })
                    .collect()
            }),
        })
        .collect();
    Ok(ServeReport {
        shard,
        host: None,
        pmu: crate::PmuCost::of(&total.looped, total.role.rx_packets, rt.pmu_unavailable()),
        workers,
        total: ServeCounts::from_snapshot(&total, detected),
        duration_s: (elapsed * 1000.0).round() / 1000.0,
        steering: steering_name,
        steering_reason,
        missteer_detector: detector_off.unwrap_or_else(|| "ebpf".into()),
        mode: cfg.mode,
        bind: cfg.bind.to_string(),
        gro: cfg.gro && !notices.iter().any(|n| n.starts_with("GRO off")),
        gso: cfg.gso && !notices.iter().any(|n| n.starts_with("GSO off")),
        busy_poll_us: cfg.busy_poll_us,
        notices,
        rcvbuf,
        sndbuf,
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

/// The most a shard waits for the earlier shards to bind the port.
const SHARD_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits until `before` sockets are bound to `bind` in this namespace (the earlier shards'),
/// so this shard's sockets take the places after theirs in the group; more than that, or
/// not that many within [`SHARD_WAIT`], is an error.
fn wait_for_earlier_shards(
    bind: std::net::SocketAddr,
    before: usize,
    stop: &AtomicBool,
) -> Result<(), ToolError> {
    let until = std::time::Instant::now() + SHARD_WAIT;
    loop {
        let n = bound_sockets(bind);
        if n == before {
            return Ok(());
        }
        if n > before {
            return Err(ToolError::usage(format!(
                "{n} sockets are bound to {bind} here, more than the {before} of the shards \
                 before this one: another server holds the port, or a shard ran twice"
            )));
        }
        if stop.load(Ordering::Relaxed) || std::time::Instant::now() > until {
            return Err(ToolError::runtime(format!(
                "the shards before this one have bound {n} of their {before} sockets to {bind} \
                 after {} s: start every shard of a host, in any order, within a minute",
                SHARD_WAIT.as_secs()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// UDP sockets bound to `bind` in this thread's namespace (/proc/net/udp or udp6).
fn bound_sockets(bind: std::net::SocketAddr) -> usize {
    let file = if bind.is_ipv6() { "udp6" } else { "udp" };
    let text = std::fs::read_to_string(format!("/proc/thread-self/net/{file}")).unwrap_or_default();
    let want = proc_net_addr(bind);
    text.lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(1) == Some(want.as_str()))
        .count()
}

/// An address as /proc/net/udp{,6} writes it: the address's bytes as native-endian 32-bit
/// words in hex, a colon, the port in hex.
fn proc_net_addr(a: std::net::SocketAddr) -> String {
    let words: Vec<u8> = match a.ip() {
        std::net::IpAddr::V4(v) => v.octets().to_vec(),
        std::net::IpAddr::V6(v) => v.octets().to_vec(),
    };
    let hex: String = words
        .chunks(4)
        .map(|w| format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
        .collect();
    format!("{hex}:{:04X}", a.port())
}

/// The workers, bound and waiting for `go`, with what start-up learned.
struct Startup {
    rt: Runtime<ServeStats, SourceCounts>,
    steering: Steering,
    rcvbuf: usize,
    sndbuf: usize,
    drop_counter: bool,
    detector_off: Option<String>,
    notices: Vec<String>,
}

impl Startup {
    /// Long: each worker's socket options (GRO, GSO, busy polling, the detector, counts by
    /// source) decided in its `make`, then steering attached once all are bound, in that order.
    fn start(
        cfg: &ServeConfig,
        whole: &[usize],
        stop: &Arc<AtomicBool>,
    ) -> Result<Startup, ToolError> {
        let gcfg = GroupConfig {
            addr: cfg.bind,
            cpus: cfg.cpus.clone(),
            rcvbuf: Some(cfg.rcvbuf),
            sndbuf: Some(cfg.sndbuf),
            v6only: cfg.v6only,
            steer: cfg.steer,
        };
        // Worker 0 hands a clone of its socket back so steering can be attached once all are
        // bound.
        let first = udp::GroupMember::default();
        let drop_counter = Arc::new(AtomicBool::new(true));
        // Why the detector is off, if it is (first failure wins; the run goes on without it).
        let no_detect: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(
            (!cfg.detect).then(|| "turned off (--no-detect)".to_string()),
        ));
        // Start-up notices (a feature turned off, and why), said once each.
        let notices: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
        let (f2, o2, g2, d2, n2) = (
            first.clone(),
            drop_counter.clone(),
            gcfg.clone(),
            no_detect.clone(),
            notices.clone(),
        );
        let (mode, detect, by_source) = (
            match cfg.mode {
                ServeMode::Echo => Mode::Echo,
                ServeMode::Sink => Mode::Sink,
            },
            cfg.detect,
            cfg.by_source,
        );
        let (want_gro, want_gso, busy_poll, budget) =
            (cfg.gro, cfg.gso, cfg.busy_poll_us, cfg.budget);
        let echo = mode == Mode::Echo;
        let v6 = cfg.bind.is_ipv6();
        let batch = budget.min(64);
        let rt_cfg = Config {
            cpus: cfg.cpus.clone(),
            budget,
            wait_ms: 100,
            busy_poll: std::time::Duration::ZERO,
            own_files: false,
        };
        let rt = Runtime::start(&rt_cfg, stop.clone(), move |idx, cpu| {
            let sock = udp::bind_one(&g2)?;
            if flowlane_io::socket::socket_drops(&sock).is_err() {
                o2.store(false, Ordering::Relaxed);
            }
            if idx == 0 {
                f2.keep(&sock)?;
            }
            let mut det = None;
            if detect {
                match udp::MissteerDetector::attach(&sock, cpu) {
                    Ok(d) => det = Some(d),
                    Err(e) => {
                        if let Ok(mut g) = d2.lock() {
                            g.get_or_insert_with(|| format!("unavailable: {e}"));
                        }
                    }
                }
            }
            let notice = |msg: String| {
                if let Ok(mut n) = n2.lock() {
                    if !n.contains(&msg) {
                        n.push(msg);
                    }
                }
            };
            // GSO is needed to echo a GRO buffer with its datagram boundaries intact.
            let gso_ok = (want_gso || (want_gro && echo))
                && match udp::probe_gso(&sock) {
                    Ok(()) => true,
                    Err(e) => {
                        notice(format!("GSO off: the kernel refused UDP_SEGMENT ({e})"));
                        false
                    }
                };
            let gro_ok = want_gro
                && (!echo || gso_ok)
                && match udp::enable_gro(&sock) {
                    Ok(()) => true,
                    Err(e) => {
                        notice(format!("GRO off: the kernel refused UDP_GRO ({e})"));
                        false
                    }
                };
            if want_gro && echo && !gso_ok {
                notice("GRO off: echoing coalesced datagrams needs GSO".into());
            }
            // Which datagrams arrived fragmented: one control message, only on those.
            let frag_ok = match udp::enable_fragment_size(&sock, v6) {
                Ok(()) => true,
                Err(e) => {
                    notice(format!(
                        "fragmented datagrams not counted: the kernel refused {e}"
                    ));
                    false
                }
            };
            let mut w = ServeWorker::new(sock, cpu, mode, batch);
            if frag_ok {
                w = w.with_fragment_count();
            }
            if let Some(us) = busy_poll {
                match udp::set_busy_poll(w.socket(), us, budget) {
                    Ok(true) => {}
                    Ok(false) => notice(
                        "busy poll without SO_PREFER_BUSY_POLL (kernel older than 5.11)".into(),
                    ),
                    Err(e) => notice(format!(
                        "SO_BUSY_POLL refused ({e}); spinning in user space only"
                    )),
                }
                w = w.with_busy_poll(us);
            }
            if gro_ok {
                w = w.with_gro();
            }
            if gso_ok && want_gso {
                w = w.with_gso();
            }
            if by_source {
                w = w.with_source_counts();
            }
            Ok(match det {
                Some(d) => w.with_detector(d),
                None => w,
            })
        })
        .map_err(|e| crate::error::start_error(e, crate::error::group_open))?;
        let (steering, member) = match &cfg.hash_steer {
            // Each bucket's queue to worker queue mod n (the workers in --cpus order).
            Some(h) if gcfg.steer => first.attach_with(|fd| {
                let n = whole.len().max(1) as u32;
                let workers: Vec<u32> = h.buckets.iter().map(|q| q % n).collect();
                match udp::attach_hash_steering(fd, &h.key, &workers, cfg.bind.is_ipv6()) {
                    Ok(()) => Steering::HashBpf,
                    Err(e) => Steering::ReuseportHash { reason: e },
                }
            }),
            _ => first.attach(whole, gcfg.steer),
        };
        let bufs = member.as_ref().and_then(|s| udp::buffer_sizes(s).ok());
        drop(member);
        let (rcvbuf, sndbuf) = bufs.unwrap_or((0, 0));
        let detector_off = no_detect.lock().ok().and_then(|g| g.clone());
        let notices = notices.lock().map(|n| n.clone()).unwrap_or_default();
        Ok(Startup {
            rt,
            steering,
            rcvbuf,
            sndbuf,
            drop_counter: drop_counter.load(Ordering::Relaxed),
            detector_off,
            notices,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::Duration;

    use super::*;

    /// The sockets on an address are counted as /proc/net/udp lists them.
    #[test]
    fn bound_sockets_are_counted_by_address_and_port() {
        assert_eq!(
            proc_net_addr("127.0.0.1:9000".parse().expect("addr")),
            if cfg!(target_endian = "little") {
                "0100007F:2328"
            } else {
                "7F000001:2328"
            }
        );
        let s = UdpSocket::bind("127.0.0.1:0").expect("a socket");
        let a = s.local_addr().expect("its address");
        assert_eq!(bound_sockets(a), 1);
        let stop = AtomicBool::new(false);
        assert!(wait_for_earlier_shards(a, 1, &stop).is_ok());
        let e = wait_for_earlier_shards(a, 0, &stop).expect_err("one too many");
        assert!(e.message.contains("more than"), "{}", e.message);
        drop(s);
        assert_eq!(bound_sockets(a), 0);
    }

    /// A whole run on loopback, in process: datagrams sent are counted, echoed back, and the
    /// report reads back from its JSON unchanged (the contract `bench` relies on).
    #[test]
    fn a_loopback_run_counts_echoes_and_its_report_round_trips() {
        let port = UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("a free port")
            .port();
        let here = flowlane_io::os::current_cpu().unwrap_or(0);
        let mut cfg = ServeConfig::new(
            format!("127.0.0.1:{port}").parse().expect("addr"),
            vec![here],
        );
        cfg.duration_s = Some(30.0);
        cfg.interval_s = 0.05;
        cfg.by_source = true;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (mut ticks, mut ticked_rx) = (0, 0);
        let report = run(&cfg, &stop, &mut |e| match e {
            ServeEvent::Started(s) => {
                assert_eq!(s.cpus, vec![here]);
                let stop3 = stop2.clone();
                std::thread::spawn(move || {
                    let c = UdpSocket::bind("127.0.0.1:0").expect("client");
                    c.set_read_timeout(Some(Duration::from_secs(5)))
                        .expect("timeout");
                    let mut buf = [0u8; 64];
                    for i in 0..100u8 {
                        c.send_to(&[i; 20], ("127.0.0.1", port)).expect("send");
                        let n = c.recv(&mut buf).expect("echo");
                        assert_eq!(&buf[..n], &[i; 20]);
                    }
                    // Time for a few status intervals (50 ms each) before the stop.
                    std::thread::sleep(Duration::from_millis(300));
                    stop3.store(true, Ordering::Relaxed);
                });
            }
            ServeEvent::Tick(t) => {
                ticks += 1;
                assert_eq!(t.workers.len(), 1);
                assert_eq!(
                    t.workers[0].1, t.total,
                    "one worker: its deltas are the total"
                );
                ticked_rx += t.total.rx_packets;
            }
        })
        .expect("serve runs");
        assert_eq!(report.total.rx_packets, 100);
        assert_eq!(report.total.tx_packets, 100);
        assert_eq!(report.workers[0].counts.rx_bytes, 2000);
        let sources = report.workers[0].sources.as_ref().expect("by source");
        assert_eq!(sources.iter().map(|s| s.packets).sum::<u64>(), 100);
        assert!(report.errors.is_empty());
        // Ticks carry interval deltas: together never more than the whole run.
        assert!(ticks >= 2, "{ticks} ticks in {} s", report.duration_s);
        assert!(ticked_rx <= report.total.rx_packets);
        let text = serde_json::to_string(&report).expect("JSON");
        let back: ServeReport = serde_json::from_str(&text).expect("reads back");
        assert_eq!(back, report);
    }

    #[test]
    fn port_zero_and_a_bad_interval_are_usage_errors() {
        let mut cfg = ServeConfig::new("127.0.0.1:0".parse().expect("addr"), vec![0]);
        let stop = Arc::new(AtomicBool::new(false));
        let e = run(&cfg, &stop, &mut |_| {}).expect_err("port 0");
        assert_eq!(e.kind, crate::ErrorKind::Usage);
        cfg.bind = "127.0.0.1:9".parse().expect("addr");
        cfg.interval_s = 0.0;
        let e = run(&cfg, &stop, &mut |_| {}).expect_err("interval 0");
        assert_eq!(e.kind, crate::ErrorKind::Usage);
    }
}
