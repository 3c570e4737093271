//! Updates in place: a changed direct slot or long prefix rebuilds only what it paints, in
//! blocks freed and reused by exact size.

use super::*;
use crate::key::Key;
use crate::rib::Rib;
use crate::{DIRECT_BITS, STRIDE};

impl<K: Key> Fib<K> {
    /// The direct entry for first-level node `root`: the node itself, or with [`Fib::EXPAND`]
    /// its expansion into a block of `mid` (a freed one, or new at the end).
    pub(super) fn root_entry(&mut self, root: u32) -> u32 {
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

    pub(super) fn check_overflow(&mut self, rib: &Rib<K>) {
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
    pub(super) fn free_below(&mut self, at: u32) {
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
    pub(super) fn free_line(&mut self, at: u32) {
        if let Some(c) = self.lines[at as usize].escaped() {
            self.free_below(c);
            self.free_block(Arena::Nodes, c, 1);
        }
    }

    pub(super) fn free_block(&mut self, arena: Arena, start: u32, n: u32) {
        if let Arena::Lines = arena {
            // Freed lines are blank, so that [`FibStats::escapes`] counts live ones only.
            let at = start as usize;
            self.lines[at..at + n as usize].fill(Line::default());
        }
        let (list, garbage) = self.arena(arena);
        list[n as usize].push(start);
        *garbage += n as usize;
    }

    pub(super) fn arena(&mut self, arena: Arena) -> (&mut Vec<Vec<u32>>, &mut usize) {
        match arena {
            Arena::Nodes => (&mut self.free_nodes, &mut self.garbage_nodes),
            Arena::Leaves => (&mut self.free_leaves, &mut self.garbage_leaves),
            Arena::Lines => (&mut self.free_lines, &mut self.garbage_lines),
        }
    }

    /// A block of `n` nodes, leaves or lines: a freed one of that size, or new at the end.
    pub(super) fn alloc(&mut self, arena: Arena, n: u32) -> u32 {
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
}

/// The arenas blocks are allocated from and freed to.
#[derive(Debug, Clone, Copy)]
pub(super) enum Arena {
    Nodes,
    Leaves,
    Lines,
}
