//! `flowlane route gen|lookup|bench`: the longest-prefix-match FIB from the command line.

use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Subcommand, ValueEnum};
use flowlane_lpm::gen::{self, Traffic};
use flowlane_lpm::load::{self, Format};
use flowlane_lpm::{Dir24_8, Fib, FibWriter, Key, Prefix, Rib, Table, NO_ROUTE};
use serde_json::{json, Value};

use crate::args::print_json;
use crate::{CmdResult, Failure};

/// Longest-prefix match: generate tables, look up addresses, benchmark our FIB.
///
/// Examples:
///   flowlane route gen --v4 950000 --seed 1 > t4.txt
///   flowlane route lookup --table t4.txt 198.18.0.1
///   flowlane route bench --table t4.txt
#[derive(Debug, Subcommand)]
#[command(verbatim_doc_comment)]
pub enum RouteCommand {
    Gen(GenArgs),
    Lookup(LookupArgs),
    Bench(BenchArgs),
}

/// Write a synthetic routing table shaped like the public BGP table.
///
/// The prefix-length mix and more-specifics nested in covering prefixes of the real table,
/// deterministic for a seed, in the plain `PREFIX/LEN NEXTHOP` format.
///
/// Examples:
///   flowlane route gen --v4 950000 --seed 1 > table.txt
///   flowlane route gen --v6 220000 > table6.txt
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct GenArgs {
    /// IPv4 prefixes (the public table holds about 1 million).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=4_000_000))]
    v4: u64,
    /// IPv6 prefixes (the public table holds about 220 000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=4_000_000))]
    v6: u64,
    /// Seed: the same seed gives the same table.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct next hops (routers' FIBs have tens, not thousands).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    next_hops: u32,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    /// Plain if the first route line is `PREFIX NUMBER`, else `ip route` output.
    Auto,
    /// `PREFIX/LEN NEXTHOP` per line.
    Plain,
    /// The output of `ip route show` / `ip -6 route show`.
    IpRoute,
}

#[derive(Debug, Args)]
struct TableArgs {
    /// Routing table file: `PREFIX/LEN NEXTHOP` lines (as `route gen` writes) or the output
    /// of `ip route show` / `ip -6 route show` (next hops become numbered, with a legend).
    #[arg(long, value_name = "FILE")]
    table: PathBuf,
    /// Table format.
    #[arg(long, value_enum, default_value_t = FormatArg::Auto)]
    format: FormatArg,
}

impl TableArgs {
    fn load(&self) -> Result<Table, Failure> {
        let text = std::fs::read_to_string(&self.table).map_err(|e| {
            Failure::usage(anyhow::anyhow!(
                "cannot read table {}: {e}",
                self.table.display()
            ))
        })?;
        let format = match self.format {
            FormatArg::Auto => Format::Auto,
            FormatArg::Plain => Format::Plain,
            FormatArg::IpRoute => Format::IpRoute,
        };
        load::parse(&text, format)
            .map_err(|e| Failure::usage(anyhow::anyhow!("{}: {e}", self.table.display())))
    }
}

/// Look addresses up in a table: the matching prefix and its next hop per address.
///
/// Examples:
///   flowlane route lookup --table table.txt 198.18.0.1 2001:2::1
///   ip route show > rt.txt; flowlane route lookup --table rt.txt 198.18.7.7
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct LookupArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Addresses (IPv4 or IPv6).
    #[arg(required = true, value_name = "ADDR")]
    addrs: Vec<String>,
    /// Print JSON.
    #[arg(long, short = 'J')]
    json: bool,
}

/// Measure the FIB on a table against DIR-24-8: memory, updates, lookups per second.
///
/// Build time, memory, insert and delete rates, and lookups per
/// second on one core in four traffic modes, each next to DIR-24-8 (DPDK's rte_lpm design)
/// for IPv4 or the per-length hash reference for IPv6, measured in the same run. Every
/// lookup result is checked against the reference structure; a mismatch fails the run.
///
/// Traffic modes: uniform random addresses (IPv6: uniform over 2000::/3, where the routes
/// are); addresses inside routed prefixes; dependent
/// lookups (each address chosen by the previous result, so lookups cannot overlap: latency);
/// a repeated working set of 1024 addresses (cache-resident).
///
/// Example:
///   flowlane route gen --v4 950000 --seed 1 > t4.txt && flowlane route bench --table t4.txt
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Seconds per measurement (the median of five runs is reported).
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Addresses per traffic mode.
    #[arg(long, default_value_t = 1 << 22, value_parser = clap::value_parser!(u64).range(1024..=1 << 26))]
    addresses: u64,
    /// Pin the benchmark thread to this CPU (default: the CPU it starts on).
    #[arg(long)]
    cpu: Option<usize>,
    /// Print JSON.
    #[arg(long, short = 'J')]
    json: bool,
}

