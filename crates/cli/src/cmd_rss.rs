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
    Verify(VerifyArgs),
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
///   flowlane rss show --dev eth0
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

    /// Read this interface's own RSS and queues (as `ethtool -i/-x/-l/-g/-n` and sysfs show
    /// them: driver, key, hash function, input transform, table, hash fields per flow type,
    /// channels, rings, NUMA node, RPS/XPS/RFS, IRQs and their CPUs) and model its RSS. Each
    /// item says whether netlink or the ioctl read it, or why it is missing (veth has no RSS).
    #[arg(long, value_name = "IF")]
    dev: Option<String>,

    /// Print JSON.
    #[arg(long, short = 'J')]
    json: bool,
}

/// Check, frame by frame, that the NIC hashed and queued each flow as its own RSS says.
///
/// An XDP program on --dev records for every received frame the hash the NIC computed
/// (bpf_xdp_metadata_rx_hash, Linux 6.3+, a device-bound program) and the receive queue, per
/// flow; each flow is then compared with our Toeplitz hash over the NIC's key and hash
/// fields and the queue its table gives. Exit 1 on any disagreement, naming which: the hash
/// differs (another key, fields or function), or the hash agrees but the frame came up on
/// another queue (the driver's fault). Every frame passes on: run it beside any traffic.
/// Where the NIC has no RSS to read (veth), the flows are listed with what the driver did.
///
/// Examples:
///   flowlane rss verify --dev eth0 --duration 10
///   flowlane rss verify --dev eth0 --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct VerifyArgs {
    /// The receiving interface.
    #[arg(long, value_name = "IF")]
    dev: String,

    /// Watch this long (e.g. 10, 2m; default: until Ctrl-C).
    #[arg(long, short = 'd', value_parser = crate::args::parse_duration)]
    duration: Option<f64>,

    /// Distinct flows (per queue and hash) recorded at most; frames past a full table are
    /// counted and said.
    #[arg(long, default_value_t = 65536, value_parser = clap::value_parser!(u32).range(1..=4_000_000))]
    max_flows: u32,

    /// Seconds between status lines.
    #[arg(long, short = 'i', value_parser = crate::args::parse_duration, default_value_t = 1.0)]
    interval: f64,

    /// Print JSON.
    #[arg(long, short = 'J')]
    json: bool,
}

