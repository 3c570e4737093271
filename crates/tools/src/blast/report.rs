//! What `blast` reports: the JSON contract (`flowlane blast --json`), read back by `bench`.

use serde::{Deserialize, Serialize};

use crate::report::{Latency, WorkerError};

/// One flow's part of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FlowReport {
    /// Flow id (in every datagram's flowlane header).
    pub id: u16,
    /// Source `IP:PORT` as the kernel bound it (the port it chose, where none was given).
    pub src: String,
    /// Destination `IP:PORT` (with destination ranges: the first; the flow moves through
    /// them).
    pub dst: String,
    /// The RSS queue the flow was placed on (with placement).
    pub queue: Option<u32>,
    /// Datagrams sent.
    pub tx_packets: u64,
    /// With echoes: echoes back (duplicates included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_packets: Option<u64>,
    /// With echoes: sequence numbers never seen back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    /// With echoes: echoes that came back below the highest sequence number seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reordered: Option<u64>,
    /// With echoes: echoes seen twice or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicates: Option<u64>,
}

/// One step of a run (the whole run, unless it sweeps frame sizes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StepReport {
    /// Datagrams (frames) the generator released: what the kernel accepted.
    pub tx_packets: u64,
    /// Frame bytes (FCS excluded) of those.
    pub tx_bytes: u64,
    /// With echoes: echoes received.
    pub rx_packets: Option<u64>,
    /// With echoes: datagrams never seen back.
    pub lost: Option<u64>,
    /// With echoes: echoes out of order.
    pub reordered: Option<u64>,
    /// With echoes: duplicated echoes.
    pub duplicates: Option<u64>,
    /// Received datagrams without a valid flowlane header of one of this run's flows.
    pub foreign: u64,
    /// Sends the kernel took only partly or not at all (a full buffer or ring).
    pub tx_full: u64,
    /// ICMP errors reported on the sockets (e.g. port unreachable).
    pub icmp_errors: u64,
    /// With echoes: echoes dropped by this host's own receive buffers (not the device's loss).
    pub lost_at_own_socket: Option<u64>,
    /// First to last datagram sent, seconds.
    pub duration_s: f64,
    /// Datagrams per second over that window.
    pub tx_pps: f64,
    /// The senders' CPU time per datagram sent (their threads' CPU clocks over their loops),
    /// nanoseconds; in xdp-live mode the kernel's run, which does the sending, is in it.
    #[serde(default)]
    pub cpu_ns_per_packet: Option<f64>,
    /// With echoes: echoes per second over that window.
    pub rx_pps: Option<f64>,
    /// The rate asked for, datagrams per second.
    pub requested_pps: Option<f64>,
    /// With a rate: whether it was not reached (within 1 %).
    pub generator_limited: Option<bool>,
    /// Why it was not reached.
    pub generator_limited_reason: Option<String>,
    /// With a rate: datagrams whose time passed unsent in stalls longer than the catch-up
    /// (`--catch-up`), over all senders.
    #[serde(default)]
    pub pace_forfeited: Option<u64>,
    /// With a rate: the most a due datagram waited for its sender to wake, milliseconds.
    #[serde(default)]
    pub late_max_ms: Option<f64>,
    /// Which part set the rate: `generator` or `path`.
    pub limited_by: Option<String>,
    /// What failed in this step, in words; empty: it did what was asked.
    pub problems: Vec<String>,
    /// With `--verify-rss` (on the run's last step): what the receiving interface's NIC did
    /// with each flow, against its own RSS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_verify: Option<Box<crate::verify::VerifyReport>>,
    /// The host's conditions when it ran (`doctor`'s rules for its CPUs and interfaces),
    /// read by the caller before the run; none when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::doctor::DoctorReport>,
    /// The frame size (one size).
    pub frame_bytes: Option<usize>,
    /// The frame sizes of one cycle (a mix).
    pub imix_frame_bytes: Option<Vec<usize>>,
    /// Megabits per second of frames (FCS excluded), one decimal.
    pub mbps: f64,
    /// Round-trip latency of echoes.
    pub latency_ns: Option<Latency>,
    /// With echoes: round trips per sender thread, by the CPU it ran on (each thread sends
    /// and takes back its own flows' datagrams).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_latency_ns: Option<Vec<CpuRoundTrip>>,
    /// The whole latency distribution (nanoseconds) behind the percentiles, for `--histogram`
    /// (in the JSON as `latency_histogram`).
    #[serde(skip)]
    pub histogram: Option<hdrhistogram::Histogram<u64>>,
    /// With echoes: every round trip (nanoseconds) in HdrHistogram's compressed interchange
    /// form (`HISTFAAA…`, base64), so `merge` joins shards' latency without losing a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_histogram: Option<String>,
    /// With `--shard` or `--start-at`: which shard of the run this is, and when it started by
    /// which clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::ShardReport>,
    /// pktgen's result line: `OK: … usec, N (SIZEbyte,0frags) PPSpps MBMb/sec (BPSbps)
    /// errors: E flows: F` (`FAIL:` for a step with problems; F: the flows sent, or with
    /// destination ranges the flows started).
    pub pktgen: String,
    /// With destination ranges (`spray`): destinations drawn over all senders — each a new
    /// 5-tuple for as long as its flow keeps it (`flowlen` frames) — and how many the ranges
    /// hold (address × port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows_started: Option<u64>,
    /// With `--fragment-size`: datagrams cut into IP fragments, and the fragment frames
    /// they became (`tx_packets` counts datagrams; the wire carried `tx_packets` −
    /// `fragmented_datagrams` + `fragments` frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragmented_datagrams: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destinations: Option<u64>,
    /// The interfaces sent on (frame modes), in the order sender threads take them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devs: Vec<String>,
    /// xdp-live: frames the device's transmit counter grew by.
    pub device_tx_packets: Option<u64>,
    /// xdp-live: frames released that the device did not transmit.
    pub device_refused: Option<u64>,
    /// raw and xdp: frames the ring handed back as malformed (AF_PACKET `wrong_format`,
    /// AF_XDP `tx_invalid_descs`): queued, counted in `tx_packets`, never sent.
    #[serde(default)]
    pub ring_refused: u64,
    /// The frame backend that carried the step (frame modes), as asked of the kernel once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::backend::BackendReport>,
    /// Per flow.
    pub flows: Vec<FlowReport>,
    /// What each packet cost in cycles, instructions and cache misses, or why not known.
    #[serde(default)]
    pub pmu: crate::PmuCost,
    /// Sender threads that stopped with an error.
    #[serde(default)]
    pub errors: Vec<WorkerError>,
    /// The capture sent (`--pcap`): how its frames were used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<super::ReplayReport>,
}

