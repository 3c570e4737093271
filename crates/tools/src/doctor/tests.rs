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

impl Tree {
    fn wb(&self, rel: &str, bytes: &[u8]) -> &Tree {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
        std::fs::write(p, bytes).expect("write");
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
        // Legacy iptables with two tables loaded.
        t.w("proc/net/ip_tables_names", "filter\nnat\n");
        // A dynamic kernel running voluntary preemption.
        t.w(
            "sys/kernel/debug/sched/preempt",
            "none (voluntary) full lazy\n",
        );
    }
    // /dev/cpu_dma_latency as the kernel answers a read: the target, 4 native-endian bytes.
    // Tuned: a process holds 0 µs; untuned: nobody holds a limit (2 000 s).
    let target: i32 = if tuned { 0 } else { 2_000_000_000 };
    t.wb("dev/cpu_dma_latency", &target.to_ne_bytes());
    t.w(
        "proc/version",
        if tuned {
            "Linux version 6.18.0-rt (gcc) #1 SMP PREEMPT_RT\n"
        } else {
            "Linux version 6.18.0 (gcc) #1 SMP PREEMPT_DYNAMIC\n"
        },
    );
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
        "cpu.dma_latency",
        "kernel.preempt",
        "net.firewall",
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
    assert_eq!(r.counts.warn, 18);
    let seen = |id: &str| {
        r.findings
            .iter()
            .find(|f| f.id == id)
            .map(|f| f.seen.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        seen("cpu.dma_latency"),
        "no limit held; deep states it allows: cpu2 C6 (133 µs), cpu3 C6 (133 µs)"
    );
    assert_eq!(
        seen("kernel.preempt"),
        "voluntary (dynamic, /sys/kernel/debug/sched/preempt)"
    );
    assert_eq!(seen("net.firewall"), "iptables filter, iptables nat");
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
        offloads: crate::nic::not_read(),
        coalesce: crate::nic::not_read(),
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

/// A NIC as recorded: its sysfs/procfs tree under a root, and what ethtool said.
fn recorded_nic(
    t: &Tree,
    dev: &str,
    node: Option<u32>,
    irqs: &[(u32, &str, &str)],
    offloads: crate::nic::Offloads,
    coalesce: Option<crate::nic::Coalesce>,
    xps: &[&str],
) -> NicReport {
    use crate::nic::Item;
    let net = format!("sys/class/net/{dev}");
    match node {
        Some(n) => t.w(&format!("{net}/device/numa_node"), &format!("{n}\n")),
        None => t.w(&format!("{net}/device/numa_node"), "-1\n"),
    };
    let mut interrupts = String::from("    CPU0  CPU1  CPU2  CPU3\n");
    for (irq, name, mask) in irqs {
        t.w(&format!("{net}/device/msi_irqs/{irq}"), "msix\n");
        t.w(
            &format!("proc/irq/{irq}/effective_affinity"),
            &format!("{mask}\n"),
        );
        interrupts.push_str(&format!(" {irq}: 1 0 0 0 PCI-MSIX-0000:03:00.0 {name}\n"));
    }
    t.w("proc/interrupts", &interrupts);
    for (q, mask) in xps.iter().enumerate() {
        t.w(
            &format!("{net}/queues/tx-{q}/xps_cpus"),
            &format!("{mask}\n"),
        );
        t.w(&format!("{net}/queues/rx-{q}/rps_cpus"), "0\n");
    }
    let item = |via: &str| Some(via.to_string());
    NicReport {
        dev: dev.into(),
        ethtool_netlink: true,
        driver: crate::nic::not_read(),
        rss: crate::nic::not_read(),
        hash_fields: crate::nic::not_read(),
        channels: crate::nic::not_read(),
        rings: crate::nic::not_read(),
        pause: crate::nic::not_read(),
        offloads: Item {
            via: item("ioctl"),
            value: Some(offloads),
            missing: None,
        },
        coalesce: match coalesce {
            Some(c) => Item {
                via: item("ioctl"),
                value: Some(c),
                missing: None,
            },
            None => Item {
                via: None,
                value: None,
                missing: Some("the driver does not support it (EOPNOTSUPP)".into()),
            },
        },
        host: flowlane_lab::nic::read_nic(&t.0, dev),
        read_ms: 0.0,
    }
}

/// mlx5, i40e and virtio as their drivers name and set things (from the kernel's
/// documentation of each): queue interrupts found by their names, offloads, adaptive
/// coalescing (mlx5's and i40e's default), XPS (set by mlx5 and virtio, not by i40e), and a
/// virtio device with one NUMA node and no coalescing to report.
#[test]
fn mlx5_i40e_and_virtio_trees_read_rule_by_rule() {
    use crate::nic::{Coalesce, Offloads};
    let on = Offloads {
        gro: Some(true),
        lro: Some(false),
        rx_checksum: Some(true),
        tx_checksum: Some(true),
    };
    let adaptive = Coalesce {
        rx_usecs: 8,
        rx_frames: 128,
        tx_usecs: 8,
        tx_frames: 128,
        adaptive_rx: true,
        adaptive_tx: true,
    };
    let find = |r: &DoctorReport, id: &str| {
        r.findings
            .iter()
            .find(|f| f.id == id)
            .cloned()
            .unwrap_or_else(|| panic!("no {id}"))
    };
    // mlx5: completion vectors `mlx5_comp<N>@pci:…`, one per CPU (2 and 3 here), XPS one CPU
    // per queue, adaptive moderation on, LRO off.
    let t = Tree::new("mlx5");
    t.w("sys/devices/system/cpu/cpu2/node0/cpulist", "0-3\n");
    let n = recorded_nic(
        &t,
        "ens1f0np0",
        Some(0),
        &[
            (80, "mlx5_async0@pci:0000:03:00.0", "1"),
            (81, "mlx5_comp0@pci:0000:03:00.0", "4"),
            (82, "mlx5_comp1@pci:0000:03:00.0", "8"),
        ],
        on,
        Some(adaptive),
        &["4", "8"],
    );
    let r = check(&t.0, &[2, 3], std::slice::from_ref(&n));
    let irq = find(&r, "nic.irq_affinity");
    assert_eq!(irq.verdict, Verdict::Pass, "{irq:?}");
    let b = find(&r, "nic.rss_cpus");
    assert_eq!(b.verdict, Verdict::Pass, "{b:?}");
    assert_eq!(
        b.seen,
        "buckets by CPU (queues counted equal: no table read): cpu2 50 %, cpu3 50 %"
    );
    assert_eq!(irq.seen, "2 queue interrupts, all on the measurement CPUs");
    // Its table weighted 3:1 (ethtool -X weight 3 1): CPU 2 takes three buckets in four.
    let mut weighted = n.clone();
    weighted.rss = crate::nic::Item {
        via: Some("netlink".into()),
        value: Some(vec![crate::nic::RssContext {
            context: 0,
            hash_function: Some("toeplitz".into()),
            input_xfrm: Some("none".into()),
            key: String::new(),
            indir: vec![0, 0, 0, 1, 0, 0, 0, 1],
        }]),
        missing: None,
    };
    let w = check(&t.0, &[2, 3], std::slice::from_ref(&weighted));
    let b = find(&w, "nic.rss_cpus");
    assert_eq!(
        (b.verdict, b.seen.as_str()),
        (
            Verdict::Warn,
            "buckets by CPU (from the indirection table): cpu2 75 %, cpu3 25 %"
        )
    );
    assert_eq!(find(&r, "nic.numa").verdict, Verdict::Pass);
    assert_eq!(find(&r, "nic.xps").verdict, Verdict::Pass);
    assert_eq!(find(&r, "nic.offloads").verdict, Verdict::Pass);
    let c = find(&r, "nic.coalesce");
    assert_eq!(c.verdict, Verdict::Warn, "{c:?}");
    assert!(c.seen.contains("adaptive-rx on"), "{}", c.seen);
    assert!(c
        .fix
        .as_deref()
        .is_some_and(|f| f.contains("ethtool -C ens1f0np0 adaptive-rx off")));

    // i40e: `i40e-<dev>-TxRx-<N>`, one interrupt on CPU 0 (off the measurement CPUs), no XPS,
    // LRO on, receive checksums off.
    let t = Tree::new("i40e");
    t.w("sys/devices/system/cpu/cpu2/node0/cpulist", "0-3\n");
    let n = recorded_nic(
        &t,
        "enp1s0f0",
        Some(0),
        &[
            (90, "i40e-0000:01:00.0:misc", "1"),
            (91, "i40e-enp1s0f0-TxRx-0", "1"),
            (92, "i40e-enp1s0f0-TxRx-1", "8"),
        ],
        Offloads {
            lro: Some(true),
            rx_checksum: Some(false),
            ..on
        },
        Some(Coalesce {
            adaptive_rx: false,
            adaptive_tx: false,
            ..adaptive
        }),
        &["0", "0"],
    );
    let r = check(&t.0, &[2, 3], std::slice::from_ref(&n));
    let irq = find(&r, "nic.irq_affinity");
    assert_eq!(irq.verdict, Verdict::Warn);
    assert_eq!(
        irq.seen,
        "outside the measurement CPUs: irq 91 (i40e-enp1s0f0-TxRx-0)"
    );
    // Queue 0's interrupt on CPU 0, queue 1's on CPU 3: CPU 2 takes no bucket.
    let b = find(&r, "nic.rss_cpus");
    assert_eq!(b.verdict, Verdict::Warn);
    assert!(
        b.seen
            .ends_with("cpu2 0 %, cpu3 50 %, other CPUs or unpinned 50 %"),
        "{}",
        b.seen
    );
    let o = find(&r, "nic.offloads");
    assert_eq!(o.verdict, Verdict::Warn);
    assert_eq!(o.seen, "gro on, lro on, rx-checksum off, tx-checksum on");
    assert_eq!(find(&r, "nic.coalesce").verdict, Verdict::Pass);
    let x = find(&r, "nic.xps");
    assert_eq!(
        (x.verdict, x.seen.as_str()),
        (Verdict::Warn, "XPS unset on 2 of 2 tx queues")
    );

    // virtio-net: `virtio0-input.<N>` / `virtio0-output.<N>`, one NUMA node (-1), no
    // coalescing reported, XPS set by the driver.
    let t = Tree::new("virtio");
    let n = recorded_nic(
        &t,
        "eth0",
        None,
        &[
            (24, "virtio0-config", "1"),
            (25, "virtio0-input.0", "4"),
            (26, "virtio0-output.0", "4"),
            (27, "virtio0-input.1", "8"),
            (28, "virtio0-output.1", "8"),
        ],
        on,
        None,
        &["4", "8"],
    );
    let r = check(&t.0, &[2, 3], std::slice::from_ref(&n));
    assert_eq!(find(&r, "nic.irq_affinity").verdict, Verdict::Pass);
    assert_eq!(find(&r, "nic.numa").verdict, Verdict::Skip);
    let c = find(&r, "nic.coalesce");
    assert_eq!(c.verdict, Verdict::Skip);
    assert!(c.seen.contains("EOPNOTSUPP"), "{}", c.seen);
    assert_eq!(find(&r, "nic.xps").verdict, Verdict::Pass);
}
