//! `forward`: flowlane as the device under test — a reflector now; the bridge and the router
//! on our FIB are the next modes (issue 25). [`run`] takes a [`ForwardConfig`] and returns a
//! [`ForwardReport`] whose counts add up: every frame the interface received was reflected or
//! dropped for a named reason.
//!
//! Backends: native XDP (a generated program swaps and returns `XDP_TX` in the driver — the
//! CPU that received a frame sends it back, so RSS decides which core carries which flow),
//! AF_XDP (one pinned worker per receive queue, its socket's frames turned around where they
//! lie in the UMEM) and AF_PACKET rings (one pinned worker per CPU, each with its own receive
//! ring in a `PACKET_FANOUT_CPU` group and its own transmit ring).

mod packet;
mod report;
pub mod worker;
mod xdp;
mod xdp_tables;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use crate::route::tables::{NextHopFile, RouteSource, RouteSummary, TablesTick};
pub use report::{
    BridgeSummary, Drops, ForwardCounts, ForwardReport, ForwardTick, PortCounts, REFUSED_FIX,
};

use crate::backend::{self, Backend};
use crate::ToolError;

/// What the forwarder does with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// The configuration of one `forward` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardConfig {
    /// What to do with frames.
    pub mode: ForwardMode,
    /// The interfaces (reflect: exactly one; route: its ports).
    pub devs: Vec<String>,
    /// Route: where routes come from.
    #[serde(default)]
    pub routes: Option<RouteSource>,
    /// Route: next hops of a table file with numbered next hops.
    #[serde(default)]
    pub next_hops: Option<std::path::PathBuf>,
    /// Bridge: seconds an unseen MAC is kept (default 300, as the Linux bridge).
    #[serde(default)]
    pub ageing_s: Option<u32>,
    /// How frames reach the forwarder: `XdpNative` or `AfPacket`.
    pub backend: Backend,
    /// Reflect: swap IP addresses too.
    pub swap_ip: bool,
    /// Reflect: swap UDP/TCP ports too.
    pub swap_ports: bool,
    /// Frames that are not IP (when addresses or ports are swapped); `None`: what the backend
    /// does anyway — native XDP and AF_PACKET pass them to the kernel, AF_XDP drops them.
    pub not_ip: Option<NotIp>,
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

/// What is known once the forwarder runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardStart {
    /// The backend, as asked of the kernel.
    pub backend: backend::BackendReport,
    /// Route: what the tables hold.
    pub routes: Option<RouteSummary>,
    /// AF_PACKET: what the rings map.
    pub rings: Option<crate::rings::RingMemory>,
}

/// Status from a running forwarder.
#[derive(Debug, Clone, PartialEq)]
pub enum ForwardEvent {
    /// Frames are being forwarded from now on.
    Started(ForwardStart),
    /// One interval's counters.
    Tick(ForwardTick),
}

/// What a backend's run needs, resolved from the configuration.
pub(crate) struct Job<'a> {
    dev: &'a str,
    ifindex: u32,
    /// Every interface (name, index); the first is `dev`.
    ports: Vec<(String, u32)>,
    /// Route: what the tables hold.
    routes: Option<RouteSummary>,
    backend: backend::BackendReport,
    swap: flowlane_wire::forward::Swap,
    cfg: &'a ForwardConfig,
    duration: Option<std::time::Duration>,
    interval: std::time::Duration,
}

