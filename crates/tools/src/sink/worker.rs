//! The frame sink behind `flowlane sink --dev IFACE`: reads every frame an interface receives
//! (AF_PACKET RX ring), and accounts the flowlane traffic in it per flow — received, lost,
//! reordered, duplicated (from the header's sequence numbers) and one-way latency (the header's
//! transmit time against this host's CLOCK_MONOTONIC: sender and sink share the clock when they
//! run on one host, e.g. in two namespaces).
//!
//! [`SinkBook`] is the accounting alone (no I/O), so it can be fed crafted frames.

use std::net::SocketAddr;

use flowlane_flowtable::reasm::{Outcome, ReasmConfig, Reassembler};
use flowlane_io::frame::{self, FrameRx};
use flowlane_io::os;
use flowlane_wire::seq::SeqTracker;
use flowlane_wire::{FlowHeader, FragmentView, FrameError, HeaderError, UdpFrame};
use hdrhistogram::Histogram;

use super::capture::{Capture, CaptureReport};
use flowlane_flowtable::{Config as TableConfig, FlowKey, FlowTable, UDP};
use flowlane_runtime::{bump, counters, FlowBook, Poll, Recorded};
use std::hash::BuildHasher;

counters! {
    /// What a sink worker counts as it goes (the per-flow book is handed over at the end).
    pub struct SinkStats => SinkSnapshot {
        /// Frames read from the ring.
        rx_packets,
        /// Their bytes.
        rx_bytes,
        /// Frames the kernel dropped because the ring was full (`tp_drops`).
        ring_drops,
        /// Frames longer than a ring slot.
        truncated,
        /// Frames that do not parse or fail their UDP checksum.
        malformed,
        /// UDP frames without a flowlane header, or for another port.
        foreign,
        /// Frames written to the capture file (`--write`).
        captured,
    }
}

/// How far a frame's checksum can be trusted, as the ring reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    /// Compute and verify it.
    Verify,
    /// Already verified (by the driver), or not filled in yet (sent from this host with
    /// checksum offload): not verifiable from the bytes.
    Skip,
}

/// What the sink counted, over all frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct SinkCounts {
    /// Every frame read.
    pub frames: u64,
    /// Their bytes (FCS excluded).
    pub bytes: u64,
    /// Frames carrying a flowlane header (accounted per flow).
    pub flowlane: u64,
    /// UDP frames to the watched port without a flowlane header (no magic, or too short).
    pub foreign: u64,
    /// Frames that are not the traffic watched: not IP, not UDP, IP fragments, or UDP to
    /// another port.
    pub other: u64,
    /// Frames whose headers are cut short or inconsistent (lengths, versions).
    pub malformed: u64,
    /// UDP frames with a wrong checksum (also not accounted per flow).
    pub bad_checksum: u64,
    /// UDP frames whose checksum field holds only the pseudo-header's sum (sent from this
    /// host with checksum offload; a reader without the kernel's word on it, AF_XDP, sees
    /// them so): accounted, their checksum not judged.
    pub checksum_not_filled: u64,
    /// Frames longer than a ring slot (cut short; counted, not parsed).
    pub truncated: u64,
    /// Flowlane frames stamped later than they were read (clocks differ: not one host).
    pub clock_skew: u64,
    /// Frames that were IP fragments of UDP datagrams, given to the reassembler (its counts
    /// say where each ended); a datagram made whole is then counted as a frame would be
    /// (flowlane, foreign, other, malformed).
    pub fragments: u64,
}

/// One flow as the sink saw it.
#[derive(Debug, Clone, Copy)]
pub struct SinkFlow<'a> {
    /// Source of its first frame.
    pub src: SocketAddr,
    /// Destination of its first frame.
    pub dst: SocketAddr,
    /// Sequence accounting.
    pub seq: &'a SeqTracker,
    /// The length of its frames (bytes, FCS excluded) when all had one (a step of a size
    /// sweep); `None` when they differed (a mix).
    pub frame_bytes: Option<usize>,
}

