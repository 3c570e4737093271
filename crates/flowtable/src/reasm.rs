//! IP reassembly (IPv4 and IPv6), bounded and counted: contexts keyed by (source,
//! destination, protocol, identification) in a [`FlowTable`] — so a bounded number of them,
//! expiry in O(1) per context on its timer wheel (the timeout runs from a datagram's first
//! fragment, as Linux's `ipfrag_time`), and eviction of the least recently started when full.
//! A byte budget over every context's buffer, a most fragments per datagram, and one policy
//! for overlap: the whole datagram is dropped (RFC 5722; what Linux does for IPv6) — an exact
//! repeat of a fragment already held is a duplicate, counted and ignored.
//!
//! Every fragment given is counted exactly once, where it ended:
//! `fragments = datagram_fragments + overlap + duplicate + too_many + too_big + memory +
//! malformed + timed_out + evicted + held_fragments` ([`ReasmCounts::balanced`]).
//!
//! Pure: the caller parses headers and passes the time.

use std::net::IpAddr;

use crate::{Config, FlowKey, FlowTable};

/// A reassembler's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReasmConfig {
    /// Datagrams being reassembled at once (VPP: 1 024).
    pub contexts: usize,
    /// Bytes all contexts' buffers may hold (Linux: 4 MiB a namespace).
    pub bytes: usize,
    /// Fragments a datagram may have (≥ 45: a 64 KiB datagram in 1 500-byte frames).
    pub max_fragments: u16,
    /// A context's life from its first fragment, nanoseconds (Linux: 30 s).
    pub timeout_ns: u64,
    /// Keys the context table's hash (choose it at random: fragments come from the network).
    pub seed: u64,
}

impl Default for ReasmConfig {
    fn default() -> ReasmConfig {
        ReasmConfig {
            contexts: 1024,
            bytes: 4 << 20,
            max_fragments: 64,
            timeout_ns: 30_000_000_000,
            seed: 0x5eed_f7a6_0000_0001,
        }
    }
}

/// One fragment, as wire's parser reads it from a frame (or as a caller builds it).
pub use flowlane_wire::FragmentView as Fragment;

/// A datagram made whole: a view of the reassembler's buffer, good until its next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub id: u32,
    /// The payload (e.g. the UDP header and its data).
    pub data: &'a [u8],
    /// Fragments it was made of.
    pub fragments: u16,
}

/// Why a fragment (and, but for a duplicate, its datagram) was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// It overlaps a fragment held (not an exact repeat): the datagram goes.
    Overlap,
    /// An exact repeat of a fragment held: ignored.
    Duplicate,
    /// More fragments than `max_fragments`.
    TooMany,
    /// Past 65 535 bytes of payload, or past the end a last fragment set.
    TooBig,
    /// The byte budget was spent.
    Memory,
    /// A fragment not last whose length is not a multiple of 8, or an empty one.
    Malformed,
}

/// What became of a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// Held until the rest come.
    Held,
    /// It completed its datagram.
    Complete(Datagram<'a>),
    /// Dropped, with (unless a duplicate) the fragments its datagram held.
    Dropped(Dropped),
}

/// Fragments by where they ended, and the state held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReasmCounts {
    /// Fragments given.
    pub fragments: u64,
    /// Datagrams made whole, and the fragments they were made of.
    pub datagrams: u64,
    pub datagram_fragments: u64,
    /// Fragments dropped, by reason (with the ones their datagram held before).
    pub overlap: u64,
    pub duplicate: u64,
    pub too_many: u64,
    pub too_big: u64,
    pub memory: u64,
    pub malformed: u64,
    /// Fragments of datagrams whose time ran out, or pushed out for a new datagram when every
    /// context was in use.
    pub timed_out: u64,
    pub evicted: u64,
    /// Datagrams given up, by any of those reasons (a context counted once).
    pub datagrams_dropped: u64,
    /// Held now: fragments, contexts, buffer bytes.
    pub held_fragments: u64,
    pub held_contexts: u64,
    pub held_bytes: u64,
}

