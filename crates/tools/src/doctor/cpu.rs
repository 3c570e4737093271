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
    let Some(deep) = enabled_states(h, cpus, 10) else {
        return finding(
            "cpu.cstates",
            Some(list(cpus)),
            Verdict::Skip,
            "no cpuidle states exposed".into(),
            WHY,
            None,
        );
    };
    let deep: Vec<String> = deep
        .iter()
        .map(|(c, name, lat)| format!("cpu{c} {name} ({lat} µs)"))
        .collect();
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
    let param = |name: &str| super::isolation::boot_cpus(&cmdline, name);
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

/// The enabled idle states of `cpus` with an exit latency above `above` µs: (cpu, name,
/// latency); `None` when no cpuidle state is exposed.
fn enabled_states(h: &Host, cpus: &[usize], above: u64) -> Option<Vec<(usize, String, u64)>> {
    let mut out = Vec::new();
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
            if lat > above && !disabled {
                let name = h.cpu(c, &format!("{base}/name")).unwrap_or_default();
                out.push((c, name, lat));
            }
        }
    }
    any.then_some(out)
}

/// `/dev/cpu_dma_latency`: the wake-up limit a process holds (the PM QoS target: idle states
/// slower to leave than it are not entered). Reading it asks for no limit.
pub(super) fn dma_latency(h: &Host, cpus: &[usize]) -> Finding {
    const WHY: &str = "while no process holds a low /dev/cpu_dma_latency, the idle governor \
                       may put a measurement CPU into a state slower to leave than the gap \
                       between packets";
    let subject = Some(list(cpus));
    let limit = h
        .bytes("dev/cpu_dma_latency")
        .and_then(|b| Some(i32::from_ne_bytes(b.get(..4)?.try_into().ok()?)));
    let Some(limit) = limit else {
        return finding(
            "cpu.dma_latency",
            subject,
            Verdict::Skip,
            "/dev/cpu_dma_latency not readable".into(),
            WHY,
            None,
        );
    };
    let held = if limit >= 2_000_000_000 {
        "no limit held".to_string()
    } else {
        format!("limit {limit} µs held")
    };
    // Deep states (above 10 µs to leave) the limit still allows (the governor skips only
    // those slower to leave than the limit).
    let allowed = u64::try_from(limit.max(0)).unwrap_or(0);
    let slower = enabled_states(h, cpus, 10)
        .map(|v| v.into_iter().filter(|s| s.2 <= allowed).collect::<Vec<_>>());
    let (verdict, seen) = match slower {
        None => (Verdict::Skip, format!("{held}; no cpuidle states exposed")),
        Some(v) if v.is_empty() => (
            Verdict::Pass,
            format!("{held}; it keeps the CPUs out of every deep idle state"),
        ),
        Some(v) => (
            Verdict::Warn,
            format!(
                "{held}; deep states it allows: {}",
                v.iter()
                    .map(|(c, n, l)| format!("cpu{c} {n} ({l} µs)"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
    };
    finding(
        "cpu.dma_latency",
        subject,
        verdict,
        seen,
        WHY,
        Some(
            "hold /dev/cpu_dma_latency open at 0 for the run (cyclictest and tuned's \
             latency-performance profile do), or disable the deep states"
                .into(),
        ),
    )
}

/// The kernel's preemption model.
pub(super) fn preemption(h: &Host) -> Finding {
    const WHY: &str = "on a kernel that preempts only voluntarily, a woken measurement thread \
                       waits for whatever kernel work runs on its CPU, and that wait is in \
                       every latency figure";
    let fix = Some(
        "boot with preempt=full (a PREEMPT_DYNAMIC kernel), or run a PREEMPT_RT kernel".into(),
    );
    let version = h.read("proc/version").unwrap_or_default();
    let cmdline = h.read("proc/cmdline").unwrap_or_default();
    let dynamic_mode = h.read("sys/kernel/debug/sched/preempt").and_then(|t| {
        let (_, rest) = t.split_once('(')?;
        Some(rest.split_once(')')?.0.to_string())
    });
    let from_cmdline = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("preempt="))
        .map(str::to_string);
    let (model, how) = if h.read("sys/kernel/realtime").as_deref() == Some("1")
        || version.contains("PREEMPT_RT")
    {
        (Some("rt".to_string()), "PREEMPT_RT")
    } else if version.contains("PREEMPT_DYNAMIC") {
        match (dynamic_mode, from_cmdline) {
            (Some(m), _) => (Some(m), "dynamic, /sys/kernel/debug/sched/preempt"),
            (None, Some(m)) => (Some(m), "dynamic, preempt= on the command line"),
            (None, None) => (None, "dynamic"),
        }
    } else if version.contains(" PREEMPT ") || version.contains("PREEMPT_LAZY") {
        (Some("full".to_string()), "built in")
    } else if version.is_empty() {
        (None, "")
    } else {
        (Some("voluntary or none".to_string()), "built in")
    };
    match model {
        None => finding(
            "kernel.preempt",
            None,
            Verdict::Skip,
            if how.is_empty() {
                "/proc/version not readable".into()
            } else {
                "PREEMPT_DYNAMIC, mode not readable (mount debugfs to see \
                 /sys/kernel/debug/sched/preempt)"
                    .into()
            },
            WHY,
            None,
        ),
        Some(m) => finding(
            "kernel.preempt",
            None,
            if matches!(m.as_str(), "rt" | "full" | "lazy") {
                Verdict::Pass
            } else {
                Verdict::Warn
            },
            format!("{m} ({how})"),
            WHY,
            fix,
        ),
    }
}
