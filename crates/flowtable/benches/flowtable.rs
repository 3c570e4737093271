//! The flow table on one core, against `hashbrown` (Rust's fastest general map, foldhash) in
//! this same run:
//! - lookups at 1 M flows, 90 % full, half of them misses (the Cuckoo++ workload), single and
//!   batched;
//! - inserts of 1 M flows into an empty table;
//! - memory per flow;
//! - lookups by table size, n = 10 k … 10 M flows (90 % full, half misses): where each table
//!   stays in the caches and where both go to memory;
//! - expiry work per expired flow with n = 10 k … 10 M resident flows while 1 000 short flows a
//!   tick come and go, against a scanning reference (a map swept each tick, as a GC that
//!   walks the table does), whose work per expired flow grows with n.
//!
//! After criterion's report, the ratios as medians of alternated rounds. DPDK's `rte_hash` on
//! the same workload: `bench/dpdk_hash.sh`.
//!
//! Run: `cargo bench -p flowlane-flowtable --bench flowtable` (`-- --quick` skips the 10 M
//! points of the size and expiry sweeps).

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use flowlane_flowtable::{Config, FlowKey, FlowTable, TableKey, TCP, UDP};

/// The `flowlane` binary's allocator: allocations of 2 MiB or more on transparent huge pages
/// (the table's buckets and records), so the table is measured as flowlane runs it — and as
/// rte_hash runs, on hugepages (bench/dpdk_hash.sh).
#[global_allocator]
static ALLOC: flowlane_io::huge::HugeAlloc = flowlane_io::huge::HugeAlloc;

const FLOWS: usize = 1_000_000;
const QUERIES: usize = 1 << 20;
const ROUNDS: usize = 9;

/// Flow `i` of a family of random-looking 5-tuples (a xorshift over the index).
fn key(i: u64, proto: u8) -> FlowKey {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    FlowKey::v4(
        Ipv4Addr::from((x >> 32) as u32),
        Ipv4Addr::from(x as u32),
        (x >> 16) as u16,
        x as u16 | 1,
        proto,
    )
}

/// Keys one `get_batch` is given: `FLOWLANE_BULK` (default 32, as DPDK's bursts and
/// bench/dpdk_hash.c's rte_hash_lookup_bulk calls; rte_hash takes at most 64).
/// A value that is not a power of two from 1 to 1024 is refused (exit 2), as
/// bench/dpdk_hash.c refuses it, rather than measured at 32 under another name.
fn bulk_size() -> usize {
    let Ok(v) = std::env::var("FLOWLANE_BULK") else {
        return 32;
    };
    match v.parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) && QUERIES.is_multiple_of(n) => n,
        _ => {
            eprintln!("FLOWLANE_BULK={v}: give a power of two from 1 to 1024");
            std::process::exit(2);
        }
    }
}

