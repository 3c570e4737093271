//! The table: cuckoo buckets of thirty (two choices per key), each a 64-byte line of 16-bit
//! tags alone; the records in slot order beside them (slot `s` of bucket `b` is record
//! `b * SLOTS + s`), so a tag that matches names its record with no index to read; and a
//! hashed timer wheel whose slots are circular lists threaded through the records.
//!
//! Why tags alone: at a million flows the tag lines are 2.4 MB, small enough to stay in the
//! caches that the records (tens of MB) do not, so a lookup waits on memory once, for a
//! hit's record, where buckets that also held record indices (7 MB) made it wait twice.
//!
//! Expiry is O(1) per flow: a record is linked once, into the wheel slot of the deadline it had
//! when linked (again, at its real deadline, if the cuckoo walk moves it); a lookup only writes its
//! `last` time. When the wheel reaches that slot the record's real deadline (`last` + its class's
//! timeout) is checked: due, it expires; not due, it moves to the slot of its real deadline. Each
//! visit either expires a flow or follows at least one timeout of activity, so the work per expired
//! flow does not grow with the table. `expire(now)` removes exactly the flows whose deadline, in
//! ticks, is at most `now`.

use crate::key::{FlowKey, TableKey, TCP, UDP};
use crate::prefetch::{prefetch, prefetch_addr};
use crate::tags;

/// Slots per bucket.
pub const SLOTS: usize = tags::SLOTS;
const NIL: u32 = u32::MAX;
const EMPTY: u16 = 0;
/// Most displacements one insert makes before the flow it then holds is evicted.
pub const MAX_KICKS: usize = 256;
/// A record's `seen` word: the tick it was last seen in the low bits, its class above them and
/// the in-use bit on top — one word, so a record is 52 bytes (a 40-byte key and three words
/// of links and time) and the table stays within 64 bytes a flow with its tags and wheel.
const LAST_BITS: u32 = 29;
const LAST_MASK: u32 = (1 << LAST_BITS) - 1;
const USED: u32 = 1 << 31;

/// A flow's timeout class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// UDP, idle timeout.
    Udp = 0,
    /// TCP, established (idle) timeout.
    Tcp = 1,
    /// TCP after a FIN or RST: the closing handshake's timeout.
    Closing = 2,
    /// Any other protocol, idle timeout.
    Other = 3,
}

/// Timeout classes.
pub const CLASSES: usize = 4;

impl Class {
    /// The class a new flow of protocol `proto` starts in.
    pub fn of(proto: u8) -> Class {
        match proto {
            UDP => Class::Udp,
            TCP => Class::Tcp,
            _ => Class::Other,
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        ["udp", "tcp", "closing", "other"][self as usize]
    }

    fn from_bits(m: u32) -> Class {
        match m & 3 {
            0 => Class::Udp,
            1 => Class::Tcp,
            2 => Class::Closing,
            _ => Class::Other,
        }
    }
}

/// A table's shape, fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The most flows held at once (the records, one per bucket slot, are allocated up
    /// front).
    pub capacity: usize,
    /// Expiry granularity, nanoseconds: deadlines are whole ticks. A table's clock runs
    /// 2^29 ticks from the first time it is given (621 days of 100 ms ticks, 6 days of 1 ms);
    /// past that it stands still, and flows leave by eviction only.
    pub tick_ns: u64,
    /// Timeout per class (`Class as usize`), nanoseconds; each at least one tick.
    pub timeouts_ns: [u64; CLASSES],
    /// Keys the hash (choose it at random where flows come from the network).
    pub seed: u64,
}