/// Runs the forwarder until the deadline or `stop`.
pub fn run(
    cfg: &ForwardConfig,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let Some(dev) = cfg.devs.first() else {
        return Err(ToolError::usage("no interface given (--dev)"));
    };
    if cfg.mode == ForwardMode::Reflect && cfg.devs.len() != 1 {
        return Err(ToolError::usage(format!(
            "reflect runs on exactly one interface, not {}",
            cfg.devs.len()
        )));
    }
    if cfg.mode == ForwardMode::Route && cfg.backend == Backend::XdpNative && cfg.cpus.is_some() {
        return Err(ToolError::usage(
            "the native XDP router runs on the CPU that received each frame: CPUs are chosen \
             by RSS, not --cpus",
        ));
    }
    if cfg.mode == ForwardMode::Bridge && cfg.backend == Backend::XdpNative && cfg.cpus.is_some() {
        return Err(ToolError::usage(
            "the native XDP bridge runs on the CPU that received each frame: CPUs are chosen \
             by RSS, not --cpus",
        ));
    }
    if cfg.mode == ForwardMode::Bridge && cfg.devs.len() < 2 {
        return Err(ToolError::usage(
            "a bridge needs two or more interfaces (--dev A --dev B)",
        ));
    }
    if cfg.mode != ForwardMode::Bridge && cfg.ageing_s.is_some() {
        return Err(ToolError::usage("--ageing is for --mode bridge"));
    }
    if cfg.mode != ForwardMode::Route && (cfg.routes.is_some() || cfg.next_hops.is_some()) {
        return Err(ToolError::usage(
            "--routes and --next-hops are for --mode route",
        ));
    }
    let duration = cfg
        .duration_s
        .map(|d| crate::seconds("duration", d))
        .transpose()?;
    let interval = crate::seconds("interval", cfg.interval_s)?;
    let swap = flowlane_wire::forward::Swap {
        ip: cfg.swap_ip,
        ports: cfg.swap_ports,
    };
    if cfg.backend == Backend::XdpNative && cfg.cpus.is_some() {
        return Err(ToolError::usage(
            "native XDP runs on the CPU that received each frame: CPUs are chosen by RSS, not \
             --cpus (use --backend af-packet for pinned workers)",
        ));
    }
    if cfg.backend == Backend::AfPacket && cfg.not_ip == Some(NotIp::Drop) {
        return Err(ToolError::usage(
            "AF_PACKET receives a copy: the kernel gets every frame anyway, so frames that are \
             not IP cannot be dropped (use --backend xdp, or --not-ip pass)",
        ));
    }
    if !matches!(
        cfg.backend,
        Backend::XdpNative | Backend::AfPacket | Backend::AfXdp
    ) {
        return Err(ToolError::usage(format!(
            "forward runs on native XDP, AF_XDP or AF_PACKET, not {:?}",
            cfg.backend
        )));
    }
    let mut ports = Vec::new();
    for d in &cfg.devs {
        let i =
            flowlane_io::netdev::ifindex(d).map_err(|e| ToolError::usage(format!("{d}: {e}")))?;
        if ports.iter().any(|p: &(String, u32)| p.1 == i) {
            return Err(ToolError::usage(format!("{d} is given twice")));
        }
        ports.push((d.clone(), i));
    }
    let ifindex = ports[0].1;
    let job = Job {
        dev,
        ifindex,
        ports,
        routes: None,
        backend: backend::choose(dev, cfg.backend)?,
        swap,
        cfg,
        duration,
        interval,
    };
    match cfg.mode {
        ForwardMode::Route if cfg.backend == Backend::XdpNative => {
            return xdp::run_route(job, stop, on_event)
        }
        ForwardMode::Route => return packet::run_route(job, stop, on_event),
        ForwardMode::Bridge if cfg.backend == Backend::XdpNative => {
            return xdp::run_bridge(&job, stop, on_event)
        }
        ForwardMode::Bridge => return packet::run_bridge(job, stop, on_event),
        ForwardMode::Reflect => {}
    }
    match cfg.backend {
        Backend::XdpNative => xdp::run(&job, stop, on_event),
        Backend::AfXdp => packet::run_xdp_sockets(&job, stop, on_event),
        _ => packet::run(&job, stop, on_event),
    }
}

/// The interface's receive and transmit frame counters (sysfs), for the report's cross-check.
fn dev_counters(dev: &str) -> (Option<u64>, Option<u64>) {
    (
        flowlane_io::netdev::counter(dev, "rx_packets"),
        flowlane_io::netdev::counter(dev, "tx_packets"),
    )
}
