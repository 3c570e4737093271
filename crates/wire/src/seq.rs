//! Receiver-side accounting of the flowlane header's sequence numbers, per flow, in the spirit
//! of RFC 4737: a packet is *reordered* when its sequence number is below the next expected one
//! (the highest seen + 1); a *duplicate* repeats one already counted; *lost* is what was sent
//! (or, without that figure, everything up to the highest seen) minus the distinct ones received.
//!
//! The 32-bit wire sequence number is extended to 64 bits against the highest seen, so a flow
//! may run past 2³² packets. Duplicates are recognised within a window of [`WINDOW`] sequence
//! numbers below the highest; a packet older than that is counted as reordered (`late`).

/// Sequence numbers below the highest seen for which duplicates are still recognised.
/// 4096: 512 bytes of bitmap per flow, allocated on the first packet, so 65 536 flows cost
/// 32 MiB at most and flows that never see a packet cost nothing.
pub const WINDOW: u64 = 1 << 12;

/// One flow's receive accounting.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    /// Highest extended sequence number seen.
    max: Option<u64>,
    /// bit `s % WINDOW` set: `s` was received (for `s` within the window).
    seen: Vec<u64>,
    /// Distinct packets received.
    pub unique: u64,
    /// Packets that repeated one already received.
    pub duplicates: u64,
    /// Packets that arrived after a higher sequence number.
    pub reordered: u64,
    /// Reordered packets too old for duplicate detection (also counted in `reordered`).
    pub late: u64,
}

/// What one packet was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Next or ahead (a gap before it may still fill in).
    InOrder,
    /// Below the highest seen, first time.
    Reordered,
    /// Seen before.
    Duplicate,
}

impl SeqTracker {
    fn bit(&mut self, s: u64) -> (&mut u64, u64) {
        if self.seen.is_empty() {
            self.seen = vec![0; (WINDOW / 64) as usize];
        }
        let i = (s % WINDOW) as usize;
        (&mut self.seen[i / 64], 1u64 << (i % 64))
    }

    /// Extends a 32-bit wire sequence number against the highest seen.
    pub fn extend(&self, seq32: u32) -> u64 {
        match self.max {
            None => seq32 as u64,
            Some(m) => {
                let d = seq32.wrapping_sub(m as u32) as i32 as i64;
                (m as i64 + d).max(0) as u64
            }
        }
    }

    /// Records a packet.
    pub fn record(&mut self, seq32: u32) -> Arrival {
        let s = self.extend(seq32);
        match self.max {
            Some(m) if s <= m => {
                if m - s >= WINDOW {
                    self.reordered += 1;
                    self.late += 1;
                    self.unique += 1;
                    return Arrival::Reordered;
                }
                let (w, b) = self.bit(s);
                if *w & b != 0 {
                    self.duplicates += 1;
                    return Arrival::Duplicate;
                }
                *w |= b;
                self.unique += 1;
                self.reordered += 1;
                Arrival::Reordered
            }
            _ => {
                // Clear the bits of the numbers skipped or re-entering the window (at most one
                // window's worth, however far ahead `s` jumped).
                let from = self.max.map_or(0, |m| m + 1);
                let from = from.max(s.saturating_sub(WINDOW - 1));
                for x in from..s {
                    let (w, b) = self.bit(x);
                    *w &= !b;
                }
                let (w, b) = self.bit(s);
                *w |= b;
                self.max = Some(s);
                self.unique += 1;
                Arrival::InOrder
            }
        }
    }

    /// Highest sequence number seen + 1 (0 when none).
    pub fn expected(&self) -> u64 {
        self.max.map_or(0, |m| m + 1)
    }

    /// Lost packets given how many were sent (`None`: up to the highest seen; losses after the
    /// last packet received cannot be seen then).
    pub fn lost(&self, sent: Option<u64>) -> u64 {
        sent.unwrap_or_else(|| self.expected())
            .saturating_sub(self.unique)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: &[u32]) -> SeqTracker {
        let mut t = SeqTracker::default();
        for &s in seqs {
            t.record(s);
        }
        t
    }

    #[test]
    fn in_order_loss_reorder_duplicates() {
        let t = run(&[0, 1, 2, 3]);
        assert_eq!(
            (t.unique, t.reordered, t.duplicates, t.lost(Some(4))),
            (4, 0, 0, 0)
        );
        // 2 arrives after 3: one reordered packet (RFC 4737 counts the late one).
        let t = run(&[0, 1, 3, 2, 4]);
        assert_eq!(
            (t.unique, t.reordered, t.duplicates, t.lost(None)),
            (5, 1, 0, 0)
        );
        // A gap that never fills: lost.
        let t = run(&[0, 1, 3, 4]);
        assert_eq!((t.reordered, t.lost(Some(5))), (0, 1));
        assert_eq!(t.lost(Some(7)), 3, "tail loss needs the sent count");
        let t = run(&[0, 1, 1, 2, 0]);
        assert_eq!((t.unique, t.duplicates, t.reordered), (3, 2, 0));
    }

    #[test]
    fn sequence_numbers_wrap_past_32_bits() {
        let mut t = SeqTracker::default();
        let start = u32::MAX - 2;
        for i in 0..6u32 {
            assert_eq!(t.record(start.wrapping_add(i)), Arrival::InOrder);
        }
        assert_eq!(t.expected(), u32::MAX as u64 - 2 + 6);
        assert_eq!(t.record(start.wrapping_add(4)), Arrival::Duplicate);
        assert_eq!(t.unique, 6);
    }

    #[test]
    fn window_edges() {
        let mut t = SeqTracker::default();
        t.record(0);
        t.record((WINDOW + 10) as u32);
        // 0 is out of the window now: its repeat counts as a late reordered packet.
        assert_eq!(t.record(0), Arrival::Reordered);
        assert_eq!(t.late, 1);
        // 11 is inside the window and was never seen.
        assert_eq!(t.record(11), Arrival::Reordered);
        assert_eq!(t.record(11), Arrival::Duplicate);
    }
}
