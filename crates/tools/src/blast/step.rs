//! One step of a run: the senders start, send their shares, and their results become a
//! [`StepReport`].

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use super::sender::BlastSnapshot;
use super::sender::{
    packet_ring, xdp_socket, BlastError, BlastJob, BlastReport as SenderReport, Flow, LiveSender,
    RawLink, RingSender, Sender, UdpSender,
};
use flowlane_io::os;
use flowlane_runtime::{Config, Runtime, StopRule};
use hdrhistogram::Histogram;

use super::{BlastConfig, BlastEvent, BlastMode, BlastTick, FlowReport, StepReport, StepStart};
use crate::report::{Latency, WorkerError};
use crate::ToolError;

/// How each step sends and judges, resolved once from the configuration: the steps and
/// their helpers read this, never the configuration.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    pub mode: BlastMode,
    pub rate: Option<super::Rate>,
    pub count: Option<u64>,
    pub burst: u32,
    /// How late a paced sender may catch up (at most 10 s).
    pub catch_up: Duration,
    pub batch: usize,
    pub echo: bool,
    pub rcvbuf: Option<usize>,
    pub metrics: Option<SocketAddr>,
    pub to: Option<SocketAddr>,
    /// The interfaces (frame modes; none for UDP).
    pub devs: Vec<String>,
    /// Per-packet destination ranges (frame modes raw and xdp).
    pub spray: Option<super::Spray>,
    /// Datagrams cut into IP fragments (frame modes raw and xdp).
    pub fragments: Option<super::Fragmenting>,
    pub seed: u64,
    pub max_loss_pct: Option<f64>,
}

impl Settings {
    pub fn of(a: &BlastConfig) -> Settings {
        Settings {
            mode: a.mode.kind(),
            rate: a.rate,
            count: a.count,
            burst: a.burst,
            // At most 10 s; a negative or non-number one (a library caller's) is none.
            catch_up: Duration::try_from_secs_f64(a.catch_up_s.min(10.0)).unwrap_or_default(),
            batch: a.batch,
            echo: a.mode.echo().is_some(),
            rcvbuf: a.mode.echo().and_then(|e| e.rcvbuf),
            metrics: a.metrics,
            to: a.to,
            devs: a
                .mode
                .frames()
                .map(|f| f.devs().map(str::to_string).collect())
                .unwrap_or_default(),
            spray: a.spray.clone(),
            fragments: a.fragments.clone(),
            seed: a.seed,
            max_loss_pct: a.mode.echo().and_then(|e| e.max_loss_pct),
        }
    }
}

/// What every step of a run shares, resolved once from the configuration.
pub(super) struct Plan {
    /// How the steps send and are judged.
    pub settings: Settings,
    /// Frame bytes around the UDP payload.
    pub hdrs: usize,
    pub flows: Vec<(Flow, Option<u32>)>,
    /// The interfaces' links (frame modes): thread i sends on `links[i % len]`.
    pub links: Vec<RawLink>,
    /// The frame backend, chosen once (frame modes).
    pub backend: Option<crate::backend::BackendReport>,
    pub cpus: Vec<usize>,
    pub duration: Option<Duration>,
    pub interval: Duration,
    pub linger: Duration,
    /// A capture's frames to send instead of built ones (`--pcap`).
    pub replay: Option<Arc<super::replay::Replay>>,
    /// UDP mode: the route's MTU towards the destination, by which the kernel fragments.
    pub path_mtu: Option<usize>,
    /// The whole run's flows (of every shard): each flow's count and rate are its share of
    /// the whole run's, so shards together send what one run would.
    pub all_flows: usize,
    /// The place in the whole run's flows of this run's first flow.
    pub first_flow: usize,
    /// This run's shard and wall-clock start.
    pub sharding: crate::shard::Sharding,
}

/// Mean of a size cycle.
pub(super) fn mean(frames: &[usize]) -> f64 {
    frames.iter().sum::<usize>() as f64 / frames.len().max(1) as f64
}