/// A flow whose frames had more than one length.
const MIXED: u32 = u32::MAX;

/// One 5-tuple's frames and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TupleCount {
    pub frames: u64,
    pub bytes: u64,
}

/// The 5-tuples a sink saw, in a bounded flow table (`flowlane-flowtable`): memory fixed at
/// the start, tuples idle longer than the spec's time expire, a new one beyond the capacity
/// evicts the least recently seen of its buckets. Every frame stays accounted: in a tuple
/// still held, or in the frames of those that expired or were evicted.
#[derive(Debug, Clone)]
pub struct Tuples {
    /// The table.
    pub table: FlowTable<TupleCount>,
    /// Tuples gone by expiry, and their frames.
    pub expired: (u64, u64),
    /// Tuples gone by eviction, and their frames.
    pub evicted: (u64, u64),
}

impl Tuples {
    /// A table as `spec` asks (a capacity of 0 or an idle time below 1 ms is refused).
    pub fn new(spec: &super::config::TupleSpec) -> Result<Tuples, String> {
        if !(spec.idle_s.is_finite() && spec.idle_s >= 0.001 && spec.idle_s <= 86_400.0) {
            return Err(format!(
                "a tuple's idle time of {} s: give 0.001 to 86400",
                spec.idle_s
            ));
        }
        let idle = (spec.idle_s * 1e9) as u64;
        let mut cfg = TableConfig::new(spec.capacity);
        // Ticks of a tenth of the idle time (1 to 100 ms): a tuple expires within 10 % of its
        // idle time (of 1 ms below 10 ms), and the table's clock runs 6 days at the least.
        cfg.tick_ns = (idle / 10).clamp(1_000_000, 100_000_000);
        cfg.timeouts_ns = [idle; flowlane_flowtable::CLASSES];
        // A seed of this process's own: tuples from the network cannot be aimed at buckets.
        cfg.seed = std::collections::hash_map::RandomState::new().hash_one(spec.capacity)
            ^ os::monotonic_ns();
        let table = FlowTable::new(&cfg).map_err(|e| format!("the tuple table: {e}"))?;
        Ok(Tuples {
            table,
            expired: (0, 0),
            evicted: (0, 0),
        })
    }

    /// Counts a frame of `bytes` from `src` to `dst` (UDP) at `now_ns`, expiring what is due.
    fn count(&mut self, src: SocketAddr, dst: SocketAddr, bytes: u64, now_ns: u64) {
        let Tuples {
            table,
            expired,
            evicted,
        } = self;
        table.expire(now_ns, |_, v, _| {
            expired.0 += 1;
            expired.1 += v.frames;
        });
        if let Some(key) = FlowKey::new(src.ip(), dst.ip(), src.port(), dst.port(), UDP) {
            let u = table.upsert(&key, now_ns);
            u.value.frames += 1;
            u.value.bytes += bytes;
            if let Some((_, gone)) = u.evicted {
                evicted.0 += 1;
                evicted.1 += gone.frames;
            }
        }
    }

    /// Frames in the tuples still held.
    pub fn live_frames(&self) -> u64 {
        self.table.iter().map(|(_, c)| c.frames).sum()
    }
}

/// The accounting of a sink: feed it frames, read the counts.
#[derive(Debug, Clone)]
pub struct SinkBook {
    port: Option<u16>,
    /// Totals.
    pub counts: SinkCounts,
    /// Per flow: sequence accounting, and one-way latency over all flows (the book blast's
    /// echo accounting keeps too).
    pub book: FlowBook,
    /// Per flow id: the addresses of its first frame (`None`: not seen).
    addrs: Vec<Option<(SocketAddr, SocketAddr)>>,
    /// Per flow id: the length of its frames ([`MIXED`] once two differed).
    lens: Vec<u32>,
    /// The 5-tuples of the flowlane frames.
    pub tuples: Tuples,
    /// IP reassembly of this worker's (its receive queue's) fragments.
    pub reasm: Reassembler,
    /// Per flow id: datagrams that came fragmented, and datagrams that arrived below the
    /// highest sequence number of the other kind (whole after fragmented or the reverse).
    frag_flows: Vec<FragFlow>,
}

