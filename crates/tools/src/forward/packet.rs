//! The reflectors with user-space workers, in the runtime's budgeted poll loop: AF_PACKET
//! (one pinned worker per CPU) and AF_XDP (one per receive queue).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::worker::bridge::{BridgeWorker, MacTable, PortCounters, XskBridgeWorker};
use super::worker::cache::RouteCache;
use super::worker::reflect::{ForwardSnapshot, ForwardStats, ReflectWorker, XskReflectWorker};
use super::worker::route::{PortInfo, RouteWorker, XskRouteWorker};
use crate::route::decide::FastSet;
use flowlane_io::{bpf, ebpf, frame, netdev, SysError};
use flowlane_runtime::Poll;
use flowlane_runtime::{Config, Runtime, StartError, StopRule};

use super::report::{BridgeSummary, CpuCounts, Drops, ForwardCounts, ForwardReport, ForwardTick};
use super::{dev_counters, ForwardEvent, ForwardStart, Job};
use crate::backend::Backend;
use crate::rings::RingMemory;
use crate::route::tables::{self as routes, LiveTables, NextHopFile, RouteSource};
use crate::ToolError;

fn counts(s: &ForwardSnapshot, cache: bool) -> ForwardCounts {
    ForwardCounts {
        flow_cache: cache.then_some(super::report::CacheCounts {
            lookups: s.cache_lookups,
            hits: s.cache_hits,
            stale: s.cache_stale,
            inserts: s.cache_inserts,
            expired: s.cache_expired,
            evicted: s.cache_evicted,
            gc_visited: s.cache_gc_visited,
        }),
        rx_packets: s.rx_packets,
        forwarded: s.forwarded,
        to_host: s.to_host,
        flooded: s.flooded,
        flood_copies: s.flood_copies,
        dropped: Drops {
            not_ip: s.not_ip,
            malformed: s.malformed,
            truncated: s.truncated,
            tx_full: s.tx_full,
            no_route: s.no_route,
            no_neighbour: s.no_neighbour,
            ttl_exceeded: s.ttl_exceeded,
            too_big: s.too_big,
            filtered: s.filtered,
            checksum_unfinished: 0,
        },
        ring_drops: s.ring_drops,
        checksum_completed: s.checksum_completed,
    }
}

/// The CPUs the workers are pinned to: as configured, else every usable one.
fn worker_cpus(job: &Job<'_>) -> Result<Vec<usize>, ToolError> {
    let set = flowlane_runtime::cpus::CpuSet::current();
    let cpus = job.cfg.cpus.clone().unwrap_or_else(|| set.usable());
    if cpus.is_empty() {
        return Err(ToolError::usage("no CPU for a forwarding worker"));
    }
    set.check(&cpus)
        .map_err(|e| ToolError::usage(e.to_string()))?;
    Ok(cpus)
}

/// Who can fix a forwarding worker that could not open its rings.
fn start_error(e: StartError<SysError>) -> ToolError {
    crate::error::start_error(e, |err, m| {
        crate::error::denied_open(
            err,
            m,
            "the forwarder needs CAP_NET_RAW (run as root or grant the capability)",
        )
    })
}

/// AF_PACKET: one worker per CPU, each with a receive ring in one fanout group (by CPU) and
/// a transmit ring.
pub(super) fn run(
    job: &Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let swap = job.swap;
    let cpus = worker_cpus(job)?;
    let before = vec![dev_counters(job.dev)];
    // Reflect has one port: its rings.
    let (rt, rings) = start_ports(job, &cpus, stop, false, move |mut rings| {
        let (rx, tx, _) = rings.remove(0);
        ReflectWorker::new(rx, tx, swap)
    })?;
    let on = Started {
        cpus: &cpus,
        before: &before,
        rings: Some(rings),
    };
    session(job, rt, &on, stop, &mut |_| {}, on_event)
}

