//! The obviously-correct reference: one hash map per prefix length, searched from the
//! longest length down. Tests compare every fast path with it; it is slow on purpose.

use std::collections::HashMap;

use crate::key::{Key, Prefix};

/// Per-length hash maps.
#[derive(Debug, Clone)]
pub struct Reference<K: Key> {
    by_len: Vec<HashMap<K, u32>>,
}

impl<K: Key> Default for Reference<K> {
    fn default() -> Self {
        Reference {
            by_len: (0..=K::BITS).map(|_| HashMap::new()).collect(),
        }
    }
}

impl<K: Key> Reference<K> {
    /// Inserts or replaces; returns the replaced next hop.
    pub fn insert(&mut self, p: Prefix<K>, hop: u32) -> Option<u32> {
        self.by_len[p.len() as usize].insert(p.addr(), hop)
    }

    /// Deletes; returns the deleted next hop.
    pub fn remove(&mut self, p: Prefix<K>) -> Option<u32> {
        self.by_len[p.len() as usize].remove(&p.addr())
    }

    /// Longest match: the first length, from the longest, whose map holds the masked address.
    pub fn lookup(&self, addr: K) -> Option<u32> {
        (0..=K::BITS)
            .rev()
            .find_map(|len| self.by_len[len as usize].get(&addr.mask(len)).copied())
    }
}
