//! # flowlane-rss — the RSS engine
//!
//! Layer: pure computation. No sockets, no files, no clocks; bytes in, numbers out.
//!
//! * [`Key`]: Toeplitz keys (40–52 bytes), parsing, generation, analysis (period, entropy).
//! * [`toeplitz`]: the hash — bit-serial [`toeplitz::reference`], table-driven
//!   [`Toeplitz`], a carry-less (PCLMULQDQ) single path and an AVX-512 GFNI/VPCLMULQDQ
//!   batch path, picked at run time. Every path
//!   passes the 16 published verification values ([`vectors`]).
//! * [`Tuple`]: flows in the byte layout NICs hash (IPv4/IPv6, 2- or 4-tuple), with the NIC
//!   models of symmetric hashing ([`Symmetric`]).
//! * [`queue`]: hash → queue models: RETA, `% n`, Linux RPS, FreeBSD buckets.
//! * [`pick`]: exact inverse — tuples that land on chosen queues, by linear algebra over GF(2).
//! * [`ethtool`]: what a saved `ethtool -x` says: table, key, hash function, transformation.
//! * [`analysis`]: how evenly a key spreads a population over a model's queues.
//!
//! Guarantees: no function here panics on any input (keys, tuples, files) — errors are small
//! `Copy`/`Clone` enums. `unsafe` is denied except in the two x86-64 SIMD modules, where every
//! block carries a `// SAFETY:` comment.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod analysis;
pub mod ethtool;
mod gf2;
pub mod key;
pub mod pick;
pub mod queue;
pub mod toeplitz;
pub mod tuple;
pub mod vectors;
pub mod verify;

pub use gf2::{rank as gf2_rank, XorBasis};
pub use key::{Key, KeyError};
pub use pick::{pick, PickSpec};
pub use queue::{FreeBsdBuckets, QueueModel, Reta};
pub use toeplitz::{Backend, Toeplitz};
pub use tuple::{Symmetric, Tuple, TupleKind};
