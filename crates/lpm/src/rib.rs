//! The mutable routing table: insert, replace, delete, exact-match get.
//!
//! Layout follows the lookup structure so a change tells exactly which direct slots of the
//! [`Fib`](crate::Fib) it touches: prefixes longer than the direct stride live in a small
//! sorted list per direct slot; shorter ones live in per-length hash maps, and each slot keeps
//! the resolved best short prefix (its next hop and length).

use rustc_hash::FxHashMap;

use crate::key::{Key, Prefix, PrefixError};
use crate::{DIRECT_BITS, MAX_NEXT_HOP, NO_ROUTE};

/// A route as stored: prefix bits, length, next hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route<K> {
    pub addr: K,
    pub len: u8,
    pub hop: u32,
}

const NO_LEN: u8 = u8::MAX;
const SLOTS: usize = 1 << DIRECT_BITS;

/// The mutable table (the builder of a [`Fib`](crate::Fib)).
#[derive(Debug, Clone)]
pub struct Rib<K: Key> {
    /// Prefixes of length `0..=DIRECT_BITS`, one map per length.
    short: Vec<FxHashMap<K, u32>>,
    /// Per direct slot: prefixes longer than `DIRECT_BITS`, sorted by (addr, len) — so a
    /// covering prefix always precedes the prefixes nested in it.
    chunks: Vec<Vec<Route<K>>>,
    /// Per direct slot: next hop and length of the longest short prefix covering it.
    short_hop: Vec<u32>,
    short_len: Vec<u8>,
    count: usize,
    /// Slots whose resolution changed since the last `take_dirty` (only when tracking).
    dirty: Vec<u32>,
    track: bool,
}

impl<K: Key> Default for Rib<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Key> Rib<K> {
    /// An empty table.
    pub fn new() -> Self {
        Rib {
            short: (0..=DIRECT_BITS).map(|_| FxHashMap::default()).collect(),
            chunks: vec![Vec::new(); SLOTS],
            short_hop: vec![NO_ROUTE; SLOTS],
            short_len: vec![NO_LEN; SLOTS],
            count: 0,
            dirty: Vec::new(),
            track: false,
        }
    }

    /// A table holding `routes`; a later duplicate replaces an earlier one.
    pub fn from_routes<I: IntoIterator<Item = (Prefix<K>, u32)>>(
        routes: I,
    ) -> Result<Self, PrefixError> {
        let mut rib = Rib::new();
        for (p, hop) in routes {
            rib.insert(p, hop)?;
        }
        Ok(rib)
    }

    /// Number of prefixes.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when there are no prefixes.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Inserts or replaces a route; returns the next hop it replaced.
    pub fn insert(&mut self, prefix: Prefix<K>, next_hop: u32) -> Result<Option<u32>, PrefixError> {
        if next_hop > MAX_NEXT_HOP {
            return Err(PrefixError::NextHopReserved(next_hop));
        }
        let (addr, len) = (prefix.addr(), prefix.len());
        let old = if u32::from(len) <= DIRECT_BITS {
            let old = self.short[len as usize].insert(addr, next_hop);
            self.paint_short(addr, len, next_hop);
            old
        } else {
            let slot = addr.slot();
            let chunk = &mut self.chunks[slot];
            let old = match chunk.binary_search_by(|r| (r.addr, r.len).cmp(&(addr, len))) {
                Ok(i) => Some(std::mem::replace(&mut chunk[i].hop, next_hop)),
                Err(i) => {
                    chunk.insert(
                        i,
                        Route {
                            addr,
                            len,
                            hop: next_hop,
                        },
                    );
                    None
                }
            };
            if old != Some(next_hop) {
                self.mark(slot);
            }
            old
        };
        if old.is_none() {
            self.count += 1;
        }
        Ok(old)
    }

    /// Deletes a route; returns its next hop, or `None` when it was not there.
    pub fn remove(&mut self, prefix: Prefix<K>) -> Option<u32> {
        let (addr, len) = (prefix.addr(), prefix.len());
        let old = if u32::from(len) <= DIRECT_BITS {
            let old = self.short[len as usize].remove(&addr)?;
            // Slots this prefix resolved fall back to the longest shorter prefix covering it,
            // the same one for all of them.
            let (hop, blen) = (0..len)
                .rev()
                .find_map(|l| self.short[l as usize].get(&addr.mask(l)).map(|&h| (h, l)))
                .unwrap_or((NO_ROUTE, NO_LEN));
            for slot in Self::slot_range(addr, len) {
                if self.short_len[slot] == len {
                    let changed = self.short_hop[slot] != hop;
                    self.short_hop[slot] = hop;
                    self.short_len[slot] = blen;
                    if changed {
                        self.mark(slot);
                    }
                }
            }
            old
        } else {
            let slot = addr.slot();
            let chunk = &mut self.chunks[slot];
            let i = chunk
                .binary_search_by(|r| (r.addr, r.len).cmp(&(addr, len)))
                .ok()?;
            let old = chunk.remove(i).hop;
            self.mark(slot);
            old
        };
        self.count -= 1;
        Some(old)
    }

