//! What the frame modes need to know about the interface: index, MACs, MTU, and whether a
//! requested rate fits its line rate.

use std::net::SocketAddr;

use super::sender::RawLink;
use flowlane_io::netdev;

use super::{BlastConfig, FrameSettings};
use crate::ToolError;

/// `aa:bb:cc:dd:ee:ff` (for the command line's `--dst-mac`).
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    netdev::parse_mac(s).ok_or_else(|| format!("`{s}` is not a MAC address like 02:00:00:00:00:01"))
}

/// Resolves what the frame modes need about the configured interface for frames up to
/// `frame` bytes: index, MACs (the destination's from the neighbour table unless given), and
/// a check against its MTU.
pub fn raw_link(
    f: &FrameSettings,
    to: Option<SocketAddr>,
    frame: usize,
) -> Result<RawLink, ToolError> {
    let dev = f.dev.as_str();
    let src_mac = netdev::mac(dev).ok_or_else(|| {
        ToolError::usage(format!(
            "no interface `{dev}` here (see `ip link`; in a namespace, run inside it)"
        ))
    })?;
    let mtu = netdev::mtu(dev).unwrap_or(1500);
    let max = mtu + 14 + if f.vlan.is_some() { 4 } else { 0 };
    if frame > max {
        return Err(ToolError::usage(format!(
            "a {frame}-byte frame is above what {dev} carries (MTU {mtu}: at most {max} bytes \
             without FCS)"
        )));
    }
    let ifindex =
        flowlane_io::netdev::ifindex(dev).map_err(|e| ToolError::usage(format!("{dev}: {e}")))?;
    let dst_mac = match (f.dst_mac, to) {
        (Some(m), _) => m,
        (None, Some(to)) => neighbour_mac(to, dev)?,
        (None, None) => {
            return Err(ToolError::usage(
                "frames need a destination MAC: --dst-mac, or --to IP:PORT to look it up",
            ))
        }
    };
    Ok(RawLink {
        ifindex,
        src_mac,
        dst_mac,
        vlan: f.vlan,
        ttl: f.ttl,
        max_frame: frame,
        qdisc_bypass: true,
    })
}

/// The neighbour table's MAC for `dst` on `dev` (rtnetlink, as `ip neigh show` reads it) or,
/// for a destination behind a router, the MAC of the gateway the kernel's route to it names
/// (as `ip route get` answers): frames then go to the router, as the kernel would send them.
pub fn neighbour_mac(dst: SocketAddr, dev: &str) -> Result<[u8; 6], ToolError> {
    let ifindex = netdev::ifindex(dev).map_err(|e| ToolError::usage(format!("{dev}: {e}")))?;
    let lookup =
        |ip| netdev::neighbour_mac(ifindex, ip).map_err(|e| ToolError::runtime(e.to_string()));
    if let Some(mac) = lookup(dst.ip())? {
        return Ok(mac);
    }
    let gateway = netdev::route_get(dst.ip())
        .ok()
        .flatten()
        .filter(|r| r.oif == Some(ifindex))
        .and_then(|r| r.gateway);
    if let Some(gw) = gateway {
        if let Some(mac) = lookup(gw)? {
            return Ok(mac);
        }
    }
    let via = gateway.map_or(String::new(), |g| format!(" (nor for its gateway {g})"));
    Err(ToolError::usage(format!(
        "no neighbour entry for {}{via} on {dev}: give the destination MAC, or let the kernel \
         resolve it first (e.g. ping it once)",
        dst.ip()
    )))
}

/// Refuses a rate above what the egress link can carry, when the link reports a speed (veth
/// says 10 Gb/s; loopback says nothing and is not checked).
pub fn check_line_rate(a: &BlastConfig, frame: f64, pps: f64) -> Result<(), ToolError> {
    let dev = match a.mode.frames() {
        Some(f) => f.dev.clone(),
        // The interface the route to the destination leaves by (rtnetlink, as `ip route get`).
        None => match a.to.and_then(|t| netdev::route_oif(t.ip()).ok().flatten()) {
            Some(i) => match netdev::ifname(i) {
                Ok(name) => name,
                Err(_) => return Ok(()),
            },
            None => return Ok(()),
        },
    };
    let speed_mbps = netdev::speed_mbps(&dev);
    if let Some(mbps) = speed_mbps {
        let max = mbps * 1e6 / ((frame + 24.0) * 8.0);
        if pps > max * 1.0001 {
            return Err(ToolError::usage(format!(
                "a rate of {pps:.0} pps is more than {dev} ({mbps:.0} Mb/s) can carry with \
                 {frame:.0}-byte frames: at most {max:.0} pps (frame + 4 FCS + 20 preamble/gap)"
            )));
        }
    }
    Ok(())
}
