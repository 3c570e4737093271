//! What `serve` is asked to do.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// What the server does with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServeMode {
    /// Send every datagram back to its source, unchanged.
    Echo,
    /// Count and drop.
    Sink,
}

/// The configuration of one `serve` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServeConfig {
    /// Address every worker's socket binds (a port other than 0).
    pub bind: SocketAddr,
    /// Echo or sink.
    pub mode: ServeMode,
    /// One pinned worker per CPU (already checked usable by the caller, or refused by the
    /// runtime when pinning fails).
    pub cpus: Vec<usize>,
    /// Datagrams per poll round (NAPI-style quota).
    pub budget: usize,
    /// Stop after this many seconds (`None`: when the stop flag is set).
    pub duration_s: Option<f64>,
    /// Seconds between status ticks.
    pub interval_s: f64,
    /// Receive buffer to request per socket, bytes (forced where CAP_NET_ADMIN allows).
    pub rcvbuf: usize,
    /// Send buffer to request per socket, bytes.
    pub sndbuf: usize,
    /// CPU steering (a generated program hands each datagram to the worker on the CPU that
    /// processed it); off: the kernel's reuseport hash.
    pub steer: bool,
    /// Steer by the software Toeplitz hash instead of the CPU (FreeBSD's re-dispatch of a
    /// reassembled datagram to its bucket's CPU): with `steer` on.
    #[serde(default)]
    pub hash_steer: Option<HashSteer>,
    /// Receive with UDP_GRO.
    pub gro: bool,
    /// Echo with UDP_SEGMENT (GSO).
    pub gso: bool,
    /// Spin up to this many microseconds on the socket before sleeping (SO_BUSY_POLL).
    pub busy_poll_us: Option<u32>,
    /// Attach the mis-steering detector (an eBPF socket filter per worker).
    pub detect: bool,
    /// Count datagrams per source address in each worker.
    pub by_source: bool,
    /// IPv6 only (no IPv4-mapped clients).
    pub v6only: bool,
    /// Serve the workers' counters in the OpenMetrics text format at this address while
    /// running (`--metrics`).
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Which shard of a sharded run this server is (each on a host or pod of its own), and a
    /// wall-clock start.
    #[serde(default)]
    pub sharding: crate::shard::Sharding,
}

/// Hash steering: the key and each bucket's queue; queue q is served by worker q mod n.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HashSteer {
    /// The Toeplitz key's bytes.
    pub key: Vec<u8>,
    /// Per bucket (`hash % len`; a power of two is `hash & (len - 1)`), its queue.
    pub buckets: Vec<u32>,
}

impl ServeConfig {
    /// A configuration with flowlane's defaults for `bind` on `cpus`.
    pub fn new(bind: SocketAddr, cpus: Vec<usize>) -> ServeConfig {
        ServeConfig {
            metrics: None,
            bind,
            mode: ServeMode::Echo,
            cpus,
            budget: 64,
            duration_s: None,
            interval_s: 1.0,
            rcvbuf: 4 << 20,
            sndbuf: 4 << 20,
            steer: true,
            hash_steer: None,
            gro: false,
            gso: false,
            busy_poll_us: None,
            detect: true,
            by_source: false,
            v6only: false,
            sharding: Default::default(),
        }
    }
}
