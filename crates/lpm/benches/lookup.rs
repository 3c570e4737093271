//! Lookup cost per address on a generated 950k-prefix IPv4 table, traffic inside routed
//! prefixes: the Poptrie FIB (batch and single) against DIR-24-8 (DPDK rte_lpm's design)
//! measured in this same run; after criterion's report, a line with the ratio.
//! `flowlane route bench` gives the full picture (four traffic modes, updates, IPv6).
//!
//! Run: `cargo bench -p flowlane-lpm --bench lookup`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use flowlane_lpm::gen::{self, Traffic};
use flowlane_lpm::{Dir24_8, Fib, Rib, NO_ROUTE};

const N: usize = 1 << 20;

fn ns_per_lookup(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < Duration::from_millis(500) {
        f();
        rounds += 1;
    }
    start.elapsed().as_nanos() as f64 / (f64::from(rounds) * N as f64)
}

fn main() {
    let table = gen::ipv4(950_000, 1, 32);
    let rib = Rib::from_routes(table.iter().copied()).expect("generated routes are valid");
    let fib = Fib::build(&rib);
    let dir = Dir24_8::build(&rib);
    let addrs = gen::traffic_v4(Traffic::Inside, &table, N, 7);
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
    c.final_summary();

    let p = ns_per_lookup(|| fib.lookup_batch(black_box(&addrs), &mut out));
    let d = ns_per_lookup(|| dir.lookup_batch(black_box(&addrs), &mut out));
    println!(
        "poptrie batch {:.2} ns/lookup ({:.0} M/s), DIR-24-8 batch {:.2} ns ({:.0} M/s): ratio {:.2}× (this run)",
        p,
        1e3 / p,
        d,
        1e3 / d,
        d / p
    );
}
