//! What `rfc2544` is asked to do.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::blast::{ModelSpec, Placement};
use crate::ToolError;

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
    /// Not RFC 2544's: a probe flow's loss and latency through the DUT while a flood of
    /// random destinations (`Rfc2544Config::flood`) runs beside it, at each flood rate.
    #[serde(default)]
    pub probe_under_flood: bool,
}

impl Tests {
    /// All four, the default.
    pub fn all() -> Tests {
        Tests {
            throughput: true,
            latency: true,
            frame_loss: true,
            back_to_back: true,
            probe_under_flood: false,
        }
    }
}

/// The flood of the probe-under-flood test: random destinations (a new one every frame)
/// from ranges the DUT routes, at each of `rates`, with a probe flow to `to` beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloodSpec {
    /// Destination addresses and ports, inclusive (the DUT must route them out of its rx
    /// side, e.g. a large table via the sink).
    pub dst: (std::net::IpAddr, std::net::IpAddr),
    pub dport: (u16, u16),
    /// Flows of the flood (source ports; each moves through the destinations).
    pub flows: u32,
    /// Flood rates, frames per second: `None` as fast as its generator goes (AF_XDP, one
    /// thread), `Some(0.0)` the probe alone (the baseline).
    pub rates: Vec<Option<f64>>,
    /// The probe's rate, frames per second.
    pub probe_pps: f64,
    /// The probe's sending CPU (default: the generator's).
    #[serde(default)]
    pub probe_cpu: Option<usize>,
}

