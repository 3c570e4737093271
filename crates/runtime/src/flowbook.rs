//! The per-flow book both receivers of flowlane traffic keep — blast's echo accounting and the
//! sink: per flow, the sequence numbers seen (loss, reordering, duplicates), and one latency
//! histogram over all of them, from the transmit time in every header. One type, so the
//! forwarder and the RFC 2544 tester account the same way.

use flowlane_wire::seq::SeqTracker;
use hdrhistogram::Histogram;

/// Sequence accounting per flow and latency over all flows.
#[derive(Debug, Clone)]
pub struct FlowBook {
    /// The id of `flows[0]`.
    first: u16,
    /// Per flow id − `first`.
    flows: Vec<SeqTracker>,
    /// A book for a known range of flows never grows; an open one grows to the highest id.
    open: bool,
    /// Latency, ns (1 ns to 100 s, 3 significant digits; larger values saturate).
    latency: Histogram<u64>,
    /// Packets stamped later than they arrived: the sender's clock is not this host's.
    clock_skew: u64,
    /// Only these flow ids (inclusive) are timed; the others are accounted without latency
    /// (a probe's latency through a flood of other flows).
    timed: (u16, u16),
}

/// What [`FlowBook::record`] made of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Accounted, with its latency.
    Timed,
    /// Accounted, but stamped after it arrived: no latency.
    Skewed,
    /// Not a flow of this book.
    Foreign,
    /// Accounted, not timed (outside [`FlowBook::time_only`]'s flows).
    Untimed,
}

impl FlowBook {
    fn with(first: u16, flows: usize, open: bool) -> FlowBook {
        FlowBook {
            first,
            flows: vec![SeqTracker::default(); flows],
            open,
            latency: Histogram::new_with_bounds(1, 100_000_000_000, 3)
                .expect("constant histogram bounds are valid"),
            clock_skew: 0,
            timed: (0, u16::MAX),
        }
    }

    /// Times only flows `lo..=hi` from now on.
    pub fn time_only(&mut self, lo: u16, hi: u16) {
        self.timed = (lo, hi);
    }

    /// A book for the `count` flows from id `first` on (a sender's own flows).
    pub fn for_flows(first: u16, count: usize) -> FlowBook {
        FlowBook::with(first, count, false)
    }

    /// A book for any flow id (a receiver of someone else's traffic), grown as ids appear.
    pub fn open() -> FlowBook {
        FlowBook::with(0, 0, true)
    }

    /// Accounts a packet of flow `flow` with sequence `seq`, sent at `tx_ns` and seen at
    /// `now_ns` (both CLOCK_MONOTONIC).
    #[inline]
    pub fn record(&mut self, flow: u16, seq: u32, tx_ns: u64, now_ns: u64) -> Recorded {
        let Some(i) = flow.checked_sub(self.first).map(usize::from) else {
            return Recorded::Foreign;
        };
        if i >= self.flows.len() {
            if !self.open {
                return Recorded::Foreign;
            }
            self.flows.resize(i + 1, SeqTracker::default());
        }
        self.flows[i].record(seq);
        if flow < self.timed.0 || flow > self.timed.1 {
            return Recorded::Untimed;
        }
        if now_ns >= tx_ns {
            self.latency.saturating_record(now_ns - tx_ns);
            Recorded::Timed
        } else {
            self.clock_skew += 1;
            Recorded::Skewed
        }
    }

    /// Flow `id`'s accounting (`None`: outside the book).
    pub fn flow(&self, id: u16) -> Option<&SeqTracker> {
        self.flows.get(usize::from(id.checked_sub(self.first)?))
    }

    /// Every flow's accounting, from the first id on.
    pub fn flows(&self) -> &[SeqTracker] {
        &self.flows
    }

    /// The latency histogram, ns.
    pub fn latency(&self) -> &Histogram<u64> {
        &self.latency
    }

    /// Packets stamped after they arrived.
    pub fn clock_skew(&self) -> u64 {
        self.clock_skew
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_senders_book_accounts_its_own_flows_only() {
        let mut b = FlowBook::for_flows(10, 2);
        assert_eq!(b.record(10, 0, 100, 1100), Recorded::Timed);
        assert_eq!(b.record(11, 0, 100, 2100), Recorded::Timed);
        assert_eq!(b.record(11, 2, 100, 2100), Recorded::Timed);
        assert_eq!(b.record(9, 0, 0, 1), Recorded::Foreign, "below the range");
        assert_eq!(b.record(12, 0, 0, 1), Recorded::Foreign, "above the range");
        assert_eq!(b.record(10, 1, 500, 400), Recorded::Skewed);
        assert_eq!(b.flow(11).map(|f| f.lost(Some(3))), Some(1));
        assert_eq!(b.flow(10).map(|f| f.unique), Some(2));
        assert_eq!(b.latency().len(), 3);
        assert_eq!(b.clock_skew(), 1);
        assert_eq!(b.flows().len(), 2);
    }

    #[test]
    fn an_open_book_grows_to_the_ids_it_sees() {
        let mut b = FlowBook::open();
        assert_eq!(b.record(5, 0, 1, 2), Recorded::Timed);
        assert_eq!(b.flows().len(), 6);
        assert_eq!(b.flow(5).map(|f| f.unique), Some(1));
        assert_eq!(b.flow(3).map(|f| f.unique), Some(0));
    }

    #[test]
    fn only_the_timed_flows_enter_the_latency() {
        let mut b = FlowBook::open();
        b.time_only(7, 7);
        assert_eq!(b.record(3, 0, 1, 1_000_000), Recorded::Untimed);
        assert_eq!(b.record(7, 0, 1, 11), Recorded::Timed);
        assert_eq!(b.flow(3).map(|f| f.unique), Some(1), "still accounted");
        assert_eq!((b.latency().len(), b.latency().max()), (1, 10));
    }
}
