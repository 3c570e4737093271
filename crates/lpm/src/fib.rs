//! The frozen lookup structure: an 18-bit direct-pointing array over 64-way Poptrie nodes,
//! childless first-level nodes stored flat, IPv6 first-level nodes expanded to 64 entries.

use rustc_hash::FxHashMap;

use crate::key::Key;
use crate::rib::{Rib, Route};
use crate::{DIRECT_BITS, NO_ROUTE, STRIDE};

/// Direct entry flag: the entry leads to a node; without it the low 31 bits are a next hop.
const NODE: u32 = 0x8000_0000;
/// With [`NODE`]: the node is a flat block (see [`Fib`]'s `flat`) whose word offset is the
/// low [`FLAT_OFFSET_BITS`] bits and whose size in words minus one the 6 bits above (the
/// offset of its last word, which the batch lookup prefetches with its first); without it
/// the low 30 bits index `nodes` (2^30 nodes would be 24 GiB: the allocation fails long
/// before an index could reach this bit).
const FLAT: u32 = 0x4000_0000;
const FLAT_OFFSET_BITS: u32 = 24;
const FLAT_OFFSET: u32 = (1 << FLAT_OFFSET_BITS) - 1;
/// Most runs of a flat block; also the most runs of any node.
const FLAT_RUNS_MAX: u32 = 64;

/// Words (`u64`) of a flat block with `runs` leaf runs: the leaf vector, then 4 codes a word.
#[inline(always)]
fn flat_words(runs: u32) -> u32 {
    1 + runs.div_ceil(4)
}

/// The direct entry of a flat block at word `at` with `runs` runs.
#[inline(always)]
fn flat_entry(at: u32, runs: u32) -> u32 {
    NODE | FLAT | ((flat_words(runs) - 1) << FLAT_OFFSET_BITS) | at
}

/// Word offset and word count of the flat block a direct entry with [`FLAT`] leads to.
#[inline(always)]
fn flat_block(e: u32) -> (usize, usize) {
    let last = (e >> FLAT_OFFSET_BITS) & 0x3F;
    ((e & FLAT_OFFSET) as usize, last as usize + 1)
}

/// The flat arena as 16-bit leaf codes: the codes of the block at word `at` start at code
/// `4 * (at + 1)`. Read and written through this view (never by shifting words), so the
/// layout is the same on any byte order.
#[inline(always)]
fn flat_codes(flat: &[u64]) -> &[u16] {
    bytemuck::cast_slice(flat)
}

/// The leaf code slot `v` of the flat block at word `at` resolves to (0 outside the arena:
/// never, for entries this module wrote). `codes` is [`flat_codes`] of `flat`.
#[inline(always)]
fn flat_code(flat: &[u64], codes: &[u16], at: usize, v: u32) -> u16 {
    let leafvec = flat.get(at).copied().unwrap_or(1);
    // Runs up to and including slot `v`: the run's index plus one (the leaf vector always
    // has bit 0 set, so at least one).
    let runs = (leafvec << (63 - v)).count_ones() as usize;
    codes.get(4 * at + 3 + runs).copied().unwrap_or(0)
}
/// "No route" as stored in a direct entry (31 bits).
const DIRECT_NONE: u32 = 0x7FFF_FFFF;

#[inline(always)]
fn decode_direct(e: u32) -> u32 {
    if e == DIRECT_NONE {
        NO_ROUTE
    } else {
        e
    }
}

#[inline(always)]
fn encode_direct(hop: u32) -> u32 {
    if hop == NO_ROUTE {
        DIRECT_NONE
    } else {
        hop
    }
}

/// A 64-way node: slot `i` (the next 6 address bits) is a child node when bit `i` of
/// `vector` is set, else a leaf. Children are `nodes[base1..]` in slot order; leaves are
/// run-length compressed: bit `i` of `leafvec` marks a leaf slot whose next hop differs from
/// the previous leaf slot's, and the run's hop is `leaves[base0 + runs up to i - 1]`.
///
/// Inline leaves: a node without children and with at most [`INLINE_MAX`] runs (most nodes of
/// a BGP-shaped table: a /18 holding a few /24s) keeps its runs' 16-bit leaf codes in the
/// bytes `vector` and `base1` do not need then, and `base0` is [`INLINE`]: its lookups end in
/// the node's own cache line, one dependent load fewer than through the leaf array.
/// A prefix node (see [`Node::prefix`]) is inline too, with [`PREFIX`] set as well.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Node {
    vector: u64,
    leafvec: u64,
    base0: u32,
    base1: u32,
}

/// A node's size: a prefetch of its first and last byte brings all of it.
const NODE_BYTES: usize = std::mem::size_of::<Node>();

/// `base0` of a node whose leaf codes are inline.
const INLINE: u32 = 0x8000_0000;
/// With [`INLINE`]: a prefix node (see [`Node::prefix`]).
const PREFIX: u32 = 0x4000_0000;
/// Without [`INLINE`] (the same bit as [`PREFIX`]): the node's children are [`Line`]s, not
/// nodes; the rest of `base0` is the leaf base.
const RANGED: u32 = PREFIX;
/// Addresses a batch lookup works on together. Each pass prefetches what the next one loads,
/// so the group's size is how long a prefetch has to land. Since IPv6 lookups end in a range
/// line (often from DRAM) after passes that hit in cache, 128 beats 32: IPv6 inside 1.12–1.13×,
/// IPv4 inside 0.99–1.10×, cached working sets the same (64: 1.07–1.10×; 256 as 128, with
/// twice the stack). Before lines and expanded roots, 64 had measured 0.98× for IPv6.
const GROUP: usize = 128;
// A group's addresses are listed by their `u8` position.
const _: () = assert!(GROUP <= 256);

/// Per-group working lists of the batch lookup, reused from group to group: each pass lists
/// the lookups it hands to the next (the node, line or leaf each needs and its position in
/// the group).
struct Scratch {
    entry: [u32; GROUP],
    node: [u32; GROUP],
    pending: [u8; GROUP],
    /// The 64 address bits from each listed node's depth (taken when it was listed, so that
    /// the node's pass reads them instead of the address).
    bits: [u64; GROUP],
    leaf_at: [u32; GROUP],
    leaf_of: [u8; GROUP],
    line_at: [u32; GROUP],
    line_of: [u8; GROUP],
    line_x: [u32; GROUP],
}