impl FloodSpec {
    /// A flood over `dst` × `dport`: the probe alone, then the flood unpaced; 64 flows; a
    /// probe of 1 000 frames a second.
    pub fn new(dst: (std::net::IpAddr, std::net::IpAddr), dport: (u16, u16)) -> FloodSpec {
        FloodSpec {
            dst,
            dport,
            flows: 64,
            rates: vec![Some(0.0), None],
            probe_pps: 1000.0,
            probe_cpu: None,
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

/// The sizes for IPv6 (RFC 5180 §5 keeps RFC 2544's list above the minimum): the smallest
/// frame that carries IPv6, UDP and flowlane's 16-byte header (82 bytes with FCS) instead of
/// 64.
pub const DEFAULT_SIZES_V6: [usize; 7] = [82, 128, 256, 512, 1024, 1280, 1518];

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
    /// The placement is a lab's default (one flow, off the generator's CPU), not asked for.
    #[serde(default)]
    pub placement_default: bool,
    /// The line rate, bits per second (frame + FCS + preamble + gap, as a tester counts);
    /// `None`: the generator's measured maximum stands in, and the report says so.
    pub line_rate_bps: Option<f64>,
    /// Seconds per search trial.
    pub trial_s: f64,
    /// Seconds of the confirming trial at each final rate, and of latency and loss trials.
    pub confirm_s: f64,
    /// Seconds between trials (the DUT drains; RFC 2544 §23 asks for some).
    pub pause_s: f64,
    /// At most this many seconds of counting after the generator stopped, for the frames the
    /// DUT still holds; the wait ends once nothing has come for 0.1 s (RFC 2544 §23: 2 s).
    pub drain_s: f64,
    /// Learning frames sent before each size's first trial (§23).
    pub learning_frames: u64,
    /// The search's resolution, a fraction of the lowest rate that failed (the answer lies
    /// within it below that rate).
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
    /// AF_PACKET: bytes the sink's ring may map (`ring` slots at most): 1 GiB holds the
    /// 262 144 default slots at a 1 500-byte MTU (410 MiB) and ~115 000 at 9 000.
    #[serde(default = "default_ring_memory")]
    pub ring_memory: u64,
    /// The flood of the probe-under-flood test (required by it).
    #[serde(default)]
    pub flood: Option<FloodSpec>,
}

fn default_ring_memory() -> u64 {
    1 << 30
}

impl Rfc2544Config {
    /// A configuration with flowlane's defaults (the sizes by the destination's family: 64
    /// bytes cannot carry IPv6, UDP and flowlane's header).
    pub fn new(tx: Endpoint, rx: Endpoint, to: SocketAddr) -> Rfc2544Config {
        Rfc2544Config {
            tx,
            rx,
            to,
            dst_mac: None,
            tests: Tests::all(),
            sizes: SizeSpec::List(if to.is_ipv6() {
                DEFAULT_SIZES_V6.to_vec()
            } else {
                DEFAULT_SIZES.to_vec()
            }),
            flows: 1,
            placement: None,
            placement_default: false,
            line_rate_bps: None,
            trial_s: 2.0,
            confirm_s: 10.0,
            pause_s: 1.0,
            drain_s: 2.0,
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
            ring_memory: default_ring_memory(),
            flood: None,
        }
    }
}

/// A run through the DUT of a line lab (`flowlane lab up --topology line`), and how its flows
/// meet the DUT's RSS queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabRun {
    /// The lab's name.
    pub lab: String,
    /// IPv6 frames (to the lab sink's IPv6 address).
    pub ipv6: bool,
    /// Where frames go instead of the lab sink's address (port 9 when 0 is given).
    pub to: Option<SocketAddr>,
    /// Flows, when not placed.
    pub flows: u32,
    /// This many flows on each of the DUT's queues, chosen by the picker with the lab's key
    /// and indirection table.
    pub per_queue: Option<u64>,
    /// With `per_queue`: only these queues (empty: all).
    pub queues: Vec<u32>,
    /// The generator's CPU.
    pub tx_cpu: usize,
}

impl Rfc2544Config {
    /// The configuration of a run through a line lab's DUT: the lab's generator and sink
    /// interfaces and the sink's address, with flowlane's defaults otherwise.
    ///
    /// Flows: with `per_queue`, placed on the DUT's queues. Without it, in a lab with
    /// software RSS and one flow, that flow is placed on a queue whose CPU is not the
    /// generator's (the last such): on veth a queue's work runs on its CPU, and a generator
    /// sharing its CPU with the DUT's forwarding falls short of its rate, so the trials would
    /// be marked tester-limited and the DUT's figure move with the flow's hash.
    pub fn in_lab(run: &LabRun) -> Result<Rfc2544Config, ToolError> {
        use flowlane_lab::setup::{self as lab, Segment, Steer, Topology};
        let name = &run.lab;
        let l = lab::saved(name).ok_or_else(|| {
            ToolError::usage(format!(
                "no lab `{name}`: make it with `flowlane lab up --name {name} --topology line`"
            ))
        })?;
        if l.topology != Topology::Line {
            return Err(ToolError::usage(format!(
                "lab `{name}` is a pair: RFC 2544 needs a DUT between two interfaces \
                 (`flowlane lab up --topology line`)"
            )));
        }
        let to = match run.to {
            Some(t) => t,
            None => {
                let a = match (run.ipv6, l.segment == Segment::Switched) {
                    (false, false) => lab::LAB_SINK_V4,
                    (true, false) => lab::LAB_SINK_V6,
                    (false, true) => lab::LAB_SINK_L2_V4,
                    (true, true) => lab::LAB_SINK_L2_V6,
                };
                let ip = a.parse().map_err(|_| {
                    ToolError::runtime(format!("the lab's sink address `{a}` does not parse"))
                })?;
                SocketAddr::new(ip, 0)
            }
        };
        let to = if to.port() == 0 {
            SocketAddr::new(to.ip(), 9)
        } else {
            to
        };
        let placed = |per_queue: u64, queues: Vec<u32>| Placement {
            per_queue,
            queues,
            key: l.key.clone(),
            symmetric: Default::default(),
            model: ModelSpec::Reta(l.reta.clone()),
            // A two-tuple lab steers by address: flows are placed by source address.
            hash_ports: l.ports,
        };
        let placement = match run.per_queue {
            Some(k) => Some(placed(k, run.queues.clone())),
            None if run.flows == 1 && l.steer == Steer::Rss => l
                .queue_cpus
                .iter()
                .enumerate()
                .rev()
                .find(|(_, &cpu)| cpu as usize != run.tx_cpu)
                .map(|(q, _)| placed(1, vec![q as u32])),
            None => None,
        };
        let mut c = Rfc2544Config::new(
            Endpoint {
                netns: Some(l.gen_ns()),
                dev: lab::GEN_IF.into(),
            },
            Endpoint {
                netns: Some(l.sink_ns()),
                dev: lab::SINK_IF.into(),
            },
            to,
        );
        c.flows = run.flows;
        c.placement_default = run.per_queue.is_none() && placement.is_some();
        c.placement = placement;
        c.tx_cpu = run.tx_cpu;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default sizes follow the destination's family: IPv6's start at 82 bytes (64 was
    /// refused for a size the user never gave).
    #[test]
    fn the_default_sizes_follow_the_destinations_family() {
        let end = || Endpoint {
            netns: None,
            dev: "x".into(),
        };
        let v4 = Rfc2544Config::new(end(), end(), "198.18.1.2:9".parse().expect("addr"));
        let v6 = Rfc2544Config::new(end(), end(), "[2001:2::2]:9".parse().expect("addr"));
        assert_eq!(v4.sizes, SizeSpec::List(DEFAULT_SIZES.to_vec()));
        assert_eq!(v6.sizes, SizeSpec::List(DEFAULT_SIZES_V6.to_vec()));
    }
}
