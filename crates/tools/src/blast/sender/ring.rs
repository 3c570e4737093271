//! The frame sender: whole frames built once per (flow, size) and patched per packet, on an
//! AF_PACKET TX ring or an AF_XDP socket — both through io's [`FrameTx`].

use flowlane_io::frame::{self, FrameTx};
use flowlane_io::{os, SysError};
use flowlane_wire::FlowHeader;

use super::BlastStats;
use super::{BlastError, BlastJob, BlastReport, ReplayFrame, TxBook};

/// A scheduled frame without a flow: sent as it is.
const NO_FLOW: u32 = u32::MAX;
use flowlane_runtime::Poll;

/// Where raw frames go and how they are addressed.
#[derive(Debug, Clone)]
pub struct RawLink {
    /// Interface index (in the worker's namespace).
    pub ifindex: u32,
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// 802.1Q tag, if any.
    pub vlan: Option<u16>,
    /// IPv4 TTL / IPv6 hop limit, where not the default 64.
    pub ttl: Option<u8>,
    /// The largest frame sent (FCS excluded): ring slots hold it.
    pub max_frame: usize,
    /// Skip the qdisc layer.
    pub qdisc_bypass: bool,
}

/// A sending worker on a frame ring (AF_PACKET TX ring or AF_XDP UMEM). Every (flow, size)
/// has a template frame, built once; a slot keeps the frame last written into it, so when it
/// comes round for the same (flow, size) again only the flowlane header is patched (with an
/// incremental UDP checksum update) — with one size and a flow count dividing the ring, that is
/// every time after the first lap.
#[derive(Debug)]
pub struct RingSender<T: FrameTx> {
    job: BlastJob,
    ring: T,
    /// `templates[flow * sizes + size]`, or a capture's frames in order.
    templates: Vec<flowlane_wire::Template>,
    /// A capture's order: per position, (template, flow or [`NO_FLOW`]); empty: round robin
    /// over the flows, each cycling through the sizes.
    schedule: Vec<(u32, u32)>,
    /// Per slot: the template index its frame was copied from (`u32::MAX`: none yet).
    slot_holds: Vec<u32>,
    seq: Vec<u64>,
    /// Frames queued by this worker (picks the flow: round robin).
    queued: u64,
    book: TxBook,
    finished: bool,
    /// Per-packet destinations (pktgen's ranges), written after the copy.
    spray: Option<super::spray::Sprayer>,
    /// Datagrams cut into fragments: how, and the fragments still to send of the last one
    /// cut (they leave before any new datagram).
    cut: Option<Cutter>,
    /// Per template: the fragments a datagram cut from it becomes (1: it fits one piece).
    frags_of: Vec<u32>,
}

/// A sender's fragmenting: the spec, the next IP id, the fragments waiting for slots.
#[derive(Debug)]
struct Cutter {
    spec: crate::blast::Fragmenting,
    /// Next id: this worker's ids are `w`, `w + n`, … (distinct from other workers').
    id: u32,
    step: u32,
    pending: std::collections::VecDeque<Vec<u8>>,
    rng: rand::rngs::SmallRng,
}

impl Cutter {
    /// Whether a flow's datagram `seq` is cut (an even share over its sequence).
    fn cuts(&self, seq: u64) -> bool {
        let share = self.spec.share.clamp(0.0, 1.0);
        ((seq + 1) as f64 * share).floor() > (seq as f64 * share).floor()
    }

