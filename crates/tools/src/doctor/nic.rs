//! An interface's rules: rings, NUMA node, queue interrupts' CPUs, RPS.

use super::{finding, list, Finding, Host, Verdict};
use crate::nic::NicReport;

/// The NUMA node of CPU `c` (from its `nodeN` link).
pub(super) fn cpu_node(h: &Host, c: usize) -> Option<u32> {
    std::fs::read_dir(h.root.join(format!("sys/devices/system/cpu/cpu{c}")))
        .ok()?
        .filter_map(Result::ok)
        .find_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
}

pub(super) fn nic_rules(h: &Host, n: &NicReport, cpus: &[usize], out: &mut Vec<Finding>) {
    let dev = Some(n.dev.clone());
    // Rings against their maximum.
    const RINGS: &str = "a receive ring below its maximum overflows sooner under bursts, and the \
                         drops are the NIC's, not the code's";
    match &n.rings.value {
        Some(r) => match (r.rx, r.rx_max) {
            (Some(rx), Some(max)) => out.push(finding(
                "nic.rings",
                dev.clone(),
                if rx >= max {
                    Verdict::Pass
                } else {
                    Verdict::Warn
                },
                format!("rx ring {rx} of {max}"),
                RINGS,
                Some(format!("ethtool -G {} rx {max}", n.dev)),
            )),
            _ => out.push(finding(
                "nic.rings",
                dev.clone(),
                Verdict::Skip,
                "no ring sizes reported".into(),
                RINGS,
                None,
            )),
        },
        None => out.push(finding(
            "nic.rings",
            dev.clone(),
            Verdict::Skip,
            n.rings.missing.clone().unwrap_or_default(),
            RINGS,
            None,
        )),
    }
    // NUMA: the device's node against the measurement CPUs'.
    const NUMA: &str = "a device on another NUMA node than the CPUs that read it costs a trip \
                        across the interconnect for every packet";
    match n.host.numa_node {
        None => out.push(finding(
            "nic.numa",
            dev.clone(),
            Verdict::Skip,
            if n.host.has_device {
                "one NUMA node (or none reported)".into()
            } else {
                "a virtual interface: no device".into()
            },
            NUMA,
            None,
        )),
        Some(node) => {
            let far: Vec<usize> = cpus
                .iter()
                .copied()
                .filter(|&c| cpu_node(h, c).is_some_and(|x| x != node))
                .collect();
            out.push(finding("nic.numa", dev.clone(), if far.is_empty() { Verdict::Pass } else { Verdict::Warn },
                if far.is_empty() { format!("node {node}, as the measurement CPUs") } else { format!("node {node}; CPUs {} are on another", list(&far)) },
                NUMA, Some(format!("measure on node {node}'s CPUs (see /sys/devices/system/node/node{node}/cpulist)"))));
        }
    }
    // Each queue's IRQ against the measurement CPUs.
    const IRQ: &str = "a queue whose interrupt runs on a CPU that is not its worker's makes every \
                       packet cross CPUs before it is read";
    let queue_irqs: Vec<_> = n
        .host
        .irqs
        .iter()
        .filter(|i| i.queue_by_name.is_some())
        .collect();
    if queue_irqs.is_empty() {
        out.push(finding(
            "nic.irq_affinity",
            dev.clone(),
            Verdict::Skip,
            "no queue interrupts of its own (a virtual interface, or names without a queue)".into(),
            IRQ,
            None,
        ));
    } else {
        let off: Vec<String> = queue_irqs
            .iter()
            .filter(|i| {
                let on = i.effective.as_ref().or(i.affinity.as_ref());
                on.is_some_and(|c| c.iter().any(|&x| !cpus.contains(&(x as usize))))
            })
            .map(|i| format!("irq {} ({})", i.irq, i.name))
            .collect();
        out.push(finding(
            "nic.irq_affinity",
            dev.clone(),
            if off.is_empty() {
                Verdict::Pass
            } else {
                Verdict::Warn
            },
            if off.is_empty() {
                format!(
                    "{} queue interrupts, all on the measurement CPUs",
                    queue_irqs.len()
                )
            } else {
                format!("outside the measurement CPUs: {}", off.join(", "))
            },
            IRQ,
            Some(
                "echo CPU > /proc/irq/N/smp_affinity_list for each queue's IRQ (its worker's CPU)"
                    .into(),
            ),
        ));
    }
    // Flow control: a receiver that sends pause frames sets the sender's rate.
    const PAUSE: &str = "with Ethernet flow control on, a slow receiver pauses its sender, so \
                         the rate measured is the pauses', not the device's (the seed found it \
                         made \"a world of difference\")";
    let fix = Some(format!("ethtool -A {} autoneg off rx off tx off", n.dev));
    match &n.pause.value {
        None => out.push(finding(
            "nic.flow_control",
            dev.clone(),
            Verdict::Skip,
            n.pause.missing.clone().unwrap_or_default(),
            PAUSE,
            None,
        )),
        Some(p) => {
            let on = p.rx == Some(true) || p.tx == Some(true);
            let word = |b: Option<bool>| match b {
                Some(true) => "on",
                Some(false) => "off",
                None => "?",
            };
            let frames = match (p.rx_frames, p.tx_frames) {
                (None, None) => String::new(),
                (r, t) => format!(
                    "; pause frames received {}, sent {}",
                    r.map_or("?".into(), |v| v.to_string()),
                    t.map_or("?".into(), |v| v.to_string())
                ),
            };
            out.push(finding(
                "nic.flow_control",
                dev.clone(),
                if on { Verdict::Fail } else { Verdict::Pass },
                format!(
                    "autoneg {}, rx {}, tx {}{frames}",
                    word(p.autoneg),
                    word(p.rx),
                    word(p.tx)
                ),
                PAUSE,
                fix,
            ));
        }
    }
    // RPS on top of RSS.
    const RPS: &str = "RPS steers packets again in software after the NIC's RSS, so the CPU that \
                       reads a packet is not the one its queue's interrupt ran on";
    let on: Vec<String> = n
        .host
        .rx
        .iter()
        .filter(|q| q.rps_cpus.as_ref().is_some_and(|c| !c.is_empty()))
        .map(|q| format!("rx-{}", q.queue))
        .collect();
    out.push(finding(
        "nic.rps",
        dev,
        if on.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Warn
        },
        if on.is_empty() {
            "RPS off on every receive queue".into()
        } else {
            format!("RPS on: {}", on.join(", "))
        },
        RPS,
        Some(format!(
            "echo 0 > /sys/class/net/{}/queues/rx-N/rps_cpus",
            n.dev
        )),
    ));
}
