//! What `blast` is asked to do.

use std::net::{IpAddr, SocketAddr};

use flowlane_rss::queue::{FreeBsdBuckets, QueueModel, Reta};
use flowlane_rss::Symmetric;
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// How frames leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlastMode {
    /// UDP sockets (sendmmsg); the kernel builds the headers.
    Udp,
    /// Whole frames through an AF_PACKET TX ring, bypassing the qdisc layer.
    Raw,
    /// Whole frames through AF_XDP sockets (copy mode; need_wakeup).
    Xdp,
    /// A generated XDP program run in live-frames mode (BPF_PROG_TEST_RUN): no socket.
    XdpLive,
}

impl BlastMode {
    /// Builds its own frames (every mode but `udp`).
    pub fn frames(self) -> bool {
        self != BlastMode::Udp
    }
}

/// How frames leave, each way with the settings only it takes: a UDP socket's echoes, a frame
/// mode's interface and headers. Another mode's setting cannot be written (the CLI refuses its
/// flag and says whose it is).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// UDP sockets (sendmmsg); the kernel builds the headers.
    Udp {
        /// Take echoes back (from `serve --mode echo`) and account them per flow.
        #[serde(default)]
        echo: Option<Echo>,
    },
    /// Whole frames through an AF_PACKET TX ring, bypassing the qdisc layer.
    Raw(FrameSettings),
    /// Whole frames through AF_XDP sockets (copy mode; need_wakeup).
    Xdp(FrameSettings),
    /// A generated XDP program run in live-frames mode (BPF_PROG_TEST_RUN): no socket.
    XdpLive(FrameSettings),
}

impl Mode {
    /// Plain UDP sockets, no echoes.
    pub const UDP: Mode = Mode::Udp { echo: None };

    /// Which way, without its settings.
    pub fn kind(&self) -> BlastMode {
        match self {
            Mode::Udp { .. } => BlastMode::Udp,
            Mode::Raw(_) => BlastMode::Raw,
            Mode::Xdp(_) => BlastMode::Xdp,
            Mode::XdpLive(_) => BlastMode::XdpLive,
        }
    }

    /// The frame modes' settings (`None` for UDP sockets).
    pub fn frames(&self) -> Option<&FrameSettings> {
        match self {
            Mode::Udp { .. } => None,
            Mode::Raw(f) | Mode::Xdp(f) | Mode::XdpLive(f) => Some(f),
        }
    }

    /// The echo settings, when echoes are taken back (UDP only).
    pub fn echo(&self) -> Option<&Echo> {
        match self {
            Mode::Udp { echo } => echo.as_ref(),
            _ => None,
        }
    }
}

/// What a UDP sender does with echoes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Echo {
    /// Loss above this percentage fails the run.
    pub max_loss_pct: Option<f64>,
    /// Seconds to wait for the last echoes.
    pub linger_s: f64,
    /// Receive buffer per flow socket, bytes.
    pub rcvbuf: Option<usize>,
}

impl Default for Echo {
    /// Wait a second for the last echoes; no loss bound; the default buffer.
    fn default() -> Echo {
        Echo {
            max_loss_pct: None,
            linger_s: 1.0,
            rcvbuf: None,
        }
    }
}

/// What the frame modes need to build a frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameSettings {
    /// The interface frames leave by.
    pub dev: String,
    /// Destination MAC (default: the neighbour entry of the destination on `dev`).
    pub dst_mac: Option<[u8; 6]>,
    /// 802.1Q tag.
    pub vlan: Option<u16>,
    /// The IPv4 TTL / IPv6 hop limit (default 64).
    #[serde(default)]
    pub ttl: Option<u8>,
    /// More interfaces to send on in the same run (pktgen's one thread per device): sender
    /// thread i sends on the (i mod n)-th of `dev` and these, so the thread count must be a
    /// multiple of the interfaces and each carries the same share of the rate.
    #[serde(default)]
    pub also: Vec<String>,
}

impl FrameSettings {
    /// Frames on `dev`, to the neighbour's MAC, untagged, TTL 64.
    pub fn on(dev: &str) -> FrameSettings {
        FrameSettings {
            dev: dev.to_string(),
            dst_mac: None,
            vlan: None,
            ttl: None,
            also: Vec::new(),
        }
    }

    /// Every interface sent on: `dev`, then `also`.
    pub fn devs(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.dev.as_str()).chain(self.also.iter().map(String::as_str))
    }
}

