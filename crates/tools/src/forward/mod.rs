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
mod xdp;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use report::{Drops, ForwardCounts, ForwardReport, ForwardTick};

use crate::backend::{self, Backend};
use crate::ToolError;

/// What the forwarder does with a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForwardMode {
    /// Back out of the interface it came in on, MACs (and as asked addresses, ports) swapped.
    Reflect,
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
    /// The interface (reflect: exactly one).
    pub devs: Vec<String>,
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
}

/// What is known once the forwarder runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardStart {
    /// The backend, as asked of the kernel.
    pub backend: backend::BackendReport,
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
    let [dev] = cfg.devs.as_slice() else {
        return Err(ToolError::usage(format!(
            "reflect runs on exactly one interface, not {}",
            cfg.devs.len()
        )));
    };
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
    if cfg.backend == Backend::AfXdp && cfg.not_ip == Some(NotIp::Pass) {
        return Err(ToolError::usage(
            "AF_XDP takes every frame from the kernel, so frames that are not IP cannot be \
             passed to it (use --backend xdp, or --not-ip drop)",
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
    let ifindex =
        flowlane_io::netdev::ifindex(dev).map_err(|e| ToolError::usage(format!("{dev}: {e}")))?;
    let job = Job {
        dev,
        ifindex,
        backend: backend::choose(dev, cfg.backend)?,
        swap,
        cfg,
        duration,
        interval,
    };
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