impl StepReport {
    /// The mean frame of the step (one size, or a cycle's mean).
    pub fn mean_frame(&self) -> f64 {
        match (&self.frame_bytes, &self.imix_frame_bytes) {
            (Some(f), _) => *f as f64,
            (None, Some(c)) => c.iter().sum::<usize>() as f64 / c.len().max(1) as f64,
            // A capture's frames: the mean of what left.
            _ if self.tx_packets > 0 => self.tx_bytes as f64 / self.tx_packets as f64,
            _ => 0.0,
        }
    }

    /// Whether the step did what was asked.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// A whole run: one step, or one per frame size of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BlastReport {
    /// In the order run; a run stopped early (Ctrl-C, a failed step) has fewer than asked.
    pub steps: Vec<StepReport>,
    /// The run was a size sweep (printed as `{"sweep": [...]}`).
    pub sweep: bool,
    /// The host's conditions when it ran (`doctor`'s rules for its CPUs and interfaces),
    /// read by the caller before the run; none when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::doctor::DoctorReport>,
}

/// What `blast --json` prints: a single step's report as it is, or a sweep's steps under
/// `sweep`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum BlastJson {
    /// One step.
    Step(Box<StepReport>),
    /// A sweep: one step per size.
    Sweep {
        /// The steps, in the order run.
        sweep: Vec<StepReport>,
        /// The host's conditions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<crate::doctor::DoctorReport>,
    },
}

impl BlastReport {
    /// The form `--json` prints.
    pub fn json(&self) -> BlastJson {
        match self.steps.as_slice() {
            [one] if !self.sweep => BlastJson::Step(Box::new(StepReport {
                host: self.host.clone(),
                ..one.clone()
            })),
            all => BlastJson::Sweep {
                sweep: all.to_vec(),
                host: self.host.clone(),
            },
        }
    }

    /// Every step did what was asked.
    pub fn ok(&self) -> bool {
        self.steps.iter().all(StepReport::ok)
    }

    /// Every step's round trips in one distribution (a sweep's sizes together; `None`: no
    /// echo was timed), for `--histogram`.
    pub fn round_trips(&self) -> Option<hdrhistogram::Histogram<u64>> {
        let mut all: Option<hdrhistogram::Histogram<u64>> = None;
        for h in self.steps.iter().filter_map(|s| s.histogram.as_ref()) {
            match all.as_mut() {
                Some(a) => {
                    let _ = a.add(h);
                }
                None => all = Some(h.clone()),
            }
        }
        all
    }
}

/// One sender thread's round trips.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CpuRoundTrip {
    /// The CPU the thread ran on.
    pub cpu: usize,
    /// Echoes it timed.
    pub echoes: u64,
    /// Their percentiles (`None`: none came back).
    pub latency: Option<Latency>,
}