impl Scratch {
    /// Lists node `c` as the `at`-th of the next node pass, for the lookup at position `i`
    /// of the group, with the 64 address bits from the node's depth, and asks for the node's
    /// first and last byte (its second line when it straddles two, as a 24-byte node does at
    /// 2 of every 8 positions, and then that line was a demand miss). `nodes` is the node
    /// arena: a prefetch is a hint, so its address needs no bounds check. (`at < GROUP`
    /// always: the `% GROUP` only spares the check.)
    #[inline(always)]
    fn list_node(&mut self, at: usize, c: u32, i: usize, bits: u64, nodes: *const Node) {
        let p = nodes.wrapping_add(c as usize);
        crate::arch::prefetch(p);
        crate::arch::prefetch(p.cast::<u8>().wrapping_add(NODE_BYTES - 1));
        self.node[at % GROUP] = c;
        self.pending[at % GROUP] = i as u8;
        self.bits[at % GROUP] = bits;
    }

    fn new() -> Self {
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
/// Most routes in a direct slot for which a delete that empties a child of the first-level
/// node rebuilds the whole slot (see [`Fib::update_long`]).
const COLLAPSE_MAX: usize = 64;
/// Most runs a node keeps inline: 6 codes of 16 bits in `vector` (4) and `base1` (2).
const INLINE_MAX: u32 = 6;

impl Node {
    #[inline(always)]
    fn inline(&self) -> bool {
        self.base0 & INLINE != 0
    }

    /// Inline leaf code `i` (< `INLINE_MAX`).
    #[inline(always)]
    fn inline_code(&self, i: u32) -> u16 {
        let packed = (u128::from(self.base1) << 64) | u128::from(self.vector);
        (packed >> (16 * i.min(INLINE_MAX - 1))) as u16
    }

    /// A prefix node: the node's whole subtree is one or two routes (`a` no longer than
    /// `b`), kept verbatim instead of as slots and children: their bits from the node's depth
    /// on, left-aligned, in `vector` and `leafvec`; their lengths past the depth (1–64, less
    /// one) and the code of the hop around them in `base0`; their codes in `base1`. A lookup
    /// compares instead of descending: on a BGP-shaped IPv6 table most nodes below /30 hold
    /// one or two routes, a /48 under them walked two or three more nodes and a leaf before.
    /// With one route, `b` repeats `a`.
    fn prefix(a: (u64, u32, u16), b: (u64, u32, u16), outside: u16) -> Node {
        Node {
            vector: a.0,
            leafvec: b.0,
            base0: INLINE | PREFIX | ((a.1 - 1) << 24) | ((b.1 - 1) << 18) | u32::from(outside),
            base1: u32::from(a.2) | (u32::from(b.2) << 16),
        }
    }

    /// The leaf code of an inline node (a prefix node or inline leaves) for address bits
    /// `bits` from the node's depth on, whose first 6 are `v`.
    #[inline(always)]
    fn inline_leaf(&self, bits: u64, v: u32) -> u16 {
        if self.base0 & PREFIX == 0 {
            return self.inline_code(self.run(v));
        }
        let hit = |p: u64, m1: u32| (bits ^ p) >> (63 - (m1 & 63)) == 0;
        if hit(self.leafvec, self.base0 >> 18) {
            (self.base1 >> 16) as u16
        } else if hit(self.vector, self.base0 >> 24) {
            self.base1 as u16
        } else {
            self.base0 as u16
        }
    }

    #[inline(always)]
    fn is_prefix(&self) -> bool {
        self.base0 & (INLINE | PREFIX) == INLINE | PREFIX
    }

    /// Asks for the node's cache lines: both of them when it straddles two (a 24-byte node
    /// does at 2 of every 8 positions, and then its second line was a demand miss).
    #[inline(always)]
    fn prefetch(&self) {
        crate::arch::prefetch(&self.vector);
        crate::arch::prefetch(&self.base1);
    }

    /// Whether slot `v` holds a child node.
    #[inline(always)]
    fn has_child(&self, v: u32) -> bool {
        !self.inline() && self.vector & (1u64 << v) != 0
    }

    /// Index of slot `v`'s child (a child slot) in the node or line arena.
    #[inline(always)]
    fn child(&self, v: u32) -> u32 {
        self.base1 + (self.vector << (63 - v)).count_ones() - 1
    }

    /// Index among the runs of the leaf run covering slot `v` (a leaf slot).
    #[inline(always)]
    fn run(&self, v: u32) -> u32 {
        (self.leafvec << (63 - v)).count_ones().wrapping_sub(1)
    }
}

/// Boundaries a [`Line`] holds.
const LINE_BOUNDS: usize = 10;
/// Every code of an escape [`Line`]; narrow leaves stop one code short of it.
const ESCAPE: u16 = u16::MAX;
/// Ranges worked out before giving up on a line (a few past what fits: merges at the end
/// can still bring the count down).
const RANGES_CAP: usize = 2 * LINE_BOUNDS + 4;

/// A child subtree kept as its address ranges, in one cache line: `bounds` are the
/// starts of ranges 1.. (the 32 address bits past the line's depth, ascending; unused ones
/// `u32::MAX`), `codes[i]` the leaf code of range `i` (past the last range, repeated). A
/// lookup counts the bounds at or below its address bits and takes that code: no branch,
/// no further load. Children of a node with [`RANGED`] are lines.
///
/// An escape (a child whose ranges do not fit): every code is [`ESCAPE`] (never a leaf
/// code), and `bounds[0]` the index of an ordinary node for the child. So the batch learns
/// of an escape from the code its count picks, and tests nothing before counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
struct Line {
    bounds: [u32; LINE_BOUNDS],
    codes: [u16; LINE_BOUNDS + 1],
    spare: u16,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            bounds: [u32::MAX; LINE_BOUNDS],
            codes: [0; LINE_BOUNDS + 1],
            spare: 0,
        }
    }
}

impl Line {
    fn escape(node: u32) -> Line {
        let mut l = Line {
            codes: [ESCAPE; LINE_BOUNDS + 1],
            ..Line::default()
        };
        l.bounds[0] = node;
        l
    }

    /// The node an escape leads to.
    #[inline(always)]
    fn escaped(&self) -> Option<u32> {
        (self.codes[0] == ESCAPE).then_some(self.bounds[0])
    }

    /// The leaf code for the 32 address bits `x` past the line's depth.
    #[inline(always)]
    fn code(&self, x: u32) -> u16 {
        self.codes[(crate::arch::bounds_at_or_below(&self.bounds, x) as usize).min(LINE_BOUNDS)]
    }
}

