//! `sink`: the receiving end of frame-mode traffic. An AF_PACKET RX ring on one interface (a
//! copy of every frame; the kernel's own path still runs), accounting flowlane traffic per
//! flow — received, lost, reordered, duplicated, one-way latency — and counting everything
//! else apart (malformed, foreign, other). [`run`] returns a [`SinkReport`].

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use flowlane_io::{frame, netdev, os, SysError};
use flowlane_runtime::{Config, Runtime, StartError, StopRule};

pub mod capture;
pub mod worker;

pub use capture::CaptureSpec;
use capture::{Capture, CaptureReport};
use serde::{Deserialize, Serialize};
use worker::{SinkReport as Book, SinkStop, SinkWorker};

use crate::backend::{self, Backend, BackendReport};
use crate::{Latency, ToolError};

/// The configuration of one `sink` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkConfig {
    /// Interface to receive on (in the caller's namespace).
    pub dev: String,
    /// Account only UDP to this destination port (others are `other`).
    pub port: Option<u16>,
    /// Stop after this many flowlane frames.
    pub count: Option<u64>,
    /// Stop after this many seconds.
    pub duration_s: Option<f64>,
    /// Stop once no frame came for this many seconds (after the first one).
    pub idle_s: Option<f64>,
    /// The CPU the sink is pinned to.
    pub cpu: usize,
    /// Slots in the receive ring.
    pub ring: usize,
    /// Seconds between status ticks.
    pub interval_s: f64,
    /// Serve the workers' counters in the OpenMetrics text format at this address while
    /// running (`--metrics`).
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Write the frames read (all, or a choice of them) to a pcap file (`--write`).
    #[serde(default)]
    pub write: Option<CaptureSpec>,
    /// How frames are read.
    #[serde(default)]
    pub backend: SinkBackend,
    /// AF_XDP: the CPUs of the queue workers, in turn (empty: `cpu`).
    #[serde(default)]
    pub cpus: Vec<usize>,
    /// AF_PACKET: bytes the receive ring may map (`--ring-memory`); `ring` is its most slots.
    #[serde(default = "default_ring_memory")]
    pub ring_memory: u64,
}

fn default_ring_memory() -> u64 {
    crate::rings::DEFAULT_BUDGET
}

/// How the sink reads frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SinkBackend {
    /// An AF_PACKET RX ring: a copy of every frame; the kernel's own path still runs.
    #[default]
    AfPacket,
    /// AF_XDP sockets, one worker per receive queue, an XDP program redirecting each queue's
    /// unicast IP frames to its socket: those are taken from the kernel (no skb is ever made);
    /// the rest (ARP, neighbour discovery, multicast) goes on to the kernel, counted.
    AfXdp,
}

impl SinkBackend {
    /// The name the CLI and the JSON use (`af-packet`, `af-xdp`).
    pub fn name(self) -> &'static str {
        match self {
            SinkBackend::AfPacket => "af-packet",
            SinkBackend::AfXdp => "af-xdp",
        }
    }

    /// The socket family in words (`AF_PACKET`, `AF_XDP`).
    pub fn family(self) -> &'static str {
        match self {
            SinkBackend::AfPacket => "AF_PACKET",
            SinkBackend::AfXdp => "AF_XDP",
        }
    }
}

/// What is known once the ring is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkStart {
    /// The interface's MTU.
    pub mtu: usize,
    /// AF_PACKET: what the ring maps.
    pub rings: Option<crate::rings::RingMemory>,
}

/// Counters over one status interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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

/// One flow as the sink saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkFlowReport {
    /// Flow id from the flowlane header.
    pub id: u16,
    /// Source `IP:PORT` of its frames.
    pub src: Option<String>,
    /// Destination `IP:PORT`.
    pub dst: Option<String>,
    /// Frames received (duplicates included).
    pub rx_packets: u64,
    /// Sequence numbers below the highest seen that never came.
    pub lost: u64,
    /// Frames that came below the highest sequence number already seen.
    pub reordered: u64,
    /// Frames seen twice or more.
    pub duplicates: u64,
    /// The highest sequence number seen.
    pub highest_seq: Option<u64>,
    /// AF_XDP: the receive queue this flow's frames came in on (a flow seen on several has
    /// a row per queue, its loss and order counted per queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<u32>,
    /// The length of its frames (bytes, FCS excluded) when all had one; absent for a mix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_bytes: Option<usize>,
}

