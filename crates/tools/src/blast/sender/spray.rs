//! pktgen's per-packet ranges for the frame senders: each flow (a header flow id) sends
//! `flowlen` frames to one destination (address × port, from the ranges), then draws the next
//! — counting up through the ranges or at random — and the MACs count up per frame through
//! their counts. The frame keeps its flow id and sequence numbers across its destinations, so
//! a receiver still accounts loss and order per flow; each new destination is a new 5-tuple,
//! counted here as a flow started.

use std::net::IpAddr;

use flowlane_wire::Readdress;
use rand::{Rng, SeedableRng};

/// One worker's share of a run's ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SprayJob {
    /// First destination address, as a number, and how many (at most 2^64).
    pub dst_base: u128,
    pub dst_count: u64,
    pub v6: bool,
    /// First destination port and how many.
    pub dport_base: u16,
    pub dport_count: u32,
    /// Draw at random (else count up).
    pub random: bool,
    /// Frames per destination before the next draw (≥ 1).
    pub flowlen: u64,
    /// The MACs' first values and counts (each counts up in its low 32 bits, per frame).
    pub src_mac: [u8; 6],
    pub src_macs: u32,
    pub dst_mac: [u8; 6],
    pub dst_macs: u32,
    /// Seed of this worker's draws (random).
    pub seed: u64,
    /// Counting up: this worker's first index into the ranges and its stride (the worker
    /// count), so that the workers together count through every destination in turn.
    pub start: u64,
    pub stride: u64,
}

impl SprayJob {
    /// Destinations in the ranges (address × port), capped at u64::MAX.
    pub fn space(&self) -> u64 {
        self.dst_count.saturating_mul(u64::from(self.dport_count))
    }
}

/// A worker's draws: the current destination of each of its flows.
#[derive(Debug)]
pub struct Sprayer {
    job: SprayJob,
    rng: rand::rngs::SmallRng,
    /// Per flow: its destination and the frames it still sends there.
    current: Vec<(Readdress, u64)>,
    /// Draws made (counting up: the next index is start + draws × stride).
    draws: u64,
    /// Frames addressed (the MACs' counter).
    frames: u64,
}

impl Sprayer {
    /// Draws for `flows` flows.
    pub fn new(job: SprayJob, flows: usize) -> Sprayer {
        let blank = Readdress {
            dst: IpAddr::from([0u8; 4]),
            dport: 0,
            src_mac: job.src_mac,
            dst_mac: job.dst_mac,
        };
        Sprayer {
            rng: rand::rngs::SmallRng::seed_from_u64(job.seed),
            current: vec![(blank, 0); flows],
            draws: 0,
            frames: 0,
            job,
        }
    }

    /// Destinations drawn so far: flows started (each a new 5-tuple, pktgen's flows).
    pub fn flows_started(&self) -> u64 {
        self.draws
    }

    /// Where flow `f`'s next frame goes.
    #[inline]
    pub fn next(&mut self, f: usize) -> Option<&Readdress> {
        let space = self.job.space().max(1);
        let frames = self.frames;
        self.frames += 1;
        let (src_macs, dst_macs) = (self.job.src_macs.max(1), self.job.dst_macs.max(1));
        let (src_mac, dst_mac) = (self.job.src_mac, self.job.dst_mac);
        let cur = self.current.get_mut(f)?;
        if cur.1 == 0 {
            let i = if self.job.random {
                // Lemire's multiply-shift: uniform enough over any space up to 2^64.
                ((u128::from(self.rng.next_u64()) * u128::from(space)) >> 64) as u64
            } else {
                self.job
                    .start
                    .wrapping_add(self.draws.wrapping_mul(self.job.stride))
                    % space
            };
            self.draws += 1;
            let ports = u64::from(self.job.dport_count.max(1));
            let (a, p) = (i / ports, i % ports);
            let v = self.job.dst_base.wrapping_add(u128::from(a));
            cur.0.dst = if self.job.v6 {
                IpAddr::from(std::net::Ipv6Addr::from(v))
            } else {
                IpAddr::from(std::net::Ipv4Addr::from(v as u32))
            };
            cur.0.dport = self.job.dport_base.wrapping_add(p as u16);
            cur.1 = self.job.flowlen.max(1);
        }
        cur.1 -= 1;
        cur.0.src_mac = nth_mac(src_mac, (frames % u64::from(src_macs)) as u32);
        cur.0.dst_mac = nth_mac(dst_mac, (frames % u64::from(dst_macs)) as u32);
        Some(&cur.0)
    }
}

