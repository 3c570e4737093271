//! The router's tables, loaded: routes from the kernel (an rtnetlink dump of the main table,
//! as `ip route show` lists it) or from a file (what `flowlane route gen` writes, or `ip route
//! show` output), next-hop MACs from the kernel's neighbour table or a next-hops file, and the
//! host's own addresses (the local table) so frames to them are left to the kernel.
//!
//! Next hops are keyed by what they are — the port and the gateway, the port alone for a
//! connected route, or nowhere — so 200 000 routes through one gateway share one next hop.
//! While a router runs, [`LiveTables`] applies the kernel's route changes (an rtnetlink
//! monitor) through the FIB writers and reads the neighbour table again, each second.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use std::sync::Arc;

use super::decide::{host_key_v4, FastMap, FastSet, Hop, NextHops, Tables};
use arc_swap::ArcSwap;
use flowlane_io::netdev::{self, KernelRoute, Neighbour, RouteChange, RouteKind, RouteMonitor};
use flowlane_lpm::{FibWriter, Prefix, Rib};
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// Where routes come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
            let bad = |what: &str| {
                format!(
                    "next hops line {}: {what} in {}",
                    i + 1,
                    crate::input::excerpt(line)
                )
            };
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RouteSummary {
    /// `kernel` or the file's path.
    pub source: String,
    /// IPv4 routes in the FIB (at the end of a run).
    pub routes_v4: usize,
    /// IPv6 routes in the FIB.
    pub routes_v6: usize,
    /// Distinct next hops.
    pub next_hops: usize,
    /// Next hops through a gateway whose MAC was not known at the start (their routes drop
    /// as no neighbour until it is; the router asks the kernel to resolve them).
    pub unresolved: Vec<String>,
    /// Requests to the kernel to resolve a gateway without a MAC (ARP or neighbour
    /// solicitation, as for a packet of its own): at once, then after 1, 2, 4 … 64 s while
    /// it stays unresolved.
    #[serde(default)]
    pub neighbour_requests: u64,
    /// Of those, requests the kernel refused (the gateway's routes stay no neighbour).
    #[serde(default)]
    pub neighbour_requests_refused: u64,
    /// Routes leaving by an interface the forwarder does not own (counted as no route).
    pub elsewhere: usize,
    /// Blackhole, unreachable and prohibit routes.
    pub discard: usize,
    /// Multipath routes, of which only the first path is used.
    pub multipath: usize,
    /// Kernel source: route changes applied while forwarding (added, replaced or removed).
    #[serde(default)]
    pub changes_applied: u64,
    /// Kernel source: times the change stream overflowed and the whole table was read again.
    #[serde(default)]
    pub reloads: u64,
}

/// A next hop's identity, so equal ones share an index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HopKey {
    Via(u16, IpAddr),
    Mac(u16, [u8; 6]),
    Connected(u16),
    Nowhere,
}

/// The next hops as routes name them, each once, with MACs from the neighbours given.
#[derive(Debug, Clone, Default)]
pub struct Hops {
    ports: Vec<(String, u32)>,
    index: HashMap<HopKey, u32>,
    keys: Vec<HopKey>,
    /// What the workers read.
    pub table: NextHops,
    /// Each next hop in words (`via 198.18.1.2 dev fldut1`, `dev fldut1`, `nowhere`).
    pub names: Vec<String>,
    /// Gateways without a MAC asked of the kernel: when next, and the wait after that.
    asked: HashMap<usize, (std::time::Instant, std::time::Duration)>,
}

/// A gateway that stays unresolved is asked for again after 1 s, then twice as long each
/// time, at most this long apart (the kernel sends its ARP or solicitation probes per ask).
const ASK_AGAIN_MAX: std::time::Duration = std::time::Duration::from_secs(64);

