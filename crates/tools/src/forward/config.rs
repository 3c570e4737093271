//! What a `forward` run is asked to do.

use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::route::tables::RouteSource;

/// What the forwarder does with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ForwardMode {
    /// Back out of the interface it came in on, MACs (and as asked addresses, ports) swapped.
    Reflect,
    /// IPv4 and IPv6 routing on our FIB between the interfaces: next hop by longest-prefix
    /// match, MACs rewritten, TTL decremented.
    Route,
    /// A learning bridge between the interfaces: MAC table with ageing, unknown unicast,
    /// broadcast and multicast flooded.
    Bridge,
}

/// Where frames that are not IP go, when the reflector swaps addresses or ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotIp {
    /// To the kernel's stack (ARP keeps working).
    Pass,
    /// Nowhere.
    Drop,
}

/// What the forwarder does, with each mode's own settings (a mode cannot be given another's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum Mode {
    /// Back out of the interface it came in on.
    Reflect {
        /// Swap IP addresses too.
        swap_ip: bool,
        /// Swap UDP/TCP ports too.
        swap_ports: bool,
        /// Frames that are not IP (when addresses or ports are swapped); `None`: what the
        /// backend does anyway — native XDP and AF_PACKET pass them to the kernel, AF_XDP
        /// drops them.
        not_ip: Option<NotIp>,
    },
    /// Routing on our FIB between the interfaces.
    Route {
        /// Where routes come from.
        routes: RouteSource,
        /// Next hops of a table file with numbered next hops.
        next_hops: Option<std::path::PathBuf>,
        /// A flow cache in front of the FIB (TRASH's idea: a hit skips the route lookup), of
        /// this many flows per worker; a route or neighbour change makes every entry stale.
        #[serde(default)]
        flow_cache: Option<usize>,
    },
    /// A learning bridge between the interfaces.
    Bridge {
        /// Seconds an unseen MAC is kept (300, as the Linux bridge, unless told).
        ageing_s: u32,
    },
}

impl Mode {
    /// Which mode, without its settings (as reports name it).
    pub fn kind(&self) -> ForwardMode {
        match self {
            Mode::Reflect { .. } => ForwardMode::Reflect,
            Mode::Route { .. } => ForwardMode::Route,
            Mode::Bridge { .. } => ForwardMode::Bridge,
        }
    }

    /// Where frames that are not IP go (reflect's setting; `None` elsewhere).
    pub fn not_ip(&self) -> Option<NotIp> {
        match self {
            Mode::Reflect { not_ip, .. } => *not_ip,
            _ => None,
        }
    }
}

/// The configuration of one `forward` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardConfig {
    /// What to do with frames, and that mode's settings.
    #[serde(flatten)]
    pub mode: Mode,
    /// The interfaces (reflect: exactly one; route and bridge: its ports).
    pub devs: Vec<String>,
    /// How frames reach the forwarder: `XdpNative`, `AfXdp` or `AfPacket`.
    pub backend: Backend,
    /// AF_PACKET: one worker per CPU, pinned (the kernel hands each the frames it received on
    /// that CPU); `None`: every usable CPU. Native XDP runs where the driver receives, so
    /// CPUs cannot be given there.
    pub cpus: Option<Vec<usize>>,
    /// Stop after this many seconds (else at Ctrl-C).
    pub duration_s: Option<f64>,
    /// Seconds between status ticks.
    pub interval_s: f64,
    /// Serve the workers' counters in the OpenMetrics text format at this address while
    /// running (`--metrics`).
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// AF_PACKET: bytes all the rings may map, split evenly over them (`--ring-memory`).
    #[serde(default = "default_ring_memory")]
    pub ring_memory: u64,
}

fn default_ring_memory() -> u64 {
    crate::rings::DEFAULT_BUDGET
}