/// How far step `index`'s flow ids lie above the plan's: `index` × `flows`, which must fit the
/// header's 16-bit flow id with every flow of the step.
pub(super) fn step_id_offset(index: usize, flows: usize) -> Result<u16, ToolError> {
    index
        .checked_mul(flows)
        .filter(|o| o.checked_add(flows).is_some_and(|end| end <= 1 << 16))
        .and_then(|o| u16::try_from(o).ok())
        .ok_or_else(|| {
            ToolError::usage(format!(
                "a size sweep gives each step's flows ids of their own, and {} steps of {flows} \
                 flows need more than the header's 65 536: fewer flows or fewer sizes",
                index + 1
            ))
        })
}

/// Splits `total` into `parts` shares that add up exactly.
fn split(total: u64, parts: usize, i: usize) -> u64 {
    let p = parts.max(1) as u64;
    total / p + u64::from((i as u64) < total % p)
}

/// One step: every thread sends its share with the frame sizes `frames` (a cycle per flow).
/// Step `index` of a sweep sends its flows under ids of their own (the plan's ids plus `index`
/// × the number of flows), so a receiver across the sweep tells the steps apart: each step's
/// sequence numbers start at 0 again, and under the same ids they were duplicates.
///
/// Long: the threads' jobs, the start (one sender per backend), the session with its ticks and
/// `--metrics`, then the counters read back, in the order they happen; the report is
/// `summarize`'s.
pub(super) fn run_step(
    plan: &Plan,
    index: usize,
    frames: &[usize],
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(BlastEvent),
) -> Result<StepReport, ToolError> {
    let a = &plan.settings;
    // A sharded run's first step waits for the agreed wall-clock start; every step records
    // when it began.
    let started = match index {
        0 => plan.sharding.start(stop)?,
        _ => crate::shard::Sharding {
            start_at_ns: None,
            ..plan.sharding
        }
        .start(stop)?,
    }
    .filter(|_| plan.sharding.asked());
    let nthreads = plan.cpus.len();
    let offset = step_id_offset(index, plan.flows.len())?;
    let flows: &Vec<(Flow, Option<u32>)> = &plan
        .flows
        .iter()
        .map(|&(mut f, q)| {
            f.id = f.id.wrapping_add(offset);
            (f, q)
        })
        .collect();
    // Each flow carries its share of the whole run's rate and count (flow f of K: ⌊C/K⌋, one
    // more for the first C mod K), so a thread's, or a shard's, part is its flows' part.
    let all = plan.all_flows.max(flows.len()).max(1);
    let ours = if flows.is_empty() { all } else { flows.len() };
    let requested_pps = a
        .rate
        .map(|r| r.pps(mean(frames)) * ours as f64 / all as f64);
    let start_ns = os::monotonic_ns();
    let deadline_ns = plan
        .duration
        .map(|d| start_ns.saturating_add(d.as_nanos() as u64));
    // A capture's frames (`plan.replay`) may be shorter than the headers of built ones.
    let payloads: Vec<usize> = frames.iter().map(|f| f.saturating_sub(plan.hdrs)).collect();
    // UDP mode: the IP fragments the kernel cuts each payload of the cycle into, at the path
    // MTU (all 1: nothing is fragmented, and nothing is counted).
    let v6 = a.to.is_some_and(|t| t.is_ipv6());
    let kernel_pieces: Vec<u32> = match plan.path_mtu {
        Some(mtu) if plan.links.is_empty() => payloads
            .iter()
            .map(|&p| flowlane_wire::fragment::kernel_pieces(p, mtu, v6) as u32)
            .collect(),
        _ => Vec::new(),
    };
    let kernel_fragmenting = kernel_pieces.iter().any(|&n| n > 1);
    // Worker w gets a contiguous share of the flows (ids stay contiguous per worker).
    let jobs: Vec<BlastJob> = (0..nthreads)
        .map(|w| {
            let per = flows.len() / nthreads;
            let extra = flows.len() % nthreads;
            let from = w * per + w.min(extra);
            let to = from + per + usize::from(w < extra);
            let replay = match &plan.replay {
                Some(r) => r.share(w, nthreads, from..to)?,
                None => Vec::new(),
            };
            // A capture without --count or --duration is sent once.
            let once =
                (!replay.is_empty() && plan.duration.is_none()).then_some(replay.len() as u64);
            Ok(BlastJob {
                flows: flows[from..to].iter().map(|(f, _)| *f).collect(),
                payloads: payloads.clone(),
                overhead: plan.hdrs,
                quota: a
                    .count
                    .map(|c| match flows.len() {
                        0 => split(c, nthreads, w),
                        _ => (from..to).map(|f| split(c, all, plan.first_flow + f)).sum(),
                    })
                    .or(once),
                pps: requested_pps.map(|p| match flows.len() {
                    0 => p / nthreads as f64,
                    n => p * (to - from) as f64 / n as f64,
                }),
                burst: a.burst,
                catch_up: a.catch_up,
                batch: a.batch,
                echo: a.echo,
                linger: plan.linger,
                rcvbuf: a.rcvbuf,
                deadline_ns,
                replay,
                spray: match (&a.spray, plan.links.get(w % plan.links.len().max(1))) {
                    (Some(sp), Some(l)) => Some(spray_job(sp, l, a.seed, w, nthreads)),
                    _ => None,
                },
                fragments: a.fragments.clone().map(|f| (f, w as u32, nthreads as u32)),
                kernel_pieces: if kernel_fragmenting {
                    kernel_pieces.clone()
                } else {
                    Vec::new()
                },
            })
        })
        .collect::<Result<_, ToolError>>()?;
    let jobs2 = jobs.clone();
    // `--metrics` with echoes: each sender's round trips, published as they come.
    let shares: Vec<flowlane_runtime::latency::LatencyShare> = (0..nthreads)
        .map(|_| flowlane_runtime::latency::LatencyShare::new())
        .collect();
    let (shares2, timed) = (shares.clone(), a.echo && a.metrics.is_some());
    let rt_cfg = Config {
        budget: a.batch,
        ..Config::frames(plan.cpus.clone())
    };
    let (mode, links) = (a.mode, plan.links.clone());
    // The step's own stop flag (the runtime raises it when the step ends); a stop request
    // (`stop`) is passed on to it below.
    let step_stop = Arc::new(AtomicBool::new(false));
    let mut rt = Runtime::start(&rt_cfg, step_stop.clone(), move |idx, _cpu| {
        let job = jobs2[idx].clone();
        let src = job.flows.first().map(|f| f.src);
        let sock_err = |error| BlastError::Socket {
            src: src.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
            error,
        };
        // Thread i sends on interface i mod n, and is the (i / n)-th thread there.
        let n = links.len().max(1);
        let (link, queue) = (links.get(idx % n), (idx / n) as u32);
        match (link, mode) {
            (Some(l), BlastMode::XdpLive) => {
                LiveSender::new(job, l).map(|r| Sender::Live(Box::new(r)))
            }
            (Some(l), BlastMode::Xdp) => {
                let x = xdp_socket(l, queue).map_err(sock_err)?;
                RingSender::new(job, l, x).map(|r| Sender::Xdp(Box::new(r)))
            }
            (Some(l), _) => {
                let ring = packet_ring(l).map_err(sock_err)?;
                RingSender::new(job, l, ring).map(|r| Sender::Raw(Box::new(r)))
            }
            (None, _) => UdpSender::new(job).map(|u| {
                let u = match shares2.get(idx).filter(|_| timed) {
                    Some(s) => u.with_latency_share(s.clone()),
                    None => u,
                };
                Sender::Udp(Box::new(u))
            }),
        }
    })
    .map_err(|e| crate::error::start_error(e, open_error))?;
    on_event(BlastEvent::StepStarted(Box::new(StepStart {
        mode: a.mode,
        flows: flows.len(),
        to: a.to,
        cpus: plan.cpus.clone(),
        frames: frames.to_vec(),
        payloads: payloads.clone(),
        requested_pps,
        count: a.count,
        echo: a.echo,
        replay: plan.replay.as_ref().map(|r| r.report.clone()),
        spray: a.spray.clone(),
        devs: a.devs.clone(),
    })));
    // xdp-live frames are handed to the driver with nothing to say whether it took them (veth
    // without NAPI on the peer drops them uncounted); the device's own transmit counter says.
    let dev_tx = || -> Option<u64> {
        if a.mode != BlastMode::XdpLive {
            return None;
        }
        a.devs
            .iter()
            .map(|d| flowlane_io::netdev::counter(d, "tx_packets"))
            .sum()
    };
    let dev_tx_before = dev_tx();
    // The senders end by their quota or deadline; the session ends with them (or a stop).
    let rule = StopRule {
        external: stop.clone(),
        deadline: None,
    };
    let _metrics = a
        .metrics
        .map(|m| {
            let latency = timed.then(|| crate::metrics::LatencyExport {
                what: "round_trip",
                help: "round-trip time of echoed datagrams, per sender",
                shares: shares.clone(),
            });
            crate::metrics::Exporter::start_with(m, "blast", &plan.cpus, rt.stats(), latency)
        })
        .transpose()?;
    let end = rt.session(Some(plan.interval), &rule, &mut |t| {
        let (d, cur) = (t.delta(), t.total());
        on_event(BlastEvent::Tick(BlastTick {
            elapsed_s: t.elapsed.as_secs_f64(),
            interval_s: t.interval.as_secs_f64(),
            tx_packets: d.role.tx_packets,
            tx_bytes: d.role.tx_bytes,
            rx_packets: d.role.rx_packets,
            not_back_yet: a
                .echo
                .then(|| cur.role.tx_packets.saturating_sub(cur.role.rx_packets)),
        }))
    });
    let errors: Vec<WorkerError> = end
        .errors
        .iter()
        .map(|(worker, error)| WorkerError {
            worker: *worker,
            error: error.to_string(),
        })
        .collect();
    let total = end.total();
    let t = total.role;
    // Each sender's report comes back through the join.
    let reports: Vec<SenderReport> = end.reports.into_iter().flatten().collect();
    let device_tx = match (dev_tx_before, dev_tx()) {
        (Some(b), Some(e)) => Some(e.saturating_sub(b)),
        _ => None,
    };
    let mut r = summarize(
        a,
        flows,
        &reports,
        &t,
        frames,
        requested_pps,
        errors,
        device_tx,
        kernel_fragmenting,
    );
    r.backend = plan.backend.clone();
    if a.echo {
        r.cpu_latency_ns = Some(
            reports
                .iter()
                .zip(&plan.cpus)
                .map(|(rep, &cpu)| super::report::CpuRoundTrip {
                    cpu,
                    echoes: rep.rtt_ns.as_ref().map_or(0, |h| h.len()),
                    latency: Latency::of(rep.rtt_ns.as_ref(), "round-trip"),
                })
                .collect(),
        );
    }
    if let Some(replay) = &plan.replay {
        // A capture's sizes are its own, not a cycle to print: the mean is what was sent.
        r.frame_bytes = None;
        r.imix_frame_bytes = None;
        r.replay = Some(replay.report.clone());
    }
    r.cpu_ns_per_packet = crate::ns_per(total.looped.cpu_ns, t.tx_packets);
    r.pmu = crate::PmuCost::of(&total.looped, t.tx_packets, rt.pmu_unavailable());
    r.shard = started;
    r.latency_histogram = r
        .histogram
        .as_ref()
        .and_then(crate::report::encode_histogram);
    Ok(r)
}