impl Config {
    /// `capacity` flows with flowlane's defaults: 100 ms ticks; UDP 30 s idle, TCP 120 s
    /// idle, 10 s after FIN or RST, other protocols 30 s.
    pub fn new(capacity: usize) -> Config {
        Config {
            capacity,
            tick_ns: 100_000_000,
            timeouts_ns: [30e9 as u64, 120e9 as u64, 10e9 as u64, 30e9 as u64],
            seed: 0x5eed_f10f_1a7e_0001,
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The table's counters: `rtstat`'s columns for this table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups that count (`lookup`, `upsert`).
    pub lookups: u64,
    /// Of them, found.
    pub hits: u64,
    /// Of them, not found.
    pub misses: u64,
    /// Flows added.
    pub inserts: u64,
    /// Flows expired, per class.
    pub expired: [u64; CLASSES],
    /// Flows removed by the caller.
    pub removed: u64,
    /// Flows evicted because the table held its capacity (the new flow took the least
    /// recently seen of its two buckets, a closing one first).
    pub evicted_full: u64,
    /// Flows evicted because the cuckoo walk found no room in `MAX_KICKS` moves (the flow
    /// it then held, or, had it come back to the new flow, the least recently seen of the
    /// new flow's buckets).
    pub evicted_no_room: u64,
    /// TCP flows moved to the closing timeout by a FIN or RST.
    pub closed: u64,
    /// Cuckoo displacements.
    pub kicks: u64,
    /// Wheel ticks processed.
    pub gc_ticks: u64,
    /// Records the wheel visited (expired or moved on).
    pub gc_visited: u64,
    /// Of them, moved on to their real deadline (seen since they were linked).
    pub gc_relinked: u64,
    /// Flows held now.
    pub live: u64,
}

impl Stats {
    /// Every flow expired, whatever its class.
    pub fn expired_total(&self) -> u64 {
        self.expired.iter().sum()
    }
}

/// A bucket: thirty 16-bit tags (0: empty) in one cache line, all compared at once
/// (`tags.rs`); the records they stand for are the bucket's slots in the record array. Lanes
/// [`FILTER`] and [`COUNT`] are this bucket's spill filter and count (Cuckoo++'s idea): the
/// flows whose first bucket this is but which sit in their second, as a 16-bit filter of their
/// tags and a count (the filter is cleared when the count reaches 0). A key not here whose tag
/// is not in the filter is in neither bucket: a miss reads one line, not two.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tags: [u16; tags::LANES],
}

const FILTER: usize = SLOTS;
const COUNT: usize = SLOTS + 1;

const EMPTY_BUCKET: Bucket = Bucket {
    tags: [EMPTY; tags::LANES],
};

impl Bucket {
    #[inline(always)]
    fn tag(&self, s: usize) -> u16 {
        self.tags[s]
    }

    #[inline(always)]
    fn set_tag(&mut self, s: usize, tag: u16) {
        self.tags[s] = tag;
    }

    /// The slots whose tag is `tag`: bit `s` for slot `s` (exact; the spill filter and count
    /// are never matched).
    #[inline(always)]
    fn matching(&self, tag: u16) -> u32 {
        tags::matching(&self.tags, tag)
    }

    /// The first slot whose tag is `tag`.
    #[inline(always)]
    fn first(&self, tag: u16) -> Option<usize> {
        let m = self.matching(tag);
        (m != 0).then_some(m.trailing_zeros() as usize)
    }

    /// Whether a flow with `tag` whose first bucket this is may sit in its second.
    #[inline(always)]
    fn may_spill(&self, tag: u16) -> bool {
        self.tags[FILTER] & (1 << (tag & 15)) != 0
    }

    /// One more (`up`) or one fewer flow of this first bucket in its second.
    fn spill(&mut self, tag: u16, up: bool) {
        let count = self.tags[COUNT];
        if up {
            self.tags[FILTER] |= 1 << (tag & 15);
            self.tags[COUNT] = count.saturating_add(1);
        } else {
            self.tags[COUNT] = count.saturating_sub(1);
            if self.tags[COUNT] == 0 {
                self.tags[FILTER] = 0;
            }
        }
    }

    fn empty_slot(&self) -> Option<usize> {
        self.first(EMPTY)
    }
}

/// A key's 15-bit tag (never 0, an empty slot's), from its hash's low bits.
#[inline(always)]
fn tag_of(h: u64) -> u16 {
    ((h & 0x7fff) as u16).max(1)
}

#[derive(Debug, Clone)]
#[repr(C)]
struct Record<V, K> {
    key: K,
    /// Last seen (ticks since the table's first, low [`LAST_BITS`]), the class above, and
    /// [`USED`] when it holds a flow.
    seen: u32,
    /// Wheel list links (record indices; the wheel's sentinels follow the slots' records;
    /// [`NIL`] in a record that holds no flow).
    prev: u32,
    next: u32,
    value: V,
}

impl<V: Default, K: Default> Record<V, K> {
    /// A record that holds no flow.
    fn blank() -> Self {
        Record {
            key: K::default(),
            seen: 0,
            prev: NIL,
            next: NIL,
            value: V::default(),
        }
    }
}

impl<V, K> Record<V, K> {
    /// Last seen, ticks.
    #[inline(always)]
    fn last(&self) -> u32 {
        self.seen & LAST_MASK
    }

    /// Seen at `now` (never going back).
    #[inline(always)]
    fn touch(&mut self, now: u32) {
        if now > self.last() {
            self.seen = (self.seen & !LAST_MASK) | now;
        }
    }

    fn class(&self) -> Class {
        Class::from_bits(self.seen >> LAST_BITS)
    }

    fn used(&self) -> bool {
        self.seen & USED != 0
    }

