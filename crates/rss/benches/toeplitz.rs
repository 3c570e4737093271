//! Toeplitz hash cost per hash: bit-serial reference vs table vs SIMD batch, on IPv4 4-tuples
//! (12 input bytes) and IPv6 4-tuples (36 bytes). Prints, after criterion's own report, a table
//! of ns/hash with the speed-up over the reference measured in this same run.
//!
//! Run: `cargo bench -p flowlane-rss --bench toeplitz`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use flowlane_rss::toeplitz::{reference, Backend, Toeplitz};
use flowlane_rss::{Key, Tuple};

const BATCH: usize = 1024;

/// Per (input bytes, path): total hashes, total time, and the best ns/hash of any sample.
type Seen = BTreeMap<(usize, String), (u128, Duration, f64)>;
static SEEN: Mutex<Seen> = Mutex::new(BTreeMap::new());

fn record(len: usize, path: &str, hashes: u128, t: Duration) {
    if let Ok(mut m) = SEEN.lock() {
        let e = m
            .entry((len, path.to_string()))
            .or_insert((0, Duration::ZERO, f64::MAX));
        e.0 += hashes;
        e.1 += t;
        e.2 = e.2.min(t.as_nanos() as f64 / hashes as f64);
    }
}

fn tuples(len: usize) -> Vec<Tuple> {
    (0..BATCH as u32)
        .map(|i| {
            let x = i.wrapping_mul(2_654_435_761);
            if len == 12 {
                Tuple::v4(
                    Ipv4Addr::from(0xc612_0000 | (x & 0xffff)),
                    Ipv4Addr::new(198, 19, 0, 1),
                    (x >> 16) as u16,
                    8080,
                )
            } else {
                Tuple::v6(
                    Ipv6Addr::from(0x2001_0002_0000_0000_0000_0000_0000_0000u128 | x as u128),
                    Ipv6Addr::from(0x2001_0002_0000_0000_0000_0000_0001_0001u128),
                    (x >> 16) as u16,
                    8080,
                )
            }
        })
        .collect()
}

/// Benchmarks `hash` one tuple at a time over `ts`, recorded as `path`.
fn one_at_a_time(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    len: usize,
    ts: &[Tuple],
    path: &str,
    hash: impl Fn(&Tuple) -> u32,
) {
    // Generic, not `dyn`: an indirect call per hash would be measured with it.
    g.bench_function(path.replace(' ', "_"), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            let mut acc = 0u32;
            for _ in 0..iters {
                for t in black_box(ts) {
                    acc ^= hash(t);
                }
            }
            black_box(acc);
            let e = start.elapsed();
            record(len, path, iters as u128 * BATCH as u128, e);
            e
        })
    });
}

/// The loop's own floor for a hash behind a call, as `Toeplitz::hash`'s kernels are (they are
/// compiled for features the binary does not assume, so they cannot inline): a call that only
/// reads the tuple's first word and its kind, no hashing. No single hash called this way can
/// take less (issue 29 item 2 asks IPv4 ≤ 0.5× of DPDK's inlined `rte_thash_gfni`).
#[inline(never)]
fn floor(t: &Tuple) -> u32 {
    let b = t.padded_input();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]]) ^ t.input_len() as u32
}

fn bench(c: &mut Criterion) {
    let key = Key::MICROSOFT;
    for len in [12usize, 36] {
        let ts = tuples(len);
        let mut g = c.benchmark_group(format!("toeplitz_{len}B"));
        g.throughput(Throughput::Elements(BATCH as u64));
        one_at_a_time(&mut g, len, &ts, "reference", |t| {
            reference(&key, t.input())
        });
        one_at_a_time(&mut g, len, &ts, "call floor", floor);
        // `hash` of each backend's hasher: the table, the carry-less path with bytes reversed
        // by nibble shuffles (pclmul-ssse3) and by GFNI (avx512-gfni-clmul's hasher, the
        // default where the CPU has it).
        for backend in Backend::available() {
            let h = Toeplitz::with_backend(&key, backend).expect("listed as available");
            let name = format!("{} single", backend.name());
            one_at_a_time(&mut g, len, &ts, &name, |t| h.hash(t));
        }
        for backend in Backend::available() {
            let h = Toeplitz::with_backend(&key, backend).expect("listed as available");
            let name = format!("{} batch", backend.name());
            let mut out = vec![0u32; BATCH];
            g.bench_function(name.replace(' ', "_"), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        h.hash_batch(black_box(&ts), &mut out);
                        black_box(&out);
                    }
                    let e = start.elapsed();
                    record(len, &name, iters as u128 * BATCH as u128, e);
                    e
                })
            });
        }
        g.finish();
    }
}

fn report() {
    let Ok(seen) = SEEN.lock() else { return };
    println!("\nToeplitz ns/hash, and speed-up vs the bit-serial reference of this same run.");
    println!("mean = all criterion samples; best = fastest sample (less exposed to a noisy VM)");
    println!(
        "{:>6}  {:<26} {:>10} {:>9} {:>10} {:>9}",
        "input", "path", "mean ns", "vs ref", "best ns", "vs ref"
    );
    for len in [12usize, 36] {
        let Some(&(rn, rt, rbest)) = seen.get(&(len, "reference".to_string())) else {
            continue;
        };
        let rmean = rt.as_nanos() as f64 / rn as f64;
        for ((l, path), (n, t, best)) in seen.iter() {
            if *l != len {
                continue;
            }
            let mean = t.as_nanos() as f64 / *n as f64;
            println!(
                "{:>5}B  {:<26} {:>10.3} {:>8.1}x {:>10.3} {:>8.1}x",
                len,
                path,
                mean,
                rmean / mean,
                best,
                rbest / best
            );
        }
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
    report();
}