/// AF_XDP: one worker per receive queue (pinned to the configured CPUs in turn), each with
/// its queue's socket and UMEM; a generated XDP program redirects each queue's frames to its
/// socket through an XSKMAP, attached once every socket is in the map.
pub(super) fn run_xdp_sockets(
    job: &Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let (dev, swap) = (job.dev, job.swap);
    let cpus = worker_cpus(job)?;
    let ifindex = job.ifindex;
    let queues = job.backend.rx_queues.unwrap_or(1).max(1);
    let bpf_err = |what: &str, e: String| ToolError::runtime(format!("{what}: {e}"));
    let map = Arc::new(
        bpf::XskMap::create("fl_xsks", queues)
            .map_err(|e| bpf_err("cannot make the XSKMAP", e.to_string()))?,
    );
    // --not-ip pass: frames that are not IP go to the kernel (counted), the rest here.
    let passed = match job.cfg.mode.not_ip() {
        Some(super::NotIp::Pass) => Some(
            bpf::MappedArray::new("fl_passed", flowlane_io::os::possible_cpus() as u32)
                .map_err(|e| bpf_err("cannot make the counter map", e.to_string()))?,
        ),
        _ => None,
    };
    let insns = match &passed {
        Some(p) => ebpf::xsk_redirect_ip_program(map.raw_fd(), p.fd()),
        None => ebpf::xsk_redirect_program(map.raw_fd()),
    }
    .map_err(|e| ToolError::runtime(format!("the redirect does not assemble: {e:?}")))?;
    let prog = bpf::prog_load(bpf::PROG_XDP, "fl_xsk_redir", &insns)
        .map_err(|e| bpf_err("the kernel refused the redirect program", e.to_string()))?;
    // Worker q serves queue q, on the configured CPUs in turn.
    let worker_cpus: Vec<usize> = (0..queues as usize).map(|q| cpus[q % cpus.len()]).collect();
    let before = vec![dev_counters(dev)];
    let map2 = map.clone();
    let rt = Runtime::start(
        &Config::frames(worker_cpus.clone()),
        stop.clone(),
        move |idx, _| {
            let xsk = frame::Xsk::open(ifindex, idx as u32, 4096, 4096)?;
            map2.set(idx as u32, &xsk)?;
            Ok::<_, SysError>(XskReflectWorker::new(xsk, swap))
        },
    )
    .map_err(start_error)?;
    let _link = crate::backend::attach_native(&prog, ifindex, dev, "redirect program")?;
    let on = Started {
        cpus: &worker_cpus,
        before: &before,
        rings: None,
    };
    let mut r = session(job, rt, &on, stop, &mut |_| {}, on_event)?;
    // What the program passed to the kernel was looked at there, never by a worker.
    let passed = passed.map_or(0, |m| (0..m.entries()).map(|i| m.get(i)).sum());
    r.total.rx_packets += passed;
    r.total.dropped.not_ip += passed;
    Ok(r)
}

/// The router's tables as the job names them; for kernel routes followed (`follow`), the
/// monitor, opened before the table is read so no change falls between the two.
pub(super) fn load_tables(
    job: &Job<'_>,
    follow: bool,
    stop: &AtomicBool,
) -> Result<(routes::Loaded, Option<netdev::RouteMonitor>), ToolError> {
    let (source, next_hops) = match &job.cfg.mode {
        super::Mode::Route {
            routes, next_hops, ..
        } => (routes.clone(), next_hops.clone()),
        _ => (RouteSource::Kernel, None),
    };
    let file = match &next_hops {
        Some(p) => {
            let text =
                crate::input::read_text("--next-hops", p, crate::input::NEXT_HOPS, Some(stop))?;
            Some(
                NextHopFile::parse(&text)
                    .map_err(|e| ToolError::usage(format!("--next-hops {}: {e}", p.display())))?,
            )
        }
        None => None,
    };
    let monitor = match source {
        RouteSource::Kernel if follow => Some(netdev::RouteMonitor::open().map_err(|e| {
            ToolError::runtime(format!("cannot follow the kernel's route changes: {e}"))
        })?),
        _ => None,
    };
    Ok((
        routes::load(&source, file.as_ref(), &job.ports, Some(stop))?,
        monitor,
    ))
}

