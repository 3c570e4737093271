//! The route worker's flow cache (TRASH's idea, `forward --mode route --flow-cache N`): a
//! decision kept per flow in a `flowlane-flowtable` table, so a flow's later frames skip the
//! FIB and next-hop lookups. Entries carry the generation of the routes and neighbours they
//! were decided on; when a worker sees new snapshots (a route or neighbour changed) the
//! generation moves on and every older entry is stale — decided again when its flow next
//! comes, never followed. Coarse (a change anywhere invalidates all), never wrong.

use flowlane_flowtable::{Config, FlowKey, FlowTable, Stats};
use flowlane_wire::forward::{Reason, L3};

use crate::route::decide::{Decision, Snapshots, View};

/// A decision as kept: 0 none, 1 forward, 2 to the host, 3 + reason dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cached {
    generation: u32,
    kind: u8,
    port: u16,
    mac: [u8; 6],
}

const REASONS: [Reason; 6] = [
    Reason::NotIp,
    Reason::Malformed,
    Reason::TtlExceeded,
    Reason::NoRoute,
    Reason::NoNeighbour,
    Reason::TooBig,
];

impl Cached {
    fn of(d: &Decision, generation: u32) -> Cached {
        let (kind, port, mac) = match *d {
            Decision::Forward { port, mac } => (1, port, mac),
            Decision::ToHost => (2, 0, [0; 6]),
            Decision::Drop(r) => (
                3 + REASONS.iter().position(|&x| x == r).unwrap_or(1) as u8,
                0,
                [0; 6],
            ),
        };
        Cached {
            generation,
            kind,
            port,
            mac,
        }
    }

    fn decision(&self) -> Option<Decision> {
        match self.kind {
            1 => Some(Decision::Forward {
                port: self.port,
                mac: self.mac,
            }),
            2 => Some(Decision::ToHost),
            k @ 3..=8 => Some(Decision::Drop(REASONS[usize::from(k - 3)])),
            _ => None,
        }
    }
}

/// A worker's cache.
#[allow(missing_debug_implementations)]
pub struct RouteCache {
    table: FlowTable<Cached>,
    generation: u32,
    seen: Option<Snapshots>,
    /// Hits on an entry decided before the routes or neighbours last changed (decided again).
    pub stale: u64,
    /// What the table's counters were when last published (`published`).
    last: (Stats, u64),
}

/// What a cache did since it was last asked (`RouteCache::published`).
#[derive(Debug, Clone, Copy, Default)]
pub struct CacheDelta {
    pub lookups: u64,
    pub hits: u64,
    pub stale: u64,
    pub inserts: u64,
    pub expired: u64,
    pub evicted: u64,
    pub gc_visited: u64,
}

impl RouteCache {
    /// A cache of `capacity` flows; an idle flow expires after 30 s (10 s after a TCP FIN or
    /// RST is not tracked here: a router's cache keeps decisions, not connections).
    pub fn new(capacity: usize) -> Result<RouteCache, String> {
        let mut cfg = Config::new(capacity);
        cfg.timeouts_ns = [30_000_000_000; flowlane_flowtable::CLASSES];
        cfg.seed = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            capacity,
        );
        Ok(RouteCache {
            table: FlowTable::new(&cfg).map_err(|e| format!("the flow cache: {e}"))?,
            generation: 0,
            seen: None,
            stale: 0,
            last: (Stats::default(), 0),
        })
    }

    /// The start of a poll round: new snapshots start a new generation; what is due expires.
    pub fn round(&mut self, view: &View, now_ns: u64) {
        if !self.seen.as_ref().is_some_and(|s| s.same(view)) {
            self.generation = self.generation.wrapping_add(1);
            self.seen = Some(view.snapshots());
        }
        self.table.expire(now_ns, |_, _, _| {});
    }

    /// The decision for a frame that came in on port `port`: the cached one where it is of
    /// this generation, else the view's (then kept).
    pub fn decide(
        &mut self,
        view: &View,
        frame: &[u8],
        l3: &L3,
        port: u16,
        now_ns: u64,
    ) -> Decision {
        let Some(key) = flow_key(frame, l3, port) else {
            return view.decide(frame, l3);
        };
        let generation = self.generation;
        let u = self.table.upsert(&key, now_ns);
        if !u.new {
            if u.value.generation == generation {
                if let Some(d) = u.value.decision() {
                    return d;
                }
            } else {
                self.stale += 1;
            }
        }
        let d = view.decide(frame, l3);
        *u.value = Cached::of(&d, generation);
        d
    }

    /// The counts since the last call.
    pub fn published(&mut self) -> CacheDelta {
        let s = *self.table.stats();
        let (p, stale) = self.last;
        self.last = (s, self.stale);
        CacheDelta {
            lookups: s.lookups - p.lookups,
            hits: s.hits - p.hits,
            stale: self.stale - stale,
            inserts: s.inserts - p.inserts,
            expired: s.expired_total() - p.expired_total(),
            evicted: (s.evicted_full + s.evicted_no_room) - (p.evicted_full + p.evicted_no_room),
            gc_visited: s.gc_visited - p.gc_visited,
        }
    }
}

/// The frame's flow: addresses, protocol, ports (0 for a fragment or a protocol without
/// them), and the port it came in on. `None`: addresses cut short.
fn flow_key(frame: &[u8], l3: &L3, port: u16) -> Option<FlowKey> {
    let ports = l3
        .l4
        .filter(|_| matches!(l3.proto, 6 | 17))
        .and_then(|at| frame.get(at..at + 4))
        .map_or((0, 0), |p| {
            (
                u16::from_be_bytes([p[0], p[1]]),
                u16::from_be_bytes([p[2], p[3]]),
            )
        });
    let key = if l3.v6 {
        let s: [u8; 16] = frame.get(l3.at + 8..l3.at + 24)?.try_into().ok()?;
        let d: [u8; 16] = frame.get(l3.at + 24..l3.at + 40)?.try_into().ok()?;
        FlowKey::v6(s.into(), d.into(), ports.0, ports.1, l3.proto)
    } else {
        let s: [u8; 4] = frame.get(l3.at + 12..l3.at + 16)?.try_into().ok()?;
        let d: [u8; 4] = frame.get(l3.at + 16..l3.at + 20)?.try_into().ok()?;
        FlowKey::v4(s.into(), d.into(), ports.0, ports.1, l3.proto)
    };
    Some(key.on(port))
}
