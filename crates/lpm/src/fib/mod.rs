//! The frozen lookup structure: an 18-bit direct-pointing array over 64-way Poptrie nodes,
//! childless first-level nodes stored flat, IPv6 first-level nodes expanded to 64 entries.
//!
//! One file per concern: `layout.rs` (what is stored and how it is encoded), `build.rs`
//! (nodes, flat blocks and lines from routes), `update.rs` (in-place changes and the block
//! allocator), `lookup.rs` (single and batch lookups); the structure and its sizes here.

mod build;
mod layout;
mod lookup;
mod update;

use layout::*;
use update::*;

use crate::key::Key;
use crate::rib::Rib;
use crate::DIRECT_BITS;

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
}
