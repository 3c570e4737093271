//! Every lookup path (incrementally updated, freshly built, batched, DIR-24-8) against the
//! per-length hash-map reference: hand-picked edge cases, proptests over random insert /
//! delete sequences, and a 10-million-address comparison on generated tables.
//!
//! Longer than the ~600-line rule on purpose: one file of cases against one reference, each
//! a few lines; split, the shared builders and generators would be copied or made public.

use flowlane_lpm::reference::Reference;
use flowlane_lpm::{
    gen, Block, Dir24_8, Fib, FibStats, FibWriter, Key, Prefix, Rib, MAX_NEXT_HOP, NO_ROUTE,
};
use proptest::prelude::*;
use rand::{Rng, RngExt, SeedableRng};

fn p4(s: &str) -> Prefix<u32> {
    s.parse().expect("test input is valid")
}
fn a4(s: &str) -> u32 {
    s.parse::<std::net::Ipv4Addr>()
        .expect("test input is valid")
        .into()
}
fn a6(s: &str) -> u128 {
    s.parse::<std::net::Ipv6Addr>()
        .expect("test input is valid")
        .into()
}

/// The writer's incremental structure, a fresh build and the batch API all agree with the
/// reference on `addrs`.
fn agree<K: Key>(w: &FibWriter<K>, r: &Reference<K>, addrs: &[K]) {
    let fresh = Fib::build(w.rib());
    let mut batch = vec![0u32; addrs.len()];
    let mut fresh_batch = vec![0u32; addrs.len()];
    w.fib().lookup_batch(addrs, &mut batch);
    fresh.lookup_batch(addrs, &mut fresh_batch);
    for (i, &a) in addrs.iter().enumerate() {
        let want = r.lookup(a);
        assert_eq!(w.fib().lookup(a), want, "incremental, {a:?}");
        assert_eq!(fresh.lookup(a), want, "fresh build, {a:?}");
        assert_eq!(batch[i], want.unwrap_or(NO_ROUTE), "batch, {a:?}");
        assert_eq!(
            fresh_batch[i],
            want.unwrap_or(NO_ROUTE),
            "fresh batch, {a:?}"
        );
        if let Some((p, hop)) = w.rib().matching(a) {
            assert_eq!(Some(hop), want);
            assert!(p.contains(a));
        } else {
            assert_eq!(want, None);
        }
    }
}

#[test]
fn edge_cases_v4() {
    let mut w = FibWriter::new(Rib::<u32>::new());
    let mut r = Reference::default();
    let probes: Vec<u32> = [
        "0.0.0.0",
        "255.255.255.255",
        "198.18.0.0",
        "198.18.4.128",
        "198.18.4.129",
        "198.18.4.130",
        "198.18.255.255",
        "198.19.0.1",
        "198.20.0.0",
        "198.17.255.255",
        "198.18.4.0",
        "198.18.7.255",
    ]
    .iter()
    .map(|s| a4(s))
    .collect();
    // Empty table: no route anywhere.
    agree(&w, &r, &probes);
    assert_eq!(w.fib().lookup(0), None);
    // The default route is a route, distinct from "no route".
    let ins = |w: &mut FibWriter<u32>, r: &mut Reference<u32>, p: &str, h: u32| {
        let old = w.insert(p4(p), h).expect("test input is valid");
        assert_eq!(old, r.insert(p4(p), h), "{p}");
        agree(w, r, &probes);
    };
    ins(&mut w, &mut r, "0.0.0.0/0", 0);
    assert_eq!(w.fib().lookup(a4("203.0.113.1")), Some(0));
    // Nests: /15 ⊃ /16 ⊃ /22 ⊃ /25 ⊃ /32.
    for (p, h) in [
        ("198.18.0.0/15", 1),
        ("198.18.0.0/16", 2),
        ("198.18.4.0/22", 3),
        ("198.18.4.128/25", 4),
        ("198.18.4.129/32", 5),
        ("255.255.255.255/32", 6),
    ] {
        ins(&mut w, &mut r, p, h);
    }
    assert_eq!(w.fib().lookup(a4("198.18.4.129")), Some(5));
    assert_eq!(w.fib().lookup(a4("198.18.4.130")), Some(4));
    assert_eq!(w.fib().lookup(a4("198.18.4.127")), Some(3));
    assert_eq!(w.fib().lookup(a4("198.18.8.0")), Some(2));
    assert_eq!(w.fib().lookup(a4("198.19.0.1")), Some(1));
    assert_eq!(w.fib().lookup(a4("255.255.255.255")), Some(6));
    // A duplicate insert replaces and reports the old next hop; the count does not change.
    let n = w.rib().len();
    assert_eq!(
        w.insert(p4("198.18.4.0/22"), 3)
            .expect("test input is valid"),
        Some(3)
    );
    assert_eq!(
        w.insert(p4("198.18.4.0/22"), 9)
            .expect("test input is valid"),
        Some(3)
    );
    r.insert(p4("198.18.4.0/22"), 9);
    assert_eq!(w.rib().len(), n);
    agree(&w, &r, &probes);
    // Deleting a covering prefix uncovers the next shorter one, not "no route".
    assert_eq!(w.remove(p4("198.18.0.0/16")), Some(2));
    r.remove(p4("198.18.0.0/16"));
    agree(&w, &r, &probes);
    assert_eq!(w.fib().lookup(a4("198.18.8.0")), Some(1));
    assert_eq!(w.remove(p4("198.18.0.0/16")), None, "deleting twice");
    assert_eq!(w.remove(p4("0.0.0.0/0")), Some(0));
    r.remove(p4("0.0.0.0/0"));
    agree(&w, &r, &probes);
    assert_eq!(w.fib().lookup(a4("203.0.113.1")), None);
    // Reserved next hops are refused, and the table is unchanged.
    assert!(w.insert(p4("198.18.0.0/24"), MAX_NEXT_HOP + 1).is_err());
    assert!(w.insert(p4("198.18.0.0/24"), MAX_NEXT_HOP).is_ok());
    r.insert(p4("198.18.0.0/24"), MAX_NEXT_HOP);
    agree(&w, &r, &probes);
    let d = Dir24_8::build(w.rib());
    for &a in &probes {
        assert_eq!(d.lookup(a), r.lookup(a));
    }
}

