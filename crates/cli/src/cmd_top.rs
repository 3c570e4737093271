//! `flowlane top`: a live per-queue and per-CPU view of interfaces.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;
use flowlane_tools::top::{self, QueueRow, TopConfig, TopReport, TopTick};

use crate::{CmdResult, Failure};

/// Watch interfaces per receive queue and per CPU, one line a second (Linux's `netstat -Q`).
///
/// Per queue: packets and drops a second from the driver's own per-queue statistics (any
/// driver's names: rx_queue_N_packets, rx-N.packets, rxN_packets, queue_N_rx_cnt), the share
/// of the interface's packets it got, and the share its indirection-table entries predict
/// (`reta`) — a queue far from its prediction is a steering problem. Per CPU: the receive
/// path's softnet counts (processed, dropped at a full backlog, time squeeze) and the
/// interrupts of the interfaces' IRQs. Nothing is sent; Ctrl-C prints the summary.
///
/// Examples:
///   flowlane top --dev eth0
///   flowlane top --dev eth0 --dev eth1 --duration 10 --json
///   flowlane top --dev eth0 --json-stream
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct TopArgs {
    /// An interface to watch (repeat for more).
    #[arg(long, value_name = "IF", required = true)]
    dev: Vec<String>,

    /// Stop after this long (e.g. 10, 2m; default: until Ctrl-C).
    #[arg(long, short = 'd', value_parser = crate::args::parse_duration)]
    duration: Option<f64>,

    #[command(flatten)]
    live: crate::live::LiveArgs,
}

fn pct(v: Option<f64>) -> String {
    v.map_or("    -".into(), |s| format!("{:5.1}", s * 100.0))
}

fn table(t: &TopTick) -> Vec<String> {
    let mut lines = vec![format!(
        "{:>7.1}s  queue  {:>12} {:>10} {:>6} {:>6}",
        t.t_s, "rx pkt/s", "drops/s", "share", "reta"
    )];
    lines.extend(t.queues.iter().map(queue_line));
    lines.push(format!(
        "          cpu    {:>12} {:>10} {:>9} {:>9}",
        "processed/s", "dropped/s", "squeeze/s", "irqs/s"
    ));
    lines.extend(t.cpus.iter().map(|c| {
        format!(
            "          {:<6} {:>12.0} {:>10.0} {:>9.0} {:>9.0}",
            c.cpu, c.processed_per_s, c.dropped_per_s, c.squeezed_per_s, c.irqs_per_s
        )
    }));
    lines
}

fn queue_line(q: &QueueRow) -> String {
    format!(
        "          {}:{:<4} {:>12.0} {:>10.0} {:>6} {:>6}",
        q.dev,
        q.queue,
        q.rx_pps,
        q.drops_per_s,
        pct(q.share),
        pct(q.reta_share)
    )
}

pub fn run(a: TopArgs) -> CmdResult {
    let stop = Arc::new(AtomicBool::new(false));
    crate::live::stop_on_signals(&stop)?;
    let cfg = TopConfig {
        devs: a.dev.clone(),
        interval_s: a.live.interval,
        duration_s: a.duration,
    };
    if a.live.metrics.is_some() {
        return Err(Failure::usage(anyhow::anyhow!(
            "--metrics is not served by top: its own lines are the view (use --json-stream)"
        )));
    }
    let mut log = a.live.log();
    let stream = a.live.stream();
    let report = top::run(&cfg, &stop, &mut |t| {
        stream.interval(t);
        if !a.live.quiet {
            for l in table(t) {
                log.line(&l);
            }
        }
    })
    .map_err(Failure::from_tool)?;
    if a.live.json {
        crate::args::print_json(&report)?;
    } else if stream.on() {
        stream.last(&report)?;
    } else {
        summary(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn summary(r: &TopReport) {
    outln!(
        "flowlane top: {:.1} s, {} lines; reading every counter took {:.0} µs on average \
         ({:.0} µs at most), {:.2} % of a CPU",
        r.duration_s,
        r.ticks,
        r.read_us_mean,
        r.read_us_max,
        r.cpu_share * 100.0
    );
    for d in &r.devs {
        outln!(
            "{}: {} queues (from {}){}, {} IRQs, {}",
            d.dev,
            d.queues,
            d.source,
            if d.queues == 0 {
                ": none per queue, nothing to show"
            } else {
                ""
            },
            d.irqs.len(),
            match &d.reta {
                Some(t) => format!("{}-entry indirection table", t.len()),
                None => "no indirection table reported".into(),
            }
        );
    }
    outln!("over the whole watch:");
    for q in &r.queues {
        outln!("{}", queue_line(q));
    }
}
