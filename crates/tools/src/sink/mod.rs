//! `sink`: the receiving end of frame-mode traffic. An AF_PACKET RX ring on one interface (a
//! copy of every frame; the kernel's own path still runs), accounting flowlane traffic per
//! flow — received, lost, reordered, duplicated, one-way latency — and counting everything
//! else apart (malformed, foreign, other). [`run`] returns a [`SinkReport`].

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use flowlane_io::{frame, netdev, os, SysError};
use flowlane_runtime::{Config, Runtime, StopRule};

pub mod capture;
mod config;
mod report;
pub mod worker;

pub use config::{ReasmSpec, SinkBackend, SinkConfig, TupleSpec};
pub use report::{
    by_size, FragmentReport, SinkFlowReport, SinkReport, SinkSizeReport, TupleReport,
};

use capture::Capture;
pub use capture::CaptureSpec;
use worker::{SinkReport as Book, SinkStop, SinkWorker};

use crate::backend::{self, Backend, BackendReport};
use crate::{Latency, ToolError};

/// What is known once the ring is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkStart {
    /// The interface's MTU.
    pub mtu: usize,
    /// AF_PACKET: what the ring maps.
    pub rings: Option<crate::rings::RingMemory>,
}

/// Counters over one status interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SinkTick {
    /// Seconds since the start.
    pub elapsed_s: f64,
    /// Seconds the interval lasted.
    pub interval_s: f64,
    /// Frames received in the interval.
    pub rx_packets: u64,
    /// Bytes received in the interval.
    pub rx_bytes: u64,
    /// Frames the ring had no room for, so far.
    pub ring_drops: u64,
    /// Malformed frames so far.
    pub malformed: u64,
    /// Foreign frames so far.
    pub foreign: u64,
}

/// Status from a running sink.
#[derive(Debug, Clone, PartialEq)]
pub enum SinkEvent {
    /// The ring is open: frames are counted from now on.
    Started(SinkStart),
    /// One interval's counters.
    Tick(SinkTick),
}

