//! IP reassembly (IPv4 and IPv6), bounded and counted: a fixed number of contexts keyed by
//! (source, destination, protocol, identification), found through an open-addressed index;
//! expiry in O(1) per context, and eviction of the least recently started when full.
//!
//! Every context has the same timeout, running from its datagram's first fragment (as Linux's
//! `ipfrag_time`), so deadlines come in the order contexts start: the timer is a list of the
//! live contexts in that order (a timer wheel with one timeout degenerates to it) — expiry
//! takes contexts off its head while they are due, a completed or dropped context leaves it
//! from the middle in O(1), and when every context is in use the head is the one evicted. No
//! pass over the contexts ever happens. The flow table's cuckoo buckets and wheel did this
//! job before, slower (BENCHMARKS.md, "IP reassembly"): per-flow timeouts, touch-on-hit and
//! displacement walks are work a reassembler does not need.
//!
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

use crate::FlowKey;

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

/// A datagram being reassembled. A free context holds no buffer; buffers are reused through a
/// pool, so a reassembler in its steady state allocates nothing.
#[derive(Debug, Clone, Default)]
struct Ctx {
    key: FlowKey,
    /// When it times out, nanoseconds (its first fragment's time + the timeout).
    deadline: u64,
    /// The payload so far: bytes below `span` that a piece covers are the datagram's; a reused
    /// buffer keeps its length, so it is not zeroed again (bytes no piece covers are never
    /// shown: a datagram is whole only when its pieces cover it).
    data: Vec<u8>,
    /// The pieces held: (offset, length) — a payload is at most 65 535 bytes.
    pieces: Vec<(u16, u16)>,
    /// The timer list's links (context indices; [`NIL`] at either end).
    prev: u32,
    next: u32,
    /// The high half of its key's hash (its index entry's tag and home).
    hash: u32,
    /// The payload's length once the last fragment came (0: not yet; a fragment is never
    /// empty).
    total: u16,
    /// The furthest end seen: the bytes this context holds against the budget.
    span: u16,
}

impl ReasmCounts {
    /// A context leaves: what it held is no longer held.
    fn release(&mut self, ctx: &Ctx) {
        self.held_fragments -= ctx.pieces.len() as u64;
        self.held_bytes -= u64::from(ctx.span);
        self.held_contexts -= 1;
    }
}

const NIL: u32 = u32::MAX;
/// A context's buffers: the payload, the pieces.
type Buffers = (Vec<u8>, Vec<(u16, u16)>);

/// The most contexts a reassembler has (the index numbers them in 32 bits).
pub const MAX_CONTEXTS: usize = (u32::MAX / 2) as usize;

/// A reassembler: one per receive queue (no locks).
#[derive(Debug, Clone)]
pub struct Reassembler {
    cfg: ReasmConfig,
    counts: ReasmCounts,
    ctxs: Vec<Ctx>,
    /// Open addressing, linear probing, two entries a context (at most half full); deletion
    /// shifts back (no tombstones). An entry: the high half of the key's hash above the
    /// context's number + 1 (0: empty) — a probe compares hashes, and a shift finds an entry's
    /// home, without reading a context.
    index: Vec<u64>,
    /// The free contexts, linked through `next`.
    free: u32,
    /// The timer list: the live contexts from the first started to the last.
    head: u32,
    tail: u32,
    /// The latest time given (a clock that steps back is held there).
    now: u64,
    /// Buffers of finished contexts to reuse, and their bytes (at most the byte budget).
    pool: Vec<Buffers>,
    pooled: usize,
    /// The last datagram made whole (what [`Datagram::data`] shows).
    done: Vec<u8>,
}

/// The largest buffer kept for reuse: a 9 000-byte MTU's payload and a little.
const POOLED_MAX: usize = 9216;

/// The most payload a datagram carries.
const MAX_PAYLOAD: u32 = 65_535;

impl Reassembler {
    /// An empty reassembler; its contexts and index are allocated now.
    pub fn new(cfg: &ReasmConfig) -> Result<Reassembler, crate::ConfigError> {
        if cfg.max_fragments == 0 || cfg.bytes == 0 {
            return Err(crate::ConfigError(
                "a reassembler needs room for a fragment and a byte".into(),
            ));
        }
        if cfg.contexts == 0 || cfg.contexts > MAX_CONTEXTS {
            return Err(crate::ConfigError(format!(
                "{} reassembly contexts: give 1 to {MAX_CONTEXTS}",
                cfg.contexts
            )));
        }
        let n = cfg.contexts as u32;
        let ctxs = (0..n)
            .map(|c| Ctx {
                next: if c + 1 < n { c + 1 } else { NIL },
                ..Ctx::default()
            })
            .collect();
        Ok(Reassembler {
            cfg: cfg.clone(),
            counts: ReasmCounts::default(),
            ctxs,
            index: vec![0; 2 * cfg.contexts],
            free: 0,
            head: NIL,
            tail: NIL,
            now: 0,
            pool: Vec::new(),
            pooled: 0,
            done: Vec::new(),
        })
    }