/// Every query, `bulk` to a `get_batch` call, each call's results in the same `bulk` slots
/// of `out` and counted before the next — as bench/dpdk_hash.c does with rte_hash's
/// positions (a router acts on a burst's results, then looks up the next burst's). The hits.
fn batches<K: TableKey>(
    table: &FlowTable<u32, K>,
    queries: &[K],
    out: &mut [Option<u32>],
    bulk: usize,
) -> usize {
    let out = &mut out[..bulk];
    let mut hits = 0;
    for q in queries.chunks(bulk) {
        table.get_batch(q, out);
        hits += out.iter().filter(|o| o.is_some()).count();
    }
    hits
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ns_each(n: usize, mut f: impl FnMut(), time: Duration) -> f64 {
    f();
    let start = Instant::now();
    let mut rounds = 0u32;
    while start.elapsed() < time {
        f();
        rounds += 1;
    }
    start.elapsed().as_nanos() as f64 / (f64::from(rounds) * n as f64)
}

type Map = hashbrown::HashMap<FlowKey, u32>;

/// The lookup workload's queries: half hits, half misses, shuffled — or with
/// `FLOWTABLE_QUERIES=hits` or `misses` every query one kind (what each costs alone). With
/// the number of hits expected.
fn workload() -> (Vec<FlowKey>, usize) {
    workload_for(FLOWS)
}

/// The same over a table of `flows` flows.
fn workload_for(flows: usize) -> (Vec<FlowKey>, usize) {
    let kind = std::env::var("FLOWTABLE_QUERIES").unwrap_or_default();
    let hit = |q: u64| match kind.as_str() {
        "hits" => true,
        "misses" => false,
        _ => q.is_multiple_of(2),
    };
    let queries = (0..QUERIES as u64)
        .map(|q| {
            let r = q.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
            if hit(q) {
                key(r % flows as u64, UDP)
            } else {
                key(flows as u64 + r, UDP)
            }
        })
        .collect();
    (queries, (0..QUERIES as u64).filter(|&q| hit(q)).count())
}

/// 1 M flows filling 90 % of the bucket slots (a record a slot; a capacity of 1.02 M flows).
fn filled<K: TableKey>(conv: impl Fn(FlowKey) -> K) -> FlowTable<u32, K> {
    filled_for(FLOWS, conv)
}

/// `flows` flows filling 90 % of the bucket slots.
fn filled_for<K: TableKey>(flows: usize, conv: impl Fn(FlowKey) -> K) -> FlowTable<u32, K> {
    let mut table = FlowTable::new(&Config::new(flows * 92 / 90)).expect("table");
    for i in 0..flows as u64 {
        *table.upsert(&conv(key(i, UDP)), 0).value = i as u32;
    }
    table
}

/// Lookups at `flows` flows, 90 % full, half misses: batched (32 a call) and one at a time
/// against hashbrown, `rounds` alternated rounds of every query each; medians, ns a lookup.
fn sweep_point(flows: usize, rounds: usize) -> (f64, f64, f64) {
    let table = filled_for(flows, |k| k);
    let mut map: Map = Map::with_capacity(flows);
    for i in 0..flows as u64 {
        map.insert(key(i, UDP), i as u32);
    }
    let (queries, hits) = workload_for(flows);
    let mut out = vec![None; 32];
    let (mut batch, mut single, mut hb) = (Vec::new(), Vec::new(), Vec::new());
    let t = Duration::from_millis(200);
    for _ in 0..rounds {
        batch.push(ns_each(
            QUERIES,
            || assert_eq!(batches(&table, &queries, &mut out, 32), hits),
            t,
        ));
        single.push(ns_each(
            QUERIES,
            || {
                let found = queries.iter().filter(|q| table.get(q).is_some()).count();
                assert_eq!(found, hits);
            },
            t,
        ));
        hb.push(ns_each(
            QUERIES,
            || {
                let found = queries.iter().filter(|q| map.get(*q).is_some()).count();
                assert_eq!(found, hits);
            },
            t,
        ));
    }
    (median(batch), median(single), median(hb))
}

/// `rounds` rounds of batched lookups only, one line `batch M/s` (the median) — the form
/// bench/flowtable_vs_dpdk.sh alternates with rte_hash's.
fn lookups_only<K: TableKey>(rounds: usize, conv: impl Fn(FlowKey) -> K) {
    let table = filled(&conv);
    let (queries, hits_expected) = workload();
    let queries: Vec<K> = queries.into_iter().map(conv).collect();
    let mut out = vec![None; 1024];
    let bulk = bulk_size();
    // `FLOWTABLE_TURNS=1`: a line `ready`, then a round for each line read on stdin, each
    // answered by a line of M/s (bench/flowtable_vs_dpdk.sh alternates them with rte_hash's).
    if std::env::var("FLOWTABLE_TURNS").is_ok() {
        println!(
            "ready: {} MiB on huge pages, {} B of table a flow",
            flowlane_io::huge::huge_page_bytes().unwrap_or(0) >> 20,
            table.memory_bytes() / FLOWS
        );
        for line in std::io::stdin().lines() {
            if line.is_err() {
                break;
            }
            let start = Instant::now();
            let hits = batches(&table, &queries, &mut out, bulk);
            let ns = start.elapsed().as_nanos() as f64 / QUERIES as f64;
            assert_eq!(hits, hits_expected, "every hit found, no miss found");
            println!("{:.3}", 1e3 / ns);
        }
        return;
    }
    let rounds: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let start = Instant::now();
            let hits = batches(&table, &queries, &mut out, bulk);
            let ns = start.elapsed().as_nanos() as f64 / QUERIES as f64;
            assert_eq!(hits, hits_expected, "every hit found, no miss found");
            ns
        })
        .collect();
    println!(
        "batch {:.2} (huge pages {} MiB, {} B of table a flow)",
        1e3 / median(rounds),
        flowlane_io::huge::huge_page_bytes().unwrap_or(0) >> 20,
        table.memory_bytes() / FLOWS
    );
}