/// The leaf array: 16-bit codes into a next-hop table when there are at most 65 535 codes
/// ("no route" and 65 534 distinct next hops; routers' FIBs have tens), halving the leaves'
/// footprint; the hops themselves otherwise.
#[derive(Debug, Clone)]
enum Leaves {
    Narrow {
        codes: Vec<u16>,
        hops: Vec<u32>,
        /// Code of each next hop below `SMALL_HOPS` (`u16::MAX`: none yet), else `code_of`.
        small: Vec<u16>,
        code_of: FxHashMap<u32, u16>,
        overflow: bool,
    },
    Wide(Vec<u32>),
}

impl Leaves {
    fn new(wide: bool) -> Self {
        if wide {
            Leaves::Wide(Vec::new())
        } else {
            Leaves::Narrow {
                codes: Vec::new(),
                hops: Vec::new(),
                small: Vec::new(),
                code_of: FxHashMap::default(),
                overflow: false,
            }
        }
    }

    #[inline(always)]
    fn get(&self, j: u32) -> u32 {
        match self {
            Leaves::Narrow { codes, hops, .. } => hops[codes[j as usize] as usize],
            Leaves::Wide(v) => v[j as usize],
        }
    }

    /// Asks for leaf `j`'s cache line (a hint: nothing is read).
    #[inline(always)]
    fn prefetch(&self, j: u32) {
        match self {
            Leaves::Narrow { codes, .. } => {
                if let Some(c) = codes.get(j as usize) {
                    crate::arch::prefetch(c);
                }
            }
            Leaves::Wide(v) => {
                if let Some(h) = v.get(j as usize) {
                    crate::arch::prefetch(h);
                }
            }
        }
    }

    /// The next hop of leaf code `c` (inline leaves exist only with narrow leaves).
    #[inline(always)]
    fn hop_of(&self, c: u16) -> u32 {
        match self {
            Leaves::Narrow { hops, .. } => hops.get(usize::from(c)).copied().unwrap_or(NO_ROUTE),
            Leaves::Wide(_) => NO_ROUTE,
        }
    }

    /// `n` more leaves at the end; returns the first index.
    fn grow(&mut self, n: usize) -> u32 {
        let start = self.len();
        match self {
            Leaves::Narrow { codes, .. } => codes.resize(start + n, 0),
            Leaves::Wide(v) => v.resize(start + n, 0),
        }
        start as u32
    }

    fn set(&mut self, j: usize, hop: u32) {
        match self.code(hop) {
            Some(c) => {
                if let Leaves::Narrow { codes, .. } = self {
                    codes[j] = c;
                }
            }
            None => {
                if let Leaves::Wide(v) = self {
                    v[j] = hop;
                }
            }
        }
    }

    /// The 16-bit code of `hop`, given one if it has none yet (`None` with wide leaves).
    #[inline]
    fn code(&mut self, hop: u32) -> Option<u16> {
        if let Leaves::Narrow { small, .. } = self {
            if let Some(&c) = small.get(hop as usize).filter(|&&c| c != u16::MAX) {
                return Some(c);
            }
        }
        self.new_code(hop)
    }

    /// [`Leaves::code`] for a hop not seen yet, or one above `SMALL_HOPS`.
    #[cold]
    fn new_code(&mut self, hop: u32) -> Option<u16> {
        match self {
            Leaves::Narrow {
                hops,
                small,
                code_of,
                overflow,
                ..
            } => {
                if let Some(&c) = small.get(hop as usize).filter(|&&c| c != u16::MAX) {
                    return Some(c);
                }
                let next = hops.len();
                let code = *code_of.entry(hop).or_insert_with(|| {
                    // Codes 0..ESCAPE: the last 16-bit value marks escape lines.
                    if next >= usize::from(ESCAPE) {
                        *overflow = true;
                        0
                    } else {
                        hops.push(hop);
                        next as u16
                    }
                });
                if (hop as usize) < SMALL_HOPS && !*overflow {
                    if small.len() <= hop as usize {
                        small.resize(hop as usize + 1, u16::MAX);
                    }
                    small[hop as usize] = code;
                }
                Some(code)
            }
            Leaves::Wide(_) => None,
        }
    }

    fn len(&self) -> usize {
        match self {
            Leaves::Narrow { codes, .. } => codes.len(),
            Leaves::Wide(v) => v.len(),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Leaves::Narrow { codes, hops, .. } => codes.len() * 2 + hops.len() * 4,
            Leaves::Wide(v) => v.len() * 4,
        }
    }

    fn overflowed(&self) -> bool {
        matches!(self, Leaves::Narrow { overflow: true, .. })
    }
}

/// Next hops below this get their leaf code from a plain array instead of a hash map.
const SMALL_HOPS: usize = 1 << 16;

/// Sizes of a [`Fib`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FibStats {
    /// Bytes of the direct-pointing array.
    pub direct_bytes: usize,
    /// Nodes stored (live and garbage).
    pub nodes: usize,
    /// Nodes whose leaf codes are stored in the node itself (live and garbage).
    pub inline_nodes: usize,
    /// Prefix nodes: a subtree of one or two routes kept as the routes themselves (live and
    /// garbage; not counted in `inline_nodes`).
    pub prefix_nodes: usize,
    /// Leaves stored in the leaf array (live and garbage).
    pub leaves: usize,
    /// First-level nodes stored flat (leaf vector and codes only; live).
    pub flat_nodes: usize,
    /// Bytes of the flat blocks (live and garbage).
    pub flat_bytes: usize,
    /// Child subtrees kept as [address-range lines](Fib) (live and garbage), escapes
    /// included.
    pub lines: usize,
    /// Lines that are escapes: their subtree's ranges did not fit, so they lead to a node.
    pub escapes: usize,
    /// First-level nodes expanded into 64 direct-style entries (IPv6 only; live).
    pub expanded_roots: usize,
    /// Lines left behind by incremental updates.
    pub garbage_lines: usize,
    /// Nodes left behind by incremental updates, reclaimed by the next full rebuild.
    pub garbage_nodes: usize,
    /// Leaves left behind by incremental updates.
    pub garbage_leaves: usize,
    /// All bytes of the lookup structure (direct + nodes + leaves + flat blocks + lines +
    /// expanded roots, garbage included).
    pub bytes: usize,
    /// Leaves hold next hops themselves (more than 65 534 distinct ones), not 16-bit codes.
    pub wide_leaves: bool,
}

