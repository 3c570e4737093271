//! A worker's latency histogram, published now and then for readers on other threads (the
//! `--metrics` endpoint) — the worker keeps recording into its own; a copy is made at most
//! every [`PUBLISH_EVERY_NS`], and never waits for a lock a reader holds (the copy is then
//! made next time).

use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram;

/// Copies are made at most this often.
pub const PUBLISH_EVERY_NS: u64 = 200_000_000;

/// The last copy a worker published; clones share it.
#[derive(Debug, Clone, Default)]
pub struct LatencyShare {
    inner: Arc<Mutex<Option<Histogram<u64>>>>,
}

impl LatencyShare {
    /// Nothing published yet.
    pub fn new() -> LatencyShare {
        LatencyShare::default()
    }

    /// The last copy published (`None`: none yet).
    pub fn read(&self) -> Option<Histogram<u64>> {
        self.inner.lock().ok()?.clone()
    }

    fn store(&self, h: &Histogram<u64>) {
        if let Ok(mut g) = self.inner.try_lock() {
            match g.as_mut() {
                // The same bounds every time: a reset and an add reuse the counts array.
                Some(copy) => {
                    copy.reset();
                    if copy.add(h).is_err() {
                        *copy = h.clone();
                    }
                }
                None => *g = Some(h.clone()),
            }
        }
    }
}

/// What a worker keeps to publish its histogram on time.
#[derive(Debug, Clone, Default)]
pub struct Publisher {
    share: Option<LatencyShare>,
    next_ns: u64,
}

impl Publisher {
    /// Publishes into `share`.
    pub fn to(share: LatencyShare) -> Publisher {
        Publisher {
            share: Some(share),
            next_ns: 0,
        }
    }

    /// Publishes `h` if a share is set and the last copy is [`PUBLISH_EVERY_NS`] old
    /// (`now_ns`: CLOCK_MONOTONIC), or at once with `force` (the loop's end).
    pub fn offer(&mut self, now_ns: u64, force: bool, h: &Histogram<u64>) {
        if !self.due(now_ns, force) {
            return;
        }
        if let Some(s) = &self.share {
            s.store(h);
            self.next_ns = now_ns.saturating_add(PUBLISH_EVERY_NS);
        }
    }

    /// Whether a copy would be made now (for a worker that must first assemble it).
    pub fn due(&self, now_ns: u64, force: bool) -> bool {
        self.share.is_some() && (force || now_ns >= self.next_ns)
    }

    /// Whether anyone reads what this publishes.
    pub fn wanted(&self) -> bool {
        self.share.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_follow_the_worker_at_most_as_often_as_asked() {
        let share = LatencyShare::new();
        let mut p = Publisher::to(share.clone());
        let mut h = Histogram::<u64>::new(3).expect("histogram");
        assert!(share.read().is_none());
        h.record(1_000).expect("record");
        p.offer(1, false, &h);
        assert_eq!(share.read().map(|c| c.len()), Some(1));
        h.record(2_000).expect("record");
        // Too soon: the copy stays as it was …
        p.offer(2, false, &h);
        assert_eq!(share.read().map(|c| c.len()), Some(1));
        // … until its time, or the end.
        p.offer(1 + PUBLISH_EVERY_NS, false, &h);
        let c = share.read().expect("a copy");
        assert_eq!((c.len(), c.max()), (2, h.max()));
        h.record(3_000).expect("record");
        p.offer(3 + PUBLISH_EVERY_NS, true, &h);
        assert_eq!(share.read().map(|c| c.len()), Some(3));
        // Without a share nothing is kept.
        let mut none = Publisher::default();
        assert!(!none.wanted());
        none.offer(0, true, &h);
    }
}
