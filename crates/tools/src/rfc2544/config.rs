//! What `rfc2544` is asked to do.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::blast::Placement;

/// Where frames leave or arrive: an interface, in a network namespace or in the caller's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// A named network namespace (`ip netns`), or the caller's.
    pub netns: Option<String>,
    /// The interface.
    pub dev: String,
}

/// Which of RFC 2544 §26's tests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tests {
    /// §26.1 throughput (NDR, and PDR beside it).
    pub throughput: bool,
    /// §26.2 latency at the throughput rate.
    pub latency: bool,
    /// §26.3 frame loss rate, 100 % down in 10 % steps.
    pub frame_loss: bool,
    /// §26.4 back-to-back frames (RFC 9004).
    pub back_to_back: bool,
}

impl Tests {
    /// All four, the default.
    pub fn all() -> Tests {
        Tests {
            throughput: true,
            latency: true,
            frame_loss: true,
            back_to_back: true,
        }
    }
}

/// Frame sizes, as RFC 2544 counts them: with the 4-byte FCS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SizeSpec {
    /// One size after the other.
    List(Vec<usize>),
    /// One mix, cycled (size with FCS, weight): sent through AF_XDP (the live-frames
    /// generator sends one size per run).
    Imix(Vec<(usize, u32)>),
}

/// RFC 2544's sizes for Ethernet (§9.1), with FCS.
pub const DEFAULT_SIZES: [usize; 7] = [64, 128, 256, 512, 1024, 1280, 1518];

/// The configuration of one `rfc2544` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rfc2544Config {
    /// The generator's interface (frames leave here towards the DUT).
    pub tx: Endpoint,
    /// The receiving interface (frames the DUT forwarded arrive here).
    pub rx: Endpoint,
    /// Where the frames are addressed (through the DUT), a port other than 0.
    pub to: SocketAddr,
    /// The next hop's MAC (default: the neighbour table's entry on the tx interface).
    pub dst_mac: Option<[u8; 6]>,
    /// The tests to run.
    pub tests: Tests,
    /// Frame sizes.
    pub sizes: SizeSpec,
    /// Flows (source ports), when not placed.
    pub flows: u32,
    /// Flows placed on the DUT's RSS queues by the picker.
    pub placement: Option<Placement>,
    /// The line rate, bits per second (frame + FCS + preamble + gap, as a tester counts);
    /// `None`: the generator's measured maximum stands in, and the report says so.
    pub line_rate_bps: Option<f64>,
    /// Seconds per search trial.
    pub trial_s: f64,
    /// Seconds of the confirming trial at each final rate, and of latency and loss trials.
    pub confirm_s: f64,
    /// Seconds between trials (the DUT drains; RFC 2544 §23 asks for some).
    pub pause_s: f64,
    /// Seconds to wait after the last frame of a trial before counting (frames in flight).
    pub drain_s: f64,
    /// Learning frames sent before each size's first trial (§23).
    pub learning_frames: u64,
    /// The search's resolution, a fraction of the maximum rate.
    pub resolution: f64,
    /// The PDR's loss tolerance, percent (RFC: 0 for throughput; 0.5 by default for PDR).
    pub loss_tolerance_pct: f64,
    /// At most this many search trials per size.
    pub max_trials: u32,
    /// A plain binary search (the usual tester's), not aimed at what the DUT forwarded.
    #[serde(default)]
    pub halving_only: bool,
    /// Latency trials at the throughput rate.
    pub latency_trials: u32,
    /// Back-to-back searches per size (RFC 9004 asks for many; each is a search).
    pub b2b_trials: u32,
    /// The longest burst tried, seconds at the maximum rate.
    pub b2b_max_s: f64,
    /// The generator's CPU; the sink's.
    pub tx_cpu: usize,
    /// The sink's CPU.
    pub rx_cpu: usize,
    /// Most frames the paced generator sends at once after a stall.
    pub burst: u32,
    /// The sink's receive ring, slots.
    pub ring: usize,
    /// How the sink reads what the DUT forwarded. On veth the receive path runs on the CPU
    /// that sent the frame — the DUT's: an AF_PACKET copy (with the kernel's own IP and UDP
    /// path behind it) is paid by the DUT during trials, AF_XDP (frames taken in XDP, no skb)
    /// costs it far less.
    #[serde(default)]
    pub rx_backend: crate::sink::SinkBackend,
}

impl Rfc2544Config {
    /// A configuration with flowlane's defaults.
    pub fn new(tx: Endpoint, rx: Endpoint, to: SocketAddr) -> Rfc2544Config {
        Rfc2544Config {
            tx,
            rx,
            to,
            dst_mac: None,
            tests: Tests::all(),
            sizes: SizeSpec::List(DEFAULT_SIZES.to_vec()),
            flows: 1,
            placement: None,
            line_rate_bps: None,
            trial_s: 2.0,
            confirm_s: 10.0,
            pause_s: 1.0,
            drain_s: 0.2,
            learning_frames: 100,
            resolution: 0.01,
            loss_tolerance_pct: 0.5,
            max_trials: 16,
            halving_only: false,
            latency_trials: 3,
            b2b_trials: 3,
            b2b_max_s: 2.0,
            tx_cpu: 0,
            rx_cpu: 0,
            burst: 256,
            ring: 262_144,
            rx_backend: crate::sink::SinkBackend::AfXdp,
        }
    }
}
