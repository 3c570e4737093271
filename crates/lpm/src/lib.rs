//! # flowlane-lpm — longest-prefix match for IPv4 and IPv6
//!
//! Layer: pure computation. No sockets, files or clocks. `#![deny(unsafe_code)]`, allowed in
//! one place only: `arch.rs`, two `core::arch` uses for the batch lookup, each measured
//! necessary (docs/benchmarks-history.md): a cache prefetch hint (`PREFETCHT0`, which cannot fault;
//! 1.7–2.8× on batch lookups) and a range line's ten comparisons as three SSE4.1 compares
//! and a population count (IPv6 203 → 176 instructions a lookup).
//! Mechanism apart from policy: a mutable [`Rib`] (insert, delete, replace, exact-match get)
//! apart from the frozen lookup structure [`Fib`] built from it, and a [`FibWriter`] that
//! keeps the two in step and publishes snapshots to any number of [`FibReader`]s without ever
//! stopping them.
//!
//! ## The lookup structure, and why this one
//! [`Fib`] is a Poptrie (Asai & Ohara, SIGCOMM 2015): an 18-bit *direct pointing* array
//! (2^18 `u32`, 1 MiB) whose entries are either a resolved next hop or the index of a 64-way
//! trie node; each node covers the next 6 address bits with two 64-bit vectors — `vector`
//! (which of the 64 slots hold a child node) and `leafvec` (where a new run of equal next hops
//! starts) — so children and leaves are stored contiguously and found with one `popcnt`.
//! Leaves are pushed (every slot resolves to its longest match), so a lookup never
//! backtracks. An IPv4 /24 is resolved by the direct array plus one node (18 + 6 = 24).
//!
//! Five departures from the paper, all measured (docs/benchmarks-history.md):
//! - **Flat first-level nodes.** A node a direct entry leads to that has no children — 96%
//!   of them on a BGP-shaped IPv4 table, where a /18 holds a few /24s — is stored as its leaf
//!   vector followed by its runs' 16-bit leaf codes, and the direct entry carries the block's
//!   offset and size. A /24 lookup is then direct entry → leaf vector and code (mostly
//!   one cache line; the batch lookup prefetches its first and last line): no child
//!   vector, no base, no choice between inline and array leaves. 950k IPv4 prefixes: 6.96 → 5.53 MiB, batch
//!   lookups inside routed prefixes 0.7–0.8× → 1.12–1.24× DIR-24-8 in the same run (one
//!   noisy pair 0.77×) on a Zen 1 host. The batch resolves a group's flat blocks in a
//!   second scan of its direct entries, once all their lines are on the way: on a Zen 3
//!   host (32 MiB L3) 1.5 → 1.8× DIR-24-8 (medians of six alternated pairs).
//! - **Prefix nodes** below the first level: a node whose subtree holds one or two routes,
//!   one of them reaching past the node's 6 bits, keeps the routes themselves (their bits
//!   from the node's depth on, lengths and leaf codes) and a lookup compares instead of
//!   walking on. On a BGP-shaped IPv6 table most nodes below /30 hold one or two routes, so
//!   a /48 under them is two or three nodes and a leaf shorter: 220k IPv6 prefixes 9.79 →
//!   5.36 MiB, dependent lookups ~1.7×, single 1.5–2×, batch 1.25–1.46× (same-process
//!   pairs).
//! - **Range lines** below the second level: a node at /24 or deeper may keep its children
//!   as 64-byte lines instead of nodes, each the child subtree's address ranges — up to 10
//!   boundaries (the 32 address bits past the child's depth) and 11 leaf codes. A lookup
//!   counts the boundaries at or below its address bits and is done: one cache line where a
//!   /48 under a /30 walked a /30 node, often a /36 node, and a leaf. A child whose ranges do
//!   not fit (more boundaries, or a route more than 32 bits deeper) is an *escape* to an
//!   ordinary node; a node keeps lines only while its escapes hold at most half its routes.
//!   On the 220k IPv6 table 84% of inside lookups end in a line, and a lookup makes 3.2
//!   dependent loads instead of 3.8: batch lookups inside routed prefixes 1.04–1.26× (median
//!   1.13×, old and new structure in one process), from ~0.45 to ~0.51 of IPv4 DIR-24-8;
//!   5.36 → 7.58 MiB; the build 2.2× and updates ~15% slower; single lookups on a cached
//!   working set 0.91–0.93×. IPv4 tables get no lines (their nodes below /18 are few, and
//!   the first level's children never become lines).
//! - **Expanded roots** for IPv6: an IPv6 table uses few direct slots (324 of 2^18 on the
//!   220k table), nearly all with a first-level node with children, through which every
//!   lookup made a pass. Each such node is expanded into 64 entries (256 bytes, 81 KiB in
//!   all: they stay in cache), slot `v`'s entry a next hop or the child; the batch lookup
//!   reads it in the direct pass, so the first node pass is at /24. Single lookups inside
//!   routed prefixes 1.07–1.18×, batches on a cached working set 1.08×, batches inside
//!   0.99–1.05× with groups of 32 and 1.06–1.10× with groups of 128 (same process). The
//!   node stays beside its expansion for updates, which rebuild both together (a node below
//!   the first level is rebuilt in place, so its parent's expansion keeps pointing at it).
//! - **Inline leaves** below the first level: a node with no children and at most 6 runs
//!   keeps its runs' codes in the bytes its child vector and child base would take, so
//!   lookups ending there need no load from the leaf array.
//!
//! The alternatives, measured on the same generated 950k-prefix table (see docs/benchmarks-history.md,
//! `flowlane route bench`): DIR-24-8 (DPDK's `rte_lpm`, [`Dir24_8`] here as the baseline)
//! needs a 64 MiB first-level table that does not stay in cache, and is slower on traffic
//! that spreads over the table; a binary search over ranges (DXR) trades memory for a
//! data-dependent search of ~log2(n) steps. Poptrie fits the whole table in a few MiB and
//! keeps lookups to two or three dependent loads.
//!
//! ## Updates
//! Every prefix longer than 18 bits lives inside exactly one direct slot; an update rebuilds
//! only that slot's subtree (appending new nodes, leaving the old ones as counted garbage) and
//! rewrites one direct entry. Shorter prefixes repaint the range of direct slots they cover.
//! Garbage is reclaimed by a full rebuild once it outgrows the live structure.
//! [`FibWriter::publish`] hands readers a new immutable snapshot through an atomic pointer
//! swap (`arc-swap`), so readers never wait and never see a half-applied update.
//!
//! ## Results
//! A lookup returns the next-hop index (`u32`) of the longest matching prefix, or "no route"
//! ([`None`] from [`Fib::lookup`], [`NO_ROUTE`] from [`Fib::lookup_batch`]). A default route
//! (`0.0.0.0/0`, `::/0`) is an ordinary prefix of length 0, so it and "no route" are distinct.
//! Next hops are `0..=MAX_NEXT_HOP`; the top values are reserved for the encoding.
//!
//! Guarantees: nothing here panics on any input (addresses, prefixes, table text); errors are
//! small enums that say what was wrong ([`PrefixError`], [`LoadError`]).

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod arch;
mod dir24;
mod fib;
pub mod gen;
mod key;
pub mod load;
pub mod reference;
mod rib;
mod writer;

/// At most 80 bytes of an input token, cut on a character and marked `…` where cut: what an
/// error quotes (a 1 GiB line was once quoted whole).
pub(crate) fn excerpt(s: &str) -> std::borrow::Cow<'_, str> {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return s.into();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len()).into()
}

pub use dir24::{Block, Dir24_8};
pub use fib::{Fib, FibStats};
pub use key::{Key, Prefix, PrefixError};
pub use load::{LoadError, Table};
pub use rib::Rib;
pub use writer::{FibReader, FibWriter};

/// Returned by the batch lookups for an address no prefix covers.
pub const NO_ROUTE: u32 = u32::MAX;
/// The largest next-hop index a route may carry (`2^31 - 2`); larger values are reserved.
pub const MAX_NEXT_HOP: u32 = 0x7FFF_FFFE;

/// Bits resolved by the direct-pointing array.
pub(crate) const DIRECT_BITS: u32 = 18;
/// Bits resolved by each trie node.
pub(crate) const STRIDE: u32 = 6;