/// How a frame sender cuts datagrams into IP fragments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fragmenting {
    /// IP payload bytes a fragment carries at most (a multiple of 8, at least 8).
    pub piece: usize,
    /// The share of each flow's datagrams cut, 0 to 1 (evenly: datagram s is cut when
    /// ⌊(s+1)·share⌋ > ⌊s·share⌋), so mixed flows can be tested.
    pub share: f64,
    /// The order a datagram's fragments leave in.
    pub order: FragOrder,
    /// A hostile way to cut every datagram cut, for testing a device's reassembly.
    #[serde(default)]
    pub attack: Option<FragAttack>,
}

/// UDP mode: a share of each flow's datagrams made long enough that the kernel fragments them
/// (above the path MTU), the rest at the step's size, so one flow mixes fragmented and whole
/// datagrams through the kernel's own fragmentation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelFragmenting {
    /// The share of each flow's datagrams sent long, 0 to 1 (evenly, as [`Fragmenting`]).
    pub share: f64,
    /// Their UDP payload bytes (above what the path MTU carries whole).
    pub payload: usize,
}

/// The hostile cuts (`wire::fragment::Attack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FragAttack {
    /// The first fragment runs 8 bytes into the second.
    OverlapForward,
    /// The second fragment starts 8 bytes inside the first.
    OverlapBack,
    /// A first fragment of 8 bytes (the UDP header alone).
    TinyFirst,
    /// The first fragment again, right after it.
    Duplicate,
    /// The last fragment never sent.
    Incomplete,
    /// The second fragment wholly inside the first (offset 8, 8 bytes).
    Teardrop,
}

impl FragAttack {
    /// The cut it names.
    pub fn wire(self) -> flowlane_wire::fragment::Attack {
        use flowlane_wire::fragment::Attack;
        match self {
            FragAttack::OverlapForward => Attack::OverlapForward,
            FragAttack::OverlapBack => Attack::OverlapBack,
            FragAttack::TinyFirst => Attack::TinyFirst,
            FragAttack::Duplicate => Attack::Duplicate,
            FragAttack::Incomplete => Attack::Incomplete,
            FragAttack::Teardrop => Attack::Teardrop,
        }
    }
}

/// The order of a datagram's fragments on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FragOrder {
    /// By offset.
    InOrder,
    /// Last first.
    Reverse,
    /// The odd-numbered first, then the even (the kernel selftest `ip_defrag.c`'s order).
    OddEven,
    /// Shuffled per datagram.
    Random,
}

/// pktgen's per-packet ranges: destinations drawn from an address range and a port range,
/// kept by a flow for `flowlen` frames; source and destination MACs counting up per frame.
/// Frame modes that write each frame (raw, xdp).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spray {
    /// Destination addresses, inclusive, the family of `to` (whose address is the first).
    pub dst: (IpAddr, IpAddr),
    /// Destination ports, inclusive.
    pub dport: (u16, u16),
    /// Draw each destination at random (seeded by the run's `seed`); else count up through
    /// the ranges, ports first.
    pub random: bool,
    /// Frames a flow sends to one destination before it draws the next (pktgen's
    /// `flowlen`); 1: a new destination every frame.
    pub flowlen: u64,
    /// Source MACs: the interface's and the next ones up, one per frame in turn.
    pub src_macs: u32,
    /// Destination MACs likewise from the destination's.
    pub dst_macs: u32,
}

impl Spray {
    /// Destinations in the ranges (address × port), capped at u64::MAX.
    pub fn space(&self) -> u64 {
        let d = flowlane_rss::pick::addr_to_u128(self.dst.1)
            .saturating_sub(flowlane_rss::pick::addr_to_u128(self.dst.0));
        let addrs = u64::try_from(d).map_or(u64::MAX, |d| d.saturating_add(1));
        addrs.saturating_mul(u64::from(self.dport.1.saturating_sub(self.dport.0)) + 1)
    }
}

/// A send rate: packets per second, or bits per second on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rate {
    /// Packets per second.
    Pps(f64),
    /// Bits per second of Ethernet line rate (frame + FCS + preamble + inter-frame gap).
    Bps(f64),
}

impl Rate {
    /// Packets per second for frames of `frame` bytes (FCS excluded): a bit rate is divided by
    /// (frame + 4 FCS + 8 preamble/SFD + 12 gap) × 8, as a tester counts line rate.
    pub fn pps(&self, frame: f64) -> f64 {
        match *self {
            Rate::Pps(p) => p,
            Rate::Bps(b) => b / ((frame + 24.0) * 8.0),
        }
    }
}

impl std::fmt::Display for Rate {
    /// With its unit always written (`50000pps`, `1000000000bit`), so no reader can take
    /// packets for bits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Rate::Pps(p) => write!(f, "{p}pps"),
            Rate::Bps(b) => write!(f, "{b}bit"),
        }
    }
}