    /// The frame's fragments in the order they leave (`None`: it fits one piece).
    fn cut(&mut self, frame: &[u8]) -> Option<Vec<Vec<u8>>> {
        use flowlane_wire::fragment as wf;
        let attack = self.spec.attack.map(crate::blast::FragAttack::wire);
        let ranges = wf::pieces(wf::ip_payload_len(frame)?, self.spec.piece, attack)?;
        let mut pieces = wf::split_ranges(frame, &ranges, self.id)?;
        self.id = self.id.wrapping_add(self.step);
        match self.spec.order {
            crate::blast::FragOrder::InOrder => {}
            crate::blast::FragOrder::Reverse => pieces.reverse(),
            crate::blast::FragOrder::OddEven => {
                let (odd, even): (Vec<_>, Vec<_>) = pieces
                    .into_iter()
                    .enumerate()
                    .partition(|(i, _)| i % 2 == 1);
                pieces = odd.into_iter().chain(even).map(|(_, p)| p).collect();
            }
            crate::blast::FragOrder::Random => {
                use rand::seq::SliceRandom;
                pieces.shuffle(&mut self.rng);
            }
        }
        Some(pieces)
    }
}

/// Opens an AF_PACKET TX ring for `link`.
pub fn packet_ring(link: &RawLink) -> Result<frame::TxRing, SysError> {
    frame::TxRing::open(link.ifindex, 2048, link.max_frame + 32, link.qdisc_bypass)
}

/// Opens an AF_XDP socket (copy mode) on `link`'s interface, queue `queue`.
pub fn xdp_socket(link: &RawLink, queue: u32) -> Result<frame::XskTx, SysError> {
    frame::XskTx::open(link.ifindex, queue, 4096, link.max_frame.max(2048))
}

impl<T: FrameTx> RingSender<T> {
    /// Builds every (flow, size) template once.
    pub fn new(job: BlastJob, link: &RawLink, ring: T) -> Result<RingSender<T>, BlastError> {
        let (templates, schedule) = if job.replay.is_empty() {
            (Self::build(&job, link)?, Vec::new())
        } else {
            Self::replay(&job)?
        };
        let mut ring = ring;
        let largest = templates.iter().map(|t| t.bytes.len()).max().unwrap_or(0);
        if ring.slot_buf(0).is_some_and(|b| b.len() < largest) {
            return Err(BlastError::Job(format!(
                "a {largest}-byte frame does not fit a ring slot"
            )));
        }
        let frags_of: Vec<u32> = templates
            .iter()
            .map(|t| {
                use flowlane_wire::fragment as wf;
                let Some((f, _, _)) = &job.fragments else {
                    return 1;
                };
                let attack = f.attack.map(crate::blast::FragAttack::wire);
                wf::ip_payload_len(&t.bytes)
                    .and_then(|len| wf::pieces(len, f.piece, attack))
                    .map_or(1, |r| r.len() as u32)
            })
            .collect();
        Ok(RingSender {
            book: TxBook::new(&job),
            seq: vec![0; job.flows.len()],
            slot_holds: vec![u32::MAX; ring.slots()],
            queued: 0,
            ring,
            templates,
            schedule,
            finished: false,
            spray: job
                .spray
                .clone()
                .map(|s| super::spray::Sprayer::new(s, job.flows.len())),
            frags_of,
            cut: job.fragments.clone().map(|(spec, w, n)| Cutter {
                spec,
                id: w,
                step: n.max(1),
                pending: Default::default(),
                rng: rand::SeedableRng::seed_from_u64(u64::from(w) + 1),
            }),
            job,
        })
    }

    /// A capture's frames as templates, and the order they leave in.
    #[allow(clippy::type_complexity)]
    fn replay(
        job: &BlastJob,
    ) -> Result<(Vec<flowlane_wire::Template>, Vec<(u32, u32)>), BlastError> {
        let mut templates = Vec::with_capacity(job.replay.len());
        let mut schedule = Vec::with_capacity(job.replay.len());
        for (i, r) in job.replay.iter().enumerate() {
            let (t, flow) = match r {
                ReplayFrame::Stamp { template, flow } if *flow < job.flows.len() => {
                    (template.clone(), *flow as u32)
                }
                ReplayFrame::Stamp { flow, .. } => {
                    return Err(BlastError::Job(format!(
                        "captured frame {i} names flow {flow} of {}",
                        job.flows.len()
                    )))
                }
                // Offsets that `patch` never writes at (no room for a header past the end):
                // the frame leaves as it is.
                ReplayFrame::Verbatim(b) => (
                    flowlane_wire::Template {
                        bytes: b.clone(),
                        l3: 0,
                        l4: 0,
                        payload: b.len(),
                        v6: false,
                    },
                    NO_FLOW,
                ),
            };
            let ti = u32::try_from(templates.len())
                .map_err(|_| BlastError::Job("more than 2^32 captured frames".into()))?;
            templates.push(t);
            schedule.push((ti, flow));
        }
        Ok((templates, schedule))
    }