/// Route over AF_PACKET: the tables loaded once (in this thread's namespace), then one worker
/// per CPU with a receive ring on every port (one fanout group per port, by CPU) and a
/// transmit ring on every port. Each second the neighbour table is read again, so a gateway
/// resolved later starts forwarding.
pub(super) fn run_route(
    mut job: Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let (loaded, monitor) = load_tables(&job, true, stop)?;
    job.routes = Some(loaded.summary.clone());
    let mut live = LiveTables::new(loaded, monitor);
    let tables = live.tables();
    let before: Vec<_> = job.ports.iter().map(|p| dev_counters(&p.0)).collect();
    let own = live.next_hops().local.clone();
    let cache_flows = match &job.cfg.mode {
        super::Mode::Route { flow_cache, .. } => *flow_cache,
        _ => None,
    };
    // Checked here (a usage error); each worker then makes its own.
    if let Some(n) = cache_flows {
        RouteCache::new(n).map_err(ToolError::usage)?;
    }
    let cache = move || cache_flows.and_then(|n| RouteCache::new(n).ok());
    let (rt, mut attached, cpus, rings) = if job.cfg.backend == Backend::AfXdp {
        let (rt, attached, cpus) = start_xsk_groups(&job, stop, Some(&own), move |group, info| {
            XskRouteWorker::new(group, info, tables.clone(), cache())
        })?;
        (rt, attached, cpus, None)
    } else {
        let cpus = worker_cpus(&job)?;
        let (rt, rings) = start_ports(&job, &cpus, stop, false, move |rings| {
            RouteWorker::new(rings, tables.clone(), cache())
        })?;
        (rt, Attached::default(), cpus, Some(rings))
    };
    let mut upkeep_error = None;
    let mut upkeep = |tick: &mut ForwardTick| {
        let began = std::time::Instant::now();
        // AF_XDP: the redirect programs pass frames to the host's own addresses to the
        // kernel; they learn an address gained or lost here.
        let kept = live.upkeep().and_then(|up| {
            if up.hops {
                attached.own(&live.next_hops().local)?;
            }
            Ok(up)
        });
        match kept {
            Ok(up) if up.any() => live.updated(began.elapsed(), false),
            Ok(_) => {}
            Err(e) => {
                upkeep_error.get_or_insert(e.to_string());
            }
        }
        tick.tables = Some(live.tick());
    };
    let on = Started {
        cpus: &cpus,
        before: &before,
        rings,
    };
    let mut r = session(&job, rt, &on, stop, &mut upkeep, on_event)?;
    r.routes = Some(live.summary());
    // AF_XDP: what the program left to the kernel (ARP, neighbour discovery, multicast) was
    // looked at there, never by a worker.
    let passed = attached.passed();
    r.total.rx_packets += passed;
    r.total.to_host += passed;
    if let Some(e) = upkeep_error {
        r.problems
            .push(format!("the tables could not be kept up to date: {e}"));
    }
    Ok(r)
}

/// Each port's facts, from the interface.
pub(super) fn port_infos(job: &Job<'_>) -> Result<Vec<(u32, PortInfo)>, ToolError> {
    job.ports
        .iter()
        .map(|(dev, ifindex)| {
            let mac = netdev::mac(dev)
                .ok_or_else(|| ToolError::usage(format!("{dev} has no MAC address")))?;
            Ok((
                *ifindex,
                PortInfo {
                    mac,
                    mtu: netdev::mtu(dev).unwrap_or(1500),
                },
            ))
        })
        .collect()
}

/// Starts one multi-port worker per CPU: each with a receive ring on every port (one fanout
/// group per port, by CPU; promiscuous where asked, for a bridge) and a transmit ring on
/// every port, handed to `make`; the rings share `--ring-memory` (what they map is returned).
fn start_ports<W: Poll<Stats = ForwardStats, Report = ()>>(
    job: &Job<'_>,
    cpus: &[usize],
    stop: &Arc<AtomicBool>,
    promiscuous: bool,
    make: impl Fn(Vec<(frame::RxRing, frame::TxRing, PortInfo)>) -> W + Send + Sync + 'static,
) -> Result<(Runtime<ForwardStats>, RingMemory), ToolError> {
    let ports = port_infos(job)?;
    // One fanout group per port and run (ids are per namespace).
    let base = (std::process::id() & 0xffff) as u16;
    // Room for a VLAN tag besides the Ethernet header.
    let max_frame = ports.iter().map(|p| p.1.mtu).max().unwrap_or(1500) + 18;
    // Per worker and port a receive and a transmit ring, from one budget.
    let n = cpus.len() * ports.len();
    let (rx_slot, tx_slot) = (frame::rx_slot_size(max_frame), max_frame + 32);
    let (geometry, memory) = crate::rings::plan(
        job.cfg.ring_memory,
        &[(n, rx_slot), (n, tx_slot)],
        RING_SLOTS,
        "--ring-memory",
    )?;
    let (rx_slots, tx_slots) = (geometry[0].slots, geometry[1].slots);
    let rt = Runtime::start(&Config::frames(cpus.to_vec()), stop.clone(), move |_, _| {
        let mut rings = Vec::new();
        for (i, (ifindex, info)) in ports.iter().enumerate() {
            let group = base.wrapping_add(i as u16);
            let rx = frame::RxRing::open_fanout(*ifindex, rx_slots, max_frame, group)?;
            if promiscuous {
                rx.set_promiscuous(*ifindex)?;
            }
            let tx = frame::TxRing::open(*ifindex, tx_slots, tx_slot, true)?;
            rings.push((rx, tx, *info));
        }
        Ok::<_, SysError>(make(rings))
    })
    .map_err(start_error)?;
    Ok((rt, memory))
}

