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

mod config;
mod packet;
pub use config::{ForwardConfig, ForwardMode, Mode, NotIp};
mod report;
pub mod worker;
mod xdp;
mod xdp_tables;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use crate::route::tables::{NextHopFile, RouteSource, RouteSummary, TablesTick};
pub use report::{
    BridgeSummary, Drops, ForwardCounts, ForwardReport, ForwardTick, PortCounts, REFUSED_FIX,
};

use crate::backend::{self, Backend};
use crate::ToolError;

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
    let kind = cfg.mode.kind();
    if kind == ForwardMode::Reflect && cfg.devs.len() != 1 {
        return Err(ToolError::usage(format!(
            "reflect runs on exactly one interface, not {}",
            cfg.devs.len()
        )));
    }
    if let (
        Mode::Route {
            flow_cache: Some(_),
            ..
        },
        Backend::XdpNative,
    ) = (&cfg.mode, cfg.backend)
    {
        return Err(ToolError::usage(
            "the flow cache is the user-space router's: use --backend af-packet or af-xdp (the \
             native XDP router looks every frame up in its own table)",
        ));
    }
    if kind == ForwardMode::Route && cfg.backend == Backend::XdpNative && cfg.cpus.is_some() {
        return Err(ToolError::usage(
            "the native XDP router runs on the CPU that received each frame: CPUs are chosen \
             by RSS, not --cpus",
        ));
    }
    if kind == ForwardMode::Bridge && cfg.backend == Backend::XdpNative && cfg.cpus.is_some() {
        return Err(ToolError::usage(
            "the native XDP bridge runs on the CPU that received each frame: CPUs are chosen \
             by RSS, not --cpus",
        ));
    }
    if kind == ForwardMode::Bridge && cfg.devs.len() < 2 {
        return Err(ToolError::usage(
            "a bridge needs two or more interfaces (--dev A --dev B)",
        ));
    }
    let duration = cfg
        .duration_s
        .map(|d| crate::seconds("duration", d))
        .transpose()?;
    let interval = crate::seconds("interval", cfg.interval_s)?;
    let swap = match cfg.mode {
        Mode::Reflect {
            swap_ip,
            swap_ports,
            ..
        } => flowlane_wire::forward::Swap {
            ip: swap_ip,
            ports: swap_ports,
        },
        _ => flowlane_wire::forward::Swap::default(),
    };
    if cfg.backend == Backend::XdpNative && cfg.cpus.is_some() {
        return Err(ToolError::usage(
            "native XDP runs on the CPU that received each frame: CPUs are chosen by RSS, not \
             --cpus (use --backend af-packet for pinned workers)",
        ));
    }
    if cfg.backend == Backend::AfPacket && cfg.mode.not_ip() == Some(NotIp::Drop) {
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
    match kind {
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