#[test]
fn edge_cases_v6() {
    let mut w = FibWriter::new(Rib::<u128>::new());
    let mut r = Reference::default();
    let probes: Vec<u128> = [
        "::",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "2001:2::",
        "2001:2::1",
        "2001:2:0:1::",
        "2001:2:ffff::",
        "2001:3::",
        "2001:2::ffff",
    ]
    .iter()
    .map(|s| a6(s))
    .collect();
    for (p, h) in [
        ("::/0", 0),
        ("2001:2::/48", 1),
        ("2001:2::/64", 2),
        ("2001:2::1/128", 3),
        ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128", 4),
        ("2001::/16", 5),
    ] {
        let p: Prefix<u128> = p.parse().expect("test input is valid");
        assert_eq!(w.insert(p, h).expect("test input is valid"), r.insert(p, h));
        agree(&w, &r, &probes);
    }
    assert_eq!(w.fib().lookup(a6("2001:2::1")), Some(3));
    assert_eq!(w.fib().lookup(a6("2001:2::2")), Some(2));
    assert_eq!(w.fib().lookup(a6("2001:2:0:1::")), Some(1));
    assert_eq!(w.fib().lookup(a6("2001:3::")), Some(5));
    assert_eq!(w.fib().lookup(a6("3000::")), Some(0));
    let p: Prefix<u128> = "2001:2::/48".parse().expect("test input is valid");
    assert_eq!(w.remove(p), Some(1));
    r.remove(p);
    agree(&w, &r, &probes);
    assert_eq!(w.fib().lookup(a6("2001:2:0:1::")), Some(5));
}

/// Random operations over prefixes cut from a few base addresses, so they nest and collide.
fn run_ops<K: Key>(bases: &[K], ops: &[(bool, usize, u8, u32)], queries: &[K]) {
    let mut w = FibWriter::new(Rib::<K>::new());
    let mut r = Reference::default();
    for &(insert, b, len, hop) in ops {
        let p = Prefix::covering(bases[b % bases.len()], len % (K::BITS + 1));
        if insert {
            assert_eq!(
                w.insert(p, hop).expect("test input is valid"),
                r.insert(p, hop)
            );
        } else {
            assert_eq!(w.remove(p), r.remove(p));
        }
    }
    // Query the bases themselves and their neighbours too: the edges of every prefix.
    let mut addrs: Vec<K> = queries.to_vec();
    addrs.extend_from_slice(bases);
    for &b in bases {
        for len in [8u8, 16, 24, 30, 47, 63, 64, 100] {
            if len < K::BITS {
                let p = Prefix::covering(b, len);
                addrs.push(p.addr());
                addrs.push(p.addr() ^ b);
            }
        }
    }
    agree(&w, &r, &addrs);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_ops_v4(bases in prop::collection::vec(any::<u32>(), 1..6),
                     ops in prop::collection::vec((prop::bool::weighted(0.7), 0usize..6, 0u8..33, 0u32..5), 0..120),
                     queries in prop::collection::vec(any::<u32>(), 0..64)) {
        run_ops(&bases, &ops, &queries);
        // DIR-24-8 on the final table.
        let mut r = Reference::default();
        let mut rib = Rib::new();
        for &(insert, b, len, hop) in &ops {
            let p = Prefix::covering(bases[b % bases.len()], len);
            if insert { r.insert(p, hop); rib.insert(p, hop).expect("test input is valid"); } else { r.remove(p); rib.remove(p); }
        }
        let d = Dir24_8::build(&rib);
        for &a in queries.iter().chain(&bases) {
            prop_assert_eq!(d.lookup(a), r.lookup(a));
        }
        // Each entry computed alone is the built one: the entries of every prefix the ops
        // touched (their first and last /24 and their neighbours) and of the queries.
        let mut entries: Vec<u32> = queries.iter().map(|&a| a >> 8).collect();
        for &(_, b, len, _) in &ops {
            let span = Dir24_8::span(Prefix::covering(bases[b % bases.len()], len));
            entries.extend([span.start.saturating_sub(1), span.start, span.end - 1, span.end.min((1 << 24) - 1)]);
        }
        for i in entries {
            prop_assert_eq!(Dir24_8::block(&rib, i), built_block(&d, i), "entry {}", i);
        }
    }

    #[test]
    fn random_ops_v6(bases in prop::collection::vec(any::<u128>(), 1..6),
                     ops in prop::collection::vec((prop::bool::weighted(0.7), 0usize..6, 0u8..129, 0u32..5), 0..120),
                     queries in prop::collection::vec(any::<u128>(), 0..64)) {
        run_ops(&bases, &ops, &queries);
    }
}