/// Slots per AF_PACKET ring at most (fewer where the budget says so).
const RING_SLOTS: usize = 4096;

/// Per port, an XSKMAP of one entry per queue and the program redirecting each queue's frames
/// to its entry's socket; attached (native mode) once every socket is in its map.
struct Redirects {
    maps: Vec<Arc<bpf::XskMap>>,
    progs: Vec<std::os::fd::OwnedFd>,
    /// Route: frames the programs passed to the kernel, per CPU.
    passed: Option<bpf::MappedArray>,
    /// Route: the host's own addresses (their frames pass to the kernel), and what the set
    /// holds.
    own: Option<(bpf::AddrSet, FastSet<u128>)>,
}

/// Room for the host's own addresses in the router's redirect programs.
const OWN_ADDRESSES: u32 = 4096;

/// The redirect programs: for a router, unicast IP not to one of the host's addresses (`own`)
/// only (the rest, passed to the kernel, is counted); for a bridge, everything.
fn redirects(
    job: &Job<'_>,
    queues: u32,
    own: Option<&FastSet<u128>>,
) -> Result<Redirects, ToolError> {
    let bpf_err = |what: &str, e: String| ToolError::runtime(format!("{what}: {e}"));
    let passed = match job.cfg.mode.kind() {
        super::ForwardMode::Route => {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
            Some(
                bpf::MappedArray::new("fl_passed", cpus.max(64))
                    .map_err(|e| bpf_err("cannot make the counter map", e.to_string()))?,
            )
        }
        _ => None,
    };
    let own = match (&passed, own) {
        (Some(_), Some(addrs)) => {
            let set = bpf::AddrSet::create("fl_own", OWN_ADDRESSES)
                .map_err(|e| bpf_err("cannot make the own-address map", e.to_string()))?;
            let mut r = (set, FastSet::default());
            sync_own(&mut r, addrs)?;
            Some(r)
        }
        _ => None,
    };
    let mut r = Redirects {
        maps: Vec::new(),
        progs: Vec::new(),
        passed,
        own,
    };
    for _ in &job.ports {
        let map = bpf::XskMap::create("fl_xsks", queues)
            .map_err(|e| bpf_err("cannot make the XSKMAP", e.to_string()))?;
        let insns = match (&r.passed, &r.own) {
            (Some(p), Some(o)) => {
                ebpf::xsk_redirect_router_program(map.raw_fd(), p.fd(), o.0.raw_fd())
            }
            (Some(p), None) => ebpf::xsk_redirect_unicast_ip_program(map.raw_fd(), p.fd()),
            _ => ebpf::xsk_redirect_program(map.raw_fd()),
        }
        .map_err(|e| ToolError::runtime(format!("the redirect does not assemble: {e:?}")))?;
        let prog = bpf::prog_load(bpf::PROG_XDP, "fl_xsk_redir", &insns)
            .map_err(|e| bpf_err("the kernel refused the redirect program", e.to_string()))?;
        r.maps.push(Arc::new(map));
        r.progs.push(prog);
    }
    Ok(r)
}

/// Brings the own-address set `own` (the map and what it holds) to `now`.
fn sync_own(own: &mut (bpf::AddrSet, FastSet<u128>), now: &FastSet<u128>) -> Result<(), ToolError> {
    let (set, held) = own;
    let fail = |e: SysError| ToolError::runtime(format!("the own-address map: {e}"));
    for &k in held.difference(now) {
        set.remove(k.to_be_bytes()).map_err(fail)?;
    }
    for &k in now.difference(held) {
        set.insert(k.to_be_bytes()).map_err(fail)?;
    }
    held.clone_from(now);
    Ok(())
}

