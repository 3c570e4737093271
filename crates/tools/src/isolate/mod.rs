//! `isolate`: what partrt does, with today's kernel interfaces — a cpuset partition for the
//! chosen CPUs (cgroup v2 `cpuset.cpus.partition` where cgroup v2 is mounted, v1 cpusets
//! otherwise), every task that may move moved off them, every interrupt that may move moved
//! off them, and everything it changed written to a state file so that [`undo`] restores
//! exactly that. Nothing else is touched.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::ToolError;

/// The default state file.
pub const STATE: &str = "/run/flowlane/isolate.json";
/// The cpuset (v1) or cgroup (v2) holding the isolated CPUs.
const RT: &str = "flowlane-rt";
/// The v1 cpuset the other tasks move to.
const SYS: &str = "flowlane-sys";

/// Which cgroup interface the partition was made with, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Cgroup {
    /// cgroup v2: a partition (`cpuset.cpus.partition`) under this mount.
    V2 {
        /// The mount.
        root: String,
        /// `+cpuset` was added to the root's `cgroup.subtree_control` by us.
        enabled_cpuset: bool,
    },
    /// cgroup v1 cpusets under this mount: `flowlane-rt` (the CPUs) and `flowlane-sys`
    /// (the rest, where the tasks went).
    V1 {
        /// The cpuset mount.
        root: String,
        /// The root cpuset's `cpuset.sched_load_balance` before (set to 0).
        load_balance: String,
    },
}

/// An interrupt whose affinity was changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IrqChange {
    /// The IRQ.
    pub irq: u32,
    /// Its `smp_affinity_list` before.
    pub before: String,
}

/// What `isolate` did: the state file's contents and the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct IsolateReport {
    /// The isolated CPUs.
    pub cpus: Vec<usize>,
    /// The CPUs everything else runs on now.
    pub housekeeping: Vec<usize>,
    /// How the partition was made.
    pub cgroup: Cgroup,
    /// The v2 partition's state as the kernel reads it back (`isolated`, `root`, or why
    /// invalid); `None` for v1.
    pub partition: Option<String>,
    /// Tasks moved off the CPUs (v1: moved to `flowlane-sys`; v2: the partition takes its
    /// CPUs from every other cgroup, so none is moved one by one).
    pub tasks_moved: u64,
    /// Tasks that could not move (kernel threads bound to a CPU).
    pub tasks_stayed: u64,
    /// Interrupts moved off the CPUs, with their affinity before.
    pub irqs_moved: Vec<IrqChange>,
    /// Interrupts whose affinity includes the CPUs and that the kernel would not move.
    pub irqs_stayed: Vec<u32>,
    /// `/proc/irq/default_smp_affinity` before (set to the housekeeping CPUs).
    pub default_irq_affinity: Option<String>,
}

/// What `undo` restored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UndoReport {
    /// The CPUs that were isolated.
    pub cpus: Vec<usize>,
    /// Tasks moved back to the root cgroup.
    pub tasks_moved_back: u64,
    /// Interrupts given their affinity back.
    pub irqs_restored: u64,
    /// What could not be restored, in words (empty: everything).
    pub problems: Vec<String>,
}

fn read(p: &Path) -> Result<String, ToolError> {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .map_err(|e| ToolError::runtime(format!("read {}: {e}", p.display())))
}

fn write(p: &Path, v: &str) -> Result<(), ToolError> {
    std::fs::write(p, v)
        .map_err(|e| ToolError::runtime(format!("write {v} to {}: {e}", p.display())))
}

fn list(cpus: &[usize]) -> String {
    flowlane_runtime::cpus::format_cpu_list(cpus)
}

/// A CPU list as the kernel writes it.
fn parse_list(s: &str) -> Vec<usize> {
    flowlane_runtime::cpus::parse_cpu_list(s.trim()).unwrap_or_default()
}

/// Moves every task listed in `from` (a `tasks` file) to `to` (a `tasks` file): (moved,
/// refused).
fn move_tasks(from: &Path, to: &Path) -> (u64, u64) {
    let (mut moved, mut stayed) = (0, 0);
    for tid in read(from).unwrap_or_default().lines() {
        if std::fs::write(to, tid).is_ok() {
            moved += 1;
        } else {
            stayed += 1;
        }
    }
    (moved, stayed)
}

