//! The router's user-space workers behind `flowlane forward --mode route`: [`RouteWorker`]
//! over AF_PACKET rings on every port, [`XskRouteWorker`] over an AF_XDP socket group. What
//! they decide with is the route role's ([`crate::route::decide`]).

use flowlane_io::frame::{FrameRx, FrameTx, XskAction, XskGroup, TP_STATUS_CSUMNOTREADY};
use flowlane_runtime::{bump, Poll};
use flowlane_wire::forward::{decrement_ttl, Reason, L3};

use super::cache::RouteCache;
pub use super::ports::PortInfo;
use super::ports::{Ports, SendError};
use super::reflect::{finish_parsed, ForwardStats};
use crate::route::decide::{Decision, Tables, View};

/// Whether a frame's TTL (hop limit) lets it be forwarded.
fn ttl_ok(frame: &[u8], l3: &L3) -> bool {
    let at = l3.at + if l3.v6 { 7 } else { 8 };
    frame.get(at).is_some_and(|&t| t > 1)
}

/// One worker: a receive and a transmit ring on every port, pinned to one CPU (each receive
/// ring in its port's fanout group, so the kernel hands it the frames received on its CPU).
#[allow(missing_debug_implementations)]
pub struct RouteWorker<R, T> {
    ports: Ports<R, T>,
    tables: Tables,
    cache: Option<RouteCache>,
}

impl<R: FrameRx, T: FrameTx> RouteWorker<R, T> {
    /// A worker over its rings (`ports[i]` = port i's receive and transmit rings and facts),
    /// with a flow cache where given.
    pub fn new(
        ports: Vec<(R, T, PortInfo)>,
        tables: Tables,
        cache: Option<RouteCache>,
    ) -> RouteWorker<R, T> {
        RouteWorker {
            ports: Ports::new(ports),
            tables,
            cache,
        }
    }
}

/// A worker's tallies for one round, added to its counters once.
#[derive(Default)]
struct Tally {
    rx: u64,
    fwd: u64,
    to_host: u64,
    not_ip: u64,
    malformed: u64,
    truncated: u64,
    tx_full: u64,
    no_route: u64,
    no_neighbour: u64,
    ttl: u64,
    too_big: u64,
    completed: u64,
    cache: super::cache::CacheDelta,
}

impl Tally {
    fn drop(&mut self, r: Reason) {
        match r {
            Reason::NotIp => self.not_ip += 1,
            Reason::Malformed => self.malformed += 1,
            Reason::TtlExceeded => self.ttl += 1,
            Reason::NoRoute => self.no_route += 1,
            Reason::NoNeighbour => self.no_neighbour += 1,
            Reason::TooBig => self.too_big += 1,
        }
    }

    fn add_to(&self, st: &ForwardStats) {
        bump(&st.rx_packets, self.rx);
        bump(&st.forwarded, self.fwd);
        bump(&st.to_host, self.to_host);
        bump(&st.not_ip, self.not_ip);
        bump(&st.malformed, self.malformed);
        bump(&st.truncated, self.truncated);
        bump(&st.tx_full, self.tx_full);
        bump(&st.no_route, self.no_route);
        bump(&st.no_neighbour, self.no_neighbour);
        bump(&st.ttl_exceeded, self.ttl);
        bump(&st.too_big, self.too_big);
        bump(&st.checksum_completed, self.completed);
        let c = &self.cache;
        bump(&st.cache_lookups, c.lookups);
        bump(&st.cache_hits, c.hits);
        bump(&st.cache_stale, c.stale);
        bump(&st.cache_inserts, c.inserts);
        bump(&st.cache_expired, c.expired);
        bump(&st.cache_evicted, c.evicted);
        bump(&st.cache_gc_visited, c.gc_visited);
    }
}

/// The routing decision and its checks for one received frame: the port and MAC it leaves
/// by, or what was counted instead.
fn route_one(
    view: &View,
    data: &[u8],
    (port, port_mac): (u16, [u8; 6]),
    info: &[PortInfo],
    t: &mut Tally,
    cache: Option<(&mut RouteCache, u64)>,
) -> Option<(u16, [u8; 6])> {
    // A unicast frame to another MAC is not the router's (a promiscuous port): the kernel's.
    if data.len() >= 6 && data[0] & 1 == 0 && data[..6] != port_mac {
        t.to_host += 1;
        return None;
    }
    let l3 = match L3::parse(data) {
        Ok(l3) => l3,
        Err(r) => {
            t.drop(r);
            return None;
        }
    };
    let decision = match cache {
        Some((c, now)) => c.decide(view, data, &l3, port, now),
        None => view.decide(data, &l3),
    };
    match decision {
        Decision::ToHost => {
            t.to_host += 1;
            None
        }
        Decision::Drop(r) => {
            t.drop(r);
            None
        }
        Decision::Forward { port, mac } => {
            if !ttl_ok(data, &l3) {
                t.drop(Reason::TtlExceeded);
                return None;
            }
            let mtu = info.get(port as usize).map_or(0, |p| p.mtu);
            if data.len() - l3.at > mtu {
                t.drop(Reason::TooBig);
                return None;
            }
            Some((port, mac))
        }
    }
}

