//! Lookups: one address at a time, and the batch that prefetches one stage ahead.

use super::*;
use crate::key::Key;
use crate::{DIRECT_BITS, NO_ROUTE, STRIDE};

/// Addresses a batch lookup works on together. Each pass prefetches what the next one loads,
/// so the group's size is how long a prefetch has to land. Since IPv6 lookups end in a range
/// line (often from DRAM) after passes that hit in cache, 128 beats 32: IPv6 inside 1.12–1.13×,
/// IPv4 inside 0.99–1.10×, cached working sets the same (64: 1.07–1.10×; 256 as 128, with
/// twice the stack). Before lines and expanded roots, 64 had measured 0.98× for IPv6.
pub(super) const GROUP: usize = 128;
// A group's addresses are listed by their `u8` position.
const _: () = assert!(GROUP <= 256);

/// Per-group working lists of the batch lookup, reused from group to group: each pass lists
/// the lookups it hands to the next (the node, line or leaf each needs and its position in
/// the group).
pub(super) struct Scratch {
    pub(super) entry: [u32; GROUP],
    pub(super) node: [u32; GROUP],
    pub(super) pending: [u8; GROUP],
    /// The 64 address bits from each listed node's depth (taken when it was listed, so that
    /// the node's pass reads them instead of the address).
    pub(super) bits: [u64; GROUP],
    pub(super) leaf_at: [u32; GROUP],
    pub(super) leaf_of: [u8; GROUP],
    pub(super) line_at: [u32; GROUP],
    pub(super) line_of: [u8; GROUP],
    pub(super) line_x: [u32; GROUP],
}

impl Scratch {
    /// Lists node `c` as the `at`-th of the next node pass, for the lookup at position `i`
    /// of the group, with the 64 address bits from the node's depth, and asks for the node's
    /// first and last byte (its second line when it straddles two, as a 24-byte node does at
    /// 2 of every 8 positions, and then that line was a demand miss). `nodes` is the node
    /// arena: a prefetch is a hint, so its address needs no bounds check. (`at < GROUP`
    /// always: the `% GROUP` only spares the check.)
    #[inline(always)]
    pub(super) fn list_node(&mut self, at: usize, c: u32, i: usize, bits: u64, nodes: *const Node) {
        let p = nodes.wrapping_add(c as usize);
        crate::arch::prefetch(p);
        crate::arch::prefetch(p.cast::<u8>().wrapping_add(NODE_BYTES - 1));
        self.node[at % GROUP] = c;
        self.pending[at % GROUP] = i as u8;
        self.bits[at % GROUP] = bits;
    }

    pub(super) fn new() -> Self {
        Scratch {
            entry: [0; GROUP],
            node: [0; GROUP],
            pending: [0; GROUP],
            bits: [0; GROUP],
            leaf_at: [0; GROUP],
            leaf_of: [0; GROUP],
            line_at: [0; GROUP],
            line_of: [0; GROUP],
            line_x: [0; GROUP],
        }
    }
}
impl<K: Key> Fib<K> {
    /// The next hop of the longest prefix covering `addr`, or `None` when no prefix does.
    #[inline]
    pub fn lookup(&self, addr: K) -> Option<u32> {
        let hop = self.lookup_raw(addr);
        (hop != NO_ROUTE).then_some(hop)
    }

    /// Looks up every address of `addrs` into the same position of `out` ([`NO_ROUTE`] where
    /// none matches). Lookups are issued in groups so that their memory loads overlap.
    ///
    /// # Panics
    /// When `addrs` and `out` differ in length (a caller bug, like `copy_from_slice`).
    pub fn lookup_batch(&self, addrs: &[K], out: &mut [u32]) {
        assert_eq!(
            addrs.len(),
            out.len(),
            "lookup_batch: addrs and out differ in length"
        );
        // As a fixed-size array, indexing by a slot (< 2^18 by construction) needs no bounds
        // check. The fallback never runs: the array always has 2^18 entries.
        let Ok(direct) = <&[u32; 1 << DIRECT_BITS]>::try_from(&self.direct[..]) else {
            for (o, &a) in out.iter_mut().zip(addrs) {
                *o = self.lookup_raw(a);
            }
            return;
        };
        if !Self::EXPAND {
            return self.batch_straight(direct, addrs, out);
        }
        let (groups, tail) = addrs.as_chunks::<GROUP>();
        let mut s = Scratch::new();
        by_groups(addrs, out, |g, a, o| {
            let next = groups.get(g + 1);
            if next.is_none() && g < groups.len() {
                for addr in tail {
                    crate::arch::prefetch(&direct[addr.slot()]);
                }
            }
            self.group(direct, a, next, o, &mut s);
        });
    }