    /// The next hop stored for exactly this prefix.
    pub fn get(&self, prefix: Prefix<K>) -> Option<u32> {
        let (addr, len) = (prefix.addr(), prefix.len());
        if u32::from(len) <= DIRECT_BITS {
            self.short[len as usize].get(&addr).copied()
        } else {
            let chunk = &self.chunks[addr.slot()];
            let i = chunk
                .binary_search_by(|r| (r.addr, r.len).cmp(&(addr, len)))
                .ok()?;
            Some(chunk[i].hop)
        }
    }

    /// The longest prefix covering `addr` and its next hop — the slow, explaining path (it
    /// scans the slot's list); use a [`Fib`](crate::Fib) to look up traffic.
    pub fn matching(&self, addr: K) -> Option<(Prefix<K>, u32)> {
        let slot = addr.slot();
        let long = self.chunks[slot]
            .iter()
            .filter(|r| addr.mask(r.len) == r.addr)
            .max_by_key(|r| r.len)
            .map(|r| (Prefix::covering(r.addr, r.len), r.hop));
        long.or_else(|| {
            let len = self.short_len[slot];
            (len != NO_LEN).then(|| (Prefix::covering(addr, len), self.short_hop[slot]))
        })
    }

    /// Every route, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Prefix<K>, u32)> + '_ {
        let short = self.short.iter().enumerate().flat_map(|(len, m)| {
            m.iter()
                .map(move |(&a, &h)| (Prefix::covering(a, len as u8), h))
        });
        let long = self
            .chunks
            .iter()
            .flatten()
            .map(|r| (Prefix::covering(r.addr, r.len), r.hop));
        short.chain(long)
    }

    /// The prefixes longer than the direct stride inside `slot`, covering ones first.
    pub(crate) fn chunk(&self, slot: usize) -> &[Route<K>] {
        &self.chunks[slot]
    }

    /// The next hop of the longest prefix of length `<= DIRECT_BITS` covering `slot`.
    pub(crate) fn short_hop(&self, slot: usize) -> u32 {
        self.short_hop[slot]
    }

    /// Starts recording which direct slots each change touches.
    pub(crate) fn track_changes(&mut self) {
        self.track = true;
        self.dirty.clear();
    }

    /// The slots touched since the last call (each at most once per change).
    pub(crate) fn take_dirty(&mut self, into: &mut Vec<u32>) {
        into.clear();
        std::mem::swap(into, &mut self.dirty);
    }

    /// Asks for the cache line of slot `slot`'s list header.
    pub(crate) fn prefetch_chunk_header(&self, slot: usize) {
        if let Some(c) = self.chunks.get(slot) {
            crate::arch::prefetch(c);
        }
    }

    /// Asks for the first cache line of slot `slot`'s routes (reads the list header).
    pub(crate) fn prefetch_chunk(&self, slot: usize) {
        if let Some(r) = self.chunks.get(slot).and_then(|c| c.first()) {
            crate::arch::prefetch(r);
        }
    }

    fn mark(&mut self, slot: usize) {
        if self.track {
            self.dirty.push(slot as u32);
        }
    }

    fn slot_range(addr: K, len: u8) -> std::ops::Range<usize> {
        let first = addr.slot();
        first..first + (1usize << (DIRECT_BITS - u32::from(len)))
    }

    /// A short prefix was inserted or replaced: it wins every slot of its range whose best
    /// is not longer.
    fn paint_short(&mut self, addr: K, len: u8, hop: u32) {
        for slot in Self::slot_range(addr, len) {
            let cur = self.short_len[slot];
            if cur == NO_LEN || cur <= len {
                let changed = self.short_hop[slot] != hop;
                self.short_hop[slot] = hop;
                self.short_len[slot] = len;
                if changed {
                    self.mark(slot);
                }
            }
        }
    }
}