/// The lookup structure. Build it from a [`Rib`] with [`Fib::build`], or keep one in step
/// with a table through a [`FibWriter`](crate::FibWriter).
///
/// A first-level node (the one a direct entry leads to) without children — nearly every one
/// on a BGP-shaped IPv4 table, where a /18 holds a few /24s — is stored *flat* instead: its
/// leaf vector followed by its runs' 16-bit leaf codes, 4 to a word, in `flat`, the direct
/// entry carrying the block's offset and size. A lookup ending there is direct entry,
/// leaf vector, code (usually the same cache line): no node decode, no inline-or-array
/// choice, no base to add, and the block is as long as its runs (8 + 2 per run bytes against
/// a 24-byte node plus 2 per run outside it). Only with narrow leaves (16-bit codes).
///
/// A node at /24 or deeper may keep its children as *range lines* (see `Line`): each child
/// subtree's address ranges in one 64-byte cache line, which a lookup resolves with one
/// load and a count, or an escape to an ordinary node where the ranges do not fit.
#[derive(Debug, Clone)]
pub struct Fib<K: Key> {
    direct: Vec<u32>,
    nodes: Vec<Node>,
    leaves: Leaves,
    flat: Vec<u64>,
    lines: Vec<Line>,
    /// Expanded roots (IPv6 only, see [`Fib::EXPAND`]): 64 entries per first-level node,
    /// slot `v`'s entry a next hop (as in `direct`) or [`NODE`] and the index of its child.
    mid: Vec<u32>,
    /// Per expanded root: the index of its first-level node (kept for updates).
    mid_root: Vec<u32>,
    /// Expanded roots left behind by updates, for reuse.
    free_mid: Vec<u32>,
    garbage_nodes: usize,
    garbage_leaves: usize,
    /// Words of `flat` left behind by updates.
    garbage_flat: usize,
    /// Freed blocks by exact size, 1–64 (a node has at most 64 leaves or children; updates
    /// mostly replace a block with one of the same size).
    free_nodes: Vec<Vec<u32>>,
    free_leaves: Vec<Vec<u32>>,
    free_lines: Vec<Vec<u32>>,
    garbage_lines: usize,
    /// Freed flat blocks by size in words (2–17).
    free_flat: Vec<Vec<u32>>,
    _key: std::marker::PhantomData<K>,
}

impl<K: Key> Fib<K> {
    /// Whether first-level nodes are *expanded* (IPv6): a direct entry with [`NODE`] (and
    /// not [`FLAT`]) then indexes a block of 64 entries in `mid`, one per slot of the node —
    /// a next hop, or [`NODE`] and the index of the slot's child — instead of the node. An
    /// IPv6 table uses few direct slots (324 of 2^18 on the 220k table), nearly all with
    /// children, so every lookup spent a pass decoding one of a few hundred nodes; now it is
    /// a second load from 256 bytes per root (81 KiB there, cache-resident), done in the
    /// direct pass. IPv4 tables are not expanded: their first-level nodes are many (one per
    /// /18 holding a longer route), almost all flat blocks.
    const EXPAND: bool = K::BITS == 128;

    /// The lookup structure for `rib`.
    pub fn build(rib: &Rib<K>) -> Self {
        let fib = Self::build_with(rib, false);
        if fib.leaves.overflowed() {
            return Self::build_with(rib, true);
        }
        fib
    }