/// A flow's fragmented datagrams.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FragFlow {
    /// Datagrams that came as fragments (and were made whole).
    pub fragmented: u64,
    /// Datagrams overtaken by one of the other kind: a whole one arriving below the highest
    /// sequence number a fragmented one had brought, or the reverse.
    pub reordered_across: u64,
    /// Highest sequence number + 1 seen whole, and fragmented (0: none).
    high: [u64; 2],
}

/// A reassembler with `spec`'s limits (a seed of its own: fragments come from the network).
pub fn reassembler(spec: &super::config::ReasmSpec) -> Result<Reassembler, String> {
    if !(spec.timeout_s.is_finite() && spec.timeout_s >= 0.001 && spec.timeout_s <= 3600.0) {
        return Err(format!(
            "a reassembly timeout of {} s: give 0.001 to 3600",
            spec.timeout_s
        ));
    }
    if spec.max_fragments < 2 || spec.contexts == 0 || spec.bytes < 1500 {
        return Err(
            "reassembly needs at least 1 context, 1500 bytes and 2 fragments a datagram".into(),
        );
    }
    Reassembler::new(&ReasmConfig {
        contexts: spec.contexts,
        bytes: spec.bytes,
        max_fragments: spec.max_fragments,
        timeout_ns: (spec.timeout_s * 1e9) as u64,
        seed: std::collections::hash_map::RandomState::new().hash_one(spec.contexts)
            ^ os::monotonic_ns(),
    })
    .map_err(|e| format!("the reassembler: {e}"))
}

