//! `flowlane rss show|keygen`: explain a key, an indirection table and a bucket→CPU map.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use flowlane_rss::Key;
use rand::SeedableRng;

use crate::args::{cpu_count, print_json, ModelArgs};
use crate::{CmdResult, Failure};

/// Explain an RSS key and indirection table, and make new keys.
///
/// Examples:
///   flowlane rss show --key symmetric --queues 4
///   flowlane rss show --reta <(ethtool -x eth0)
///   flowlane rss keygen --len 52 --colon
#[derive(Debug, Subcommand)]
#[command(verbatim_doc_comment)]
pub enum RssCommand {
    Show(ShowArgs),
    Keygen(KeygenArgs),
}

/// Explain a key and an indirection table: period, hash bits, spread, bucket→CPU map.
///
/// Shows the key (hex and ethtool form, period, usable hash bits), how evenly it spreads a
/// sample of flows over the indirection table, the table itself, and FreeBSD's bucket→CPU map.
///
/// Examples:
///   flowlane rss show
///   flowlane rss show --key symmetric --queues 4
///   flowlane rss show --reta <(ethtool -x eth0) --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ShowArgs {
    #[command(flatten)]
    model: ModelArgs,

    /// CPUs for the FreeBSD bucket→CPU table. Default: this machine's CPU count (with
    /// `--model freebsd`, the model's own: --queues CPUs and --bits).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096), conflicts_with = "bits")]
    cpus: Option<u32>,

    /// Flows in the spread sample (IPv4 4-tuples from 198.18.0.0/15 with random ports).
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    sample: u64,

    /// Print JSON.
    #[arg(long, short = 'J')]
    json: bool,
}

/// Print a new random RSS key (for `ethtool -X DEV hkey …` and `--key`).
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Key length in bytes (40 for most NICs, 52 for Intel ice/i40e).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(40..=52))]
    len: u64,

    /// Print in ethtool's colon form.
    #[arg(long)]
    colon: bool,
}

pub fn run(c: RssCommand) -> CmdResult {
    match c {
        RssCommand::Show(a) => show(a),
        RssCommand::Keygen(a) => keygen(a),
    }
}

fn keygen(a: KeygenArgs) -> CmdResult {
    let mut rng = rand::rngs::StdRng::from_rng(&mut rand::rng());
    let key = Key::random(a.len as usize, &mut rng).map_err(Failure::usage)?;
    // A random key with a short period or few usable bits would spread flows badly; draw again.
    let mut key = key;
    for _ in 0..16 {
        if key.entropy_bits(36) == 32 && key.period_bits().is_none() {
            break;
        }
        key = Key::random(a.len as usize, &mut rng).map_err(Failure::usage)?;
    }
    outln!(
        "{}",
        if a.colon {
            key.to_colon_hex()
        } else {
            key.to_hex()
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn show(a: ShowArgs) -> CmdResult {
    let m = a.model.build()?;
    let r = flowlane_tools::rss::show(
        &m.queue,
        &m.key,
        m.key_source.describe(),
        m.symmetric,
        a.cpus,
        cpu_count(),
        a.sample,
    );
    if a.json {
        return print_json(&r).map(|()| ExitCode::SUCCESS);
    }
    outln!(
        "key        {}  ({} bytes; {})",
        r.key,
        r.key_len,
        r.key_source
    );
    if m.symmetric != flowlane_rss::Symmetric::Off {
        outln!(
            "symmetric  {}: both directions of a flow hash alike",
            r.symmetric
        );
    }
    outln!("ethtool    {}", r.key_ethtool);
    match r.period_bits {
        Some(p) => {
            outln!("period     {p} bits: input bits {p} apart hash alike (symmetric-style key)")
        }
        None => outln!("period     none (the key does not repeat)"),
    }
    let (bits4, bits6) = (r.hash_bits_ipv4_4tuple, r.hash_bits_ipv6_4tuple);
    outln!(
        "hash bits  {bits4} usable of 32 for IPv4 4-tuples, {bits6} for IPv6 4-tuples{}",
        if bits4 < 32 {
            "  <- few distinct hashes: flows collide"
        } else {
            ""
        }
    );
    outln!();
    let s = &r.spread;
    outln!(
        "spread     {} sample flows over {} queues ({}): min {} max {} per queue, busiest = {:.3}x fair share, {} distinct hashes",
        s.flows,
        r.queues,
        r.model,
        s.min,
        s.max,
        s.max_over_mean,
        s.distinct_hashes
    );
    let loads: Vec<String> = s
        .per_queue
        .iter()
        .enumerate()
        .take(64)
        .map(|(q, n)| format!("{q}:{n}"))
        .collect();
    outln!(
        "per queue  {}{}",
        loads.join(" "),
        if s.per_queue.len() > 64 { " …" } else { "" }
    );
    if let Some(entries) = &r.reta {
        outln!();
        outln!(
            "RETA ({} entries; queue = RETA[hash & {}]):",
            entries.len(),
            entries.len().saturating_sub(1)
        );
        for (row, chunk) in entries.chunks(8).enumerate() {
            let cells: Vec<String> = chunk.iter().map(|q| format!("{q:>5}")).collect();
            outln!("  {:>5}: {}", row * 8, cells.join(" "));
        }
    }
    outln!();
    let b = &r.freebsd;
    outln!(
        "FreeBSD buckets for {} CPUs: {} bits, {} buckets (bucket = hash & {}), CPU = bucket % {}",
        b.cpus,
        b.bits,
        b.buckets,
        b.buckets.saturating_sub(1),
        b.cpus
    );
    let cells: Vec<String> = b
        .bucket_cpu
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{i}->{c}"))
        .collect();
    for chunk in cells.chunks(16) {
        outln!("  {}", chunk.join(" "));
    }
    outln!();
    outln!("hash paths on this CPU: {}", r.hash_backends.join(", "));
    Ok(ExitCode::SUCCESS)
}
