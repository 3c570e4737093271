//! The CPU rules: clock, idle states, SMT, isolation, interrupt balancing.

use super::{finding, list, parse_list, Finding, Host, Verdict};

pub(super) fn governor(h: &Host, cpus: &[usize]) -> Finding {
    const WHY: &str = "a governor other than performance changes the clock while a run measures, \
                       so rates differ as cores wake up";
    let seen: Vec<(usize, Option<String>)> = cpus
        .iter()
        .map(|&c| (c, h.cpu(c, "cpufreq/scaling_governor")))
        .collect();
    if seen.iter().all(|s| s.1.is_none()) {
        return finding(
            "cpu.governor",
            Some(list(cpus)),
            Verdict::Skip,
            "no cpufreq (a virtual machine, or a CPU at a fixed clock)".into(),
            WHY,
            None,
        );
    }
    let other: Vec<String> = seen
        .iter()
        .filter(|s| s.1.as_deref() != Some("performance"))
        .map(|(c, g)| format!("cpu{c}: {}", g.as_deref().unwrap_or("none")))
        .collect();
    let text = seen
        .iter()
        .map(|(c, g)| format!("cpu{c}: {}", g.as_deref().unwrap_or("none")))
        .collect::<Vec<_>>()
        .join(", ");
    finding(
        "cpu.governor",
        Some(list(cpus)),
        if other.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Warn
        },
        text,
        WHY,
        Some(format!(
            "cpupower -c {} frequency-set -g performance",
            list(cpus)
        )),
    )
}

pub(super) fn boost(h: &Host) -> Finding {
    const WHY: &str = "turbo/boost makes a core's clock depend on how many others are busy: \
                       per-core rates then differ by 15-30 % with the load, not the code";
    if let Some(b) = h.read("sys/devices/system/cpu/cpufreq/boost") {
        let on = b == "1";
        return finding(
            "cpu.boost",
            None,
            if on { Verdict::Warn } else { Verdict::Pass },
            format!("cpufreq/boost = {b}"),
            WHY,
            Some("echo 0 > /sys/devices/system/cpu/cpufreq/boost".into()),
        );
    }
    if let Some(n) = h.read("sys/devices/system/cpu/intel_pstate/no_turbo") {
        let on = n == "0";
        return finding(
            "cpu.boost",
            None,
            if on { Verdict::Warn } else { Verdict::Pass },
            format!("intel_pstate/no_turbo = {n}"),
            WHY,
            Some("echo 1 > /sys/devices/system/cpu/intel_pstate/no_turbo".into()),
        );
    }
    finding(
        "cpu.boost",
        None,
        Verdict::Skip,
        "no boost control exposed (a virtual machine, or no turbo)".into(),
        WHY,
        None,
    )
}

pub(super) fn cstates(h: &Host, cpus: &[usize]) -> Finding {
    const WHY: &str = "a core in a deep C-state takes tens to hundreds of µs to wake, which \
                       shows up as latency and as lost packets at the start of a burst";
    let mut deep = Vec::new();
    let mut any = false;
    for &c in cpus {
        for s in 0..16 {
            let base = format!("cpuidle/state{s}");
            let Some(lat) = h.cpu(c, &format!("{base}/latency")) else {
                break;
            };
            any = true;
            let lat: u64 = lat.parse().unwrap_or(0);
            let disabled = h.cpu(c, &format!("{base}/disable")).as_deref() == Some("1");
            if lat > 10 && !disabled {
                let name = h.cpu(c, &format!("{base}/name")).unwrap_or_default();
                deep.push(format!("cpu{c} {name} ({lat} µs)"));
            }
        }
    }
    if !any {
        return finding(
            "cpu.cstates",
            Some(list(cpus)),
            Verdict::Skip,
            "no cpuidle states exposed".into(),
            WHY,
            None,
        );
    }
    finding(
        "cpu.cstates",
        Some(list(cpus)),
        if deep.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Warn
        },
        if deep.is_empty() {
            "no state with an exit latency above 10 µs enabled".into()
        } else {
            deep.join(", ")
        },
        WHY,
        Some(format!(
            "cpupower -c {} idle-set -D 10 (or hold /dev/cpu_dma_latency at 0 while measuring)",
            list(cpus)
        )),
    )
}

pub(super) fn smt(h: &Host, cpus: &[usize]) -> Finding {
    const WHY: &str = "two workers on the siblings of one core share its pipelines and caches: \
                       k = 2 then measures one core, not two";
    let mut shared = Vec::new();
    let mut any = false;
    for &c in cpus {
        let Some(sib) = h.cpu(c, "topology/thread_siblings_list") else {
            continue;
        };
        any = true;
        for s in parse_list(&sib) {
            if s != c && cpus.contains(&s) && c < s {
                shared.push(format!("cpu{c}+cpu{s}"));
            }
        }
    }
    if !any {
        return finding(
            "cpu.smt",
            Some(list(cpus)),
            Verdict::Skip,
            "no topology exposed".into(),
            WHY,
            None,
        );
    }
    finding(
        "cpu.smt",
        Some(list(cpus)),
        if shared.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Warn
        },
        if shared.is_empty() {
            "no two measurement CPUs are siblings".into()
        } else {
            format!("siblings: {}", shared.join(", "))
        },
        WHY,
        Some(
            "choose one CPU per core (--cpus), or echo off > /sys/devices/system/cpu/smt/control"
                .into(),
        ),
    )
}

pub(super) fn isolation(h: &Host, cpus: &[usize]) -> Finding {
    const WHY: &str = "CPUs the scheduler, timers and RCU callbacks also use wake their workers \
                       late: the Enea profile halves worst-case latency by isolating them";
    let cmdline = h.read("proc/cmdline").unwrap_or_default();
    let param = |name: &str| {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            // `isolcpus=domain,managed_irq,2-3`: the flags are words, the CPUs numbers.
            .map(|v| {
                let nums: Vec<&str> = v
                    .split(',')
                    .filter(|t| t.starts_with(|c: char| c.is_ascii_digit()))
                    .collect();
                parse_list(&nums.join(","))
            })
            .unwrap_or_default()
    };
    let missing: Vec<&str> = ["isolcpus", "nohz_full", "rcu_nocbs"]
        .into_iter()
        .filter(|p| !cpus.iter().all(|c| param(p).contains(c)))
        .collect();
    finding(
        "cpu.isolation",
        Some(list(cpus)),
        if missing.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Warn
        },
        if missing.is_empty() {
            "isolcpus, nohz_full and rcu_nocbs cover them".into()
        } else {
            format!("not covered by: {}", missing.join(", "))
        },
        WHY,
        Some(format!(
            "boot with isolcpus={0} nohz_full={0} rcu_nocbs={0}",
            list(cpus)
        )),
    )
}

pub(super) fn irqbalance(h: &Host) -> Finding {
    const WHY: &str =
        "irqbalance moves interrupts between CPUs while a run measures, so a queue's \
                       work changes CPU under it";
    let running = std::fs::read_dir(h.root.join("proc"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                })
                .any(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "irqbalance")
                })
        })
        .unwrap_or(false);
    finding(
        "irq.balance",
        None,
        if running {
            Verdict::Warn
        } else {
            Verdict::Pass
        },
        if running {
            "irqbalance is running".into()
        } else {
            "irqbalance is not running".into()
        },
        WHY,
        Some("systemctl stop irqbalance (and set each queue's IRQ affinity by hand)".into()),
    )
}