/// An address's bytes (4 or 16), as the checksum's pseudo-header takes them.
fn octets(a: std::net::IpAddr) -> Vec<u8> {
    match a {
        std::net::IpAddr::V4(v) => v.octets().to_vec(),
        std::net::IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// What one frame was, for the caller's live counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A flowlane frame, accounted.
    Flowlane,
    /// UDP to the watched port without the header.
    Foreign,
    /// Not the watched traffic.
    Other,
    /// Cut short, inconsistent or a bad checksum.
    Malformed,
    /// An IP fragment held for reassembly (or dropped by it: its counts say why).
    Fragment,
}

impl SinkBook {
    /// A book watching UDP to destination port `port` (`None`: any port), with the default
    /// tuple table.
    pub fn new(port: Option<u16>) -> SinkBook {
        let tuples = Tuples::new(&super::config::TupleSpec::default())
            .unwrap_or_else(|e| unreachable!("the default tuple table: {e}"));
        SinkBook::with_tuples(port, tuples)
    }

    /// A book counting 5-tuples in `tuples`.
    pub fn with_tuples(port: Option<u16>, tuples: Tuples) -> SinkBook {
        SinkBook {
            port,
            counts: SinkCounts::default(),
            book: FlowBook::open(),
            addrs: Vec::new(),
            lens: Vec::new(),
            tuples,
            reasm: Reassembler::new(&ReasmConfig::default())
                .unwrap_or_else(|e| unreachable!("the default reassembler: {e}")),
            frag_flows: Vec::new(),
        }
    }

    /// Reassembles with `reasm` (its limits) instead of the default.
    pub fn with_reasm(mut self, reasm: Reassembler) -> SinkBook {
        self.reasm = reasm;
        self
    }

    /// Per flow id: its fragmented datagrams (`None`: none came fragmented).
    pub fn frag_flow(&self, id: u16) -> Option<FragFlow> {
        self.frag_flows
            .get(usize::from(id))
            .copied()
            .filter(|f| f.fragmented > 0 || f.reordered_across > 0)
    }

    /// A fragment: into the reassembler; a datagram made whole is accounted as one frame
    /// would be (its UDP checksum verified over the whole).
    fn fragment(&mut self, data: &[u8], now_ns: u64) -> Verdict {
        let v = match FragmentView::parse(data) {
            Ok(v) => v,
            Err(_) => {
                self.counts.malformed += 1;
                return Verdict::Malformed;
            }
        };
        if v.proto != UDP {
            self.counts.other += 1;
            return Verdict::Other;
        }
        self.counts.fragments += 1;
        self.reasm.expire(now_ns);
        let d = match self.reasm.fragment(&v, now_ns) {
            Outcome::Complete(d) => d,
            Outcome::Held | Outcome::Dropped(_) => return Verdict::Fragment,
        };
        // The whole datagram: UDP header, then the payload, its checksum over all of it.
        let udp = d.data;
        let ulen = udp
            .get(4..6)
            .map_or(0, |l| usize::from(u16::from_be_bytes([l[0], l[1]])));
        if ulen < 8 || ulen > udp.len() {
            self.counts.malformed += 1;
            return Verdict::Malformed;
        }
        let port = |at: usize| u16::from_be_bytes([udp[at], udp[at + 1]]);
        let (src, dst) = (
            SocketAddr::new(d.src, port(0)),
            SocketAddr::new(d.dst, port(2)),
        );
        let ok = udp[6..8] == [0, 0] || {
            let (s, t) = (octets(d.src), octets(d.dst));
            let acc = flowlane_wire::checksum::pseudo_header(&s, &t, ulen as u32);
            flowlane_wire::checksum::fold(flowlane_wire::checksum::sum(&udp[..ulen], acc)) == 0xffff
        };
        // Counted as the frame it would have been whole (Ethernet and IP headers, no
        // options), so a fragmented flow's length reads as its sender's `--size`.
        let bytes = (ulen + if d.src.is_ipv4() { 34 } else { 54 }) as u64;
        // A copy: the datagram is a view of the reassembler's buffer, and the accounting
        // below borrows the whole book.
        let payload = udp[8..ulen].to_vec();
        self.datagram(src, dst, &payload, ok, bytes, true, now_ns)
    }

    /// Accounts one frame read at `now_ns` (CLOCK_MONOTONIC).
    pub fn frame(&mut self, data: &[u8], csum: Checksum, now_ns: u64) -> Verdict {
        self.counts.frames += 1;
        self.counts.bytes += data.len() as u64;
        let f = match UdpFrame::parse(data) {
            Ok(f) => f,
            Err(FrameError::Fragment) => return self.fragment(data, now_ns),
            Err(FrameError::NotIp(_) | FrameError::NotUdp(_)) => {
                self.counts.other += 1;
                return Verdict::Other;
            }
            Err(_) => {
                self.counts.malformed += 1;
                return Verdict::Malformed;
            }
        };
        let ok = match csum {
            Checksum::Skip => true,
            Checksum::Verify if f.checksum_ok(data) => true,
            // Sent from this host with checksum offload: not filled in, not corrupt.
            Checksum::Verify if f.checksum_partial(data) => {
                self.counts.checksum_not_filled += 1;
                true
            }
            Checksum::Verify => false,
        };
        self.datagram(
            f.src,
            f.dst,
            f.payload,
            ok,
            data.len() as u64,
            false,
            now_ns,
        )
    }

    /// A whole UDP datagram (`bytes` long as counted), from one frame or made whole from
    /// fragments.
    #[allow(clippy::too_many_arguments)]
    fn datagram(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
        checksum_ok: bool,
        bytes: u64,
        fragmented: bool,
        now_ns: u64,
    ) -> Verdict {
        if self.port.is_some_and(|p| p != dst.port()) {
            self.counts.other += 1;
            return Verdict::Other;
        }
        if !checksum_ok {
            self.counts.bad_checksum += 1;
            return Verdict::Malformed;
        }
        let h = match FlowHeader::read(payload) {
            Ok(h) => h,
            Err(HeaderError::Short(_) | HeaderError::Foreign) => {
                self.counts.foreign += 1;
                return Verdict::Foreign;
            }
        };
        self.counts.flowlane += 1;
        let i = usize::from(h.flow);
        if i >= self.addrs.len() {
            self.addrs.resize(i + 1, None);
            self.lens.resize(i + 1, 0);
        }
        self.addrs[i].get_or_insert((src, dst));
        let len = u32::try_from(bytes).unwrap_or(MIXED);
        if self.lens[i] == 0 {
            self.lens[i] = len;
        } else if self.lens[i] != len {
            self.lens[i] = MIXED;
        }
        if fragmented || self.frag_flows.len() > i {
            if self.frag_flows.len() <= i {
                self.frag_flows.resize(i + 1, FragFlow::default());
            }
            let ff = &mut self.frag_flows[i];
            let (mine, other) = (usize::from(fragmented), usize::from(!fragmented));
            let seq = u64::from(h.seq) + 1;
            if ff.high[other] > seq {
                ff.reordered_across += 1;
            }
            ff.high[mine] = ff.high[mine].max(seq);
            ff.fragmented += u64::from(fragmented);
        }
        self.tuples.count(src, dst, bytes, now_ns);
        if self.book.record(h.flow, h.seq, h.tx_ns, now_ns) == Recorded::Skewed {
            self.counts.clock_skew += 1;
        }
        Verdict::Flowlane
    }

    /// Flows that saw at least one frame, with their ids.
    pub fn seen_flows(&self) -> impl Iterator<Item = (u16, SinkFlow<'_>)> {
        self.addrs.iter().enumerate().filter_map(|(i, a)| {
            let (src, dst) = (*a)?;
            let id = u16::try_from(i).ok()?;
            Some((
                id,
                SinkFlow {
                    src,
                    dst,
                    seq: self.book.flow(id)?,
                    frame_bytes: self
                        .lens
                        .get(i)
                        .filter(|&&l| l != MIXED)
                        .map(|&l| l as usize),
                },
            ))
        })
    }

    /// One-way latency over all flows, ns.
    pub fn latency(&self) -> &Histogram<u64> {
        self.book.latency()
    }

    /// Totals over the flows: (received distinct, lost, reordered, duplicates). Lost is what
    /// is missing below each flow's highest sequence number (losses after a flow's last
    /// received frame cannot be seen by a sink).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        self.seen_flows().fold((0, 0, 0, 0), |t, (_, f)| {
            (
                t.0 + f.seq.unique,
                t.1 + f.seq.lost(None),
                t.2 + f.seq.reordered,
                t.3 + f.seq.duplicates,
            )
        })
    }
}

