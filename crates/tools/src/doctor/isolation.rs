//! Each CPU's isolation as the kernel has it now: the boot parameters that take it from the
//! scheduler, the tick and RCU (isolcpus, nohz_full, rcu_nocbs), the interrupts allowed on it,
//! and the other tasks found runnable there — what `latency` reports beside each measured CPU.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{parse_list, Host};

/// One CPU's isolation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CpuIsolation {
    /// The CPU.
    pub cpu: usize,
    /// In `isolcpus=` (no load balancing onto it).
    pub isolcpus: bool,
    /// In `nohz_full=` (no scheduler tick while one task runs).
    pub nohz_full: bool,
    /// In `rcu_nocbs=` (RCU callbacks run elsewhere).
    pub rcu_nocbs: bool,
    /// In the kernel's isolated set (`/sys/devices/system/cpu/isolated`).
    pub isolated: bool,
    /// IRQs whose affinity (`/proc/irq/N/smp_affinity_list`) includes it.
    pub irqs: Vec<u32>,
}

/// The CPUs a boot parameter names (`isolcpus=domain,managed_irq,2-3`: the flags are words,
/// the CPUs numbers).
pub(super) fn boot_cpus(cmdline: &str, name: &str) -> Vec<usize> {
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .map(|v| {
            let nums: Vec<&str> = v
                .split(',')
                .filter(|t| t.starts_with(|c: char| c.is_ascii_digit()))
                .collect();
            parse_list(&nums.join(","))
        })
        .unwrap_or_default()
}

/// The isolation of each of `cpus`, read under `root` (`/` for this host; a recorded tree in
/// tests).
pub fn cpu_isolation(root: &Path, cpus: &[usize]) -> Vec<CpuIsolation> {
    let h = Host {
        root: root.to_path_buf(),
    };
    let cmdline = h.read("proc/cmdline").unwrap_or_default();
    let (iso, nohz, nocb) = (
        boot_cpus(&cmdline, "isolcpus"),
        boot_cpus(&cmdline, "nohz_full"),
        boot_cpus(&cmdline, "rcu_nocbs"),
    );
    let isolated = parse_list(
        &h.read("sys/devices/system/cpu/isolated")
            .unwrap_or_default(),
    );
    let mut irqs: Vec<(u32, Vec<usize>)> = std::fs::read_dir(root.join("proc/irq"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.parse().ok()?;
            let aff = h.read(&format!("proc/irq/{n}/smp_affinity_list"))?;
            Some((n, parse_list(&aff)))
        })
        .collect();
    irqs.sort_unstable();
    cpus.iter()
        .map(|&cpu| CpuIsolation {
            cpu,
            isolcpus: iso.contains(&cpu),
            nohz_full: nohz.contains(&cpu),
            rcu_nocbs: nocb.contains(&cpu),
            isolated: isolated.contains(&cpu),
            irqs: irqs
                .iter()
                .filter(|(_, a)| a.contains(&cpu))
                .map(|(n, _)| *n)
                .collect(),
        })
        .collect()
}

/// Tasks of other processes found runnable (state R) on `cpu`, read from
/// `/proc/PID/task/TID/stat` under `root`: `name(tid)` each, at most `max`, and how many in
/// all. A task's CPU is the one it last ran on (field 39).
pub fn runnable_others(root: &Path, cpu: usize, max: usize) -> (Vec<String>, usize) {
    let me = std::process::id();
    let mut seen = Vec::new();
    let mut count = 0;
    for p in std::fs::read_dir(root.join("proc"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        for t in std::fs::read_dir(p.path().join("task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue;
            };
            // `tid (comm) S …`: the name may hold spaces and parentheses; fields follow the
            // last `)`.
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
            // rest[0] is field 3 (state); field 39 (processor) is rest[36].
            let (Some(&state), Some(on)) = (
                rest.first(),
                rest.get(36).and_then(|s| s.parse::<usize>().ok()),
            ) else {
                continue;
            };
            if state == "R" && on == cpu {
                count += 1;
                if seen.len() < max {
                    let tid = stat[..open].trim();
                    seen.push(format!("{}({tid})", &stat[open + 1..close]));
                }
            }
        }
    }
    (seen, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_parameters_irqs_and_runnable_tasks_are_read_per_cpu() {
        let root = std::env::temp_dir().join(format!("fl-iso-{}", std::process::id()));
        let w = |rel: &str, text: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        };
        w(
            "proc/cmdline",
            "ro isolcpus=domain,managed_irq,2-3 nohz_full=3 rcu_nocbs=2-3\n",
        );
        w("sys/devices/system/cpu/isolated", "2-3\n");
        w("proc/irq/24/smp_affinity_list", "0-3\n");
        w("proc/irq/25/smp_affinity_list", "0-1\n");
        w("proc/irq/26/smp_affinity_list", "3\n");
        // A kernel thread runnable on CPU 3, one sleeping there, one runnable on CPU 2.
        let stat = |tid: u32, comm: &str, state: &str, cpu: usize| {
            let mut f: Vec<String> = vec!["0".into(); 44];
            f[0] = state.into();
            f[36] = cpu.to_string();
            format!("{tid} ({comm}) {}\n", f.join(" "))
        };
        w("proc/77/task/77/stat", &stat(77, "kworker/3:1 (x)", "R", 3));
        w("proc/78/task/78/stat", &stat(78, "sleepy", "S", 3));
        w("proc/79/task/80/stat", &stat(80, "busy", "R", 2));
        let v = cpu_isolation(&root, &[1, 3]);
        assert_eq!(
            v[0],
            CpuIsolation {
                cpu: 1,
                isolcpus: false,
                nohz_full: false,
                rcu_nocbs: false,
                isolated: false,
                irqs: vec![24, 25],
            }
        );
        assert!(v[1].isolcpus && v[1].nohz_full && v[1].rcu_nocbs && v[1].isolated);
        assert_eq!(v[1].irqs, vec![24, 26]);
        assert_eq!(
            runnable_others(&root, 3, 10),
            (vec!["kworker/3:1 (x)(77)".to_string()], 1)
        );
        assert_eq!(runnable_others(&root, 2, 0), (vec![], 1));
        let _ = std::fs::remove_dir_all(&root);
    }
}