/// Worker `w`'s share of the ranges: its link's MACs, a seed of its own, and (counting up)
/// every `nthreads`-th destination from its `w`-th.
fn spray_job(
    sp: &super::Spray,
    l: &RawLink,
    seed: u64,
    w: usize,
    nthreads: usize,
) -> super::sender::spray::SprayJob {
    use flowlane_rss::pick::addr_to_u128;
    let d = addr_to_u128(sp.dst.1).saturating_sub(addr_to_u128(sp.dst.0));
    super::sender::spray::SprayJob {
        dst_base: addr_to_u128(sp.dst.0),
        dst_count: u64::try_from(d).map_or(u64::MAX, |d| d.saturating_add(1)),
        v6: sp.dst.0.is_ipv6(),
        dport_base: sp.dport.0,
        dport_count: u32::from(sp.dport.1 - sp.dport.0.min(sp.dport.1)) + 1,
        random: sp.random,
        flowlen: sp.flowlen,
        src_mac: l.src_mac,
        src_macs: sp.src_macs,
        dst_mac: l.dst_mac,
        dst_macs: sp.dst_macs,
        // Distinct streams per worker (the golden ratio's odd multiplier spreads them).
        seed: seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
        start: w as u64,
        stride: nthreads.max(1) as u64,
    }
}

