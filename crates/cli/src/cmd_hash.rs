//! `flowlane hash`: the Toeplitz hash of a flow and the queue it lands on.

use std::io::{BufRead, BufWriter, Write};
use std::process::ExitCode;

use anyhow::anyhow;
use clap::Args;
use flowlane_rss::{QueueModel, Symmetric, Toeplitz, Tuple};

use crate::args::{hex32, parse_endpoint, print_json, Endpoint, KeySource, ModelArgs};
use crate::{CmdResult, Failure};

/// Compute the RSS hash of a flow and the queue a NIC would put it on.
///
/// With ports on both ends the 4-tuple is hashed (TCP/UDP), without ports the 2-tuple
/// (addresses only: what NICs use for IP fragments and FreeBSD for UDP by default).
///
/// Examples:
///   flowlane hash --src 66.9.149.187:2794 --dst 161.142.100.80:1766
///   flowlane hash --src [2001:2::1]:5000 --dst [2001:2::2]:8080 --queues 4 --json
///   printf '198.18.0.1 198.19.0.1 1000 8080\n' | flowlane hash --stdin
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct HashArgs {
    /// Source: IP or IP:PORT ([V6]:PORT).
    #[arg(long, value_parser = parse_endpoint, required_unless_present = "stdin")]
    src: Option<Endpoint>,

    /// Destination: IP or IP:PORT ([V6]:PORT).
    #[arg(long, value_parser = parse_endpoint, required_unless_present = "stdin")]
    dst: Option<Endpoint>,

    /// Read lines `SRC DST [SPORT DPORT]` from standard input and print one 8-hex-digit hash per
    /// line. Malformed lines are reported on stderr with their number and skipped; the exit
    /// code is then 1.
    #[arg(long, conflicts_with_all = ["src", "dst"])]
    stdin: bool,

    /// Use this interface's own RSS (key, function, input transform, table), read as `rss show
    /// --dev` reads it; an interface without RSS flowlane can model is refused, saying why.
    #[arg(long, value_name = "IF")]
    dev: Option<String>,

    #[command(flatten)]
    model: ModelArgs,

    /// Print JSON (with --stdin: one JSON object per line).
    #[arg(long, short = 'J')]
    json: bool,
}

pub fn run(a: HashArgs) -> CmdResult {
    let nic = crate::args::read_nic(a.dev.as_deref())?;
    let m = a.model.build_for(nic.as_ref())?;
    let hasher = Toeplitz::new(&m.key);
    let sym = m.symmetric;
    let model = &m.queue;
    if a.stdin {
        return run_stdin(&hasher, model, sym, a.json);
    }
    let (Some(src), Some(dst)) = (a.src, a.dst) else {
        return Err(Failure::usage(anyhow!("give --src and --dst, or --stdin")));
    };
    let ports = match (src.port, dst.port) {
        (Some(s), Some(d)) => Some((s, d)),
        (None, None) => None,
        _ => {
            return Err(Failure::usage(anyhow!(
                "give ports on both --src and --dst (4-tuple) or on neither (2-tuple)"
            )))
        }
    };
    let tuple = Tuple::new(src.addr, dst.addr, ports).map_err(Failure::usage)?;
    let input = tuple.symmetric(sym);
    let hash = hasher.hash(&input);
    let queue = model.queue(hash);
    let index = model.index(hash);
    // Fragments of this flow carry no ports: NICs hash them on the 2-tuple.
    let frag = ports.map(|_| {
        let h = hasher.hash(&tuple.addrs_only().symmetric(sym));
        (h, model.queue(h))
    });
    if a.json {
        print_json(&flowlane_tools::rss::HashReport {
            hash: hex32(hash),
            kind: tuple.kind().name().into(),
            src: tuple.src().to_string(),
            dst: tuple.dst().to_string(),
            src_port: ports.map(|p| p.0),
            dst_port: ports.map(|p| p.1),
            symmetric: sym.name().into(),
            model: model.name().into(),
            index,
            queue,
            queues: model.queues(),
            key: m.key.to_hex(),
            key_source: m.key_source.describe(),
            fragment_hash: frag.map(|f| hex32(f.0)),
            fragment_queue: frag.map(|f| f.1),
        })?;
    } else {
        outln!("hash      {}", hex32(hash));
        outln!("tuple     {}  {}", tuple.kind().name(), tuple);
        if sym != Symmetric::Off {
            outln!("hashed as {}  ({} symmetric input)", input, sym.name());
        }
        match (model, index) {
            (QueueModel::Reta(r), Some(i)) => outln!(
                "queue     {queue}  (RETA index {i} of {}, {} queues)",
                r.len(),
                model.queues()
            ),
            (QueueModel::FreeBsd(b), Some(i)) => {
                outln!("bucket    {i} of {}  -> CPU {}", b.buckets(), b.cpu(i))
            }
            _ => outln!(
                "queue     {queue}  ({} of {} queues)",
                model.name(),
                model.queues()
            ),
        }
        if let Some((fh, fq)) = frag {
            outln!(
                "fragments {}  -> queue {fq}  (2-tuple: IP fragments carry no ports)",
                hex32(fh)
            );
        }
        if a.model.reta.is_some() || m.key_source != KeySource::Default {
            outln!("key       {}", m.key_source.describe());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_stdin(hasher: &Toeplitz, model: &QueueModel, sym: Symmetric, json: bool) -> CmdResult {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut line = Vec::with_capacity(256);
    let (mut lineno, mut bad, mut good) = (0u64, 0u64, 0u64);
    loop {
        line.clear();
        match input.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Err(Failure::runtime(anyhow!("reading standard input: {e}"))),
        }
        lineno += 1;
        let Ok(text) = std::str::from_utf8(&line) else {
            bad += 1;
            errln!("line {lineno}: not valid UTF-8 text; skipped");
            continue;
        };
        let text = text.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let t = match Tuple::parse_line(text) {
            Ok(t) => t,
            Err(e) => {
                bad += 1;
                errln!("line {lineno}: {e}; skipped");
                continue;
            }
        };
        good += 1;
        let h = hasher.hash(&t.symmetric(sym));
        let res = if json {
            writeln!(
                out,
                "{{\"line\":{lineno},\"hash\":\"{h:08x}\",\"queue\":{}}}",
                model.queue(h)
            )
        } else {
            writeln!(out, "{h:08x}")
        };
        if let Err(e) = res {
            return write_failed(e);
        }
    }
    if let Err(e) = out.flush() {
        return write_failed(e);
    }
    if bad > 0 {
        errln!("flowlane: {bad} malformed line(s) skipped, {good} hashed");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// A reader that went away (`| head`) is a normal end; anything else is a failure.
fn write_failed(e: std::io::Error) -> CmdResult {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(Failure::runtime(anyhow!("writing standard output: {e}")))
    }
}