    /// In use, of `class`, last seen at `now`.
    fn hold(&mut self, class: Class, now: u32) {
        self.seen = USED | ((class as u32) << LAST_BITS) | (now & LAST_MASK);
    }
}

/// What `upsert` did.
#[derive(Debug)]
pub struct Upsert<'a, V, K = FlowKey> {
    /// The flow's value (a new flow's is `V::default()`).
    pub value: &'a mut V,
    /// The flow was not there before.
    pub new: bool,
    /// The flow evicted to make room for it, with its value.
    pub evicted: Option<(K, V)>,
}

/// A per-core flow table (no locks: one owner).
#[derive(Debug, Clone)]
pub struct FlowTable<V, K = FlowKey> {
    buckets: Vec<Bucket>,
    /// A record per bucket slot (slot `s` of bucket `b` at `b * SLOTS + s`), then the wheel's
    /// sentinels.
    records: Vec<Record<V, K>>,
    /// The most flows held at once.
    cap: u32,
    /// Records that are slots (the first sentinel's index).
    nslots: u32,
    wheel: u32,
    seed: u64,
    tick_ns: u64,
    timeouts: [u32; CLASSES],
    /// The first tick seen (`None` before any call with a time).
    base: Option<u64>,
    /// Ticks since `base`, never going back.
    now: u32,
    /// The last tick the wheel processed.
    cursor: u32,
    stats: Stats,
}

impl<V: Default, K: TableKey> FlowTable<V, K> {
    /// An empty table for up to `cfg.capacity` flows, all memory allocated now (a record for
    /// each bucket slot: a little more than the capacity, as buckets are at most 92 % full).
    pub fn new(cfg: &Config) -> Result<Self, ConfigError> {
        // Buckets at most 92 % full at capacity: two choices of thirty slots fill past 99 %,
        // and at 92 % few flows need their second bucket.
        Self::with_buckets(
            cfg,
            (cfg.capacity.div_ceil(SLOTS) * 100).div_ceil(92).max(2),
        )
    }