pub fn run(c: RouteCommand) -> CmdResult {
    match c {
        RouteCommand::Gen(a) => run_gen(a),
        RouteCommand::Lookup(a) => run_lookup(a),
        RouteCommand::Bench(a) => run_bench(a),
    }
}

fn run_gen(a: GenArgs) -> CmdResult {
    if a.v4 == 0 && a.v6 == 0 {
        return Err(Failure::usage(anyhow::anyhow!(
            "say how many prefixes: --v4 N and/or --v6 N (e.g. --v4 950000)"
        )));
    }
    let t = Table {
        v4: gen::ipv4(a.v4 as usize, a.seed, a.next_hops),
        v6: gen::ipv6(a.v6 as usize, a.seed, a.next_hops),
        legend: Vec::new(),
    };
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(t.to_plain().as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| Failure::runtime(anyhow::anyhow!("writing the table: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

fn run_lookup(a: LookupArgs) -> CmdResult {
    let t = a.table.load()?;
    let rib4 = Rib::from_routes(t.v4.iter().copied()).map_err(Failure::usage)?;
    let rib6 = Rib::from_routes(t.v6.iter().copied()).map_err(Failure::usage)?;
    let (fib4, fib6) = (Fib::build(&rib4), Fib::build(&rib6));
    let mut rows = Vec::new();
    for s in &a.addrs {
        let (prefix, hop) = if let Ok(v4) = s.parse::<std::net::Ipv4Addr>() {
            explain(&rib4, &fib4, v4.into())?
        } else if let Ok(v6) = s.parse::<std::net::Ipv6Addr>() {
            explain(&rib6, &fib6, v6.into())?
        } else {
            return Err(Failure::usage(anyhow::anyhow!(
                "`{s}` is not an IPv4 or IPv6 address"
            )));
        };
        rows.push((s.clone(), prefix, hop));
    }
    if a.json {
        let v: Vec<Value> = rows
            .iter()
            .map(|(addr, p, h)| {
                json!({"address": addr, "prefix": p, "next_hop": h,
                       "next_hop_name": h.map(|h| t.hop_name(h))})
            })
            .collect();
        print_json(&json!({"lookups": v, "legend": t.legend}))?;
    } else {
        let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        for (addr, p, h) in &rows {
            match (p, h) {
                (Some(p), Some(h)) if t.legend.is_empty() => {
                    println!("{addr:w$}  {p:20}  next hop {h}")
                }
                (Some(p), Some(h)) => {
                    println!("{addr:w$}  {p:20}  next hop {h} ({})", t.hop_name(*h))
                }
                _ => println!("{addr:w$}  no route"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The FIB's answer with the table's matching prefix; the two must agree.
fn explain<K: Key>(
    rib: &Rib<K>,
    fib: &Fib<K>,
    addr: K,
) -> Result<(Option<String>, Option<u32>), Failure> {
    let m = rib.matching(addr);
    let hop = fib.lookup(addr);
    if m.map(|m| m.1) != hop {
        return Err(Failure::runtime(anyhow::anyhow!(
            "internal error: the FIB says {hop:?} but the table's longest match is {m:?}"
        )));
    }
    Ok((m.map(|(p, _)| p.to_string()), hop))
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
trait Lookup<K> {
    fn one(&self, a: K) -> u32;
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
struct HashRef<K: Key>(flowlane_lpm::reference::Reference<K>);

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

#[derive(Debug, Default)]
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
type MakeRef<K> = dyn Fn(&Rib<K>) -> (Box<dyn Lookup<K>>, usize);

struct FamilyReport {
    json: Value,
    text: String,
    mismatches: u64,
}

const MODES: [(&str, &str); 4] = [
    ("uniform", "uniform random addresses"),
    ("inside", "inside routed prefixes"),
    ("dependent", "dependent (latency)"),
    ("working_set", "repeated working set (1024)"),
];

fn bench_family<K: Key>(
    name: &str,
    routes: &[(Prefix<K>, u32)],
    a: &BenchArgs,
    reference_name: &str,
    make_ref: &MakeRef<K>,
    traffic: &dyn Fn(Traffic, usize) -> Vec<K>,
) -> Result<FamilyReport, Failure> {
    let t = Instant::now();
    let rib = Rib::from_routes(routes.iter().copied()).map_err(Failure::usage)?;
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
    .map_err(Failure::usage)?;
    let mut w = FibWriter::new(base);
    let t = Instant::now();
    for &(p, h) in &updates {
        w.insert(p, h).map_err(Failure::usage)?;
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
    w.apply_batch(&mut burst).map_err(Failure::usage)?;
    let bins_s = t.elapsed().as_secs_f64();
    let mut burst: Vec<(Prefix<K>, Option<u32>)> =
        updates.iter().map(|&(p, _)| (p, None)).collect();
    let t = Instant::now();
    w.apply_batch(&mut burst).map_err(Failure::usage)?;
    let bdel_s = t.elapsed().as_secs_f64();
    let rebuilds = w.rebuilds();
    drop(w);

    let n = a.addresses as usize;
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

    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let m = |r: f64| r / 1e6;
    let per_s = |count: usize, s: f64| count as f64 / s.max(1e-9);
    let mut text = format!(
        "{name}: {} prefixes\n  build      table {:.0} ms ({:.2} M inserts/s), FIB {:.0} ms, {reference_name} {:.0} ms\n  \
         memory     FIB {:.2} MiB (direct {:.2} MiB, {} flat first-level nodes in {:.2} MiB, {} expanded first-level nodes, {} nodes of which {} with inline leaves and {} prefix nodes, {} leaves, {} range lines of which {} escapes); {reference_name} {}\n  \
         updates    {} routes one by one: insert {:.2} M/s, delete {:.2} M/s; as one burst: insert {:.2} M/s, \
         delete {:.2} M/s; publish {:.2} ms; {rebuilds} compactions\n  \
         lookups    M lookups/s, one core     FIB batch   single   {reference_name:>9} batch   single   batch ×\n",
        rib.len(),
        rib_s * 1e3,
        m(per_s(routes.len(), rib_s)),
        build_s * 1e3,
        ref_build_s * 1e3,
        mib(stats.bytes),
        mib(stats.direct_bytes),
        stats.flat_nodes,
        mib(stats.flat_bytes),
        stats.expanded_roots,
        stats.nodes,
        stats.inline_nodes,
        stats.prefix_nodes,
        stats.leaves,
        stats.lines,
        stats.escapes,
        if ref_bytes > 0 { format!("{:.1} MiB", mib(ref_bytes)) } else { "not measured".to_string() },
        updates.len(),
        m(per_s(updates.len(), ins_s)),
        m(per_s(updates.len(), del_s)),
        m(per_s(updates.len(), bins_s)),
        m(per_s(updates.len(), bdel_s)),
        publish_s * 1e3,
    );
    let dash = |v: f64| {
        if v == 0.0 {
            format!("{:>8}", "-")
        } else {
            format!("{:8.1}", m(v))
        }
    };
    let mut jmodes = serde_json::Map::new();
    for ((key, label), (_, r)) in MODES.iter().zip(&modes) {
        let ratio = if r.batch > 0.0 {
            r.batch / r.ref_batch
        } else {
            r.single / r.ref_single
        };
        text.push_str(&format!(
            "    {label:29} {}  {}   {}  {}   {ratio:6.2}\n",
            dash(r.batch),
            dash(r.single),
            dash(r.ref_batch),
            dash(r.ref_single)
        ));
        jmodes.insert(
            key.to_string(),
            json!({"batch_lps": r.batch, "single_lps": r.single, "reference_batch_lps": r.ref_batch,
                   "reference_single_lps": r.ref_single, "ratio": ratio}),
        );
    }
    // Both structures are allocated through the binary's huge-page allocator; say how much
    // of the process the kernel actually backed with 2 MiB pages (0 where THP is off).
    let huge = flowlane_io::huge::huge_page_bytes();
    let thp = flowlane_io::huge::Thp::read();
    text.push_str(&format!(
        "  pages      {} of the process on 2 MiB pages (allocations of 2 MiB and more are advised onto them; {})\n",
        huge.map_or("unknown".to_string(), |b| format!("{:.1} MiB", mib(b as usize))),
        thp.as_ref().map_or("no transparent huge pages here".to_string(), |t| format!(
            "THP enabled={} defrag={}{}",
            t.enabled,
            t.defrag,
            if t.advice_is_honoured() { "" } else { ": advice not honoured, expect few or none" }
        ))
    ));
    // Whether this binary has the POPCNT baseline the lookup counts bits with (a plain
    // `cargo install` away from the repository's .cargo/config.toml does not).
    text.push_str(if cfg!(target_feature = "popcnt") {
        "  build      x86-64-v2 baseline: POPCNT and SSE4.1 in the lookup\n"
    } else {
        "  build      !! without POPCNT: lookups run 1.1-1.7x slower (BENCHMARKS.md, \"Installed \
         builds\"); install from the repository root: cargo install --locked --path crates/cli\n"
    });
    text.push_str(&format!(
        "  check      {checked} lookups compared with {reference_name}: {} mismatches; {} lookups of the \
         incrementally updated FIB compared with a fresh build: {update_mismatches} mismatches\n",
        mismatches - update_mismatches,
        check.len()
    ));
    let json = json!({
        "prefixes": rib.len(),
        "table_build_s": rib_s,
        "fib_build_s": build_s,
        "reference": reference_name,
        "reference_build_s": ref_build_s,
        "fib_bytes": stats.bytes,
        "fib_nodes": stats.nodes,
        "fib_inline_nodes": stats.inline_nodes,
        "fib_prefix_nodes": stats.prefix_nodes,
        "fib_flat_nodes": stats.flat_nodes,
        "fib_flat_bytes": stats.flat_bytes,
        "fib_leaves": stats.leaves,
        "fib_lines": stats.lines,
        "fib_escapes": stats.escapes,
        "fib_expanded_roots": stats.expanded_roots,
        "reference_bytes": ref_bytes,
        "process_huge_page_bytes": huge,
        "thp_enabled": thp.as_ref().map(|t| t.enabled.clone()),
        "thp_defrag": thp.as_ref().map(|t| t.defrag.clone()),
        "build_popcnt": cfg!(target_feature = "popcnt"),
        "updates": updates.len(),
        "inserts_per_s": per_s(updates.len(), ins_s),
        "deletes_per_s": per_s(updates.len(), del_s),
        "burst_inserts_per_s": per_s(updates.len(), bins_s),
        "burst_deletes_per_s": per_s(updates.len(), bdel_s),
        "publish_s": publish_s,
        "compactions": rebuilds,
        "lookups": jmodes,
        "checked": checked,
        "update_checked": check.len(),
        "update_mismatches": update_mismatches,
        "mismatches": mismatches,
    });
    Ok(FamilyReport {
        json,
        text,
        mismatches,
    })
}

fn run_bench(a: BenchArgs) -> CmdResult {
    if !(a.seconds > 0.0 && a.seconds <= 60.0) {
        return Err(Failure::usage(anyhow::anyhow!(
            "--seconds must be in (0, 60]"
        )));
    }
    let t = a.table.load()?;
    if t.v4.is_empty() && t.v6.is_empty() {
        return Err(Failure::usage(anyhow::anyhow!(
            "{} holds no routes",
            a.table.table.display()
        )));
    }
    if let Some(cpu) = a.cpu {
        flowlane_io::os::pin_current_thread(cpu)
            .map_err(|e| Failure::usage(anyhow::anyhow!("cannot pin to CPU {cpu}: {e}")))?;
    }
    let mut reports = Vec::new();
    if !t.v4.is_empty() {
        let r = bench_family(
            "IPv4",
            &t.v4,
            &a,
            "DIR-24-8",
            &|rib| {
                let d = Dir24_8::build(rib);
                let b = d.bytes();
                (Box::new(d), b)
            },
            &|mode, n| gen::traffic_v4(mode, &t.v4, n, 7),
        )?;
        reports.push(("ipv4", r));
    }
    if !t.v6.is_empty() {
        let r = bench_family(
            "IPv6",
            &t.v6,
            &a,
            "hash/len",
            &|rib| {
                let mut r = flowlane_lpm::reference::Reference::default();
                for (p, h) in rib.iter() {
                    r.insert(p, h);
                }
                (Box::new(HashRef(r)), 0)
            },
            &|mode, n| gen::traffic_v6(mode, &t.v6, n, 7),
        )?;
        reports.push(("ipv6", r));
    }
    let mismatches: u64 = reports.iter().map(|r| r.1.mismatches).sum();
    if a.json {
        let mut m = serde_json::Map::new();
        for (k, r) in &reports {
            m.insert(k.to_string(), r.json.clone());
        }
        print_json(&Value::Object(m))?;
    } else {
        for (_, r) in &reports {
            print!("{}", r.text);
        }
    }
    if mismatches > 0 {
        eprintln!("flowlane: error: {mismatches} lookups disagreed with the reference — the figures above are void");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
