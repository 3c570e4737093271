//! Update cost on a generated 950k-prefix IPv4 table: every tenth route (95 000) goes in as
//! one burst through `FibWriter::apply_batch` and out again as another, against the reference
//! measured in the same run — building the FIB from scratch, per route of the table. After
//! criterion's report, a line with the rates and the ratio. The target is ≥ 2 M
//! inserts/s.
//!
//! Run: `cargo bench -p flowlane-lpm --bench updates`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use flowlane_lpm::{gen, Fib, FibWriter, Prefix, Rib};

/// Seconds per call of `f`, over at least a second of calls.
fn seconds_per_call(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < Duration::from_secs(1) {
        f();
        rounds += 1;
    }
    start.elapsed().as_secs_f64() / f64::from(rounds)
}

type Change = (Prefix<u32>, Option<u32>);

fn main() {
    let table = gen::ipv4(950_000, 1, 32);
    let base = Rib::from_routes(
        table
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 10 != 0)
            .map(|(_, r)| *r),
    )
    .expect("generated routes are valid");
    let full = Rib::from_routes(table.iter().copied()).expect("generated routes are valid");
    let updates: Vec<(Prefix<u32>, u32)> = table.iter().copied().step_by(10).collect();
    let ins: Vec<Change> = updates.iter().map(|&(p, h)| (p, Some(h))).collect();
    let del: Vec<Change> = updates.iter().map(|&(p, _)| (p, None)).collect();
    let mut w = FibWriter::new(base);
    // One insert burst and one delete burst: the writer ends where it started.
    let round = |w: &mut FibWriter<u32>| {
        let (mut i, mut d) = (ins.clone(), del.clone());
        let t = Instant::now();
        w.apply_batch(&mut i).expect("valid routes");
        let ti = t.elapsed();
        w.apply_batch(&mut d).expect("valid routes");
        (ti, t.elapsed() - ti)
    };

    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let mut g = c.benchmark_group("ipv4_950k_updates");
    g.throughput(Throughput::Elements(2 * updates.len() as u64));
    g.bench_function("burst_insert_then_delete", |b| {
        b.iter(|| black_box(round(&mut w)))
    });
    g.throughput(Throughput::Elements(table.len() as u64));
    g.bench_function("full_build", |b| b.iter(|| Fib::build(black_box(&full))));
    g.finish();
    c.final_summary();

    let (mut ins_s, mut del_s, mut rounds) = (0.0, 0.0, 0u32);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        let (i, d) = round(&mut w);
        ins_s += i.as_secs_f64();
        del_s += d.as_secs_f64();
        rounds += 1;
    }
    let n = updates.len() as f64 * f64::from(rounds);
    let build = seconds_per_call(|| drop(black_box(Fib::build(&full))));
    let build_rate = table.len() as f64 / build;
    println!(
        "burst insert {:.2} M/s, burst delete {:.2} M/s; full build {:.2} M routes/s ({:.0} ms): \
         insert/build ratio {:.2}× (this run)",
        n / ins_s / 1e6,
        n / del_s / 1e6,
        build_rate / 1e6,
        build * 1e3,
        n / ins_s / build_rate
    );
}