/// The flows of one frame length together: one step of a size sweep (`blast --size
/// 60,508,1514` gives each step's flows ids of their own and one length each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkSizeReport {
    /// Frame bytes, FCS excluded.
    pub frame_bytes: usize,
    /// Flows whose frames all had this length (a flow seen on several AF_XDP queues counts
    /// once; its frames and losses are summed over the queues, as the totals are).
    pub flows: u64,
    /// Their frames received (duplicates included), lost, out of order and duplicated.
    pub rx_packets: u64,
    pub lost: u64,
    pub reordered: u64,
    pub duplicates: u64,
}

/// The flows grouped by frame length, when more than one length was seen (a sweep): one row
/// per length, in order; empty otherwise (and flows of mixed lengths are in no row).
pub fn by_size(flows: &[SinkFlowReport]) -> Vec<SinkSizeReport> {
    let mut rows: std::collections::BTreeMap<usize, SinkSizeReport> = Default::default();
    let mut ids = std::collections::BTreeSet::new();
    for f in flows {
        let Some(b) = f.frame_bytes else { continue };
        let r = rows.entry(b).or_insert(SinkSizeReport {
            frame_bytes: b,
            flows: 0,
            rx_packets: 0,
            lost: 0,
            reordered: 0,
            duplicates: 0,
        });
        r.flows += u64::from(ids.insert((b, f.id)));
        r.rx_packets += f.rx_packets;
        r.lost += f.lost;
        r.reordered += f.reordered;
        r.duplicates += f.duplicates;
    }
    if rows.len() < 2 {
        return Vec::new();
    }
    rows.into_values().collect()
}

/// What `sink` reports (`flowlane sink --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkReport {
    /// Frames the interface received (all of them, whatever they carry).
    pub rx_packets: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Frames of flowlane traffic.
    pub flowlane_packets: u64,
    /// Flowlane frames lost (gaps below each flow's highest sequence number).
    pub lost: u64,
    /// Flowlane frames out of order.
    pub reordered: u64,
    /// Flowlane frames seen twice or more.
    pub duplicates: u64,
    /// UDP to the watched port without a flowlane header.
    pub foreign: u64,
    /// Not IP/UDP, fragments, other ports.
    pub other: u64,
    /// Headers cut short or inconsistent, or a wrong UDP checksum.
    pub malformed: u64,
    /// Of the malformed, those with a wrong UDP checksum.
    pub bad_checksum: u64,
    /// Accounted frames whose UDP checksum was not filled in (sent from this host with
    /// checksum offload; seen so through AF_XDP), not judged.
    #[serde(default)]
    pub checksum_not_filled: u64,
    /// Frames longer than a ring slot.
    pub truncated: u64,
    /// Frames the kernel could not copy in because the ring was full (the sink was the limit).
    pub ring_drops: u64,
    /// Frames stamped after they arrived (the sender's clock is not this host's).
    pub clock_skew: u64,
    /// First to last frame, seconds.
    pub duration_s: f64,
    /// Frames per second over that window.
    pub rx_pps: f64,
    /// One-way latency: the header's transmit time against this host's clock.
    pub latency_ns: Option<Latency>,
    /// The whole latency distribution (nanoseconds) behind the percentiles, for `--histogram`
    /// (not in the JSON).
    #[serde(skip)]
    pub histogram: Option<hdrhistogram::Histogram<u64>>,
    /// The sink worker's CPU time per frame received (its thread's CPU clock over its loop),
    /// nanoseconds.
    #[serde(default)]
    pub cpu_ns_per_packet: Option<f64>,
    /// Per flow, by id.
    pub flows: Vec<SinkFlowReport>,
    /// Per frame length when the flows had more than one (the steps of a size sweep).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_size: Vec<SinkSizeReport>,
    /// The frame backend (AF_PACKET's receive ring), as asked of the kernel once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendReport>,
    /// What the capture file (`--write`) got: frames seen, written, cut to the snap length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureReport>,
    /// What each packet cost in cycles, instructions and cache misses, or why not known.
    #[serde(default)]
    pub pmu: crate::PmuCost,
    /// AF_XDP: frames the redirect program left to the kernel instead (not unicast IP: ARP,
    /// neighbour discovery, multicast, broadcast), its own count. The interface's received
    /// frames = `rx_packets` + `ring_drops` + this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_kernel: Option<u64>,
    /// AF_XDP: flows whose frames came in on more than one queue (each has a row per queue;
    /// loss and order are then per queue, not per flow).
    #[serde(default)]
    pub split_flows: u64,
    /// AF_PACKET: what the ring mapped, of what budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rings: Option<crate::rings::RingMemory>,
    /// Why the sink stopped early, if it did (the run's exit code is then 1).
    #[serde(default)]
    pub errors: Vec<String>,
}

