//! One step of the bench: the server in the DUT namespace, the client in the generator
//! namespace (threads that entered them; their workers inherit the namespace), then the
//! counters joined and checked.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use flowlane_lab::counters::IfCounters;
use flowlane_lab::setup::{self, LabConfig, Steer, DUT_IF, GEN_IF};
use flowlane_lab::Netns;
use flowlane_rss::queue::Reta;

use super::{BenchConfig, BenchStep, BenchWorker, Five, Pps};
use crate::blast::{self, BlastConfig, ModelSpec, Placement};
use crate::serve::{self, ServeConfig, ServeEvent, ServeMode, ServeReport};
use crate::ToolError;

/// Where one step runs.
pub(super) struct Target {
    /// Namespaces (gen, dut) and the lab's settings — none for loopback.
    pub lab: Option<(Netns, Netns, LabConfig)>,
    /// Server address.
    pub to: String,
    /// The server's workers' CPUs.
    pub cpus: Vec<usize>,
    /// Buckets of the queue model the flows are placed with.
    pub buckets: u32,
    /// The RSS key (hex) the flows are placed with.
    pub key: String,
    /// The symmetric hashing they are placed with (the lab's).
    pub symmetric: flowlane_rss::Symmetric,
}

/// Per-CPU (busy, total) jiffies from /proc/stat, by position (none if it cannot be read:
/// the step then reports no CPU shares).
type CpuTimes = Vec<(u64, u64)>;

fn cpu_times() -> CpuTimes {
    flowlane_lab::counters::cpu_times()
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.busy, c.total))
        .collect()
}

fn lab_err(e: flowlane_lab::LabError) -> ToolError {
    ToolError::runtime(e.to_string())
}

fn counters(ns: &Netns, ifname: &str) -> Result<IfCounters, ToolError> {
    let d = ns.dev().map_err(lab_err)?;
    d.ifaces
        .get(ifname)
        .copied()
        .ok_or_else(|| ToolError::runtime(format!("no interface {ifname} in {}", ns.name())))
}

/// What the kernel did per CPU (softnet_stat: the host's) and per receive queue of the
/// server's interface (its driver's counters), read before and after a step.
struct KernelView {
    softnet: Vec<flowlane_lab::counters::Softnet>,
    queues: Vec<flowlane_lab::counters::RxQueue>,
}

fn kernel_view(t: &Target) -> KernelView {
    use flowlane_lab::counters::{parse_softnet, read_proc, rx_queues};
    KernelView {
        softnet: read_proc("softnet_stat")
            .and_then(|text| parse_softnet(&text))
            .unwrap_or_default(),
        queues: match &t.lab {
            Some((_, d, _)) => d
                .run(|| flowlane_io::netdev::driver_stats(DUT_IF))
                .ok()
                .and_then(Result::ok)
                .map(|s| rx_queues(&s))
                .unwrap_or_default(),
            None => Vec::new(),
        },
    }
}

/// Source addresses given to the generator for one step (two-tuple placement), with a
/// permanent neighbour entry for each on the DUT (no ARP on the link); taken away again when
/// dropped, also when the step fails.
struct SourceAddrs<'a> {
    gen: &'a Netns,
    dut: &'a Netns,
    addrs: Vec<std::net::IpAddr>,
}

impl<'a> SourceAddrs<'a> {
    fn add(
        gen: &'a Netns,
        dut: &'a Netns,
        addrs: &[std::net::IpAddr],
    ) -> Result<SourceAddrs<'a>, ToolError> {
        let mac = setup::GEN_MAC;
        let mut s = SourceAddrs {
            gen,
            dut,
            addrs: Vec::new(),
        };
        for a in addrs {
            let text = a.to_string();
            gen.ip(&["addr", "add", &format!("{text}/24"), "dev", GEN_IF])
                .map_err(lab_err)?;
            s.addrs.push(*a);
            dut.permanent_neighbour(DUT_IF, &text, mac)
                .map_err(lab_err)?;
        }
        Ok(s)
    }
}

impl Drop for SourceAddrs<'_> {
    fn drop(&mut self) {
        for a in &self.addrs {
            let text = a.to_string();
            let _ = self
                .gen
                .ip(&["addr", "del", &format!("{text}/24"), "dev", GEN_IF]);
            let _ = self.dut.ip(&["neigh", "del", &text, "dev", DUT_IF]);
        }
    }
}