/// Writes a routed frame: `data` with the next hop's MAC, the port's own, the TTL one less.
/// Returns the length written and whether a checksum left to offload was completed.
fn write_routed(
    data: &[u8],
    partial: Option<bool>,
    dst: [u8; 6],
    src: [u8; 6],
    buf: &mut [u8],
) -> (usize, bool) {
    let len = data.len();
    let Some(out) = buf.get_mut(..len) else {
        return (0, false);
    };
    out.copy_from_slice(data);
    (len, rewrite(out, partial, dst, src))
}

/// Makes `frame` the routed one where it lies: the next hop's MAC, the port's own, the TTL
/// one less (its checksum completed first where the sender left it to offload: `partial` as
/// in [`finish_checksum`]). Returns whether it completed one.
fn rewrite(frame: &mut [u8], partial: Option<bool>, dst: [u8; 6], src: [u8; 6]) -> bool {
    if frame.len() < 14 {
        return false;
    }
    frame[..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    let Ok(l3) = L3::parse(frame) else {
        return false;
    };
    let completed = finish_parsed(frame, &l3, partial);
    // Checked by the decision: the TTL is above 1.
    let _ = decrement_ttl(frame, &l3);
    completed
}

/// One AF_XDP worker: a socket on every port over one UMEM (its queue's), frames routed where
/// they lie and sent out of their port with no copy.
#[allow(missing_debug_implementations)]
pub struct XskRouteWorker {
    group: XskGroup,
    info: Vec<PortInfo>,
    tables: Tables,
    next: usize,
    cache: Option<RouteCache>,
}

impl XskRouteWorker {
    /// A worker over its group (`info[i]` = port i's facts), with a flow cache where given.
    pub fn new(
        group: XskGroup,
        info: Vec<PortInfo>,
        tables: Tables,
        cache: Option<RouteCache>,
    ) -> XskRouteWorker {
        XskRouteWorker {
            group,
            info,
            tables,
            next: 0,
            cache,
        }
    }
}

impl Poll for XskRouteWorker {
    type Stats = ForwardStats;
    type Report = ();

    fn drains(&self) -> bool {
        true
    }

    fn poll(
        &mut self,
        budget: usize,
        st: &ForwardStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        let view = self.tables.view();
        let mut t = Tally::default();
        let now = flowlane_io::os::monotonic_ns();
        if let Some(c) = self.cache.as_mut() {
            c.round(&view, now);
        }
        let ports = self.group.ports();
        let share = (budget / ports.max(1)).max(1);
        let mut n = 0;
        for k in 0..ports {
            let p = (self.next + k) % ports;
            let info = &self.info;
            let cache = &mut self.cache;
            let done = self.group.poll(p, share, |frame| {
                let c = cache.as_mut().map(|c| (c, now));
                match route_one(&view, frame, (p as u16, info[p].mac), info, &mut t, c) {
                    Some((out, mac)) => {
                        // AF_XDP does not say which frames were left to checksum offload.
                        let done = rewrite(frame, None, mac, info[out as usize].mac);
                        t.completed += u64::from(done);
                        XskAction::Send(out as usize)
                    }
                    None => XskAction::Drop,
                }
            });
            t.fwd += done.queued as u64;
            n += done.received;
        }
        self.next = (self.next + 1) % ports.max(1);
        if t.fwd > 0 {
            self.group.kick().map_err(|e| e.to_string())?;
        }
        t.rx = n as u64;
        if let Some(c) = self.cache.as_mut() {
            t.cache = c.published();
        }
        t.add_to(st);
        Ok(n)
    }

    super::ports::xsk_upkeep!(group);
}

/// Lets what a group queued leave before its sockets close (at most 2 s).
pub(crate) fn drain_group(group: &mut XskGroup) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while group.in_flight() > 0 && std::time::Instant::now() < deadline {
        if group.kick().is_err() {
            break;
        }
        std::thread::yield_now();
    }
}

