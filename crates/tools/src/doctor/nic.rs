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
    rss_by_cpu(n, cpus, out);
    offloads(n, out);
    coalescing(n, out);
    xps(n, out);
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

fn word(b: Option<bool>) -> &'static str {
    match b {
        Some(true) => "on",
        Some(false) => "off",
        None => "?",
    }
}

/// GRO, LRO and checksum offloads.
fn offloads(n: &NicReport, out: &mut Vec<Finding>) {
    const WHY: &str = "LRO merges packets before anything counts them (and breaks forwarding), \
                       and without checksum offload every packet's checksum costs CPU time the \
                       figures then include; GRO merges a flow's segments, which a socket counts \
                       as one";
    let dev = Some(n.dev.clone());
    let Some(o) = &n.offloads.value else {
        out.push(finding(
            "nic.offloads",
            dev,
            Verdict::Skip,
            n.offloads.missing.clone().unwrap_or_default(),
            WHY,
            None,
        ));
        return;
    };
    let bad = o.lro == Some(true) || o.rx_checksum == Some(false) || o.tx_checksum == Some(false);
    out.push(finding(
        "nic.offloads",
        dev,
        if bad { Verdict::Warn } else { Verdict::Pass },
        format!(
            "gro {}, lro {}, rx-checksum {}, tx-checksum {}",
            word(o.gro),
            word(o.lro),
            word(o.rx_checksum),
            word(o.tx_checksum)
        ),
        WHY,
        Some(format!("ethtool -K {} lro off rx on tx on", n.dev)),
    ));
}

/// Interrupt coalescing: adaptive moderation retunes itself during a run.
fn coalescing(n: &NicReport, out: &mut Vec<Finding>) {
    const WHY: &str = "adaptive interrupt moderation retunes the interrupt rate as the load \
                       changes, so latency and CPU per packet move between the steps of one run";
    let dev = Some(n.dev.clone());
    let Some(c) = &n.coalesce.value else {
        out.push(finding(
            "nic.coalesce",
            dev,
            Verdict::Skip,
            n.coalesce.missing.clone().unwrap_or_default(),
            WHY,
            None,
        ));
        return;
    };
    out.push(finding(
        "nic.coalesce",
        dev,
        if c.adaptive_rx || c.adaptive_tx {
            Verdict::Warn
        } else {
            Verdict::Pass
        },
        format!(
            "rx-usecs {}, rx-frames {}, adaptive-rx {}, tx-usecs {}, adaptive-tx {}",
            c.rx_usecs,
            c.rx_frames,
            word(Some(c.adaptive_rx)),
            c.tx_usecs,
            word(Some(c.adaptive_tx))
        ),
        WHY,
        Some(format!(
            "ethtool -C {} adaptive-rx off adaptive-tx off rx-usecs {}",
            n.dev, c.rx_usecs
        )),
    ));
}

/// XPS: which CPUs send on which transmit queue.
fn xps(n: &NicReport, out: &mut Vec<Finding>) {
    const WHY: &str = "without XPS the kernel picks a transmit queue by flow hash, so senders on \
                       different CPUs contend for one queue's lock and a flow's frames leave \
                       on a queue whose completions interrupt another CPU";
    let dev = Some(n.dev.clone());
    let tx = &n.host.tx;
    let read: Vec<_> = tx.iter().filter_map(|q| q.xps_cpus.as_ref()).collect();
    let (verdict, seen) = if tx.len() <= 1 {
        (
            Verdict::Pass,
            format!("{} transmit queue(s): nothing to choose", tx.len()),
        )
    } else if read.len() < tx.len() {
        (
            Verdict::Skip,
            format!(
                "xps_cpus readable on {} of {} tx queues",
                read.len(),
                tx.len()
            ),
        )
    } else {
        let unset = read.iter().filter(|c| c.is_empty()).count();
        if unset == 0 {
            (
                Verdict::Pass,
                format!("XPS set on all {} tx queues", tx.len()),
            )
        } else {
            (
                Verdict::Warn,
                format!("XPS unset on {unset} of {} tx queues", tx.len()),
            )
        }
    };
    out.push(finding(
        "nic.xps",
        dev,
        verdict,
        seen,
        WHY,
        Some(format!(
            "echo CPUMASK > /sys/class/net/{}/queues/tx-N/xps_cpus (one CPU per queue)",
            n.dev
        )),
    ));
}

