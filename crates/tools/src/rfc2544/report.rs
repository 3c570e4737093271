//! What `rfc2544` reports: per frame size, each test's answer and every trial behind it. The
//! JSON form's schema is docs/rfc2544.schema.json (a test validates a run against it).

use serde::{Deserialize, Serialize};

use super::search::{Found, TrialKind};
use crate::Latency;

/// Which test a trial belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TestName {
    /// The generator's own maximum, against a peer that drops every frame.
    Ceiling,
    /// §26.1.
    Throughput,
    /// §26.2.
    Latency,
    /// §26.3.
    FrameLoss,
    /// §26.4.
    BackToBack,
}

impl TestName {
    /// The name the JSON report uses (`frame-loss`), for every other output too.
    pub fn name(self) -> &'static str {
        match self {
            TestName::Ceiling => "ceiling",
            TestName::Throughput => "throughput",
            TestName::Latency => "latency",
            TestName::FrameLoss => "frame-loss",
            TestName::BackToBack => "back-to-back",
        }
    }
}

/// One trial, as counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TrialRecord {
    /// The test.
    pub test: TestName,
    /// Search or confirmation (throughput); `search` elsewhere.
    pub kind: TrialKind,
    /// Frame size with FCS (the mix's mean for IMIX).
    pub frame_bytes: f64,
    /// Rate asked for, frames per second (0: as fast as the generator goes).
    pub rate_pps: f64,
    /// Rate delivered: frames sent over the generator's send window.
    pub offered_pps: f64,
    /// Frames the generator's program (or sockets) released.
    pub sent: u64,
    /// Of those, frames the DUT's receive queue refused (counted by the generator's
    /// interface): the DUT's loss.
    pub refused: u64,
    /// Frames received once, counted by the sink (per flow, by sequence number).
    pub received: u64,
    /// Frames that reached the receiving interface but not the sink: its ring had no room
    /// (the receiver, not the DUT, was the limit; the trial says so in `tester_limited`).
    /// They are not in `received`, so they count in `loss`.
    #[serde(default)]
    pub receiver_dropped: u64,
    /// `sent − received`, a fraction.
    pub loss: f64,
    /// Frames received more than once.
    pub duplicates: u64,
    /// Frames received after a later one of their flow.
    pub reordered: u64,
    /// One-way latency of every frame received.
    pub latency_ns: Option<Latency>,
    /// Seconds of sending.
    pub secs: f64,
    /// Seconds the receiver went on counting after the generator stopped, until nothing had
    /// come for 0.1 s or `drain_s` had passed: how long the DUT took to give up what it
    /// still held (a DUT with deep queues takes longer; RFC 2544 §23 waits 2 s).
    #[serde(default)]
    pub drained_s: f64,
    /// The tester, not the DUT, may have been the limit: why (empty: it was not).
    pub tester_limited: Vec<String>,
    /// `pass` (loss within the goal's tolerance) or `fail`.
    pub verdict: String,
}

/// The maximum rate the search may offer, and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MaxRate {
    /// Frames per second.
    pub pps: f64,
    /// `line rate` (the user's `--line-rate`) or `generator` (its measured maximum: on a
    /// link without a line rate, such as veth, every figure is bounded by the tester).
    pub source: String,
    /// The generator's own maximum, measured against a peer that drops every frame.
    pub ceiling_pps: Option<f64>,
}

/// Throughput (§26.1): the NDR and the PDR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Throughput {
    /// No loss.
    pub ndr: Found,
    /// At most the loss tolerance.
    pub pdr: Found,
    /// The PDR's tolerance, percent.
    pub loss_tolerance_pct: f64,
    /// Search trials and confirmations run.
    pub trials: usize,
    /// The search ran out of trials before confirming both.
    pub exhausted: bool,
    /// NDR in bits per second of line (frame + 20 bytes of preamble and gap); when
    /// tester-limited, of the rate delivered (a lower bound).
    pub ndr_line_bps: f64,
    /// NDR as a percentage of the maximum rate.
    pub ndr_pct_of_max: f64,
}

/// Latency (§26.2) at the throughput rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LatencyResult {
    /// The rate, frames per second.
    pub rate_pps: f64,
    /// Each trial's percentiles.
    pub trials: Vec<Latency>,
    /// Their means, ns: p50, p99, p99.9, max.
    pub mean_p50_ns: f64,
    /// Mean p99.
    pub mean_p99_ns: f64,
    /// Mean p99.9.
    pub mean_p999_ns: f64,
    /// Mean max.
    pub mean_max_ns: f64,
}

/// One step of the frame loss rate test (§26.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LossPoint {
    /// Percent of the maximum rate.
    pub pct_of_max: u32,
    /// Rate asked for.
    pub rate_pps: f64,
    /// Rate delivered.
    pub offered_pps: f64,
    /// Frames lost, percent of those sent.
    pub loss_pct: f64,
}

