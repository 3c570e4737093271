//! What the native XDP router's maps hold, built whole from the routes and next hops, and
//! brought up to date by the changes alone (the routes they touch and the host routes that
//! neighbours and own addresses add), so that [`super::xdp`] can rewrite only those entries.

use std::collections::{BTreeSet, HashMap};

use crate::forward::worker::route::PortInfo;
use crate::route::decide::{FastMap, FastSet, Hop, NextHops};
use flowlane_io::ebpf::route_hop;
use flowlane_lpm::{Prefix, Rib};

use crate::route::tables::Upkept;
use crate::ToolError;

/// One next-hop entry, laid out as `ebpf::route_hop`.
pub(super) type Entry = [u8; route_hop::SIZE];

/// What the native router's maps hold: the IPv4 routes (for DIR-24-8), the IPv6 routes (for
/// the trie), and the next-hop entries both index — with what it takes to follow changes.
pub(super) struct XdpTables {
    pub(super) v4: Rib<u32>,
    pub(super) v6: HashMap<(u8, u128), u32>,
    pub(super) hops: Vec<Entry>,
    /// The entry of each of the FIB's next hops: its hop `i` is `hops[map[i]]` (the same
    /// index after a whole build; a next hop added since goes after the entries then made).
    map: Vec<u32>,
    /// The neighbours and own addresses the host routes were made for.
    hosts: FastMap<(u16, u128), [u8; 6]>,
    local: FastSet<u128>,
}

/// The routes a change touched in [`XdpTables`]: the entries to rewrite.
#[derive(Debug, Default)]
pub(super) struct Touched {
    pub(super) v4: Vec<Prefix<u32>>,
    pub(super) v6: Vec<Prefix<u128>>,
}

/// At most this many changed routes (and as many host routes) are followed in place; more
/// are a reload's worth, and the whole table is built.
const FOLLOW_MAX_ROUTES: usize = 4096;

/// Next-hop entries for the router's ports.
struct Entries<'a> {
    ports: &'a [PortInfo],
}

impl Entries<'_> {
    /// Out of `port` to `dst`.
    fn to(&self, port: u32, dst: [u8; 6]) -> Entry {
        let mut e = [0u8; route_hop::SIZE];
        let info = self.ports.get(port as usize);
        e[route_hop::PORT..route_hop::PORT + 4].copy_from_slice(&port.to_ne_bytes());
        let mtu = info.map_or(0, |i| i.mtu as u32);
        e[route_hop::MTU..route_hop::MTU + 4].copy_from_slice(&mtu.to_ne_bytes());
        e[route_hop::DST_MAC..route_hop::DST_MAC + 6].copy_from_slice(&dst);
        let src = info.map_or([0; 6], |i| i.mac);
        e[route_hop::SRC_MAC..route_hop::SRC_MAC + 6].copy_from_slice(&src);
        e
    }

    /// An entry that is not a port: `route_hop::NO_NEIGHBOUR`, `NOWHERE` or `HOST`.
    fn marker(&self, m: u32) -> Entry {
        self.to(m, [0; 6])
    }

    /// The FIB's next hop `h`.
    fn of(&self, h: &Hop) -> Entry {
        match *h {
            Hop::Via { port, mac: Some(m) } => self.to(u32::from(port), m),
            Hop::Via { mac: None, .. } | Hop::Connected { .. } => {
                self.marker(route_hop::NO_NEIGHBOUR)
            }
            Hop::Nowhere => self.marker(route_hop::NOWHERE),
        }
    }
}

/// Whether `key` (an address as the runtime keys it: IPv4 as `::ffff:a.b.c.d`) is IPv4.
fn is_v4(key: u128) -> bool {
    key >> 32 == 0xffff
}