/// Moves interrupts whose affinity includes `cpus` onto `house`.
fn move_irqs(cpus: &[usize], house: &[usize]) -> (Vec<IrqChange>, Vec<u32>) {
    let (mut moved, mut stayed) = (Vec::new(), Vec::new());
    let mut irqs: Vec<u32> = std::fs::read_dir("/proc/irq")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    irqs.sort_unstable();
    for irq in irqs {
        let p = PathBuf::from(format!("/proc/irq/{irq}/smp_affinity_list"));
        let Ok(before) = read(&p) else { continue };
        if !parse_list(&before).iter().any(|c| cpus.contains(c)) {
            continue;
        }
        match std::fs::write(&p, list(house)) {
            Ok(()) => moved.push(IrqChange { irq, before }),
            Err(_) => stayed.push(irq),
        }
    }
    (moved, stayed)
}

/// The hexadecimal mask of `cpus` as `/proc/irq/default_smp_affinity` takes it.
fn mask(cpus: &[usize]) -> String {
    let top = cpus.iter().max().copied().unwrap_or(0);
    let mut words = vec![0u32; top / 32 + 1];
    for &c in cpus {
        words[c / 32] |= 1 << (c % 32);
    }
    words
        .iter()
        .rev()
        .map(|w| format!("{w:08x}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Isolates `cpus`, recording what it changed in `state`.
///
/// Long: the checks, then the partition for whichever cgroup interface is mounted, the tasks,
/// the interrupts and the state file, in the order they are done (each step's failure undoes
/// what came before it).
pub fn isolate(cpus: &[usize], state: &Path) -> Result<IsolateReport, ToolError> {
    if state.exists() {
        return Err(ToolError::usage(format!(
            "{} exists: CPUs are isolated already — `flowlane isolate --undo` first",
            state.display()
        )));
    }
    let online = parse_list(&read(Path::new("/sys/devices/system/cpu/online"))?);
    if cpus.is_empty() || cpus.iter().any(|c| !online.contains(c)) {
        return Err(ToolError::usage(format!(
            "--cpus must be online CPUs (online: {})",
            list(&online)
        )));
    }
    let house: Vec<usize> = online
        .iter()
        .copied()
        .filter(|c| !cpus.contains(c))
        .collect();
    if house.is_empty() {
        return Err(ToolError::usage(
            "isolating every CPU leaves none for the rest of the system: keep one",
        ));
    }
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
    let v1 = Path::new("/sys/fs/cgroup/cpuset/cpuset.cpus");
    let mut report = IsolateReport {
        cpus: cpus.to_vec(),
        housekeeping: house.clone(),
        cgroup: Cgroup::V1 {
            root: String::new(),
            load_balance: String::new(),
        },
        partition: None,
        tasks_moved: 0,
        tasks_stayed: 0,
        irqs_moved: Vec::new(),
        irqs_stayed: Vec::new(),
        default_irq_affinity: None,
    };
    // cgroup v2 offers cpuset only where no v1 hierarchy holds it (a hybrid host mounts v2
    // elsewhere; a v2 host may still have cpuset bound to a v1 mount).
    let v2_controllers = read(v2).ok();
    let v2_cpuset = v2_controllers
        .as_deref()
        .is_some_and(|c| c.split_whitespace().any(|x| x == "cpuset"));
    if v2_cpuset {
        let root = PathBuf::from("/sys/fs/cgroup");
        let ctl = root.join("cgroup.subtree_control");
        let enabled_cpuset = !read(&ctl)?.split_whitespace().any(|c| c == "cpuset");
        if enabled_cpuset {
            write(&ctl, "+cpuset")?;
        }
        report.cgroup = Cgroup::V2 {
            root: root.display().to_string(),
            enabled_cpuset,
        };
        let rt = root.join(RT);
        std::fs::create_dir(&rt).map_err(|e| {
            ToolError::runtime(format!(
                "create {}: {e} (left by another run? rmdir it)",
                rt.display()
            ))
        })?;
        let made = write(&rt.join("cpuset.cpus"), &list(cpus))
            .and_then(|()| {
                write(&rt.join("cpuset.cpus.partition"), "isolated")
                    .or_else(|_| write(&rt.join("cpuset.cpus.partition"), "root"))
            })
            .and_then(|()| read(&rt.join("cpuset.cpus.partition")));
        match made {
            Ok(p) if !p.contains("invalid") => report.partition = Some(p),
            other => {
                let why = match other {
                    Ok(p) => p,
                    Err(e) => e.message,
                };
                let _ = std::fs::remove_dir(&rt);
                if enabled_cpuset {
                    let _ = write(&ctl, "-cpuset");
                }
                return Err(ToolError::runtime(format!(
                    "the kernel refused a partition of CPUs {}: {why}",
                    list(cpus)
                )));
            }
        }
    } else if v1.exists() {
        let root = PathBuf::from("/sys/fs/cgroup/cpuset");
        let mems = read(&root.join("cpuset.mems"))?;
        let load_balance = read(&root.join("cpuset.sched_load_balance"))?;
        let (rt, sys) = (root.join(RT), root.join(SYS));
        for (dir, set, balance) in [(&sys, &house, "1"), (&rt, &cpus.to_vec(), "0")] {
            std::fs::create_dir(dir).map_err(|e| {
                // Only the one made here: a flowlane-sys that was there already is not ours.
                if dir == &rt {
                    let _ = std::fs::remove_dir(&sys);
                }
                ToolError::runtime(format!(
                    "create {}: {e} (left by another run? rmdir it)",
                    dir.display()
                ))
            })?;
            let r = write(&dir.join("cpuset.cpus"), &list(set))
                .and_then(|()| write(&dir.join("cpuset.mems"), &mems))
                .and_then(|()| write(&dir.join("cpuset.sched_load_balance"), balance));
            if let Err(e) = r {
                let _ = std::fs::remove_dir(&rt);
                let _ = std::fs::remove_dir(&sys);
                return Err(e);
            }
        }
        let _ = write(&rt.join("cpuset.cpu_exclusive"), "1");
        report.cgroup = Cgroup::V1 {
            root: root.display().to_string(),
            load_balance,
        };
        // Written before anything moves: an undo from here restores everything.
        save(state, &report)?;
        let _ = write(&root.join("cpuset.sched_load_balance"), "0");
        let (moved, stayed) = move_tasks(&root.join("tasks"), &sys.join("tasks"));
        report.tasks_moved = moved;
        report.tasks_stayed = stayed;
    } else if let Some(c) = v2_controllers {
        return Err(ToolError::usage(format!(
            "cgroup v2 at /sys/fs/cgroup offers no cpuset controller (it has: {}), and no v1 \
             cpuset is mounted at /sys/fs/cgroup/cpuset: cpuset is bound to a v1 hierarchy \
             elsewhere — mount that one at /sys/fs/cgroup/cpuset, or free it for v2",
            c.trim()
        )));
    } else {
        return Err(ToolError::usage(
            "no cpuset controller mounted (neither cgroup v2 at /sys/fs/cgroup nor v1 at \
             /sys/fs/cgroup/cpuset): mount one to isolate CPUs",
        ));
    }
    save(state, &report)?;
    let def = Path::new("/proc/irq/default_smp_affinity");
    if let Ok(before) = read(def) {
        if write(def, &mask(&house)).is_ok() {
            report.default_irq_affinity = Some(before);
        }
    }
    let (moved, stayed) = move_irqs(cpus, &house);
    report.irqs_moved = moved;
    report.irqs_stayed = stayed;
    save(state, &report)?;
    Ok(report)
}

fn save(state: &Path, r: &IsolateReport) -> Result<(), ToolError> {
    if let Some(d) = state.parent() {
        std::fs::create_dir_all(d)
            .map_err(|e| ToolError::runtime(format!("create {}: {e}", d.display())))?;
    }
    let text = serde_json::to_string_pretty(r).map_err(|e| ToolError::runtime(e.to_string()))?;
    write(state, &text)
}

/// The cgroup that holds the isolated CPUs, for a process to join (`cgroup.procs`).
pub fn isolated_procs(r: &IsolateReport) -> PathBuf {
    match &r.cgroup {
        Cgroup::V2 { root, .. } | Cgroup::V1 { root, .. } => {
            Path::new(root).join(RT).join("cgroup.procs")
        }
    }
}

/// Where a single thread joins the isolated CPUs: the v1 cpuset's `tasks` file (`None` on
/// cgroup v2, where a partition takes whole processes).
pub fn isolated_tasks(r: &IsolateReport) -> Option<PathBuf> {
    match &r.cgroup {
        Cgroup::V1 { root, .. } => Some(Path::new(root).join(RT).join("tasks")),
        Cgroup::V2 { .. } => None,
    }
}

/// The root cgroup's `cgroup.procs`, to go back to.
pub fn root_procs(r: &IsolateReport) -> PathBuf {
    match &r.cgroup {
        Cgroup::V2 { root, .. } | Cgroup::V1 { root, .. } => Path::new(root).join("cgroup.procs"),
    }
}

/// Moves this whole process (every thread) into `procs` (a `cgroup.procs` file).
pub fn join(procs: &Path) -> Result<(), ToolError> {
    write(procs, &std::process::id().to_string())
}

/// Restores what the state file says was changed, and removes it.
pub fn undo(state: &Path) -> Result<UndoReport, ToolError> {
    let text = std::fs::read_to_string(state).map_err(|e| {
        ToolError::usage(format!(
            "{}: {e} — nothing isolated by flowlane to undo",
            state.display()
        ))
    })?;
    let r: IsolateReport = serde_json::from_str(&text).map_err(|e| {
        ToolError::runtime(format!("{}: not flowlane's state ({e})", state.display()))
    })?;
    let mut out = UndoReport {
        cpus: r.cpus.clone(),
        tasks_moved_back: 0,
        irqs_restored: 0,
        problems: Vec::new(),
    };
    for c in &r.irqs_moved {
        let p = PathBuf::from(format!("/proc/irq/{}/smp_affinity_list", c.irq));
        match std::fs::write(&p, &c.before) {
            Ok(()) => out.irqs_restored += 1,
            // An interrupt that went away meanwhile (a device removed) has nothing to restore.
            Err(e) if p.exists() => out.problems.push(format!("IRQ {}: {e}", c.irq)),
            Err(_) => {}
        }
    }
    if let Some(d) = &r.default_irq_affinity {
        if let Err(e) = std::fs::write("/proc/irq/default_smp_affinity", d) {
            out.problems.push(format!("default_smp_affinity: {e}"));
        }
    }
    match &r.cgroup {
        Cgroup::V2 {
            root,
            enabled_cpuset,
        } => {
            let root = Path::new(root);
            let rt = root.join(RT);
            let (m, _) = move_tasks(&rt.join("cgroup.procs"), &root.join("cgroup.procs"));
            out.tasks_moved_back += m;
            let _ = write(&rt.join("cpuset.cpus.partition"), "member");
            if let Err(e) = std::fs::remove_dir(&rt) {
                out.problems.push(format!("remove {}: {e}", rt.display()));
            }
            if *enabled_cpuset {
                if let Err(e) = write(&root.join("cgroup.subtree_control"), "-cpuset") {
                    out.problems
                        .push(format!("cpuset left enabled: {}", e.message));
                }
            }
        }
        Cgroup::V1 { root, load_balance } => {
            let root = Path::new(root);
            for d in [SYS, RT] {
                let dir = root.join(d);
                let (m, s) = move_tasks(&dir.join("tasks"), &root.join("tasks"));
                out.tasks_moved_back += m;
                if s > 0 {
                    out.problems
                        .push(format!("{s} tasks would not leave {}", dir.display()));
                }
                if let Err(e) = std::fs::remove_dir(&dir) {
                    out.problems.push(format!("remove {}: {e}", dir.display()));
                }
            }
            if let Err(e) = write(&root.join("cpuset.sched_load_balance"), load_balance) {
                out.problems.push(e.message);
            }
        }
    }
    if out.problems.is_empty() {
        let _ = std::fs::remove_file(state);
    } else {
        out.problems.push(format!(
            "{} kept: run --undo again once the above is fixed",
            state.display()
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_written_as_the_kernel_reads_them() {
        assert_eq!(mask(&[0]), "00000001");
        assert_eq!(mask(&[0, 2, 3]), "0000000d");
        assert_eq!(mask(&[1, 33]), "00000002,00000002");
    }
}