/// Entry `i` of a built DIR-24-8 as a [`Block`].
fn built_block(d: &Dir24_8, i: u32) -> Block {
    let (t24, t8) = d.tables();
    let e = t24[i as usize];
    if e & Dir24_8::EXTENDED == 0 {
        return Block::Direct(e);
    }
    let g = ((e & !Dir24_8::EXTENDED) as usize) * 256;
    let mut out = Box::new([0u32; 256]);
    out.copy_from_slice(&t8[g..g + 256]);
    Block::Group(out)
}

/// An address: half uniform, half inside a random routed prefix.
fn address<K: Key, R: Rng>(
    rng: &mut R,
    routes: &[(Prefix<K>, u32)],
    random: impl Fn(&mut R) -> K,
) -> K {
    let r = random(rng);
    if routes.is_empty() || rng.random_bool(0.5) {
        return r;
    }
    let p = routes[rng.random_range(0..routes.len())].0;
    p.addr() | (r ^ r.mask(p.len()))
}

/// Generated table, then a random mix of deletes, new inserts and replacements applied
/// through the writer, then `n` addresses compared with the reference.
fn big_comparison<K: Key>(
    table: Vec<(Prefix<K>, u32)>,
    extra: Vec<(Prefix<K>, u32)>,
    n: usize,
    random: impl Fn(&mut rand::rngs::StdRng) -> K + Copy,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut r = Reference::default();
    for &(p, h) in &table {
        r.insert(p, h);
    }
    let mut w =
        FibWriter::new(Rib::from_routes(table.iter().copied()).expect("test input is valid"));
    let mut live = table.clone();
    for (i, &(p, h)) in extra.iter().enumerate() {
        match i % 3 {
            0 if !live.is_empty() => {
                let (p, _) = live.swap_remove(rng.random_range(0..live.len()));
                assert_eq!(w.remove(p), r.remove(p));
            }
            1 if !live.is_empty() => {
                let (p, _) = live[rng.random_range(0..live.len())];
                assert_eq!(w.insert(p, h).expect("test input is valid"), r.insert(p, h));
            }
            _ => {
                assert_eq!(w.insert(p, h).expect("test input is valid"), r.insert(p, h));
                live.push((p, h));
            }
        }
    }
    w.publish();
    let reader = w.reader();
    let snapshot = reader.load();
    let fresh = Fib::build(w.rib());
    let mut addrs = vec![K::default(); 1 << 16];
    let mut out = vec![0u32; addrs.len()];
    let mut checked = 0;
    while checked < n {
        for a in addrs.iter_mut() {
            *a = address(&mut rng, &live, random);
        }
        snapshot.lookup_batch(&addrs, &mut out);
        for (i, &a) in addrs.iter().enumerate() {
            let want = r.lookup(a).unwrap_or(NO_ROUTE);
            assert_eq!(out[i], want, "{a:?}");
            if i % 8 == 0 {
                assert_eq!(fresh.lookup(a).unwrap_or(NO_ROUTE), want, "{a:?}");
            }
        }
        checked += addrs.len();
    }
}

#[test]
fn ten_million_v4_addresses_after_updates() {
    big_comparison(
        gen::ipv4(200_000, 11, 32),
        gen::ipv4(60_000, 12, 32),
        10_000_000,
        |r| r.next_u32(),
    );
}

#[test]
fn two_million_v6_addresses_after_updates() {
    big_comparison(
        gen::ipv6(50_000, 13, 32),
        gen::ipv6(15_000, 14, 32),
        2_000_000,
        |r| {
            // Mostly inside 2000::/3, where the table is.
            let x = u128::from(r.next_u64()) << 64 | u128::from(r.next_u64());
            if r.random_bool(0.9) {
                (x >> 3) | (1u128 << 125)
            } else {
                x
            }
        },
    );
}