impl<R: FrameRx, T: FrameTx> Poll for RouteWorker<R, T> {
    type Stats = ForwardStats;
    type Report = ();

    fn drains(&self) -> bool {
        true
    }

    fn poll(
        &mut self,
        budget: usize,
        st: &ForwardStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        let view = self.tables.view();
        let mut t = Tally::default();
        let now = flowlane_io::os::monotonic_ns();
        if let Some(c) = self.cache.as_mut() {
            c.round(&view, now);
        }
        let cache = &mut self.cache;
        let n = self.ports.poll(budget, |p, f, tx| {
            if f.truncated() {
                t.truncated += 1;
                return;
            }
            let info = tx.info;
            let c = cache.as_mut().map(|c| (c, now));
            let Some((out, mac)) =
                route_one(&view, f.data, (p as u16, info[p].mac), info, &mut t, c)
            else {
                return;
            };
            let (data, src) = (f.data, info[out as usize].mac);
            // Sent from this host with checksum offload: only the pseudo-header sum is
            // there; the frame leaves with its checksum computed.
            let partial = f.status & TP_STATUS_CSUMNOTREADY != 0;
            let mut completed = false;
            match tx.send(out as usize, data.len(), &mut |buf| {
                let (len, done) = write_routed(data, Some(partial), mac, src, buf);
                completed = done;
                len
            }) {
                Ok(()) => {
                    t.fwd += 1;
                    t.completed += u64::from(completed);
                }
                Err(SendError::TooLong) => t.truncated += 1,
                Err(SendError::Full) => t.tx_full += 1,
            }
        })?;
        t.rx = n as u64;
        if let Some(c) = self.cache.as_mut() {
            t.cache = c.published();
        }
        t.add_to(st);
        Ok(n)
    }

    super::ports::ports_upkeep!(ports);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::decide::*;
    use arc_swap::ArcSwap;
    use flowlane_lpm::{FibWriter, Prefix, Rib};
    use std::sync::Arc;

