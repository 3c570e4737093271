//! `route bench`: our FIB measured on a table against a reference measured in the same run —
//! DIR-24-8 (DPDK's rte_lpm design) for IPv4, per-length hash maps for IPv6 — for build time,
//! memory, update rates and lookups per second on one core in four traffic modes, every
//! lookup checked against the reference.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use flowlane_lpm::gen::Traffic;
use flowlane_lpm::{Dir24_8, Fib, FibWriter, Key, Prefix, Rib, NO_ROUTE};
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// How long and on how many addresses to measure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RouteBenchConfig {
    /// Seconds per measurement (the median of five runs is reported), in (0, 60].
    pub seconds: f64,
    /// Addresses per traffic mode.
    pub addresses: usize,
}

/// Lookups per second in one traffic mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ModeReport {
    /// Our FIB, batch lookups (0: not measured in this mode).
    pub batch_lps: f64,
    /// Our FIB, one at a time.
    pub single_lps: f64,
    /// The reference, batch.
    pub reference_batch_lps: f64,
    /// The reference, one at a time.
    pub reference_single_lps: f64,
    /// Ours over the reference (batch, or single where batch is not measured).
    pub ratio: f64,
}

/// One address family's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FamilyReport {
    /// Prefixes in the table.
    pub prefixes: usize,
    /// Seconds to build the table (RIB).
    pub table_build_s: f64,
    /// Seconds to build the FIB.
    pub fib_build_s: f64,
    /// The reference's name.
    pub reference: String,
    /// Seconds to build the reference.
    pub reference_build_s: f64,
    /// Bytes of the FIB.
    pub fib_bytes: usize,
    /// Of which the direct array.
    pub fib_direct_bytes: usize,
    /// Nodes.
    pub fib_nodes: usize,
    /// Nodes with inline leaves.
    pub fib_inline_nodes: usize,
    /// Prefix nodes.
    pub fib_prefix_nodes: usize,
    /// Flat first-level nodes.
    pub fib_flat_nodes: usize,
    /// Bytes of flat blocks.
    pub fib_flat_bytes: usize,
    /// Leaves.
    pub fib_leaves: usize,
    /// Range lines.
    pub fib_lines: usize,
    /// Of which escapes.
    pub fib_escapes: usize,
    /// Expanded first-level nodes.
    pub fib_expanded_roots: usize,
    /// Bytes of the reference (0: not measured).
    pub reference_bytes: usize,
    /// Bytes of the process on 2 MiB pages.
    pub process_huge_page_bytes: Option<u64>,
    /// `/sys/kernel/mm/transparent_hugepage/enabled`'s choice.
    pub thp_enabled: Option<String>,
    /// `…/defrag`'s choice.
    pub thp_defrag: Option<String>,
    /// Whether the kernel honours the huge-page advice under those settings.
    pub thp_advice_honoured: bool,
    /// Built with the POPCNT baseline.
    pub build_popcnt: bool,
    /// Routes taken out and put back.
    pub updates: usize,
    /// One by one, per second.
    pub inserts_per_s: f64,
    /// One by one, per second.
    pub deletes_per_s: f64,
    /// As one burst, per second.
    pub burst_inserts_per_s: f64,
    /// As one burst, per second.
    pub burst_deletes_per_s: f64,
    /// Seconds to publish a snapshot.
    pub publish_s: f64,
    /// Compactions during the updates.
    pub compactions: u64,
    /// Per traffic mode (keys of [`MODES`]).
    pub lookups: BTreeMap<String, ModeReport>,
    /// Lookups compared with the reference.
    pub checked: u64,
    /// Lookups of the updated FIB compared with a fresh build.
    pub update_checked: usize,
    /// Of those, disagreements.
    pub update_mismatches: u64,
    /// All disagreements (a non-zero count voids the figures).
    pub mismatches: u64,
}

/// Both families' results (`route bench --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RouteBenchReport {
    /// IPv4, when the table has IPv4 routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<FamilyReport>,
    /// IPv6, when the table has IPv6 routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<FamilyReport>,
}