/// When a sink stops by itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct SinkStop {
    /// After this many flowlane frames.
    pub count: Option<u64>,
    /// At this CLOCK_MONOTONIC time (ns).
    pub deadline_ns: Option<u64>,
    /// After this long (ns) without a frame, once the first has come.
    pub idle_ns: Option<u64>,
}

/// What a sink hands over when its loop ends.
#[derive(Debug, Clone)]
pub struct SinkReport {
    /// The accounting.
    pub book: SinkBook,
    /// Frames the kernel could not put into the ring because it was full.
    pub ring_drops: u64,
    /// First and last frame read (CLOCK_MONOTONIC ns; 0 when none).
    pub window_ns: (u64, u64),
    /// What the capture file got, or why it could not be completed.
    pub capture: Option<Result<CaptureReport, String>>,
}

/// A sink worker on one interface's receive ring (any [`FrameRx`]).
#[derive(Debug)]
pub struct SinkWorker<R: FrameRx = frame::RxRing> {
    ring: R,
    book: SinkBook,
    stop: SinkStop,
    ring_drops: u64,
    window: (u64, u64),
    finished: bool,
    capture: Option<Capture>,
    latency: flowlane_runtime::latency::Publisher,
}

impl<R: FrameRx> SinkWorker<R> {
    /// Publishes the one-way latency histogram into `share` as it goes (`--metrics`).
    pub fn with_latency_share(
        mut self,
        share: flowlane_runtime::latency::LatencyShare,
    ) -> SinkWorker<R> {
        self.latency = flowlane_runtime::latency::Publisher::to(share);
        self
    }

