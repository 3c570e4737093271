//! The router's tables, loaded: routes from the kernel (an rtnetlink dump of the main table,
//! as `ip route show` lists it) or from a file (what `flowlane route gen` writes, or `ip route
//! show` output), next-hop MACs from the kernel's neighbour table or a next-hops file, and the
//! host's own addresses (the local table) so frames to them are left to the kernel.
//!
//! Next hops are keyed by what they are — the port and the gateway, the port alone for a
//! connected route, or nowhere — so 200 000 routes through one gateway share one next hop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use flowlane_io::netdev::{self, KernelRoute, Neighbour, RouteKind};
use flowlane_lpm::{Prefix, Rib};
use flowlane_runtime::route::{host_key_v4, Hop, NextHops};
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// Where routes come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouteSource {
    /// The kernel's main table in this namespace (rtnetlink dump).
    Kernel,
    /// A table file: `PREFIX/LEN NEXTHOP` lines (next hops then named by a next-hops file)
    /// or `ip route show` output.
    File(PathBuf),
}

/// The next hops of a table file with numbered next hops: `HOP DEV MAC`, `HOP DEV GATEWAY-IP`
/// (its MAC from the kernel's neighbour table), `HOP drop`; `*` for every hop not listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NextHopFile {
    /// Hop → entry.
    pub hops: HashMap<u32, NextHopLine>,
    /// For hops not listed.
    pub default: Option<NextHopLine>,
}

/// One line of a next-hops file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextHopLine {
    /// Out of `dev` to `mac`.
    Mac(String, [u8; 6]),
    /// Out of `dev` through gateway `ip`.
    Gateway(String, IpAddr),
    /// Dropped (counted as no route).
    Drop,
}

impl NextHopFile {
    /// Parses the file's text; errors name the line.
    pub fn parse(text: &str) -> Result<NextHopFile, String> {
        let mut f = NextHopFile::default();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |what: &str| format!("next hops line {}: {what} in `{line}`", i + 1);
            let fields: Vec<&str> = line.split_whitespace().collect();
            let entry = match fields[1..] {
                ["drop"] => NextHopLine::Drop,
                [dev, target] => {
                    if let Some(mac) = netdev::parse_mac(target) {
                        NextHopLine::Mac(dev.to_string(), mac)
                    } else if let Ok(ip) = target.parse::<IpAddr>() {
                        NextHopLine::Gateway(dev.to_string(), ip)
                    } else {
                        return Err(bad(
                            "expected a MAC (02:00:00:00:00:01) or a gateway address",
                        ));
                    }
                }
                _ => {
                    return Err(bad(
                        "expected `HOP DEV MAC`, `HOP DEV GATEWAY` or `HOP drop`",
                    ))
                }
            };
            if fields[0] == "*" {
                f.default = Some(entry);
            } else {
                let hop = fields[0]
                    .parse::<u32>()
                    .map_err(|_| bad("the next hop is not a number or `*`"))?;
                f.hops.insert(hop, entry);
            }
        }
        Ok(f)
    }
}

/// What the tables were loaded from and what they hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteSummary {
    /// `kernel` or the file's path.
    pub source: String,
    /// IPv4 routes in the FIB.
    pub routes_v4: usize,
    /// IPv6 routes in the FIB.
    pub routes_v6: usize,
    /// Distinct next hops.
    pub next_hops: usize,
    /// Next hops through a gateway whose MAC is not known (their routes drop as no
    /// neighbour until it is).
    pub unresolved: Vec<String>,
    /// Routes leaving by an interface the forwarder does not own (counted as no route).
    pub elsewhere: usize,
    /// Blackhole, unreachable and prohibit routes.
    pub discard: usize,
    /// Multipath routes, of which only the first path is used.
    pub multipath: usize,
}

/// Loaded tables, ready for the FIB writers.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// IPv4 routes.
    pub v4: Rib<u32>,
    /// IPv6 routes.
    pub v6: Rib<u128>,
    /// Next hops, neighbours, local addresses.
    pub hops: NextHops,
    /// Each next hop in words (`via 198.18.1.2 dev fldut1`, `dev fldut1`, `nowhere`).
    pub names: Vec<String>,
    /// The summary.
    pub summary: RouteSummary,
}

/// A next hop's identity, so equal ones share an index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HopKey {
    Via(u16, IpAddr),
    Mac(u16, [u8; 6]),
    Connected(u16),
    Nowhere,
}