/// Runs the sink until a stop rule holds or `stop` is set.
///
/// Long: the start differs by backend (AF_XDP's socket map, redirect program and sockets, or
/// AF_PACKET's rings from the ring budget) and is written out in place; the watch and the
/// report follow in order.
pub fn run(
    a: &SinkConfig,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(SinkEvent),
) -> Result<SinkReport, ToolError> {
    let mtu = flowlane_io::netdev::mtu(&a.dev).ok_or_else(|| {
        ToolError::usage(format!(
            "no interface `{}` here (see `ip link`; in a namespace, run inside it)",
            a.dev
        ))
    })?;
    let ifindex =
        netdev::ifindex(&a.dev).map_err(|e| ToolError::usage(format!("{}: {e}", a.dev)))?;
    if a.count == Some(0) {
        return Err(ToolError::usage("--count must be at least 1"));
    }
    let xdp = a.backend == SinkBackend::AfXdp;
    if !xdp && !a.cpus.is_empty() {
        return Err(ToolError::usage(
            "--cpus places AF_XDP queue workers (--backend af-xdp); an AF_PACKET sink has one \
             worker: --cpu",
        ));
    }
    let backend = backend::choose(
        &a.dev,
        if xdp {
            Backend::AfXdp
        } else {
            Backend::AfPacket
        },
    )?;
    let secs = crate::seconds;
    let duration = a.duration_s.map(|d| secs("duration", d)).transpose()?;
    let idle = a.idle_s.map(|d| secs("idle time", d)).transpose()?;
    let interval = secs("interval", a.interval_s)?;
    // AF_XDP: a worker per receive queue, on the given CPUs in turn.
    let worker_cpus: Vec<usize> = if xdp {
        let cpus = if a.cpus.is_empty() {
            vec![a.cpu]
        } else {
            a.cpus.clone()
        };
        let queues = backend.rx_queues.unwrap_or(1).max(1) as usize;
        (0..queues).map(|q| cpus[q % cpus.len()]).collect()
    } else {
        vec![a.cpu]
    };
    if a.write.is_some() && worker_cpus.len() > 1 {
        return Err(ToolError::usage(format!(
            "--write keeps one capture: {} has {} receive queues, each its own AF_XDP worker \
             (use --backend af-packet to capture)",
            a.dev,
            worker_cpus.len()
        )));
    }
    // Room for a VLAN tag besides the Ethernet header.
    let max_frame = mtu + 18;
    // AF_XDP frames: a UMEM frame holds the frame after the kernel's 256 bytes of headroom.
    let xsk_frame = if max_frame + 256 <= 2048 { 2048 } else { 4096 };
    if xdp && max_frame + 256 > 4096 {
        return Err(ToolError::usage(format!(
            "{}'s MTU {mtu} is more than an AF_XDP frame holds (4096 with 256 of headroom): \
             use --backend af-packet",
            a.dev
        )));
    }
    // Made (and its spec checked) before any worker: each worker gets a copy.
    let tuples = worker::Tuples::new(&a.tuples).map_err(ToolError::usage)?;
    let reasm = worker::reassembler(&a.reasm).map_err(ToolError::usage)?;
    let shard = a.sharding.shard;
    if !shard.whole() && xdp {
        return Err(ToolError::usage(
            "--shard with --backend af-xdp: an interface takes one XDP program, so one AF_XDP \
             sink; shards of a receiver use --backend af-packet (each keeps its share of the \
             receive queues)",
        ));
    }
    a.sharding.check()?;
    let started = a.sharding.start(stop)?.filter(|_| a.sharding.asked());
    let start_ns = os::monotonic_ns();
    let rules = SinkStop {
        count: a.count,
        deadline_ns: duration.map(|d| start_ns.saturating_add(d.as_nanos() as u64)),
        idle_ns: idle.map(|d| d.as_nanos() as u64),
    };
    // The file is made before any thread starts: a path that cannot be written is the
    // caller's to fix.
    let capture = a
        .write
        .as_ref()
        .map(Capture::create)
        .transpose()
        .map_err(ToolError::usage)?;
    let capture = Mutex::new(capture);
    let shares: Vec<flowlane_runtime::latency::LatencyShare> = worker_cpus
        .iter()
        .map(|_| flowlane_runtime::latency::LatencyShare::new())
        .collect();
    let timed = a.metrics.is_some();
    let (port, slots) = (a.port, a.ring);
    let rt_cfg = Config::frames(worker_cpus.clone());
    // Every worker is made the same way around its ring.
    let make = Maker {
        timed_flows: a.timed_flows,
        shares: shares.clone(),
        capture,
        timed,
        port,
        rules,
        tuples,
        reasm,
    };
    let mut rings = None;
    let (mut rt, _redirect) = if xdp {
        let map = Arc::new(
            flowlane_io::bpf::XskMap::create("fl_sink_xsks", worker_cpus.len() as u32)
                .map_err(|e| ToolError::runtime(format!("cannot make the XSKMAP: {e}")))?,
        );
        // Unicast IP only: ARP, neighbour discovery, multicast and broadcast go on to the
        // kernel (counted), or a sender that must resolve this host's MAC never could.
        let passed = flowlane_io::bpf::MappedArray::new(
            "fl_sink_passed",
            flowlane_io::os::possible_cpus() as u32,
        )
        .map_err(|e| ToolError::runtime(format!("cannot make the counter map: {e}")))?;
        let insns = flowlane_io::ebpf::xsk_redirect_unicast_ip_program(map.raw_fd(), passed.fd())
            .map_err(|e| {
            ToolError::runtime(format!("the redirect does not assemble: {e:?}"))
        })?;
        let prog = flowlane_io::bpf::prog_load(flowlane_io::bpf::PROG_XDP, "fl_sink_redir", &insns)
            .map_err(|e| {
                ToolError::runtime(format!("the kernel refused the redirect program: {e}"))
            })?;
        let map2 = map.clone();
        let rt = Runtime::start(&rt_cfg, stop.clone(), move |idx, _| {
            let xsk = frame::Xsk::open(ifindex, idx as u32, slots as u32, xsk_frame)?;
            map2.set(idx as u32, &xsk)?;
            Ok::<_, SysError>(make.worker(idx, xsk))
        })
        .map_err(|e| crate::error::start_error(e, |err, m| open_error(err, m, &a.dev)))?;
        // Attached once every queue's socket is in the map: no frame is passed by for want
        // of one.
        let link = crate::backend::attach_native(&prog, ifindex, &a.dev, "redirect program")?;
        (rt, Some((link, map, passed)))
    } else {
        let (geometry, memory) = crate::rings::plan(
            a.ring_memory,
            &[(worker_cpus.len(), frame::rx_slot_size(max_frame))],
            slots,
            "--ring-memory",
        )?;
        let slots = geometry[0].slots;
        let rt = Runtime::start(&rt_cfg, stop.clone(), move |idx, _| {
            let ring = frame::RxRing::open(ifindex, slots, max_frame)?;
            if !shard.whole() {
                ring.keep_rx_queues(shard.index, shard.count)?;
            }
            Ok::<_, SysError>(make.worker(idx, ring))
        })
        .map_err(|e| crate::error::start_error(e, |err, m| open_error(err, m, &a.dev)))?;
        rings = Some(memory);
        (rt, None)
    };
    on_event(SinkEvent::Started(SinkStart {
        mtu,
        rings: rings.clone(),
    }));
    let rule = StopRule {
        external: stop.clone(),
        deadline: None,
    };
    let _metrics = a
        .metrics
        .map(|m| {
            let latency = crate::metrics::LatencyExport {
                what: "one_way_latency",
                help: "one-way latency of flowlane frames: the header's send time to this host's \
                       read",
                shares: shares.clone(),
            };
            crate::metrics::Exporter::start_with(m, "sink", &worker_cpus, rt.stats(), Some(latency))
        })
        .transpose()?;
    let end = rt.session(Some(interval), &rule, &mut |t| {
        let (d, cur) = (t.delta(), t.total());
        on_event(SinkEvent::Tick(SinkTick {
            elapsed_s: t.elapsed.as_secs_f64(),
            interval_s: t.interval.as_secs_f64(),
            rx_packets: d.role.rx_packets,
            rx_bytes: d.role.rx_bytes,
            ring_drops: cur.role.ring_drops,
            malformed: cur.role.malformed,
            foreign: cur.role.foreign,
        }))
    });
    let looped = end.total().looped;
    let cpu_ns = looped.cpu_ns;
    let mut errors: Vec<String> = end.errors.into_iter().map(|e| e.1.to_string()).collect();
    // Each worker's book comes back through the join.
    let workers = end.reports.len();
    let got: Vec<Book> = end.reports.into_iter().flatten().collect();
    if got.len() < workers {
        let why = errors
            .first()
            .cloned()
            .unwrap_or_else(|| "no report".into());
        return Err(ToolError::runtime(format!("the sink stopped: {why}")));
    }
    let mut capture = None;
    for b in &got {
        match b.capture.clone() {
            Some(Ok(c)) => capture = Some(c),
            Some(Err(e)) => errors.push(e),
            None => {}
        }
    }
    let mut r = report(&got, xdp, errors, backend);
    r.capture = capture;
    r.rings = rings;
    if let Some((_, _, passed)) = &_redirect {
        r.to_kernel = Some((0..passed.entries()).map(|i| passed.get(i)).sum());
    }
    r.cpu_ns_per_packet = crate::ns_per(cpu_ns, r.rx_packets);
    r.pmu = crate::PmuCost::of(&looped, r.rx_packets, rt.pmu_unavailable());
    r.latency_histogram = r
        .histogram
        .as_ref()
        .and_then(crate::report::encode_histogram);
    r.shard = started;
    Ok(r)
}