impl XdpTables {
    /// The native router's tables for the routes and next hops as they are: the next-hop
    /// entries, and the routes with a host route for every known neighbour on a connected
    /// link (the program has no neighbour table of its own: a connected host gets its own
    /// route to its MAC) and for each of this host's own addresses (to the kernel).
    pub(super) fn build(
        v4: &Rib<u32>,
        v6: &Rib<u128>,
        table: &NextHops,
        ports: &[PortInfo],
    ) -> Result<XdpTables, ToolError> {
        let e = Entries { ports };
        let mut hops: Vec<Entry> = table.hops.iter().map(|h| e.of(h)).collect();
        let connected = |h: Option<u32>, port: u16| {
            h.and_then(|h| table.hops.get(h as usize))
                .is_some_and(|h| *h == Hop::Connected { port })
        };
        let mut rib = v4.clone();
        let mut rib6: HashMap<(u8, u128), u32> =
            v6.iter().map(|(p, h)| ((p.len(), p.addr()), h)).collect();
        let mut hosts: Vec<(&(u16, u128), &[u8; 6])> = table.hosts.iter().collect();
        hosts.sort();
        let bad = |e: flowlane_lpm::PrefixError| ToolError::runtime(format!("host route: {e}"));
        for (&(port, key), mac) in hosts {
            if is_v4(key) {
                let addr = key as u32;
                if connected(rib.matching(addr).map(|m| m.1), port) {
                    hops.push(e.to(u32::from(port), *mac));
                    let p = Prefix::new(addr, 32).map_err(bad)?;
                    rib.insert(p, hops.len() as u32 - 1).map_err(bad)?;
                }
            } else if connected(v6.matching(key).map(|m| m.1), port) {
                hops.push(e.to(u32::from(port), *mac));
                rib6.insert((128, key), hops.len() as u32 - 1);
            }
        }
        // This host's own addresses: a host route each to an entry that passes the frame to
        // the kernel (without it, one on a connected link read as a neighbour without a MAC:
        // dropped).
        let mut local: Vec<u128> = table.local.iter().copied().collect();
        if !local.is_empty() {
            local.sort_unstable();
            hops.push(e.marker(route_hop::HOST));
            let host = hops.len() as u32 - 1;
            for key in local {
                if is_v4(key) {
                    let p = Prefix::new(key as u32, 32).map_err(bad)?;
                    rib.insert(p, host).map_err(bad)?;
                } else {
                    rib6.insert((128, key), host);
                }
            }
        }
        Ok(XdpTables {
            v4: rib,
            v6: rib6,
            hops,
            map: (0..table.hops.len() as u32).collect(),
            hosts: table.hosts.clone(),
            local: table.local.clone(),
        })
    }