/// The RSS buckets each measurement CPU takes: a queue's share of the indirection table (or
/// an equal share where the table was not read) goes to the CPU its receive interrupt runs
/// on. The rates of a run follow these shares, whatever the workers do.
fn rss_by_cpu(n: &NicReport, cpus: &[usize], out: &mut Vec<Finding>) {
    const WHY: &str = "a CPU's share of the traffic is the share of RSS buckets whose queue \
                       interrupts it takes: uneven shares make one worker the bottleneck of a \
                       run that looks like it scales";
    let dev = Some(n.dev.clone());
    // One receive interrupt per queue (the first named for it).
    let mut queues: Vec<(u32, Option<usize>)> = Vec::new();
    for i in &n.host.irqs {
        let Some(q) = i.queue_by_name else { continue };
        if queues.iter().any(|x| x.0 == q) {
            continue;
        }
        let on = i.effective.as_ref().or(i.affinity.as_ref());
        // Pinned to one CPU, or it moves between several (then it has no one CPU).
        let cpu = on.filter(|c| c.len() == 1).map(|c| c[0] as usize);
        queues.push((q, cpu));
    }
    if queues.is_empty() || cpus.is_empty() {
        out.push(finding(
            "nic.rss_cpus",
            dev,
            Verdict::Skip,
            "no queue interrupts of its own to map buckets to CPUs".into(),
            WHY,
            None,
        ));
        return;
    }
    let table: Option<Vec<u32>> = n
        .rss
        .value
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.context == 0))
        .map(|c| c.indir.clone())
        .filter(|t| !t.is_empty());
    let share = |q: u32| match &table {
        Some(t) => t.iter().filter(|&&e| e == q).count() as f64 / t.len() as f64,
        None => 1.0 / queues.len() as f64,
    };
    let mut per_cpu: Vec<(usize, f64)> = cpus.iter().map(|&c| (c, 0.0)).collect();
    let mut elsewhere = 0.0;
    for &(q, cpu) in &queues {
        match cpu.and_then(|c| per_cpu.iter_mut().find(|x| x.0 == c)) {
            Some(x) => x.1 += share(q),
            None => elsewhere += share(q),
        }
    }
    let fair = 1.0 / cpus.len() as f64;
    let most = per_cpu.iter().map(|x| x.1).fold(0.0, f64::max);
    let least = per_cpu.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
    let even = elsewhere < 1e-9 && most <= fair * 1.25 + 1e-9 && least >= fair * 0.75 - 1e-9;
    let mut seen: Vec<String> = per_cpu
        .iter()
        .map(|(c, x)| format!("cpu{c} {:.0} %", x * 100.0))
        .collect();
    if elsewhere > 1e-9 {
        seen.push(format!("other CPUs or unpinned {:.0} %", elsewhere * 100.0));
    }
    out.push(finding(
        "nic.rss_cpus",
        dev,
        if even { Verdict::Pass } else { Verdict::Warn },
        format!(
            "buckets by CPU ({}): {}",
            if table.is_some() {
                "from the indirection table"
            } else {
                "queues counted equal: no table read"
            },
            seen.join(", ")
        ),
        WHY,
        Some(format!(
            "pin queue N's interrupt to a measurement CPU, one queue per CPU \
             (/proc/irq/IRQ/smp_affinity_list), or weigh the table: ethtool -X {} weight …",
            n.dev
        )),
    ));
}
