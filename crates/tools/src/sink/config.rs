//! What a `sink` run is asked to do.

use serde::{Deserialize, Serialize};

use super::capture::CaptureSpec;

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
    /// The 5-tuples counted, in a bounded flow table per worker.
    #[serde(default)]
    pub tuples: TupleSpec,
    /// AF_PACKET: bytes the receive ring may map (`--ring-memory`); `ring` is its most slots.
    #[serde(default = "default_ring_memory")]
    pub ring_memory: u64,
    /// The limits of IP reassembly (per worker).
    #[serde(default)]
    pub reasm: ReasmSpec,
    /// Time only these flow ids (inclusive): the latency is theirs alone, every flow is still
    /// accounted (`None`: all). rfc2544's probe under a flood.
    #[serde(default)]
    pub timed_flows: Option<(u16, u16)>,
    /// This sink's shard of the receiving interface's queues (AF_PACKET: the frames of
    /// receive queues q with q mod N = I), and a wall-clock start.
    #[serde(default)]
    pub sharding: crate::shard::Sharding,
}

fn default_ring_memory() -> u64 {
    crate::rings::DEFAULT_BUDGET
}

/// How the sink reads frames.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
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

/// The limits of a sink worker's IP reassembly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasmSpec {
    /// Datagrams being reassembled at once (the least recently started is evicted beyond).
    pub contexts: usize,
    /// Bytes all of them may hold.
    pub bytes: usize,
    /// Fragments a datagram may have (≥ 45 takes a 64 KiB datagram at MTU 1 500).
    pub max_fragments: u16,
    /// Seconds a datagram may take from its first fragment.
    pub timeout_s: f64,
}

impl Default for ReasmSpec {
    /// Linux's 4 MiB and 30 s; VPP's 1 024 contexts; 64 fragments.
    fn default() -> ReasmSpec {
        ReasmSpec {
            contexts: 1024,
            bytes: 4 << 20,
            max_fragments: 64,
            timeout_s: 30.0,
        }
    }
}

/// The flow table a sink counts 5-tuples in: its records (per worker) and how long a tuple
/// may be idle before it expires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TupleSpec {
    /// Tuples held at once per worker; a new one beyond evicts the least recently seen of
    /// its buckets.
    pub capacity: usize,
    /// Seconds without a frame after which a tuple expires.
    pub idle_s: f64,
}

impl Default for TupleSpec {
    fn default() -> TupleSpec {
        TupleSpec {
            capacity: 65_536,
            idle_s: 30.0,
        }
    }
}