impl Redirects {
    /// Attaches each port's program in native mode; the links detach when dropped.
    fn attach(&self, job: &Job<'_>) -> Result<Vec<std::os::fd::OwnedFd>, ToolError> {
        job.ports
            .iter()
            .zip(&self.progs)
            .map(|((dev, ifindex), prog)| {
                crate::backend::attach_native(prog, *ifindex, dev, "redirect program")
            })
            .collect()
    }
}

/// The receive queues every port has (the fewest of them).
fn common_queues(job: &Job<'_>) -> u32 {
    job.ports
        .iter()
        .filter_map(|(dev, _)| flowlane_io::frame::Capabilities::probe(dev).ok()?.queues)
        .map(|q| q.0)
        .min()
        .unwrap_or(1)
        .max(1)
}

/// Starts one AF_XDP worker per receive queue (on the configured CPUs in turn), each with a
/// socket on every port over one UMEM, handed to `make`; then attaches the redirects. The
/// runtime, the links (keep them while it runs) and each worker's CPU.
#[allow(clippy::type_complexity)]
fn start_xsk_groups<W: Poll<Stats = ForwardStats, Report = ()>>(
    job: &Job<'_>,
    stop: &Arc<AtomicBool>,
    own: Option<&FastSet<u128>>,
    make: impl Fn(frame::XskGroup, Vec<PortInfo>) -> W + Send + Sync + 'static,
) -> Result<(Runtime<ForwardStats>, Attached, Vec<usize>), ToolError> {
    let cpus = worker_cpus(job)?;
    let queues = common_queues(job);
    let red = redirects(job, queues, own)?;
    let infos: Vec<PortInfo> = port_infos(job)?.into_iter().map(|p| p.1).collect();
    let ifindexes: Vec<u32> = job.ports.iter().map(|p| p.1).collect();
    let worker_cpus: Vec<usize> = (0..queues as usize).map(|q| cpus[q % cpus.len()]).collect();
    let maps = red.maps.clone();
    let rt = Runtime::start(
        &Config::frames(worker_cpus.clone()),
        stop.clone(),
        move |idx, _| {
            let q = idx as u32;
            let at: Vec<(u32, u32)> = ifindexes.iter().map(|&i| (i, q)).collect();
            // Frames for every port's share: 4096 per port.
            let group = frame::XskGroup::open(&at, 4096 * at.len() as u32, 2048)?;
            for (i, map) in maps.iter().enumerate() {
                if let Some(fd) = group.raw_fd(i) {
                    map.set_raw(q, fd)?;
                }
            }
            Ok::<_, SysError>(make(group, infos.clone()))
        },
    )
    .map_err(start_error)?;
    let links = red.attach(job)?;
    Ok((
        rt,
        Attached {
            _links: links,
            passed: red.passed,
            own: red.own,
        },
        worker_cpus,
    ))
}

/// The redirect programs while attached, and what they passed to the kernel.
#[derive(Default)]
struct Attached {
    _links: Vec<std::os::fd::OwnedFd>,
    passed: Option<bpf::MappedArray>,
    own: Option<(bpf::AddrSet, FastSet<u128>)>,
}

impl Attached {
    /// The host's own addresses are `now` (a router's programs pass their frames to the
    /// kernel).
    fn own(&mut self, now: &FastSet<u128>) -> Result<(), ToolError> {
        match &mut self.own {
            Some(o) => sync_own(o, now),
            None => Ok(()),
        }
    }

    /// Frames the programs passed to the kernel.
    fn passed(&self) -> u64 {
        self.passed
            .as_ref()
            .map_or(0, |m| (0..m.entries()).map(|i| m.get(i)).sum())
    }
}

