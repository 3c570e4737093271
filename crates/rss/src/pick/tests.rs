use super::*;
use crate::key::Key;
use crate::queue::{FreeBsdBuckets, Reta};

fn v4(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn spec(ports: (u16, u16)) -> PickSpec {
    PickSpec {
        src_addrs: (v4("198.18.0.1"), v4("198.18.0.1")),
        dst: v4("198.19.0.1"),
        src_ports: ports,
        dst_port: 8080,
        hash_ports: true,
        queues: vec![],
        per_queue: Some(4),
        symmetric: Symmetric::Off,
        exclude: vec![],
    }
}

/// Brute force: how many source ports in the range land on each queue.
fn brute_counts(h: &Toeplitz, m: &QueueModel, s: &PickSpec) -> Vec<u128> {
    let mut counts = vec![0u128; m.queues() as usize];
    let (lo, hi) = (addr_to_u128(s.src_addrs.0), addr_to_u128(s.src_addrs.1));
    for a in lo..=hi {
        let src = u128_to_addr(a, s.dst);
        let sorted_dst = s.symmetric == Symmetric::Sort && src == s.dst;
        if sorted_dst || s.exclude.contains(&src) {
            continue;
        }
        for p in s.src_ports.0..=s.src_ports.1 {
            let t = Tuple::new(
                u128_to_addr(a, s.dst),
                s.dst,
                s.hash_ports.then_some((p, s.dst_port)),
            )
            .expect("same family");
            counts[m.queue(h.hash(&t.symmetric(s.symmetric))) as usize] += 1;
            if !s.hash_ports {
                break;
            }
        }
    }
    counts
}

fn check(h: &Toeplitz, m: &QueueModel, s: &PickSpec) -> PickResult {
    let r = pick(h, m, s).expect("pick succeeds");
    assert_eq!(r.verify_failures, 0);
    let brute = brute_counts(h, m, s);
    for qp in &r.queues {
        assert_eq!(qp.available, brute[qp.queue as usize], "queue {}", qp.queue);
        let want = s
            .per_queue
            .map_or(qp.available, |k| (k as u128).min(qp.available));
        assert_eq!(qp.tuples.len() as u128, want, "queue {}", qp.queue);
        for p in &qp.tuples {
            assert_eq!(h.hash(&p.tuple.symmetric(s.symmetric)), p.hash);
            assert!(!s.exclude.contains(&p.tuple.src()), "{}", p.tuple);
            assert_eq!(m.queue(p.hash), qp.queue, "{}", p.tuple);
            let (sp, dp) = p.tuple.ports().unwrap_or((s.src_ports.0, s.dst_port));
            assert!((s.src_ports.0..=s.src_ports.1).contains(&sp));
            assert_eq!(dp, s.dst_port);
            assert_eq!(p.tuple.dst(), s.dst);
        }
        // No duplicates.
        let mut seen: Vec<_> = qp.tuples.iter().map(|p| p.tuple).collect();
        seen.dedup();
        assert_eq!(seen.len(), qp.tuples.len());
    }
    r
}

#[test]
fn blocks_cover_ranges_exactly() {
    assert_eq!(aligned_blocks(0, 0), vec![(0, 0)]);
    assert_eq!(
        aligned_blocks(1024, 65535),
        vec![
            (1024, 10),
            (2048, 11),
            (4096, 12),
            (8192, 13),
            (16384, 14),
            (32768, 15)
        ]
    );
    assert_eq!(aligned_blocks(3, 9), vec![(3, 0), (4, 2), (8, 1)]);
    assert_eq!(aligned_blocks(0, u128::MAX), vec![(0, 128)]);
    let b = aligned_blocks(u128::MAX - 2, u128::MAX);
    assert_eq!(b, vec![(u128::MAX - 2, 0), (u128::MAX - 1, 1)]);
}

#[test]
fn reta_128_ports_per_queue() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    for queues in [1, 2, 3, 4, 7] {
        let m = QueueModel::Reta(Reta::round_robin(128, queues).expect("valid"));
        let r = check(&h, &m, &spec((1024, 65535)));
        assert_eq!(r.method, Method::Gf2);
        assert_eq!(r.queues.len(), queues);
    }
}

