//! Synthetic tables with the public BGP table's shape: the prefix-length mix of the default-
//! free zone, many prefixes nested inside shorter covering ones (more-specifics), next hops
//! shared between a covering prefix and its more-specifics. Seeded and deterministic: the
//! same `(count, seed, next_hops)` gives the same table on every machine for a given
//! flowlane release (PCG generator; the crate versions are pinned by Cargo.lock).

use std::collections::HashSet;

use rand::{Rng, RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::key::{Key, Prefix};

/// Percent of prefixes per length, IPv4 (the listed big lengths from the public table; the
/// rest spread over /8–/32).
pub const IPV4_MIX: &[(u8, f64)] = &[
    (24, 59.6),
    (22, 12.0),
    (23, 10.7),
    (21, 5.6),
    (20, 4.7),
    (19, 2.8),
    (18, 1.5),
    (16, 1.5),
    (17, 0.6),
    (15, 0.15),
    (14, 0.15),
    (13, 0.1),
    (12, 0.08),
    (11, 0.04),
    (10, 0.03),
    (9, 0.01),
    (8, 0.02),
    (25, 0.1),
    (26, 0.08),
    (27, 0.06),
    (28, 0.05),
    (29, 0.04),
    (30, 0.03),
    (31, 0.01),
    (32, 0.05),
];

/// Percent of prefixes per length, IPv6.
pub const IPV6_MIX: &[(u8, f64)] = &[
    (48, 47.0),
    (32, 14.0),
    (44, 9.0),
    (40, 8.4),
    (36, 3.7),
    (29, 2.7),
    (46, 2.5),
    (47, 1.5),
    (45, 1.0),
    (42, 1.2),
    (43, 0.5),
    (41, 0.3),
    (38, 1.0),
    (39, 0.3),
    (37, 0.3),
    (34, 0.6),
    (35, 0.4),
    (33, 0.8),
    (30, 0.6),
    (31, 0.4),
    (28, 0.8),
    (27, 0.2),
    (26, 0.1),
    (25, 0.1),
    (24, 0.3),
    (20, 0.1),
    (19, 0.1),
    (56, 1.0),
    (64, 0.8),
    (52, 0.2),
    (128, 0.1),
];

/// Share of prefixes placed inside an earlier, shorter prefix.
const NESTED: f64 = 0.6;
/// Share of nested prefixes that keep their covering prefix's next hop.
const SAME_HOP: f64 = 0.5;

/// `count` IPv4 routes with next hops `0..next_hops` (at least 1). Unicast space only
/// (first octet 1–223 except 10 and 127).
pub fn ipv4(count: usize, seed: u64, next_hops: u32) -> Vec<(Prefix<u32>, u32)> {
    generate(count, seed, next_hops, IPV4_MIX, |rng| loop {
        let a: u32 = rng.next_u32();
        let first = a >> 24;
        if (1..=223).contains(&first) && first != 10 && first != 127 {
            break a;
        }
    })
}

/// `count` IPv6 routes inside the regional registries' big blocks of 2000::/3 (2001::/16,
/// 2400::/12, 2600::/12, 2800::/12, 2a00::/12, 2c00::/12), as in the public table.
pub fn ipv6(count: usize, seed: u64, next_hops: u32) -> Vec<(Prefix<u128>, u32)> {
    const BLOCKS: [(u128, u8); 6] = [
        (0x2001, 16),
        (0x2400, 12),
        (0x2600, 12),
        (0x2800, 12),
        (0x2a00, 12),
        (0x2c00, 12),
    ];
    generate(count, seed, next_hops, IPV6_MIX, |rng| {
        let (top, len) = BLOCKS[rng.random_range(0..BLOCKS.len())];
        let r = u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
        (top << 112) | (r >> len)
    })
}

/// Per-length counts summing to `count`: rounded shares, the remainder on the largest class,
/// and no class above what its address space can hold (the excess moves to the largest).
fn counts(count: usize, mix: &[(u8, f64)]) -> Vec<(u8, usize)> {
    let total: f64 = mix.iter().map(|m| m.1).sum();
    let mut out: Vec<(u8, usize)> = mix
        .iter()
        .map(|&(len, pct)| {
            let want = (count as f64 * pct / total).round() as usize;
            // Keep well under the space so random placement terminates quickly.
            let space = if u32::from(len) >= usize::BITS - 2 {
                usize::MAX
            } else {
                1usize << len
            };
            (len, want.min(space / 8))
        })
        .collect();
    let sum: usize = out.iter().map(|c| c.1).sum();
    if let Some(first) = out.first_mut() {
        first.1 = (first.1 + count).saturating_sub(sum);
    }
    out.sort_by_key(|c| c.0);
    out
}

fn generate<K: Key>(
    count: usize,
    seed: u64,
    next_hops: u32,
    mix: &[(u8, f64)],
    mut random_addr: impl FnMut(&mut Pcg64Mcg) -> K,
) -> Vec<(Prefix<K>, u32)> {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let next_hops = next_hops.max(1);
    let mut seen: HashSet<Prefix<K>> = HashSet::with_capacity(count);
    let mut out: Vec<(Prefix<K>, u32)> = Vec::with_capacity(count);
    // Lengths in ascending order, so every earlier prefix can cover a later one.
    // Prefixes one length could not hold (its space, in the blocks used, is full) move on to
    // the next longer length, so the total stays `count`.
    let mut carry = 0;
    for (len, n) in counts(count, mix) {
        let n = n + carry;
        let shorter = out.len();
        let mut made = 0;
        let mut misses = 0u32;
        while made < n {
            if misses > 10_000 {
                break;
            }
            let nested = shorter > 0 && rng.random_bool(NESTED);
            let mut placed = None;
            if nested {
                // A few tries inside random covering prefixes, then anywhere.
                for _ in 0..4 {
                    let (parent, parent_hop) = out[rng.random_range(0..shorter)];
                    let r: K = random_addr(&mut rng);
                    let inside = mix_bits(parent.addr(), r, parent.len());
                    let p = Prefix::covering(inside, len);
                    if !seen.contains(&p) {
                        let hop = if rng.random_bool(SAME_HOP) {
                            parent_hop
                        } else {
                            rng.random_range(0..next_hops)
                        };
                        placed = Some((p, hop));
                        break;
                    }
                }
            }
            let (p, hop) = match placed {
                Some(x) => x,
                None => {
                    let p = Prefix::covering(random_addr(&mut rng), len);
                    if seen.contains(&p) {
                        misses += 1;
                        continue;
                    }
                    (p, rng.random_range(0..next_hops))
                }
            };
            seen.insert(p);
            out.push((p, hop));
            made += 1;
            misses = 0;
        }
        carry = n - made;
    }
    // Shuffle so that files and insert sequences are not sorted by length.
    for i in (1..out.len()).rev() {
        let j = rng.random_range(0..=i);
        out.swap(i, j);
    }
    out
}

/// Address streams for lookup benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    /// Uniform over the whole IPv4 space; for IPv6 uniform over 2000::/3 (global unicast,
    /// where all routes are — elsewhere every lookup would end in the first array).
    Uniform,
    /// Inside routed prefixes: a route picked at random, its host bits random.
    Inside,
    /// `n` distinct inside-routed addresses, repeated (a cache-resident working set).
    WorkingSet(usize),
}

