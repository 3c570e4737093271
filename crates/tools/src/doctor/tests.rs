//! The rules on recorded hosts: a tuned one, an untuned one, an empty one, and a NIC.
use super::*;

/// A recorded host under a temporary root, removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new(tag: &str) -> Tree {
        let p = std::env::temp_dir().join(format!("fl-doctor-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Tree(p)
    }

    fn w(&self, rel: &str, text: &str) -> &Tree {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
        std::fs::write(p, text).expect("write");
        self
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn verdicts(r: &DoctorReport) -> Vec<(String, Verdict)> {
    r.findings
        .iter()
        .map(|f| (f.id.clone(), f.verdict))
        .collect()
}

/// Two CPUs (2 and 3) of a 4-core, 2-thread host: written as a tuned host, then as an
/// untuned one; every host rule's verdict follows.
fn host(t: &Tree, tuned: bool) {
    let cpu = |c: usize, rel: &str, v: &str| {
        t.w(&format!("sys/devices/system/cpu/cpu{c}/{rel}"), v);
    };
    for c in [2, 3] {
        cpu(
            c,
            "cpufreq/scaling_governor",
            if tuned {
                "performance\n"
            } else {
                "powersave\n"
            },
        );
        cpu(c, "cpuidle/state0/name", "POLL\n");
        cpu(c, "cpuidle/state0/latency", "0\n");
        cpu(c, "cpuidle/state0/disable", "0\n");
        cpu(c, "cpuidle/state1/name", "C6\n");
        cpu(c, "cpuidle/state1/latency", "133\n");
        cpu(
            c,
            "cpuidle/state1/disable",
            if tuned { "1\n" } else { "0\n" },
        );
        // Untuned: 2 and 3 are one core's two threads.
        cpu(
            c,
            "topology/thread_siblings_list",
            if tuned { ["2,6", "3,7"][c - 2] } else { "2-3" },
        );
        cpu(c, "node0/cpulist", "0-7\n");
    }
    t.w(
        "sys/devices/system/cpu/cpufreq/boost",
        if tuned { "0\n" } else { "1\n" },
    );
    t.w(
        "proc/cmdline",
        if tuned {
            "ro isolcpus=domain,managed_irq,2-3 nohz_full=2-3 rcu_nocbs=2-3\n"
        } else {
            "ro quiet\n"
        },
    );
    if !tuned {
        t.w("proc/4242/comm", "irqbalance\n");
        t.w("proc/sys/net/netfilter/nf_conntrack_count", "17\n");
    }
    t.w("proc/1/comm", "systemd\n");
    let sys = |k: &str, v: &str| {
        t.w(&format!("proc/sys/net/core/{k}"), v);
    };
    sys(
        "netdev_max_backlog",
        if tuned { "250000\n" } else { "1000\n" },
    );
    sys("netdev_budget", if tuned { "600\n" } else { "100\n" });
    sys("rmem_max", if tuned { "16777216\n" } else { "212992\n" });
    sys("wmem_max", if tuned { "16777216\n" } else { "212992\n" });
    sys("busy_poll", if tuned { "0\n" } else { "50\n" });
    sys("busy_read", "0\n");
    t.w(
        "sys/kernel/mm/transparent_hugepage/enabled",
        if tuned {
            "always [madvise] never\n"
        } else {
            "always madvise [never]\n"
        },
    );
    t.w(
        "proc/cpuinfo",
        if tuned {
            "flags\t\t: fpu sse2 avx2\n"
        } else {
            "flags\t\t: fpu sse2 hypervisor\n"
        },
    );
    t.w(
        "sys/devices/system/clocksource/clocksource0/current_clocksource",
        if tuned { "tsc\n" } else { "hpet\n" },
    );
}

#[test]
fn a_tuned_host_passes_and_an_untuned_one_warns_rule_by_rule() {
    let t = Tree::new("tuned");
    host(&t, true);
    let r = check(&t.0, &[2, 3], &[]);
    let bad: Vec<_> = verdicts(&r)
        .into_iter()
        .filter(|v| v.1 != Verdict::Pass)
        .collect();
    assert!(bad.is_empty(), "{bad:?}\n{r:#?}");
    let u = Tree::new("untuned");
    host(&u, false);
    let r = check(&u.0, &[2, 3], &[]);
    let v = verdicts(&r);
    for id in [
        "cpu.governor",
        "cpu.boost",
        "cpu.cstates",
        "cpu.smt",
        "cpu.isolation",
        "irq.balance",
        "net.backlog",
        "net.budget",
        "net.rmem_max",
        "net.wmem_max",
        "net.busy_poll",
        "mem.thp",
        "host.vm",
        "host.clocksource",
        "net.conntrack",
    ] {
        assert!(v.contains(&(id.to_string(), Verdict::Warn)), "{id}: {v:?}");
    }
    // Every warning names its fix; the seen values are the tree's.
    assert!(r
        .findings
        .iter()
        .filter(|f| f.verdict == Verdict::Warn)
        .all(|f| f.fix.is_some()));
    let smt = r.findings.iter().find(|f| f.id == "cpu.smt").expect("smt");
    assert_eq!(smt.seen, "siblings: cpu2+cpu3");
    assert_eq!(r.counts.warn, 15);
    // A tree with nothing in it: every rule that needs a value says SKIP, none guesses.
    let empty = Tree::new("empty");
    empty.w("proc/1/comm", "init\n");
    let r = check(&empty.0, &[0], &[]);
    for id in [
        "cpu.governor",
        "cpu.boost",
        "cpu.cstates",
        "cpu.smt",
        "net.backlog",
        "mem.thp",
        "host.clocksource",
    ] {
        assert!(
            verdicts(&r).contains(&(id.to_string(), Verdict::Skip)),
            "{id}: {r:#?}"
        );
    }
}

#[test]
fn an_interfaces_rules_follow_what_was_read() {
    use crate::nic::{Item, Rings};
    let t = Tree::new("nic");
    t.w("sys/devices/system/cpu/cpu2/node0/cpulist", "0-3\n");
    // An ixgbe-like tree: device on node 1, two queue IRQs (one on CPU 0), RPS on rx-1.
    let net = "sys/class/net/eth0";
    t.w(&format!("{net}/device/numa_node"), "1\n");
    t.w(&format!("{net}/device/msi_irqs/45"), "msix\n");
    t.w(&format!("{net}/device/msi_irqs/46"), "msix\n");
    t.w(&format!("{net}/queues/rx-0/rps_cpus"), "0\n");
    t.w(&format!("{net}/queues/rx-1/rps_cpus"), "4\n");
    t.w("proc/interrupts", "    CPU0  CPU1  CPU2  CPU3\n 45: 1 0 0 0 PCI-MSI eth0-TxRx-0\n 46: 0 0 1 0 PCI-MSI eth0-TxRx-1\n");
    t.w("proc/irq/45/effective_affinity", "1\n");
    t.w("proc/irq/46/effective_affinity", "4\n");
    let host = flowlane_lab::nic::read_nic(&t.0, "eth0");
    fn missing<T>() -> Item<T> {
        Item {
            via: None,
            value: None,
            missing: Some("n/a".into()),
        }
    }
    let n = NicReport {
        dev: "eth0".into(),
        ethtool_netlink: true,
        driver: missing(),
        rss: missing(),
        hash_fields: missing(),
        channels: missing(),
        rings: Item {
            via: Some("netlink".into()),
            value: Some(Rings {
                rx_max: Some(4096),
                tx_max: Some(4096),
                rx: Some(512),
                tx: Some(512),
                rx_mini: None,
                rx_jumbo: None,
            }),
            missing: None,
        },
        // Flow control on: received pause frames stop the sender.
        pause: Item {
            via: Some("netlink".into()),
            value: Some(crate::nic::Pause {
                autoneg: Some(true),
                rx: Some(true),
                tx: Some(false),
                rx_frames: Some(1234),
                tx_frames: Some(0),
            }),
            missing: None,
        },
        host,
        read_ms: 0.0,
    };
    let r = check(&t.0, &[2], std::slice::from_ref(&n));
    let v = verdicts(&r);
    for id in ["nic.rings", "nic.numa", "nic.irq_affinity", "nic.rps"] {
        assert!(v.contains(&(id.to_string(), Verdict::Warn)), "{id}: {v:?}");
    }
    // Flow control is the one FAIL: the run's exit code says so.
    let fc = r
        .findings
        .iter()
        .find(|f| f.id == "nic.flow_control")
        .expect("flow control");
    assert_eq!(fc.verdict, Verdict::Fail, "{fc:?}");
    assert!(
        fc.seen.contains("rx on") && fc.seen.contains("1234"),
        "{}",
        fc.seen
    );
    assert!(r.failed());
    let mut off = n;
    off.pause.value = Some(crate::nic::Pause {
        autoneg: Some(false),
        rx: Some(false),
        tx: Some(false),
        rx_frames: None,
        tx_frames: None,
    });
    let r = check(&t.0, &[2], &[off]);
    assert!(verdicts(&r).contains(&("nic.flow_control".to_string(), Verdict::Pass)));
    let irq = r
        .findings
        .iter()
        .find(|f| f.id == "nic.irq_affinity")
        .expect("irq");
    assert!(
        irq.seen.contains("irq 45") && !irq.seen.contains("irq 46"),
        "{}",
        irq.seen
    );
    assert_eq!(
        r.findings
            .iter()
            .find(|f| f.id == "nic.rings")
            .expect("rings")
            .seen,
        "rx ring 512 of 4096"
    );
}
