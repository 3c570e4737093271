//! What a `sink` run reports: per flow, per size, and the whole run.

use serde::{Deserialize, Serialize};

use super::capture::CaptureReport;
use crate::backend::BackendReport;
use crate::Latency;

/// One flow as the sink saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Datagrams of it that came as IP fragments (made whole by the sink); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragmented: Option<u64>,
    /// Of its datagrams, those overtaken by one of the other kind — a whole datagram after a
    /// fragmented one of a higher sequence number, or the reverse (a flow split by RSS
    /// between the 2-tuple and the 4-tuple hash is reordered so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reordered_across: Option<u64>,
}

/// IP reassembly over the sink's workers (each reassembles its own receive queue's
/// fragments): every fragment counted once, where it ended —
/// `fragments = datagram_fragments + overlap + duplicate + too_many + too_big + memory +
/// malformed + timed_out + evicted + held_fragments`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct FragmentReport {
    /// Fragments given to the reassemblers.
    pub fragments: u64,
    /// Datagrams made whole, and the fragments they were made of.
    pub datagrams: u64,
    pub datagram_fragments: u64,
    /// Fragments dropped, by reason (with those their datagram held): overlapping another
    /// (the datagram is dropped, RFC 5722), an exact repeat (ignored), past the fragment
    /// limit, past 65 535 bytes or the end the last fragment set, past the byte budget, not
    /// a multiple of 8 (not last) or empty, timed out, evicted for a newer datagram.
    pub overlap: u64,
    pub duplicate: u64,
    pub too_many: u64,
    pub too_big: u64,
    pub memory: u64,
    pub malformed: u64,
    pub timed_out: u64,
    pub evicted: u64,
    /// Datagrams given up for any of those reasons.
    pub datagrams_dropped: u64,
    /// Still waiting for the rest when the run ended: fragments, datagrams, bytes.
    pub held_fragments: u64,
    pub held_contexts: u64,
    pub held_bytes: u64,
}

impl FragmentReport {
    /// Adds a reassembler's counts.
    pub fn add(&mut self, c: &flowlane_flowtable::reasm::ReasmCounts) {
        self.fragments += c.fragments;
        self.datagrams += c.datagrams;
        self.datagram_fragments += c.datagram_fragments;
        self.overlap += c.overlap;
        self.duplicate += c.duplicate;
        self.too_many += c.too_many;
        self.too_big += c.too_big;
        self.memory += c.memory;
        self.malformed += c.malformed;
        self.timed_out += c.timed_out;
        self.evicted += c.evicted;
        self.datagrams_dropped += c.datagrams_dropped;
        self.held_fragments += c.held_fragments;
        self.held_contexts += c.held_contexts;
        self.held_bytes += c.held_bytes;
    }
}

/// The flows of one frame length together: one step of a size sweep (`blast --size
/// 60,508,1514` gives each step's flows ids of their own and one length each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Every one-way latency (nanoseconds) in HdrHistogram's compressed interchange form
    /// (`HISTFAAA…`, base64), so `merge` joins shards' latency without losing a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_histogram: Option<String>,
    /// With `--shard` or `--start-at`: which shard of the run this is, and when it started by
    /// which clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::ShardReport>,
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
    /// The host's conditions when it ran (`doctor`'s rules for its CPUs and interfaces),
    /// read by the caller before the run; none when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::doctor::DoctorReport>,
    /// The 5-tuples of the flowlane frames, counted in a bounded flow table per worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuples: Option<TupleReport>,
    /// IP fragments and their reassembly (absent when none came).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<FragmentReport>,
}

impl SinkReport {
    /// A report of nothing received.
    pub fn empty() -> SinkReport {
        SinkReport {
            latency_histogram: None,
            shard: None,
            host: None,
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
            tuples: None,
            fragments: None,
            errors: Vec::new(),
        }
    }
}

/// The 5-tuples a sink counted (`flowlane-flowtable`, one table per worker): how many, what
/// became of them, and the table's work. Every flowlane frame is in one of the three frame
/// counts: `frames_live + frames_expired + frames_evicted = flowlane_packets`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TupleReport {
    /// Tables (one per worker) and the records of each.
    pub tables: usize,
    pub capacity: usize,
    /// Their memory, bytes, allocated at the start.
    pub memory_bytes: u64,
    /// Tuples added: each new one, and again one that came back after it expired or was
    /// evicted (a new flow then, as a router's table would see it).
    pub seen: u64,
    /// Held at the end.
    pub live: u64,
    /// Left after their idle time.
    pub expired: u64,
    /// Pushed out by a new tuple when the table was full.
    pub evicted: u64,
    /// Frames of the tuples held at the end, of those expired, of those evicted.
    pub frames_live: u64,
    pub frames_expired: u64,
    pub frames_evicted: u64,
    /// The tables' lookups, hits, and records their expiry visited.
    pub lookups: u64,
    pub hits: u64,
    pub gc_visited: u64,
}

impl TupleReport {
    /// Adds one worker's table.
    pub fn add(&mut self, t: &super::worker::Tuples) {
        let s = t.table.stats();
        self.tables += 1;
        self.capacity = t.table.capacity();
        self.memory_bytes += t.table.memory_bytes() as u64;
        self.seen += s.inserts;
        self.live += s.live;
        self.expired += t.expired.0;
        self.evicted += t.evicted.0;
        self.frames_live += t.live_frames();
        self.frames_expired += t.expired.1;
        self.frames_evicted += t.evicted.1;
        self.lookups += s.lookups;
        self.hits += s.hits;
        self.gc_visited += s.gc_visited;
    }
}