    /// The counts so far.
    pub fn counts(&self) -> ReasmCounts {
        self.counts
    }

    /// Bytes of the context store itself: contexts and index (buffers are in `held_bytes`).
    pub fn memory_bytes(&self) -> usize {
        self.ctxs.len() * std::mem::size_of::<Ctx>() + self.index.len() * std::mem::size_of::<u64>()
    }

    /// Where an entry whose hash is `hash` starts probing (a multiply maps the hash onto
    /// the index's length, which need not be a power of two).
    #[inline(always)]
    fn home(&self, hash: u32) -> usize {
        ((u64::from(hash) * self.index.len() as u64) >> 32) as usize
    }

    #[inline(always)]
    fn after(&self, i: usize) -> usize {
        if i + 1 == self.index.len() {
            0
        } else {
            i + 1
        }
    }

    /// The index slot of `key` (its hash's high half `hash`), or of the empty entry where it
    /// would go.
    #[inline]
    fn probe(&self, key: &FlowKey, hash: u32) -> (usize, bool) {
        let mut i = self.home(hash);
        loop {
            let e = self.index[i];
            if e == 0 {
                return (i, false);
            }
            if (e >> 32) as u32 == hash && self.ctxs[e as u32 as usize - 1].key == *key {
                return (i, true);
            }
            i = self.after(i);
        }
    }

    /// Empties index slot `i`, shifting back the entries after it that probed past it.
    fn unindex(&mut self, mut i: usize) {
        let mut j = i;
        loop {
            self.index[i] = 0;
            loop {
                j = self.after(j);
                let e = self.index[j];
                if e == 0 {
                    return;
                }
                let home = self.home((e >> 32) as u32);
                // Entry j may move to i when its home is not in (i, j] (cyclically).
                let stays = if i <= j {
                    i < home && home <= j
                } else {
                    i < home || home <= j
                };
                if !stays {
                    break;
                }
            }
            self.index[i] = self.index[j];
            i = j;
        }
    }