impl ReasmCounts {
    /// Every fragment given is accounted once.
    pub fn balanced(&self) -> bool {
        self.fragments
            == self.datagram_fragments
                + self.overlap
                + self.duplicate
                + self.too_many
                + self.too_big
                + self.memory
                + self.malformed
                + self.timed_out
                + self.evicted
                + self.held_fragments
    }

    /// A context leaves the table: what it held is no longer held.
    fn release(&mut self, ctx: &Ctx) {
        self.held_fragments -= ctx.pieces.len() as u64;
        self.held_bytes -= ctx.data.len() as u64;
        self.held_contexts -= 1;
    }

    /// A context given up: its fragments (and `extra` more) counted under `why`.
    fn give_up(&mut self, ctx: &Ctx, extra: u64, why: Dropped) {
        self.release(ctx);
        self.datagrams_dropped += 1;
        *self.slot(why) += ctx.pieces.len() as u64 + extra;
    }

    fn slot(&mut self, why: Dropped) -> &mut u64 {
        match why {
            Dropped::Overlap => &mut self.overlap,
            Dropped::Duplicate => &mut self.duplicate,
            Dropped::TooMany => &mut self.too_many,
            Dropped::TooBig => &mut self.too_big,
            Dropped::Memory => &mut self.memory,
            Dropped::Malformed => &mut self.malformed,
        }
    }
}

/// A datagram being reassembled. Contexts and their buffers are reused (a pool), so a
/// reassembler in its steady state allocates nothing.
#[derive(Debug, Clone, Default)]
struct Ctx {
    /// The payload so far (as long as the furthest end seen).
    data: Vec<u8>,
    /// The pieces held: (offset, length) — a payload is at most 65 535 bytes.
    pieces: Vec<(u16, u16)>,
    /// The payload's length once the last fragment came (0: not yet; a fragment is never
    /// empty).
    total: u16,
    /// Bytes held (no overlap is ever kept, so this is what is covered).
    got: u16,
}

impl Ctx {
    fn clear(&mut self) {
        self.data.clear();
        self.pieces.clear();
        self.total = 0;
        self.got = 0;
    }
}

/// A reassembler: one per receive queue (no locks).
#[derive(Debug, Clone)]
pub struct Reassembler {
    table: FlowTable<Ctx>,
    cfg: ReasmConfig,
    counts: ReasmCounts,
    /// Cleared contexts to reuse (at most [`POOL`]).
    pool: Vec<Ctx>,
    /// The last datagram made whole (what [`Datagram::data`] shows).
    done: Vec<u8>,
}

/// The most payload a datagram carries.
const MAX_PAYLOAD: u32 = 65_535;

/// Contexts kept for reuse.
const POOL: usize = 64;

impl Reassembler {
    /// An empty reassembler; its context table is allocated now.
    pub fn new(cfg: &ReasmConfig) -> Result<Reassembler, crate::ConfigError> {
        if cfg.max_fragments == 0 || cfg.bytes == 0 {
            return Err(crate::ConfigError(
                "a reassembler needs room for a fragment and a byte".into(),
            ));
        }
        let mut t = Config::new(cfg.contexts);
        // Ticks of a sixteenth of the timeout (at least 1 µs): a context lives its timeout to
        // within 6 %, and the wheel has 18 slots.
        t.tick_ns = (cfg.timeout_ns / 16).max(1_000);
        t.timeouts_ns = [cfg.timeout_ns.max(t.tick_ns); crate::CLASSES];
        t.seed = cfg.seed;
        Ok(Reassembler {
            table: FlowTable::new(&t)?,
            cfg: cfg.clone(),
            counts: ReasmCounts::default(),
            pool: Vec::new(),
            done: Vec::new(),
        })
    }

    /// The counts so far.
    pub fn counts(&self) -> ReasmCounts {
        self.counts
    }

