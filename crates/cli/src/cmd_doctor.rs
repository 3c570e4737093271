//! `flowlane doctor`: what on this host would distort a measurement, with fixes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use flowlane_tools::doctor::{self, Verdict};

use crate::args::{parse_cpu_list, print_json, usable_cpus, CpuList};
use crate::{CmdResult, Failure};

/// Check this host before trusting a number: read-only rules with fixes.
///
/// Each rule has a stable id and says PASS, WARN, FAIL or SKIP with the value it saw, why it
/// matters to a packet-rate or latency figure, and the command that fixes it: the CPU clock
/// (governor, boost), C-states and the /dev/cpu_dma_latency limit, SMT siblings and
/// isolation of the measurement CPUs, irqbalance, the receive path's sysctls, busy polling,
/// huge pages, a hypervisor, the clock source, the preemption model, connection tracking and
/// firewall chains on the forwarding path (nftables, iptables); with --dev, each interface's
/// rings, NUMA node, queue interrupts' CPUs, flow control (the one FAIL), offloads (GRO, LRO,
/// checksums), interrupt coalescing, RPS and XPS. Nothing is changed. Exit 1 if any rule
/// fails. bench, blast, serve, sink, forward, rfc2544 and http carry the same rules for their
/// CPUs and interfaces in their JSON (`host`).
///
/// Examples:
///   flowlane doctor
///   flowlane doctor --dev eth0 --cpus 2,3
///   flowlane doctor --root recorded-host/ --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct DoctorArgs {
    /// An interface the measurement uses (repeat for more).
    #[arg(long, value_name = "IF")]
    dev: Vec<String>,

    /// The measurement CPUs (default: every CPU this process may use).
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Read /sys and /proc under this directory (a recorded host) instead of /.
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,

    /// Print JSON.
    #[arg(long, short = 'J')]
    json: bool,
}

pub fn run(a: DoctorArgs) -> CmdResult {
    let live = a.root == std::path::Path::new("/");
    if !live && !a.dev.is_empty() {
        return Err(Failure::usage(anyhow::anyhow!(
            "--dev reads a live interface (ethtool netlink and ioctl): leave it out with --root"
        )));
    }
    if !a.root.is_dir() {
        return Err(Failure::usage(anyhow::anyhow!(
            "--root {}: not a directory",
            a.root.display()
        )));
    }
    let cpus = match &a.cpus {
        Some(c) if !live => c.0.clone(),
        c => usable_cpus(c.as_ref())?,
    };
    // took_ms covers the interfaces' reading too, as a run's `host` does.
    let t0 = std::time::Instant::now();
    let mut nics = Vec::new();
    for d in &a.dev {
        nics.push(flowlane_tools::nic::read(d).map_err(Failure::from_tool)?);
    }
    let mut r = doctor::check(&a.root, &cpus, &nics);
    r.took_ms = t0.elapsed().as_secs_f64() * 1e3;
    let code = if r.failed() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    if a.json {
        return print_json(&r).map(|()| code);
    }
    for f in &r.findings {
        let v = match f.verdict {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        };
        let subject = f
            .subject
            .as_deref()
            .map_or(String::new(), |s| format!(" [{s}]"));
        outln!("{v}  {:<17}{subject}  {}", f.id, f.seen);
        if matches!(f.verdict, Verdict::Warn | Verdict::Fail) {
            outln!("      why: {}", f.why);
            if let Some(fix) = &f.fix {
                outln!("      fix: {fix}");
            }
        }
    }
    let c = &r.counts;
    outln!(
        "doctor: {} pass, {} warn, {} fail, {} skip for CPUs {:?}{} ({:.1} ms)",
        c.pass,
        c.warn,
        c.fail,
        c.skip,
        r.cpus,
        if r.devs.is_empty() {
            String::new()
        } else {
            format!(" and {}", r.devs.join(", "))
        },
        r.took_ms
    );
    Ok(code)
}
