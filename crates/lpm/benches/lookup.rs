//! Lookup cost per address, traffic inside routed prefixes: the Poptrie FIB (batch and
//! single) on a generated 950k-prefix IPv4 table and its batch on a 220k-prefix IPv6 table,
//! against DIR-24-8 (DPDK rte_lpm's design) on the IPv4 table, measured in this same run.
//! After criterion's report, the ratios to DIR-24-8 as medians of alternated rounds (one
//! measurement each is at the mercy of a busy host), and what they come to where DIR-24-8
//! does the 150-160 M/s the targets were set against (IPv4 >= 250 M/s, IPv6 >= 100).
//! `flowlane route bench` gives the full picture (four traffic modes, updates).
//!
//! Run: `cargo bench -p flowlane-lpm --bench lookup`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use flowlane_lpm::gen::{self, Traffic};
use flowlane_lpm::{Dir24_8, Fib, Rib, NO_ROUTE};

const N: usize = 1 << 20;
/// Alternated rounds behind each printed ratio.
const ROUNDS: usize = 11;

fn ns_per_lookup(mut f: impl FnMut(), time: Duration) -> f64 {
    f();
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < time {
        f();
        rounds += 1;
    }
    start.elapsed().as_nanos() as f64 / (f64::from(rounds) * N as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let table = gen::ipv4(950_000, 1, 32);
    let rib = Rib::from_routes(table.iter().copied()).expect("generated routes are valid");
    let fib = Fib::build(&rib);
    let dir = Dir24_8::build(&rib);
    let addrs = gen::traffic_v4(Traffic::Inside, &table, N, 7);
    let table6 = gen::ipv6(220_000, 1, 32);
    let fib6 =
        Fib::build(&Rib::from_routes(table6.iter().copied()).expect("generated routes are valid"));
    let addrs6 = gen::traffic_v6(Traffic::Inside, &table6, N, 7);
    let mut out = vec![0u32; N];

    let mut c = Criterion::default().configure_from_args().sample_size(20);
    let mut g = c.benchmark_group("ipv4_950k_inside");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("poptrie_batch", |b| {
        b.iter(|| fib.lookup_batch(black_box(&addrs), &mut out))
    });
    g.bench_function("poptrie_single", |b| {
        b.iter(|| {
            for (o, &a) in out.iter_mut().zip(black_box(&addrs)) {
                *o = fib.lookup(a).unwrap_or(NO_ROUTE);
            }
        })
    });
    g.bench_function("dir24_8_batch", |b| {
        b.iter(|| dir.lookup_batch(black_box(&addrs), &mut out))
    });
    g.finish();
    let mut g = c.benchmark_group("ipv6_220k_inside");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("poptrie_batch", |b| {
        b.iter(|| fib6.lookup_batch(black_box(&addrs6), &mut out))
    });
    g.finish();
    c.final_summary();

    let round = Duration::from_millis(100);
    let (mut v4, mut v6, mut dir_ns) = (vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        let p = ns_per_lookup(|| fib.lookup_batch(black_box(&addrs), &mut out), round);
        let d = ns_per_lookup(|| dir.lookup_batch(black_box(&addrs), &mut out), round);
        let p6 = ns_per_lookup(|| fib6.lookup_batch(black_box(&addrs6), &mut out), round);
        v4.push(d / p);
        v6.push(d / p6);
        dir_ns.push(d);
    }
    let (v4, v6, d) = (median(v4), median(v6), median(dir_ns));
    println!(
        "batch lookups inside routed prefixes, medians of {ROUNDS} alternated rounds: \
         DIR-24-8 (IPv4) {:.0} M/s; IPv4 FIB {v4:.2}x DIR-24-8, IPv6 FIB {v6:.2}x",
        1e3 / d
    );
    println!(
        "where DIR-24-8 does 150-160 M/s: IPv4 FIB {:.0}-{:.0} M/s (target 250), \
         IPv6 FIB {:.0}-{:.0} M/s (target 100)",
        150.0 * v4,
        160.0 * v4,
        150.0 * v6,
        160.0 * v6
    );
}
