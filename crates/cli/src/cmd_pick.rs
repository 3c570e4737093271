//! `flowlane pick`: choose flows that land on the queues you want.

use std::process::ExitCode;

use anyhow::anyhow;
use clap::Args;
use flowlane_rss::pick::{pick, Method, PickSpec};
use flowlane_rss::Toeplitz;

use crate::args::{
    hex32, parse_endpoint_with_port, parse_port_range, parse_source_range, parse_u32_list,
    print_json, Endpoint, ModelArgs, SourceRange,
};
use crate::{CmdResult, Failure};

/// Choose source addresses/ports so flows land on chosen RSS queues — exactly, no trial.
///
/// The Toeplitz hash is linear over GF(2), so for each queue the picker solves for the free
/// bits (source port range, source address range) directly, counts every solution in the range
/// and verifies each returned tuple by hashing it. A queue that no tuple in the range can reach
/// is reported (exit code 1 when fewer than --per-queue were found for a queue).
///
/// Output, one line per flow:  queue=Q src=IP:PORT dst=IP:PORT hash=XXXXXXXX
///
/// Examples:
///   flowlane pick --dst 198.19.0.1:8080 --src-ip 198.18.0.1 --queues 4 --per-queue 2
///   flowlane pick --dst 198.19.0.1:8080 --src-ip 198.18.0.0/24 --src-ports 5000 --queues 8
///   flowlane pick --dst [2001:2::2]:53 --src-ip 2001:2::1 --src-ports 40000-40999 --all --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct PickArgs {
    /// Destination IP:PORT ([V6]:PORT), fixed.
    #[arg(long, value_parser = parse_endpoint_with_port)]
    dst: Endpoint,

    /// Source address(es) to choose from: IP, IP/LEN or IP-IP. The destination is never
    /// offered, nor an IPv4 prefix's network and broadcast addresses (up to /30).
    #[arg(long, value_parser = parse_source_range)]
    src_ip: SourceRange,

    /// Source ports to choose from: A-B or a single port.
    #[arg(long, value_parser = parse_port_range, default_value = "1024-65535")]
    src_ports: (u16, u16),

    /// Flows wanted per queue.
    #[arg(long, default_value_t = 1, conflicts_with = "all")]
    per_queue: u64,

    /// Return every flow in the range (grouped by queue).
    #[arg(long)]
    all: bool,

    /// Only these queues (comma-separated), e.g. `0,3`. Default: every queue.
    #[arg(long, value_parser = parse_u32_list)]
    only: Option<crate::args::U32List>,

    /// Hash addresses only (2-tuple), as NICs do for IP fragments; the port is then left free.
    #[arg(long)]
    two_tuple: bool,

    /// Use this interface's own RSS (key, function, input transform, table), read as `rss show
    /// --dev` reads it; an interface without RSS flowlane can model is refused, saying why.
    #[arg(long, value_name = "IF")]
    dev: Option<String>,

    #[command(flatten)]
    model: ModelArgs,

    /// Print JSON.
    #[arg(long, short = 'J')]
    json: bool,
}

pub fn run(a: PickArgs) -> CmdResult {
    let nic = crate::args::read_nic(a.dev.as_deref())?;
    let m = a.model.build_for(nic.as_ref())?;
    let model = &m.queue;
    let hasher = Toeplitz::new(&m.key);
    let dst_port = a
        .dst
        .port
        .ok_or_else(|| Failure::usage(anyhow!("--dst needs a port")))?;
    // The NIC's own word where it gave one: UDP/IPv4 hashed on the addresses only is placed
    // by source address (the seed's four clients from four addresses).
    let two_tuple = a.two_tuple || nic.as_ref().and_then(|n| n.udp4_two_tuple()) == Some(true);
    let spec = PickSpec {
        src_addrs: (a.src_ip.lo, a.src_ip.hi),
        dst: a.dst.addr,
        src_ports: a.src_ports,
        dst_port,
        hash_ports: !two_tuple,
        queues: a.only.clone().map(|l| l.0).unwrap_or_default(),
        per_queue: (!a.all).then_some(a.per_queue),
        symmetric: m.symmetric,
        // The destination is no source for a flow to it, whatever the range.
        exclude: [a.src_ip.exclude.as_slice(), &[a.dst.addr]].concat(),
    };
    let result = pick(&hasher, model, &spec).map_err(Failure::usage)?;
    if result.verify_failures > 0 {
        return Err(Failure::runtime(anyhow!(
            "internal error: {} picked tuple(s) failed verification by hashing",
            result.verify_failures
        )));
    }
    let short: Vec<(u32, usize, u128)> = result
        .queues
        .iter()
        .filter(|q| !a.all && (q.tuples.len() as u64) < a.per_queue)
        .map(|q| (q.queue, q.tuples.len(), q.available))
        .collect();
    let method = match result.method {
        Method::Gf2 => "gf2",
        Method::Walk => "walk",
    };
    if a.json {
        use flowlane_tools::rss::{PickQueue, PickReport, PickTuple};
        let queues = result
            .queues
            .iter()
            .map(|q| PickQueue {
                queue: q.queue,
                available: q.available,
                complete: a.all || q.tuples.len() as u64 >= a.per_queue,
                tuples: q
                    .tuples
                    .iter()
                    .map(|p| PickTuple {
                        src: p.tuple.src().to_string(),
                        src_port: p.tuple.ports().map_or(spec.src_ports.0, |x| x.0),
                        dst: p.tuple.dst().to_string(),
                        dst_port,
                        hash: hex32(p.hash),
                    })
                    .collect(),
            })
            .collect();
        print_json(&PickReport {
            key: m.key.to_hex(),
            key_source: m.key_source.describe(),
            symmetric: m.symmetric.name().into(),
            model: model.name().into(),
            queues_in_model: model.queues(),
            hash_fields: if two_tuple { "2-tuple" } else { "4-tuple" }.into(),
            method: method.into(),
            verified: true,
            queues,
        })?;
    } else {
        let fmt_dst = std::net::SocketAddr::new(spec.dst, dst_port);
        for q in &result.queues {
            for p in &q.tuples {
                let src = match p.tuple.ports() {
                    Some((sp, _)) => std::net::SocketAddr::new(p.tuple.src(), sp).to_string(),
                    None => p.tuple.src().to_string(),
                };
                outln!(
                    "queue={} src={} dst={} hash={}",
                    q.queue,
                    src,
                    fmt_dst,
                    hex32(p.hash)
                );
            }
        }
        let total: usize = result.queues.iter().map(|q| q.tuples.len()).sum();
        errln!(
            "flowlane: {total} flow(s) for {} queue(s), solved by {method}, every one verified by \
             hashing with {}{}",
            result.queues.len(),
            m.key_source.describe(),
            match m.symmetric {
                flowlane_rss::Symmetric::Off => String::new(),
                s => format!(" ({} symmetric)", s.name()),
            }
        );
    }
    for (q, got, avail) in &short {
        errln!(
            "flowlane: queue {q}: found {got} of {} wanted — only {avail} flow(s) in the given \
             source range land there; widen --src-ports or --src-ip",
            a.per_queue
        );
    }
    Ok(if short.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