/// Batches of every length around the batch's group size (128) and its multiples, with
/// their last, partial group padded inside the lookup: each agrees with the reference, and
/// nothing past the batch is written.
fn batch_lengths<K: Key>(
    table: Vec<(Prefix<K>, u32)>,
    random: impl Fn(&mut rand::rngs::StdRng) -> K,
) {
    let fib = Fib::build(&Rib::from_routes(table.iter().copied()).expect("test input is valid"));
    let mut r = Reference::default();
    for &(p, h) in &table {
        r.insert(p, h);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let addrs: Vec<K> = (0..600)
        .map(|i| {
            if i % 2 == 0 {
                address(&mut rng, &table, &random)
            } else {
                random(&mut rng)
            }
        })
        .collect();
    let want: Vec<u32> = addrs
        .iter()
        .map(|&a| r.lookup(a).unwrap_or(NO_ROUTE))
        .collect();
    assert!(want.iter().any(|&h| h != NO_ROUTE) && want.contains(&NO_ROUTE));
    for n in [
        0, 1, 2, 63, 127, 128, 129, 200, 255, 256, 257, 383, 384, 385, 599,
    ] {
        // Start at an odd offset too, so that groups do not line up with the table's order.
        for start in [0, 1] {
            let mut out = vec![u32::MAX - 1; n + 3];
            fib.lookup_batch(&addrs[start..start + n], &mut out[..n]);
            assert_eq!(
                &out[..n],
                &want[start..start + n],
                "length {n} from {start}"
            );
            assert_eq!(
                &out[n..],
                &[u32::MAX - 1; 3],
                "length {n}: wrote past the batch"
            );
        }
    }
}

#[test]
fn batches_of_any_length_v4() {
    batch_lengths(gen::ipv4(50_000, 21, 16), |r| r.next_u32());
}

#[test]
fn batches_of_any_length_v6() {
    batch_lengths(gen::ipv6(20_000, 22, 16), |r| {
        let x = u128::from(r.next_u64()) << 64 | u128::from(r.next_u64());
        (x >> 3) | (1u128 << 125)
    });
}

#[test]
fn dir24_8_matches_reference_on_a_generated_table() {
    let table = gen::ipv4(100_000, 5, 16);
    let mut r = Reference::default();
    for &(p, h) in &table {
        r.insert(p, h);
    }
    let d = Dir24_8::build(&Rib::from_routes(table.iter().copied()).expect("test input is valid"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    for _ in 0..1_000_000 {
        let a = address(&mut rng, &table, |r: &mut rand::rngs::StdRng| r.next_u32());
        assert_eq!(d.lookup(a), r.lookup(a));
    }
    // Entries computed one at a time (what the native router rewrites on a change) are the
    // built ones: those of every route (a /24 each at most) and of random addresses.
    let rib = Rib::from_routes(table.iter().copied()).expect("test input is valid");
    let routed = table.iter().map(|(p, _)| Dir24_8::span(*p).start);
    for i in routed.chain((0..100_000).map(|_| rng.next_u32() >> 8)) {
        assert_eq!(Dir24_8::block(&rib, i), built_block(&d, i), "entry {i}");
    }
}

/// Readers never wait for the writer and never see half an update: a reader checks that
/// each snapshot answers a probe set entirely as table A or entirely as table B while the
/// writer flips between them.
#[test]
fn readers_see_whole_snapshots() {
    let base = gen::ipv4(20_000, 3, 8);
    let flip = gen::ipv4(2_000, 4, 8);
    let mut w =
        FibWriter::new(Rib::from_routes(base.iter().copied()).expect("test input is valid"));
    let probes: Vec<u32> = flip.iter().map(|(p, _)| p.addr()).collect();
    let answers = |f: &Fib<u32>| probes.iter().map(|&a| f.lookup(a)).collect::<Vec<_>>();
    let a = answers(w.fib());
    for &(p, h) in &flip {
        w.insert(p, h + 100).expect("test input is valid");
    }
    let b = answers(w.fib());
    assert_ne!(a, b);
    for &(p, _) in &flip {
        w.remove(p);
    }
    w.publish();
    let reader = w.reader();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = std::thread::scope(|s| {
        let done2 = done.clone();
        let h = s.spawn(move || {
            let (mut seen_a, mut seen_b) = (0u32, 0u32);
            for _ in 0..1_000_000 {
                let snap = reader.load();
                let got = answers(&snap);
                if got == a {
                    seen_a += 1;
                } else if got == b {
                    seen_b += 1;
                } else {
                    panic!("a snapshot mixing two tables");
                }
                if done2.load(std::sync::atomic::Ordering::Acquire) {
                    break;
                }
            }
            (seen_a, seen_b)
        });
        for _ in 0..40 {
            for &(p, h) in &flip {
                w.insert(p, h + 100).expect("test input is valid");
            }
            w.publish();
            std::thread::yield_now();
            for &(p, _) in &flip {
                w.remove(p);
            }
            w.publish();
            std::thread::yield_now();
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        h.join().expect("test input is valid")
    });
    assert!(seen.0 + seen.1 > 0);
}

/// The sizes `route bench` prints, against structures worked out by hand.
#[test]
fn stats_count_nodes_flat_blocks_and_leaves() {
    let shape = |s: FibStats| {
        (
            s.nodes,
            s.inline_nodes,
            s.leaves,
            s.flat_nodes,
            s.flat_bytes,
        )
    };
    // One /24 in its /18: the slot's first-level node has no child, so it is a flat block:
    // the leaf vector and 3 runs' codes (none, the /24, none) in one word; 8 bytes more for
    // the arena's unused word 0.
    let mut rib = Rib::from_routes([(p4("198.18.1.0/24"), 5)]).expect("valid");
    let s = Fib::build(&rib).stats();
    assert_eq!(shape(s), (0, 0, 0, 1, 8 + 16), "{s:?}");
    // A /25 inside it turns the /24's slot of the root into a child: the root is a node (one
    // run of "none" around the child) whose leaf is in the leaf array, and the child (the
    // /25 over the /24: 2 runs) keeps its codes inline.
    rib.insert(p4("198.18.1.0/25"), 6).expect("valid");
    let s = Fib::build(&rib).stats();
    assert_eq!(shape(s), (2, 1, 1, 0, 8), "{s:?}");
    // Seven /24s two apart in one /18, hops alternating: each starts a run and the gap after
    // it another, 14 runs: a leaf vector and 4 words of codes.
    let rib = Rib::from_routes((0..7u32).map(|i| {
        (
            Prefix::covering(u32::from_be_bytes([198, 18, 2 * i as u8, 0]), 24),
            i % 2,
        )
    }))
    .expect("valid");
    let fib = Fib::build(&rib);
    assert_eq!(
        shape(fib.stats()),
        (0, 0, 0, 1, 8 + 40),
        "{:?}",
        fib.stats()
    );
    for i in 0..14u8 {
        let want = (i % 2 == 0).then_some(u32::from(i / 2 % 2));
        assert_eq!(
            fib.lookup(u32::from_be_bytes([198, 18, i, 9])),
            want,
            "198.18.{i}.9"
        );
    }
    // A run that starts right after a child slot with no route edge there: the /23 paints
    // slots 0-1, the /25 makes slot 0 a child, so slot 1 (the /23) and slot 2 on (none) are
    // the root's two runs; the child (the /25 over the /23) has two inline.
    let rib =
        Rib::from_routes([(p4("198.18.0.0/23"), 5), (p4("198.18.0.0/25"), 6)]).expect("valid");
    let fib = Fib::build(&rib);
    let s = fib.stats();
    assert_eq!(shape(s), (2, 1, 2, 0, 8), "{s:?}");
    let hops: Vec<_> = ["198.18.0.1", "198.18.0.200", "198.18.1.1", "198.18.2.1"]
        .iter()
        .map(|a| fib.lookup(u32::from(a.parse::<std::net::Ipv4Addr>().expect("valid"))))
        .collect();
    assert_eq!(hops, [Some(6), Some(5), Some(5), None]);
}

/// A slot's first-level node turning from flat block to node (a child appears) and back,
/// through incremental updates, with lookups and the freed blocks' reuse checked each step.
#[test]
fn flat_blocks_become_nodes_and_back() {
    let mut w = FibWriter::new(Rib::from_routes([(p4("198.18.1.0/24"), 5)]).expect("valid"));
    let a = |s: &str| u32::from(s.parse::<std::net::Ipv4Addr>().expect("valid"));
    for round in 0..3 {
        w.insert(p4("198.18.1.0/25"), 6).expect("valid");
        let s = w.fib().stats();
        assert_eq!((s.flat_nodes, s.nodes), (0, 2), "round {round}: {s:?}");
        assert_eq!(w.fib().lookup(a("198.18.1.1")), Some(6));
        assert_eq!(w.fib().lookup(a("198.18.1.129")), Some(5));
        w.remove(p4("198.18.1.0/25"));
        let s = w.fib().stats();
        assert_eq!(s.flat_nodes, 1, "round {round}: {s:?}");
        // The freed block of the same size is reused: the arena does not grow.
        assert_eq!(s.flat_bytes, 8 + 16, "round {round}: {s:?}");
        assert_eq!(w.fib().lookup(a("198.18.1.1")), Some(5));
        assert_eq!(w.fib().lookup(a("198.18.2.1")), None);
    }
}

/// IPv6 first-level nodes are expanded (one entry per slot: a hop or the child): a slot's
/// root turning from flat block to expanded node and back through updates, with lookups in
/// the child's slot, a leaf slot of the same root, and outside it checked each step, and the
/// freed expansion reused.
#[test]
fn ipv6_roots_expand_and_collapse() {
    let p6 = |s: &str| -> Prefix<u128> { s.parse().expect("test input is valid") };
    // 2001:200::/23 paints two slots (/24s) of the /18 root: a flat block.
    let mut w = FibWriter::new(Rib::from_routes([(p6("2001:200::/23"), 5)]).expect("valid"));
    let s = w.fib().stats();
    assert_eq!((s.flat_nodes, s.expanded_roots), (1, 0), "{s:?}");
    let mut bytes = None;
    for round in 0..3 {
        // A /32 inside it makes 2001:200::/24 a child: the root is a node, expanded.
        w.insert(p6("2001:200::/32"), 6).expect("valid");
        let s = w.fib().stats();
        assert_eq!(
            (s.flat_nodes, s.expanded_roots, s.nodes - s.garbage_nodes),
            (0, 1, 2),
            "round {round}: {s:?}"
        );
        // The expansion's 64 entries and its root index: the arena does not grow again.
        assert_eq!(
            *bytes.get_or_insert(s.bytes),
            s.bytes,
            "round {round}: {s:?}"
        );
        let fresh = Fib::build(w.rib()).stats();
        assert_eq!(fresh.expanded_roots, 1);
        for (a, want) in [
            ("2001:200::1", Some(6)),
            ("2001:201::1", Some(5)),
            ("2001:3ff:ffff::", Some(5)),
            ("2001:400::", None),
            ("2001:1ff:ffff::", None),
        ] {
            let mut batch = [0u32];
            w.fib().lookup_batch(&[a6(a)], &mut batch);
            assert_eq!(w.fib().lookup(a6(a)), want, "round {round}: {a}");
            assert_eq!(batch[0], want.unwrap_or(NO_ROUTE), "round {round}: {a}");
        }
        w.remove(p6("2001:200::/32"));
        let s = w.fib().stats();
        assert_eq!(
            (s.flat_nodes, s.expanded_roots),
            (1, 0),
            "round {round}: {s:?}"
        );
        assert_eq!(w.fib().lookup(a6("2001:200::1")), Some(5));
    }
}

/// More than 65 536 distinct next hops: the leaves switch from 16-bit codes to full next
/// hops, both in a fresh build and when an update brings the 65 537th.
#[test]
fn many_distinct_next_hops() {
    let routes: Vec<(Prefix<u32>, u32)> = (0..70_000u32)
        .map(|i| (Prefix::covering(0xC400_0000 | (i << 1), 31), i * 7))
        .collect();
    many_hops(&routes);
    // IPv6: /66s in one /48 (one expanded root whose slots are children and wide leaves),
    // and /20s that each make a root of leaves only (no flat blocks with wide leaves).
    let base = a6("2001:2::");
    let routes: Vec<(Prefix<u128>, u32)> = (0..70_000u32)
        .map(|i| (Prefix::covering(base | (u128::from(i) << 62), 66), i * 7))
        .chain((1..4u128).map(|i| (Prefix::covering(base | (i << 110), 20), 3)))
        .collect();
    many_hops(&routes);
}

/// Narrow leaves hold 65 535 codes (16 bits, the last value marking escape lines): "no
/// route" and 65 534 distinct next hops; one more switches to wide leaves. Both answer like
/// the reference, with the top codes in range lines.
#[test]
fn the_last_narrow_code() {
    let base = a6("2001:2::");
    for (hops, wide) in [(65_534u32, false), (65_535, true)] {
        // /62s in one /40: /24 nodes whose children are range lines, two routes to a line.
        let routes: Vec<(Prefix<u128>, u32)> = (0..hops)
            .map(|i| (Prefix::covering(base | (u128::from(i) << 66), 62), i + 10))
            .collect();
        let mut r = Reference::default();
        for &(p, h) in &routes {
            r.insert(p, h);
        }
        let w =
            FibWriter::new(Rib::from_routes(routes.iter().copied()).expect("test input is valid"));
        let stats = w.fib().stats();
        assert_eq!(stats.wide_leaves, wide, "{hops} hops");
        if !wide {
            assert!(stats.lines > 0, "{stats:?}");
        }
        // Every 16th route, and the last 300 (codes are given in address order, so these
        // hold the top codes): a route's first address, one inside, and the gap past it.
        let addrs: Vec<u128> = routes
            .iter()
            .enumerate()
            .filter(|&(i, _)| i % 16 == 0 || i + 300 >= routes.len())
            .flat_map(|(_, (p, _))| [p.addr(), p.addr() | (1 << 65), p.addr() | (3 << 66)])
            .collect();
        agree(&w, &r, &addrs);
    }
}

/// `routes` (more than 65 536 distinct hops; the first 1000 fewer) through a writer, 65 000
/// one by one and the rest as a burst; lookups at each route's start and at address 0.
fn many_hops<K: Key>(routes: &[(Prefix<K>, u32)]) {
    let mut r = Reference::default();
    let mut w = FibWriter::new(Rib::new());
    for (k, &(p, h)) in routes.iter().enumerate() {
        r.insert(p, h);
        if k < 65_000 {
            w.insert(p, h).expect("test input is valid");
        }
    }
    let mut rest: Vec<_> = routes[65_000..]
        .iter()
        .map(|&(p, h)| (p, Some(h)))
        .collect();
    w.apply_batch(&mut rest).expect("test input is valid");
    let addrs: Vec<K> = routes
        .iter()
        .map(|(p, _)| p.addr())
        .chain([K::default()])
        .collect();
    assert!(w.fib().stats().wide_leaves, "switched to wide leaves");
    assert!(
        !Fib::build(
            &Rib::from_routes(routes[..1000].iter().copied()).expect("test input is valid")
        )
        .stats()
        .wide_leaves
    );
    agree(&w, &r, &addrs);
}

/// Flat blocks freed by deletes and never reused are garbage the writer counts: once it
/// outgrows the live structure a full rebuild reclaims it (and the arena shrinks).
#[test]
fn freed_flat_blocks_are_reclaimed_by_compaction() {
    // 100 000 /24s, each alone in its /18: 100 000 flat blocks of 2 words.
    let prefixes: Vec<Prefix<u32>> = (0..100_000u32)
        .map(|i| Prefix::covering(0x4000_0000 + (i << 14), 24))
        .collect();
    let mut w = FibWriter::new(Rib::new());
    for (i, &p) in prefixes.iter().enumerate() {
        w.insert(p, i as u32 % 7).expect("valid");
    }
    let peak = w.fib().stats();
    assert_eq!(peak.flat_nodes, 100_000, "{peak:?}");
    assert_eq!(peak.flat_bytes, 8 + 100_000 * 16, "{peak:?}");
    assert_eq!(w.rebuilds(), 0);
    for &p in &prefixes {
        w.remove(p);
    }
    let end = w.fib().stats();
    assert_eq!(end.flat_nodes, 0, "{end:?}");
    assert!(
        w.rebuilds() >= 1,
        "no compaction after freeing 1.6 MB of blocks"
    );
    assert!(
        end.flat_bytes * 2 < peak.flat_bytes,
        "garbage not reclaimed: {end:?}"
    );
    assert_eq!(w.fib().lookup(prefixes[5].addr() | 1), None);
}

/// Prefix nodes: a subtree of one or two routes, one of them reaching past the node's 6 bits,
/// is stored as the routes themselves; a third route turns it back into slots and children,
/// and deleting it makes a prefix node again. Lookups are checked against the reference at
/// each step, at the routes' edges.
#[test]
fn prefix_nodes_hold_one_or_two_routes() {
    let p6 = |s: &str| -> Prefix<u128> { s.parse().expect("test input is valid") };
    let probes: Vec<u128> = [
        "2001:2::",
        "2001:2::1",
        "2001:2:0:1::5",
        "2001:2:0:1:ffff:ffff:ffff:ffff",
        "2001:2:0:2::",
        "2001:2:0:8000::1",
        "2001:2:0:ffff::",
        "2001:2:1::",
        "2001:2:ff::",
        "2001:3::",
        "2001:1ff:ffff::",
        "2001:2:0:1:0:ffff::",
        "2001:2:0:1:0:ffff:ffff:ffff",
        "2001:2:0:1:0:fffe::",
    ]
    .iter()
    .map(|s| a6(s))
    .collect();
    let shape = |s: FibStats| (s.nodes, s.prefix_nodes, s.lines);
    let mut w = FibWriter::new(Rib::<u128>::new());
    let mut r = Reference::default();
    let mut step = |w: &mut FibWriter<u128>, p: &str, hop: Option<u32>| {
        match hop {
            Some(h) => assert_eq!(w.insert(p6(p), h).expect("valid"), r.insert(p6(p), h)),
            None => assert_eq!(w.remove(p6(p)), r.remove(p6(p))),
        }
        agree(w, &r, &probes);
        // The incremental structure has as many live nodes as a fresh build: a delete that
        // leaves one or two routes below a node turns it back into a prefix node.
        let fresh = Fib::build(w.rib()).stats();
        let s = w.fib().stats();
        assert_eq!(
            (s.nodes - s.garbage_nodes, s.lines - s.garbage_lines),
            (fresh.nodes, fresh.lines),
            "after {p}: {s:?} {fresh:?}"
        );
        shape(fresh)
    };
    // A /48 alone in its /18 slot: the slot's root node (bits 18-23) and, for the /48's slot
    // of it, one prefix node at /24 instead of four nodes and a leaf.
    assert_eq!(step(&mut w, "2001:2::/48", Some(1)), (2, 1, 0));
    assert_eq!(w.fib().lookup(a6("2001:2::1")), Some(1));
    assert_eq!(w.fib().lookup(a6("2001:2:1::")), None);
    // A /64 nested in it: still one prefix node, holding both (the longer wins inside it).
    assert_eq!(step(&mut w, "2001:2:0:1::/64", Some(2)), (2, 1, 0));
    assert_eq!(w.fib().lookup(a6("2001:2:0:1::5")), Some(2));
    assert_eq!(w.fib().lookup(a6("2001:2:0:2::")), Some(1));
    // A covering /20 is the hop around them, also inside the prefix node.
    assert_eq!(step(&mut w, "2001::/20", Some(3)), (2, 1, 0));
    assert_eq!(w.fib().lookup(a6("2001:2:1::")), Some(3));
    // A third route below /24: slots and children again. The /24 node's one child at /30
    // holds the three, but the /64 is more than 32 bits past /30, so that child is an
    // ordinary node; its child at /36 holds all three within 32 bits, so it is a line
    // (the three routes' five range edges), and the /30 node keeps its children as lines.
    assert_eq!(
        step(&mut w, "2001:2:0:8000::/49", Some(4)),
        (3, 0, 1),
        "root, /24 and /30 nodes, one line at /36"
    );
    assert_eq!(w.fib().lookup(a6("2001:2:0:8000::1")), Some(4));
    // Deleting it collapses back to the /24 prefix node.
    step(&mut w, "2001:2:0:8000::/49", None);
    assert_eq!(w.fib().lookup(a6("2001:2:0:8000::1")), Some(1));
    // The /20 alone: the slot's root has no child, so it is a flat block (no nodes).
    step(&mut w, "2001:2::/48", None);
    assert_eq!(step(&mut w, "2001:2:0:1::/64", None), (0, 0, 0));
    // A /96 is more than 64 bits past /24 and /30: ordinary nodes there, the prefix node at
    // /36 (root, /24, /30, /36); more than 32 bits past /36 too, so no line.
    assert_eq!(step(&mut w, "2001:2:0:1:0:ffff::/96", Some(5)), (4, 1, 0));
    assert_eq!(w.fib().lookup(a6("2001:2:0:1:0:ffff::")), Some(5));
    assert_eq!(w.fib().lookup(a6("2001:2:0:1:0:fffe::")), Some(3));
}

/// Range lines: a small subtree below a node past the first two levels is kept as its
/// address ranges in one cache line. Nested routes and equal neighbours merge; an eleventh
/// boundary makes the child an escape (an ordinary node), and a delete makes it a line again.
/// Lookups are checked against the reference at every route's edges after each step.
#[test]
fn lines_hold_small_subtrees_and_escape_big_ones() {
    let p6 = |s: &str| -> Prefix<u128> { s.parse().expect("test input is valid") };
    let mut w = FibWriter::new(Rib::<u128>::new());
    let mut r = Reference::default();
    let mut probes: Vec<u128> = vec![a6("2001::"), a6("2001:3:ffff::"), a6("2001:4::")];
    // (live nodes, live lines, live escapes) of the incremental structure; and the fresh
    // build's, which must be the same unless `differs`.
    let mut step = |w: &mut FibWriter<u128>, p: &str, hop: Option<u32>, differs: bool| {
        let q = p6(p);
        match hop {
            Some(h) => assert_eq!(w.insert(q, h).expect("valid"), r.insert(q, h)),
            None => assert_eq!(w.remove(q), r.remove(q)),
        }
        let last = q.addr() | u128::MAX.checked_shr(u32::from(q.len())).unwrap_or(0);
        probes.extend([
            q.addr(),
            q.addr().wrapping_sub(1),
            last,
            last.wrapping_add(1),
        ]);
        agree(w, &r, &probes);
        let live = |s: FibStats| {
            (
                s.nodes - s.garbage_nodes,
                s.lines - s.garbage_lines,
                s.escapes,
            )
        };
        let (s, fresh) = (w.fib().stats(), Fib::build(w.rib()).stats());
        assert_eq!(s.expanded_roots, fresh.expanded_roots, "after {p}");
        let (got, fresh) = (live(s), live(fresh));
        if !differs {
            assert_eq!(got, fresh, "after {p}");
        }
        got
    };
    // Three /48s in 2001::/30: the slot's root, a node at /24 (three routes are too many for
    // a prefix node), and its one child at /30 as a line of 4 boundaries.
    step(&mut w, "2001:1::/48", Some(1), false);
    step(&mut w, "2001:1:1::/48", Some(2), false);
    assert_eq!(step(&mut w, "2001:1:2::/48", Some(1), false), (2, 1, 0));
    // A /40 around them with the first and third's hop: the same 4 boundaries (its start
    // merges with the first /48, the third merges into it).
    assert_eq!(step(&mut w, "2001:1::/40", Some(1), false), (2, 1, 0));
    // Three /48s apart from the rest and each other: 10 boundaries, still one line.
    for k in ["2001:2::/48", "2001:2:2::/48", "2001:2:4::/48"] {
        assert_eq!(step(&mut w, k, Some(3), false), (2, 1, 0), "{k}");
    }
    // An eleventh and twelfth: the line becomes an escape to a node at /30, itself with two
    // lines at /36 (the /40's routes, the four /48s). A fresh build, whose only child at /30
    // would be an escape, keeps nodes at /24 instead.
    assert_eq!(step(&mut w, "2001:2:6::/48", Some(3), true), (3, 3, 1));
    // A route deeper than 32 bits past /30 inside the escape: updated within its node.
    step(&mut w, "2001:2:6:0:1::/80", Some(4), true);
    step(&mut w, "2001:2:6:0:1::/80", None, true);
    // The twelfth boundary gone: a line again, the escape's nodes freed.
    assert_eq!(step(&mut w, "2001:2:6::/48", None, false), (2, 1, 0));
    // Emptied: the delete of the last route below the line leaves it all one range.
    for k in [
        "2001:2::/48",
        "2001:2:2::/48",
        "2001:2:4::/48",
        "2001:1:1::/48",
    ] {
        step(&mut w, k, None, true);
    }
    assert_eq!(w.fib().lookup(a6("2001:1:1::5")), Some(1));
    assert_eq!(w.fib().lookup(a6("2001:2:2::5")), None);
}