/// Builds next hops as routes name them, resolving MACs from the neighbours given.
struct HopTable<'a> {
    ports: &'a [(String, u32)],
    neigh: &'a [Neighbour],
    index: HashMap<HopKey, u32>,
    out: Loaded,
}

impl<'a> HopTable<'a> {
    fn new(ports: &'a [(String, u32)], neigh: &'a [Neighbour], source: String) -> Self {
        let mut out = Loaded::default();
        out.summary.source = source;
        for n in neigh {
            if let (Some(p), Some(mac)) = (ports.iter().position(|x| x.1 == n.ifindex), n.mac) {
                out.hops.hosts.insert((p as u16, key_of(n.ip)), mac);
            }
        }
        HopTable {
            ports,
            neigh,
            index: HashMap::new(),
            out,
        }
    }

    fn port_of_ifindex(&self, ifindex: u32) -> Option<u16> {
        self.ports
            .iter()
            .position(|p| p.1 == ifindex)
            .map(|p| p as u16)
    }

    fn port_of_dev(&self, dev: &str) -> Result<u16, ToolError> {
        self.ports
            .iter()
            .position(|p| p.0 == dev)
            .map(|p| p as u16)
            .ok_or_else(|| {
                ToolError::usage(format!(
                    "next hop on `{dev}`, which is not one of the forwarder's interfaces (--dev)"
                ))
            })
    }

    fn hop(&mut self, key: HopKey) -> u32 {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.out.hops.hops.len() as u32;
        let (hop, name) = match &key {
            HopKey::Via(port, gw) => {
                let ifindex = self.ports[*port as usize].1;
                let mac = self
                    .neigh
                    .iter()
                    .find(|n| n.ifindex == ifindex && n.ip == *gw)
                    .and_then(|n| n.mac);
                let name = format!("via {gw} dev {}", self.ports[*port as usize].0);
                if mac.is_none() {
                    self.out.summary.unresolved.push(name.clone());
                }
                (Hop::Via { port: *port, mac }, name)
            }
            HopKey::Mac(port, mac) => (
                Hop::Via {
                    port: *port,
                    mac: Some(*mac),
                },
                format!("to {} dev {}", fmt_mac(mac), self.ports[*port as usize].0),
            ),
            HopKey::Connected(port) => (
                Hop::Connected { port: *port },
                format!("dev {}", self.ports[*port as usize].0),
            ),
            HopKey::Nowhere => (Hop::Nowhere, "nowhere".to_string()),
        };
        self.out.hops.hops.push(hop);
        self.out.names.push(name);
        self.index.insert(key, i);
        i
    }

