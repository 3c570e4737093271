//! Building nodes, prefix nodes, flat blocks and range lines from a slot's routes.

use super::*;
use crate::key::Key;
use crate::rib::Route;
use crate::{DIRECT_BITS, STRIDE};

impl<K: Key> Fib<K> {
    /// The direct entry for a slot with `routes` (all longer than the direct stride, sorted)
    /// below the covering next hop `inherited`: a flat block when the first-level node has
    /// no children (and leaves are narrow), else a node.
    pub(super) fn build_root(&mut self, routes: &[Route<K>], inherited: u32) -> u32 {
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
    pub(super) fn alloc_flat(&mut self, words: u32) -> Option<u32> {
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
    pub(super) fn build_node(&mut self, routes: &[Route<K>], depth: u32, inherited: u32) -> Node {
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
    pub(super) fn prefix_node(
        &mut self,
        routes: &[Route<K>],
        depth: u32,
        inherited: u32,
    ) -> Option<Node> {
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
    pub(super) fn paint(p: &mut Painted, routes: &[Route<K>], depth: u32) {
        let end = depth + STRIDE;
        // Slots where the painted next hop may differ from the slot before: the edges of every
        // painted range. Only these (and the first leaf after a child) can start a leaf run,
        // so runs are found without a pass over all 64 slots (this loop was most of a
        // rebuild's time: perf, docs/benchmarks-history.md).
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
    pub(super) fn finish_node(&mut self, p: &Painted, routes: &[Route<K>], depth: u32) -> Node {
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
    pub(super) fn escape(&mut self, routes: &[Route<K>], depth: u32, inherited: u32) -> Line {
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
    pub(super) fn wants_lines(&self, p: &Painted, routes: &[Route<K>], end: u32) -> bool {
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
    pub(super) fn line_of(
        &mut self,
        routes: &[Route<K>],
        depth: u32,
        inherited: u32,
    ) -> Option<Line> {
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
    pub(super) fn ranges(
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

/// A node's slots worked out from its routes, before anything is stored.
pub(super) struct Painted {
    /// Each slot's next hop (for a child slot: the hop the child inherits).
    pub(super) hops: [u32; 64],
    /// Per child, in slot order: its range of the routes.
    pub(super) children: [(u32, u32); 64],
    pub(super) vector: u64,
    pub(super) leafvec: u64,
}

impl Painted {
    /// No routes yet: every slot a leaf of `inherited`.
    #[inline(always)]
    pub(super) fn new(inherited: u32) -> Self {
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
pub(super) fn set_bits(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let s = m.trailing_zeros() as usize;
            m &= m - 1;
            s
        })
    })
}