    /// One template per (flow, size).
    fn build(job: &BlastJob, link: &RawLink) -> Result<Vec<flowlane_wire::Template>, BlastError> {
        if job.flows.is_empty() || job.payloads.is_empty() {
            return Err(BlastError::Job("a worker without flows or sizes".into()));
        }
        let mut templates = Vec::with_capacity(job.flows.len() * job.payloads.len());
        for f in &job.flows {
            for &p in &job.payloads {
                let mut t = flowlane_wire::Template::build(&flowlane_wire::TemplateSpec {
                    src_mac: link.src_mac,
                    dst_mac: link.dst_mac,
                    vlan: link.vlan,
                    src: f.src,
                    dst: f.dst,
                    frame_len: p + job.overhead,
                })
                .map_err(|e| BlastError::Job(format!("flow {}: {e}", f.id)))?;
                if let Some(ttl) = link.ttl {
                    t.set_ttl(ttl);
                }
                templates.push(t);
            }
        }
        Ok(templates)
    }
}

impl<T: FrameTx> Poll for RingSender<T> {
    type Stats = BlastStats;
    type Report = BlastReport;

    fn poll(
        &mut self,
        budget: usize,
        st: &BlastStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        let now = os::monotonic_ns();
        // The rest of a datagram already cut leaves first, whatever the pacing says.
        if let Some(c) = self.cut.as_mut().filter(|c| !c.pending.is_empty()) {
            let (pending, holds) = (&mut c.pending, &mut self.slot_holds);
            let (mut frames, mut bytes) = (0u64, 0u64);
            self.ring
                .queue(pending.len().min(budget), &mut |slot, buf| {
                    let Some(p) = pending.pop_front() else {
                        return 0;
                    };
                    let len = p.len().min(buf.len());
                    buf[..len].copy_from_slice(&p[..len]);
                    if let Some(h) = holds.get_mut(slot) {
                        *h = u32::MAX;
                    }
                    frames += 1;
                    bytes += len as u64;
                    len
                });
            self.ring.kick().map_err(|e| e.to_string())?;
            flowlane_runtime::bump(&st.tx_fragments, frames);
            flowlane_runtime::bump(&st.tx_bytes, bytes);
            if !c.pending.is_empty() {
                return Ok(0);
            }
        }
        if self.book.over(now) {
            // Hand every queued frame to the driver before finishing (bounded: 1 s).
            let until = now + 1_000_000_000;
            while self.ring.in_flight() > 0 && os::monotonic_ns() < until {
                self.ring.kick().map_err(|e| e.to_string())?;
                std::thread::yield_now();
            }
            self.finished = true;
            return Ok(0);
        }
        let n = self.book.allow(now, budget);
        if n == 0 {
            return Ok(0);
        }
        let nflows = self.seq.len() as u64;
        let nsizes = self.job.payloads.len() as u64;
        // Slots for the next n datagrams: one each, or a cut one's fragments (its rest taken
        // from `pending` in the slots right after it, before the next datagram). Datagram
        // number p (of this worker) is flow p mod flows' (p / flows)-th.
        let start = self.queued;
        let slots = match (&self.cut, self.schedule.is_empty()) {
            (Some(c), true) => (0..n as u64)
                .map(|i| {
                    let p = start + i;
                    let (f, s) = ((p % nflows) as usize, p / nflows);
                    let ti = f * nsizes as usize + (s % nsizes) as usize;
                    if c.cuts(s) {
                        self.frags_of.get(ti).copied().unwrap_or(1) as usize
                    } else {
                        1
                    }
                })
                .sum(),
            _ => n,
        };
        let (templates, seq, flows) = (&self.templates, &mut self.seq, &self.job.flows);
        let (holds, queued, schedule) = (&mut self.slot_holds, &mut self.queued, &self.schedule);
        let spray = &mut self.spray;
        let cut = &mut self.cut;
        let (mut cut_datagrams, mut cut_frames) = (0u64, 0u64);
        let mut bytes = 0usize;
        let frames = self.ring.queue(slots, &mut |slot, buf| {
            if let Some(p) = cut.as_mut().and_then(|c| c.pending.pop_front()) {
                let len = p.len().min(buf.len());
                buf[..len].copy_from_slice(&p[..len]);
                if let Some(h) = holds.get_mut(slot) {
                    *h = u32::MAX;
                }
                cut_frames += 1;
                bytes += len;
                return len;
            }
            let (ti, f) = if schedule.is_empty() {
                let f = (*queued % nflows) as usize;
                (f * nsizes as usize + (seq[f] % nsizes) as usize, f)
            } else {
                let (ti, f) = schedule[(*queued % schedule.len() as u64) as usize];
                (ti as usize, f as usize)
            };
            *queued += 1;
            let t = &templates[ti];
            let len = t.bytes.len();
            let Some(frame) = buf.get_mut(..len) else {
                return 0;
            };
            if holds.get(slot) != Some(&(ti as u32)) {
                frame.copy_from_slice(&t.bytes);
                if let Some(h) = holds.get_mut(slot) {
                    *h = ti as u32;
                }
            }
            if f == NO_FLOW as usize {
                bytes += len;
                return len;
            }
            if let Some(to) = spray.as_mut().and_then(|s| s.next(f)) {
                // The slot may hold another destination's frame: the checksums follow what
                // it holds (incremental), so no copy is needed.
                t.readdress(frame, to);
            }
            let h = FlowHeader {
                flow: flows[f].id,
                seq: seq[f] as u32,
                tx_ns: now,
            };
            t.patch(frame, &h);
            let s = seq[f];
            seq[f] += 1;
            if let Some(c) = cut.as_mut().filter(|c| c.cuts(s)) {
                if let Some(mut pieces) = c.cut(frame) {
                    // The slot now holds a fragment, not the template's copy.
                    if let Some(h) = holds.get_mut(slot) {
                        *h = u32::MAX;
                    }
                    let first = pieces.remove(0);
                    buf[..first.len()].copy_from_slice(&first);
                    cut_datagrams += 1;
                    cut_frames += 1;
                    bytes += first.len();
                    c.pending.extend(pieces);
                    return first.len();
                }
            }
            bytes += len;
            len
        });
        if cut_datagrams > 0 {
            flowlane_runtime::bump(&st.tx_fragmented, cut_datagrams);
            flowlane_runtime::bump(&st.tx_fragments, cut_frames);
        }
        self.ring.kick().map_err(|e| e.to_string())?;
        let _ = frames;
        let queued_now = (self.queued - start) as usize;
        self.book.record(st, now, n, queued_now, bytes);
        Ok(queued_now)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        self.book.sleep(timeout_ms);
        Ok(())
    }

    fn done(&self) -> bool {
        self.finished
    }

    fn finish(&mut self, st: &BlastStats) -> Option<BlastReport> {
        let refused = self.ring.refused();
        if refused > 0 {
            flowlane_runtime::set(&st.ring_refused, refused);
        }
        let mut r = self.book.report(&self.job.flows, &self.seq, None, None);
        r.flows_started = self.spray.as_ref().map_or(0, |s| s.flows_started());
        Some(r)
    }
}