/// `FLOWTABLE_INSERT_TURNS=1`: a line `ready`, then for each line read on stdin a round of inserts
/// on `FlowKey`s: 1 M flows into an empty table, then half of them removed in a shuffled order and
/// as many new flows inserted, then (the table filled to its capacity) half a million new flows,
/// each of which evicts one. Each round answers with a line of three rates, M/s: into the empty
/// table, into the churned one (a table that has seen flows come and go: its free slots or records
/// scattered), into the full one. For two builds' inserts alternated round by round, as
/// bench/flowtable_vs_dpdk.sh alternates lookups.
fn insert_turns(cfg: &Config) {
    println!("ready");
    for line in std::io::stdin().lines() {
        if line.is_err() {
            break;
        }
        let mut t: FlowTable<u32> = FlowTable::new(cfg).expect("table");
        let start = Instant::now();
        for i in 0..FLOWS as u64 {
            *t.upsert(&key(i, UDP), 0).value = i as u32;
        }
        let fresh = start.elapsed().as_nanos() as f64 / FLOWS as f64;
        // Every other flow, in a shuffled order (as flows end: not in the order they came).
        for j in 0..FLOWS as u64 {
            let i = j * 0x9E37_79B1 % FLOWS as u64;
            if i.is_multiple_of(2) {
                assert_eq!(t.remove(&key(i, UDP)), Some(i as u32));
            }
        }
        let start = Instant::now();
        for i in (FLOWS as u64..).take(FLOWS / 2) {
            *t.upsert(&key(i, UDP), 0).value = i as u32;
        }
        let churned = start.elapsed().as_nanos() as f64 / (FLOWS / 2) as f64;
        assert_eq!(t.len(), FLOWS);
        assert_eq!(t.stats().evicted_full + t.stats().evicted_no_room, 0);
        // Up to capacity, then half a million more: each evicts one (a flood of new flows).
        let mut next = FLOWS as u64 * 3 / 2;
        while t.len() < t.capacity() {
            t.upsert(&key(next, UDP), 1);
            next += 1;
        }
        let start = Instant::now();
        for i in (next..).take(FLOWS / 2) {
            *t.upsert(&key(i, UDP), 2).value = i as u32;
        }
        let full = start.elapsed().as_nanos() as f64 / (FLOWS / 2) as f64;
        let s = t.stats();
        assert!(s.evicted_full + s.evicted_no_room >= FLOWS as u64 / 2);
        println!("{:.3} {:.3} {:.3}", 1e3 / fresh, 1e3 / churned, 1e3 / full);
    }
}