/// What every sink worker is made with, whatever its ring.
struct Maker {
    timed_flows: Option<(u16, u16)>,
    shares: Vec<flowlane_runtime::latency::LatencyShare>,
    capture: Mutex<Option<Capture>>,
    timed: bool,
    port: Option<u16>,
    rules: SinkStop,
    tuples: worker::Tuples,
    reasm: flowlane_flowtable::reasm::Reassembler,
}

impl Maker {
    /// Worker `idx` on `ring`: its book, its latency share, and the capture (the first
    /// worker to ask takes it).
    fn worker<R: flowlane_io::frame::FrameRx>(&self, idx: usize, ring: R) -> SinkWorker<R> {
        let mut w = SinkWorker::new(ring, self.port, self.rules, self.tuples.clone())
            .with_reasm(self.reasm.clone());
        if let Some((lo, hi)) = self.timed_flows {
            w.time_only(lo, hi);
        }
        if self.timed {
            if let Some(s) = self.shares.get(idx) {
                w = w.with_latency_share(s.clone());
            }
        }
        match self.capture.lock().ok().and_then(|mut c| c.take()) {
            Some(c) => w.with_capture(c),
            None => w,
        }
    }
}

/// Who can fix a sink worker that could not open its ring or socket, and how.
fn open_error(err: &SysError, message: String, dev: &str) -> ToolError {
    if err.call == "bind(AF_XDP)" && err.source.kind() == std::io::ErrorKind::ResourceBusy {
        return ToolError::usage(format!(
            "{message}: a receive queue of {dev} already has an AF_XDP socket (another sink or \
             forwarder on this interface?): stop it, or read with --backend af-packet"
        ));
    }
    crate::error::denied_open(
        err,
        message,
        "the sink needs CAP_NET_RAW (AF_XDP: CAP_NET_ADMIN and CAP_BPF too; run as root or \
         grant the capabilities)",
    )
}

