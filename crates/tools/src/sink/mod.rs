//! `sink`: the receiving end of frame-mode traffic. An AF_PACKET RX ring on one interface (a
//! copy of every frame; the kernel's own path still runs), accounting flowlane traffic per
//! flow — received, lost, reordered, duplicated, one-way latency — and counting everything
//! else apart (malformed, foreign, other). [`run`] returns a [`SinkReport`].

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use flowlane_io::{frame, netdev, os, SysError};
use flowlane_runtime::capture::{Capture, CaptureReport, CaptureSpec};
use flowlane_runtime::sink::{SinkReport as Book, SinkStop, SinkWorker};
use flowlane_runtime::{Config, Runtime, StartError, StopRule};
use serde::{Deserialize, Serialize};

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
}

/// What is known once the ring is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkStart {
    /// The interface's MTU.
    pub mtu: usize,
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
    /// The frame backend (AF_PACKET's receive ring), as asked of the kernel once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendReport>,
    /// What the capture file (`--write`) got: frames seen, written, cut to the snap length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureReport>,
    /// What each packet cost in cycles, instructions and cache misses, or why not known.
    #[serde(default)]
    pub pmu: crate::PmuCost,
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
            backend: None,
            capture: None,
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
    let backend = backend::choose(&a.dev, Backend::AfPacket)?;
    let secs = crate::seconds;
    let duration = a.duration_s.map(|d| secs("duration", d)).transpose()?;
    let idle = a.idle_s.map(|d| secs("idle time", d)).transpose()?;
    let interval = secs("interval", a.interval_s)?;
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
    let share = flowlane_runtime::latency::LatencyShare::new();
    let (share2, timed) = (share.clone(), a.metrics.is_some());
    let book: Arc<Mutex<Option<Book>>> = Arc::new(Mutex::new(None));
    let book2 = book.clone();
    let (port, slots) = (a.port, a.ring);
    // Room for a VLAN tag besides the Ethernet header.
    let max_frame = mtu + 18;
    let mut rt = Runtime::start(
        &Config {
            cpus: vec![a.cpu],
            budget: 256,
            wait_ms: 50,
        },
        stop.clone(),
        move |_, _| {
            let ring = frame::RxRing::open(ifindex, slots, max_frame)?;
            let mut w = SinkWorker::new(ring, port, rules, book2.clone());
            if timed {
                w = w.with_latency_share(share2.clone());
            }
            let c = capture.lock().ok().and_then(|mut c| c.take());
            Ok::<_, SysError>(match c {
                Some(c) => w.with_capture(c),
                None => w,
            })
        },
    )
    .map_err(|e| match e {
        StartError::Open(ref err) if err.source.kind() == std::io::ErrorKind::PermissionDenied => {
            ToolError::privilege(format!(
                "{e}: the sink needs CAP_NET_RAW (run as root or grant the capability)"
            ))
        }
        StartError::Pin { .. } => ToolError::usage(e.to_string()),
        _ => ToolError::runtime(e.to_string()),
    })?;
    on_event(SinkEvent::Started(SinkStart { mtu }));
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
                shares: vec![share.clone()],
            };
            crate::metrics::Exporter::start_with(m, "sink", &[a.cpu], rt.stats(), Some(latency))
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
    let Some(b) = book.lock().ok().and_then(|mut g| g.take()) else {
        let why = errors
            .first()
            .cloned()
            .unwrap_or_else(|| "no report".into());
        return Err(ToolError::runtime(format!("the sink stopped: {why}")));
    };
    let capture = match b.capture.clone() {
        Some(Ok(c)) => Some(c),
        Some(Err(e)) => {
            errors.push(e);
            None
        }
        None => None,
    };
    let mut r = report(&b, errors, backend);
    r.capture = capture;
    r.cpu_ns_per_packet = crate::ns_per(cpu_ns, r.rx_packets);
    r.pmu = crate::PmuCost::of(&looped, r.rx_packets, rt.pmu_unavailable());
    Ok(r)
}

fn report(r: &Book, errors: Vec<String>, backend: BackendReport) -> SinkReport {
    let c = &r.book.counts;
    let secs = r.window_ns.1.saturating_sub(r.window_ns.0) as f64 / 1e9;
    let (_, lost, reordered, duplicates) = r.book.totals();
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
        truncated: c.truncated,
        ring_drops: r.ring_drops,
        clock_skew: c.clock_skew,
        duration_s: (secs * 1000.0).round() / 1000.0,
        rx_pps: if secs > 0.0 {
            (c.frames as f64 / secs).round()
        } else {
            0.0
        },
        latency_ns: Latency::of(Some(r.book.latency()), "one-way"),
        histogram: Some(r.book.latency().clone()).filter(|h| !h.is_empty()),
        cpu_ns_per_packet: None,
        pmu: crate::PmuCost::default(),
        flows: r
            .book
            .seen_flows()
            .map(|(id, f)| SinkFlowReport {
                id,
                src: Some(f.src.to_string()),
                dst: Some(f.dst.to_string()),
                rx_packets: f.seq.unique + f.seq.duplicates,
                lost: f.seq.lost(None),
                reordered: f.seq.reordered,
                duplicates: f.seq.duplicates,
                highest_seq: f.seq.expected().checked_sub(1),
            })
            .collect(),
        backend: Some(backend),
        capture: None,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let stop = Arc::new(AtomicBool::new(false));
        let e = run(&cfg, &stop, &mut |_| {}).expect_err("no interface");
        assert_eq!(e.kind, crate::ErrorKind::Usage);
        assert!(e.message.contains("fl-no-such-if"), "{e}");
    }
}
