//! `flowlane isolate`: partition CPUs off for measurement, and undo it exactly.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use flowlane_tools::isolate;

use crate::args::{parse_cpu_list, print_json, CpuList};
use crate::{CmdResult, Failure};

/// Isolate CPUs as partrt does (cpuset partition, tasks and IRQs moved off); --undo restores.
///
/// The CPUs get a cpuset of their own — a cgroup v2 partition (`cpuset.cpus.partition`
/// isolated, or root on kernels before 6.2) where cgroup v2 is mounted, else v1 cpusets
/// `flowlane-rt` and `flowlane-sys` with load balancing off between them and every task that
/// may move moved to `flowlane-sys`. Every interrupt whose affinity includes them and that
/// the kernel lets move goes to the other CPUs, and so does the default affinity of new ones.
/// What was changed, with each value before, is written to the state file; --undo reads it
/// and puts each back. Boot parameters (isolcpus, nohz_full, rcu_nocbs) cannot be changed at
/// run time: `flowlane doctor` and `flowlane latency` say which are set. To measure before
/// and after in one run: `flowlane latency --compare-isolated`. Needs root.
///
/// Examples:
///   flowlane isolate --cpus 2-3
///   flowlane isolate --undo
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct IsolateArgs {
    /// The CPUs to isolate.
    #[arg(long, value_parser = parse_cpu_list, required_unless_present = "undo")]
    cpus: Option<CpuList>,

    /// Restore what an earlier `flowlane isolate` changed (from its state file).
    #[arg(long, conflicts_with = "cpus")]
    undo: bool,

    /// Where the state is kept.
    #[arg(long, value_name = "FILE", default_value = isolate::STATE)]
    state: PathBuf,

    /// Print the report as JSON.
    #[arg(long, short = 'J')]
    json: bool,
}

pub fn run(a: IsolateArgs) -> CmdResult {
    if a.undo {
        let r = isolate::undo(&a.state).map_err(Failure::from_tool)?;
        if a.json {
            print_json(&r)?;
        } else {
            outln!(
                "CPUs {} back: {} tasks moved back, {} interrupts given their affinity back",
                flowlane_runtime::cpus::format_cpu_list(&r.cpus),
                r.tasks_moved_back,
                r.irqs_restored
            );
            for p in &r.problems {
                outln!("  !! {p}");
            }
        }
        return Ok(if r.problems.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let cpus = a.cpus.map(|c| c.0).unwrap_or_default();
    let r = isolate::isolate(&cpus, &a.state).map_err(Failure::from_tool)?;
    if a.json {
        print_json(&r)?;
    } else {
        outln!(
            "CPUs {} isolated ({}{}); everything else on {}",
            flowlane_runtime::cpus::format_cpu_list(&r.cpus),
            match &r.cgroup {
                isolate::Cgroup::V2 { .. } => "cgroup v2 partition",
                isolate::Cgroup::V1 { .. } => "cgroup v1 cpusets flowlane-rt, flowlane-sys",
            },
            r.partition
                .as_ref()
                .map_or(String::new(), |p| format!(": {p}")),
            flowlane_runtime::cpus::format_cpu_list(&r.housekeeping)
        );
        outln!(
            "tasks: {} moved off, {} could not move (bound kernel threads); interrupts: {} moved \
             off, {} could not move{}",
            r.tasks_moved,
            r.tasks_stayed,
            r.irqs_moved.len(),
            r.irqs_stayed.len(),
            if r.irqs_stayed.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    r.irqs_stayed
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                )
            }
        );
        outln!(
            "undo with: flowlane isolate --undo --state {}",
            a.state.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