#[test]
fn odd_port_ranges_and_all_solutions() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    let m = QueueModel::Reta(Reta::round_robin(128, 4).expect("valid"));
    let mut s = spec((1000, 1999));
    s.per_queue = None;
    let r = check(&h, &m, &s);
    let total: usize = r.queues.iter().map(|q| q.tuples.len()).sum();
    assert_eq!(total, 1000);
}

#[test]
fn address_ranges_and_two_tuple() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    let m = QueueModel::FreeBsd(FreeBsdBuckets::new(4));
    let mut s = spec((5000, 5000));
    s.src_addrs = (v4("198.18.0.3"), v4("198.18.1.200"));
    s.hash_ports = false;
    check(&h, &m, &s);
    s.hash_ports = true;
    s.src_ports = (5000, 5100);
    check(&h, &m, &s);
}

#[test]
fn ipv6_sources() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    let m = QueueModel::Reta(Reta::round_robin(128, 6).expect("valid"));
    let s = PickSpec {
        src_addrs: (v4("2001:2::10"), v4("2001:2::1f")),
        dst: v4("2001:2::1:1"),
        src_ports: (40000, 40999),
        dst_port: 53,
        hash_ports: true,
        queues: vec![5, 0],
        per_queue: Some(3),
        symmetric: Symmetric::Off,
        exclude: vec![],
    };
    let r = check(&h, &m, &s);
    assert_eq!(
        r.queues.iter().map(|q| q.queue).collect::<Vec<_>>(),
        vec![5, 0]
    );
}

#[test]
fn impossible_requests_are_reported_per_queue() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    let m = QueueModel::Reta(Reta::round_robin(128, 8).expect("valid"));
    // One candidate: it lands on exactly one queue; the other seven have none.
    let r = check(&h, &m, &spec((7777, 7777)));
    assert_eq!(r.queues.iter().filter(|q| q.available == 0).count(), 7);
    assert_eq!(r.queues.iter().filter(|q| q.tuples.is_empty()).count(), 7);
    // The symmetric key hashes ports and addresses with the same 16-bit windows; a tiny port
    // range covers few indices.
    let hs = Toeplitz::new(&Key::symmetric());
    let r = check(&hs, &m, &spec((8, 11)));
    assert!(r.queues.iter().any(|q| q.available == 0));
    assert_eq!(
        pick(
            &h,
            &m,
            &PickSpec {
                queues: vec![8],
                ..spec((1, 2))
            }
        ),
        Err(PickError::NoSuchQueue {
            queue: 8,
            queues: 8
        })
    );
    assert_eq!(pick(&h, &m, &spec((2, 1))), Err(PickError::EmptyRange));
    let mixed = PickSpec {
        dst: v4("2001:2::1"),
        ..spec((1, 2))
    };
    assert_eq!(pick(&h, &m, &mixed), Err(PickError::MixedFamilies));
}

#[test]
fn non_linear_models_are_walked_exactly() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    for m in [QueueModel::Modulo(3), QueueModel::Rps(6)] {
        let r = check(&h, &m, &spec((2000, 6000)));
        assert_eq!(r.method, Method::Walk);
    }
    for m in [QueueModel::Modulo(4), QueueModel::Rps(8)] {
        let r = check(&h, &m, &spec((2000, 6000)));
        assert_eq!(r.method, Method::Gf2);
    }
}