    /// Reassembles with `reasm` (its limits).
    pub fn with_reasm(mut self, reasm: Reassembler) -> SinkWorker<R> {
        self.book = self.book.with_reasm(reasm);
        self
    }

    /// Writes the frames read (as `capture` chooses them) to its file too.
    pub fn with_capture(mut self, capture: Capture) -> SinkWorker<R> {
        self.capture = Some(capture);
        self
    }

    /// A worker reading `ring`, watching UDP port `port`, counting tuples in `tuples`.
    pub fn new(ring: R, port: Option<u16>, stop: SinkStop, tuples: Tuples) -> SinkWorker<R> {
        SinkWorker {
            ring,
            book: SinkBook::with_tuples(port, tuples),
            stop,
            ring_drops: 0,
            window: (0, 0),
            finished: false,
            capture: None,
            latency: flowlane_runtime::latency::Publisher::default(),
        }
    }

    /// Times only flows `lo..=hi` (every flow is still accounted).
    pub fn time_only(&mut self, lo: u16, hi: u16) {
        self.book.book.time_only(lo, hi);
    }

    fn check_done(&mut self, now: u64) {
        let s = &self.stop;
        if s.count.is_some_and(|c| self.book.counts.flowlane >= c)
            || s.deadline_ns.is_some_and(|d| now >= d)
            || s.idle_ns
                .is_some_and(|i| self.window.1 > 0 && now >= self.window.1.saturating_add(i))
        {
            self.finished = true;
        }
    }
}

impl<R: FrameRx> Poll for SinkWorker<R> {
    type Stats = SinkStats;
    type Report = SinkReport;

    fn drains(&self) -> bool {
        true
    }

    fn poll(
        &mut self,
        budget: usize,
        st: &SinkStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        let now = os::monotonic_ns();
        let mut n = 0;
        let (mut bytes, mut foreign, mut malformed, mut truncated) = (0u64, 0u64, 0u64, 0u64);
        let captured_before = self.capture.as_ref().map_or(0, |c| c.report().written);
        while n < budget {
            if self
                .stop
                .count
                .is_some_and(|c| self.book.counts.flowlane >= c)
            {
                break;
            }
            let Some(fr) = self.ring.next() else {
                break;
            };
            n += 1;
            bytes += fr.data.len() as u64;
            if let Some(c) = self.capture.as_mut() {
                c.offer(fr.ts_ns, fr.data, fr.wire_len, fr.vlan)?;
            }
            if fr.truncated() {
                truncated += 1;
                self.book.counts.frames += 1;
                self.book.counts.bytes += fr.data.len() as u64;
                self.book.counts.truncated += 1;
            } else {
                let csum = if fr.checksum_settled() {
                    Checksum::Skip
                } else {
                    Checksum::Verify
                };
                // The clock is read per frame: frames keep arriving while a round runs, and
                // one stamped after a round-start reading would look like it came from the
                // future (a high-rate sender made thousands of those per second).
                match self.book.frame(fr.data, csum, os::monotonic_ns()) {
                    Verdict::Foreign => foreign += 1,
                    Verdict::Malformed => malformed += 1,
                    Verdict::Flowlane | Verdict::Other | Verdict::Fragment => {}
                }
            }
            self.ring.release();
        }
        if n > 0 {
            if self.window.0 == 0 {
                self.window.0 = now;
            }
            self.window.1 = now;
            bump(&st.rx_packets, n as u64);
            bump(&st.rx_bytes, bytes);
            bump(&st.foreign, foreign);
            bump(&st.malformed, malformed);
            bump(&st.truncated, truncated);
            if let Some(c) = &self.capture {
                bump(&st.captured, c.report().written - captured_before);
            }
        }
        self.check_done(now);
        Ok(n)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        self.ring
            .wait(timeout_ms)
            .map(drop)
            .map_err(flowlane_runtime::WorkerError::from)
    }

