//! `flowlane merge`: the shards' reports of one run joined into one exact report.

use std::path::PathBuf;
use std::process::ExitCode;

use flowlane_tools::merge::{self, Merged};
use flowlane_tools::{input, Latency};

use crate::args::print_json;
use crate::{CmdResult, Failure};

/// Join the reports of a sharded run's shards into one exact report
///
/// Reads the `--json` (or `--json-stream`) reports of `blast`, `sink`, `serve` or `http load`
/// shards
/// (`--shard I/N`, or `--shards N` in a Kubernetes Indexed Job) and prints one report of the
/// same schema: counts summed, per-flow tables joined, latency from the shards' histograms
/// (every sample kept), rates over the common time window (the earliest shard's start to the
/// latest one's end), every shard's problems, and a row per shard.
///
/// Refused (exit 2): reports of different kinds or runs, a shard twice, a flow in two shards.
/// Exit 1: a shard reported a problem, or shards are missing.
///
/// Examples:
///   flowlane merge gen-0.json gen-1.json gen-2.json
///   kubectl logs -l job-name=flowlane-gen --tail=-1 | flowlane merge - --json
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct MergeArgs {
    /// Reports: files, or - for standard input; a file or stream may hold several reports
    /// one after another.
    #[arg(required = true, value_name = "REPORT")]
    reports: Vec<PathBuf>,

    /// The merged report as JSON on stdout.
    #[arg(long, short = 'J')]
    json: bool,

    /// Write the merged latency distribution to this file in HdrHistogram's
    /// percentile-distribution text (.hgrm), in microseconds; a name ending in .hlog gets
    /// HdrHistogram's log instead (the compressed interchange form, nanoseconds, lossless).
    #[arg(long, value_name = "FILE")]
    histogram: Option<PathBuf>,
}

pub fn run(a: MergeArgs) -> CmdResult {
    if let Some(p) = &a.histogram {
        crate::side::check("--histogram", p)?;
    }
    let mut all = Vec::new();
    for path in &a.reports {
        let (name, text) = if path.as_os_str() == "-" {
            let t = input::read_stdin_text("merge", input::REPORTS);
            ("-".to_string(), t)
        } else {
            let t = input::read_text("merge", path, input::REPORTS, None);
            (path.display().to_string(), t)
        };
        let text = text.map_err(Failure::from_tool)?;
        let read = merge::read_reports(&name, &text).map_err(Failure::from_tool)?;
        if read.skipped_lines > 0 {
            errln!(
                "flowlane merge: {name}: {} lines outside the reports passed over (status \
                 lines, as kubectl logs mixes them in)",
                read.skipped_lines
            );
        }
        if read.reports.is_empty() {
            return Err(Failure::usage(anyhow::anyhow!(
                "{name} holds no report: give merge the output of --json or --json-stream"
            )));
        }
        all.extend(read.reports);
    }
    let m = merge::merge(&all).map_err(Failure::from_tool)?;
    if a.json {
        print_json(&m.report)?;
    } else {
        print_text(&m);
    }
    crate::live::write_histogram(a.histogram.as_deref(), m.histogram.as_ref())?;
    for p in &m.problems {
        errln!("flowlane: {p}");
    }
    Ok(if m.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn print_text(m: &Merged) {
    let r = &m.report;
    let kind = format!("{:?}", m.kind).to_lowercase();
    outln!(
        "{kind}: {} reports merged{}",
        m.shards.len(),
        merge::began(m).map_or(String::new(), |t| format!(", the first started {t}"))
    );
    outln!(
        "  {:<24} {:>7} {:>10} {:>9} {:>14} {:>10}  problems",
        "source",
        "shard",
        "start+ms",
        "seconds",
        "packets",
        "clock ±µs"
    );
    for s in &m.shards {
        outln!(
            "  {:<24} {:>7} {:>10} {:>9.3} {:>14} {:>10}  {}",
            s.source,
            s.shard.map_or("-".into(), |s| s.to_string()),
            s.start_offset_ms.map_or("-".into(), |o| format!("{o:.3}")),
            s.duration_s,
            s.packets,
            s.clock_max_error_us.map_or("-".into(), |e| e.to_string()),
            s.problems.len()
        );
    }
    let steps: Vec<&serde_json::Value> = match r.get("sweep").and_then(|s| s.as_array()) {
        Some(a) => a.iter().collect(),
        None => vec![r],
    };
    for s in steps {
        let n = |k: &str| s.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        outln!("merged, over {:.3} s in common:", n("duration_s"));
        match m.kind {
            merge::Kind::Blast => {
                outln!("  {}", s["pktgen"].as_str().unwrap_or(""));
                outln!(
                    "  sent {} datagrams ({:.0} pps){}",
                    n("tx_packets"),
                    n("tx_pps"),
                    match s.get("rx_packets").and_then(|v| v.as_u64()) {
                        Some(rx) => format!(
                            ", {rx} echoes back ({:.0} pps), {} lost",
                            n("rx_pps"),
                            n("lost")
                        ),
                        None => String::new(),
                    }
                );
            }
            merge::Kind::Sink => outln!(
                "  received {} frames ({:.0} pps), {} flowlane, {} lost, {} reordered",
                n("rx_packets"),
                n("rx_pps"),
                n("flowlane_packets"),
                n("lost"),
                n("reordered")
            ),
            merge::Kind::Serve => {
                let t = &s["total"];
                outln!(
                    "  received {} datagrams, sent {}, {} dropped at the sockets, by {} workers",
                    t["rx_packets"],
                    t["tx_packets"],
                    t["socket_drops"],
                    s["workers"].as_array().map_or(0, Vec::len)
                );
            }
            merge::Kind::HttpLoad => {
                let t = &s["total"];
                outln!(
                    "  {} requests, {} answers ({:.1}/s over {:.3} s steady), {} errors{}",
                    t["requests"],
                    t["responses"],
                    n("requests_per_s"),
                    n("steady_s"),
                    s["errors"],
                    if s["passed"] == true { "" } else { ": FAILED" }
                );
                if let Some(l) = s["latency"].as_object() {
                    let f = |k: &str| l.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
                    outln!(
                        "  latency, µs: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
                        f("p50"),
                        f("p90"),
                        f("p99"),
                        f("p999"),
                        f("max")
                    );
                }
            }
        }
        if let Ok(Some(l)) = serde_json::from_value::<Option<Latency>>(s["latency_ns"].clone()) {
            outln!(
                "  {} latency, µs: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
                l.kind,
                l.p50 as f64 / 1e3,
                l.p90 as f64 / 1e3,
                l.p99 as f64 / 1e3,
                l.p999 as f64 / 1e3,
                l.max as f64 / 1e3
            );
        }
    }
    for s in &m.shards {
        for p in &s.problems {
            outln!("  problem ({}): {p}", s.source);
        }
    }
}
