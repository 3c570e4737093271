//! How the FIB is laid out in memory: direct entries, flat blocks, 64-way nodes, range
//! lines and the leaf array, with their encodings.

use rustc_hash::FxHashMap;

use crate::NO_ROUTE;

/// Direct entry flag: the entry leads to a node; without it the low 31 bits are a next hop.
pub(super) const NODE: u32 = 0x8000_0000;
/// With [`NODE`]: the node is a flat block (see [`Fib`]'s `flat`) whose word offset is the
/// low [`FLAT_OFFSET_BITS`] bits and whose size in words minus one the 6 bits above (the
/// offset of its last word, which the batch lookup prefetches with its first); without it
/// the low 30 bits index `nodes` (2^30 nodes would be 24 GiB: the allocation fails long
/// before an index could reach this bit).
pub(super) const FLAT: u32 = 0x4000_0000;
pub(super) const FLAT_OFFSET_BITS: u32 = 24;
pub(super) const FLAT_OFFSET: u32 = (1 << FLAT_OFFSET_BITS) - 1;
/// Most runs of a flat block; also the most runs of any node.
pub(super) const FLAT_RUNS_MAX: u32 = 64;

/// Words (`u64`) of a flat block with `runs` leaf runs: the leaf vector, then 4 codes a word.
#[inline(always)]
pub(super) fn flat_words(runs: u32) -> u32 {
    1 + runs.div_ceil(4)
}

/// The direct entry of a flat block at word `at` with `runs` runs.
#[inline(always)]
pub(super) fn flat_entry(at: u32, runs: u32) -> u32 {
    NODE | FLAT | ((flat_words(runs) - 1) << FLAT_OFFSET_BITS) | at
}

/// Word offset and word count of the flat block a direct entry with [`FLAT`] leads to.
#[inline(always)]
pub(super) fn flat_block(e: u32) -> (usize, usize) {
    let last = (e >> FLAT_OFFSET_BITS) & 0x3F;
    ((e & FLAT_OFFSET) as usize, last as usize + 1)
}

/// The flat arena as 16-bit leaf codes: the codes of the block at word `at` start at code
/// `4 * (at + 1)`. Read and written through this view (never by shifting words), so the
/// layout is the same on any byte order.
#[inline(always)]
pub(super) fn flat_codes(flat: &[u64]) -> &[u16] {
    bytemuck::cast_slice(flat)
}

/// The leaf code slot `v` of the flat block at word `at` resolves to (0 outside the arena:
/// never, for entries this module wrote). `codes` is [`flat_codes`] of `flat`.
#[inline(always)]
pub(super) fn flat_code(flat: &[u64], codes: &[u16], at: usize, v: u32) -> u16 {
    let leafvec = flat.get(at).copied().unwrap_or(1);
    // Runs up to and including slot `v`: the run's index plus one (the leaf vector always
    // has bit 0 set, so at least one).
    let runs = (leafvec << (63 - v)).count_ones() as usize;
    codes.get(4 * at + 3 + runs).copied().unwrap_or(0)
}
/// "No route" as stored in a direct entry (31 bits).
pub(super) const DIRECT_NONE: u32 = 0x7FFF_FFFF;

#[inline(always)]
pub(super) fn decode_direct(e: u32) -> u32 {
    if e == DIRECT_NONE {
        NO_ROUTE
    } else {
        e
    }
}

#[inline(always)]
pub(super) fn encode_direct(hop: u32) -> u32 {
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
    pub(super) vector: u64,
    pub(super) leafvec: u64,
    pub(super) base0: u32,
    pub(super) base1: u32,
}

/// A node's size: a prefetch of its first and last byte brings all of it.
pub(super) const NODE_BYTES: usize = std::mem::size_of::<Node>();

/// `base0` of a node whose leaf codes are inline.
pub(super) const INLINE: u32 = 0x8000_0000;
/// With [`INLINE`]: a prefix node (see [`Node::prefix`]).
pub(super) const PREFIX: u32 = 0x4000_0000;
/// Without [`INLINE`] (the same bit as [`PREFIX`]): the node's children are [`Line`]s, not
/// nodes; the rest of `base0` is the leaf base.
pub(super) const RANGED: u32 = PREFIX;
/// Most routes in a direct slot for which a delete that empties a child of the first-level
/// node rebuilds the whole slot (see [`Fib::update_long`]).
pub(super) const COLLAPSE_MAX: usize = 64;
/// Most runs a node keeps inline: 6 codes of 16 bits in `vector` (4) and `base1` (2).
pub(super) const INLINE_MAX: u32 = 6;

impl Node {
    #[inline(always)]
    pub(super) fn inline(&self) -> bool {
        self.base0 & INLINE != 0
    }