#[test]
fn too_wide_and_too_many() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    let m = QueueModel::Reta(Reta::round_robin(128, 2).expect("valid"));
    let wide = PickSpec {
        src_addrs: (v4("2001:2::"), v4("2001:2::ffff:ffff:ffff:ffff")),
        dst: v4("2001:2:1::1"),
        ..spec((0, 65535))
    };
    assert_eq!(
        pick(&h, &m, &wide),
        Err(PickError::RangeTooWide { free_bits: 80 })
    );
    let many = PickSpec {
        src_addrs: (v4("198.18.0.0"), v4("198.19.255.255")),
        per_queue: None,
        ..spec((0, 65535))
    };
    assert!(matches!(
        pick(&h, &m, &many),
        Err(PickError::TooManyResults { .. })
    ));
    // ...but asking for a few per queue over the same range is instant.
    let few = PickSpec {
        per_queue: Some(2),
        ..many
    };
    let r = pick(&h, &m, &few).expect("solvable");
    assert!(r
        .queues
        .iter()
        .all(|q| q.tuples.len() == 2 && q.available == 1u128 << 32));
}

/// An excluded address (the destination, a prefix's network and broadcast addresses, as `pick`
/// excludes them) is never offered: `pick --dst 10.11.2.1:8080 --src-ip 10.11.2.0/24
/// --two-tuple` once offered 10.11.2.1 itself.
#[test]
fn the_destination_and_excluded_addresses_are_never_offered() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    for queues in [2, 4] {
        let m = QueueModel::Reta(Reta::round_robin(128, queues).expect("valid"));
        for two_tuple in [true, false] {
            let s = PickSpec {
                src_addrs: (v4("198.18.2.0"), v4("198.18.2.255")),
                dst: v4("198.18.2.1"),
                hash_ports: !two_tuple,
                per_queue: None,
                exclude: vec![v4("198.18.2.0"), v4("198.18.2.255"), v4("198.18.2.1")],
                ..spec((5000, 5003))
            };
            let r = check(&h, &m, &s);
            let total: u128 = r.queues.iter().map(|q| q.available).sum();
            let per_addr = if two_tuple { 1 } else { 4 };
            assert_eq!(total, 253 * per_addr);
        }
    }
    let only = PickSpec {
        src_addrs: (v4("198.19.0.1"), v4("198.19.0.1")),
        exclude: vec![v4("198.19.0.1")],
        ..spec((5000, 5000))
    };
    let m = QueueModel::Reta(Reta::round_robin(128, 2).expect("valid"));
    assert_eq!(pick(&h, &m, &only), Err(PickError::NothingLeft));
    // Unexcluded, the destination is a source like any other (loopback sends from it).
    let lo = PickSpec {
        exclude: vec![],
        ..only
    };
    assert!(check(&h, &m, &lo)
        .queues
        .iter()
        .any(|q| !q.tuples.is_empty()));
}

/// Under a NIC's symmetric hashing the picker still solves exactly: the counts equal brute
/// force over the transformed tuples, for ranges below, above and around the destination.
#[test]
fn symmetric_hashing_is_solved_exactly() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    let m = QueueModel::Reta(Reta::round_robin(128, 4).expect("valid"));
    for sym in [Symmetric::Xor, Symmetric::Sort] {
        for (lo, hi) in [
            ("198.18.0.0", "198.18.0.15"),
            ("198.20.0.0", "198.20.0.15"),
            ("198.19.0.0", "198.19.0.7"),
        ] {
            for two_tuple in [false, true] {
                let s = PickSpec {
                    src_addrs: (v4(lo), v4(hi)),
                    dst: v4("198.19.0.1"),
                    hash_ports: !two_tuple,
                    per_queue: None,
                    symmetric: sym,
                    ..spec((40000, 40063))
                };
                let r = check(&h, &m, &s);
                assert_eq!(r.method, Method::Gf2);
            }
        }
    }
    let m = QueueModel::Modulo(3);
    let s = PickSpec {
        src_addrs: (v4("198.19.0.0"), v4("198.19.0.3")),
        dst: v4("198.19.0.1"),
        per_queue: None,
        symmetric: Symmetric::Sort,
        ..spec((40000, 40015))
    };
    assert_eq!(check(&h, &m, &s).method, Method::Walk);
}