    /// One group of the batch lookup with expanded roots (IPv6; IPv4 takes
    /// [`Fib::batch_straight`]): the direct pass, then the flat blocks' pass, then
    /// [`Fib::descend`] for the lookups that go on to nodes. `next` is the following group,
    /// whose direct entries are asked for while this one runs.
    #[inline(always)]
    pub(super) fn group(
        &self,
        direct: &[u32; 1 << DIRECT_BITS],
        a: &[K; GROUP],
        next: Option<&[K; GROUP]>,
        o: &mut [u32; GROUP],
        s: &mut Scratch,
    ) {
        // Flat blocks exist only with narrow leaves; their codes index this directly.
        let hops: &[u32] = match &self.leaves {
            Leaves::Narrow { hops, .. } => hops,
            Leaves::Wide(_) => &[],
        };
        let flat = &self.flat[..];
        let mid = &self.mid[..];
        let nodes = self.nodes.as_ptr();
        // Direct entries: a next hop ends here; a flat block is prefetched (first and last
        // line) and resolved in the pass after this one; a node is prefetched and listed for
        // `descend`. The flat blocks' pass is separate (rather than listing them as nodes are
        // listed) because IPv4 lookups mostly ended in one when this served them: a plain
        // scan of the group's entries costs less than writing and reading back a list, and
        // the block's lines have the rest of this pass to arrive. (`n <= j < GROUP`: the
        // `% GROUP` below only spares a bounds check. Prefetches take addresses unchecked: a
        // hint cannot fault.)
        let mut n = 0;
        let mut flats = 0;
        for j in 0..GROUP {
            if let Some(next) = next {
                crate::arch::prefetch(&direct[next[j].slot()]);
            }
            let addr = a[j];
            let x = direct[addr.slot()];
            s.entry[j] = x;
            if x & (NODE | FLAT) == NODE | FLAT {
                let (at, words) = flat_block(x);
                crate::arch::prefetch(flat.as_ptr().wrapping_add(at));
                crate::arch::prefetch(flat.as_ptr().wrapping_add(at + words - 1));
                flats += 1;
                continue;
            }
            // An expanded root's entry for the address's slot: a cache hit (the blocks are
            // few), so loaded here rather than a pass later.
            let x = if Self::EXPAND && x & NODE != 0 {
                let at = ((x & !NODE) as usize) << STRIDE | addr.stride(DIRECT_BITS) as usize;
                mid.get(at).copied().unwrap_or(DIRECT_NONE)
            } else {
                x
            };
            if x & NODE != 0 {
                s.list_node(n, x & !NODE, j, addr.bits64(Self::first_depth()), nodes);
                n += 1;
            } else {
                o[j] = decode_direct(x);
            }
        }
        if flats > 0 {
            Self::flat_pass(flat, hops, a, o, &s.entry);
        }
        if n > 0 {
            self.descend(a, o, s, n, Self::first_depth());
        }
    }