    fn build_with(rib: &Rib<K>, wide: bool) -> Self {
        let mut fib = Fib {
            direct: vec![DIRECT_NONE; 1 << DIRECT_BITS],
            nodes: Vec::new(),
            leaves: Leaves::new(wide),
            // Word 0 stays unused, so that no flat entry is 0.
            flat: vec![0],
            lines: Vec::new(),
            mid: Vec::new(),
            mid_root: Vec::new(),
            free_mid: Vec::new(),
            garbage_nodes: 0,
            garbage_leaves: 0,
            garbage_flat: 0,
            free_nodes: vec![Vec::new(); 65],
            free_leaves: vec![Vec::new(); 65],
            free_lines: vec![Vec::new(); 65],
            garbage_lines: 0,
            free_flat: vec![Vec::new(); flat_words(FLAT_RUNS_MAX) as usize + 1],
            _key: std::marker::PhantomData,
        };
        let slots = fib.direct.len();
        fib.set_slots(rib, slots, |i| i as u32);
        fib
    }

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
        // Whole groups as arrays, so that a position (masked to the group) needs no bounds
        // check either; a last, partial group is padded with address 0 and copied out.
        let (groups, tail) = addrs.as_chunks::<GROUP>();
        let (outs, tail_out) = out.as_chunks_mut::<GROUP>();
        let mut s = Scratch::new();
        for (g, (a, o)) in groups.iter().zip(outs.iter_mut()).enumerate() {
            let next = groups.get(g + 1);
            if next.is_none() {
                for addr in tail {
                    crate::arch::prefetch(&direct[addr.slot()]);
                }
            }
            self.group(direct, a, next, o, &mut s);
        }
        if !tail.is_empty() {
            let mut a = [K::default(); GROUP];
            a[..tail.len()].copy_from_slice(tail);
            let mut o = [NO_ROUTE; GROUP];
            self.group(direct, &a, None, &mut o, &mut s);
            tail_out.copy_from_slice(&o[..tail.len()]);
        }
    }

    /// One group of the batch lookup: the direct pass, then the flat blocks' pass, then
    /// [`Fib::descend`] for the lookups that go on to nodes. `next` is the following group,
    /// whose direct entries are asked for while this one runs.
    #[inline(always)]
    fn group(
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
        // listed) because most IPv4 lookups end in one: a plain scan of the group's entries
        // costs less than writing and reading back a list, and the block's lines have the
        // rest of this pass to arrive. (`n <= j < GROUP`: the `% GROUP` below only spares a
        // bounds check. Prefetches take addresses unchecked: a hint cannot fault.)
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
    fn flat_pass(
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
    fn descend(
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
            // batches inside routed prefixes 1.03-1.10x (BENCHMARKS.md).
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

    /// Sizes, including garbage left by incremental updates.
    pub fn stats(&self) -> FibStats {
        let bytes = self.direct.len() * 4
            + self.nodes.len() * std::mem::size_of::<Node>()
            + self.leaves.bytes()
            + self.flat.len() * 8
            + self.lines.len() * std::mem::size_of::<Line>()
            + self.mid.len() * 4
            + self.mid_root.len() * 4;
        FibStats {
            direct_bytes: self.direct.len() * 4,
            nodes: self.nodes.len(),
            inline_nodes: self
                .nodes
                .iter()
                .filter(|n| n.inline() && !n.is_prefix())
                .count(),
            prefix_nodes: self.nodes.iter().filter(|n| n.is_prefix()).count(),
            leaves: self.leaves.len(),
            flat_nodes: self
                .direct
                .iter()
                .filter(|&&e| e & (NODE | FLAT) == NODE | FLAT)
                .count(),
            flat_bytes: self.flat.len() * 8,
            lines: self.lines.len(),
            escapes: self.lines.iter().filter(|l| l.escaped().is_some()).count(),
            expanded_roots: self.mid_root.len() - self.free_mid.len(),
            garbage_lines: self.garbage_lines,
            garbage_nodes: self.garbage_nodes,
            garbage_leaves: self.garbage_leaves,
            bytes,
            wide_leaves: matches!(self.leaves, Leaves::Wide(_)),
        }
    }

    #[inline(always)]
    fn lookup_raw(&self, addr: K) -> u32 {
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
    const fn first_depth() -> u32 {
        if Self::EXPAND {
            DIRECT_BITS + STRIDE
        } else {
            DIRECT_BITS
        }
    }

    /// The walk from node `first` at depth `offset` down to `addr`'s leaf.
    #[inline(always)]
    fn walk(&self, addr: K, first: u32, mut offset: u32) -> u32 {
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
    fn root_of(&self, e: u32) -> u32 {
        if Self::EXPAND {
            self.mid_root
                .get((e & !NODE) as usize)
                .copied()
                .unwrap_or(0)
        } else {
            e & !NODE
        }
    }

    /// The direct entry for first-level node `root`: the node itself, or with [`Fib::EXPAND`]
    /// its expansion into a block of `mid` (a freed one, or new at the end).
    fn root_entry(&mut self, root: u32) -> u32 {
        if !Self::EXPAND {
            return root | NODE;
        }
        let node = self.nodes[root as usize];
        let block = self.free_mid.pop().unwrap_or_else(|| {
            self.mid.resize(self.mid.len() + 64, DIRECT_NONE);
            self.mid_root.push(0);
            (self.mid_root.len() - 1) as u32
        });
        self.mid_root[block as usize] = root;
        for v in 0..64u32 {
            self.mid[block as usize * 64 + v as usize] = if node.has_child(v) {
                // First-level nodes never have lines ([`Fib::wants_lines`]): a node.
                NODE | node.child(v)
            } else if node.inline() {
                // First-level nodes are never prefix nodes: an inline leaf code.
                encode_direct(self.leaves.hop_of(node.inline_code(node.run(v))))
            } else {
                encode_direct(self.leaves.get((node.base0 & !RANGED) + node.run(v)))
            };
        }
        block | NODE
    }

    /// Rebuilds every slot of `slots` (as [`Fib::set_slot`]), each slot's routes and old root
    /// node prefetched a few slots ahead: every slot's routes are an allocation of their own,
    /// and the first load from it was a quarter of `build_node`'s time (perf) before.
    /// `slot_at(i)` is the `i`-th of `count` slots.
    pub(crate) fn set_slots(&mut self, rib: &Rib<K>, count: usize, slot_at: impl Fn(usize) -> u32) {
        const AHEAD: usize = 4;
        for i in 0..count {
            if i + 2 * AHEAD < count {
                rib.prefetch_chunk_header(slot_at(i + 2 * AHEAD) as usize);
            }
            if i + AHEAD < count {
                let next = slot_at(i + AHEAD);
                rib.prefetch_chunk(next as usize);
                self.prefetch_root(next as usize);
            }
            self.set_slot(rib, slot_at(i) as usize);
        }
    }

    /// Asks for the cache lines of direct slot `slot`'s entry and root node (a hint, for an
    /// update about to touch them; reads the entry).
    pub(crate) fn prefetch_root(&self, slot: usize) {
        if let Some(&e) = self.direct.get(slot) {
            if e & (NODE | FLAT) == NODE | FLAT {
                if let Some(w) = self.flat.get(flat_block(e).0) {
                    crate::arch::prefetch(w);
                }
            } else if let Some(n) = self
                .nodes
                .get(self.root_of(e) as usize)
                .filter(|_| e & NODE != 0)
            {
                n.prefetch();
            }
        }
    }

    /// Rebuilds direct slot `slot` from the table; its old subtree's blocks are freed.
    pub(crate) fn set_slot(&mut self, rib: &Rib<K>, slot: usize) {
        let old = self.direct[slot];
        if old & (NODE | FLAT) == NODE | FLAT {
            let (at, words) = flat_block(old);
            self.free_flat[words].push(at as u32);
            self.garbage_flat += words;
        } else if old & NODE != 0 {
            let root = self.root_of(old);
            self.free_below(root);
            self.free_block(Arena::Nodes, root, 1);
            if Self::EXPAND {
                self.free_mid.push(old & !NODE);
            }
        }
        let inherited = rib.short_hop(slot);
        let routes = rib.chunk(slot);
        self.direct[slot] = if routes.is_empty() {
            encode_direct(inherited)
        } else {
            self.build_root(routes, inherited)
        };
        self.check_overflow(rib);
    }

    /// Applies a change of the route `addr/len` (longer than the direct stride, already made
    /// in `rib`): only the deepest existing node whose slots the route paints (or below which
    /// it must hang) is rebuilt, in place — or, when a node above it on the route's path has
    /// at most two routes left below it, that node, so that it becomes a prefix node. A range
    /// line on the path is redone alone (as a line, or an escape when it no longer fits);
    /// whether its parent keeps lines is decided again at the next rebuild of that parent.
    pub(crate) fn update_long(&mut self, rib: &Rib<K>, addr: K, len: u8) {
        let slot = addr.slot();
        let e = self.direct[slot];
        let routes = rib.chunk(slot);
        if e & NODE == 0 || e & FLAT != 0 || routes.is_empty() {
            // Nothing below the direct entry to keep: the slot is rebuilt whole (for a flat
            // block that is the one node an in-place rebuild would redo too).
            return self.set_slot(rib, slot);
        }
        // The routes inside the node at `depth` on `addr`'s path and longer than its depth
        // (sorted by address, so the ones covering the whole node come first and are skipped).
        let inside = |depth: u32| {
            let lo = addr.mask(depth as u8);
            let first = routes.partition_point(|r| r.addr < lo);
            let first = first
                + routes[first..]
                    .iter()
                    .take_while(|r| r.addr == lo && u32::from(r.len) <= depth)
                    .count();
            let last = first + routes[first..].partition_point(|r| r.addr.mask(depth as u8) == lo);
            (first, last)
        };
        // The longest route covering the whole node at `depth` on `addr`'s path, from the
        // slot's list or the short ones.
        let inherited = |depth: u32| {
            let lo = addr.mask(depth as u8);
            (DIRECT_BITS + 1..=depth)
                .rev()
                .find_map(|l| {
                    let a = lo.mask(l as u8);
                    routes
                        .binary_search_by(|r| (r.addr, u32::from(r.len)).cmp(&(a, l)))
                        .ok()
                        .map(|i| routes[i].hop)
                })
                .unwrap_or_else(|| rib.short_hop(slot))
        };
        let (mut at, mut depth) = (self.root_of(e), DIRECT_BITS);
        // Set with every step down: `inside(depth)` below the first level.
        let (mut first, mut last) = (0, 0);
        while u32::from(len) > depth + STRIDE {
            let node = self.nodes[at as usize];
            let v = addr.stride(depth);
            if !node.has_child(v) {
                break;
            }
            at = node.child(v);
            depth += STRIDE;
            (first, last) = inside(depth);
            if node.base0 & RANGED != 0 {
                // A line child is redone alone (it has nothing below it): as a line when
                // its routes still fit one, else as an escape. An escape whose routes still
                // do not fit keeps its node, and the walk goes on into it.
                let (sub, around) = (&routes[first..last], inherited(depth));
                let line = self.line_of(sub, depth, around);
                let escaped = self.lines[at as usize].escaped();
                match (line, escaped) {
                    (None, Some(c)) => {
                        at = c;
                        if last - first > 2 {
                            continue;
                        }
                        break;
                    }
                    (Some(l), _) => {
                        self.free_line(at);
                        self.lines[at as usize] = l;
                    }
                    (None, None) => {
                        let l = self.escape(sub, depth, around);
                        self.lines[at as usize] = l;
                    }
                }
                return self.check_overflow(rib);
            }
            if last - first <= 2 {
                // Few enough routes below to be a prefix node (a delete left them, or an
                // insert joins a prefix node): this node is rebuilt, not one further down.
                break;
            }
        }
        if depth == DIRECT_BITS {
            // The first-level node itself is redone (with everything below it): as a slot
            // rebuild, so that it becomes a flat block if it has no children left.
            return self.set_slot(rib, slot);
        }
        if first == last && depth == DIRECT_BITS + STRIDE && routes.len() <= COLLAPSE_MAX {
            // A delete emptied a child of the first-level node: the slot is rebuilt, so the
            // child's slot turns back into a leaf and the node into a flat block when it was
            // the last child. (Deeper, or in a slot of many routes, the emptied node stays,
            // all one leaf run, until the next compaction: rebuilding its parent's whole
            // subtree would cost more than it saves.)
            return self.set_slot(rib, slot);
        }
        self.free_below(at);
        let node = self.build_node(&routes[first..last], depth, inherited(depth));
        self.nodes[at as usize] = node;
        self.check_overflow(rib);
    }

    fn check_overflow(&mut self, rib: &Rib<K>) {
        if self.leaves.overflowed() {
            // The 65537th distinct next hop: switch to wide leaves.
            *self = Self::build_with(rib, true);
        }
    }

    /// Whether the blocks left unused by updates outgrew the live structure.
    pub(crate) fn wants_compaction(&self) -> bool {
        // In 2-byte units: a node is 24 bytes, a leaf 2 (or 4), a flat word 8, a line 64, an
        // expanded root 256.
        let garbage = self.garbage_nodes * 12
            + self.garbage_leaves
            + self.garbage_flat * 4
            + self.garbage_lines * 32
            + self.free_mid.len() * 128;
        let total = self.nodes.len() * 12
            + self.leaves.len()
            + self.flat.len() * 4
            + self.lines.len() * 32
            + self.mid_root.len() * 128;
        garbage > 192 * 1024 && garbage * 2 > total
    }

    /// Frees node `at`'s leaf block and child blocks, recursively (not `at` itself).
    fn free_below(&mut self, at: u32) {
        let node = self.nodes[at as usize];
        if node.inline() {
            return;
        }
        let (leaves, children) = (node.leafvec.count_ones(), node.vector.count_ones());
        if leaves > 0 {
            self.free_block(Arena::Leaves, node.base0 & !RANGED, leaves);
        }
        if children == 0 {
            return;
        }
        if node.base0 & RANGED != 0 {
            for k in 0..children {
                self.free_line(node.base1 + k);
            }
            self.free_block(Arena::Lines, node.base1, children);
        } else {
            for k in 0..children {
                self.free_below(node.base1 + k);
            }
            self.free_block(Arena::Nodes, node.base1, children);
        }
    }

    /// Frees what line `at` leads to: an escape's node and everything below it (not the
    /// line itself).
    fn free_line(&mut self, at: u32) {
        if let Some(c) = self.lines[at as usize].escaped() {
            self.free_below(c);
            self.free_block(Arena::Nodes, c, 1);
        }
    }

    fn free_block(&mut self, arena: Arena, start: u32, n: u32) {
        if let Arena::Lines = arena {
            // Freed lines are blank, so that [`FibStats::escapes`] counts live ones only.
            let at = start as usize;
            self.lines[at..at + n as usize].fill(Line::default());
        }
        let (list, garbage) = self.arena(arena);
        list[n as usize].push(start);
        *garbage += n as usize;
    }

    fn arena(&mut self, arena: Arena) -> (&mut Vec<Vec<u32>>, &mut usize) {
        match arena {
            Arena::Nodes => (&mut self.free_nodes, &mut self.garbage_nodes),
            Arena::Leaves => (&mut self.free_leaves, &mut self.garbage_leaves),
            Arena::Lines => (&mut self.free_lines, &mut self.garbage_lines),
        }
    }

    /// A block of `n` nodes, leaves or lines: a freed one of that size, or new at the end.
    fn alloc(&mut self, arena: Arena, n: u32) -> u32 {
        let (list, garbage) = self.arena(arena);
        if let Some(start) = list[n as usize].pop() {
            *garbage -= n as usize;
            return start;
        }
        match arena {
            Arena::Leaves => self.leaves.grow(n as usize),
            Arena::Nodes => {
                let start = self.nodes.len();
                self.nodes.resize(start + n as usize, Node::default());
                start as u32
            }
            Arena::Lines => {
                let start = self.lines.len();
                self.lines.resize(start + n as usize, Line::default());
                start as u32
            }
        }
    }

    /// The direct entry for a slot with `routes` (all longer than the direct stride, sorted)
    /// below the covering next hop `inherited`: a flat block when the first-level node has
    /// no children (and leaves are narrow), else a node.
    fn build_root(&mut self, routes: &[Route<K>], inherited: u32) -> u32 {
        let mut p = Painted::new(inherited);
        Self::paint(&mut p, routes, DIRECT_BITS);
        if p.vector == 0 && matches!(self.leaves, Leaves::Narrow { .. }) {
            let runs = p.leafvec.count_ones();
            if let Some(at) = self.alloc_flat(flat_words(runs)) {
                let at = at as usize;
                self.flat[at] = p.leafvec;
                for (k, s) in set_bits(p.leafvec).enumerate() {
                    // Narrow leaves always give a code (0 on overflow, which rebuilds wide).
                    let code = self.leaves.code(p.hops[s]).unwrap_or(0);
                    bytemuck::cast_slice_mut::<u64, u16>(&mut self.flat)[4 * (at + 1) + k] = code;
                }
                return flat_entry(at as u32, runs);
            }
        }
        let root = self.finish_node(&p, routes, DIRECT_BITS);
        let at = self.alloc(Arena::Nodes, 1);
        self.nodes[at as usize] = root;
        self.root_entry(at)
    }

    /// A flat block of `words` words: a freed one of that size, or new at the end; `None`
    /// when the arena's offsets are used up (the slot then gets a node).
    fn alloc_flat(&mut self, words: u32) -> Option<u32> {
        if let Some(at) = self.free_flat[words as usize].pop() {
            self.garbage_flat -= words as usize;
            return Some(at);
        }
        let at = self.flat.len();
        if at + words as usize > FLAT_OFFSET as usize {
            return None;
        }
        self.flat.resize(at + words as usize, 0);
        Some(at as u32)
    }

    /// Builds the node for the 6 bits at `depth` from `routes` (all longer than `depth`,
    /// inside this node's range, sorted by (addr, len)), below a covering next hop
    /// `inherited`. Children are appended contiguously before recursing into them.
    fn build_node(&mut self, routes: &[Route<K>], depth: u32, inherited: u32) -> Node {
        if let Some(node) = self.prefix_node(routes, depth, inherited) {
            return node;
        }
        let mut p = Painted::new(inherited);
        Self::paint(&mut p, routes, depth);
        self.finish_node(&p, routes, depth)
    }

    /// The node as a prefix node (see [`Node::prefix`]) when `routes` are one or two, one of
    /// them longer than the node's 6 bits (else an ordinary node is as short a walk), none
    /// more than 64 bits past `depth`, and leaves are narrow.
    fn prefix_node(&mut self, routes: &[Route<K>], depth: u32, inherited: u32) -> Option<Node> {
        let (a, b) = match routes {
            [a] => (a, a),
            [a, b] => {
                if a.len <= b.len {
                    (a, b)
                } else {
                    (b, a)
                }
            }
            _ => return None,
        };
        let past = |r: &Route<K>| u32::from(r.len).wrapping_sub(depth);
        if past(b) <= STRIDE || past(b) > 64 || past(a) == 0 || past(a) > 64 {
            return None;
        }
        let codes = (
            self.leaves.code(a.hop)?,
            self.leaves.code(b.hop)?,
            self.leaves.code(inherited)?,
        );
        Some(Node::prefix(
            (a.addr.bits64(depth), past(a), codes.0),
            (b.addr.bits64(depth), past(b), codes.1),
            codes.2,
        ))
    }

    /// Fills `p` (fresh from [`Painted::new`]): each of the 64 slots' longest match among
    /// `routes` (as [`Fib::build_node`]), which slots hold children (and their ranges of
    /// `routes`), and where leaf runs start. Filled in place: the arrays are ~800 bytes, and
    /// moving them between functions measured ~15% of an IPv6 burst.
    fn paint(p: &mut Painted, routes: &[Route<K>], depth: u32) {
        let end = depth + STRIDE;
        // Slots where the painted next hop may differ from the slot before: the edges of every
        // painted range. Only these (and the first leaf after a child) can start a leaf run,
        // so runs are found without a pass over all 64 slots (this loop was most of a
        // rebuild's time: perf, BENCHMARKS.md).
        let mut edges = 1u64;
        let mut i = 0;
        while i < routes.len() {
            let r = routes[i];
            let s = r.addr.stride(depth);
            if u32::from(r.len) <= end {
                // Covering routes come before the routes nested in them, so painting in
                // list order leaves every slot with its longest match.
                let span = 1usize << (end - u32::from(r.len));
                let start = s as usize & !(span - 1);
                p.hops[start..start + span].fill(r.hop);
                edges |= (1u64 << start) | 1u64.checked_shl((start + span) as u32).unwrap_or(0);
                i += 1;
            } else {
                // The deeper routes of one slot are contiguous (they share its address bits).
                let first = i;
                while i < routes.len()
                    && u32::from(routes[i].len) > end
                    && routes[i].addr.stride(depth) == s
                {
                    i += 1;
                }
                p.children[p.vector.count_ones() as usize] = (first as u32, i as u32);
                p.vector |= 1u64 << s;
            }
        }
        // A leaf slot starts a run when its hop differs from the previous leaf slot's (or it
        // has none). Runs may span child slots, so the first leaf after a child is checked too.
        let leaf_slots = !p.vector;
        let mut cand = (edges | (p.vector << 1)) & leaf_slots;
        while cand != 0 {
            let s = cand.trailing_zeros();
            cand &= cand - 1;
            let before = leaf_slots & ((1u64 << s) - 1);
            if before == 0 || p.hops[63 - before.leading_zeros() as usize] != p.hops[s as usize] {
                p.leafvec |= 1u64 << s;
            }
        }
    }

    /// The node for painted slots `p` (see [`Fib::paint`]), its leaves and children stored.
    fn finish_node(&mut self, p: &Painted, routes: &[Route<K>], depth: u32) -> Node {
        let end = depth + STRIDE;
        let Painted {
            hops,
            children,
            vector,
            leafvec,
        } = p;
        let (vector, leafvec) = (*vector, *leafvec);
        let runs = leafvec.count_ones();
        if vector == 0 && runs <= INLINE_MAX {
            let mut packed = 0u128;
            let mut k = 0;
            for s in set_bits(leafvec) {
                match self.leaves.code(hops[s]) {
                    Some(c) => packed |= u128::from(c) << (16 * k),
                    None => break,
                }
                k += 1;
            }
            if k == runs {
                return Node {
                    vector: packed as u64,
                    leafvec,
                    base0: INLINE,
                    base1: (packed >> 64) as u32,
                };
            }
        }
        let base0 = if runs > 0 {
            self.alloc(Arena::Leaves, runs)
        } else {
            0
        };
        for (j, s) in set_bits(leafvec).enumerate() {
            self.leaves.set(base0 as usize + j, hops[s]);
        }
        let count = vector.count_ones();
        if count > 0 && self.wants_lines(p, routes, end) {
            let at = self.alloc(Arena::Lines, count);
            for (k, s) in set_bits(vector).enumerate() {
                let (a, b) = children[k];
                let sub = &routes[a as usize..b as usize];
                self.lines[at as usize + k] = match self.line_of(sub, end, hops[s]) {
                    Some(l) => l,
                    None => self.escape(sub, end, hops[s]),
                };
            }
            return Node {
                vector,
                leafvec,
                base0: base0 | RANGED,
                base1: at,
            };
        }
        let base1 = if count > 0 {
            self.alloc(Arena::Nodes, count)
        } else {
            0
        };
        for (k, s) in set_bits(vector).enumerate() {
            let (a, b) = children[k];
            let child = self.build_node(&routes[a as usize..b as usize], end, hops[s]);
            self.nodes[base1 as usize + k] = child;
        }
        Node {
            vector,
            leafvec,
            base0,
            base1,
        }
    }

    /// An escape line for a child subtree whose ranges do not fit in a line: an ordinary node
    /// for `routes` at `depth` below `inherited`.
    fn escape(&mut self, routes: &[Route<K>], depth: u32, inherited: u32) -> Line {
        let child = self.build_node(routes, depth, inherited);
        let c = self.alloc(Arena::Nodes, 1);
        self.nodes[c as usize] = child;
        Line::escape(c)
    }

    /// Whether the node painted `p` (children at depth `end`) keeps its children as lines:
    /// below the second level, with narrow leaves, and when the children whose ranges do not
    /// fit a line (escapes, one load more) hold at most half the node's routes. Nothing is
    /// stored: the lines are made again when they are stored (cheaper than holding up to 64
    /// of them here: with a vector of lines per node the 220k IPv6 build took 2.7× as long
    /// as without lines, against 2.2× now).
    fn wants_lines(&self, p: &Painted, routes: &[Route<K>], end: u32) -> bool {
        if end <= DIRECT_BITS + STRIDE || !matches!(self.leaves, Leaves::Narrow { .. }) {
            return false;
        }
        let mut escaped = 0;
        for (k, s) in set_bits(p.vector).enumerate() {
            let (a, b) = p.children[k];
            if Self::ranges(&routes[a as usize..b as usize], end, p.hops[s]).is_none() {
                escaped += (b - a) as usize;
                if escaped * 2 > routes.len() {
                    return false;
                }
            }
        }
        true
    }

    /// The subtree of `routes` (sorted, all longer than `depth`, inside one range at `depth`)
    /// below the covering hop `inherited` as a [`Line`], when its ranges fit in one.
    fn line_of(&mut self, routes: &[Route<K>], depth: u32, inherited: u32) -> Option<Line> {
        let (v, n) = Self::ranges(routes, depth, inherited)?;
        let mut line = Line::default();
        for k in 0..LINE_BOUNDS + 1 {
            let (pos, hop) = v[k.min(n - 1)];
            line.codes[k] = self.leaves.code(hop)?;
            if k >= 1 && k < n {
                line.bounds[k - 1] = pos as u32;
            }
        }
        Some(line)
    }

    /// The ranges of [`Fib::line_of`]'s subtree as (start, hop) and their number, equal
    /// neighbours merged, when they fit a line.
    #[allow(clippy::type_complexity)]
    fn ranges(
        routes: &[Route<K>],
        depth: u32,
        inherited: u32,
    ) -> Option<([(u64, u32); RANGES_CAP], usize)> {
        const CAP: usize = RANGES_CAP;
        const END: u64 = 1 << 32;
        // Ranges as (start, hop), equal neighbours merged.
        let mut v: [(u64, u32); CAP] = [(0, inherited); CAP];
        let mut n = 1;
        let emit = |v: &mut [(u64, u32); CAP], n: &mut usize, pos: u64, hop: u32| -> bool {
            let last = v[*n - 1];
            if last.0 == pos {
                v[*n - 1].1 = hop;
                if *n >= 2 && v[*n - 2].1 == hop {
                    *n -= 1;
                }
            } else if last.1 != hop {
                if *n == CAP {
                    return false;
                }
                v[*n] = (pos, hop);
                *n += 1;
            }
            true
        };
        // Enclosing routes (end, hop), the slot's inherited hop at the bottom.
        let mut stack: [(u64, u32); 40] = [(END, inherited); 40];
        let mut top = 0;
        for r in routes {
            let len = u32::from(r.len);
            if len > depth + 32 || top + 1 == stack.len() {
                return None;
            }
            let s = r.addr.bits64(depth) >> 32;
            let e = s + (1u64 << (depth + 32 - len));
            while stack[top].0 <= s {
                top -= 1;
                if !emit(&mut v, &mut n, stack[top + 1].0, stack[top].1) {
                    return None;
                }
            }
            if !emit(&mut v, &mut n, s, r.hop) {
                return None;
            }
            top += 1;
            stack[top] = (e, r.hop);
        }
        while top > 0 {
            top -= 1;
            if stack[top + 1].0 < END && !emit(&mut v, &mut n, stack[top + 1].0, stack[top].1) {
                return None;
            }
        }
        (n <= LINE_BOUNDS + 1).then_some((v, n))
    }
}

/// The arenas blocks are allocated from and freed to.
#[derive(Debug, Clone, Copy)]
enum Arena {
    Nodes,
    Leaves,
    Lines,
}

/// A node's slots worked out from its routes, before anything is stored.
struct Painted {
    /// Each slot's next hop (for a child slot: the hop the child inherits).
    hops: [u32; 64],
    /// Per child, in slot order: its range of the routes.
    children: [(u32, u32); 64],
    vector: u64,
    leafvec: u64,
}

impl Painted {
    /// No routes yet: every slot a leaf of `inherited`.
    #[inline(always)]
    fn new(inherited: u32) -> Self {
        Painted {
            hops: [inherited; 64],
            children: [(0, 0); 64],
            vector: 0,
            leafvec: 0,
        }
    }
}

/// The positions of the set bits of `m`, lowest first.
#[inline(always)]
fn set_bits(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let s = m.trailing_zeros() as usize;
            m &= m - 1;
            s
        })
    })
}