/// Measures `v4` against DIR-24-8 and `v6` against per-length hash maps (each when not
/// empty).
pub fn run(
    v4: &[(Prefix<u32>, u32)],
    v6: &[(Prefix<u128>, u32)],
    cfg: &RouteBenchConfig,
) -> Result<RouteBenchReport, ToolError> {
    if !(cfg.seconds > 0.0 && cfg.seconds <= 60.0) {
        return Err(ToolError::usage(
            "seconds per measurement must be in (0, 60]",
        ));
    }
    if v4.is_empty() && v6.is_empty() {
        return Err(ToolError::usage("the table holds no routes"));
    }
    let ipv4 = (!v4.is_empty())
        .then(|| {
            bench_family(
                v4,
                cfg,
                "DIR-24-8",
                &|rib| {
                    let d = Dir24_8::build(rib);
                    let b = d.bytes();
                    (Box::new(d), b)
                },
                &|mode, n| flowlane_lpm::gen::traffic_v4(mode, v4, n, 7),
            )
        })
        .transpose()?;
    let ipv6 = (!v6.is_empty())
        .then(|| {
            bench_family(
                v6,
                cfg,
                "hash/len",
                &|rib| {
                    let mut r = flowlane_lpm::reference::Reference::default();
                    for (p, h) in rib.iter() {
                        r.insert(p, h);
                    }
                    (Box::new(HashRef(r)), 0)
                },
                &|mode, n| flowlane_lpm::gen::traffic_v6(mode, v6, n, 7),
            )
        })
        .transpose()?;
    Ok(RouteBenchReport { ipv4, ipv6 })
}

/// Median rate (items per second) of five runs of `f`, each repeated for `seconds / 5`.
fn rate(items: usize, seconds: f64, mut f: impl FnMut()) -> f64 {
    f(); // warm caches and pages
    let mut rates: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let mut n = 0usize;
            loop {
                f();
                n += items;
                let t = start.elapsed().as_secs_f64();
                if t >= seconds / 5.0 {
                    break n as f64 / t;
                }
            }
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[2]
}

/// One lookup structure as the bench drives it.
pub trait Lookup<K> {
    /// One lookup: the next hop, or `NO_ROUTE`.
    fn one(&self, a: K) -> u32;
    /// A batch of lookups into `out`.
    fn batch(&self, a: &[K], out: &mut [u32]);
}

impl<K: Key> Lookup<K> for Fib<K> {
    fn one(&self, a: K) -> u32 {
        self.lookup(a).unwrap_or(NO_ROUTE)
    }
    fn batch(&self, a: &[K], out: &mut [u32]) {
        self.lookup_batch(a, out)
    }
}

impl Lookup<u32> for Dir24_8 {
    fn one(&self, a: u32) -> u32 {
        self.lookup(a).unwrap_or(NO_ROUTE)
    }
    fn batch(&self, a: &[u32], out: &mut [u32]) {
        self.lookup_batch(a, out)
    }
}

/// Per-length hash maps (the IPv6 reference).
#[allow(missing_debug_implementations)] // the reference's maps are not Debug
pub struct HashRef<K: Key>(pub flowlane_lpm::reference::Reference<K>);