    /// The group's lookups whose direct entry is a flat block (prefetched in the direct
    /// pass). Out of line, so that its few values stay in registers (inlined, the flat
    /// arena's and the hop table's bounds were reloaded from the stack for every lookup).
    #[inline(never)]
    pub(super) fn flat_pass(
        flat: &[u64],
        hops: &[u32],
        a: &[K; GROUP],
        o: &mut [u32; GROUP],
        entry: &[u32; GROUP],
    ) {
        let codes = flat_codes(flat);
        for j in 0..GROUP {
            let e = entry[j];
            if e & (NODE | FLAT) == NODE | FLAT {
                let (at, _) = flat_block(e);
                let code = flat_code(flat, codes, at, a[j].stride(DIRECT_BITS));
                o[j] = hops.get(usize::from(code)).copied().unwrap_or(NO_ROUTE);
            }
        }
    }

    /// The batch lookup below the first level, for the `n` addresses of the group `a` listed
    /// in `s.pending` with their (prefetched) nodes in `s.node`. Level by level across the
    /// group, each pass prefetching what the next one loads (nodes, lines, leaf codes): by
    /// the time a node's bits are tested — a branch that would otherwise wait on memory and,
    /// mispredicted, throw away the loads behind it — the node is in cache. (Out of line it
    /// measured ~5% slower for IPv6, where most lookups come here.)
    #[inline(always)]
    pub(super) fn descend(
        &self,
        a: &[K; GROUP],
        o: &mut [u32; GROUP],
        s: &mut Scratch,
        mut n: usize,
        mut offset: u32,
    ) {
        let hops: &[u32] = match &self.leaves {
            Leaves::Narrow { hops, .. } => hops,
            Leaves::Wide(_) => &[],
        };
        let node_ptr = self.nodes.as_ptr();
        let line_ptr = self.lines.as_ptr();
        while n > 0 {
            // First a lean scan for the common case below an IPv6 expanded root: a ranged
            // node whose slot holds a child (a line). Those are listed for the line pass;
            // every other node is moved up the list for the full decode after it. Apart, each
            // loop keeps its values in registers: IPv6 156 -> 143 instructions a lookup,
            // batches inside routed prefixes 1.03-1.10x (docs/benchmarks-history.md).
            let mut lines = 0;
            let mut rest = 0;
            for k in 0..n.min(GROUP) {
                let c = s.node[k];
                let i = s.pending[k];
                let bits = s.bits[k];
                let v = (bits >> (64 - STRIDE)) as u32;
                if let Some(nd) = self.nodes.get(c as usize) {
                    if nd.base0 & (INLINE | RANGED) == RANGED && nd.vector & (1u64 << v) != 0 {
                        let l = nd.child(v);
                        crate::arch::prefetch(line_ptr.wrapping_add(l as usize));
                        s.line_at[lines % GROUP] = l;
                        s.line_of[lines % GROUP] = i;
                        // The 32 address bits past the line's depth.
                        s.line_x[lines % GROUP] = ((bits << STRIDE) >> 32) as u32;
                        lines += 1;
                        continue;
                    }
                }
                s.node[rest % GROUP] = c;
                s.pending[rest % GROUP] = i;
                s.bits[rest % GROUP] = bits;
                rest += 1;
            }
            let (mut still, mut leaves) = (0, 0);
            for k in 0..rest.min(GROUP) {
                let i = usize::from(s.pending[k]) % GROUP;
                let Some(nd) = self.nodes.get(s.node[k] as usize) else {
                    continue;
                };
                // The node's slot is the first 6 of the 64 bits a prefix node compares.
                let bits = s.bits[k];
                let v = (bits >> (64 - STRIDE)) as u32;
                if nd.inline() {
                    o[i] = self.leaves.hop_of(nd.inline_leaf(bits, v));
                } else if nd.vector & (1u64 << v) == 0 {
                    let j = (nd.base0 & !RANGED) + nd.run(v);
                    self.leaves.prefetch(j);
                    s.leaf_at[leaves % GROUP] = j;
                    s.leaf_of[leaves % GROUP] = i as u8;
                    leaves += 1;
                } else {
                    // A ranged node's children were all listed as lines above.
                    debug_assert!(nd.base0 & RANGED == 0);
                    s.list_node(
                        still,
                        nd.child(v),
                        i,
                        a[i].bits64(offset + STRIDE),
                        node_ptr,
                    );
                    still += 1;
                }
            }
            for k in 0..leaves.min(GROUP) {
                o[usize::from(s.leaf_of[k]) % GROUP] = self.leaves.get(s.leaf_at[k]);
            }
            for k in 0..lines.min(GROUP) {
                let i = usize::from(s.line_of[k]) % GROUP;
                let Some(l) = self.lines.get(s.line_at[k] as usize) else {
                    continue;
                };
                let code = l.code(s.line_x[k]);
                if code == ESCAPE {
                    s.list_node(
                        still,
                        l.bounds[0],
                        i,
                        a[i].bits64(offset + STRIDE),
                        node_ptr,
                    );
                    still += 1;
                } else {
                    o[i] = hops.get(usize::from(code)).copied().unwrap_or(NO_ROUTE);
                }
            }
            n = still;
            offset += STRIDE;
        }
    }