    /// A table of `nb` buckets (the tests give fewer slots than flows, so that buckets fill
    /// and the cuckoo walk runs out of room).
    pub(crate) fn with_buckets(cfg: &Config, nb: usize) -> Result<Self, ConfigError> {
        if cfg.capacity == 0 || cfg.capacity >= (u32::MAX / 2) as usize {
            return Err(ConfigError(format!(
                "capacity {} flows: give 1 to {}",
                cfg.capacity,
                u32::MAX / 2 - 1
            )));
        }
        if cfg.tick_ns == 0 {
            return Err(ConfigError("the tick must be at least 1 ns".into()));
        }
        let mut timeouts = [0u32; CLASSES];
        for (t, &ns) in timeouts.iter_mut().zip(&cfg.timeouts_ns) {
            let ticks = ns / cfg.tick_ns;
            if ticks == 0 || ticks > 1 << 24 {
                return Err(ConfigError(format!(
                    "a timeout of {ns} ns is {ticks} ticks of {} ns: give 1 to 2^24 ticks",
                    cfg.tick_ns
                )));
            }
            *t = ticks as u32;
        }
        let nslots = (nb * SLOTS) as u32;
        let wheel = timeouts.iter().max().copied().unwrap_or(1) + 2;
        let mut records = Vec::with_capacity(nslots as usize + wheel as usize);
        records.resize_with(nslots as usize, Record::blank);
        // The wheel's sentinels: empty circular lists.
        for s in 0..wheel {
            records.push(Record {
                prev: nslots + s,
                next: nslots + s,
                ..Record::blank()
            });
        }
        Ok(FlowTable {
            buckets: vec![EMPTY_BUCKET; nb],
            records,
            cap: cfg.capacity as u32,
            nslots,
            wheel,
            seed: cfg.seed,
            tick_ns: cfg.tick_ns,
            timeouts,
            base: None,
            now: 0,
            cursor: 0,
            stats: Stats::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Flows held.
    pub fn len(&self) -> usize {
        self.stats.live as usize
    }

    /// Whether no flow is held.
    pub fn is_empty(&self) -> bool {
        self.stats.live == 0
    }

    /// The most flows it holds.
    pub fn capacity(&self) -> usize {
        self.cap as usize
    }

    /// Bucket slots (more than the capacity: buckets are at most 92 % full).
    pub fn slots(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    /// Bytes of table: buckets, records (with their values) and the wheel.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
            + self.records.len() * std::mem::size_of::<Record<V, K>>()
    }

    /// Converts a time to ticks since the first, never going back (a clock that steps back
    /// is held at its last value).
    fn tick(&mut self, now_ns: u64) -> u32 {
        let t = now_ns / self.tick_ns;
        let base = *self.base.get_or_insert(t);
        let rel = u32::try_from(t.saturating_sub(base)).unwrap_or(LAST_MASK);
        self.now = self.now.max(rel.min(LAST_MASK));
        self.now
    }

    /// A key's tag, first bucket and second bucket, from its hash.
    #[inline]
    fn place(&self, h: u64) -> (u16, usize, usize) {
        let b1 = self.first_bucket(h);
        (tag_of(h), b1, self.second_bucket(b1, (h >> 32) as u32))
    }

    /// Independent bits: the first bucket from the hash's low word (its high bits, by the
    /// multiply), the second from the high word, the tag ([`tag_of`]) from the low word's low
    /// bits.
    #[inline(always)]
    fn first_bucket(&self, h: u64) -> usize {
        (((h & 0xffff_ffff) * self.buckets.len() as u64) >> 32) as usize
    }

    /// The second bucket, from the first and the hash's high word (never the first).
    #[inline(always)]
    fn second_bucket(&self, b1: usize, high: u32) -> usize {
        let nb = self.buckets.len();
        let b2 = ((u64::from(high) * nb as u64) >> 32) as usize;
        if b2 == b1 {
            (b1 + 1) % nb
        } else {
            b2
        }
    }

    #[inline]
    fn scan(&self, b: usize, tag: u16, key: &K) -> Option<u32> {
        let bk = &self.buckets[b];
        let mut m = bk.matching(tag);
        while m != 0 {
            let s = m.trailing_zeros() as usize;
            m &= m - 1;
            let r = (b * SLOTS + s) as u32;
            if *key == self.records[r as usize].key {
                return Some(r);
            }
        }
        None
    }

    #[inline]
    fn find(&self, key: &K, h: u64) -> Option<u32> {
        let (tag, b1, b2) = self.place(h);
        self.scan(b1, tag, key).or_else(|| {
            if self.buckets[b1].may_spill(tag) {
                self.scan(b2, tag, key)
            } else {
                None
            }
        })
    }

    /// The flow's value, without counting or touching it.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key, key.keyed_hash(self.seed))
            .map(|r| &self.records[r as usize].value)
    }

    /// The flow's value to change, without counting or touching it (its deadline stays: a
    /// reassembly context's timeout runs from its first fragment, as Linux's does).
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let r = self.find(key, key.keyed_hash(self.seed))?;
        Some(&mut self.records[r as usize].value)
    }

    /// Whether each of `keys` is held: `out[i]` is set to the record index or `None`. Up to 64 keys
    /// (rte_hash's most a bulk lookup) go through the stages together: the buckets of the whole
    /// batch are touched first, so their cache misses overlap (as DPDK's bulk lookup does). A
    /// bucket of tags alone, its records in slot order, took the batch 1.10–1.24× further than
    /// buckets of ten tags and ten record indices (a hit's record index came from the bucket, and
    /// those buckets were three times the bytes, so more of them came from memory). 64 rather than
    /// 32: a batch waits on its buckets, then on its records, and over 64 keys those waits are
    /// shared by twice as many (with the layout before, buckets of ten tags and ten record indices:
    /// 43 M lookups/s against 38 on the benchmark's workload given 64 at a time; the same given
    /// 32). Each stage waits on memory, so what it does behind its loads is kept short (the fewer
    /// instructions a key takes there, the more keys' loads are in flight): a bucket's tags
    /// compared at once (ten, then) took it 1.12–1.16× further. Tried on that layout and slower,
    /// for the same reason: choosing each stage's prefetch without branches (more instructions
    /// behind each load, though the benchmark's hits and misses alternate at random: 0.77–0.85×),
    /// and the compare without a branch on a missing candidate (reading a hot dummy record:
    /// 0.87–0.95×). Tried and no better: comparing the first buckets' candidates before the second
    /// buckets' (0.9×, or even); asking for a key's second bucket in stage 1 where a spill filter
    /// kept apart from the buckets (in cache) said so (0.93–1.0×: the filter's own load sits behind
    /// every key); both buckets of every key prefetched in stage 1, as rte_hash does (0.95×: more
    /// lines for the 10 % that need the second); prefetch hints T1 and NTA (the same).
    ///
    /// # Panics
    ///
    /// If `out` does not hold one slot per key (a key with no slot would go unanswered).
    pub fn get_batch(&self, keys: &[K], out: &mut [Option<u32>]) {
        assert_eq!(
            keys.len(),
            out.len(),
            "get_batch: {} keys, {} result slots",
            keys.len(),
            out.len()
        );
        // A call of 32 or fewer (DPDK's usual burst) zeroes scratch for 32 only: 1.02x.
        if keys.len() <= 32 {
            self.batch::<32>(keys, out)
        } else {
            self.batch::<64>(keys, out)
        }
    }

    /// [`Self::get_batch`], `B` keys through the stages at a time.
    fn batch<const B: usize>(&self, keys: &[K], out: &mut [Option<u32>]) {
        // Per key: its tag, first bucket and hash's high half (its second bucket, for the few
        // that need it), then its candidate record: 14 bytes a key, zeroed each call (it was
        // 29, a tuple with both buckets: 1.04-1.09x the batched rate, 1.14x with the table
        // in cache).
        let mut tag = [0u16; B];
        let mut first = [0u32; B];
        let mut high = [0u32; B];
        let mut cand = [NIL; B];
        let one_line = self.records_in_lines();
        for (chunk, outs) in keys.chunks(B).zip(out.chunks_mut(B)) {
            // Stage 1: hashes, and a prefetch of each first bucket's line (the misses overlap).
            for (((t, b1), hi), k) in tag.iter_mut().zip(&mut first).zip(&mut high).zip(chunk) {
                let h = k.keyed_hash(self.seed);
                *t = tag_of(h);
                *b1 = self.first_bucket(h) as u32;
                *hi = (h >> 32) as u32;
                prefetch(&self.buckets[*b1 as usize]);
            }
            // Stage 2: a candidate from the first bucket, or a prefetch of the second where
            // its spill filter says the key may be there (such keys listed for stage 3).
            let mut spilled = [0u8; B];
            let mut n = 0;
            let stage = cand.iter_mut().zip(&tag).zip(&first).zip(&high).zip(chunk);
            for (i, ((((c, &t), &b1), &hi), k)) in stage.enumerate() {
                let b = &self.buckets[b1 as usize];
                match b.first(t) {
                    Some(s) => {
                        *c = (b1 as usize * SLOTS + s) as u32;
                        self.prefetch_key(*c, k, one_line);
                    }
                    None => {
                        *c = NIL;
                        if b.may_spill(t) {
                            spilled[n] = i as u8;
                            n += 1;
                            prefetch(&self.buckets[self.second_bucket(b1 as usize, hi)]);
                        }
                    }
                }
            }
            // Stage 3: candidates from second buckets, and their records' prefetch. Over the
            // list (~10 % of the keys) rather than every key with a mark to test: 6 % fewer
            // instructions a lookup (callgrind, 16-byte keys), 1.02x the batched rate.
            for &i in &spilled[..n] {
                let i = usize::from(i);
                let b2 = self.second_bucket(first[i] as usize, high[i]);
                if let Some(s) = self.buckets[b2].first(tag[i]) {
                    cand[i] = (b2 * SLOTS + s) as u32;
                    self.prefetch_key(cand[i], &chunk[i], one_line);
                }
            }
            // Stage 4: compare.
            for ((k, o), &c) in chunk.iter().zip(outs.iter_mut()).zip(&cand) {
                *o = self.confirm(k, c);
            }
        }
    }

    /// Whether candidate record `c` (or [`NIL`]) holds `k`; a candidate that does not falls
    /// back to a full find (another slot may have the same tag).
    #[inline(always)]
    fn confirm(&self, k: &K, c: u32) -> Option<u32> {
        if c == NIL {
            None
        } else if *k == self.records[c as usize].key {
            Some(c)
        } else {
            self.find(k, k.keyed_hash(self.seed))
        }
    }

    /// Prefetches what comparing `query` reads of record `r`'s key: its first word and the
    /// last one compared (`query` on the left of `==` decides how many), which may lie in two
    /// lines — unless `one_line` (from [`Self::records_in_lines`]): then one prefetch.
    #[inline(always)]
    fn prefetch_key(&self, r: u32, query: &K, one_line: bool) {
        let key: *const u8 = (&self.records[r as usize].key as *const K).cast();
        prefetch_addr(key);
        if !one_line {
            prefetch_addr(key.wrapping_add(query.compared_bytes() - 1));
        }
    }

    /// Whether no record crosses a cache line (records of 16, 32 or 64 bytes from a line's
    /// start, as the V4Key table's 32-byte records on huge pages, 2 MiB-aligned): then a
    /// key's compare reads one line, and a batch prefetches it once.
    fn records_in_lines(&self) -> bool {
        let size = std::mem::size_of::<Record<V, K>>();
        (self.records.as_ptr() as usize).is_multiple_of(64) && 64 % size == 0
    }

    /// Looks the flow up at `now_ns` (counted); a hit marks it seen.
    pub fn lookup(&mut self, key: &K, now_ns: u64) -> Option<&mut V> {
        let now = self.tick(now_ns);
        self.stats.lookups += 1;
        match self.find(key, key.keyed_hash(self.seed)) {
            Some(r) => {
                self.stats.hits += 1;
                let rec = &mut self.records[r as usize];
                rec.touch(now);
                Some(&mut rec.value)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The flow's value, added (as `V::default()`) if it is not held, at `now_ns`. When the
    /// table holds its capacity, the least recently seen flow of the new one's two buckets
    /// (a closing one first) is evicted and handed back.
    pub fn upsert(&mut self, key: &K, now_ns: u64) -> Upsert<'_, V, K> {
        let now = self.tick(now_ns);
        self.stats.lookups += 1;
        let h = key.keyed_hash(self.seed);
        if let Some(r) = self.find(key, h) {
            self.stats.hits += 1;
            let rec = &mut self.records[r as usize];
            rec.touch(now);
            return Upsert {
                value: &mut rec.value,
                new: false,
                evicted: None,
            };
        }
        self.stats.misses += 1;
        let (tag, b1, b2) = self.place(h);
        let mut evicted = None;
        if self.stats.live >= u64::from(self.cap) {
            if let Some(v) = self.victim(b1, b2) {
                evicted = Some(self.take(v, self.home(v)));
                self.stats.evicted_full += 1;
            }
        }
        let mut rec = Record {
            key: *key,
            ..Record::blank()
        };
        rec.hold(Class::of(key.protocol()), now);
        self.stats.inserts += 1;
        self.stats.live += 1;
        let (r, lost) = self.seat(tag, rec, b1, b2);
        if lost.is_some() {
            // The walk ended holding a flow with no room, or came back to the new flow and
            // evicted the least recently seen of its buckets for it. (Never after an eviction
            // for want of a record: that eviction emptied a slot of this flow's own buckets.)
            debug_assert!(evicted.is_none());
            self.stats.evicted_no_room += 1;
            evicted = lost;
        }
        Upsert {
            value: &mut self.records[r as usize].value,
            new: true,
            evicted,
        }
    }

    /// A TCP FIN or RST of the flow at `now_ns`: it moves to the closing timeout (counted
    /// once). `false`: no such flow.
    pub fn close(&mut self, key: &K, now_ns: u64) -> bool {
        let now = self.tick(now_ns);
        let Some(r) = self.find(key, key.keyed_hash(self.seed)) else {
            return false;
        };
        let rec = &mut self.records[r as usize];
        rec.touch(now);
        if rec.class() == Class::Closing {
            return true;
        }
        let last = rec.last();
        rec.hold(Class::Closing, last);
        let d = last.saturating_add(self.timeouts[Class::Closing as usize]);
        self.unlink(r);
        let slot = self.deadline_slot(d);
        self.link(r, slot);
        self.stats.closed += 1;
        true
    }

    /// Removes the flow, handing back its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let h = key.keyed_hash(self.seed);
        let r = self.find(key, h)?;
        self.stats.removed += 1;
        Some(self.take(r, self.first_bucket(h)).1)
    }

    /// Advances the wheel to `now_ns`: every flow whose deadline (last seen plus its class's
    /// timeout, in ticks) is at most now is removed and handed to `on_expired` with its class.
    /// Work: the ticks passed (at most the wheel's size) plus the records due or moved on.
    pub fn expire(&mut self, now_ns: u64, mut on_expired: impl FnMut(&K, V, Class)) {
        let now = self.tick(now_ns);
        if now <= self.cursor {
            return;
        }
        let steps = (now - self.cursor).min(self.wheel);
        for i in 1..=steps {
            let slot = (self.cursor + i) % self.wheel;
            self.stats.gc_ticks += 1;
            // Detach the slot's list first: what moves on lands in other lists.
            let sentinel = self.nslots + slot;
            let mut r = self.records[sentinel as usize].next;
            self.records[sentinel as usize].next = sentinel;
            self.records[sentinel as usize].prev = sentinel;
            while r != sentinel {
                let next = self.records[r as usize].next;
                self.stats.gc_visited += 1;
                let rec = &self.records[r as usize];
                let class = rec.class();
                let due = u64::from(rec.last()) + u64::from(self.timeouts[class as usize]);
                if due <= u64::from(now) {
                    // Its list is detached: it leaves the bucket and the slot, no unlink.
                    let (key, value) = self.release(r, self.home(r));
                    self.stats.expired[class as usize] += 1;
                    on_expired(&key, value, class);
                } else {
                    self.stats.gc_relinked += 1;
                    self.link(r, (due % u64::from(self.wheel)) as u32);
                }
                r = next;
            }
        }
        self.cursor = now;
    }

    /// Every flow held, in no order: (key, value).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.records[..self.nslots as usize]
            .iter()
            .filter(|r| r.used())
            .map(|r| (&r.key, &r.value))
    }

    /// The wheel slot for a deadline (never one already passed).
    fn deadline_slot(&self, deadline: u32) -> u32 {
        deadline.max(self.cursor.saturating_add(1)) % self.wheel
    }

    fn link(&mut self, r: u32, slot: u32) {
        let s = self.nslots + slot;
        let tail = self.records[s as usize].prev;
        self.records[r as usize].prev = tail;
        self.records[r as usize].next = s;
        self.records[tail as usize].next = r;
        self.records[s as usize].prev = r;
    }

    fn unlink(&mut self, r: u32) {
        let (p, n) = (self.records[r as usize].prev, self.records[r as usize].next);
        self.records[p as usize].next = n;
        self.records[n as usize].prev = p;
    }

    /// The first bucket of the flow in record `r`.
    fn home(&self, r: u32) -> usize {
        self.first_bucket(self.records[r as usize].key.keyed_hash(self.seed))
    }

    /// Takes the held flow of record `r` (first bucket `b1`) out entirely (bucket, wheel,
    /// record): its key and value.
    fn take(&mut self, r: u32, b1: usize) -> (K, V) {
        self.unlink(r);
        self.release(r, b1)
    }

    /// The held flow of record `r` (first bucket `b1`), off the wheel already (or on a
    /// detached wheel list), leaves its slot: the slot is emptied, `b1`'s spill filter
    /// forgets it if it sat in its second bucket, and its key and value are handed back.
    fn release(&mut self, r: u32, b1: usize) -> (K, V) {
        let (b, s) = (r as usize / SLOTS, r as usize % SLOTS);
        if b != b1 {
            let tag = self.buckets[b].tag(s);
            self.buckets[b1].spill(tag, false);
        }
        self.buckets[b].set_tag(s, EMPTY);
        self.stats.live -= 1;
        let rec = std::mem::replace(&mut self.records[r as usize], Record::blank());
        (rec.key, rec.value)
    }

    /// Puts `rec` (tag `tag`) in slot `s` of bucket `b`, an empty one, and links it on the
    /// wheel at its deadline (for a flow moved by the cuckoo walk, its real one): its index.
    fn put(&mut self, b: usize, s: usize, tag: u16, rec: Record<V, K>) -> u32 {
        let r = (b * SLOTS + s) as u32;
        let due = rec
            .last()
            .saturating_add(self.timeouts[rec.class() as usize]);
        self.records[r as usize] = rec;
        self.buckets[b].set_tag(s, tag);
        let slot = self.deadline_slot(due);
        self.link(r, slot);
        r
    }

    /// Lifts the flow out of slot `s` of bucket `b` (and off the wheel) for the cuckoo walk
    /// to carry; the spill filters are the walk's to keep.
    fn lift(&mut self, b: usize, s: usize) -> Record<V, K> {
        let r = (b * SLOTS + s) as u32;
        self.unlink(r);
        self.buckets[b].set_tag(s, EMPTY);
        std::mem::replace(&mut self.records[r as usize], Record::blank())
    }

    /// The flow to evict for a new one whose buckets are `b1` and `b2`: a closing flow
    /// there first, else the least recently seen there; with both buckets empty, the first
    /// flow on the wheel from now on (among the soonest due). `None`: no flow is held.
    fn victim(&self, b1: usize, b2: usize) -> Option<u32> {
        self.victim_in(b1, b2).or_else(|| {
            (1..=self.wheel).find_map(|i| {
                let s = self.nslots + (self.cursor + i) % self.wheel;
                let first = self.records[s as usize].next;
                (first != s).then_some(first)
            })
        })
    }

    /// A closing flow of buckets `b1` and `b2` first, else their least recently seen.
    fn victim_in(&self, b1: usize, b2: usize) -> Option<u32> {
        let mut best: Option<(bool, u32, u32)> = None;
        for b in [b1, b2] {
            for s in 0..SLOTS {
                if self.buckets[b].tag(s) == EMPTY {
                    continue;
                }
                let r = (b * SLOTS + s) as u32;
                let rec = &self.records[r as usize];
                let rank = (rec.class() != Class::Closing, rec.last(), r);
                if best.is_none_or(|x| rank < x) {
                    best = Some(rank);
                }
            }
        }
        best.map(|(_, _, r)| r)
    }

    /// Seats the new flow `rec` (tag `tag`) in `b1` or `b2`, displacing others cuckoo-wise:
    /// where it sits, and the flow that lost its place (no longer counted as held) — the one
    /// the walk held when it gave up after `MAX_KICKS` moves or, when the walk came back to
    /// the new flow, the least recently seen of the new flow's (full) buckets, whose slot it
    /// takes.
    fn seat(&mut self, tag: u16, rec: Record<V, K>, b1: usize, b2: usize) -> (u32, Option<(K, V)>) {
        if let Some(s) = self.buckets[b1].empty_slot() {
            return (self.put(b1, s, tag, rec), None);
        }
        if let Some(s) = self.buckets[b2].empty_slot() {
            self.buckets[b1].spill(tag, true);
            return (self.put(b2, s, tag, rec), None);
        }
        // The flow held (`tag`, `rec`, first bucket `first`; `new` if it is the new flow)
        // goes into bucket `b` in place of one there, which then goes to its other bucket.
        let (mut b, mut tag, mut rec, mut first, mut new) = (b1, tag, rec, b1, true);
        let mut at = NIL;
        for k in 0..MAX_KICKS {
            let s = (k * 7 + usize::from(tag)) % SLOTS;
            let r = (b * SLOTS + s) as u32;
            let vt = self.buckets[b].tag(s);
            let victim = self.lift(b, s);
            let was_new = at == r;
            self.put(b, s, tag, rec);
            if new {
                at = r;
            }
            if b != first {
                self.buckets[first].spill(tag, true);
            }
            self.stats.kicks += 1;
            let (_, x1, x2) = self.place(victim.key.keyed_hash(self.seed));
            if b != x1 {
                self.buckets[x1].spill(vt, false);
            }
            let alt = if x1 == b { x2 } else { x1 };
            if let Some(s) = self.buckets[alt].empty_slot() {
                if alt != x1 {
                    self.buckets[x1].spill(vt, true);
                }
                let landed = self.put(alt, s, vt, victim);
                if was_new {
                    at = landed;
                }
                return (at, None);
            }
            (b, tag, rec, first, new) = (alt, vt, victim, x1, was_new);
        }
        if !new {
            self.stats.live -= 1;
            return (at, Some((rec.key, rec.value)));
        }
        // Back to the new flow: its buckets are full (it was lifted from one of them), so
        // they hold a least recently seen flow, whose slot it takes.
        let Some(v) = self.victim_in(b1, b2) else {
            unreachable!("the walk gave up with the new flow's two buckets full");
        };
        let lost = self.take(v, self.home(v));
        let (vb, vs) = (v as usize / SLOTS, v as usize % SLOTS);
        if vb != b1 {
            self.buckets[b1].spill(tag, true);
        }
        at = self.put(vb, vs, tag, rec);
        (at, Some(lost))
    }

    /// Panics unless every held flow sits in one of its two buckets under its tag, every
    /// bucket's spill count is the number of its flows sitting in their second bucket and its
    /// filter holds their tags, and the wheel lists hold exactly the held flows.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut spills = vec![(0u16, 0u16); self.buckets.len()];
        let mut seated = 0u64;
        for (b, bk) in self.buckets.iter().enumerate() {
            for s in 0..SLOTS {
                if bk.tag(s) == EMPTY {
                    continue;
                }
                seated += 1;
                let r = b * SLOTS + s;
                let rec = &self.records[r];
                assert!(rec.used(), "bucket {b} slot {s} holds a free record");
                let (tag, b1, b2) = self.place(rec.key.keyed_hash(self.seed));
                assert_eq!(bk.tag(s), tag);
                assert!(b == b1 || b == b2, "flow in bucket {b}, not {b1} or {b2}");
                if b == b2 {
                    spills[b1].0 |= 1 << (tag & 15);
                    spills[b1].1 += 1;
                }
            }
        }
        assert_eq!(seated, self.stats.live);
        assert!(seated <= u64::from(self.cap));
        let used = self.records[..self.nslots as usize]
            .iter()
            .filter(|r| r.used());
        assert_eq!(
            used.count() as u64,
            seated,
            "records in use outside the tagged slots"
        );
        for (b, bk) in self.buckets.iter().enumerate() {
            let (filter, count) = (bk.tags[FILTER], bk.tags[COUNT]);
            assert_eq!(count, spills[b].1, "bucket {b}'s spill count");
            assert_eq!(filter & spills[b].0, spills[b].0, "bucket {b}'s filter");
        }
        let mut on_wheel = 0u64;
        for slot in 0..self.wheel {
            let sentinel = self.nslots + slot;
            let mut r = self.records[sentinel as usize].next;
            while r != sentinel {
                assert!(self.records[r as usize].used());
                let n = self.records[r as usize].next;
                assert_eq!(self.records[n as usize].prev, r, "wheel links");
                on_wheel += 1;
                r = self.records[r as usize].next;
            }
        }
        assert_eq!(on_wheel, self.stats.live);
    }
}
