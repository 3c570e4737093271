//! Token-bucket pacing on a monotonic clock given in nanoseconds (the caller reads the clock, so
//! this is pure and testable). Credit accrues at the rate; at most `burst` packets may leave at
//! once. Credit is banked for at most the catch-up time (or one burst, if that is longer): a
//! sender woken late by up to that much sends what fell due, burst after burst, and the rate
//! holds; a longer stall forfeits the rest, so it is not followed by a flood — and the packets
//! forfeited are counted ([`Pacer::forfeited`]) so a report can say why a rate was missed.
//!
//! Why time and not a count: a loaded or virtual CPU wakes a sleeping thread 25-100 µs late on
//! average and a few ms late under a competing process (one scheduler slice); a fixed
//! 32-packet bucket carries 1.6 ms at 20 000/s, so every such wake-up cost the rate (8 500 of
//! 20 000/s with a thread spinning on the sender's CPU, measured) whatever the rate was.

/// Paces one sender.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// Nanoseconds per packet, in 1/1024 ns (so rates above 1 Gpps keep precision).
    step: u64,
    /// Time (1/1024 ns) the next packet is due.
    next: u64,
    burst: u64,
    /// Credit banked at most, 1/1024 ns: the catch-up time or one burst, whichever is longer.
    bank: u64,
    /// Packets whose time passed beyond the bank (a stall longer than the catch-up).
    forfeited: u64,
    /// The most a due packet waited for the sender (ns): how late it was woken, at worst.
    late_max_ns: u64,
    /// The first call has come: the schedule starts then, not when the pacer was made (a
    /// sender's set-up would otherwise be caught up at once, and its rate read too high).
    started: bool,
}

const SCALE: u64 = 1024;

impl Pacer {
    /// `pps` packets per second (> 0), bursts of at most `burst`, credit banked for at most
    /// `catch_up_ns` (or one burst), starting at `now_ns`.
    pub fn new(pps: f64, burst: u32, catch_up_ns: u64, now_ns: u64) -> Pacer {
        let step = ((1e9 * SCALE as f64) / pps.max(1e-3)).round().max(1.0) as u64;
        let burst = burst.max(1) as u64;
        Pacer {
            step,
            next: now_ns.saturating_mul(SCALE),
            burst,
            bank: (step * (burst - 1)).max(catch_up_ns.saturating_mul(SCALE)),
            forfeited: 0,
            late_max_ns: 0,
            started: false,
        }
    }

    /// The most a due packet waited for the sender to come (ns): its worst late wake-up.
    pub fn late_max_ns(&self) -> u64 {
        self.late_max_ns
    }

    /// Packets whose time passed in stalls longer than the catch-up: the rate lost to them.
    pub fn forfeited(&self) -> u64 {
        self.forfeited
    }

    /// Packets that may leave at `now_ns` (up to `max` and the burst). The caller reports what
    /// it really sent with [`Pacer::sent`].
    #[inline]
    pub fn allowed(&mut self, now_ns: u64, max: usize) -> usize {
        let now = now_ns.saturating_mul(SCALE);
        if !self.started {
            self.started = true;
            self.next = self.next.max(now);
        }
        if now < self.next {
            return 0;
        }
        self.late_max_ns = self.late_max_ns.max((now - self.next) / SCALE);
        // Bank no more than the catch-up's worth of credit; count what is given up.
        let floor = now.saturating_sub(self.bank);
        if self.next < floor {
            self.forfeited += (floor - self.next) / self.step;
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
        let mut p = Pacer::new(pps, burst, 0, 1_000);
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
        let mut p = Pacer::new(1_000_000.0, 8, 0, 0);
        assert_eq!(p.allowed(0, 64), 1);
        p.sent(1);
        // A 1 ms stall would bank 1000 packets; only one burst may leave.
        assert_eq!(p.allowed(1_000_000, 64), 8);
        p.sent(8);
        assert_eq!(p.allowed(1_000_000, 64), 0);
        assert_eq!(p.wait_ns(1_000_000), 1_000);
        assert_eq!(p.allowed(1_001_000, 64), 1);
        // The 1000 due less the burst's 8 (7 steps banked, and the one due now) were given up.
        assert_eq!(p.forfeited(), 992);
    }

    /// A sender woken late — by less than the catch-up — sends what fell due in bursts and
    /// keeps the rate; a stall beyond the catch-up loses only what lies beyond it, counted.
    #[test]
    fn late_wake_ups_within_the_catch_up_keep_the_rate() {
        // 20 000/s, bursts of 32, 10 ms of catch-up; the sender wakes every 4 ms (a loaded
        // CPU's slice) and sends bursts back to back while any are due.
        let rate = 20_000.0;
        let run = |catch_up: u64, wake: u64| {
            let mut p = Pacer::new(rate, 32, catch_up, 0);
            let (mut sent, mut now) = (0u64, 0u64);
            while now <= 1_000_000_000 {
                loop {
                    let n = p.allowed(now, 32);
                    if n == 0 {
                        break;
                    }
                    p.sent(n);
                    sent += n as u64;
                }
                now += wake;
            }
            (sent, p.forfeited())
        };
        let (sent, lost) = run(10_000_000, 4_000_000);
        assert!((19_990..=20_010).contains(&sent), "{sent}");
        assert_eq!(lost, 0);
        // Without a catch-up only a burst per wake-up: the first packet and 250 × 32, the
        // rest (12 000 of the 20 001 due) forfeited.
        let (sent, lost) = run(0, 4_000_000);
        assert_eq!(sent, 8_001);
        assert_eq!(lost, 12_000);
        // A 30 ms stall after the first packet, with 10 ms of catch-up: the 399 due from
        // 50 µs to 20 ms are given up, the 201 due from 20 to 30 ms are sent.
        let mut p = Pacer::new(rate, 32, 10_000_000, 0);
        assert_eq!(p.allowed(0, 32), 1);
        p.sent(1);
        let mut sent = 0;
        loop {
            let n = p.allowed(30_000_000, 32);
            if n == 0 {
                break;
            }
            p.sent(n);
            sent += n;
        }
        assert_eq!(p.forfeited(), 399);
        assert_eq!(sent, 201);
        assert_eq!(p.late_max_ns(), 29_950_000); // the packet due at 50 µs
    }

    /// The schedule starts at the first call: a sender that took 15 ms to set up does not
    /// send 15 ms of packets at once.
    #[test]
    fn the_schedule_starts_when_sending_does() {
        let mut p = Pacer::new(20_000.0, 32, 20_000_000, 0);
        assert_eq!(p.allowed(15_000_000, 64), 1);
        assert_eq!(p.forfeited(), 0);
        assert_eq!(p.late_max_ns(), 0);
    }
}