/// Back-to-back (§26.4, RFC 9004).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BackToBack {
    /// The rate bursts were sent at (the maximum), frames per second.
    pub rate_pps: f64,
    /// The longest burst without loss, per search.
    pub bursts: Vec<u64>,
    /// Their mean.
    pub mean_frames: f64,
    /// RFC 9004 §6: implied DUT buffer time, s = mean burst / maximum rate.
    pub implied_buffer_s: f64,
    /// The frames the DUT held when the longest burst ended, by RFC 9004's model: mean ×
    /// (1 − throughput / maximum), the burst less what the DUT forwarded while it arrived at
    /// the maximum rate. A generator slower than that during the burst (the live-frames
    /// generator's first ~20 ms of a run are) makes the bursts longer and this larger.
    pub buffer_frames: Option<f64>,
    /// RFC 9004 §6: corrected DUT buffer time, s = implied × (1 − throughput / maximum):
    /// the DUT forwards while the burst arrives, so only the difference fills its buffer.
    pub corrected_buffer_s: Option<f64>,
    /// Why the test was not run or means little (e.g. the DUT forwards the maximum rate, so
    /// no burst fills a buffer).
    pub note: Option<String>,
    /// The longest burst tried passed but left slower than the maximum rate (the generator
    /// fell short): what it offered. The DUT's buffer was not tested at that rate, so the
    /// bursts bound the tester, not the DUT.
    #[serde(default)]
    pub tester_limited: Option<String>,
}

/// One frame size's answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SizeReport {
    /// Frame bytes with FCS (the mix's mean for IMIX).
    pub frame_bytes: f64,
    /// The IMIX, if this size is one: (size with FCS, weight).
    pub imix: Option<Vec<(usize, u32)>>,
    /// The maximum rate.
    pub max: MaxRate,
    /// §26.1.
    pub throughput: Option<Throughput>,
    /// §26.2.
    pub latency: Option<LatencyResult>,
    /// §26.3.
    pub frame_loss: Option<Vec<LossPoint>>,
    /// §26.4.
    pub back_to_back: Option<BackToBack>,
    /// A probe's loss and latency through the DUT at each flood rate (not RFC 2544's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_under_flood: Option<Vec<FloodPoint>>,
}

/// One flood rate of the probe-under-flood test: what the flood did, and what the probe
/// beside it saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FloodPoint {
    /// The flood's rate asked for, frames per second (`None`: unpaced; 0: no flood).
    pub flood_rate_pps: Option<f64>,
    /// Flood frames released, and over the flood's send window per second.
    pub flood_sent: u64,
    pub flood_offered_pps: f64,
    /// Destinations the flood drew (a new one every frame).
    pub flood_destinations: u64,
    /// Flood frames the sink received (forwarded by the DUT), and per second over the
    /// sink's window (its first to its last frame read).
    pub flood_forwarded: u64,
    pub flood_forwarded_pps: f64,
    /// Flood frames sent and not received (the DUT's loss, with `sink_ring_drops` the
    /// receiver's).
    pub flood_lost: u64,
    /// The probe: frames sent, received once, lost (sent − received), its rate.
    pub probe_pps: f64,
    pub probe_sent: u64,
    pub probe_received: u64,
    pub probe_lost: u64,
    /// The probe's one-way latency (only the probe's frames are timed).
    pub probe_latency_ns: Option<Latency>,
    /// Frames the sink's ring had no room for (the receiver, not the DUT, dropped them).
    pub sink_ring_drops: u64,
    /// Seconds of sending.
    pub secs: f64,
    /// Non-empty when the tester, not the DUT, set a figure (a paced flood not delivered, a
    /// probe short of its rate, the sink's ring full).
    pub tester_limited: String,
}

/// Flows placed on the DUT's RSS queues by the picker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Placed {
    /// Flows per queue.
    pub per_queue: u64,
    /// The queues asked for (empty: every queue).
    pub queues: Vec<u32>,
    /// Not asked for: a lab's default (one flow, on a queue off the generator's CPU).
    pub by_default: bool,
    /// The flows the generator sent (empty if no trial ran).
    pub flows: Vec<PlacedFlow>,
}

/// One placed flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PlacedFlow {
    /// Source `IP:PORT`.
    pub src: String,
    /// Destination `IP:PORT`.
    pub dst: String,
    /// The DUT's RSS queue its hash selects.
    pub queue: u32,
}

/// What `rfc2544` reports (`--json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Rfc2544Report {
    /// The generator's interface.
    pub tx_dev: String,
    /// The receiving interface.
    pub rx_dev: String,
    /// Where frames were addressed.
    pub to: String,
    /// How frames were generated.
    pub generator: String,
    /// How the sink read them: `af-xdp` or `af-packet`.
    pub receiver: crate::sink::SinkBackend,
    /// Where the flows went, when they were placed on the DUT's RSS queues.
    #[serde(default)]
    pub placement: Option<Placed>,
    /// Per size, in the order run (fewer than asked if stopped).
    pub sizes: Vec<SizeReport>,
    /// Every trial, in the order run.
    pub trials: Vec<TrialRecord>,
    /// Seconds the whole run took.
    pub duration_s: f64,
    /// Stopped before the end (Ctrl-C).
    pub interrupted: bool,
    /// The host's conditions when it ran (`doctor`'s rules for its CPUs and interfaces),
    /// read by the caller before the run; none when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::doctor::DoctorReport>,
}

/// Bits per second on the line for `pps` frames of `frame` bytes with FCS (+ 8 preamble +
/// 12 gap).
pub fn line_bps(pps: f64, frame: f64) -> f64 {
    pps * (frame + 20.0) * 8.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_names_are_the_json_names() {
        for t in [
            TestName::Ceiling,
            TestName::Throughput,
            TestName::Latency,
            TestName::FrameLoss,
            TestName::BackToBack,
        ] {
            assert_eq!(serde_json::to_value(t).expect("json"), t.name());
        }
        for k in [TrialKind::Search, TrialKind::Confirm, TrialKind::Long] {
            assert_eq!(serde_json::to_value(k).expect("json"), k.name());
        }
    }
}
