//! `flowlane route gen|lookup|bench`: the longest-prefix-match FIB from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use flowlane_lpm::gen;
use flowlane_lpm::load::{self, Format};
use flowlane_lpm::{Fib, Key, Rib, Table};
use flowlane_tools::route::{self, FamilyReport, RouteBenchConfig};

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
    /// of `ip route show` / `ip -6 route show` (next hops become numbered, with a legend);
    /// `kernel`: this namespace's main table, read by rtnetlink (both families, next hops
    /// named `via GW dev IF`, `dev IF` or `nowhere`) — what `forward --mode route` loads.
    #[arg(long, value_name = "FILE|kernel")]
    table: PathBuf,
    /// Table format.
    #[arg(long, value_enum, default_value_t = FormatArg::Auto)]
    format: FormatArg,
}

impl TableArgs {
    fn load(&self) -> Result<Table, Failure> {
        if self.table.as_os_str() == "kernel" {
            return flowlane_tools::route::tables::kernel_table().map_err(Failure::from_tool);
        }
        let text = flowlane_tools::input::read_text(
            "--table",
            &self.table,
            flowlane_tools::input::ROUTES,
            None,
        )
        .map_err(Failure::from_tool)?;
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
///   flowlane route lookup --table kernel 198.18.7.7
///   flowlane route lookup --table kernel --json - < addresses.txt
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct LookupArgs {
    #[command(flatten)]
    table: TableArgs,
    /// Addresses (IPv4 or IPv6); `-` reads them from standard input, one per line.
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
    let mut addrs = Vec::new();
    for s in &a.addrs {
        if s == "-" {
            let text =
                flowlane_tools::input::read_stdin_text("addresses", flowlane_tools::input::ROUTES)
                    .map_err(Failure::from_tool)?;
            addrs.extend(text.split_whitespace().map(str::to_string));
        } else {
            addrs.push(s.clone());
        }
    }
    for s in &addrs {
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
        let lookups = rows
            .iter()
            .map(|(addr, p, h)| route::Lookup {
                address: addr.clone(),
                prefix: p.clone(),
                next_hop: *h,
                next_hop_name: h.map(|h| t.hop_name(h)),
            })
            .collect();
        print_json(&route::LookupReport {
            lookups,
            legend: t.legend.clone(),
        })?;
    } else {
        let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        for (addr, p, h) in &rows {
            match (p, h) {
                (Some(p), Some(h)) if t.legend.is_empty() => {
                    outln!("{addr:w$}  {p:20}  next hop {h}")
                }
                (Some(p), Some(h)) => {
                    outln!("{addr:w$}  {p:20}  next hop {h} ({})", t.hop_name(*h))
                }
                _ => outln!("{addr:w$}  no route"),
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

fn run_bench(a: BenchArgs) -> CmdResult {
    let t = a.table.load()?;
    if let Some(cpu) = a.cpu {
        flowlane_io::os::pin_current_thread(cpu)
            .map_err(|e| Failure::usage(anyhow::anyhow!("cannot pin to CPU {cpu}: {e}")))?;
    }
    let cfg = RouteBenchConfig {
        seconds: a.seconds,
        addresses: a.addresses as usize,
    };
    let r = route::run(&t.v4, &t.v6, &cfg).map_err(|e| {
        Failure::from_tool(flowlane_tools::ToolError {
            message: format!("{}: {}", a.table.table.display(), e.message),
            ..e
        })
    })?;
    let families = [("IPv4", &r.ipv4), ("IPv6", &r.ipv6)];
    if a.json {
        print_json(&r)?;
    } else {
        for (name, f) in families {
            if let Some(f) = f {
                out!("{}", family_text(name, f));
            }
        }
    }
    let mismatches: u64 = families
        .iter()
        .filter_map(|f| f.1.as_ref())
        .map(|f| f.mismatches)
        .sum();
    if mismatches > 0 {
        errln!("flowlane: error: {mismatches} lookups disagreed with the reference — the figures above are void");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// One family's results as text.
fn family_text(name: &str, f: &FamilyReport) -> String {
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    let m = |r: f64| r / 1e6;
    let reference_name = &f.reference;
    let mut text = format!(
        "{name}: {} prefixes\n  build      table {:.0} ms ({:.2} M inserts/s), FIB {:.0} ms, {reference_name} {:.0} ms\n  \
         memory     FIB {:.2} MiB (direct {:.2} MiB, {} flat first-level nodes in {:.2} MiB, {} expanded first-level nodes, {} nodes of which {} with inline leaves and {} prefix nodes, {} leaves, {} range lines of which {} escapes); {reference_name} {}\n  \
         updates    {} routes one by one: insert {:.2} M/s, delete {:.2} M/s; as one burst: insert {:.2} M/s, \
         delete {:.2} M/s; publish {:.2} ms; {} compactions\n  \
         lookups    M lookups/s, one core     FIB batch   single   {reference_name:>9} batch   single   batch ×\n",
        f.prefixes,
        f.table_build_s * 1e3,
        m(f.prefixes as f64 / f.table_build_s.max(1e-9)),
        f.fib_build_s * 1e3,
        f.reference_build_s * 1e3,
        mib(f.fib_bytes),
        mib(f.fib_direct_bytes),
        f.fib_flat_nodes,
        mib(f.fib_flat_bytes),
        f.fib_expanded_roots,
        f.fib_nodes,
        f.fib_inline_nodes,
        f.fib_prefix_nodes,
        f.fib_leaves,
        f.fib_lines,
        f.fib_escapes,
        if f.reference_bytes > 0 { format!("{:.1} MiB", mib(f.reference_bytes)) } else { "not measured".to_string() },
        f.updates,
        m(f.inserts_per_s),
        m(f.deletes_per_s),
        m(f.burst_inserts_per_s),
        m(f.burst_deletes_per_s),
        f.publish_s * 1e3,
        f.compactions,
    );
    let dash = |v: f64| {
        if v == 0.0 {
            format!("{:>8}", "-")
        } else {
            format!("{:8.1}", m(v))
        }
    };
    for (key, label) in route::MODES {
        if let Some(r) = f.lookups.get(key) {
            text.push_str(&format!(
                "    {label:29} {}  {}   {}  {}   {:6.2}\n",
                dash(r.batch_lps),
                dash(r.single_lps),
                dash(r.reference_batch_lps),
                dash(r.reference_single_lps),
                r.ratio
            ));
        }
    }
    text.push_str(&format!(
        "  pages      {} of the process on 2 MiB pages (allocations of 2 MiB and more are advised onto them; {})\n",
        f.process_huge_page_bytes.map_or("unknown".to_string(), |b| format!("{:.1} MiB", mib(b as usize))),
        match (&f.thp_enabled, &f.thp_defrag) {
            (Some(e), Some(d)) => format!(
                "THP enabled={e} defrag={d}{}",
                if f.thp_advice_honoured { "" } else { ": advice not honoured, expect few or none" }
            ),
            _ => "no transparent huge pages here".to_string(),
        }
    ));
    // Whether this binary has the POPCNT baseline the lookup counts bits with (a plain
    // `cargo install` away from the repository's .cargo/config.toml does not).
    text.push_str(if f.build_popcnt {
        "  binary     x86-64-v2 baseline: POPCNT and SSE4.1 in the lookup\n"
    } else {
        "  binary     !! without POPCNT: lookups run 1.1-1.7x slower (BENCHMARKS.md, \"Installed \
         builds\"); install from the repository root: cargo install --locked --path crates/cli\n"
    });
    text.push_str(&format!(
        "  check      {} lookups compared with {reference_name}: {} mismatches; {} lookups of the \
         incrementally updated FIB compared with a fresh build: {} mismatches\n",
        f.checked,
        f.mismatches - f.update_mismatches,
        f.update_checked,
        f.update_mismatches
    ));
    text
}