    #[inline(always)]
    pub(super) fn lookup_raw(&self, addr: K) -> u32 {
        let e = self.direct[addr.slot()];
        if e & NODE == 0 {
            decode_direct(e)
        } else if e & FLAT != 0 {
            let code = flat_code(
                &self.flat,
                flat_codes(&self.flat),
                (e & FLAT_OFFSET) as usize,
                addr.stride(DIRECT_BITS),
            );
            self.leaves.hop_of(code)
        } else if Self::EXPAND {
            let at = ((e & !NODE) as usize) << STRIDE | addr.stride(DIRECT_BITS) as usize;
            let m = self.mid.get(at).copied().unwrap_or(DIRECT_NONE);
            if m & NODE == 0 {
                decode_direct(m)
            } else {
                self.walk(addr, m & !NODE, Self::first_depth())
            }
        } else {
            self.walk(addr, e & !NODE, Self::first_depth())
        }
    }

    /// The depth of the nodes a direct entry (through its expanded root, if any) leads to.
    #[inline(always)]
    pub(super) const fn first_depth() -> u32 {
        if Self::EXPAND {
            DIRECT_BITS + STRIDE
        } else {
            DIRECT_BITS
        }
    }

    /// The walk from node `first` at depth `offset` down to `addr`'s leaf.
    #[inline(always)]
    pub(super) fn walk(&self, addr: K, first: u32, mut offset: u32) -> u32 {
        let mut node = self.nodes[first as usize];
        loop {
            let bits = addr.bits64(offset);
            let v = (bits >> (64 - STRIDE)) as u32;
            if node.inline() {
                return self.leaves.hop_of(node.inline_leaf(bits, v));
            }
            if node.vector & (1u64 << v) == 0 {
                return self.leaves.get((node.base0 & !RANGED) + node.run(v));
            }
            let mut i = node.child(v);
            offset += STRIDE;
            if node.base0 & RANGED != 0 {
                let l = &self.lines[i as usize];
                match l.escaped() {
                    Some(c) => i = c,
                    None => {
                        let x = (addr.bits64(offset) >> 32) as u32;
                        return self.leaves.hop_of(l.code(x));
                    }
                }
            }
            node = self.nodes[i as usize];
        }
    }

    /// The first-level node of a direct entry with [`NODE`] and not [`FLAT`].
    #[inline(always)]
    pub(super) fn root_of(&self, e: u32) -> u32 {
        if Self::EXPAND {
            self.mid_root
                .get((e & !NODE) as usize)
                .copied()
                .unwrap_or(0)
        } else {
            e & !NODE
        }
    }
}

/// How far ahead (in addresses) the IPv4 batch asks for a direct entry, and how far ahead it
/// reads one (asked for earlier, so by then a hit) to ask for the flat block it leads to.
/// 16/8 measured best of 8/4, 16/8, 24/12, 32/16 and 32/8 in all three traffic modes.
const AHEAD_DIRECT: usize = 16;
const AHEAD_FLAT: usize = 8;