impl Hops {
    fn new(ports: &[(String, u32)]) -> Hops {
        Hops {
            ports: ports.to_vec(),
            ..Hops::default()
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

    fn gateway_mac(&self, port: u16, gw: IpAddr, neigh: &[Neighbour]) -> Option<[u8; 6]> {
        let ifindex = self.ports.get(port as usize)?.1;
        neigh
            .iter()
            .find(|n| n.ifindex == ifindex && n.ip == gw)
            .and_then(|n| n.mac)
    }

    /// The index of next hop `key`, added (resolved against `neigh`) if new.
    fn hop(&mut self, key: HopKey, neigh: &[Neighbour], summary: &mut RouteSummary) -> u32 {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.table.hops.len() as u32;
        let dev = |p: u16| self.ports[p as usize].0.clone();
        let (hop, name) = match &key {
            HopKey::Via(port, gw) => {
                let mac = self.gateway_mac(*port, *gw, neigh);
                let name = format!("via {gw} dev {}", dev(*port));
                if mac.is_none() {
                    summary.unresolved.push(name.clone());
                }
                (Hop::Via { port: *port, mac }, name)
            }
            HopKey::Mac(port, mac) => (
                Hop::Via {
                    port: *port,
                    mac: Some(*mac),
                },
                format!("to {} dev {}", flowlane_wire::Mac(*mac), dev(*port)),
            ),
            HopKey::Connected(port) => (
                Hop::Connected { port: *port },
                format!("dev {}", dev(*port)),
            ),
            HopKey::Nowhere => (Hop::Nowhere, "nowhere".to_string()),
        };
        self.table.hops.push(hop);
        self.names.push(name);
        self.keys.push(key.clone());
        self.index.insert(key, i);
        summary.next_hops = self.table.hops.len();
        i
    }

    /// Asks the kernel to resolve the gateways without a MAC (nothing else would: the
    /// kernel sends nothing of its own to a gateway the router forwards to) — at once, then
    /// backing off while one stays unresolved. How many it asked for, and how many of those
    /// the kernel refused.
    fn ask_unresolved(&mut self) -> (u64, u64) {
        let now = std::time::Instant::now();
        let (mut asked, mut refused) = (0, 0);
        for (i, (key, hop)) in self.keys.iter().zip(&self.table.hops).enumerate() {
            let (HopKey::Via(port, gw), Hop::Via { mac: None, .. }) = (key, hop) else {
                self.asked.remove(&i);
                continue;
            };
            let (next, wait) = self
                .asked
                .entry(i)
                .or_insert((now, std::time::Duration::from_secs(1)));
            if now < *next {
                continue;
            }
            (*next, *wait) = (now + *wait, (*wait * 2).min(ASK_AGAIN_MAX));
            let ifindex = self.ports.get(usize::from(*port)).map(|p| p.1);
            if let Some(ifindex) = ifindex {
                asked += 1;
                refused += u64::from(netdev::resolve_neighbour(ifindex, *gw).is_err());
            }
        }
        (asked, refused)
    }

    /// Takes the neighbour table as it is now: hosts on connected links and gateways' MACs
    /// (hop identities and indices unchanged). Whether anything changed.
    fn resolve(&mut self, neigh: &[Neighbour]) -> bool {
        let mut hosts = FastMap::default();
        for n in neigh {
            if let (Some(p), Some(mac)) = (self.port_of_ifindex(n.ifindex), n.mac) {
                hosts.insert((p, key_of(n.ip)), mac);
            }
        }
        let mut changed = hosts != self.table.hosts;
        self.table.hosts = hosts;
        for i in 0..self.keys.len() {
            if let HopKey::Via(port, gw) = self.keys[i] {
                let mac = self.gateway_mac(port, gw, neigh);
                if self.table.hops[i] != (Hop::Via { port, mac }) {
                    self.table.hops[i] = Hop::Via { port, mac };
                    changed = true;
                }
            }
        }
        changed
    }
}

/// Loaded tables, ready for the FIB writers.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// IPv4 routes.
    pub v4: Rib<u32>,
    /// IPv6 routes.
    pub v6: Rib<u128>,
    /// Next hops, neighbours, local addresses.
    pub hops: Hops,
    /// The summary.
    pub summary: RouteSummary,
}

fn insert(
    v4: &mut Rib<u32>,
    v6: &mut Rib<u128>,
    dst: IpAddr,
    len: u8,
    hop: u32,
) -> Result<(), ToolError> {
    let bad = |e: flowlane_lpm::PrefixError| ToolError::usage(format!("route {dst}/{len}: {e}"));
    match dst {
        IpAddr::V4(a) => {
            v4.insert(Prefix::new(u32::from(a), len).map_err(bad)?, hop)
                .map_err(bad)?;
        }
        IpAddr::V6(a) => {
            v6.insert(Prefix::new(u128::from(a), len).map_err(bad)?, hop)
                .map_err(bad)?;
        }
    }
    Ok(())
}

/// An address of either family as the runtime's host key.
pub fn key_of(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => host_key_v4(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// Table 254, `main`.
pub const MAIN_TABLE: u32 = 254;
/// Table 255, `local`.
const LOCAL_TABLE: u32 = 255;
/// `RTN_LOCAL`: an address of this host.
const RTN_LOCAL: u8 = 2;

/// The key of one of this host's addresses, for a route that is one (`local` table, type
/// local: the kernel adds one with each address and removes it with the address).
fn local_key(r: &KernelRoute) -> Option<u128> {
    (r.table == LOCAL_TABLE && r.kind == RouteKind::Other(RTN_LOCAL)).then(|| key_of(r.dst))
}

/// Whether a kernel route is one the router takes: the main table's unicast, blackhole and
/// unreachable routes.
fn wanted(r: &KernelRoute) -> bool {
    r.table == MAIN_TABLE && !matches!(r.kind, RouteKind::Other(_))
}

/// The next hop a kernel route names.
fn kernel_hop(h: &mut Hops, r: &KernelRoute, neigh: &[Neighbour], s: &mut RouteSummary) -> u32 {
    match r.kind {
        RouteKind::Unicast => {
            if r.paths > 1 {
                s.multipath += 1;
            }
            match r.oif.and_then(|i| h.port_of_ifindex(i)) {
                None => {
                    s.elsewhere += 1;
                    h.hop(HopKey::Nowhere, neigh, s)
                }
                Some(port) => match r.gateway {
                    Some(gw) => h.hop(HopKey::Via(port, gw), neigh, s),
                    None => h.hop(HopKey::Connected(port), neigh, s),
                },
            }
        }
        _ => {
            s.discard += 1;
            h.hop(HopKey::Nowhere, neigh, s)
        }
    }
}

fn sys(e: flowlane_io::SysError) -> ToolError {
    ToolError::runtime(e.to_string())
}

/// Loads the tables for a forwarder on `ports` (name, ifindex), in the calling thread's
/// namespace.
pub fn load(
    source: &RouteSource,
    next_hops: Option<&NextHopFile>,
    ports: &[(String, u32)],
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Result<Loaded, ToolError> {
    let kroutes = netdev::routes().map_err(sys)?;
    let neigh = netdev::neighbours().map_err(sys)?;
    let mut l = Loaded {
        hops: Hops::new(ports),
        ..Loaded::default()
    };
    l.hops.table.local = kroutes.iter().filter_map(local_key).collect();
    l.hops.resolve(&neigh);
    match source {
        RouteSource::Kernel => {
            l.summary.source = "kernel".into();
            for r in kroutes.iter().filter(|r| wanted(r)) {
                let hop = kernel_hop(&mut l.hops, r, &neigh, &mut l.summary);
                insert(&mut l.v4, &mut l.v6, r.dst, r.len, hop)?;
            }
        }
        RouteSource::File(path) => {
            let text = crate::input::read_text("--routes", path, crate::input::ROUTES, stop)?;
            let table = flowlane_lpm::load::parse(&text, flowlane_lpm::load::Format::Auto)
                .map_err(|e| ToolError::usage(format!("--routes {}: {e}", path.display())))?;
            l.summary.source = path.display().to_string();
            // File hop → our hop, resolved once per file hop.
            let mut map: HashMap<u32, u32> = HashMap::new();
            let mut resolve = |l: &mut Loaded, h: u32| -> Result<u32, ToolError> {
                if let Some(&i) = map.get(&h) {
                    return Ok(i);
                }
                let i = if table.legend.is_empty() {
                    file_hop(l, next_hops, h, &neigh)?
                } else {
                    legend_hop(
                        l,
                        table.legend.get(h as usize).map_or("", String::as_str),
                        &neigh,
                    )
                };
                map.insert(h, i);
                Ok(i)
            };
            for (p, h) in &table.v4 {
                let hop = resolve(&mut l, *h)?;
                l.v4.insert(*p, hop)
                    .map_err(|e| ToolError::usage(format!("route {p}: {e}")))?;
            }
            for (p, h) in &table.v6 {
                let hop = resolve(&mut l, *h)?;
                l.v6.insert(*p, hop)
                    .map_err(|e| ToolError::usage(format!("route {p}: {e}")))?;
            }
        }
    }
    l.summary.routes_v4 = l.v4.len();
    l.summary.routes_v6 = l.v6.len();
    l.summary.next_hops = l.hops.table.hops.len();
    Ok(l)
}

/// The kernel's main table (this thread's namespace) as a [`flowlane_lpm::Table`] whose
/// legend names each next hop as [`load`] resolves it, every interface a route leaves by
/// taken as a port: what `flowlane route lookup --table kernel` answers from.
pub fn kernel_table() -> Result<flowlane_lpm::Table, ToolError> {
    let routes = netdev::routes().map_err(sys)?;
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
    let l = load(&RouteSource::Kernel, None, &ports, None)?;
    Ok(flowlane_lpm::Table {
        v4: l.v4.iter().collect(),
        v6: l.v6.iter().collect(),
        legend: l.hops.names,
    })
}

/// A numbered next hop through the next-hops file.
fn file_hop(
    l: &mut Loaded,
    file: Option<&NextHopFile>,
    h: u32,
    neigh: &[Neighbour],
) -> Result<u32, ToolError> {
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
    let key = match line {
        NextHopLine::Drop => HopKey::Nowhere,
        NextHopLine::Mac(dev, mac) => HopKey::Mac(l.hops.port_of_dev(dev)?, *mac),
        NextHopLine::Gateway(dev, gw) => HopKey::Via(l.hops.port_of_dev(dev)?, *gw),
    };
    Ok(l.hops.hop(key, neigh, &mut l.summary))
}

/// A next hop of `ip route show` text (`via GW dev DEV`, `dev DEV`, `blackhole`, …).
fn legend_hop(l: &mut Loaded, legend: &str, neigh: &[Neighbour]) -> u32 {
    let words: Vec<&str> = legend.split_whitespace().collect();
    let after = |w: &str| {
        words
            .iter()
            .position(|x| *x == w)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    let port = after("dev").and_then(|d| l.hops.port_of_dev(d).ok());
    let gw = after("via").and_then(|g| g.parse::<IpAddr>().ok());
    let key = match (port, gw) {
        (Some(p), Some(gw)) => HopKey::Via(p, gw),
        (Some(p), None) => HopKey::Connected(p),
        (None, _) => {
            if after("dev").is_some() {
                l.summary.elsewhere += 1;
            } else {
                l.summary.discard += 1;
            }
            HopKey::Nowhere
        }
    };
    l.hops.hop(key, neigh, &mut l.summary)
}

/// What one [`LiveTables::upkeep`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upkept {
    /// Next hops, the neighbours on connected links, or this host's addresses.
    pub hops: bool,
    /// IPv4 prefixes added, replaced or removed (the RIB holds what each is now).
    pub v4: Vec<Prefix<u32>>,
    /// IPv6 prefixes added, replaced or removed.
    pub v6: Vec<Prefix<u128>>,
}

impl Upkept {
    /// Whether anything changed.
    pub fn any(&self) -> bool {
        self.hops || !self.v4.is_empty() || !self.v6.is_empty()
    }
}

/// The tables while a router runs: the FIB writers (whose snapshots the workers read), the
/// next hops (swapped whole), and — for kernel routes — the kernel's route changes, applied
/// as they come so the FIB follows `ip route add/del/replace` without stopping a worker.
#[derive(Debug)]
pub struct LiveTables {
    hops: Hops,
    summary: RouteSummary,
    w4: FibWriter<u32>,
    w6: FibWriter<u128>,
    shared: Arc<ArcSwap<NextHops>>,
    monitor: Option<RouteMonitor>,
    /// Updates so far and the latest's duration (see [`TablesTick`]).
    tick: TablesTick,
}

impl LiveTables {
    /// Builds the FIBs; `monitor` (opened before the tables were read, so no change falls
    /// between) makes them follow the kernel.
    pub fn new(l: Loaded, monitor: Option<RouteMonitor>) -> LiveTables {
        LiveTables {
            w4: FibWriter::new(l.v4),
            w6: FibWriter::new(l.v6),
            shared: Arc::new(ArcSwap::from_pointee(l.hops.table.clone())),
            hops: l.hops,
            summary: l.summary,
            monitor,
            tick: TablesTick::default(),
        }
    }

    /// The upkeep so far, for a status tick.
    pub fn tick(&self) -> TablesTick {
        TablesTick {
            routes_v4: self.w4.rib().len(),
            routes_v6: self.w6.rib().len(),
            changes_applied: self.summary.changes_applied,
            reloads: self.summary.reloads,
            ..self.tick
        }
    }

    /// Counts an update of the forwarding path's tables that took `took` (from reading the
    /// changes until the path uses them), and whether it wrote the whole table.
    pub fn updated(&mut self, took: std::time::Duration, whole: bool) {
        self.tick.updates += 1;
        self.tick.whole += u64::from(whole);
        self.tick.last_update_ms = Some(took.as_secs_f64() * 1e3);
    }

    /// What workers read.
    pub fn tables(&self) -> Tables {
        Tables {
            v4: self.w4.reader(),
            v6: self.w6.reader(),
            hops: self.shared.clone(),
        }
    }

    /// The summary, with the current route counts.
    pub fn summary(&self) -> RouteSummary {
        let mut s = self.summary.clone();
        s.routes_v4 = self.w4.rib().len();
        s.routes_v6 = self.w6.rib().len();
        s
    }

    /// The IPv4 routes as they are now.
    pub fn v4(&self) -> &Rib<u32> {
        self.w4.rib()
    }

    /// The IPv6 routes as they are now.
    pub fn v6(&self) -> &Rib<u128> {
        self.w6.rib()
    }

    /// The next hops as they are now.
    pub fn next_hops(&self) -> &NextHops {
        &self.hops.table
    }

    /// Applies the kernel's route changes since the last call and the neighbour table as it
    /// is now; publishes what changed (next hops first, so a route's new next hop exists
    /// before the route does). What changed.
    pub fn upkeep(&mut self) -> Result<Upkept, ToolError> {
        let neigh = netdev::neighbours().map_err(sys)?;
        let mut hops_changed = self.hops.resolve(&neigh);
        let (asked, refused) = self.hops.ask_unresolved();
        self.summary.neighbour_requests += asked;
        self.summary.neighbour_requests_refused += refused;
        let mut c4: Vec<(Prefix<u32>, Option<u32>)> = Vec::new();
        let mut c6: Vec<(Prefix<u128>, Option<u32>)> = Vec::new();
        let changes = match self.monitor.as_mut() {
            // Until nothing waits: a burst of 100 000 changes is drained in one go.
            Some(m) => m.drain(usize::MAX).map_err(sys)?,
            None => Vec::new(),
        };
        let before = self.hops.table.hops.len();
        let mut reload = false;
        for ch in &changes {
            let (r, add) = match ch {
                RouteChange::Added(r) => (r, true),
                RouteChange::Removed(r) => (r, false),
                RouteChange::Overrun => {
                    reload = true;
                    continue;
                }
            };
            // An address added or removed while forwarding: its frames are the kernel's
            // from now on, or no longer.
            if let Some(k) = local_key(r) {
                let local = &mut self.hops.table.local;
                hops_changed |= if add {
                    local.insert(k)
                } else {
                    local.remove(&k)
                };
                continue;
            }
            if !wanted(r) {
                continue;
            }
            let hop = add.then(|| kernel_hop(&mut self.hops, r, &neigh, &mut self.summary));
            let bad = |e| ToolError::runtime(format!("route {}/{}: {e}", r.dst, r.len));
            match r.dst {
                IpAddr::V4(a) => c4.push((Prefix::new(u32::from(a), r.len).map_err(bad)?, hop)),
                IpAddr::V6(a) => c6.push((Prefix::new(u128::from(a), r.len).map_err(bad)?, hop)),
            }
        }
        if reload {
            self.summary.reloads += 1;
            hops_changed |= self.reload(&neigh, &mut c4, &mut c6)?;
        }
        hops_changed |= self.hops.table.hops.len() != before;
        if hops_changed {
            self.shared.store(Arc::new(self.hops.table.clone()));
        }
        let bad = |e: flowlane_lpm::PrefixError| ToolError::runtime(e.to_string());
        let up = Upkept {
            hops: hops_changed,
            v4: c4.iter().map(|c| c.0).collect(),
            v6: c6.iter().map(|c| c.0).collect(),
        };
        if !c4.is_empty() {
            self.summary.changes_applied += c4.len() as u64;
            self.w4.apply_batch(&mut c4).map_err(bad)?;
            self.w4.publish();
        }
        if !c6.is_empty() {
            self.summary.changes_applied += c6.len() as u64;
            self.w6.apply_batch(&mut c6).map_err(bad)?;
            self.w6.publish();
        }
        Ok(up)
    }

    /// Changes lost: the whole main table again, as changes against what the FIBs hold, and
    /// this host's addresses again; whether those changed.
    fn reload(
        &mut self,
        neigh: &[Neighbour],
        c4: &mut Vec<(Prefix<u32>, Option<u32>)>,
        c6: &mut Vec<(Prefix<u128>, Option<u32>)>,
    ) -> Result<bool, ToolError> {
        let (mut v4, mut v6) = (Rib::new(), Rib::new());
        let routes = netdev::routes().map_err(sys)?;
        let local: FastSet<u128> = routes.iter().filter_map(local_key).collect();
        let local_changed = local != self.hops.table.local;
        self.hops.table.local = local;
        for r in routes.iter().filter(|r| wanted(r)) {
            let hop = kernel_hop(&mut self.hops, r, neigh, &mut self.summary);
            insert(&mut v4, &mut v6, r.dst, r.len, hop)?;
        }
        c4.clear();
        c6.clear();
        c4.extend(
            self.w4
                .rib()
                .iter()
                .filter(|(p, _)| v4.get(*p).is_none())
                .map(|(p, _)| (p, None)),
        );
        c4.extend(
            v4.iter()
                .filter(|(p, h)| self.w4.rib().get(*p) != Some(*h))
                .map(|(p, h)| (p, Some(h))),
        );
        c6.extend(
            self.w6
                .rib()
                .iter()
                .filter(|(p, _)| v6.get(*p).is_none())
                .map(|(p, _)| (p, None)),
        );
        c6.extend(
            v6.iter()
                .filter(|(p, h)| self.w6.rib().get(*p) != Some(*h))
                .map(|(p, h)| (p, Some(h))),
        );
        Ok(local_changed)
    }
}

/// The router's table upkeep as of a tick: what a user (or a test) waits on after changing
/// routes, and how long the change took to reach the forwarding path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TablesTick {
    /// IPv4 routes the forwarding path uses now.
    pub routes_v4: usize,
    /// IPv6 routes.
    pub routes_v6: usize,
    /// Route changes applied since the start (as the summary's `changes_applied`).
    pub changes_applied: u64,
    /// Whole re-reads of the kernel's table after its change stream overran, since the start.
    pub reloads: u64,
    /// Times the forwarding path's tables were replaced (routes, next hops or this host's
    /// addresses changed), since the start.
    pub updates: u64,
    /// How long the latest update took, ms: from reading the changes until the forwarding
    /// path uses the new tables (native XDP: the rebuild and the maps' rewrite too).
    pub last_update_ms: Option<f64>,
    /// Of the updates, those that wrote the whole table anew: the native XDP router's when
    /// next hops, neighbours or this host's addresses changed, or a change was too wide to
    /// make in place (its other updates rewrite only the entries the changed routes cover;
    /// the other backends' FIB always changes in place).
    #[serde(default)]
    pub whole: u64,
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