    /// Inline leaf code `i` (< `INLINE_MAX`).
    #[inline(always)]
    pub(super) fn inline_code(&self, i: u32) -> u16 {
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
    pub(super) fn prefix(a: (u64, u32, u16), b: (u64, u32, u16), outside: u16) -> Node {
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
    pub(super) fn inline_leaf(&self, bits: u64, v: u32) -> u16 {
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
    pub(super) fn is_prefix(&self) -> bool {
        self.base0 & (INLINE | PREFIX) == INLINE | PREFIX
    }

    /// Asks for the node's cache lines: both of them when it straddles two (a 24-byte node
    /// does at 2 of every 8 positions, and then its second line was a demand miss).
    #[inline(always)]
    pub(super) fn prefetch(&self) {
        crate::arch::prefetch(&self.vector);
        crate::arch::prefetch(&self.base1);
    }

    /// Whether slot `v` holds a child node.
    #[inline(always)]
    pub(super) fn has_child(&self, v: u32) -> bool {
        !self.inline() && self.vector & (1u64 << v) != 0
    }

    /// Index of slot `v`'s child (a child slot) in the node or line arena.
    #[inline(always)]
    pub(super) fn child(&self, v: u32) -> u32 {
        self.base1 + (self.vector << (63 - v)).count_ones() - 1
    }

    /// Index among the runs of the leaf run covering slot `v` (a leaf slot).
    #[inline(always)]
    pub(super) fn run(&self, v: u32) -> u32 {
        (self.leafvec << (63 - v)).count_ones().wrapping_sub(1)
    }
}

/// Boundaries a [`Line`] holds.
pub(super) const LINE_BOUNDS: usize = 10;
/// Every code of an escape [`Line`]; narrow leaves stop one code short of it.
pub(super) const ESCAPE: u16 = u16::MAX;
/// Ranges worked out before giving up on a line (a few past what fits: merges at the end
/// can still bring the count down).
pub(super) const RANGES_CAP: usize = 2 * LINE_BOUNDS + 4;

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
pub(super) struct Line {
    pub(super) bounds: [u32; LINE_BOUNDS],
    pub(super) codes: [u16; LINE_BOUNDS + 1],
    pub(super) spare: u16,
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
    pub(super) fn escape(node: u32) -> Line {
        let mut l = Line {
            codes: [ESCAPE; LINE_BOUNDS + 1],
            ..Line::default()
        };
        l.bounds[0] = node;
        l
    }

    /// The node an escape leads to.
    #[inline(always)]
    pub(super) fn escaped(&self) -> Option<u32> {
        (self.codes[0] == ESCAPE).then_some(self.bounds[0])
    }

    /// The leaf code for the 32 address bits `x` past the line's depth.
    #[inline(always)]
    pub(super) fn code(&self, x: u32) -> u16 {
        self.codes[(crate::arch::bounds_at_or_below(&self.bounds, x) as usize).min(LINE_BOUNDS)]
    }
}

/// The leaf array: 16-bit codes into a next-hop table when there are at most 65 535 codes
/// ("no route" and 65 534 distinct next hops; routers' FIBs have tens), halving the leaves'
/// footprint; the hops themselves otherwise.
#[derive(Debug, Clone)]
pub(super) enum Leaves {
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
    pub(super) fn new(wide: bool) -> Self {
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
    pub(super) fn get(&self, j: u32) -> u32 {
        match self {
            Leaves::Narrow { codes, hops, .. } => hops[codes[j as usize] as usize],
            Leaves::Wide(v) => v[j as usize],
        }
    }

    /// Asks for leaf `j`'s cache line (a hint: nothing is read).
    #[inline(always)]
    pub(super) fn prefetch(&self, j: u32) {
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
    pub(super) fn hop_of(&self, c: u16) -> u32 {
        match self {
            Leaves::Narrow { hops, .. } => hops.get(usize::from(c)).copied().unwrap_or(NO_ROUTE),
            Leaves::Wide(_) => NO_ROUTE,
        }
    }

    /// `n` more leaves at the end; returns the first index.
    pub(super) fn grow(&mut self, n: usize) -> u32 {
        let start = self.len();
        match self {
            Leaves::Narrow { codes, .. } => codes.resize(start + n, 0),
            Leaves::Wide(v) => v.resize(start + n, 0),
        }
        start as u32
    }

    pub(super) fn set(&mut self, j: usize, hop: u32) {
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
    pub(super) fn code(&mut self, hop: u32) -> Option<u16> {
        if let Leaves::Narrow { small, .. } = self {
            if let Some(&c) = small.get(hop as usize).filter(|&&c| c != u16::MAX) {
                return Some(c);
            }
        }
        self.new_code(hop)
    }

    /// [`Leaves::code`] for a hop not seen yet, or one above `SMALL_HOPS`.
    #[cold]
    pub(super) fn new_code(&mut self, hop: u32) -> Option<u16> {
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

    pub(super) fn len(&self) -> usize {
        match self {
            Leaves::Narrow { codes, .. } => codes.len(),
            Leaves::Wide(v) => v.len(),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Leaves::Narrow { codes, hops, .. } => codes.len() * 2 + hops.len() * 4,
            Leaves::Wide(v) => v.len() * 4,
        }
    }

    pub(super) fn overflowed(&self) -> bool {
        matches!(self, Leaves::Narrow { overflow: true, .. })
    }
}

/// Next hops below this get their leaf code from a plain array instead of a hash map.
pub(super) const SMALL_HOPS: usize = 1 << 16;