fn main() {
    if std::env::var("FLOWTABLE_INSERT_TURNS").is_ok() {
        insert_turns(&Config::new(FLOWS * 92 / 90));
        return;
    }
    // `FLOWTABLE_LOOKUPS_ONLY=N`: N rounds of batched lookups only; `FLOWLANE_BULK` keys a
    // call and `FLOWLANE_KEY=16` the 16-byte IPv4 key (rte_hash's bench reads the same two).
    if let Some(n) = std::env::var("FLOWTABLE_LOOKUPS_ONLY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        if std::env::var("FLOWLANE_KEY").is_ok_and(|k| k == "16") {
            lookups_only(n, |k: FlowKey| k.as_v4().expect("IPv4 flows"));
        } else {
            lookups_only(n, |k| k);
        }
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let cfg = Config::new(FLOWS * 92 / 90);
    let table = filled(|k| k);
    let mut map: Map = Map::with_capacity(FLOWS);
    for i in 0..FLOWS as u64 {
        map.insert(key(i, UDP), i as u32);
    }
    let (queries, _) = workload();
    let mut out = vec![None; 1024];
    let bulk = bulk_size();

    let mut c = Criterion::default().configure_from_args().sample_size(20);
    let mut g = c.benchmark_group("lookup_1M_90pct_half_misses");
    g.throughput(Throughput::Elements(QUERIES as u64));
    g.bench_function("flowtable_batch", |b| {
        b.iter(|| batches(&table, black_box(&queries), &mut out, bulk))
    });
    g.bench_function("flowtable_single", |b| {
        b.iter(|| {
            let mut hits = 0u32;
            for q in black_box(&queries) {
                hits += u32::from(table.get(q).is_some());
            }
            hits
        })
    });
    g.bench_function("hashbrown", |b| {
        b.iter(|| {
            let mut hits = 0u32;
            for q in black_box(&queries) {
                hits += u32::from(map.get(q).is_some());
            }
            hits
        })
    });
    g.finish();
    c.final_summary();

    // Alternated rounds: ns a lookup.
    let (mut batch, mut single, mut hb) = (Vec::new(), Vec::new(), Vec::new());
    let t = Duration::from_millis(300);
    for _ in 0..ROUNDS {
        batch.push(ns_each(
            QUERIES,
            || {
                black_box(batches(&table, &queries, &mut out, bulk));
            },
            t,
        ));
        single.push(ns_each(
            QUERIES,
            || {
                let mut hits = 0u32;
                for q in &queries {
                    hits += u32::from(table.get(q).is_some());
                }
                black_box(hits);
            },
            t,
        ));
        hb.push(ns_each(
            QUERIES,
            || {
                let mut hits = 0u32;
                for q in &queries {
                    hits += u32::from(map.get(q).is_some());
                }
                black_box(hits);
            },
            t,
        ));
    }
    let (b, s, h) = (median(batch), median(single), median(hb));
    println!(
        "lookups, 1 M flows, {:.0} % of the slots full, 50 % misses (medians of {ROUNDS} \
         alternated rounds):",
        100.0 * FLOWS as f64 / table.slots() as f64
    );
    println!(
        "  flowtable batch {:.1} M/s, single {:.1} M/s; hashbrown {:.1} M/s; ratio batch / \
         hashbrown {:.2}, single / hashbrown {:.2}",
        1e3 / b,
        1e3 / s,
        1e3 / h,
        h / b,
        h / s
    );

    // Inserts: 1 M flows into empty tables, rounds alternated.
    let (mut ti, mut hi) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let mut t2: FlowTable<u32> = FlowTable::new(&cfg).expect("table");
        let start = Instant::now();
        for i in 0..FLOWS as u64 {
            *t2.upsert(&key(i, UDP), 0).value = i as u32;
        }
        ti.push(start.elapsed().as_nanos() as f64 / FLOWS as f64);
        black_box(&t2);
        let mut m2: Map = Map::with_capacity(FLOWS);
        let start = Instant::now();
        for i in 0..FLOWS as u64 {
            m2.insert(key(i, UDP), i as u32);
        }
        hi.push(start.elapsed().as_nanos() as f64 / FLOWS as f64);
        black_box(&m2);
    }
    let (ti, hi) = (median(ti), median(hi));
    println!(
        "inserts of 1 M flows: flowtable {:.1} M/s, hashbrown {:.1} M/s (ratio {:.2})",
        1e3 / ti,
        1e3 / hi,
        hi / ti
    );

    // Memory per flow at 90 % full (the table's own bytes with no value; hashbrown: its
    // buckets and control bytes for the same flows with a 4-byte value).
    let bare: FlowTable<()> = FlowTable::new(&cfg).expect("table");
    let hb_bytes = map.capacity() * (std::mem::size_of::<(FlowKey, u32)>() + 1);
    println!(
        "memory per flow at 1 M flows: flowtable {:.1} B (no value; {:.1} B with a u32; \
         a record for each of {} slots, for up to {} flows), hashbrown {:.1} B with a u32",
        bare.memory_bytes() as f64 / FLOWS as f64,
        table.memory_bytes() as f64 / FLOWS as f64,
        bare.slots(),
        bare.capacity(),
        hb_bytes as f64 / FLOWS as f64
    );
    drop((table, map, bare));

    // Lookups against hashbrown by table size: where each stays in the caches and where
    // both go to memory.
    println!("lookups by table size, 90 % of the slots full, 50 % misses (medians of 5 alternated rounds):");
    println!(
        "  {:>10}  {:>10}  {:>11}  {:>14}  {:>9}  {:>10}",
        "n", "batch M/s", "single M/s", "hashbrown M/s", "batch/hb", "single/hb"
    );
    let sizes: &[usize] = if quick {
        &[10_000, 100_000, 1_000_000]
    } else {
        &[10_000, 100_000, 1_000_000, 10_000_000]
    };
    for &n in sizes {
        let (b, s, h) = sweep_point(n, 5);
        println!(
            "  {n:>10}  {:>10.1}  {:>11.1}  {:>14.1}  {:>9.2}  {:>10.2}",
            1e3 / b,
            1e3 / s,
            1e3 / h,
            h / b,
            h / s
        );
    }

    // Expiry work per expired flow: n resident TCP flows (timeout 120 s, never due in the
    // window) and 1 000 UDP flows a tick (timeout 1 s, 10 ticks of 100 ms) that expire.
    println!("expiry work per expired flow, n resident flows + 1 000 short flows a tick:");
    println!(
        "  {:>10}  {:>14}  {:>16}  {:>8}",
        "n", "wheel ns/flow", "scanning ns/flow", "ratio"
    );
    for &n in sizes {
        let (w, sc) = expiry(n);
        println!("  {n:>10}  {w:>14.1}  {sc:>16.1}  {:>8.0}", sc / w);
    }
}