/// `n` IPv4 addresses of the given traffic pattern over `routes`.
pub fn traffic_v4(t: Traffic, routes: &[(Prefix<u32>, u32)], n: usize, seed: u64) -> Vec<u32> {
    traffic(t, routes, n, seed, |r| r.next_u32())
}

/// `n` IPv6 addresses of the given traffic pattern over `routes`.
pub fn traffic_v6(t: Traffic, routes: &[(Prefix<u128>, u32)], n: usize, seed: u64) -> Vec<u128> {
    traffic(t, routes, n, seed, |r| {
        let x = u128::from(r.next_u64()) << 64 | u128::from(r.next_u64());
        (x >> 3) | (1u128 << 125)
    })
}

fn traffic<K: Key>(
    t: Traffic,
    routes: &[(Prefix<K>, u32)],
    n: usize,
    seed: u64,
    uniform: impl Fn(&mut Pcg64Mcg) -> K,
) -> Vec<K> {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let inside = |rng: &mut Pcg64Mcg| {
        let r = uniform(rng);
        if routes.is_empty() {
            return r;
        }
        let p = routes[rng.random_range(0..routes.len())].0;
        mix_bits(p.addr(), r, p.len())
    };
    match t {
        Traffic::Uniform => (0..n).map(|_| uniform(&mut rng)).collect(),
        Traffic::Inside => (0..n).map(|_| inside(&mut rng)).collect(),
        Traffic::WorkingSet(k) => {
            let set: Vec<K> = (0..k.max(1)).map(|_| inside(&mut rng)).collect();
            set.iter().copied().cycle().take(n).collect()
        }
    }
}

/// The first `len` bits of `parent`, the rest from `random`.
fn mix_bits<K: Key>(parent: K, random: K, len: u8) -> K {
    parent | (random ^ random.mask(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_whose_space_is_full_hands_its_share_on() {
        // 1M IPv6 prefixes: the /19 and /20 shares exceed the /19s and /20s the six
        // registry blocks hold; generation still ends, with exactly the count asked for.
        let t = ipv6(1_000_000, 1, 4);
        assert_eq!(t.len(), 1_000_000);
        let set: HashSet<_> = t.iter().map(|r| r.0).collect();
        assert_eq!(set.len(), t.len());
    }

    #[test]
    fn deterministic_exact_count_and_mix() {
        let a = ipv4(20_000, 1, 16);
        let b = ipv4(20_000, 1, 16);
        assert_eq!(a, b, "same seed, same table");
        assert_ne!(a, ipv4(20_000, 2, 16));
        assert_eq!(a.len(), 20_000);
        let set: HashSet<_> = a.iter().map(|r| r.0).collect();
        assert_eq!(set.len(), a.len(), "no duplicate prefixes");
        let share = |len| a.iter().filter(|r| r.0.len() == len).count() as f64 / a.len() as f64;
        assert!((share(24) - 0.596).abs() < 0.01, "/24 share {}", share(24));
        assert!((share(22) - 0.12).abs() < 0.005);
        assert!(a.iter().all(|r| r.1 < 16));
        // More-specifics: a good share of prefixes lies inside a shorter one of the table.
        let rib = crate::Rib::from_routes(a.iter().copied()).expect("test input is valid");
        let nested = a
            .iter()
            .filter(|(p, _)| (0..p.len()).any(|l| rib.get(Prefix::covering(p.addr(), l)).is_some()))
            .count();
        assert!(nested as f64 > 0.3 * a.len() as f64, "nested {nested}");
    }

    #[test]
    fn ipv6_mix() {
        let t = ipv6(10_000, 7, 8);
        assert_eq!(t.len(), 10_000);
        let share = |len| t.iter().filter(|r| r.0.len() == len).count() as f64 / t.len() as f64;
        assert!((share(48) - 0.47).abs() < 0.01);
        assert!((share(32) - 0.14).abs() < 0.01);
        assert!(
            t.iter().all(|(p, _)| p.addr() >> 125 == 1),
            "inside 2000::/3"
        );
    }
}