/// Who can fix a sender that could not open its socket or ring, and how.
fn open_error(e: &BlastError, message: String) -> ToolError {
    let BlastError::Socket { error, .. } = e else {
        // A job that cannot be built (e.g. a frame larger than a ring slot) is the
        // configuration's to fix.
        return ToolError::usage(message);
    };
    let denied = error.source.kind() == std::io::ErrorKind::PermissionDenied;
    if denied && (error.call.contains("AF_PACKET") || error.call.contains("AF_XDP")) {
        ToolError::privilege(format!(
            "{message}: raw and xdp modes need CAP_NET_RAW (run as root or grant the capability)"
        ))
    } else if denied && error.call.starts_with("bpf(") {
        ToolError::privilege(format!(
            "{message}: xdp-live mode loads a BPF program and needs CAP_BPF and CAP_NET_ADMIN \
             (run as root)"
        ))
    } else if denied
        || matches!(
            error.source.kind(),
            std::io::ErrorKind::AddrNotAvailable | std::io::ErrorKind::AddrInUse
        )
    {
        ToolError::usage(format!(
            "{message} (is the source an address of this host, and are the ports free?)"
        ))
    } else {
        ToolError::runtime(message)
    }
}

/// The step's report from the senders' results and counters.
#[allow(clippy::too_many_arguments)]
/// Long: the per-flow tally (sent, and with echoes lost, reordered, duplicated) and the step's
/// figures, each computed once where the report takes it.
fn summarize(
    a: &Settings,
    flows: &[(Flow, Option<u32>)],
    reports: &[SenderReport],
    t: &BlastSnapshot,
    frames: &[usize],
    requested_pps: Option<f64>,
    errors: Vec<WorkerError>,
    device_tx: Option<u64>,
    kernel_fragmenting: bool,
) -> StepReport {
    // The send window: first to last datagram over all threads.
    let first = reports
        .iter()
        .map(|r| r.tx_window_ns.0)
        .filter(|&x| x > 0)
        .min();
    let last = reports.iter().map(|r| r.tx_window_ns.1).max();
    let secs = match (first, last) {
        (Some(f), Some(l)) if l > f => (l - f) as f64 / 1e9,
        _ => 0.0,
    };
    let mut rtt: Option<Histogram<u64>> = None;
    let (mut lost, mut reordered, mut duplicates) = (0, 0, 0);
    let mut flow_reports = Vec::new();
    for r in reports {
        if let Some(h) = &r.rtt_ns {
            match rtt.as_mut() {
                Some(all) => {
                    let _ = all.add(h);
                }
                None => rtt = Some(h.clone()),
            }
        }
        for f in &r.flows {
            let queue = flows
                .iter()
                .find(|(x, _)| x.id == f.flow.id)
                .and_then(|(_, q)| *q);
            let mut fr = FlowReport {
                id: f.flow.id,
                src: f.flow.src.to_string(),
                dst: f.flow.dst.to_string(),
                queue,
                tx_packets: f.sent,
                rx_packets: None,
                lost: None,
                reordered: None,
                duplicates: None,
            };
            if a.echo {
                let l = f.rx.lost(Some(f.sent));
                lost += l;
                reordered += f.rx.reordered;
                duplicates += f.rx.duplicates;
                fr.rx_packets = Some(f.rx.unique + f.rx.duplicates);
                fr.lost = Some(l);
                fr.reordered = Some(f.rx.reordered);
                fr.duplicates = Some(f.rx.duplicates);
            }
            flow_reports.push(fr);
        }
    }
    let per_s = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let tx_pps = per_s(t.tx_packets);
    let forfeited: u64 = reports.iter().map(|r| r.forfeited).sum();
    let late_max_ns = reports.iter().map(|r| r.late_max_ns).max().unwrap_or(0);
    let limited = requested_pps.map(|req| {
        // One packet's worth of slack: a window of n packets spans n−1 intervals.
        let achieved = if t.tx_packets > 1 && secs > 0.0 {
            (t.tx_packets - 1) as f64 / secs
        } else {
            req
        };
        if achieved >= 0.99 * req {
            None
        } else if t.tx_full > 0 {
            Some(format!(
                "the kernel refused datagrams {} times (socket buffer full): the path below the \
                 socket, not pacing, set the rate",
                t.tx_full
            ))
        } else if forfeited > 0 {
            Some(format!(
                "the sending threads were woken too late: up to {:.1} ms after a datagram was \
                 due, longer than the {:.0} ms they may catch up, so {forfeited} datagrams' time \
                 passed unsent (a CPU shared with a busy process, or a slow timer); give the \
                 senders CPUs of their own (--cpus), or a longer --catch-up",
                late_max_ns as f64 / 1e6,
                a.catch_up.as_secs_f64() * 1e3
            ))
        } else {
            Some(format!(
                "the sending threads could not keep up: CPU-bound (every due datagram was \
                 sent as soon as they came, at worst {:.1} ms late); add CPUs or a larger \
                 batch",
                late_max_ns as f64 / 1e6
            ))
        }
    });
    let limited_by = match &limited {
        Some(Some(_)) if t.tx_full > 0 => Some("path".to_string()),
        Some(Some(_)) => Some("generator".to_string()),
        _ => None,
    };
    let mbps = if secs > 0.0 {
        t.tx_bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    };
    let device_refused = device_tx.map(|d| t.tx_packets.saturating_sub(d));
    let mut r = StepReport {
        tx_packets: t.tx_packets,
        tx_bytes: t.tx_bytes,
        rx_packets: a.echo.then_some(t.rx_packets),
        lost: a.echo.then_some(lost),
        reordered: a.echo.then_some(reordered),
        duplicates: a.echo.then_some(duplicates),
        foreign: t.foreign,
        tx_full: t.tx_full,
        icmp_errors: t.icmp_errors,
        lost_at_own_socket: a.echo.then_some(t.echo_socket_drops),
        duration_s: (secs * 1000.0).round() / 1000.0,
        tx_pps: tx_pps.round(),
        cpu_ns_per_packet: None,
        pmu: crate::PmuCost::default(),
        rx_pps: a.echo.then(|| per_s(t.rx_packets).round()),
        requested_pps: requested_pps.map(f64::round),
        generator_limited: limited.as_ref().map(Option::is_some),
        generator_limited_reason: limited.clone().flatten(),
        pace_forfeited: requested_pps.map(|_| forfeited),
        late_max_ms: requested_pps.map(|_| late_max_ns as f64 / 1e6),
        limited_by,
        problems: Vec::new(),
        frame_bytes: match frames {
            [one] => Some(*one),
            _ => None,
        },
        imix_frame_bytes: (frames.len() > 1).then(|| frames.to_vec()),
        mbps: (mbps * 10.0).round() / 10.0,
        latency_ns: Latency::of(rtt.as_ref(), "round-trip"),
        cpu_latency_ns: None,
        histogram: rtt.clone(),
        latency_histogram: None,
        shard: None,
        pktgen: String::new(),
        flows_started: a
            .spray
            .as_ref()
            .map(|_| reports.iter().map(|r| r.flows_started).sum()),
        destinations: a.spray.as_ref().map(super::Spray::space),
        // Frame modes count what they cut; UDP mode what the path MTU makes the kernel cut.
        fragmented_datagrams: (a.fragments.is_some() || kernel_fragmenting)
            .then_some(t.tx_fragmented),
        fragments: (a.fragments.is_some() || kernel_fragmenting).then_some(t.tx_fragments),
        devs: a.devs.clone(),
        device_tx_packets: device_tx,
        device_refused,
        ring_refused: t.ring_refused,
        backend: None,
        replay: None,
        flows: flow_reports,
        errors,
        rss_verify: None,
        host: None,
    };
    r.problems = judge(a, &r, tx_pps);
    r.pktgen = pktgen_line(&r, secs, mean(frames), mbps);
    r
}

