//! A per-core flow table for IPv4 and IPv6 5-tuples (the TRASH idea: one lookup on the full
//! key), with bounded memory set at creation, expiry in O(1) per flow on a hashed timer
//! wheel, TCP close tracking (FIN or RST → the closing timeout), eviction when full by a
//! stated policy, and `rtstat`-style counters. Pure: no sockets, no clocks — every call that
//! needs the time takes it.
//!
//! ```
//! use flowlane_flowtable::{Config, FlowKey, FlowTable, UDP};
//! let mut t: FlowTable<u64> = FlowTable::new(&Config::new(1000)).expect("table");
//! let k = FlowKey::v4([198, 18, 0, 1].into(), [198, 18, 1, 2].into(), 1234, 9, UDP);
//! *t.upsert(&k, 0).value += 1;
//! *t.upsert(&k, 1_000_000).value += 1;
//! assert_eq!(t.get(&k), Some(&2));
//! let mut gone = Vec::new();
//! t.expire(40_000_000_000, |key, packets, _| gone.push((*key, packets)));
//! assert_eq!(gone, vec![(k, 2)]);
//! ```

#![deny(unsafe_code)]

mod key;
mod prefetch;
pub mod reasm;
mod table;
mod tags;

pub use key::{FlowKey, TableKey, V4Key, TCP, UDP};
pub use table::{Class, Config, ConfigError, FlowTable, Stats, Upsert, CLASSES, MAX_KICKS, SLOTS};

#[cfg(test)]
mod tests;
