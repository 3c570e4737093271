//! Keeping a [`Fib`] in step with a [`Rib`] and handing snapshots to readers.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::fib::Fib;
use crate::key::{Key, Prefix, PrefixError};
use crate::rib::Rib;
use crate::DIRECT_BITS;

/// Owns the table and its lookup structure; applies each change to both (only the direct
/// slots the change touches are rebuilt) and publishes snapshots to [`FibReader`]s.
#[derive(Debug)]
pub struct FibWriter<K: Key> {
    rib: Rib<K>,
    fib: Fib<K>,
    shared: Arc<ArcSwap<Fib<K>>>,
    dirty: Vec<u32>,
    rebuilds: u64,
}

/// A reader's handle: [`FibReader::load`] returns the latest published snapshot without
/// locking; a writer publishing meanwhile never waits for it and never changes it.
#[derive(Debug, Clone)]
pub struct FibReader<K: Key> {
    shared: Arc<ArcSwap<Fib<K>>>,
}

impl<K: Key> FibReader<K> {
    /// The latest published snapshot (hold it for a batch of lookups, not forever: the
    /// memory of an old snapshot is freed when its last holder drops it).
    pub fn load(&self) -> arc_swap::Guard<Arc<Fib<K>>> {
        self.shared.load()
    }
}

impl<K: Key> FibWriter<K> {
    /// Builds the lookup structure for `rib` and publishes it.
    pub fn new(mut rib: Rib<K>) -> Self {
        rib.track_changes();
        let fib = Fib::build(&rib);
        let shared = Arc::new(ArcSwap::from_pointee(fib.clone()));
        FibWriter {
            rib,
            fib,
            shared,
            dirty: Vec::new(),
            rebuilds: 0,
        }
    }

    /// Inserts or replaces a route; returns the next hop it replaced. Visible to
    /// [`FibWriter::fib`] at once and to readers at the next [`FibWriter::publish`].
    pub fn insert(&mut self, prefix: Prefix<K>, next_hop: u32) -> Result<Option<u32>, PrefixError> {
        self.prefetch(prefix);
        let old = self.rib.insert(prefix, next_hop)?;
        if old != Some(next_hop) {
            self.apply(prefix);
        }
        Ok(old)
    }

    /// Deletes a route; returns its next hop, or `None` when it was not there.
    pub fn remove(&mut self, prefix: Prefix<K>) -> Option<u32> {
        self.prefetch(prefix);
        let old = self.rib.remove(prefix);
        if old.is_some() {
            self.apply(prefix);
        }
        old
    }

    /// Applies many changes at once — `Some(next_hop)` inserts or replaces, `None` deletes —
    /// in address order, rebuilding each touched direct slot once. A burst of updates (a BGP
    /// session coming up, a peer going down) goes in several times faster this way than
    /// route by route, because neighbouring routes share memory. Returns how many routes
    /// were added (new prefixes) and removed. Stops at the first refused route, with the
    /// changes before it applied.
    pub fn apply_batch(
        &mut self,
        changes: &mut [(Prefix<K>, Option<u32>)],
    ) -> Result<(usize, usize), PrefixError> {
        changes.sort_unstable_by_key(|c| c.0);
        let (mut added, mut removed) = (0, 0);
        let mut result = Ok(());
        // Each change's slot list is a separate allocation, so the first touch of each was
        // the burst's main cost (perf): ask for list headers 16 changes ahead and the lists
        // themselves 8 ahead, as slot rebuilds do.
        const AHEAD: usize = 8;
        for (i, &(p, hop)) in changes.iter().enumerate() {
            if let Some(c) = changes.get(i + 2 * AHEAD) {
                self.rib.prefetch_chunk_header(c.0.addr().slot());
            }
            if let Some(c) = changes.get(i + AHEAD) {
                self.rib.prefetch_chunk(c.0.addr().slot());
            }
            match hop {
                Some(h) => match self.rib.insert(p, h) {
                    Ok(None) => added += 1,
                    Ok(Some(_)) => {}
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                },
                None => removed += usize::from(self.rib.remove(p).is_some()),
            }
        }
        self.rib.take_dirty(&mut self.dirty);
        self.dirty.sort_unstable();
        self.dirty.dedup();
        let dirty = &self.dirty;
        self.fib.set_slots(&self.rib, dirty.len(), |i| dirty[i]);
        self.compact_if_needed();
        result.map(|_| (added, removed))
    }

    /// Makes every change so far visible to readers (one atomic pointer swap; the copy of the
    /// structure it publishes costs about a memcpy of [`Fib::stats`]`.bytes`).
    pub fn publish(&mut self) {
        self.shared.store(Arc::new(self.fib.clone()));
    }

    /// A handle for a reader thread.
    pub fn reader(&self) -> FibReader<K> {
        FibReader {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The table.
    pub fn rib(&self) -> &Rib<K> {
        &self.rib
    }

    /// The writer's own, always current lookup structure.
    pub fn fib(&self) -> &Fib<K> {
        &self.fib
    }

    /// How many times garbage from incremental updates was reclaimed by a full rebuild.
    pub fn rebuilds(&self) -> u64 {
        self.rebuilds
    }

    /// One update is a chain of cache misses (slot list header, list, direct entry, root
    /// node, …): asking for the FIB's lines before the table's are read lets the two chains
    /// overlap.
    fn prefetch(&self, prefix: Prefix<K>) {
        let slot = prefix.addr().slot();
        self.rib.prefetch_chunk_header(slot);
        self.fib.prefetch_root(slot);
    }

    fn apply(&mut self, prefix: Prefix<K>) {
        self.rib.take_dirty(&mut self.dirty);
        if u32::from(prefix.len()) > DIRECT_BITS {
            self.fib.update_long(&self.rib, prefix.addr(), prefix.len());
        } else {
            for &slot in &self.dirty {
                self.fib.set_slot(&self.rib, slot as usize);
            }
        }
        self.compact_if_needed();
    }

    fn compact_if_needed(&mut self) {
        if self.fib.wants_compaction() {
            self.fib = Fib::build(&self.rib);
            self.rebuilds += 1;
        }
    }
}