/// `base` plus `n`, counted in the MAC's low 32 bits (wrapping there: the vendor part stays).
pub fn nth_mac(base: [u8; 6], n: u32) -> [u8; 6] {
    let low = u32::from_be_bytes([base[2], base[3], base[4], base[5]]).wrapping_add(n);
    let mut m = base;
    m[2..6].copy_from_slice(&low.to_be_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(random: bool, flowlen: u64) -> SprayJob {
        SprayJob {
            dst_base: u128::from(u32::from(std::net::Ipv4Addr::new(198, 18, 3, 0))),
            dst_count: 4,
            v6: false,
            dport_base: 9000,
            dport_count: 2,
            random,
            flowlen,
            src_mac: [2, 0, 0, 0, 0, 0xff],
            src_macs: 3,
            dst_mac: [2, 0, 0, 0, 1, 0],
            dst_macs: 1,
            seed: 7,
            start: 0,
            stride: 1,
        }
    }

    #[test]
    fn counting_up_walks_ports_then_addresses_and_keeps_each_for_flowlen_frames() {
        let mut s = Sprayer::new(job(false, 2), 1);
        let got: Vec<String> = (0..18)
            .map(|_| {
                let r = s.next(0).expect("a flow");
                format!("{}:{}", r.dst, r.dport)
            })
            .collect();
        let want: Vec<String> = (0..9)
            .flat_map(|i| {
                let d = format!("198.18.3.{}:{}", (i % 8) / 2, 9000 + i % 2);
                [d.clone(), d]
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(s.flows_started(), 9);
        assert!(s.next(1).is_none(), "one flow only");
    }

    #[test]
    fn macs_count_up_per_frame_in_their_low_bits() {
        let mut s = Sprayer::new(job(false, 1), 1);
        let macs: Vec<[u8; 6]> = (0..4).map(|_| s.next(0).expect("a flow").src_mac).collect();
        assert_eq!(
            macs,
            [
                [2, 0, 0, 0, 0, 0xff],
                [2, 0, 0, 0, 1, 0],
                [2, 0, 0, 0, 1, 1],
                [2, 0, 0, 0, 0, 0xff]
            ]
        );
        assert_eq!(
            nth_mac([2, 0, 0xff, 0xff, 0xff, 0xff], 1),
            [2, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn random_draws_stay_in_the_ranges_and_cover_them() {
        let mut s = Sprayer::new(job(true, 1), 2);
        let mut seen = std::collections::HashSet::new();
        for i in 0..2000 {
            let r = *s.next(i % 2).expect("a flow");
            let IpAddr::V4(a) = r.dst else { panic!("IPv4") };
            assert!((0..4).contains(&(a.octets()[3])), "{a}");
            assert!((9000..9002).contains(&r.dport));
            seen.insert((a, r.dport));
        }
        assert_eq!(seen.len(), 8, "every destination drawn");
        assert_eq!(s.flows_started(), 2000);
    }

    /// Workers counting up with their start and stride draw every destination once between
    /// them before any comes again.
    #[test]
    fn workers_counting_up_share_the_ranges() {
        let mut all = Vec::new();
        for w in 0..3u64 {
            let mut j = job(false, 1);
            j.dst_count = 6;
            (j.start, j.stride) = (w, 3);
            let mut s = Sprayer::new(j, 1);
            for _ in 0..4 {
                let r = s.next(0).expect("a flow");
                all.push((r.dst, r.dport));
            }
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 12);
    }
}
