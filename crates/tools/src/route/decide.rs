//! What the router knows and how it decides, apart from the workers that move frames: the
//! FIB snapshots and the next hops ([`Tables`]) and the decision ([`View::decide`]), so the
//! same decision is checked against the kernel's without a packet sent (the user-space
//! workers are `forward::worker::route`; the native XDP router compiles the same tables).
//!
//! A decision is: the frame is for this host (multicast or broadcast, or to one of its own
//! addresses: left to the kernel), or it leaves by port P to MAC M, or it is dropped for a
//! named [`Reason`]. Next hops are indices the FIB returns into a [`NextHops`] table, which
//! is swapped whole (neighbours change) while the FIB's own snapshots are published by its
//! writer (routes change): a worker loads both once per poll round and never waits.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arc_swap::ArcSwap;
use flowlane_lpm::{Fib, FibReader};
use flowlane_wire::forward::{Reason, L3};

/// Where a next hop sends frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// Through a gateway on port `port`, whose MAC is `mac` (`None`: not resolved).
    Via {
        /// The forwarder's port (index into its interfaces).
        port: u16,
        /// The gateway's MAC.
        mac: Option<[u8; 6]>,
    },
    /// To the destination itself, on the link of port `port` (a connected route): its MAC
    /// comes from [`NextHops::hosts`].
    Connected {
        /// The forwarder's port.
        port: u16,
    },
    /// Nowhere the forwarder can send: a blackhole or unreachable route, or one leaving by an
    /// interface that is not the forwarder's (counted as no route).
    Nowhere,
}

/// An address of either family as one key: IPv4 as `::ffff:a.b.c.d`.
pub fn host_key_v4(a: u32) -> u128 {
    0xffff_0000_0000 | u128::from(a)
}

/// A hash map looked up for every frame: FxHash (`rustc-hash`). std's SipHash was ~6 % of the
/// AF_XDP router's CPU (`perf record` on its core: two lookups a frame, the own-address and the
/// neighbour checks); the keys are the kernel's neighbours and addresses, not the frames'.
pub type FastMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

/// A hash set looked up for every frame (see [`FastMap`]).
pub type FastSet<K> = HashSet<K, rustc_hash::FxBuildHasher>;

/// The next-hop table a FIB's results index, with the neighbours of connected routes and the
/// host's own addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NextHops {
    /// Next hop `i` of the FIB.
    pub hops: Vec<Hop>,
    /// MACs of hosts on connected links: (port, address key) → MAC.
    pub hosts: FastMap<(u16, u128), [u8; 6]>,
    /// This host's own addresses (keys): frames to them are the kernel's.
    pub local: FastSet<u128>,
}

/// What the router does with one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send it out of `port` to `mac`.
    Forward {
        /// The port.
        port: u16,
        /// The destination MAC.
        mac: [u8; 6],
    },
    /// Multicast, broadcast or to this host: the kernel's.
    ToHost,
    /// Dropped, and why.
    Drop(Reason),
}

/// Everything a worker reads: the two FIBs' snapshots and the next hops, each swapped whole.
#[derive(Debug, Clone)]
pub struct Tables {
    /// IPv4 routes.
    pub v4: FibReader<u32>,
    /// IPv6 routes.
    pub v6: FibReader<u128>,
    /// The next hops and neighbours.
    pub hops: Arc<ArcSwap<NextHops>>,
}

/// One round's view of [`Tables`]: snapshots held for a batch of decisions.
#[allow(missing_debug_implementations)]
pub struct View {
    v4: arc_swap::Guard<Arc<Fib<u32>>>,
    v6: arc_swap::Guard<Arc<Fib<u128>>>,
    hops: arc_swap::Guard<Arc<NextHops>>,
}

impl Tables {
    /// The current snapshots (a worker takes one per poll round).
    pub fn view(&self) -> View {
        View {
            v4: self.v4.load(),
            v6: self.v6.load(),
            hops: self.hops.load(),
        }
    }
}

/// Which snapshots a [`View`] saw, held so that none of them can be freed (and its address
/// reused) while compared: a route cache's generation changes when they do.
#[allow(missing_debug_implementations)]
#[derive(Clone)]
pub struct Snapshots(Arc<Fib<u32>>, Arc<Fib<u128>>, Arc<NextHops>);

impl Snapshots {
    /// Whether `v` sees the same snapshots.
    pub fn same(&self, v: &View) -> bool {
        Arc::ptr_eq(&self.0, &v.v4) && Arc::ptr_eq(&self.1, &v.v6) && Arc::ptr_eq(&self.2, &v.hops)
    }
}

impl View {
    /// The snapshots this view holds.
    pub fn snapshots(&self) -> Snapshots {
        Snapshots(
            Arc::clone(&self.v4),
            Arc::clone(&self.v6),
            Arc::clone(&self.hops),
        )
    }

    /// The decision for `frame` (whose IP header `l3` describes). The TTL and the outgoing
    /// MTU are the caller's to check.
    pub fn decide(&self, frame: &[u8], l3: &L3) -> Decision {
        // Multicast and broadcast destinations (the group bit) are the host's: neighbour
        // discovery, routing protocols.
        if frame.first().is_some_and(|b| b & 1 != 0) {
            return Decision::ToHost;
        }
        let (hop, key) = if l3.v6 {
            let Some(d) = l3.dst_v6(frame) else {
                return Decision::Drop(Reason::Malformed);
            };
            (self.v6.lookup(d), d)
        } else {
            let Some(d) = l3.dst_v4(frame) else {
                return Decision::Drop(Reason::Malformed);
            };
            (self.v4.lookup(d), host_key_v4(d))
        };
        let hops = &self.hops;
        if !hops.local.is_empty() && hops.local.contains(&key) {
            return Decision::ToHost;
        }
        let Some(hop) = hop.and_then(|h| hops.hops.get(h as usize)) else {
            return Decision::Drop(Reason::NoRoute);
        };
        match *hop {
            Hop::Via {
                port,
                mac: Some(mac),
            } => Decision::Forward { port, mac },
            Hop::Via { mac: None, .. } => Decision::Drop(Reason::NoNeighbour),
            Hop::Connected { port } => match hops.hosts.get(&(port, key)) {
                Some(&mac) => Decision::Forward { port, mac },
                None => Decision::Drop(Reason::NoNeighbour),
            },
            Hop::Nowhere => Decision::Drop(Reason::NoRoute),
        }
    }
}