    /// Bytes of the context table itself (buffers are in `held_bytes`).
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
    }

    /// Keeps a context's allocations for the next datagram: at most [`POOL`] contexts, and
    /// none whose buffer grew past a jumbo frame's payload — the pool holds at most
    /// 64 × 9 KiB beyond the byte budget, which counts only what contexts hold.
    fn recycle(pool: &mut Vec<Ctx>, mut ctx: Ctx) {
        if pool.len() < POOL && ctx.data.capacity() <= 9216 {
            ctx.clear();
            pool.push(ctx);
        }
    }

    /// Takes one fragment at `now_ns`.
    pub fn fragment(&mut self, f: &Fragment<'_>, now_ns: u64) -> Outcome<'_> {
        let Reassembler {
            table,
            cfg,
            counts,
            pool,
            done,
        } = self;
        counts.fragments += 1;
        let len = f.data.len() as u32;
        let end = u64::from(f.offset) + u64::from(len);
        if len == 0 || (f.more && !len.is_multiple_of(8)) {
            counts.malformed += 1;
            return Outcome::Dropped(Dropped::Malformed);
        }
        if end > u64::from(MAX_PAYLOAD) {
            // A context it would have joined stays as it is.
            counts.too_big += 1;
            return Outcome::Dropped(Dropped::TooBig);
        }
        let Some(key) = FlowKey::new(f.src, f.dst, (f.id >> 16) as u16, f.id as u16, f.proto)
        else {
            counts.malformed += 1;
            return Outcome::Dropped(Dropped::Malformed);
        };
        // Both fit 16 bits now: the end is at most 65 535.
        let (end, off, len) = (end as u16, f.offset as u16, len as u16);
        let u = table.upsert(&key, now_ns);
        if let Some((_, gone)) = u.evicted {
            counts.evicted += gone.pieces.len() as u64;
            counts.datagrams_dropped += 1;
            counts.release(&gone);
            Self::recycle(pool, gone);
        }
        let ctx = u.value;
        if u.new {
            counts.held_contexts += 1;
            if let Some(c) = pool.pop() {
                *ctx = c;
            }
        }
        // What this fragment says against what is held.
        let known = ctx.total > 0;
        let verdict = if (known && (end > ctx.total || (!f.more && end != ctx.total)))
            || (!f.more && ctx.pieces.iter().any(|&(o, l)| o + l > end))
        {
            Some(Dropped::TooBig)
        } else if let Some(&(o, l)) = ctx.pieces.iter().find(|&&(o, l)| off < o + l && o < end) {
            let same = o == off
                && l == len
                && ctx.data.get(usize::from(o)..usize::from(o + l)) == Some(f.data);
            Some(if same {
                Dropped::Duplicate
            } else {
                Dropped::Overlap
            })
        } else if ctx.pieces.len() >= usize::from(cfg.max_fragments) {
            Some(Dropped::TooMany)
        } else {
            let grow = u64::from(end).saturating_sub(ctx.data.len() as u64);
            (counts.held_bytes + grow > cfg.bytes as u64).then_some(Dropped::Memory)
        };
        match verdict {
            Some(Dropped::Duplicate) => {
                counts.duplicate += 1;
                return Outcome::Dropped(Dropped::Duplicate);
            }
            Some(why) => {
                let ctx = table
                    .remove(&key)
                    .unwrap_or_else(|| unreachable!("the context is held"));
                counts.give_up(&ctx, 1, why);
                Self::recycle(pool, ctx);
                return Outcome::Dropped(why);
            }
            None => {}
        }
        let grow = usize::from(end).saturating_sub(ctx.data.len());
        if grow > 0 {
            ctx.data.resize(usize::from(end), 0);
        }
        ctx.data[usize::from(off)..usize::from(end)].copy_from_slice(f.data);
        ctx.pieces.push((off, len));
        ctx.got += len;
        if !f.more {
            ctx.total = end;
        }
        counts.held_bytes += grow as u64;
        counts.held_fragments += 1;
        if ctx.total != ctx.got {
            return Outcome::Held;
        }
        let mut ctx = table
            .remove(&key)
            .unwrap_or_else(|| unreachable!("the context is held"));
        counts.release(&ctx);
        let n = ctx.pieces.len() as u64;
        counts.datagrams += 1;
        counts.datagram_fragments += n;
        // The whole datagram becomes `done`; `done`'s old buffer goes back with the context.
        std::mem::swap(done, &mut ctx.data);
        Self::recycle(pool, ctx);
        Outcome::Complete(Datagram {
            src: f.src,
            dst: f.dst,
            proto: f.proto,
            id: f.id,
            data: done,
            fragments: n as u16,
        })
    }

    /// Gives up every datagram whose time ran out by `now_ns` (O(1) a context: the table's
    /// timer wheel).
    pub fn expire(&mut self, now_ns: u64) {
        let Reassembler {
            table,
            counts,
            pool,
            ..
        } = self;
        table.expire(now_ns, |_, ctx, _| {
            counts.timed_out += ctx.pieces.len() as u64;
            counts.datagrams_dropped += 1;
            counts.release(&ctx);
            Self::recycle(pool, ctx);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frag(id: u32, offset: u32, more: bool, data: &[u8]) -> Fragment<'_> {
        Fragment {
            src: "198.18.0.1".parse().expect("addr"),
            dst: "198.18.1.2".parse().expect("addr"),
            proto: 17,
            id,
            offset,
            more,
            data,
        }
    }

    fn small() -> Reassembler {
        Reassembler::new(&ReasmConfig {
            contexts: 8,
            bytes: 4096,
            max_fragments: 4,
            timeout_ns: 1_000_000,
            seed: 1,
        })
        .expect("reassembler")
    }

    #[test]
    fn fragments_in_any_order_make_the_datagram() {
        let payload: Vec<u8> = (0..40u8).collect();
        let mut r = small();
        for order in [[0usize, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]] {
            let mut out: Option<(Vec<u8>, u16)> = None;
            for &i in &order {
                let last = i == 2;
                let end = if last { 40 } else { (i + 1) * 16 };
                let f = frag(7, (i * 16) as u32, !last, &payload[i * 16..end]);
                match r.fragment(&f, 0) {
                    Outcome::Complete(d) => out = Some((d.data.to_vec(), d.fragments)),
                    Outcome::Held => {}
                    o => panic!("{o:?}"),
                }
            }
            let (data, n) = out.expect("complete");
            assert_eq!((data, n), (payload.clone(), 3));
        }
        let c = r.counts();
        assert!(c.balanced(), "{c:?}");
        assert_eq!((c.datagrams, c.held_contexts, c.held_bytes), (4, 0, 0));
    }

    #[test]
    fn overlap_drops_the_datagram_and_a_repeat_is_a_duplicate() {
        let mut r = small();
        let d = [1u8; 24];
        assert_eq!(r.fragment(&frag(1, 0, true, &d[..16]), 0), Outcome::Held);
        assert_eq!(
            r.fragment(&frag(1, 0, true, &d[..16]), 0),
            Outcome::Dropped(Dropped::Duplicate)
        );
        // Overlapping from below and from above both drop the whole datagram.
        assert_eq!(
            r.fragment(&frag(1, 8, true, &d[..16]), 0),
            Outcome::Dropped(Dropped::Overlap)
        );
        assert_eq!(r.fragment(&frag(2, 8, false, &d), 0), Outcome::Held);
        assert_eq!(
            r.fragment(&frag(2, 0, true, &d[..16]), 0),
            Outcome::Dropped(Dropped::Overlap)
        );
        // A repeat with other bytes is an overlap, not a duplicate (Teardrop's cousin).
        assert_eq!(r.fragment(&frag(3, 0, true, &d[..8]), 0), Outcome::Held);
        assert_eq!(
            r.fragment(&frag(3, 0, true, &[2u8; 8]), 0),
            Outcome::Dropped(Dropped::Overlap)
        );
        let c = r.counts();
        assert!(c.balanced(), "{c:?}");
        assert_eq!((c.duplicate, c.overlap, c.held_contexts), (1, 6, 0));
    }

    #[test]
    fn limits_hold_and_time_runs_out() {
        let mut r = small();
        let d = [0u8; 64];
        for i in 0..4 {
            assert_eq!(r.fragment(&frag(1, i * 8, true, &d[..8]), 0), Outcome::Held);
        }
        assert_eq!(
            r.fragment(&frag(1, 32, true, &d[..8]), 0),
            Outcome::Dropped(Dropped::TooMany)
        );
        assert_eq!(
            r.fragment(&frag(2, 65_528, true, &d[..16]), 0),
            Outcome::Dropped(Dropped::TooBig)
        );
        assert_eq!(
            r.fragment(&frag(3, 0, true, &d[..12]), 0),
            Outcome::Dropped(Dropped::Malformed),
            "not a multiple of 8"
        );
        // 4 096 bytes a reassembler: a fragment far out spends them.
        assert_eq!(
            r.fragment(&frag(4, 8000, false, &d[..8]), 0),
            Outcome::Dropped(Dropped::Memory)
        );
        assert_eq!(r.fragment(&frag(5, 0, true, &d[..8]), 0), Outcome::Held);
        r.expire(500_000);
        assert_eq!(r.counts().held_contexts, 1);
        r.expire(1_100_000);
        let c = r.counts();
        assert!(c.balanced(), "{c:?}");
        assert_eq!((c.timed_out, c.held_contexts, c.held_bytes), (1, 0, 0));
        assert_eq!((c.too_many, c.too_big, c.malformed, c.memory), (5, 1, 1, 1));
    }

    /// A context costs at most 128 bytes beyond its fragments' (issue 54's target), table,
    /// buckets and wheel included.
    #[test]
    fn a_context_costs_at_most_128_bytes() {
        for contexts in [1024, 100_000] {
            let r = Reassembler::new(&ReasmConfig {
                contexts,
                ..ReasmConfig::default()
            })
            .expect("reassembler");
            let per = r.memory_bytes() as f64 / contexts as f64;
            assert!(per <= 128.0, "{per} B a context at {contexts}");
        }
    }

    #[test]
    fn a_full_table_evicts_and_counts() {
        let mut r = small();
        let d = [0u8; 8];
        for id in 0..20 {
            assert_eq!(
                r.fragment(&frag(id, 0, true, &d), u64::from(id)),
                Outcome::Held
            );
        }
        let c = r.counts();
        assert!(c.balanced(), "{c:?}");
        assert!(
            c.held_contexts <= 8 && c.evicted == 20 - c.held_contexts,
            "{c:?}"
        );
    }

    proptest! {
        /// Any stream of fragments (orders, overlaps, repeats, gaps, time passing) keeps
        /// every fragment accounted, the buffers within the budget, and makes a datagram
        /// only from fragments that cover it exactly once.
        #[test]
        fn every_fragment_is_accounted(
            ops in proptest::collection::vec(
                (0u32..6, 0u32..12, any::<bool>(), 1usize..4, 0u64..3), 1..300)
        ) {
            let mut r = small();
            let mut now = 0;
            for (id, slot, more, words, dt) in ops {
                now += dt * 200_000;
                // Each fragment's bytes name the 8-byte slot it starts at.
                let data = vec![slot as u8; words * 8];
                let f = frag(id, slot * 8, more, &data);
                if let Outcome::Complete(d) = r.fragment(&f, now) {
                    // Every byte came from a fragment that starts at or before it and
                    // covers it: the pieces sit where their offsets say.
                    for (k, chunk) in d.data.chunks(8).enumerate() {
                        let v = usize::from(chunk[0]);
                        prop_assert!(chunk.iter().all(|&b| usize::from(b) == v));
                        prop_assert!(v <= k && k < v + 3, "slot {} at chunk {}", v, k);
                    }
                    prop_assert_eq!(d.data[0], 0, "a datagram starts at offset 0");
                }
                r.expire(now);
                let c = r.counts();
                prop_assert!(c.balanced(), "{:?}", c);
                prop_assert!(c.held_bytes <= 4096);
                prop_assert!(c.held_contexts <= 8);
            }
        }
    }
}