    /// Takes context `c` off the timer list and out of the index, frees it and returns its
    /// buffers (to be counted, then recycled).
    fn finish(&mut self, c: u32) -> Ctx {
        let (prev, next) = (self.ctxs[c as usize].prev, self.ctxs[c as usize].next);
        match prev {
            NIL => self.head = next,
            p => self.ctxs[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.ctxs[n as usize].prev = prev,
        }
        let mut i = self.home(self.ctxs[c as usize].hash);
        while self.index[i] as u32 != c + 1 {
            i = self.after(i);
        }
        self.unindex(i);
        self.ctxs[c as usize].next = self.free;
        self.free = c;
        let ctx = &mut self.ctxs[c as usize];
        Ctx {
            key: ctx.key,
            deadline: 0,
            data: std::mem::take(&mut ctx.data),
            pieces: std::mem::take(&mut ctx.pieces),
            prev: NIL,
            next: NIL,
            hash: 0,
            total: ctx.total,
            span: ctx.span,
        }
    }

    /// Context `c` given up (evicted, timed out or dropped): its fragments, and `extra` more
    /// (the one that dropped it), counted where `reason` says.
    fn give_up(&mut self, c: u32, extra: u64, reason: impl FnOnce(&mut ReasmCounts) -> &mut u64) {
        let ctx = self.finish(c);
        self.counts.release(&ctx);
        self.counts.datagrams_dropped += 1;
        *reason(&mut self.counts) += ctx.pieces.len() as u64 + extra;
        self.recycle(ctx);
    }

    /// Keeps a finished context's buffers for the next datagram while the pool holds no more
    /// than the byte budget, so a window of datagrams as large as the budget allows finds
    /// buffers ready (a pool of 64 buffers made 1 024 datagrams in flight allocate most of
    /// theirs: a third of the time), and none that grew past a jumbo frame's payload: a
    /// pooled buffer goes to a context whose span may be far smaller, so what contexts hold
    /// beyond their counted spans is at most 9 KiB each. Allocated in all: the spans (within
    /// the budget; a new buffer at most twice its span as it grew), that, and the pool
    /// (within the budget).
    fn recycle(&mut self, ctx: Ctx) {
        let bytes = ctx.data.capacity() + 4 * ctx.pieces.capacity();
        if ctx.data.capacity() <= POOLED_MAX && self.pooled + bytes <= self.cfg.bytes {
            let mut pieces = ctx.pieces;
            pieces.clear();
            self.pooled += bytes;
            self.pool.push((ctx.data, pieces));
        }
    }

    /// A new context for `key` at index slot `at`, last on the timer list (evicting the
    /// first started when none is free).
    fn start(&mut self, key: &FlowKey, hash: u32, mut at: usize) -> u32 {
        if self.free == NIL {
            self.give_up(self.head, 0, |n| &mut n.evicted);
            // The index moved under the eviction: find the key's empty slot again.
            at = self.probe(key, hash).0;
        }
        let c = self.free;
        self.free = self.ctxs[c as usize].next;
        self.index[at] = u64::from(hash) << 32 | u64::from(c + 1);
        let (data, pieces) = match self.pool.pop() {
            Some((d, p)) => {
                self.pooled -= d.capacity() + 4 * p.capacity();
                (d, p)
            }
            // New buffers grow with what they hold (at most twice it), so the memory
            // allocated stays within a small multiple of the byte budget.
            None => (Vec::new(), Vec::new()),
        };
        let tail = self.tail;
        self.ctxs[c as usize] = Ctx {
            key: *key,
            deadline: self.now.saturating_add(self.cfg.timeout_ns),
            data,
            pieces,
            prev: tail,
            next: NIL,
            hash,
            total: 0,
            span: 0,
        };
        match tail {
            NIL => self.head = c,
            t => self.ctxs[t as usize].next = c,
        }
        self.tail = c;
        self.counts.held_contexts += 1;
        c
    }

    /// Takes one fragment at `now_ns`.
    pub fn fragment(&mut self, f: &Fragment<'_>, now_ns: u64) -> Outcome<'_> {
        self.counts.fragments += 1;
        self.now = self.now.max(now_ns);
        let len = f.data.len() as u32;
        let end = u64::from(f.offset) + u64::from(len);
        if len == 0 || (f.more && !len.is_multiple_of(8)) {
            self.counts.malformed += 1;
            return Outcome::Dropped(Dropped::Malformed);
        }
        if end > u64::from(MAX_PAYLOAD) {
            // A context it would have joined stays as it is.
            self.counts.too_big += 1;
            return Outcome::Dropped(Dropped::TooBig);
        }
        let Some(key) = FlowKey::new(f.src, f.dst, (f.id >> 16) as u16, f.id as u16, f.proto)
        else {
            self.counts.malformed += 1;
            return Outcome::Dropped(Dropped::Malformed);
        };
        // Both fit 16 bits now: the end is at most 65 535.
        let (end, off, len) = (end as u16, f.offset as u16, len as u16);
        let hash = (key.hash(self.cfg.seed) >> 32) as u32;
        let c = match self.probe(&key, hash) {
            (i, true) => self.index[i] as u32 - 1,
            (i, false) => self.start(&key, hash, i),
        };
        let ctx = &self.ctxs[c as usize];
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
        } else if ctx.pieces.len() >= usize::from(self.cfg.max_fragments) {
            Some(Dropped::TooMany)
        } else {
            let grow = u64::from(end.saturating_sub(ctx.span));
            (self.counts.held_bytes + grow > self.cfg.bytes as u64).then_some(Dropped::Memory)
        };
        match verdict {
            Some(Dropped::Duplicate) => {
                self.counts.duplicate += 1;
                return Outcome::Dropped(Dropped::Duplicate);
            }
            Some(why) => {
                self.give_up(c, 1, |n| n.slot(why));
                return Outcome::Dropped(why);
            }
            None => {}
        }
        let ctx = &mut self.ctxs[c as usize];
        let grow = end.saturating_sub(ctx.span);
        ctx.span = ctx.span.max(end);
        if ctx.data.len() < usize::from(end) {
            ctx.data.resize(usize::from(end), 0);
        }
        ctx.data[usize::from(off)..usize::from(end)].copy_from_slice(f.data);
        ctx.pieces.push((off, len));
        if !f.more {
            ctx.total = end;
        }
        // No overlap is ever kept, so the pieces' lengths add up to what is covered.
        let whole = ctx.total > 0
            && ctx.pieces.iter().map(|&(_, l)| u32::from(l)).sum::<u32>() == u32::from(ctx.total);
        self.counts.held_bytes += u64::from(grow);
        self.counts.held_fragments += 1;
        if !whole {
            return Outcome::Held;
        }
        let mut ctx = self.finish(c);
        let total = usize::from(ctx.total);
        self.counts.release(&ctx);
        let n = ctx.pieces.len() as u64;
        self.counts.datagrams += 1;
        self.counts.datagram_fragments += n;
        // The whole datagram becomes `done`; `done`'s old buffer goes back with the context.
        std::mem::swap(&mut self.done, &mut ctx.data);
        self.recycle(ctx);
        Outcome::Complete(Datagram {
            src: f.src,
            dst: f.dst,
            proto: f.proto,
            id: f.id,
            data: &self.done[..total],
            fragments: n as u16,
        })
    }

    /// Gives up every datagram whose time ran out by `now_ns`: the timer list's head while it
    /// is due (O(1) a context; the first one not due ends it).
    pub fn expire(&mut self, now_ns: u64) {
        self.now = self.now.max(now_ns);
        while self.head != NIL && self.ctxs[self.head as usize].deadline <= self.now {
            self.give_up(self.head, 0, |n| &mut n.timed_out);
        }
    }

    /// Checks the timer list, index and free list against each other (tests).
    #[cfg(test)]
    fn check(&self) {
        let mut live = 0usize;
        let (mut c, mut prev, mut deadline) = (self.head, NIL, 0);
        while c != NIL {
            let ctx = &self.ctxs[c as usize];
            assert_eq!(ctx.prev, prev);
            assert!(ctx.deadline >= deadline, "the list is in deadline order");
            assert_eq!(ctx.hash, (ctx.key.hash(self.cfg.seed) >> 32) as u32);
            let (i, found) = self.probe(&ctx.key, ctx.hash);
            assert!(found && self.index[i] as u32 - 1 == c);
            deadline = ctx.deadline;
            prev = c;
            c = ctx.next;
            live += 1;
        }
        assert_eq!(self.tail, prev);
        assert_eq!(live as u64, self.counts.held_contexts);
        let (mut free, mut c) = (0, self.free);
        while c != NIL {
            free += 1;
            c = self.ctxs[c as usize].next;
        }
        assert_eq!(live + free, self.ctxs.len());
        assert_eq!(self.index.iter().filter(|&&e| e != 0).count(), live);
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

    /// Buffers are reused without zeroing: a datagram shows only its own bytes, whatever a
    /// longer one left in the buffer before it.
    #[test]
    fn a_reused_buffer_shows_only_the_new_datagram() {
        let mut r = small();
        let long = [0xaau8; 64];
        assert_eq!(
            r.fragment(&frag(1, 32, false, &long[..32]), 0),
            Outcome::Held
        );
        assert!(matches!(
            r.fragment(&frag(1, 0, true, &long[..32]), 0),
            Outcome::Complete(d) if d.data == &long[..]
        ));
        for id in 2..6 {
            let short: Vec<u8> = (0..24).map(|b| b + id as u8).collect();
            assert_eq!(
                r.fragment(&frag(id, 16, false, &short[16..]), 0),
                Outcome::Held
            );
            assert_eq!(
                r.fragment(&frag(id, 0, true, &short[..8]), 0),
                Outcome::Held
            );
            assert!(matches!(
                r.fragment(&frag(id, 8, true, &short[8..16]), 0),
                Outcome::Complete(d) if d.data == &short[..] && d.fragments == 3
            ));
        }
        let c = r.counts();
        assert!(c.balanced(), "{c:?}");
        assert_eq!((c.datagrams, c.held_bytes, c.held_contexts), (5, 0, 0));
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
        assert_eq!((c.held_contexts, c.evicted), (8, 12), "{c:?}");
        r.check();
        // The least recently started went: 12 to 19 are held, 11 is not.
        let last = [0u8; 8];
        assert!(matches!(
            r.fragment(&frag(12, 8, false, &last), 20),
            Outcome::Complete(d) if d.data.len() == 16
        ));
        assert_eq!(r.fragment(&frag(11, 8, false, &last), 21), Outcome::Held);
        r.check();
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
                r.check();
                let c = r.counts();
                prop_assert!(c.balanced(), "{:?}", c);
                prop_assert!(c.held_bytes <= 4096);
                prop_assert!(c.held_contexts <= 8);
            }
        }
    }
}
