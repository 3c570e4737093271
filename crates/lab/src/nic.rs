//! What sysfs and procfs say about an interface's device and queues: its NUMA node, each
//! receive queue's RPS CPUs and flow table, each transmit queue's XPS CPUs, the RFS socket
//! table, and the device's IRQs with the CPUs they may run on. Every reader takes the root
//! the trees hang from — `/` on a live host, a recorded tree in tests (this machine has no
//! real NIC: the IRQ and NUMA paths are tested on trees recorded from mlx5, ixgbe and
//! virtio hosts) — and says what is missing as missing.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One receive queue's software steering (`queues/rx-N`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RxQueueConf {
    /// The queue.
    pub queue: u32,
    /// RPS: the CPUs this queue's packets are spread over in software (empty: RPS off).
    /// `None`: the kernel has no RPS (built without `CONFIG_RPS`).
    pub rps_cpus: Option<Vec<u32>>,
    /// RFS: this queue's flow table entries (0: RFS off for it).
    pub rps_flow_cnt: Option<u64>,
}

/// One transmit queue's CPU mapping (`queues/tx-N`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TxQueueConf {
    /// The queue.
    pub queue: u32,
    /// XPS: the CPUs that send on this queue (empty: none set).
    pub xps_cpus: Option<Vec<u32>>,
}

/// One of the device's interrupts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Irq {
    /// The IRQ number.
    pub irq: u32,
    /// Its name in /proc/interrupts (e.g. `eth0-TxRx-3`, `mlx5_comp3@pci:0000:03:00.0`).
    pub name: String,
    /// The queue its name says it serves (the number a driver puts after `-`, `.` or
    /// `comp`), for a name that names a queue's interrupt; `None` for others (the admin
    /// interrupt, link events) and names that say no number.
    pub queue_by_name: Option<u32>,
    /// The CPUs it may run on (`/proc/irq/N/smp_affinity`).
    pub affinity: Option<Vec<u32>>,
    /// The CPUs it does run on (`effective_affinity`, where the kernel says).
    pub effective: Option<Vec<u32>>,
    /// Interrupts taken per CPU since boot (/proc/interrupts), CPU 0 first.
    pub per_cpu: Vec<u64>,
}

/// What sysfs and procfs say about one interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NicSysfs {
    /// Whether the interface has a device behind it (`/sys/class/net/IF/device`); a virtual
    /// interface (veth, bridge) has none, and so no NUMA node and no IRQs of its own.
    pub has_device: bool,
    /// The device's NUMA node (`None`: no device, or the platform has one node: `-1`).
    pub numa_node: Option<u32>,
    /// Receive queues.
    pub rx: Vec<RxQueueConf>,
    /// Transmit queues.
    pub tx: Vec<TxQueueConf>,
    /// RFS: the global socket flow table's entries (`net.core.rps_sock_flow_entries`; 0: off).
    pub rps_sock_flow_entries: Option<u64>,
    /// The device's interrupts (MSI/MSI-X, from `device/msi_irqs`).
    pub irqs: Vec<Irq>,
}

/// A CPU mask as sysfs writes it (`00000000,0000000f`, 32-bit groups, most significant
/// first) → the CPUs set. `None`: not a mask.
pub fn parse_cpu_mask(text: &str) -> Option<Vec<u32>> {
    let groups: Vec<&str> = text.trim().split(',').collect();
    let mut cpus = Vec::new();
    for (i, g) in groups.iter().rev().enumerate() {
        let bits = u32::from_str_radix(g, 16).ok()?;
        for b in 0..32u32 {
            if bits & (1 << b) != 0 {
                cpus.push(u32::try_from(i).ok()?.checked_mul(32)?.checked_add(b)?);
            }
        }
    }
    Some(cpus)
}

/// /proc/interrupts: (IRQ, name, count per CPU) for each numbered line. The name is the
/// last word (a driver's names have no spaces; the words before it are the chip and type).
pub fn parse_interrupts(text: &str) -> Vec<(u32, String, Vec<u64>)> {
    let mut lines = text.lines();
    let ncpu = lines.next().map_or(0, |h| {
        h.split_whitespace()
            .filter(|w| w.starts_with("CPU"))
            .count()
    });
    lines
        .filter_map(|l| {
            let (irq, rest) = l.trim_start().split_once(':')?;
            let irq: u32 = irq.trim().parse().ok()?;
            let words: Vec<&str> = rest.split_whitespace().collect();
            let per_cpu: Vec<u64> = words
                .iter()
                .take(ncpu)
                .map_while(|w| w.parse().ok())
                .collect();
            let name = words.get(per_cpu.len()..).and_then(|w| w.last())?;
            Some((irq, (*name).to_string(), per_cpu))
        })
        .collect()
}