impl SinkReport {
    /// A report of nothing received.
    pub fn empty() -> SinkReport {
        SinkReport {
            rx_packets: 0,
            rx_bytes: 0,
            flowlane_packets: 0,
            lost: 0,
            reordered: 0,
            duplicates: 0,
            foreign: 0,
            other: 0,
            malformed: 0,
            bad_checksum: 0,
            checksum_not_filled: 0,
            truncated: 0,
            ring_drops: 0,
            clock_skew: 0,
            duration_s: 0.0,
            rx_pps: 0.0,
            latency_ns: None,
            histogram: None,
            cpu_ns_per_packet: None,
            pmu: crate::PmuCost::default(),
            flows: Vec::new(),
            by_size: Vec::new(),
            backend: None,
            capture: None,
            to_kernel: None,
            split_flows: 0,
            rings: None,
            errors: Vec::new(),
        }
    }
}

/// Runs the sink until a stop rule holds or `stop` is set.
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
    let books: Vec<Arc<Mutex<Option<Book>>>> = worker_cpus
        .iter()
        .map(|_| Arc::new(Mutex::new(None)))
        .collect();
    let (port, slots) = (a.port, a.ring);
    let rt_cfg = Config {
        cpus: worker_cpus.clone(),
        budget: 256,
        wait_ms: 50,
        busy_poll: std::time::Duration::ZERO,
        own_files: false,
    };
    // Every worker is made the same way around its ring.
    let make = Maker {
        books: books.clone(),
        shares: shares.clone(),
        capture,
        timed,
        port,
        rules,
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
        .map_err(|e| start_error(e, &a.dev))?;
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
            Ok::<_, SysError>(make.worker(idx, frame::RxRing::open(ifindex, slots, max_frame)?))
        })
        .map_err(|e| start_error(e, &a.dev))?;
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
    let mut errors: Vec<String> = end.errors.into_iter().map(|e| e.1).collect();
    let got: Vec<Book> = books
        .iter()
        .filter_map(|b| b.lock().ok().and_then(|mut g| g.take()))
        .collect();
    if got.len() < books.len() {
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
    Ok(r)
}

/// What every sink worker is made with, whatever its ring.
struct Maker {
    books: Vec<Arc<Mutex<Option<Book>>>>,
    shares: Vec<flowlane_runtime::latency::LatencyShare>,
    capture: Mutex<Option<Capture>>,
    timed: bool,
    port: Option<u16>,
    rules: SinkStop,
}

impl Maker {
    /// Worker `idx` on `ring`: its book, its latency share, and the capture (the first
    /// worker to ask takes it).
    fn worker<R: flowlane_io::frame::FrameRx>(&self, idx: usize, ring: R) -> SinkWorker<R> {
        let book = self.books.get(idx).cloned().unwrap_or_default();
        let mut w = SinkWorker::new(ring, self.port, self.rules, book);
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

/// Who can fix a sink that could not start, and how.
fn start_error(e: StartError<SysError>, dev: &str) -> ToolError {
    match e {
        StartError::Open(ref err)
            if err.call == "bind(AF_XDP)"
                && err.source.kind() == std::io::ErrorKind::ResourceBusy =>
        {
            ToolError::usage(format!(
                "{e}: a receive queue of {dev} already has an AF_XDP socket (another sink or \
                 forwarder on this interface?): stop it, or read with --backend af-packet"
            ))
        }
        StartError::Open(ref err) if err.source.kind() == std::io::ErrorKind::PermissionDenied => {
            ToolError::privilege(format!(
                "{e}: the sink needs CAP_NET_RAW (AF_XDP: CAP_NET_ADMIN and CAP_BPF too; run as \
                 root or grant the capabilities)"
            ))
        }
        StartError::Pin { .. } => ToolError::usage(e.to_string()),
        _ => ToolError::runtime(e.to_string()),
    }
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
    for (q, r) in books.iter().enumerate() {
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
        cpu_ns_per_packet: None,
        pmu: crate::PmuCost::default(),
        by_size: by_size(&flows),
        flows,
        backend: Some(backend),
        capture: None,
        to_kernel: None,
        split_flows,
        rings: None,
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
        };
        let stop = Arc::new(AtomicBool::new(false));
        let e = run(&cfg, &stop, &mut |_| {}).expect_err("no interface");
        assert_eq!(e.kind, crate::ErrorKind::Usage);
        assert!(e.message.contains("fl-no-such-if"), "{e}");
    }
}
