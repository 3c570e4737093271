//! Token-bucket pacing on a monotonic clock given in nanoseconds (the caller reads the clock, so
//! this is pure and testable). Credit accrues at the rate; at most `burst` packets may leave at
//! once, and credit beyond a burst is not banked, so a stall is not followed by a flood.

/// Paces one sender.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// Nanoseconds per packet, in 1/1024 ns (so rates above 1 Gpps keep precision).
    step: u64,
    /// Time (1/1024 ns) the next packet is due.
    next: u64,
    burst: u64,
}

const SCALE: u64 = 1024;

impl Pacer {
    /// `pps` packets per second (> 0), bursts of at most `burst`, starting at `now_ns`.
    pub fn new(pps: f64, burst: u32, now_ns: u64) -> Pacer {
        let step = ((1e9 * SCALE as f64) / pps.max(1e-3)).round().max(1.0) as u64;
        Pacer {
            step,
            next: now_ns.saturating_mul(SCALE),
            burst: burst.max(1) as u64,
        }
    }

    /// Packets that may leave at `now_ns` (up to `max` and the burst). The caller reports what
    /// it really sent with [`Pacer::sent`].
    #[inline]
    pub fn allowed(&mut self, now_ns: u64, max: usize) -> usize {
        let now = now_ns.saturating_mul(SCALE);
        if now < self.next {
            return 0;
        }
        // Do not bank more than one burst of credit.
        let floor = now.saturating_sub(self.step * (self.burst - 1));
        if self.next < floor {
            self.next = floor;
        }
        let due = (now - self.next) / self.step + 1;
        due.min(self.burst).min(max as u64) as usize
    }

    /// Records `n` packets sent.
    #[inline]
    pub fn sent(&mut self, n: usize) {
        self.next += self.step * n as u64;
    }

    /// Nanoseconds from `now_ns` until the next packet is due (0 when one is due now).
    pub fn wait_ns(&self, now_ns: u64) -> u64 {
        self.next.saturating_sub(now_ns.saturating_mul(SCALE)) / SCALE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulated sender polling every `tick` ns for `secs` seconds: packets sent.
    fn simulate(pps: f64, burst: u32, tick: u64, secs: u64) -> u64 {
        let mut p = Pacer::new(pps, burst, 1_000);
        let mut sent = 0u64;
        let mut now = 1_000u64;
        while now < 1_000 + secs * 1_000_000_000 {
            let n = p.allowed(now, 64);
            p.sent(n);
            sent += n as u64;
            now += tick;
        }
        sent
    }

    #[test]
    fn rate_is_exact_over_time_whatever_the_poll_interval() {
        for tick in [100, 1_000, 50_000, 300_000] {
            let n = simulate(50_000.0, 32, tick, 2);
            assert!((99_990..=100_010).contains(&n), "tick {tick}: {n}");
        }
        assert_eq!(simulate(3.0, 1, 1_000_000, 2), 6);
    }

    #[test]
    fn bursts_are_bounded_and_stalls_not_banked() {
        let mut p = Pacer::new(1_000_000.0, 8, 0);
        // A 1 ms stall would bank 1000 packets; only one burst may leave.
        assert_eq!(p.allowed(1_000_000, 64), 8);
        p.sent(8);
        assert_eq!(p.allowed(1_000_000, 64), 0);
        assert_eq!(p.wait_ns(1_000_000), 1_000);
        assert_eq!(p.allowed(1_001_000, 64), 1);
    }
}