/// (wheel, scanning) nanoseconds of expiry work per expired flow.
fn expiry(n: usize) -> (f64, f64) {
    const CHURN: u64 = 1_000;
    const TICKS: u64 = 40;
    let tick = 100_000_000u64;
    let mut cfg = Config::new(n + 20 * CHURN as usize);
    cfg.timeouts_ns = [
        1_000_000_000,
        120_000_000_000,
        10_000_000_000,
        1_000_000_000,
    ];
    let mut t: FlowTable<u32> = FlowTable::new(&cfg).expect("table");
    // The scanning reference: the same flows in a map with their deadlines, swept each tick.
    let mut m: hashbrown::HashMap<FlowKey, u64> = hashbrown::HashMap::with_capacity(n + 20_000);
    for i in 0..n as u64 {
        t.upsert(&key(i, TCP), 0);
        m.insert(key(i, TCP), 120_000_000_000);
    }
    let (mut wheel_ns, mut scan_ns, mut expired_w, mut expired_s) = (0u128, 0u128, 0u64, 0u64);
    let mut next = n as u64;
    for k in 1..=TICKS {
        let now = k * tick;
        for _ in 0..CHURN {
            t.upsert(&key(next, UDP), now);
            m.insert(key(next, UDP), now + 1_000_000_000);
            next += 1;
        }
        let start = Instant::now();
        t.expire(now, |_, _, _| expired_w += 1);
        wheel_ns += start.elapsed().as_nanos();
        let start = Instant::now();
        let before = m.len();
        m.retain(|_, due| *due > now);
        expired_s += (before - m.len()) as u64;
        scan_ns += start.elapsed().as_nanos();
    }
    assert_eq!(expired_w, expired_s, "both expire the same flows");
    (
        wheel_ns as f64 / expired_w.max(1) as f64,
        scan_ns as f64 / expired_s.max(1) as f64,
    )
}