/// The interfaces' counters and the kernel's view read as of one moment. On veth the DUT
/// end's `rx_packets` is the sum of its queues' XDP counts (plus frames that bypassed
/// NAPI), but the two are read by separate calls: a frame the kernel sends on its own (a
/// late MLD report after `lab up`) arriving between them is in one reading and not the
/// other, and the step's two sums then differ by it (seen once in CI: the queues' count
/// 1 short of the interface's). Reading the interface again after the queues and
/// retrying until neither end has moved makes the pair consistent; bounded at half a second,
/// after which the last reading is kept (and the test's exact check will show it).
fn snapshot(
    t: &Target,
    gen: Option<&Netns>,
    dut: Option<&Netns>,
) -> Result<(Option<(IfCounters, IfCounters)>, KernelView), ToolError> {
    let (Some(g), Some(d)) = (gen, dut) else {
        return Ok((None, kernel_view(t)));
    };
    let until = Instant::now() + std::time::Duration::from_millis(500);
    loop {
        let first = (counters(g, GEN_IF)?, counters(d, DUT_IF)?);
        let view = kernel_view(t);
        let again = (counters(g, GEN_IF)?, counters(d, DUT_IF)?);
        // Counters only grow: equal readings around everything mean nothing arrived between.
        let counts = |(g, d): &(IfCounters, IfCounters)| {
            (g.tx_packets, g.rx_packets, d.rx_packets, d.rx_dropped)
        };
        if counts(&first) == counts(&again) || Instant::now() >= until {
            return Ok((Some(again), view));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The differences over a step, per CPU and per queue.
fn kernel_deltas(
    a: &KernelView,
    b: &KernelView,
) -> (Vec<super::KernelCpu>, Vec<flowlane_lab::counters::RxQueue>) {
    let cpus = b
        .softnet
        .iter()
        .map(|y| {
            let x = a.softnet.iter().find(|x| x.cpu == y.cpu);
            let d = |f: fn(&flowlane_lab::counters::Softnet) -> u64| {
                f(y).saturating_sub(x.map_or(0, f))
            };
            super::KernelCpu {
                cpu: y.cpu as u64,
                processed: d(|s| s.processed),
                backlog_drops: d(|s| s.dropped),
                time_squeeze: d(|s| s.time_squeeze),
            }
        })
        .collect();
    let queues = b
        .queues
        .iter()
        .map(|y| {
            let x = a
                .queues
                .iter()
                .find(|x| x.queue == y.queue)
                .copied()
                .unwrap_or_default();
            flowlane_lab::counters::RxQueue {
                queue: y.queue,
                xdp_packets: y.xdp_packets.saturating_sub(x.xdp_packets),
                xdp_redirect: y.xdp_redirect.saturating_sub(x.xdp_redirect),
                drops: y.drops.saturating_sub(x.drops),
                xdp_drops: y.xdp_drops.saturating_sub(x.xdp_drops),
            }
        })
        .collect();
    (cpus, queues)
}

/// The lab's software-RSS counts per CPU (None: loopback, or steering other than rss).
fn steer_counts(t: &Target) -> Result<Option<Vec<setup::SteerCount>>, ToolError> {
    match &t.lab {
        Some((_, d, c)) if c.steer == Steer::Rss => setup::steer_counts(d).map_err(lab_err),
        _ => Ok(None),
    }
}

/// Frames each CPU's software-RSS queue dropped between two readings: handed to the queue but
/// never taken off it (the step is over, so none is still waiting).
fn queue_drops(
    before: &Option<Vec<setup::SteerCount>>,
    after: &Option<Vec<setup::SteerCount>>,
) -> Option<BTreeMap<u64, u64>> {
    let (b, a) = (before.as_ref()?, after.as_ref()?);
    Some(
        a.iter()
            .map(|x| {
                let y = b.iter().find(|y| y.cpu == x.cpu);
                // Saturating: a lab taken down and up again meanwhile starts from zero.
                let redirected = x.redirected.saturating_sub(y.map_or(0, |y| y.redirected));
                let arrived = x.arrived.saturating_sub(y.map_or(0, |y| y.arrived));
                (x.cpu as u64, redirected.saturating_sub(arrived))
            })
            .collect(),
    )
}

/// Runs `f` in the namespace `ns` (on a thread that entered it), or here without one.
fn inside<T: Send>(ns: Option<&Netns>, f: impl FnOnce() -> T + Send) -> Result<T, ToolError> {
    match ns {
        Some(ns) => ns.run(f).map_err(lab_err),
        None => Ok(f()),
    }
}

/// One step: the server, then the client for the step's seconds, then the numbers.
///
/// Long: server, client and counters of one step in the order they run, each in its namespace;
/// the checks are `account`'s.
pub(super) fn step(
    a: &BenchConfig,
    t: &Target,
    k: u32,
    (echo, hash): (bool, bool),
    stop: &Arc<AtomicBool>,
) -> Result<BenchStep, ToolError> {
    let to: std::net::SocketAddr =
        t.to.parse()
            .map_err(|_| ToolError::runtime(format!("server address {}", t.to)))?;
    let mut scfg = ServeConfig::new(to, t.cpus.clone());
    scfg.mode = if echo {
        ServeMode::Echo
    } else {
        ServeMode::Sink
    };
    scfg.by_source = true;
    scfg.interval_s = 3600.0;
    if hash {
        scfg.hash_steer = Some(hash_steer(t)?);
    }
    let threads = k.min(t.cpus.len() as u32).max(1);
    let mut bcfg = BlastConfig::new(to, t.cpus[0]);
    bcfg.cpus = t.cpus[..threads as usize].to_vec();
    // A two-tuple lab steers by address: each flow gets a source address of its own, from a
    // block of the generator's subnet that no lab end uses (added for the step, below).
    let two_tuple = matches!(&t.lab, Some((_, _, c)) if !c.ports);
    bcfg.placement = Some(Placement {
        hash_ports: !two_tuple,
        per_queue: a.per_bucket,
        queues: (0..k).collect(),
        key: t.key.clone(),
        symmetric: t.symmetric,
        model: ModelSpec::Reta(match &t.lab {
            Some((_, _, c)) => c.reta.clone(),
            None => Reta::round_robin(128, t.buckets as usize)
                .map_err(|e| ToolError::usage(e.to_string()))?
                .entries()
                .to_vec(),
        }),
    });
    bcfg.frames = blast::Frames::Sizes(vec![a.frame_bytes]);
    bcfg.kernel_fragments = a.fragments.as_ref().map(|f| blast::KernelFragmenting {
        share: f.share,
        payload: f.payload,
    });
    bcfg.duration_s = Some(a.step_secs);
    bcfg.rate = a.rate;
    bcfg.interval_s = 3600.0;
    if t.lab.is_none() {
        let lo = std::net::IpAddr::from([127, 0, 0, 1]);
        bcfg.from = Some((lo, lo));
    }
    if echo {
        bcfg.mode = blast::Mode::Udp {
            echo: Some(blast::Echo {
                linger_s: 0.5,
                ..blast::Echo::default()
            }),
        };
    }
    let (gen, dut) = match &t.lab {
        Some((g, d, _)) => (Some(g), Some(d)),
        None => (None, None),
    };
    let _sources = match (gen, dut) {
        (Some(g), Some(d)) if two_tuple => {
            bcfg.from = Some((
                std::net::IpAddr::from([198, 18, 0, 100]),
                std::net::IpAddr::from([198, 18, 0, 254]),
            ));
            Some(SourceAddrs::add(g, d, &blast::source_addrs(&bcfg)?)?)
        }
        _ => None,
    };
    // Counters before the server starts and after it stops: nothing crosses the link outside
    // the step.
    let (before, kernel0) = snapshot(t, gen, dut)?;
    let steer0 = steer_counts(t)?;
    let snmp0 = a.fragments.as_ref().and_then(|_| snmp_pair(gen, dut));
    let server_stop = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = mpsc::channel();
    let srv = std::thread::scope(|s| -> Result<_, ToolError> {
        let (scfg, server_stop) = (&scfg, &server_stop);
        // The sender moves into the server's thread: when the server ends without starting
        // (a busy port), the channel closes and the wait below ends with it.
        let server = s.spawn(move || {
            inside(dut, move || {
                serve::run(scfg, server_stop, &mut |e| {
                    if let ServeEvent::Started(_) = e {
                        let _ = started_tx.send(());
                    }
                })
            })
        });
        // Started, or the server ended (its error is in its result).
        let ready = started_rx.recv().is_ok();
        let client = if ready {
            let cpu0 = cpu_times();
            let t0 = Instant::now();
            let b = inside(gen, || blast::run(&bcfg, stop, &mut |_| {}));
            Some((cpu0, t0.elapsed().as_secs_f64(), cpu_times(), b))
        } else {
            None
        };
        // Datagrams still queued on the server's sockets when it stops would count as lost
        // with no counter to show it: give the workers a moment to read what came last.
        std::thread::sleep(std::time::Duration::from_millis(100));
        server_stop.store(true, Ordering::Relaxed);
        let srv = server
            .join()
            .map_err(|_| ToolError::runtime("the server thread panicked"))???;
        Ok((srv, client))
    })?;
    let (srv, client) = srv;
    let Some((cpu0, elapsed, cpu1, b)) = client else {
        return Err(ToolError::runtime("the server stopped before it was ready"));
    };
    let b = b??;
    let b = b
        .steps
        .into_iter()
        .next()
        .ok_or_else(|| ToolError::runtime(format!("the client ran no step at k = {k}")))?;
    // Frames still on their way (a busy CPU's NAPI poll not yet run) move both counts of
    // the snapshot together, so it waits for them while they move.
    let (after, kernel1) = snapshot(t, gen, dut)?;
    let qdrops = queue_drops(&steer0, &steer_counts(t)?);
    let (kernel_cpus, server_queues) = kernel_deltas(&kernel0, &kernel1);
    let frags = match (a.fragments.as_ref(), snmp0, snmp_pair(gen, dut)) {
        (Some(f), Some(x), Some(y)) => Some(step_fragments(f.share, &b, &srv, &x, &y)),
        _ => None,
    };
    let mut s = account(
        t,
        k,
        echo,
        threads,
        &srv,
        &b,
        before,
        after,
        qdrops,
        (cpu0, cpu1),
        elapsed,
        frags,
    );
    s.kernel_cpus = kernel_cpus;
    s.server_queues = server_queues;
    Ok(s)
}

/// The server's hash steering for a step: the lab's key, and per entry of its table the
/// worker (by position in the server's CPUs) that owns the entry's queue — its queue's CPU in
/// a lab, queue mod workers on loopback — so a datagram reaches the worker its bucket's CPU
/// runs, wherever the kernel finished it.
fn hash_steer(t: &Target) -> Result<serve::HashSteer, ToolError> {
    let key = flowlane_rss::Key::parse(&t.key).map_err(|e| ToolError::usage(e.to_string()))?;
    let n = t.cpus.len().max(1);
    let buckets = match &t.lab {
        Some((_, _, c)) => c
            .reta
            .iter()
            .map(|&q| {
                let cpu = c.queue_cpus.get(usize::from(q)).copied().unwrap_or(0) as usize;
                t.cpus
                    .iter()
                    .position(|&w| w == cpu)
                    .map(|i| i as u32)
                    .ok_or_else(|| {
                        ToolError::usage(format!(
                            "lab {} steers queue {q} to CPU {cpu}, where no worker runs",
                            c.name
                        ))
                    })
            })
            .collect::<Result<Vec<u32>, ToolError>>()?,
        None => (0..t.buckets).map(|q| q % n as u32).collect(),
    };
    Ok(serve::HashSteer {
        key: key.as_bytes().to_vec(),
        buckets,
    })
}

/// Both namespaces' /proc/net/snmp (client's, server's); `None` when either cannot be read.
fn snmp_pair(
    gen: Option<&Netns>,
    dut: Option<&Netns>,
) -> Option<(flowlane_lab::counters::Snmp, flowlane_lab::counters::Snmp)> {
    Some((gen?.snmp().ok()?, dut?.snmp().ok()?))
}

/// The step's fragments from the programs' reports and both kernels' counters before and
/// after.
fn step_fragments(
    share: f64,
    b: &blast::StepReport,
    srv: &ServeReport,
    (g0, d0): &(flowlane_lab::counters::Snmp, flowlane_lab::counters::Snmp),
    (g1, d1): &(flowlane_lab::counters::Snmp, flowlane_lab::counters::Snmp),
) -> super::StepFragments {
    let delta = |x: &flowlane_lab::counters::Snmp, y: &flowlane_lab::counters::Snmp, k: &str| {
        let v = |s: &flowlane_lab::counters::Snmp| s.get("Ip", k).unwrap_or(0);
        u64::try_from(v(y).saturating_sub(v(x))).unwrap_or(0)
    };
    // A flow whose datagrams reached two workers or more.
    let mut workers_of: BTreeMap<&str, u32> = BTreeMap::new();
    for w in &srv.workers {
        for s in w.sources.iter().flatten().filter(|s| s.packets > 0) {
            *workers_of.entry(s.src.as_str()).or_default() += 1;
        }
    }
    super::StepFragments {
        share,
        sent_datagrams: b.fragmented_datagrams.unwrap_or(0),
        sent_fragments: b.fragments.unwrap_or(0),
        client_frag_oks: delta(g0, g1, "FragOKs"),
        client_frag_creates: delta(g0, g1, "FragCreates"),
        server_reasm_reqds: delta(d0, d1, "ReasmReqds"),
        server_reasm_oks: delta(d0, d1, "ReasmOKs"),
        server_reasm_fails: delta(d0, d1, "ReasmFails"),
        server_fragmented: srv.total.fragmented,
        worker_fragmented: srv.workers.iter().map(|w| w.counts.fragmented).collect(),
        split_flows: workers_of.values().filter(|&&n| n > 1).count() as u64,
    }
}

/// The step's numbers and checks.
#[allow(clippy::too_many_arguments)]
/// Long: every check of a step (sent = received = seen, each worker exactly its buckets, echoes
/// back, the programs' counts against the interfaces') is written beside the figure it checks,
/// so each rule is read once, in one place.
fn account(
    t: &Target,
    k: u32,
    echo: bool,
    threads: u32,
    srv: &ServeReport,
    b: &blast::StepReport,
    before: Option<(IfCounters, IfCounters)>,
    after: Option<(IfCounters, IfCounters)>,
    qdrops: Option<BTreeMap<u64, u64>>,
    (cpu0, cpu1): (CpuTimes, CpuTimes),
    elapsed: f64,
    frags: Option<super::StepFragments>,
) -> BenchStep {
    // Where each flow should land: its bucket's CPU (the lab's table; loopback: bucket mod
    // CPUs).
    let queue_cpu = |q: u32| -> u64 {
        match &t.lab {
            Some((_, _, c)) => c.queue_cpus.get(q as usize).copied().unwrap_or(0) as u64,
            None => t.cpus[q as usize % t.cpus.len()] as u64,
        }
    };
    let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
    // Each flow's bucket CPU, by source address.
    let mut flow_cpu: BTreeMap<&str, u64> = BTreeMap::new();
    let mut unplaced = 0;
    for f in &b.flows {
        match f.queue {
            Some(q) => {
                *expected.entry(queue_cpu(q)).or_default() += f.tx_packets;
                flow_cpu.insert(&f.src, queue_cpu(q));
            }
            None => unplaced += 1,
        }
    }
    let mut workers = Vec::new();
    let mut misplaced = 0u64;
    for w in &srv.workers {
        let cpu = w.cpu as u64;
        // Datagrams of a flow whose bucket belongs to another CPU.
        for s in w.sources.iter().flatten() {
            if flow_cpu.get(s.src.as_str()).is_some_and(|&c| c != cpu) {
                misplaced += s.packets;
            }
        }
        workers.push(BenchWorker {
            cpu,
            rx_packets: w.counts.rx_packets,
            expected: expected.get(&cpu).copied().unwrap_or(0),
            echoed: w.counts.tx_packets,
            missteered: w.counts.missteered,
            socket_drops: w.counts.socket_drops,
            queue_drops: qdrops.as_ref().map(|q| q.get(&cpu).copied().unwrap_or(0)),
            cpu_ns_per_packet: w.counts.cpu_ns_per_packet,
        });
    }
    let (seen, echoed) = (srv.total.rx_packets, srv.total.tx_packets);
    let prog_sent = b.tx_packets;
    let back = if echo { b.rx_packets } else { None };
    let (iface_sent, iface_rx, iface_rx_dropped, iface_back) = match (before, after) {
        (Some((g0, d0)), Some((g1, d1))) => (
            Some(g1.tx_packets.saturating_sub(g0.tx_packets)),
            Some(d1.rx_packets.saturating_sub(d0.rx_packets)),
            Some(d1.rx_dropped.saturating_sub(d0.rx_dropped)),
            Some(g1.rx_packets.saturating_sub(g0.rx_packets)),
        ),
        _ => (None, None, None, None),
    };
    let busy: Vec<f64> = cpu0
        .iter()
        .zip(&cpu1)
        .map(|(x, y)| {
            let total = y.1.saturating_sub(x.1).max(1) as f64;
            (y.0.saturating_sub(x.0) as f64 / total * 1000.0).round() / 10.0
        })
        .collect();
    let secs = Some(b.duration_s).filter(|&s| s > 0.0).unwrap_or(elapsed);
    let pps = |x: u64| (x as f64 / secs).round() as u64;
    let missteered: u64 = workers.iter().filter_map(|w| w.missteered).sum();
    let drops: u64 = workers.iter().map(|w| w.socket_drops).sum();
    let qdrops_total: Option<u64> = qdrops.as_ref().map(|q| q.values().sum());
    // Where the datagrams the server never saw went, as far as counters show: its sockets'
    // and CPU queues' drops, its interface's, and frames the client's interface sent that
    // the server's never received.
    let lost = prog_sent.saturating_sub(seen);
    let counted = drops
        + qdrops_total.unwrap_or(0)
        + iface_rx_dropped.unwrap_or(0)
        + iface_sent
            .zip(iface_rx)
            .map_or(0, |(s, r)| s.saturating_sub(r));
    let unexplained = lost.saturating_sub(counted);

    // The checks: what must add up.
    let mut problems = Vec::new();
    if unplaced > 0 {
        problems.push(format!(
            "{unplaced} of the client's flows carry no queue: the placement did not happen"
        ));
    }
    if echo && back.is_none() {
        problems.push("the client took echoes but reported no count of them".into());
    }
    let back = back.unwrap_or(0);
    if let Some(rx) = iface_rx {
        if seen > rx {
            problems.push(format!(
                "the server program saw {seen} datagrams but its interface received only {rx}"
            ));
        }
    }
    if let Some(sent) = iface_sent {
        if sent < prog_sent {
            problems.push(format!(
                "the client says it sent {prog_sent} but its interface sent {sent}"
            ));
        }
    }
    if echo && back > echoed {
        problems.push(format!(
            "the client got {back} echoes back but the server echoed only {echoed}"
        ));
    }
    if echo && echoed > seen {
        problems.push(format!(
            "the server echoed {echoed} of {seen} datagrams seen"
        ));
    }
    // Mixed flows: a reassembled datagram is finished on the CPU its fragments were steered
    // to (by the 2-tuple), so under CPU steering it may land on another worker than its
    // flow's (the experiment's finding, bounded by the fragmented ones); under hash steering
    // it reaches its bucket's worker from that CPU (a hand-off the detector counts as
    // missteered, bounded the same way). Whole datagrams must do neither.
    let hash = srv.steering == flowlane_io::udp::Steering::HashBpf.name();
    let fragmented_seen = frags.as_ref().map_or(0, |f| f.server_fragmented);
    let misplaced_allowed = if hash { 0 } else { fragmented_seen };
    if misplaced > misplaced_allowed {
        if let Some((_, _, c)) = &t.lab {
            problems.push(format!(
                "{misplaced} datagrams landed on a worker other than their bucket's (steering: \
                 {}, server {}; {fragmented_seen} arrived fragmented)",
                c.steer.name(),
                srv.steering
            ));
        }
    }
    let missteered_allowed = if hash { fragmented_seen } else { 0 };
    if missteered > missteered_allowed {
        problems.push(format!(
            "{missteered} datagrams reached a worker after the kernel processed them on another \
             CPU ({missteered_allowed} could: reassembled ones handed to their bucket's worker)"
        ));
    }
    if let Some(f) = &frags {
        if (f.client_frag_oks, f.client_frag_creates) != (f.sent_datagrams, f.sent_fragments) {
            problems.push(format!(
                "the client says it sent {} datagrams as {} fragments; its kernel fragmented {} \
                 into {} (FragOKs, FragCreates)",
                f.sent_datagrams, f.sent_fragments, f.client_frag_oks, f.client_frag_creates
            ));
        }
        if f.server_fragmented > f.server_reasm_oks || f.server_reasm_oks > f.sent_datagrams {
            problems.push(format!(
                "fragmented datagrams: {} sent, {} made whole by the server's kernel (ReasmOKs), \
                 {} received by its workers — each must be at most the one before",
                f.sent_datagrams, f.server_reasm_oks, f.server_fragmented
            ));
        }
        if lost == 0
            && (f.server_reasm_oks, f.server_fragmented) != (f.sent_datagrams, f.sent_datagrams)
        {
            problems.push(format!(
                "nothing was lost, yet of {} fragmented datagrams the server's kernel made {} \
                 whole and its workers got {} of them fragmented",
                f.sent_datagrams, f.server_reasm_oks, f.server_fragmented
            ));
        }
    }
    if unexplained > 0 {
        problems.push(format!(
            "{unexplained} of {lost} datagrams lost where no counter shows: the server's socket \
             drops ({drops}), CPU queue drops ({}), interface drops ({}) and link loss account \
             for {counted}",
            qdrops_total.map_or("not measured".into(), |q| q.to_string()),
            iface_rx_dropped.map_or("not measured".into(), |q| q.to_string()),
        ));
    }
    for e in &srv.errors {
        problems.push(format!("server worker {} stopped: {}", e.worker, e.error));
    }
    for e in &b.errors {
        problems.push(format!("client sender {} stopped: {}", e.worker, e.error));
    }
    BenchStep {
        mode: if echo { "echo" } else { "sink" }.into(),
        buckets: k,
        flows: b.flows.len(),
        client_threads: threads,
        duration_s: (secs * 1000.0).round() / 1000.0,
        five: Five {
            client_sent: iface_sent,
            server_received: iface_rx,
            server_seen: seen,
            server_echoed: echo.then_some(echoed),
            client_back: echo.then_some(back),
        },
        client_program_sent: prog_sent,
        // A fragmented datagram leaves as several frames: those are the program's too.
        link_other_frames: iface_sent.map(|sent| {
            let extra = frags
                .as_ref()
                .map_or(0, |f| f.sent_fragments.saturating_sub(f.sent_datagrams));
            sent.saturating_sub(prog_sent + extra)
        }),
        client_iface_back: if echo { iface_back } else { None },
        server_iface_rx_dropped: iface_rx_dropped,
        scaling_efficiency: None,
        pps: Pps {
            sent: pps(prog_sent),
            server_seen: pps(seen),
            echoed: echo.then(|| pps(echoed)),
            back: echo.then(|| pps(back)),
        },
        lost,
        lost_unexplained: unexplained,
        workers,
        misplaced,
        missteered,
        socket_drops: drops,
        queue_drops: qdrops_total,
        cpu_busy_pct: busy,
        kernel_cpus: Vec::new(),
        server_queues: Vec::new(),
        latency_ns: if echo { b.latency_ns.clone() } else { None },
        steering: srv.steering.clone(),
        reordered: if echo { b.reordered } else { None },
        fragments: frags,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{BenchMode, BenchTarget};
    use crate::Cause;

    /// A step whose server cannot bind (another socket holds the port) ends with that error,
    /// naming the cause — it must not wait for a start that never comes.
    #[test]
    fn a_server_that_cannot_start_ends_the_step_with_its_cause() {
        let holder = std::net::UdpSocket::bind("127.0.0.1:0").expect("hold a port");
        let to = holder.local_addr().expect("addr").to_string();
        let cpu = flowlane_io::os::current_cpu().unwrap_or(0);
        let cfg = BenchConfig {
            target: BenchTarget::Loopback {
                key: flowlane_rss::Key::MICROSOFT.to_hex(),
            },
            buckets: Some((1, 1)),
            mode: BenchMode::Sink,
            frame_bytes: 60,
            step_secs: 0.2,
            per_bucket: 1,
            rate: None,
            cpus: vec![cpu],
            serve_steering: crate::bench::ServeSteering::Cpu,
            fragments: None,
        };
        let t = Target {
            lab: None,
            to,
            cpus: vec![cpu],
            buckets: 1,
            key: flowlane_rss::Key::MICROSOFT.to_hex(),
            symmetric: flowlane_rss::Symmetric::Off,
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let stop = Arc::new(AtomicBool::new(false));
            let _ = tx.send(step(&cfg, &t, 1, (false, false), &stop));
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("the step ends instead of waiting forever");
        let e = r.expect_err("the port is taken");
        assert!(matches!(e.cause, Some(Cause::AddrInUse(_))), "{e:?}");
        drop(holder);
    }
}