/// One report from the workers' books (AF_XDP: one per receive queue, `per_queue`).
fn report(
    books: &[Book],
    per_queue: bool,
    errors: Vec<String>,
    backend: BackendReport,
) -> SinkReport {
    let mut c = worker::SinkCounts::default();
    let (mut lost, mut reordered, mut duplicates, mut ring_drops) = (0, 0, 0, 0);
    let mut window: Option<(u64, u64)> = None;
    let mut latency: Option<hdrhistogram::Histogram<u64>> = None;
    let mut flows = Vec::new();
    let mut tuples = report::TupleReport::default();
    let mut frags = report::FragmentReport::default();
    for (q, r) in books.iter().enumerate() {
        tuples.add(&r.book.tuples);
        frags.add(&r.book.reasm.counts());
        let k = &r.book.counts;
        c.frames += k.frames;
        c.bytes += k.bytes;
        c.flowlane += k.flowlane;
        c.foreign += k.foreign;
        c.other += k.other;
        c.malformed += k.malformed;
        c.bad_checksum += k.bad_checksum;
        c.checksum_not_filled += k.checksum_not_filled;
        c.truncated += k.truncated;
        c.clock_skew += k.clock_skew;
        let (_, l, o, d) = r.book.totals();
        (lost, reordered, duplicates) = (lost + l, reordered + o, duplicates + d);
        ring_drops += r.ring_drops;
        if r.window_ns.0 > 0 {
            window = Some(match window {
                Some((a, b)) => (a.min(r.window_ns.0), b.max(r.window_ns.1)),
                None => r.window_ns,
            });
        }
        match latency.as_mut() {
            Some(h) => {
                let _ = h.add(r.book.latency());
            }
            None => latency = Some(r.book.latency().clone()),
        }
        flows.extend(r.book.seen_flows().map(|(id, f)| SinkFlowReport {
            id,
            src: Some(f.src.to_string()),
            dst: Some(f.dst.to_string()),
            rx_packets: f.seq.unique + f.seq.duplicates,
            lost: f.seq.lost(None),
            reordered: f.seq.reordered,
            duplicates: f.seq.duplicates,
            highest_seq: f.seq.expected().checked_sub(1),
            queue: per_queue.then_some(q as u32),
            frame_bytes: f.frame_bytes,
            fragmented: r.book.frag_flow(id).map(|x| x.fragmented),
            reordered_across: r.book.frag_flow(id).map(|x| x.reordered_across),
        }));
    }
    flows.sort_by_key(|f| (f.id, f.queue));
    let split_flows = flows
        .windows(2)
        .filter(|w| w[0].id == w[1].id)
        .map(|w| w[0].id)
        .collect::<std::collections::BTreeSet<u16>>()
        .len() as u64;
    let (first, last) = window.unwrap_or((0, 0));
    let secs = last.saturating_sub(first) as f64 / 1e9;
    let latency = latency.filter(|h| !h.is_empty());
    SinkReport {
        host: None,
        rx_packets: c.frames,
        rx_bytes: c.bytes,
        flowlane_packets: c.flowlane,
        lost,
        reordered,
        duplicates,
        foreign: c.foreign,
        other: c.other,
        malformed: c.malformed + c.bad_checksum,
        bad_checksum: c.bad_checksum,
        checksum_not_filled: c.checksum_not_filled,
        truncated: c.truncated,
        ring_drops,
        clock_skew: c.clock_skew,
        duration_s: (secs * 1000.0).round() / 1000.0,
        rx_pps: if secs > 0.0 {
            (c.frames as f64 / secs).round()
        } else {
            0.0
        },
        latency_ns: Latency::of(latency.as_ref(), "one-way"),
        histogram: latency,
        latency_histogram: None,
        shard: None,
        cpu_ns_per_packet: None,
        pmu: crate::PmuCost::default(),
        by_size: by_size(&flows),
        flows,
        backend: Some(backend),
        capture: None,
        to_kernel: None,
        split_flows,
        rings: None,
        tuples: Some(tuples),
        fragments: (frags.fragments > 0).then_some(frags),
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(id: u16, queue: Option<u32>, frame_bytes: usize, rx: u64, lost: u64) -> SinkFlowReport {
        SinkFlowReport {
            id,
            src: None,
            dst: None,
            rx_packets: rx,
            lost,
            reordered: 0,
            duplicates: 0,
            highest_seq: None,
            queue,
            frame_bytes: Some(frame_bytes),
            fragmented: None,
            reordered_across: None,
        }
    }

    /// A flow whose frames came in on two AF_XDP queues has a row per queue; its size's row
    /// counts it once (it counted two flows), its frames and losses over both queues.
    #[test]
    fn a_flow_split_across_queues_is_one_flow_of_its_size() {
        let flows = [
            flow(1, Some(0), 60, 600, 1),
            flow(1, Some(1), 60, 400, 2),
            flow(2, Some(0), 60, 1000, 0),
            flow(3, Some(1), 1514, 500, 0),
        ];
        let rows = by_size(&flows);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(
            (
                rows[0].frame_bytes,
                rows[0].flows,
                rows[0].rx_packets,
                rows[0].lost
            ),
            (60, 2, 2000, 3)
        );
        assert_eq!((rows[1].frame_bytes, rows[1].flows), (1514, 1));
    }

    #[test]
    fn a_backends_name_is_the_one_its_json_uses() {
        for b in [SinkBackend::AfPacket, SinkBackend::AfXdp] {
            let json = serde_json::to_string(&b).expect("serialises");
            assert_eq!(json, format!("\"{}\"", b.name()));
            assert_eq!(b.family(), b.name().to_uppercase().replace('-', "_"));
        }
    }

    #[test]
    fn an_interface_that_is_not_here_is_a_usage_error() {
        let cfg = SinkConfig {
            sharding: Default::default(),
            timed_flows: None,
            reasm: Default::default(),
            metrics: None,
            dev: "fl-no-such-if".into(),
            port: None,
            count: None,
            duration_s: Some(1.0),
            idle_s: None,
            cpu: 0,
            ring: 64,
            interval_s: 1.0,
            write: None,
            backend: SinkBackend::AfPacket,
            cpus: Vec::new(),
            ring_memory: crate::rings::DEFAULT_BUDGET,
            tuples: TupleSpec::default(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let e = run(&cfg, &stop, &mut |_| {}).expect_err("no interface");
        assert_eq!(e.kind, crate::ErrorKind::Usage);
        assert!(e.message.contains("fl-no-such-if"), "{e}");
    }
}
