//! `flowlane isolate` (issue 55 item 3) on this host's real cgroups and interrupts: a new
//! process is confined to the other CPUs while isolated, the interrupts it moved exclude the
//! CPU, and `--undo` puts back exactly what was there (every IRQ's affinity, the default
//! affinity, the cpusets, a new process's CPUs). Then `latency --compare-isolated` does the
//! same around a second phase. One test: both change the whole host, never at once. A guard
//! undoes the isolation if an assertion fails half-way.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// Every IRQ's affinity and the default one, as text.
fn irqs() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir("/proc/irq")
        .expect("/proc/irq")
        .flatten()
        .filter_map(|e| {
            let p = e.path().join("smp_affinity_list");
            Some((p.display().to_string(), std::fs::read_to_string(p).ok()?))
        })
        .collect();
    v.push((
        "default".into(),
        std::fs::read_to_string("/proc/irq/default_smp_affinity").unwrap_or_default(),
    ));
    v.sort();
    v
}

/// The CPUs a new process may run on.
fn new_process_cpus() -> String {
    let out = Command::new("cat")
        .arg("/proc/self/status")
        .output()
        .expect("cat");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string()
}

/// cpusets or cgroups flowlane made.
fn ours_left() -> Vec<PathBuf> {
    ["/sys/fs/cgroup", "/sys/fs/cgroup/cpuset"]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("flowlane-"))
        })
        .collect()
}

struct Undo(PathBuf);

impl Drop for Undo {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = Command::new(BIN)
                .args(["isolate", "--undo", "--state"])
                .arg(&self.0)
                .output();
        }
    }
}

fn flowlane(args: &[&str], state: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .arg(if args[0] == "isolate" {
            "--state"
        } else {
            "--isolate-state"
        })
        .arg(state)
        .output()
        .expect("runs")
}

#[test]
fn isolation_confines_new_tasks_and_irqs_and_undo_restores_everything() {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: isolate changes cgroups and IRQs and needs root");
        return;
    }
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online");
    let cpus = flowlane_runtime::cpus::parse_cpu_list(online.trim()).expect("CPUs");
    if cpus.len() < 2 {
        eprintln!("SKIP: one CPU: nothing left for the rest when it is isolated");
        return;
    }
    let cpu = *cpus.last().expect("a CPU");
    let house: Vec<usize> = cpus.iter().copied().filter(|&c| c != cpu).collect();
    let state = std::env::temp_dir().join(format!("fl-isolate-{}.json", std::process::id()));
    let _undo = Undo(state.clone());
    let (irqs0, cpus0) = (irqs(), new_process_cpus());
    assert!(ours_left().is_empty(), "{:?}", ours_left());

    let out = flowlane(&["isolate", "--cpus", &cpu.to_string(), "--json"], &state);
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("no cpuset controller mounted") {
        eprintln!("SKIP: {err}");
        return;
    }
    assert!(out.status.success(), "{err}");
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(state.exists());
    assert_eq!(
        new_process_cpus(),
        flowlane_runtime::cpus::format_cpu_list(&house),
        "a new process runs on the other CPUs only: {r}"
    );
    for c in r["irqs_moved"].as_array().expect("irqs") {
        let p = format!("/proc/irq/{}/smp_affinity_list", c["irq"]);
        let now = std::fs::read_to_string(&p).expect("affinity");
        let now = flowlane_runtime::cpus::parse_cpu_list(now.trim()).expect("list");
        assert!(!now.contains(&cpu), "{p}: {now:?}");
    }
    // Isolating again is refused: the state says it is done.
    let again = flowlane(&["isolate", "--cpus", &cpu.to_string()], &state);
    assert_eq!(again.status.code(), Some(2));

    let out = flowlane(&["isolate", "--undo", "--json"], &state);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let u: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(u["problems"], serde_json::json!([]), "{u}");
    assert_eq!(
        u["irqs_restored"],
        r["irqs_moved"].as_array().map(Vec::len).unwrap_or(0)
    );
    assert!(!state.exists());
    assert_eq!(irqs(), irqs0, "every IRQ's affinity as it was");
    assert_eq!(new_process_cpus(), cpus0);
    assert!(ours_left().is_empty(), "{:?}", ours_left());
    // Nothing to undo now: a usage error.
    let none = flowlane(&["isolate", "--undo"], &state);
    assert_eq!(none.status.code(), Some(2));

    // Before and after in one run, the host as it was at the end.
    let out = flowlane(
        &[
            "latency",
            "--cpus",
            &cpu.to_string(),
            "--duration",
            "1",
            "--compare-isolated",
            "--json",
            "--quiet",
        ],
        &state,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let l: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = l["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["no load", "isolated, no load"], "{l}");
    // 1 s at 1 000 µs: each period measured, or skipped after a late wake-up.
    let c = &l["phases"][1]["cpus"][0];
    let periods = c["wakeups"].as_u64().unwrap_or(0) + c["overruns"].as_u64().unwrap_or(0);
    assert!((999..=1002).contains(&periods), "{l}");
    assert_eq!(l["undone"]["problems"], serde_json::json!([]), "{l}");
    assert!(!state.exists());
    assert_eq!(irqs(), irqs0);
    assert_eq!(new_process_cpus(), cpus0);
    assert!(ours_left().is_empty(), "{:?}", ours_left());
}