impl<K: Key> Lookup<K> for HashRef<K> {
    fn one(&self, a: K) -> u32 {
        self.0.lookup(a).unwrap_or(NO_ROUTE)
    }
    fn batch(&self, a: &[K], out: &mut [u32]) {
        for (o, &a) in out.iter_mut().zip(a) {
            *o = self.one(a);
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct ModeResult {
    batch: f64,
    single: f64,
    ref_batch: f64,
    ref_single: f64,
}

/// Lookups per second of `fib` and `reference` on `addrs` in `mode`, after checking that
/// both give the same answer for every address.
fn measure<K: Key>(
    fib: &Fib<K>,
    reference: &dyn Lookup<K>,
    addrs: &[K],
    dependent: bool,
    seconds: f64,
    mismatches: &mut u64,
) -> ModeResult {
    let mut out = vec![0u32; addrs.len()];
    let mut want = vec![0u32; addrs.len()];
    fib.lookup_batch(addrs, &mut out);
    reference.batch(addrs, &mut want);
    *mismatches += out.iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
    let n = addrs.len();
    let mask = (n + 1).next_power_of_two() / 2 - 1; // the largest power of two <= n, minus 1
    let chase = |l: &dyn Lookup<K>| {
        // Each address is picked by the previous lookup's result.
        let mut i = 0usize;
        let mut acc = 0u32;
        for _ in 0..n {
            let h = l.one(addrs[i]);
            acc = acc.wrapping_add(h);
            i = (i + 1 + (h as usize & 15)) & mask;
        }
        black_box(acc);
    };
    if dependent {
        ModeResult {
            single: rate(n, seconds, || chase(fib)),
            ref_single: rate(n, seconds, || chase(reference)),
            ..Default::default()
        }
    } else {
        ModeResult {
            batch: rate(n, seconds, || fib.lookup_batch(black_box(addrs), &mut out)),
            single: rate(n, seconds, || {
                for (o, &a) in out.iter_mut().zip(black_box(addrs)) {
                    *o = fib.lookup(a).unwrap_or(NO_ROUTE);
                }
            }),
            ref_batch: rate(n, seconds, || reference.batch(black_box(addrs), &mut want)),
            ref_single: rate(n, seconds, || {
                for (o, &a) in want.iter_mut().zip(black_box(addrs)) {
                    *o = reference.one(a);
                }
            }),
        }
    }
}

/// Builds the reference structure for a table; returns it and its size in bytes (0: not
/// measured).
pub type MakeRef<K> = dyn Fn(&Rib<K>) -> (Box<dyn Lookup<K>>, usize);

/// The traffic modes: (JSON key, label).
pub const MODES: [(&str, &str); 4] = [
    ("uniform", "uniform random addresses"),
    ("inside", "inside routed prefixes"),
    ("dependent", "dependent (latency)"),
    ("working_set", "repeated working set (1024)"),
];

/// Measures one address family's table: build, memory, updates, four traffic modes against
/// `reference_name` (built by `make_ref`), every lookup checked.
///
/// Long: the measurement in its order — build, memory, updates, then each traffic mode
/// alternated with the reference — every lookup checked where it is made.
pub fn bench_family<K: Key>(
    routes: &[(Prefix<K>, u32)],
    a: &RouteBenchConfig,
    reference_name: &str,
    make_ref: &MakeRef<K>,
    traffic: &dyn Fn(Traffic, usize) -> Vec<K>,
) -> Result<FamilyReport, ToolError> {
    let t = Instant::now();
    let rib =
        Rib::from_routes(routes.iter().copied()).map_err(|e| ToolError::usage(e.to_string()))?;
    let rib_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let fib = Fib::build(&rib);
    let build_s = t.elapsed().as_secs_f64();
    let stats = fib.stats();
    let t = Instant::now();
    let (reference, ref_bytes) = make_ref(&rib);
    let ref_build_s = t.elapsed().as_secs_f64();

    // Updates: every tenth route leaves the table, then goes back in through the writer
    // (incremental FIB update per route), then is deleted again; then the same as bursts.
    let updates: Vec<(Prefix<K>, u32)> = routes.iter().copied().step_by(10).collect();
    let base = Rib::from_routes(
        routes
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 10 != 0)
            .map(|(_, r)| *r),
    )
    .map_err(|e| ToolError::usage(e.to_string()))?;
    let mut w = FibWriter::new(base);
    let t = Instant::now();
    for &(p, h) in &updates {
        w.insert(p, h)
            .map_err(|e| ToolError::usage(e.to_string()))?;
    }
    let ins_s = t.elapsed().as_secs_f64();
    // The incrementally updated FIB now holds the whole table again: it must answer exactly
    // as the one built from scratch (itself checked against the reference below).
    let check = traffic(Traffic::Inside, 1 << 16);
    let (mut got, mut want) = (vec![0u32; check.len()], vec![0u32; check.len()]);
    w.fib().lookup_batch(&check, &mut got);
    fib.lookup_batch(&check, &mut want);
    let update_mismatches = got.iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
    let t = Instant::now();
    w.publish();
    let publish_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for &(p, _) in &updates {
        w.remove(p);
    }
    let del_s = t.elapsed().as_secs_f64();
    // The same routes as one burst each way (sorted, each touched slot rebuilt once).
    let mut burst: Vec<(Prefix<K>, Option<u32>)> =
        updates.iter().map(|&(p, h)| (p, Some(h))).collect();
    let t = Instant::now();
    w.apply_batch(&mut burst)
        .map_err(|e| ToolError::usage(e.to_string()))?;
    let bins_s = t.elapsed().as_secs_f64();
    let mut burst: Vec<(Prefix<K>, Option<u32>)> =
        updates.iter().map(|&(p, _)| (p, None)).collect();
    let t = Instant::now();
    w.apply_batch(&mut burst)
        .map_err(|e| ToolError::usage(e.to_string()))?;
    let bdel_s = t.elapsed().as_secs_f64();
    let rebuilds = w.rebuilds();
    drop(w);

    let n = a.addresses;
    let mut mismatches = update_mismatches;
    let mut modes = Vec::new();
    for (key, _) in MODES {
        let addrs = match key {
            "uniform" => traffic(Traffic::Uniform, n),
            "working_set" => traffic(Traffic::WorkingSet(1024), n),
            _ => traffic(Traffic::Inside, n),
        };
        let r = measure(
            &fib,
            reference.as_ref(),
            &addrs,
            key == "dependent",
            a.seconds,
            &mut mismatches,
        );
        modes.push((key, r));
    }
    let checked = n as u64 * MODES.len() as u64;

    let per_s = |count: usize, s: f64| count as f64 / s.max(1e-9);
    let mut lookups = std::collections::BTreeMap::new();
    for ((key, _), (_, r)) in MODES.iter().zip(&modes) {
        let ratio = if r.batch > 0.0 {
            r.batch / r.ref_batch
        } else {
            r.single / r.ref_single
        };
        lookups.insert(
            key.to_string(),
            ModeReport {
                batch_lps: r.batch,
                single_lps: r.single,
                reference_batch_lps: r.ref_batch,
                reference_single_lps: r.ref_single,
                ratio,
            },
        );
    }
    // Both structures are allocated through the binary's huge-page allocator; say how much
    // of the process the kernel actually backed with 2 MiB pages (0 where THP is off).
    let thp = flowlane_io::huge::Thp::read();
    Ok(FamilyReport {
        prefixes: rib.len(),
        table_build_s: rib_s,
        fib_build_s: build_s,
        reference: reference_name.to_string(),
        reference_build_s: ref_build_s,
        fib_bytes: stats.bytes,
        fib_direct_bytes: stats.direct_bytes,
        fib_nodes: stats.nodes,
        fib_inline_nodes: stats.inline_nodes,
        fib_prefix_nodes: stats.prefix_nodes,
        fib_flat_nodes: stats.flat_nodes,
        fib_flat_bytes: stats.flat_bytes,
        fib_leaves: stats.leaves,
        fib_lines: stats.lines,
        fib_escapes: stats.escapes,
        fib_expanded_roots: stats.expanded_roots,
        reference_bytes: ref_bytes,
        process_huge_page_bytes: flowlane_io::huge::huge_page_bytes(),
        thp_enabled: thp.as_ref().map(|t| t.enabled.clone()),
        thp_defrag: thp.as_ref().map(|t| t.defrag.clone()),
        thp_advice_honoured: thp.as_ref().is_some_and(|t| t.advice_is_honoured()),
        build_popcnt: cfg!(target_feature = "popcnt"),
        updates: updates.len(),
        inserts_per_s: per_s(updates.len(), ins_s),
        deletes_per_s: per_s(updates.len(), del_s),
        burst_inserts_per_s: per_s(updates.len(), bins_s),
        burst_deletes_per_s: per_s(updates.len(), bdel_s),
        publish_s,
        compactions: rebuilds,
        lookups,
        checked,
        update_checked: check.len(),
        update_mismatches,
        mismatches,
    })
}