    fn insert(&mut self, dst: IpAddr, len: u8, hop: u32) -> Result<(), ToolError> {
        let bad =
            |e: flowlane_lpm::PrefixError| ToolError::usage(format!("route {dst}/{len}: {e}"));
        match dst {
            IpAddr::V4(a) => {
                let p = Prefix::new(u32::from(a), len).map_err(bad)?;
                self.out.v4.insert(p, hop).map_err(bad)?;
            }
            IpAddr::V6(a) => {
                let p = Prefix::new(u128::from(a), len).map_err(bad)?;
                self.out.v6.insert(p, hop).map_err(bad)?;
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Loaded {
        self.out.summary.routes_v4 = self.out.v4.len();
        self.out.summary.routes_v6 = self.out.v6.len();
        self.out.summary.next_hops = self.out.hops.hops.len();
        self.out
    }
}

/// An address of either family as the runtime's host key.
pub fn key_of(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => host_key_v4(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The main table's routes (254), the neighbours and the local addresses, as the kernel of the
/// calling thread's namespace has them.
fn kernel_state() -> Result<(Vec<KernelRoute>, Vec<Neighbour>), ToolError> {
    let routes = netdev::routes().map_err(|e| ToolError::runtime(e.to_string()))?;
    let neigh = netdev::neighbours().map_err(|e| ToolError::runtime(e.to_string()))?;
    Ok((routes, neigh))
}

/// Table 254, `main`.
pub const MAIN_TABLE: u32 = 254;
/// Table 255, `local`.
const LOCAL_TABLE: u32 = 255;
/// `RTN_LOCAL`: an address of this host.
const RTN_LOCAL: u8 = 2;

/// The next hop a kernel route names, for ports `ports`.
fn kernel_hop(t: &mut HopTable<'_>, r: &KernelRoute) -> u32 {
    match r.kind {
        RouteKind::Unicast => {
            if r.paths > 1 {
                t.out.summary.multipath += 1;
            }
            match r.oif.and_then(|i| t.port_of_ifindex(i)) {
                None => {
                    t.out.summary.elsewhere += 1;
                    t.hop(HopKey::Nowhere)
                }
                Some(port) => match r.gateway {
                    Some(gw) => t.hop(HopKey::Via(port, gw)),
                    None => t.hop(HopKey::Connected(port)),
                },
            }
        }
        _ => {
            t.out.summary.discard += 1;
            t.hop(HopKey::Nowhere)
        }
    }
}

/// Loads the tables for a forwarder on `ports` (name, ifindex), in the calling thread's
/// namespace.
pub fn load(
    source: &RouteSource,
    next_hops: Option<&NextHopFile>,
    ports: &[(String, u32)],
) -> Result<Loaded, ToolError> {
    let (kroutes, neigh) = kernel_state()?;
    let local = kroutes
        .iter()
        .filter(|r| r.table == LOCAL_TABLE && r.kind == RouteKind::Other(RTN_LOCAL))
        .map(|r| key_of(r.dst));
    match source {
        RouteSource::Kernel => {
            let mut t = HopTable::new(ports, &neigh, "kernel".into());
            t.out.hops.local.extend(local);
            for r in kroutes.iter().filter(|r| r.table == MAIN_TABLE) {
                if matches!(r.kind, RouteKind::Other(_)) {
                    continue;
                }
                let hop = kernel_hop(&mut t, r);
                t.insert(r.dst, r.len, hop)?;
            }
            Ok(t.finish())
        }
        RouteSource::File(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ToolError::usage(format!("{}: {e}", path.display())))?;
            let table = flowlane_lpm::load::parse(&text, flowlane_lpm::load::Format::Auto)
                .map_err(|e| ToolError::usage(format!("{}: {e}", path.display())))?;
            let mut t = HopTable::new(ports, &neigh, path.display().to_string());
            t.out.hops.local.extend(local);
            // File hop → our hop, resolved once per file hop.
            let mut map: HashMap<u32, u32> = HashMap::new();
            let mut resolve = |t: &mut HopTable<'_>, h: u32| -> Result<u32, ToolError> {
                if let Some(&i) = map.get(&h) {
                    return Ok(i);
                }
                let i = if table.legend.is_empty() {
                    file_hop(t, next_hops, h)?
                } else {
                    legend_hop(t, table.legend.get(h as usize).map_or("", String::as_str))
                };
                map.insert(h, i);
                Ok(i)
            };
            for (p, h) in &table.v4 {
                let hop = resolve(&mut t, *h)?;
                t.insert(
                    IpAddr::from(std::net::Ipv4Addr::from(p.addr())),
                    p.len(),
                    hop,
                )?;
            }
            for (p, h) in &table.v6 {
                let hop = resolve(&mut t, *h)?;
                t.insert(
                    IpAddr::from(std::net::Ipv6Addr::from(p.addr())),
                    p.len(),
                    hop,
                )?;
            }
            Ok(t.finish())
        }
    }
}

/// The kernel's main table (this thread's namespace) as a [`flowlane_lpm::Table`] whose
/// legend names each next hop as [`load`] resolves it, every interface a route leaves by
/// taken as a port: what `flowlane route lookup --table kernel` answers from.
pub fn kernel_table() -> Result<flowlane_lpm::Table, ToolError> {
    let routes = netdev::routes().map_err(|e| ToolError::runtime(e.to_string()))?;
    let mut ports: Vec<(String, u32)> = Vec::new();
    for oif in routes
        .iter()
        .filter(|r| r.table == MAIN_TABLE)
        .filter_map(|r| r.oif)
    {
        if !ports.iter().any(|p| p.1 == oif) {
            let name = netdev::ifname(oif).unwrap_or_else(|_| format!("if{oif}"));
            ports.push((name, oif));
        }
    }
    let l = load(&RouteSource::Kernel, None, &ports)?;
    Ok(flowlane_lpm::Table {
        v4: l.v4.iter().collect(),
        v6: l.v6.iter().collect(),
        legend: l.names,
    })
}

/// A numbered next hop through the next-hops file.
fn file_hop(t: &mut HopTable<'_>, file: Option<&NextHopFile>, h: u32) -> Result<u32, ToolError> {
    let Some(file) = file else {
        return Err(ToolError::usage(
            "a table with numbered next hops needs --next-hops FILE (lines `HOP DEV MAC`, `HOP \
             DEV GATEWAY` or `HOP drop`; `*` for every hop not listed)",
        ));
    };
    let Some(line) = file.hops.get(&h).or(file.default.as_ref()) else {
        return Err(ToolError::usage(format!(
            "next hop {h} is not in the next-hops file (add a line for it, or a `*` line)"
        )));
    };
    Ok(match line {
        NextHopLine::Drop => t.hop(HopKey::Nowhere),
        NextHopLine::Mac(dev, mac) => {
            let port = t.port_of_dev(dev)?;
            t.hop(HopKey::Mac(port, *mac))
        }
        NextHopLine::Gateway(dev, gw) => {
            let port = t.port_of_dev(dev)?;
            t.hop(HopKey::Via(port, *gw))
        }
    })
}

/// A next hop of `ip route show` text (`via GW dev DEV`, `dev DEV`, `blackhole`, …).
fn legend_hop(t: &mut HopTable<'_>, legend: &str) -> u32 {
    let words: Vec<&str> = legend.split_whitespace().collect();
    let after = |w: &str| {
        words
            .iter()
            .position(|x| *x == w)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    let port = after("dev").and_then(|d| t.ports.iter().position(|p| p.0 == d));
    let gw = after("via").and_then(|g| g.parse::<IpAddr>().ok());
    match (port, gw) {
        (Some(p), Some(gw)) => t.hop(HopKey::Via(p as u16, gw)),
        (Some(p), None) => t.hop(HopKey::Connected(p as u16)),
        (None, _) => {
            if after("dev").is_some() {
                t.out.summary.elsewhere += 1;
            } else {
                t.out.summary.discard += 1;
            }
            t.hop(HopKey::Nowhere)
        }
    }
}

/// The next hops again, with the neighbour table as it is now (hop identities and indices
/// unchanged): what a running router swaps in each second so a gateway resolved later starts
/// forwarding.
pub fn refresh_neighbours(loaded: &Loaded, ports: &[(String, u32)]) -> Result<NextHops, ToolError> {
    let neigh = netdev::neighbours().map_err(|e| ToolError::runtime(e.to_string()))?;
    let mut hops = loaded.hops.clone();
    hops.hosts.clear();
    for n in &neigh {
        if let (Some(p), Some(mac)) = (ports.iter().position(|x| x.1 == n.ifindex), n.mac) {
            hops.hosts.insert((p as u16, key_of(n.ip)), mac);
        }
    }
    for (hop, name) in hops.hops.iter_mut().zip(&loaded.names) {
        if let Hop::Via { port, mac } = hop {
            // A gateway by address (not a MAC from the file): look it up again.
            if let Some(gw) = name
                .strip_prefix("via ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|g| g.parse::<IpAddr>().ok())
            {
                let ifindex = ports.get(*port as usize).map_or(0, |p| p.1);
                *mac = neigh
                    .iter()
                    .find(|n| n.ifindex == ifindex && n.ip == gw)
                    .and_then(|n| n.mac);
            }
        }
    }
    Ok(hops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_hop_files_parse_and_bad_lines_say_where() {
        let f = NextHopFile::parse(
            "# hops\n0 fldut1 02:00:00:00:00:05\n1 fldut1 198.18.1.2\n2 drop\n* fldut1 198.18.1.2\n",
        )
        .expect("parses");
        assert_eq!(
            f.hops.get(&0),
            Some(&NextHopLine::Mac("fldut1".into(), [2, 0, 0, 0, 0, 5]))
        );
        assert_eq!(
            f.hops.get(&1),
            Some(&NextHopLine::Gateway(
                "fldut1".into(),
                "198.18.1.2".parse().expect("ip")
            ))
        );
        assert_eq!(f.hops.get(&2), Some(&NextHopLine::Drop));
        assert!(f.default.is_some());
        let e = NextHopFile::parse("0 fldut1\n").expect_err("too few fields");
        assert!(e.contains("line 1"), "{e}");
        let e = NextHopFile::parse("\nx fldut1 198.18.1.2\n").expect_err("not a number");
        assert!(e.contains("line 2"), "{e}");
        assert!(NextHopFile::parse("0 d zz:zz\n").is_err());
    }
}