    /// Takes in the changes `up` made to the routes (`v4`, `v6`) and next hops (`table`), as
    /// they are now: the changed routes, the host routes of neighbours that came, went or
    /// changed their MAC and of addresses this host gained or lost, and the host routes a
    /// changed route decides (a neighbour is a host route only on a connected link). New
    /// next-hop entries go after those in use. What it touched — or `None` when the change
    /// takes a whole build: an entry in use changed (a gateway's MAC: every route through it),
    /// next hops went away, or more than [`FOLLOW_MAX_ROUTES`] routes changed. After `None`
    /// these tables are not to be used (build them anew).
    ///
    /// Long: one pass over a change set, one block per kind of change (neighbours, addresses,
    /// routes), each deciding in place whether the change can be written into the tables in
    /// use.
    pub(super) fn follow(
        &mut self,
        up: &Upkept,
        v4: &Rib<u32>,
        v6: &Rib<u128>,
        table: &NextHops,
        ports: &[PortInfo],
    ) -> Result<Option<Touched>, ToolError> {
        if up.v4.len() + up.v6.len() > FOLLOW_MAX_ROUTES || table.hops.len() < self.map.len() {
            return Ok(None);
        }
        let e = Entries { ports };
        for (i, h) in table.hops.iter().enumerate() {
            match self.map.get(i) {
                Some(&x) if self.hops.get(x as usize) == Some(&e.of(h)) => {}
                Some(_) => return Ok(None),
                None => {
                    self.hops.push(e.of(h));
                    self.map.push(self.hops.len() as u32 - 1);
                }
            }
        }
        let map = &self.map;
        let entry = |h: u32| map.get(h as usize).copied();
        let bad = |p: &dyn std::fmt::Display, e| ToolError::runtime(format!("route {p}: {e}"));
        let mut touched = Touched::default();
        for &p in &up.v4 {
            match v4.get(p).map(entry) {
                Some(Some(x)) => {
                    self.v4.insert(p, x).map_err(|e| bad(&p, e))?;
                }
                Some(None) => return Ok(None),
                None => {
                    self.v4.remove(p);
                }
            }
            touched.v4.push(p);
        }
        for &p in &up.v6 {
            let k = (p.len(), p.addr());
            match v6.get(p).map(entry) {
                Some(Some(x)) => {
                    self.v6.insert(k, x);
                }
                Some(None) => return Ok(None),
                None => {
                    self.v6.remove(&k);
                }
            }
            touched.v6.push(p);
        }
        // The addresses whose host route may have changed: neighbours that came, went or
        // changed, addresses gained or lost, and those under a changed route.
        let mut keys: BTreeSet<u128> = BTreeSet::new();
        for (k, mac) in &table.hosts {
            if self.hosts.get(k) != Some(mac) {
                keys.insert(k.1);
            }
        }
        keys.extend(
            self.hosts
                .keys()
                .filter(|k| !table.hosts.contains_key(k))
                .map(|k| k.1),
        );
        keys.extend(table.local.symmetric_difference(&self.local));
        let under_change = |k: u128| {
            if is_v4(k) {
                up.v4.iter().any(|p| p.contains(k as u32))
            } else {
                up.v6.iter().any(|p| p.contains(k))
            }
        };
        keys.extend(
            table
                .hosts
                .keys()
                .map(|k| k.1)
                .chain(table.local.iter().copied())
                .filter(|&k| under_change(k)),
        );
        if keys.len() > FOLLOW_MAX_ROUTES {
            return Ok(None);
        }
        // Entries are shared where equal (the same neighbour's MAC on the same port).
        let mut index: HashMap<Entry, u32> = HashMap::new();
        for (i, h) in self.hops.iter().enumerate() {
            index.entry(*h).or_insert(i as u32);
        }
        let mut entry_for = |hops: &mut Vec<Entry>, want: Entry| {
            *index.entry(want).or_insert_with(|| {
                hops.push(want);
                hops.len() as u32 - 1
            })
        };
        let connected = |h: Option<u32>| match h.and_then(|h| table.hops.get(h as usize)) {
            Some(&Hop::Connected { port }) => Some(port),
            _ => None,
        };
        for k in keys {
            // As a whole build decides: an own address is the kernel's; a neighbour on the
            // link its address is connected by has a route to its MAC; else the address's
            // own route, if it has one.
            let on_link = if is_v4(k) {
                connected(v4.matching(k as u32).map(|m| m.1))
            } else {
                connected(v6.matching(k).map(|m| m.1))
            };
            let host = on_link.and_then(|port| Some((port, *table.hosts.get(&(port, k))?)));
            let want = if table.local.contains(&k) {
                Some(entry_for(&mut self.hops, e.marker(route_hop::HOST)))
            } else if let Some((port, mac)) = host {
                Some(entry_for(&mut self.hops, e.to(u32::from(port), mac)))
            } else if is_v4(k) {
                let p = Prefix::new(k as u32, 32).map_err(|e| bad(&k, e))?;
                match v4.get(p).map(entry) {
                    Some(None) => return Ok(None),
                    other => other.flatten(),
                }
            } else {
                let p = Prefix::new(k, 128).map_err(|e| bad(&k, e))?;
                match v6.get(p).map(entry) {
                    Some(None) => return Ok(None),
                    other => other.flatten(),
                }
            };
            if is_v4(k) {
                let p = Prefix::new(k as u32, 32).map_err(|e| bad(&k, e))?;
                match want {
                    Some(x) => {
                        self.v4.insert(p, x).map_err(|e| bad(&p, e))?;
                    }
                    None => {
                        self.v4.remove(p);
                    }
                }
                touched.v4.push(p);
            } else {
                let p = Prefix::new(k, 128).map_err(|e| bad(&k, e))?;
                match want {
                    Some(x) => self.v6.insert((128, k), x),
                    None => self.v6.remove(&(128, k)),
                };
                touched.v6.push(p);
            }
        }
        self.hosts.clone_from(&table.hosts);
        self.local.clone_from(&table.local);
        Ok(Some(touched))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowlane_lpm::gen;
    use rand::{Rng, RngExt, SeedableRng};

    /// The entry `t` answers for address key `k` (longest prefix), if any.
    fn answer(t: &XdpTables, k: u128) -> Option<Entry> {
        let hop = if is_v4(k) {
            t.v4.matching(k as u32).map(|m| m.1)
        } else {
            (0..=128u8)
                .rev()
                .find_map(|len| t.v6.get(&(len, Prefix::covering(k, len).addr())).copied())
        };
        hop.map(|h| t.hops[h as usize])
    }

    fn v4(a: u32) -> u128 {
        crate::route::decide::host_key_v4(a)
    }

    /// Tables followed change by change answer as tables built whole from the same routes
    /// and next hops do — for neighbours that come, go and change their MAC on both links
    /// and on no link of theirs, own addresses gained and lost, routes over neighbours
    /// (a gateway over half a link, a host's own /32), routes elsewhere, next hops added —
    /// and every address whose answer changed lies under a route they say they touched (the
    /// entries the maps rewrite). A gateway's new MAC takes a whole build.
    /// (Long: one scenario, every step checked before the next.)
    #[test]
    fn followed_tables_answer_as_a_whole_build() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let ports = [
            PortInfo {
                mac: [2, 0, 0, 0, 0, 0xa0],
                mtu: 1500,
            },
            PortInfo {
                mac: [2, 0, 0, 0, 0, 0xa1],
                mtu: 1280,
            },
        ];
        let lan = [0xc612_0000u32, 0xc612_0100]; // 198.18.0.0/24, 198.18.1.0/24
        let lan6 = [
            0x2001_0002_0000_0000u128 << 64,
            0x2001_0002_0000_0001u128 << 64,
        ];
        let mut nh = NextHops {
            hops: vec![
                Hop::Connected { port: 0 },
                Hop::Connected { port: 1 },
                Hop::Via {
                    port: 1,
                    mac: Some([2, 0, 0, 0, 1, 1]),
                },
                Hop::Via { port: 0, mac: None },
                Hop::Nowhere,
            ],
            ..Default::default()
        };
        let mut r4 = Rib::from_routes(gen::ipv4(20_000, 3, 5)).expect("valid");
        let mut r6 = Rib::from_routes(gen::ipv6(5_000, 3, 5)).expect("valid");
        for p in 0..2u16 {
            let i = usize::from(p);
            r4.insert(Prefix::covering(lan[i], 24), u32::from(p))
                .expect("valid");
            r6.insert(Prefix::covering(lan6[i], 64), u32::from(p))
                .expect("valid");
        }
        // An address the kernel routes on its own.
        let own32 = Prefix::covering(lan[1] | 50, 32);
        r4.insert(own32, 2).expect("valid");
        let host_addr = |rng: &mut rand::rngs::StdRng| {
            let p = rng.random_range(0..2usize);
            let k = if rng.random_bool(0.5) {
                v4(lan[p] | rng.random_range(2..64))
            } else {
                lan6[p] | rng.random_range(2..64)
            };
            // Now and then on the other link (its address is not connected there).
            let port = if rng.random_bool(0.1) { 1 - p } else { p };
            (port as u16, k)
        };
        let mac = |rng: &mut rand::rngs::StdRng| [2, 0, 0, 1, rng.random(), rng.random()];
        for _ in 0..40 {
            let (k, m) = (host_addr(&mut rng), mac(&mut rng));
            nh.hosts.insert(k, m);
        }
        nh.local
            .extend([v4(lan[0] | 1), v4(lan[1] | 1), lan6[0] | 1]);
        let mut cur = XdpTables::build(&r4, &r6, &nh, &ports).expect("tables");
        let gateway = Prefix::covering(lan[1] | 128, 25);
        let gateway6 = Prefix::covering(lan6[1] | (1 << 63), 65);
        for round in 0..60 {
            // The addresses looked at: every neighbour's and own address (before and
            // after), random ones on the links and anywhere.
            let mut keys: BTreeSet<u128> = nh.hosts.keys().map(|k| k.1).collect();
            keys.extend(nh.local.iter().copied());
            let mut up = Upkept {
                hops: false,
                v4: Vec::new(),
                v6: Vec::new(),
            };
            for _ in 0..rng.random_range(0..6) {
                match rng.random_range(0..10) {
                    0..=2 => {
                        let (k, m) = (host_addr(&mut rng), mac(&mut rng));
                        nh.hosts.insert(k, m);
                    }
                    3 => {
                        let k = nh
                            .hosts
                            .keys()
                            .nth(rng.random_range(0..nh.hosts.len().max(1)));
                        if let Some(k) = k.copied() {
                            nh.hosts.remove(&k);
                        }
                    }
                    4 => {
                        let k = v4(lan[rng.random_range(0..2)] | rng.random_range(1..64));
                        if !nh.local.remove(&k) {
                            nh.local.insert(k);
                        }
                    }
                    5 => {
                        // A gateway over the upper half of a link, or not.
                        if r4.remove(gateway).is_none() {
                            r4.insert(gateway, 2).expect("valid");
                        }
                        if r6.remove(gateway6).is_none() {
                            r6.insert(gateway6, 2).expect("valid");
                        }
                        up.v4.push(gateway);
                        up.v6.push(gateway6);
                    }
                    6 => {
                        // A neighbour's own /32 routed elsewhere, or no longer.
                        let k = nh.hosts.keys().map(|k| k.1).find(|&k| is_v4(k));
                        if let Some(k) = k {
                            let p = Prefix::covering(k as u32, 32);
                            if r4.remove(p).is_none() {
                                r4.insert(p, 4).expect("valid");
                            }
                            up.v4.push(p);
                        }
                    }
                    7 => {
                        // A new next hop, and routes through it.
                        nh.hops.push(Hop::Via {
                            port: 0,
                            mac: Some(mac(&mut rng)),
                        });
                        let h = nh.hops.len() as u32 - 1;
                        let p = Prefix::covering(rng.next_u32(), rng.random_range(8..=32));
                        r4.insert(p, h).expect("valid");
                        up.v4.push(p);
                        let p6 = Prefix::covering(rng.random::<u128>(), rng.random_range(16..=64));
                        r6.insert(p6, h).expect("valid");
                        up.v6.push(p6);
                    }
                    _ => {
                        let p = Prefix::covering(rng.next_u32(), rng.random_range(8..=32));
                        if rng.random_bool(0.3) {
                            r4.remove(p);
                        } else {
                            r4.insert(p, rng.random_range(0..5)).expect("valid");
                        }
                        up.v4.push(p);
                    }
                }
            }
            keys.extend(nh.hosts.keys().map(|k| k.1));
            keys.extend(nh.local.iter().copied());
            for _ in 0..300 {
                keys.insert(v4(lan[rng.random_range(0..2)] | rng.random_range(0..256)));
                keys.insert(v4(rng.next_u32()));
                keys.insert(lan6[rng.random_range(0..2)] | rng.random_range(0..1 << 10));
            }
            keys.extend(up.v4.iter().map(|p| v4(p.addr())));
            keys.extend(up.v6.iter().map(|p| p.addr()));
            let before: Vec<Option<Entry>> = keys.iter().map(|&k| answer(&cur, k)).collect();
            let gateway_moved = round % 20 == 19;
            if gateway_moved {
                nh.hops[2] = Hop::Via {
                    port: 1,
                    mac: Some(mac(&mut rng)),
                };
            }
            let whole = XdpTables::build(&r4, &r6, &nh, &ports).expect("tables");
            let touched = cur.follow(&up, &r4, &r6, &nh, &ports).expect("follows");
            if gateway_moved {
                assert!(touched.is_none(), "round {round}: a gateway's MAC followed");
                cur = whole;
                continue;
            }
            let touched = touched.unwrap_or_else(|| panic!("round {round}: not followed"));
            for (&k, was) in keys.iter().zip(before) {
                let now = answer(&cur, k);
                assert_eq!(now, answer(&whole, k), "round {round}: key {k:x}");
                let said = if is_v4(k) {
                    touched.v4.iter().any(|p| p.contains(k as u32))
                } else {
                    touched.v6.iter().any(|p| p.contains(k))
                };
                assert!(
                    now == was || said,
                    "round {round}: key {k:x} changed under no touched route"
                );
            }
        }
    }
}