fn verify(a: VerifyArgs) -> CmdResult {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    crate::live::stop_on_signals(&stop)?;
    let cfg = flowlane_tools::verify::VerifyConfig {
        dev: a.dev.clone(),
        duration_s: a.duration,
        interval_s: a.interval,
        max_flows: a.max_flows,
    };
    let mut log = crate::live::Log::new(a.json);
    let r = flowlane_tools::verify::run(&cfg, &stop, &mut |flows, frames| {
        log.line(&format!("{flows} flows, {frames} frames recorded"));
    })
    .map_err(Failure::from_tool)?;
    let code = if r.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    if a.json {
        return print_json(&r).map(|()| code);
    }
    outln!("model      {}", r.model);
    if let Some(why) = &r.no_nic_hash {
        outln!("NIC hash   not read: {why}");
    }
    outln!(
        "{:<24} {:<24} {:>9} {:>5} {:>8} {:>8} {:>8}  verdict",
        "src",
        "dst",
        "frames",
        "queue",
        "NIC hash",
        "ours",
        "expected"
    );
    for f in &r.flows {
        outln!(
            "{:<24} {:<24} {:>9} {:>5} {:>8} {:>8} {:>8}  {}",
            f.src,
            f.dst,
            f.frames,
            f.queue,
            f.nic_hash.as_deref().unwrap_or("-"),
            f.our_hash.as_deref().unwrap_or("-"),
            f.expected_queue.map_or("-".into(), |q| q.to_string()),
            f.verdict
        );
    }
    let s = &r.summary;
    let compared = if s.compared {
        format!(
            "hash agrees for {} of {}, queue for {} of {}; {} on a wrong queue with an \
             agreeing hash",
            s.hash_agrees, s.flows, s.queue_agrees, s.flows, s.wrong_queue
        )
    } else {
        "not compared (no model: see above)".into()
    };
    outln!(
        "summary    {} flows, {} frames ({} not IP, {} not recorded); NIC hash for {}; {compared}",
        s.flows,
        r.frames,
        r.other_frames,
        r.uncounted_frames,
        s.with_nic_hash
    );
    for p in &r.problems {
        outln!("!! {p}");
    }
    Ok(code)
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
        RssCommand::Verify(a) => verify(a),
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
    let nic = crate::args::read_nic(a.dev.as_deref())?;
    // The NIC's own RSS when it has one flowlane models; else the flags' model, said below.
    let not_the_nics = nic.as_ref().and_then(|n| n.model().err());
    let m = match &nic {
        Some(n) if not_the_nics.is_none() => a.model.build_for(Some(n))?,
        _ => a.model.build()?,
    };
    let mut r = flowlane_tools::rss::show(
        &m.queue,
        &m.key,
        m.key_source.describe(),
        m.symmetric,
        a.cpus,
        cpu_count(),
        a.sample,
    );
    r.nic = nic;
    if a.json {
        return print_json(&r).map(|()| ExitCode::SUCCESS);
    }
    if let Some(n) = &r.nic {
        print_nic(n);
        if let Some(why) = &not_the_nics {
            outln!("model      not the NIC's ({why}): the flags' model follows");
        }
        outln!();
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

/// How an item was read, or why it is missing.
fn how<T>(i: &flowlane_tools::nic::Item<T>) -> String {
    match (&i.via, &i.missing) {
        (Some(v), _) => format!("[{v}]"),
        (None, Some(m)) => format!("not read: {m}"),
        (None, None) => "not read".into(),
    }
}

fn opt(v: Option<u32>) -> String {
    v.map_or("n/a".into(), |v| v.to_string())
}

fn cpus(v: &Option<Vec<u32>>) -> String {
    match v {
        None => "n/a".into(),
        Some(c) if c.is_empty() => "none".into(),
        Some(c) => flowlane_runtime::cpus::format_cpu_list(
            &c.iter().map(|&x| x as usize).collect::<Vec<_>>(),
        ),
    }
}

/// Long: one line per item of the interface (driver, RSS, hash fields, channels, rings, NUMA,
/// RPS/XPS/RFS, IRQs), each saying how it was read; only prints.
fn print_nic(n: &flowlane_tools::nic::NicReport) {
    outln!(
        "interface  {} (ethtool netlink {}; read in {:.2} ms)",
        n.dev,
        if n.ethtool_netlink {
            "present"
        } else {
            "absent: ioctl only"
        },
        n.read_ms
    );
    match &n.driver.value {
        Some(d) => outln!(
            "driver     {} {} firmware {} bus {}  {}",
            d.driver,
            d.version,
            if d.firmware.is_empty() {
                "-"
            } else {
                &d.firmware
            },
            if d.bus.is_empty() {
                "- (virtual)"
            } else {
                &d.bus
            },
            how(&n.driver)
        ),
        None => outln!("driver     {}", how(&n.driver)),
    }
    match &n.rss.value {
        Some(cs) => {
            for c in cs {
                outln!(
                    "rss        context {}: function {}, input transform {}, {}-entry table over \
                     {} queues, key {} bytes  {}",
                    c.context,
                    c.hash_function.as_deref().unwrap_or("not reported"),
                    c.input_xfrm.as_deref().unwrap_or("not reported"),
                    c.indir.len(),
                    {
                        let mut q = c.indir.clone();
                        q.sort_unstable();
                        q.dedup();
                        q.len()
                    },
                    c.key.len() / 2,
                    how(&n.rss)
                );
            }
        }
        None => outln!("rss        {}", how(&n.rss)),
    }
    match &n.hash_fields.value {
        Some(fs) => {
            let parts: Vec<String> = fs
                .iter()
                .map(|f| {
                    if f.discard {
                        format!("{}: discard", f.flow_type)
                    } else {
                        format!("{}: {}", f.flow_type, f.fields.join("+"))
                    }
                })
                .collect();
            outln!("hashes on  {}  {}", parts.join("; "), how(&n.hash_fields));
            if n.udp4_two_tuple() == Some(true) {
                outln!(
                    "           UDP/IPv4 is hashed on the addresses only: flows differ by \
                     address, not port"
                );
            }
        }
        None => outln!("hashes on  {}", how(&n.hash_fields)),
    }
    match &n.channels.value {
        Some(c) => outln!(
            "channels   rx {} tx {} other {} combined {} (max {} / {} / {} / {})  {}",
            opt(c.rx),
            opt(c.tx),
            opt(c.other),
            opt(c.combined),
            opt(c.max_rx),
            opt(c.max_tx),
            opt(c.max_other),
            opt(c.max_combined),
            how(&n.channels)
        ),
        None => outln!("channels   {}", how(&n.channels)),
    }
    match &n.rings.value {
        Some(r) => outln!(
            "rings      rx {} of {}, tx {} of {}  {}",
            opt(r.rx),
            opt(r.rx_max),
            opt(r.tx),
            opt(r.tx_max),
            how(&n.rings)
        ),
        None => outln!("rings      {}", how(&n.rings)),
    }
    match &n.pause.value {
        Some(p) => {
            let w = |b: Option<bool>| match b {
                Some(true) => "on",
                Some(false) => "off",
                None => "?",
            };
            outln!(
                "pause      autoneg {} rx {} tx {}{}  {}",
                w(p.autoneg),
                w(p.rx),
                w(p.tx),
                match (p.rx_frames, p.tx_frames) {
                    (Some(r), Some(t)) => format!("; pause frames received {r}, sent {t}"),
                    _ => String::new(),
                },
                how(&n.pause)
            )
        }
        None => outln!("pause      {}", how(&n.pause)),
    }
    let h = &n.host;
    outln!(
        "device     {}; NUMA node {}  [sysfs]",
        if h.has_device {
            "present"
        } else {
            "none (a virtual interface: no IRQs, no NUMA node)"
        },
        h.numa_node.map_or("not reported".into(), |v| v.to_string())
    );
    let rps: Vec<String> =
        h.rx.iter()
            .map(|q| {
                format!(
                    "rx-{}: {} (flows {})",
                    q.queue,
                    cpus(&q.rps_cpus),
                    q.rps_flow_cnt.map_or("n/a".into(), |v| v.to_string())
                )
            })
            .collect();
    outln!(
        "rps        {}",
        if rps.is_empty() {
            "no queues in sysfs".into()
        } else {
            rps.join("; ")
        }
    );
    let xps: Vec<String> =
        h.tx.iter()
            .map(|q| format!("tx-{}: {}", q.queue, cpus(&q.xps_cpus)))
            .collect();
    outln!(
        "xps        {}",
        if xps.is_empty() {
            "no queues in sysfs".into()
        } else {
            xps.join("; ")
        }
    );
    match h.rps_sock_flow_entries {
        Some(0) => outln!("rfs        off (socket flow table 0 entries)"),
        Some(v) => outln!("rfs        socket flow table {v} entries"),
        None => outln!(
            "rfs        not readable here (net.core.rps_sock_flow_entries is host-wide, shown \
             only in the first namespace)"
        ),
    }
    if h.irqs.is_empty() {
        outln!("irqs       none of its own");
    }
    for i in &h.irqs {
        outln!(
            "irq        {} {}{}: CPUs {} (effective {}), {} taken",
            i.irq,
            i.name,
            i.queue_by_name
                .map_or(String::new(), |q| format!(" (queue {q} by its name)")),
            cpus(&i.affinity),
            cpus(&i.effective),
            i.per_cpu.iter().sum::<u64>()
        );
    }
}