    fn frame_v4(dst: [u8; 4], ttl: u8, dst_mac: [u8; 6]) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&dst_mac);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&46u16.to_be_bytes());
        ip[8] = ttl;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
        ip[16..20].copy_from_slice(&dst);
        let c = flowlane_wire::checksum::checksum(&f[14..34]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f
    }

    fn tables(routes: &[(&str, u32)], hops: NextHops) -> (Tables, FibWriter<u32>, FibWriter<u128>) {
        let rib = Rib::from_routes(
            routes
                .iter()
                .map(|(p, h)| (p.parse::<Prefix<u32>>().expect("prefix"), *h)),
        )
        .expect("routes");
        let w4 = FibWriter::new(rib);
        let w6 = FibWriter::new(Rib::new());
        let t = Tables {
            v4: w4.reader(),
            v6: w6.reader(),
            hops: Arc::new(ArcSwap::from_pointee(hops)),
        };
        (t, w4, w6)
    }

    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const GW: [u8; 6] = [2, 0, 0, 0, 0, 2];

    #[test]
    fn each_reason_is_decided_where_it_arises() {
        let mut hops = NextHops {
            hops: vec![
                Hop::Via {
                    port: 1,
                    mac: Some(GW),
                },
                Hop::Via { port: 1, mac: None },
                Hop::Connected { port: 0 },
                Hop::Nowhere,
            ],
            ..NextHops::default()
        };
        hops.hosts
            .insert((0, host_key_v4(0xc612_0105)), [2, 0, 0, 0, 0, 5]);
        hops.local.insert(host_key_v4(0xc612_0001));
        let (t, ..) = tables(
            &[
                ("198.18.0.0/15", 0),
                ("198.19.0.0/16", 1),
                ("198.18.1.0/24", 2),
                ("198.18.2.0/24", 3),
            ],
            hops,
        );
        let v = t.view();
        let d = |dst: [u8; 4], ttl: u8, mac: [u8; 6]| {
            let f = frame_v4(dst, ttl, mac);
            let mut tally = Tally::default();
            let info = [PortInfo {
                mac: MAC,
                mtu: 1500,
            }; 2];
            (
                route_one(&v, &f, (0, MAC), &info, &mut tally, None),
                v.decide(&f, &L3::parse(&f).expect("ip")),
            )
        };
        assert_eq!(d([198, 18, 9, 9], 64, MAC).0, Some((1, GW)));
        assert_eq!(
            d([198, 19, 0, 1], 64, MAC).1,
            Decision::Drop(Reason::NoNeighbour)
        );
        assert_eq!(d([198, 18, 1, 5], 64, MAC).0, Some((0, [2, 0, 0, 0, 0, 5])));
        assert_eq!(
            d([198, 18, 1, 6], 64, MAC).1,
            Decision::Drop(Reason::NoNeighbour)
        );
        assert_eq!(
            d([198, 18, 2, 1], 64, MAC).1,
            Decision::Drop(Reason::NoRoute)
        );
        assert_eq!(d([10, 0, 0, 1], 64, MAC).1, Decision::Drop(Reason::NoRoute));
        assert_eq!(d([198, 18, 0, 1], 64, MAC).1, Decision::ToHost);
        assert_eq!(d([198, 18, 9, 9], 64, [0xff; 6]).1, Decision::ToHost);
        // TTL 1 is decided a forward, then refused by the check before sending.
        assert_eq!(d([198, 18, 9, 9], 1, MAC).0, None);
        // Unicast to another MAC is not routed.
        assert_eq!(d([198, 18, 9, 9], 64, GW).0, None);
    }

    #[test]
    fn the_flow_cache_keeps_every_decision_and_drops_them_all_when_the_hops_change() {
        let hops = |mac| NextHops {
            hops: vec![Hop::Via { port: 1, mac }, Hop::Nowhere],
            ..NextHops::default()
        };
        let (t, ..) = tables(
            &[("198.18.0.0/15", 0), ("198.18.2.0/24", 1)],
            hops(Some(GW)),
        );
        let mut c = RouteCache::new(64).expect("cache");
        let info = [PortInfo {
            mac: MAC,
            mtu: 1500,
        }; 2];
        let go = |dst: [u8; 4], now: u64, c: &mut RouteCache| {
            let v = t.view();
            c.round(&v, now);
            let f = frame_v4(dst, 64, MAC);
            let mut tally = Tally::default();
            let out = route_one(&v, &f, (0, MAC), &info, &mut tally, Some((c, now)));
            (out, tally.no_route, tally.no_neighbour)
        };
        // Decided once per flow (a forward and a drop alike), then found.
        for now in [1, 2, 3] {
            assert_eq!(go([198, 18, 9, 9], now, &mut c).0, Some((1, GW)));
            assert_eq!(go([198, 18, 2, 1], now, &mut c).1, 1);
        }
        let d = c.published();
        assert_eq!((d.lookups, d.hits, d.inserts, d.stale), (6, 4, 2, 0));
        // The gateway's MAC is lost: every kept decision is stale, the forward becomes a
        // drop at once, and the drop is decided again (the same).
        t.hops.store(Arc::new(hops(None)));
        assert_eq!(go([198, 18, 9, 9], 4, &mut c), (None, 0, 1));
        assert_eq!(go([198, 18, 2, 1], 4, &mut c).1, 1);
        let d = c.published();
        assert_eq!((d.lookups, d.hits, d.stale, d.inserts), (2, 2, 2, 0));
    }

    #[test]
    fn a_routed_frame_has_new_macs_one_ttl_less_and_a_valid_checksum() {
        let f = frame_v4([198, 18, 9, 9], 64, MAC);
        let mut buf = [0u8; 128];
        let (len, completed) = write_routed(&f, Some(false), GW, MAC, &mut buf);
        assert!(!completed);
        let out = &buf[..len];
        assert_eq!(&out[..6], &GW);
        assert_eq!(&out[6..12], &MAC);
        assert_eq!(out[22], 63);
        assert_eq!(
            flowlane_wire::checksum::checksum(&out[14..34]),
            0,
            "valid header sum"
        );
        assert_eq!(&out[34..], &f[34..], "the rest untouched");
    }

    #[test]
    fn an_update_published_is_seen_by_the_next_view() {
        let hops = NextHops {
            hops: vec![
                Hop::Via {
                    port: 0,
                    mac: Some(GW),
                },
                Hop::Via {
                    port: 1,
                    mac: Some(MAC),
                },
            ],
            ..NextHops::default()
        };
        let (t, mut w4, _w6) = tables(&[("198.18.0.0/15", 0)], hops);
        let f = frame_v4([198, 18, 7, 7], 64, MAC);
        let l3 = L3::parse(&f).expect("ip");
        let before = t.view();
        w4.insert("198.18.7.0/24".parse().expect("prefix"), 1)
            .expect("insert");
        w4.publish();
        assert_eq!(
            before.decide(&f, &l3),
            Decision::Forward { port: 0, mac: GW },
            "a held view stays"
        );
        assert_eq!(
            t.view().decide(&f, &l3),
            Decision::Forward { port: 1, mac: MAC }
        );
    }
}