/// Frame sizes (FCS excluded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Frames {
    /// The smallest frame that carries the flowlane header: 60 bytes for IPv4, 78 for IPv6.
    Auto,
    /// One step per size (one size: a single step).
    Sizes(Vec<usize>),
    /// One step cycling through a mix: (size *with* FCS, as IMIX definitions give it, weight).
    Imix(Vec<(usize, u32)>),
    /// A UDP payload size instead of a frame size.
    Payload(usize),
}

/// How a hash becomes a queue, in a form a configuration file can hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelSpec {
    /// A NIC indirection table: RETA index → queue.
    Reta(Vec<u16>),
    /// `hash % n`.
    Modulo(u32),
    /// Linux RPS: `(hash * n) >> 32`.
    Rps(u32),
    /// FreeBSD buckets over this many CPUs, FreeBSD's default bit count.
    Freebsd(u32),
    /// FreeBSD buckets with the bits set by hand (`net.inet.rss.bits`).
    FreebsdBits {
        /// CPUs.
        cpus: u32,
        /// Bits of the hash that pick the bucket.
        bits: u32,
    },
}

impl ModelSpec {
    /// The spec of a built model.
    pub fn of(model: &QueueModel) -> ModelSpec {
        match model {
            QueueModel::Reta(r) => ModelSpec::Reta(r.entries().to_vec()),
            QueueModel::Modulo(n) => ModelSpec::Modulo(*n),
            QueueModel::Rps(n) => ModelSpec::Rps(*n),
            QueueModel::FreeBsd(b) if *b == FreeBsdBuckets::new(b.ncpus()) => {
                ModelSpec::Freebsd(b.ncpus())
            }
            QueueModel::FreeBsd(b) => ModelSpec::FreebsdBits {
                cpus: b.ncpus(),
                bits: b.bits(),
            },
        }
    }

    /// The model.
    pub fn build(&self) -> Result<QueueModel, ToolError> {
        Ok(match self {
            ModelSpec::Reta(t) => QueueModel::Reta(
                Reta::from_entries(t.clone()).map_err(|e| ToolError::usage(e.to_string()))?,
            ),
            ModelSpec::Modulo(n) => QueueModel::Modulo(*n),
            ModelSpec::Rps(n) => QueueModel::Rps(*n),
            ModelSpec::Freebsd(n) => QueueModel::FreeBsd(FreeBsdBuckets::new(*n)),
            ModelSpec::FreebsdBits { cpus, bits } => {
                QueueModel::FreeBsd(FreeBsdBuckets::with_bits(*bits, *cpus).ok_or_else(|| {
                    ToolError::usage(format!("FreeBSD takes 0 to 7 bits, not {bits}"))
                })?)
            }
        })
    }
}

/// Flows placed on RSS queues by the picker: `per_queue` source ports for each queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Flows per queue.
    pub per_queue: u64,
    /// Only these queues (empty: all of the model's).
    pub queues: Vec<u32>,
    /// The RSS key, hex.
    pub key: String,
    /// The NIC's symmetric hashing (ethtool `symmetric-xor`), if any.
    #[serde(default)]
    pub symmetric: Symmetric,
    /// Hash → queue.
    pub model: ModelSpec,
    /// The receiver hashes UDP/TCP ports too (the 4-tuple); `false`: addresses only (the
    /// 2-tuple), so flows are placed by source address, one address per flow.
    #[serde(default = "yes")]
    pub hash_ports: bool,
}

fn yes() -> bool {
    true
}

/// Where `rss verify` watches the run's frames arrive (`--verify-rss IF[@NETNS]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyAt {
    /// The receiving interface.
    pub dev: String,
    /// The namespace it is in (`ip netns` name); none: this one.
    #[serde(default)]
    pub netns: Option<String>,
}