    fn idle(&mut self, st: &SinkStats) {
        if let Ok(d) = self.ring.take_drops() {
            self.ring_drops += d;
            flowlane_runtime::set(&st.ring_drops, self.ring_drops);
        }
        self.check_done(os::monotonic_ns());
    }

    fn done(&self) -> bool {
        self.finished
    }

    fn publish(&mut self, last: bool) {
        if self.latency.wanted() {
            self.latency
                .offer(os::monotonic_ns(), last, self.book.latency());
        }
    }

    fn finish(&mut self, _st: &SinkStats) -> Option<SinkReport> {
        let capture = self.capture.as_mut().map(Capture::finish);
        Some(SinkReport {
            book: self.book.clone(),
            ring_drops: self.ring_drops,
            window_ns: self.window,
            capture,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowlane_wire::{Template, TemplateSpec};

    fn frame(flow: u16, seq: u32, tx_ns: u64, dport: u16) -> Vec<u8> {
        let t = Template::build(&TemplateSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan: None,
            src: SocketAddr::from(([198, 18, 0, 1], 1000 + flow)),
            dst: SocketAddr::from(([198, 18, 0, 2], dport)),
            frame_len: 60,
        })
        .expect("template");
        let mut b = t.bytes.clone();
        assert!(t.patch(&mut b, &FlowHeader { flow, seq, tx_ns }));
        b
    }

    /// A 400-byte datagram cut in pieces of 64, given in reverse: made whole, checked and
    /// accounted as the frame it was; a whole datagram of the same flow with a lower
    /// sequence number after it is reordered across; a piece with a flipped byte makes a
    /// whole datagram with a bad checksum.
    #[test]
    fn fragments_are_made_whole_and_accounted_like_frames() {
        let big = |seq: u32| {
            let t = Template::build(&TemplateSpec {
                src_mac: [2, 0, 0, 0, 0, 1],
                dst_mac: [2, 0, 0, 0, 0, 2],
                vlan: None,
                src: SocketAddr::from(([198, 18, 0, 1], 1000)),
                dst: SocketAddr::from(([198, 18, 0, 2], 9000)),
                frame_len: 400,
            })
            .expect("template");
            let mut b = t.bytes.clone();
            assert!(t.patch(
                &mut b,
                &FlowHeader {
                    flow: 0,
                    seq,
                    tx_ns: 1
                }
            ));
            b
        };
        let mut book = SinkBook::new(Some(9000));
        let pieces = flowlane_wire::fragment::split(&big(5), 64, 77).expect("cut");
        assert_eq!(pieces.len(), 6);
        for p in pieces.iter().rev() {
            book.frame(p, Checksum::Verify, 10);
        }
        assert_eq!((book.counts.flowlane, book.counts.fragments), (1, 6));
        book.frame(&big(4), Checksum::Verify, 20);
        let ff = book.frag_flow(0).expect("fragmented");
        assert_eq!((ff.fragmented, ff.reordered_across), (1, 1));
        assert_eq!(book.lens[0], 400, "as long as the whole frame");
        let mut bad = flowlane_wire::fragment::split(&big(6), 64, 78).expect("cut");
        let last = bad.len() - 1;
        let at = bad[last].len() - 1;
        bad[last][at] ^= 0xff;
        for p in &bad {
            book.frame(p, Checksum::Verify, 30);
        }
        assert_eq!(book.counts.bad_checksum, 1);
        let r = book.reasm.counts();
        assert!(r.balanced(), "{r:?}");
        assert_eq!((r.datagrams, r.datagram_fragments), (2, 12));
    }

    #[test]
    fn crafted_sequences_are_reported_exactly() {
        let mut book = SinkBook::new(Some(9000));
        // Flow 0: 0 1 3 2 4 4 6 (5 lost, 2 reordered, 4 duplicated); flow 1: in order.
        for s in [0, 1, 3, 2, 4, 4, 6] {
            assert_ne!(
                book.frame(&frame(0, s, 1_000, 9000), Checksum::Verify, 6_000),
                Verdict::Malformed
            );
        }
        for s in 0..5 {
            book.frame(&frame(1, s, 2_000, 9000), Checksum::Verify, 3_000);
        }
        let f0 = book.book.flow(0).expect("flow 0");
        assert_eq!(
            (f0.unique, f0.lost(None), f0.reordered, f0.duplicates),
            (6, 1, 1, 1)
        );
        assert_eq!(book.totals(), (11, 1, 1, 1));
        assert_eq!(book.counts.flowlane, 12);
        // One-way latency: 5 µs for flow 0's seven frames, 1 µs for flow 1's five.
        assert_eq!(book.latency().len(), 12);
        assert_eq!(book.latency().min(), 1_000);
        assert!(book.latency().max().abs_diff(5_000) <= 5);
    }

    #[test]
    fn a_checksum_left_to_offload_is_accounted_and_said_so() {
        let mut book = SinkBook::new(Some(9000));
        let mut f = frame(2, 0, 10, 9000);
        // What a sender with checksum offload leaves in the field: the pseudo-header's sum.
        let (l4, udp_len) = (34, (f.len() - 34) as u32);
        let pseudo = flowlane_wire::checksum::fold(flowlane_wire::checksum::pseudo_header(
            &f[26..30],
            &f[30..34],
            udp_len,
        ));
        f[l4 + 6..l4 + 8].copy_from_slice(&pseudo.to_be_bytes());
        assert_eq!(book.frame(&f, Checksum::Verify, 20), Verdict::Flowlane);
        assert_eq!(
            (book.counts.checksum_not_filled, book.counts.bad_checksum),
            (1, 0)
        );
        // Any other wrong value is still a bad checksum.
        f[l4 + 6] ^= 0x10;
        assert_eq!(book.frame(&f, Checksum::Verify, 20), Verdict::Malformed);
        assert_eq!(book.counts.bad_checksum, 1);
    }

    #[test]
    fn odd_frames_are_counted_never_accounted() {
        let mut book = SinkBook::new(Some(9000));
        let good = frame(3, 0, 10, 9000);
        // Another port, not UDP (ARP), cut short, a bad checksum, a payload without the magic.
        assert_eq!(
            book.frame(&frame(3, 1, 10, 53), Checksum::Verify, 20),
            Verdict::Other
        );
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(book.frame(&arp, Checksum::Verify, 20), Verdict::Other);
        assert_eq!(
            book.frame(&good[..40], Checksum::Verify, 20),
            Verdict::Malformed
        );
        let mut flipped = good.clone();
        flipped[42] ^= 0x40;
        assert_eq!(
            book.frame(&flipped, Checksum::Verify, 20),
            Verdict::Malformed
        );
        // Unverifiable checksums (offload) are not judged: the same frame is foreign then,
        // because the flip hit the magic.
        assert_eq!(book.frame(&flipped, Checksum::Skip, 20), Verdict::Foreign);
        // A clock that runs behind the sender's is counted, not recorded as latency.
        assert_eq!(book.frame(&good, Checksum::Verify, 5), Verdict::Flowlane);
        let c = book.counts;
        assert_eq!(
            (
                c.frames,
                c.other,
                c.malformed,
                c.bad_checksum,
                c.foreign,
                c.flowlane
            ),
            (6, 2, 1, 1, 1, 1)
        );
        assert_eq!(c.clock_skew, 1);
        assert_eq!(book.latency().len(), 0);
    }
}