/// Bridge over AF_PACKET: one worker per CPU over every port (promiscuous), one MAC table
/// shared by all, aged each interval.
pub(super) fn run_bridge(
    job: Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let ageing = match job.cfg.mode {
        super::Mode::Bridge { ageing_s } => ageing_s,
        _ => 300,
    };
    let table = Arc::new(MacTable::new(64 * 1024));
    let counts: Arc<[PortCounters]> = job.ports.iter().map(|_| PortCounters::default()).collect();
    let before: Vec<_> = job.ports.iter().map(|p| dev_counters(&p.0)).collect();
    let (t2, c2) = (table.clone(), counts.clone());
    let (rt, _attached, cpus, rings) = if job.cfg.backend == Backend::AfXdp {
        let (rt, attached, cpus) = start_xsk_groups(&job, stop, None, move |group, _| {
            XskBridgeWorker::new(group, t2.clone(), c2.clone())
        })?;
        (rt, attached, cpus, None)
    } else {
        let cpus = worker_cpus(&job)?;
        let (rt, rings) = start_ports(&job, &cpus, stop, true, move |rings| {
            BridgeWorker::new(rings, t2.clone(), c2.clone())
        })?;
        (rt, Attached::default(), cpus, Some(rings))
    };
    let start = std::time::Instant::now();
    let mut aged = 0;
    let mut upkeep = |_: &mut ForwardTick| {
        aged += table.age(start.elapsed().as_secs() as u32 + 1, ageing);
    };
    let on = Started {
        cpus: &cpus,
        before: &before,
        rings,
    };
    let mut r = session(&job, rt, &on, stop, &mut upkeep, on_event)?;
    for (p, c) in r.ports.iter_mut().zip(counts.iter()) {
        p.looked_at = Some(c.rx.load(std::sync::atomic::Ordering::Relaxed));
        p.queued = Some(c.tx.load(std::sync::atomic::Ordering::Relaxed));
    }
    let mut macs: Vec<(String, String)> = table
        .entries()
        .into_iter()
        .map(|(m, port)| {
            (
                flowlane_wire::Mac(m).to_string(),
                job.ports
                    .get(port as usize)
                    .map_or_else(|| port.to_string(), |p| p.0.clone()),
            )
        })
        .collect();
    macs.sort();
    r.bridge = Some(BridgeSummary {
        ageing_s: ageing,
        macs,
        aged_out: aged as u64,
    });
    Ok(r)
}

/// What a session starts from: the workers' CPUs, the interfaces' counters before, and what
/// AF_PACKET rings map.
struct Started<'a> {
    cpus: &'a [usize],
    before: &'a [(Option<u64>, Option<u64>)],
    rings: Option<RingMemory>,
}

/// Runs started workers to the end of the job and reports.
/// `each_tick` runs on the control thread after each interval (table upkeep), before the
/// tick goes out (it may add to it).
fn session(
    job: &Job<'_>,
    mut rt: Runtime<ForwardStats>,
    on: &Started<'_>,
    stop: &Arc<AtomicBool>,
    each_tick: &mut dyn FnMut(&mut ForwardTick),
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    on_event(ForwardEvent::Started(ForwardStart {
        backend: job.backend.clone(),
        routes: job.routes.clone(),
        rings: on.rings.clone(),
    }));
    let (cpus, before) = (on.cpus, on.before);
    let rule = StopRule {
        external: stop.clone(),
        deadline: job.duration,
    };
    let _metrics = job
        .cfg
        .metrics
        .map(|a| crate::metrics::Exporter::start(a, "forward", cpus, rt.stats()))
        .transpose()?;
    let cached = matches!(
        job.cfg.mode,
        super::Mode::Route {
            flow_cache: Some(_),
            ..
        }
    );
    let end = rt.session(Some(job.interval), &rule, &mut |t| {
        let mut tick = ForwardTick {
            elapsed_s: t.elapsed.as_secs_f64(),
            interval_s: t.interval.as_secs_f64(),
            delta: counts(&t.delta().role, cached),
            tables: None,
            device_refused: None,
        };
        each_tick(&mut tick);
        on_event(ForwardEvent::Tick(tick))
    });
    let cpus = cpus
        .iter()
        .zip(&end.finals)
        .map(|(&cpu, s)| {
            let counts = counts(&s.role, cached);
            CpuCounts {
                cpu,
                cpu_ns_per_packet: crate::ns_per(s.looped.cpu_ns, counts.rx_packets),
                counts,
            }
        })
        .collect();
    let total = end.total();
    let mut r = super::report::assemble(
        job,
        end.elapsed.as_secs_f64(),
        cpus,
        before,
        end.errors.into_iter().map(|e| e.1.to_string()).collect(),
    );
    r.pmu = crate::PmuCost::of(&total.looped, total.role.rx_packets, rt.pmu_unavailable());
    r.rings = on.rings.clone();
    Ok(r)
}