impl<K: Key> Fib<K> {
    /// The batch lookup without expanded roots (IPv4), where nearly every lookup ends in its
    /// direct entry or the flat block it names. One pass per group instead of [`Fib::group`]'s
    /// two: the direct entry and flat block are asked for a fixed distance ahead in the
    /// address list, and each lookup then resolves both kinds without a branch on which it
    /// is (the flat block's code is worked out for a plain next hop too, from block 0, and
    /// discarded). Lookups that go on to nodes are listed for [`Fib::descend`] as before.
    /// Against the two-pass group on the 950k table (`route bench`, alternated): uniform
    /// 1.75x, inside and repeated working set unchanged (BENCHMARKS.md, "IPv4 batch in one
    /// pass").
    fn batch_straight(&self, direct: &[u32; 1 << DIRECT_BITS], addrs: &[K], out: &mut [u32]) {
        let hops: &[u32] = match &self.leaves {
            Leaves::Narrow { hops, .. } => hops,
            Leaves::Wide(_) => &[],
        };
        let mut s = Scratch::new();
        by_groups(addrs, out, |g, a, o| {
            // The tail's call reads ahead in the tail alone.
            let ahead = addrs.get(g * GROUP..).unwrap_or(&[]);
            self.group_straight(direct, hops, a, ahead, o, &mut s);
        });
    }

    /// One group of [`Fib::batch_straight`]; `ahead` is the address list from the group's
    /// first address on (what the prefetches read ahead in).
    #[inline(always)]
    fn group_straight(
        &self,
        direct: &[u32; 1 << DIRECT_BITS],
        hops: &[u32],
        a: &[K; GROUP],
        ahead: &[K],
        o: &mut [u32; GROUP],
        s: &mut Scratch,
    ) {
        let flat = &self.flat[..];
        let codes = flat_codes(flat);
        let nodes = self.nodes.as_ptr();
        let mut n = 0;
        for j in 0..GROUP {
            if let Some(f) = ahead.get(j + AHEAD_DIRECT) {
                crate::arch::prefetch(&direct[f.slot()]);
            }
            if let Some(f) = ahead.get(j + AHEAD_FLAT) {
                let x = direct[f.slot()];
                crate::arch::prefetch(flat.as_ptr().wrapping_add((x & FLAT_OFFSET) as usize));
            }
            let addr = a[j];
            let x = direct[addr.slot()];
            if x & (NODE | FLAT) == NODE {
                s.list_node(n, x & !NODE, j, addr.bits64(Self::first_depth()), nodes);
                n += 1;
                continue;
            }
            let is_flat = x & (NODE | FLAT) == NODE | FLAT;
            let at = std::hint::select_unpredictable(is_flat, (x & FLAT_OFFSET) as usize, 0);
            let code = flat_code(flat, codes, at, addr.stride(DIRECT_BITS));
            let hop = hops.get(usize::from(code)).copied().unwrap_or(NO_ROUTE);
            o[j] = std::hint::select_unpredictable(is_flat, hop, decode_direct(x));
        }
        if n > 0 {
            self.descend(a, o, s, n, Self::first_depth());
        }
    }
}

/// Runs `f` on each whole group of `addrs` as an array (so that a position, masked to the
/// group, needs no bounds check), with the group's number and its part of `out`; then on a
/// last, partial group padded with address 0 (number: the whole groups' count), whose
/// answers are copied out. `addrs` and `out` have the same length (checked by the caller).
#[inline(always)]
fn by_groups<K: Key>(
    addrs: &[K],
    out: &mut [u32],
    mut f: impl FnMut(usize, &[K; GROUP], &mut [u32; GROUP]),
) {
    let (groups, tail) = addrs.as_chunks::<GROUP>();
    let (outs, tail_out) = out.as_chunks_mut::<GROUP>();
    for (g, (a, o)) in groups.iter().zip(outs.iter_mut()).enumerate() {
        f(g, a, o);
    }
    if !tail.is_empty() {
        let mut a = [K::default(); GROUP];
        a[..tail.len()].copy_from_slice(tail);
        let mut o = [NO_ROUTE; GROUP];
        f(groups.len(), &a, &mut o);
        tail_out.copy_from_slice(&o[..tail.len()]);
    }
}