/// The configuration of one `blast` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlastConfig {
    /// How frames leave, with that way's own settings.
    pub mode: Mode,
    /// Where traffic goes (a port other than 0). Only a capture replay (`pcap`) runs
    /// without one: its frames then keep their captured MACs unless `dst_mac` is given.
    #[serde(default)]
    pub to: Option<SocketAddr>,
    /// Source address range (default: the address the route to `to` uses).
    pub from: Option<(IpAddr, IpAddr)>,
    /// Source port range (default: chosen by the kernel; with placement 1024-65535).
    pub sport: Option<(u16, u16)>,
    /// Check at the receiving interface that the NIC hashed and queued the run's frames as
    /// its RSS says (attached before the first frame, judged after the last; the last step
    /// carries the verdict).
    #[serde(default)]
    pub verify_rss: Option<VerifyAt>,
    /// Flows (source address × port combinations) without placement.
    pub flows: u32,
    /// Choose sources at random (distinct) from the ranges, seeded by `seed`.
    pub random: bool,
    /// Seed for `random`.
    pub seed: u64,
    /// RSS placement instead of `flows`.
    pub placement: Option<Placement>,
    /// Frame sizes.
    pub frames: Frames,
    /// Datagrams in total (per step of a sweep).
    pub count: Option<u64>,
    /// Seconds of sending (per step).
    pub duration_s: Option<f64>,
    /// Rate over all threads (default: as fast as possible).
    pub rate: Option<Rate>,
    /// Token bucket depth when paced.
    pub burst: u32,
    /// When paced, how long a sender woken late may catch up on what fell due, seconds
    /// (bursts back to back); a longer stall gives its excess up and it is counted.
    #[serde(default = "default_catch_up_s")]
    pub catch_up_s: f64,
    /// Datagrams per sendmmsg call.
    pub batch: usize,
    /// Sender threads, one pinned per CPU (at most one per flow).
    pub cpus: Vec<usize>,
    /// Seconds between status ticks.
    pub interval_s: f64,
    /// Serve the workers' counters in the OpenMetrics text format at this address while
    /// running (`--metrics`).
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Send a capture's frames instead of building them (frame modes). `to` is then optional.
    #[serde(default)]
    pub pcap: Option<super::PcapSource>,
    /// Per-packet destination ranges, MAC counts and flowlen (frame modes raw and xdp).
    #[serde(default)]
    pub spray: Option<Spray>,
    /// Frame modes (raw, xdp): send datagrams as IP fragments of at most this many bytes of
    /// IP payload each (IPv4 and IPv6), a share of each flow's datagrams, in an order.
    #[serde(default)]
    pub fragments: Option<Fragmenting>,
    /// UDP mode: a share of each flow's datagrams long enough for the kernel to fragment.
    /// (Any datagram above the path MTU is fragmented and counted, with or without this.)
    #[serde(default)]
    pub kernel_fragments: Option<KernelFragmenting>,
    /// The first flow id (the flows' ids count up from it): two generators feeding one
    /// receiver keep their flows apart (rfc2544's probe beside a flood).
    #[serde(default)]
    pub first_id: u16,
    /// This run's shard of a larger one (its part of the flows, and of the rate and count),
    /// and a wall-clock start shared with the other shards.
    #[serde(default)]
    pub sharding: crate::shard::Sharding,
}

/// The catch-up a paced sender has by default: 10 ms, three times the few ms a competing
/// process holds a shared CPU (one scheduler slice), and so short that what a stall leaves to
/// catch up is at most 10 ms of the rate. Measured in BENCHMARKS.md ("Paced rates on a shared
/// CPU").
pub const DEFAULT_CATCH_UP_S: f64 = 0.010;

fn default_catch_up_s() -> f64 {
    DEFAULT_CATCH_UP_S
}

impl BlastConfig {
    /// The destination, which everything but a capture replay needs.
    pub fn dest(&self) -> Result<SocketAddr, crate::ToolError> {
        self.to.ok_or_else(|| {
            crate::ToolError::usage(
                "blast needs a destination: --to IP:PORT (only --pcap runs without one)",
            )
        })
    }

    /// A configuration with flowlane's defaults: one UDP flow to `to` from CPU `cpu`.
    pub fn new(to: SocketAddr, cpu: usize) -> BlastConfig {
        BlastConfig {
            metrics: None,
            mode: Mode::UDP,
            to: Some(to),
            from: None,
            sport: None,
            flows: 1,
            random: false,
            seed: 1,
            placement: None,
            verify_rss: None,
            frames: Frames::Auto,
            count: None,
            duration_s: None,
            rate: None,
            burst: 32,
            catch_up_s: DEFAULT_CATCH_UP_S,
            batch: 64,
            cpus: vec![cpu],
            interval_s: 1.0,
            pcap: None,
            spray: None,
            fragments: None,
            kernel_fragments: None,
            first_id: 0,
            sharding: Default::default(),
        }
    }
}

/// One cycle of frame sizes without FCS (size − 4), each size as often as its weight,
/// interleaved evenly (smooth weighted round robin: 64:7,594:4,1518:1 never sends the seven
/// small frames back to back).
pub fn imix_sequence(mix: &[(usize, u32)]) -> Vec<usize> {
    let total: i64 = mix.iter().map(|p| i64::from(p.1)).sum();
    let mut current = vec![0i64; mix.len()];
    (0..total)
        .filter_map(|_| {
            for (c, p) in current.iter_mut().zip(mix) {
                *c += i64::from(p.1);
            }
            let (best, _) = current
                .iter()
                .enumerate()
                .max_by_key(|&(i, c)| (*c, std::cmp::Reverse(i)))?;
            current[best] -= total;
            Some(mix[best].0.saturating_sub(4))
        })
        .collect()
}