/// The queue an interrupt's name says it serves: the number at the end of its first word
/// (`eth0-TxRx-3`, `ens1f0-rx-2`, `virtio0-input.1`, `mlx5_comp3@pci:…`, `i40e-eth2-TxRx-7`)
/// when the name marks a queue interrupt (`TxRx`, `rx`, `comp`, `input`, `fp`, `rxtx`,
/// `queue`), else `None`.
pub fn queue_of_irq_name(name: &str) -> Option<u32> {
    let head = name.split('@').next()?;
    let lower = head.to_ascii_lowercase();
    let marks = ["txrx", "rx", "comp", "input", "fp", "queue"];
    if !marks.iter().any(|m| lower.contains(m)) {
        return None;
    }
    let digits: String = head
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

fn read(root: &Path, rel: &str) -> Option<String> {
    std::fs::read_to_string(root.join(rel.trim_start_matches('/'))).ok()
}

/// Numbered entries `PREFIX-N` of a directory, in order.
fn numbered(dir: &Path, prefix: &str) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_prefix(prefix)?
                    .parse()
                    .ok()
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// Reads what sysfs and procfs under `root` say about `ifname`.
pub fn read_nic(root: &Path, ifname: &str) -> NicSysfs {
    let net = PathBuf::from(format!("sys/class/net/{ifname}"));
    let dev = root.join(&net).join("device");
    let has_device = dev.exists();
    let numa_node = read(root, &format!("{}/device/numa_node", net.display()))
        .and_then(|t| t.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    let queues = root.join(&net).join("queues");
    let rx = numbered(&queues, "rx-")
        .into_iter()
        .map(|q| {
            let f = |name: &str| read(&queues, &format!("rx-{q}/{name}"));
            RxQueueConf {
                queue: q,
                rps_cpus: f("rps_cpus").and_then(|t| parse_cpu_mask(&t)),
                rps_flow_cnt: f("rps_flow_cnt").and_then(|t| t.trim().parse().ok()),
            }
        })
        .collect();
    let tx = numbered(&queues, "tx-")
        .into_iter()
        .map(|q| TxQueueConf {
            queue: q,
            xps_cpus: read(&queues, &format!("tx-{q}/xps_cpus")).and_then(|t| parse_cpu_mask(&t)),
        })
        .collect();
    let proc_irqs = read(root, "proc/interrupts")
        .map(|t| parse_interrupts(&t))
        .unwrap_or_default();
    let mut irq_numbers: Vec<u32> = std::fs::read_dir(dev.join("msi_irqs"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    irq_numbers.sort_unstable();
    let irqs = irq_numbers
        .into_iter()
        .map(|irq| {
            let (name, per_cpu) = proc_irqs
                .iter()
                .find(|p| p.0 == irq)
                .map(|p| (p.1.clone(), p.2.clone()))
                .unwrap_or_default();
            let mask = |f: &str| {
                read(root, &format!("proc/irq/{irq}/{f}")).and_then(|t| parse_cpu_mask(&t))
            };
            Irq {
                irq,
                queue_by_name: queue_of_irq_name(&name),
                name,
                affinity: mask("smp_affinity"),
                effective: mask("effective_affinity"),
                per_cpu,
            }
        })
        .collect();
    NicSysfs {
        has_device,
        numa_node,
        rx,
        tx,
        rps_sock_flow_entries: read(root, "proc/sys/net/core/rps_sock_flow_entries")
            .and_then(|t| t.trim().parse().ok()),
        irqs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_read_as_sysfs_writes_them() {
        assert_eq!(parse_cpu_mask("0000000f\n"), Some(vec![0, 1, 2, 3]));
        assert_eq!(parse_cpu_mask("00000001,00000002"), Some(vec![1, 32]));
        assert_eq!(parse_cpu_mask("0"), Some(vec![]));
        assert_eq!(parse_cpu_mask("xyz"), None);
        assert_eq!(parse_cpu_mask(""), None);
    }

    #[test]
    fn irq_names_of_the_common_drivers_give_their_queue() {
        for (name, q) in [
            ("eth0-TxRx-3", Some(3)),
            ("ens1f0-rx-2", Some(2)),
            ("virtio0-input.1", Some(1)),
            ("virtio0-output.1", None),
            ("mlx5_comp7@pci:0000:03:00.0", Some(7)),
            ("mlx5_async0@pci:0000:03:00.0", None),
            ("i40e-eth2-TxRx-11", Some(11)),
            ("eth0", None),
            ("ice-ens2f0-TxRx-0", Some(0)),
            ("ixgbe-lsc", None),
        ] {
            assert_eq!(queue_of_irq_name(name), q, "{name}");
        }
    }

    #[test]
    fn interrupts_lines_give_counts_and_names() {
        let text = "           CPU0       CPU1\n  \
                    0:         30          0   IO-APIC   2-edge      timer\n \
                    45:     123456        789   PCI-MSIX-0000:03:00.0   1-edge      eth0-TxRx-0\n\
                    NMI:          0          0   Non-maskable interrupts\n";
        let v = parse_interrupts(text);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1], (45, "eth0-TxRx-0".to_string(), vec![123_456, 789]));
    }

    /// A tree recorded from an ixgbe host (two queues shown), written out under a temporary
    /// root: what the reader makes of it.
    #[test]
    fn a_recorded_ixgbe_tree_reads_whole() {
        let root = std::env::temp_dir().join(format!("fl-nic-tree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let w = |rel: &str, text: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("dir");
            std::fs::write(p, text).expect("write");
        };
        let net = "sys/class/net/eth0";
        w(&format!("{net}/device/numa_node"), "1\n");
        w(&format!("{net}/device/msi_irqs/45"), "msix\n");
        w(&format!("{net}/device/msi_irqs/46"), "msix\n");
        w(&format!("{net}/device/msi_irqs/47"), "msix\n");
        w(&format!("{net}/queues/rx-0/rps_cpus"), "00000000\n");
        w(&format!("{net}/queues/rx-0/rps_flow_cnt"), "0\n");
        w(&format!("{net}/queues/rx-1/rps_cpus"), "0000000c\n");
        w(&format!("{net}/queues/rx-1/rps_flow_cnt"), "2048\n");
        w(&format!("{net}/queues/tx-0/xps_cpus"), "00000001\n");
        w(&format!("{net}/queues/tx-1/xps_cpus"), "00000002\n");
        w("proc/sys/net/core/rps_sock_flow_entries", "32768\n");
        w(
            "proc/interrupts",
            "            CPU0       CPU1       CPU2       CPU3\n \
             45:       10          0          0          0  PCI-MSI 1-edge  eth0-TxRx-0\n \
             46:        0         20          0          0  PCI-MSI 2-edge  eth0-TxRx-1\n \
             47:        1          0          0          0  PCI-MSI 3-edge  eth0\n",
        );
        w("proc/irq/45/smp_affinity", "00000001\n");
        w("proc/irq/45/effective_affinity", "00000001\n");
        w("proc/irq/46/smp_affinity", "0000000f\n");
        w("proc/irq/46/effective_affinity", "00000002\n");
        let n = read_nic(&root, "eth0");
        let _ = std::fs::remove_dir_all(&root);
        assert!(n.has_device);
        assert_eq!(n.numa_node, Some(1));
        assert_eq!(n.rx.len(), 2);
        assert_eq!(n.rx[1].rps_cpus, Some(vec![2, 3]));
        assert_eq!(n.rx[1].rps_flow_cnt, Some(2048));
        assert_eq!(n.tx[1].xps_cpus, Some(vec![1]));
        assert_eq!(n.rps_sock_flow_entries, Some(32768));
        assert_eq!(n.irqs.len(), 3);
        assert_eq!(n.irqs[1].queue_by_name, Some(1));
        assert_eq!(n.irqs[1].affinity, Some(vec![0, 1, 2, 3]));
        assert_eq!(n.irqs[1].effective, Some(vec![1]));
        assert_eq!(n.irqs[1].per_cpu, vec![0, 20, 0, 0]);
        // The link-event interrupt names no queue; an IRQ without /proc/irq files has no
        // affinity to show.
        assert_eq!(n.irqs[2].queue_by_name, None);
        assert_eq!(n.irqs[2].affinity, None);
        // An interface that is not there: nothing, said as nothing.
        let none = read_nic(Path::new("/nonexistent-root"), "eth9");
        assert!(!none.has_device && none.rx.is_empty() && none.irqs.is_empty());
    }
}