/// What failed in a step, in words: sender errors, frames the device refused, a requested
/// rate not reached (saying whether the generator or the path below it was the limit), no
/// echo at all, loss above the configured maximum.
pub(super) fn judge(a: &Settings, r: &StepReport, tx_pps: f64) -> Vec<String> {
    let mut p = Vec::new();
    if !r.errors.is_empty() {
        p.push(format!(
            "{} sender thread(s) stopped with an error",
            r.errors.len()
        ));
    }
    if let Some(n) = r.device_refused.filter(|&n| n > 0) {
        p.push(format!("the device refused {n} frames"));
    }
    if r.ring_refused > 0 {
        p.push(format!(
            "the kernel refused {} queued frames as malformed (the ring's own count)",
            r.ring_refused
        ));
    }
    if let (Some(req), Some(why), Some(by)) =
        (r.requested_pps, &r.generator_limited_reason, &r.limited_by)
    {
        p.push(format!(
            "requested {req:.0} pps, sent {tx_pps:.0} pps: the {by} was the limit ({why})"
        ));
    }
    if a.echo && r.tx_packets > 0 {
        let lost = r.lost.unwrap_or(0);
        let pct = 100.0 * lost as f64 / r.tx_packets as f64;
        if lost >= r.tx_packets {
            p.push(format!(
                "no echo came back of {} datagrams sent{} (is `flowlane serve --mode echo` \
                 running at the destination?)",
                r.tx_packets,
                if r.foreign > 0 {
                    format!(" ({} replies were not flowlane echoes)", r.foreign)
                } else {
                    String::new()
                }
            ));
        } else if let Some(max) = a.max_loss_pct.filter(|&m| pct > m) {
            p.push(format!(
                "{pct:.4}% of the datagrams were lost, above --max-loss {max}%"
            ));
        }
    }
    p
}

/// pktgen's result line; "OK" only for a step that did what was asked.
pub(crate) fn pktgen_line(r: &StepReport, secs: f64, mean_frame: f64, mbps: f64) -> String {
    let usec = (secs * 1e6).round() as u64;
    let bps = (mbps * 1e6).round() as u64;
    format!(
        "{}: {usec} usec, {} ({}byte,{}frags) {:.0}pps {}Mb/sec ({bps}bps) errors: {} flows: {}",
        if r.ok() { "OK" } else { "FAIL" },
        r.tx_packets,
        // A mix reports its mean frame, as a line rate computation would use it.
        mean_frame.round(),
        // Fragments per datagram cut (its IP fragments, where pktgen counts page frags).
        match (r.fragmented_datagrams, r.fragments) {
            (Some(d), Some(f)) if d > 0 => f.div_ceil(d),
            _ => 0,
        },
        r.tx_pps,
        bps / 1_000_000,
        r.errors.len() as u64 + r.device_refused.unwrap_or(0),
        r.flows_started.unwrap_or(r.flows.len() as u64)
    )
}
