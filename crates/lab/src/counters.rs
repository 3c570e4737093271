//! Kernel counters: `/proc/net/snmp` (per-protocol MIBs), `/proc/net/dev` (per-interface),
//! `/proc/net/softnet_stat` and `/proc/stat` (per CPU).

use std::collections::BTreeMap;

use crate::LabError;

/// Reads `/proc/thread-self/net/NAME`: the calling thread's namespace.
pub fn read_proc(name: &str) -> Result<String, LabError> {
    let path = format!("/proc/thread-self/net/{name}");
    std::fs::read_to_string(&path).map_err(|e| LabError {
        what: format!("read {path}"),
        detail: e.to_string(),
    })
}

fn bad(file: &str, line: usize, why: &str) -> LabError {
    LabError {
        what: format!("parse {file}"),
        detail: format!("line {line}: {why}"),
    }
}

/// `/proc/net/snmp`: pairs of lines, `Proto: Name Name …` then `Proto: value value …`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snmp {
    values: BTreeMap<(String, String), i64>,
}

impl Snmp {
    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<Snmp, LabError> {
        let mut values = BTreeMap::new();
        let lines: Vec<&str> = text.lines().collect();
        for (i, pair) in lines.chunks(2).enumerate() {
            let [names, vals] = pair else {
                return Err(bad("snmp", i * 2 + 1, "header without values"));
            };
            let (p1, names) = names
                .split_once(':')
                .ok_or_else(|| bad("snmp", i * 2 + 1, "no `Proto:`"))?;
            let (p2, vals) = vals
                .split_once(':')
                .ok_or_else(|| bad("snmp", i * 2 + 2, "no `Proto:`"))?;
            if p1 != p2 {
                return Err(bad("snmp", i * 2 + 2, "protocol differs from its header"));
            }
            let names: Vec<&str> = names.split_whitespace().collect();
            let vals: Vec<&str> = vals.split_whitespace().collect();
            if names.len() != vals.len() {
                return Err(bad("snmp", i * 2 + 2, "value count differs from header"));
            }
            for (n, v) in names.iter().zip(vals) {
                let v: i64 = v
                    .parse()
                    .map_err(|_| bad("snmp", i * 2 + 2, &format!("`{v}` is not a number")))?;
                values.insert((p1.to_string(), n.to_string()), v);
            }
        }
        Ok(Snmp { values })
    }

    /// A counter, e.g. `get("Udp", "InDatagrams")`.
    pub fn get(&self, proto: &str, name: &str) -> Option<i64> {
        self.values
            .get(&(proto.to_string(), name.to_string()))
            .copied()
    }

    /// `self − earlier` for one counter (0 when missing).
    pub fn delta(&self, earlier: &Snmp, proto: &str, name: &str) -> i64 {
        self.get(proto, name).unwrap_or(0) - earlier.get(proto, name).unwrap_or(0)
    }
}

/// `/proc/net/snmp6`: one `Name value` pair per line (`Ip6OutRequests 16`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snmp6 {
    values: BTreeMap<String, i64>,
}

impl Snmp6 {
    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<Snmp6, LabError> {
        let mut values = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let mut w = line.split_whitespace();
            let (Some(name), Some(v), None) = (w.next(), w.next(), w.next()) else {
                if line.trim().is_empty() {
                    continue;
                }
                return Err(bad("snmp6", i + 1, "expected `Name value`"));
            };
            let v: i64 = v
                .parse()
                .map_err(|_| bad("snmp6", i + 1, &format!("`{v}` is not a number")))?;
            values.insert(name.to_string(), v);
        }
        Ok(Snmp6 { values })
    }

    /// A counter, e.g. `get("Ip6OutRequests")`.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.values.get(name).copied()
    }
}

/// One interface's line of `/proc/net/dev`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IfCounters {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Packets dropped on receive.
    pub rx_dropped: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// Packets dropped on transmit.
    pub tx_dropped: u64,
}

/// `/proc/net/dev`: every interface of a namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DevCounters {
    /// By interface name.
    pub ifaces: BTreeMap<String, IfCounters>,
}

impl DevCounters {
    /// Parses the file's text (two header lines, then `name: 16 numbers`).
    pub fn parse(text: &str) -> Result<DevCounters, LabError> {
        let mut ifaces = BTreeMap::new();
        for (i, line) in text.lines().enumerate().skip(2) {
            let (name, rest) = line
                .split_once(':')
                .ok_or_else(|| bad("dev", i + 1, "no `name:`"))?;
            let v: Vec<u64> = rest
                .split_whitespace()
                .map(|x| x.parse::<u64>())
                .collect::<Result<_, _>>()
                .map_err(|_| bad("dev", i + 1, "not a number"))?;
            if v.len() < 16 {
                return Err(bad("dev", i + 1, "fewer than 16 fields"));
            }
            ifaces.insert(
                name.trim().to_string(),
                IfCounters {
                    rx_bytes: v[0],
                    rx_packets: v[1],
                    rx_errors: v[2],
                    rx_dropped: v[3],
                    tx_bytes: v[8],
                    tx_packets: v[9],
                    tx_errors: v[10],
                    tx_dropped: v[11],
                },
            );
        }
        Ok(DevCounters { ifaces })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snmp_pairs_parse() {
        let t = "Ip: Forwarding DefaultTTL\nIp: 2 64\nUdp: InDatagrams NoPorts InErrors RcvbufErrors\nUdp: 10 1 3 3\n";
        let s = Snmp::parse(t).expect("parses");
        assert_eq!(s.get("Udp", "InDatagrams"), Some(10));
        assert_eq!(s.get("Udp", "RcvbufErrors"), Some(3));
        assert_eq!(s.get("Ip", "DefaultTTL"), Some(64));
        assert_eq!(s.get("Tcp", "x"), None);
        assert!(Snmp::parse("Udp: A B\nUdp: 1\n").is_err());
        assert!(Snmp::parse("Udp: A\nTcp: 1\n").is_err());
        assert!(Snmp::parse("Udp: A\n").is_err());
    }

    #[test]
    fn this_threads_counters_parse() {
        let s = Snmp::parse(&read_proc("snmp").expect("readable")).expect("parses");
        assert!(s.get("Udp", "InDatagrams").is_some());
        let d = DevCounters::parse(&read_proc("dev").expect("readable")).expect("parses");
        assert!(d.ifaces.contains_key("lo"));
    }

    #[test]
    fn dev_lines_parse() {
        let t = "Inter-|   Receive\n face |bytes\n  lo: 100 2 0 0 0 0 0 0 100 2 0 0 0 0 0 0\nveth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n";
        let d = DevCounters::parse(t).expect("parses");
        assert_eq!(d.ifaces["lo"].rx_packets, 2);
        let v = d.ifaces["veth0"];
        assert_eq!((v.rx_dropped, v.tx_packets, v.tx_dropped), (4, 10, 12));
        assert!(DevCounters::parse("a\nb\nlo: 1 2\n").is_err());
    }
}

/// One receive queue of an interface as its driver counts it (`ethtool -S`: veth names
/// `rx_queue_N_xdp_packets`, `rx_queue_N_xdp_redirect`, `rx_queue_N_drops`,
/// `rx_queue_N_xdp_drops`; veth counts only frames that went through its NAPI/XDP path).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct RxQueue {
    /// The queue.
    pub queue: u32,
    /// Frames its XDP program saw.
    pub xdp_packets: u64,
    /// Frames the program redirected (e.g. to a CPU's queue: software RSS).
    pub xdp_redirect: u64,
    /// Frames dropped on the queue (ring full).
    pub drops: u64,
    /// Frames the program dropped.
    pub xdp_drops: u64,
}

/// The row of queue `queue` in `rows`, made by `make` if there is none yet.
pub fn row_of<T>(
    rows: &mut Vec<T>,
    queue: u32,
    key: impl Fn(&T) -> u32,
    make: impl FnOnce(u32) -> T,
) -> &mut T {
    let i = match rows.iter().position(|r| key(r) == queue) {
        Some(i) => i,
        None => {
            rows.push(make(queue));
            rows.len() - 1
        }
    };
    &mut rows[i]
}

/// The per-queue receive counters among a driver's statistics (`rx_queue_N_…`), by queue;
/// names of other forms are ignored.
pub fn rx_queues(stats: &[(String, u64)]) -> Vec<RxQueue> {
    let mut out: Vec<RxQueue> = Vec::new();
    for (name, v) in stats {
        let Some(rest) = name.strip_prefix("rx_queue_") else {
            continue;
        };
        let Some((q, field)) = rest.split_once('_') else {
            continue;
        };
        let Ok(q) = q.parse::<u32>() else { continue };
        let r = row_of(
            &mut out,
            q,
            |r| r.queue,
            |queue| RxQueue {
                queue,
                ..RxQueue::default()
            },
        );
        match field {
            "xdp_packets" | "packets" => r.xdp_packets = *v,
            "xdp_redirect" => r.xdp_redirect = *v,
            "drops" => r.drops = *v,
            "xdp_drops" => r.xdp_drops = *v,
            _ => {}
        }
    }
    out.sort_by_key(|r| r.queue);
    out
}

#[cfg(test)]
mod rx_queue_tests {
    use super::*;

    #[test]
    fn veth_statistics_become_one_row_per_queue() {
        let s: Vec<(String, u64)> = [
            ("peer_ifindex", 9),
            ("rx_queue_1_xdp_packets", 5),
            ("rx_queue_0_xdp_packets", 7),
            ("rx_queue_0_xdp_redirect", 6),
            ("rx_queue_0_drops", 1),
            ("rx_queue_0_xdp_drops", 0),
            ("rx_queue_1_xdp_tx", 3),
            ("rx_queue_x_drops", 4),
            ("tx_queue_0_xdp_xmit", 2),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
        let q = rx_queues(&s);
        assert_eq!(
            q,
            vec![
                RxQueue {
                    queue: 0,
                    xdp_packets: 7,
                    xdp_redirect: 6,
                    drops: 1,
                    xdp_drops: 0
                },
                RxQueue {
                    queue: 1,
                    xdp_packets: 5,
                    ..RxQueue::default()
                }
            ]
        );
        assert!(rx_queues(&[]).is_empty());
    }
}

/// One CPU's line of `/proc/net/softnet_stat`: what the kernel's receive path did on it.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct Softnet {
    /// The CPU.
    pub cpu: usize,
    /// Packets its backlog processed (`netif_receive_skb` and the RPS/backlog path).
    pub processed: u64,
    /// Packets dropped because its backlog queue was full (`netdev_max_backlog`).
    pub dropped: u64,
    /// Times its receive softirq ran out of budget or time with work left (`time_squeeze`).
    pub time_squeeze: u64,
}

/// Reads `/proc/net/softnet_stat` text: one line per online CPU, hexadecimal columns
/// (processed, dropped, time_squeeze, …; from Linux 5.10 the 13th column is the CPU's number,
/// else the line's position is).
pub fn parse_softnet(text: &str) -> Result<Vec<Softnet>, LabError> {
    let bad = |l: &str| LabError {
        what: "/proc/net/softnet_stat".into(),
        detail: format!("a line that is not hexadecimal columns: {l:?}"),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            let cols: Vec<u64> = l
                .split_whitespace()
                .map(|c| u64::from_str_radix(c, 16))
                .collect::<Result<_, _>>()
                .map_err(|_| bad(l))?;
            if cols.len() < 3 {
                return Err(bad(l));
            }
            Ok(Softnet {
                cpu: cols.get(12).map_or(i, |&c| c as usize),
                processed: cols[0],
                dropped: cols[1],
                time_squeeze: cols[2],
            })
        })
        .collect()
}

/// One CPU's time from `/proc/stat`, in jiffies (USER_HZ).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// The CPU (`cpuN`).
    pub cpu: usize,
    /// Not idle and not waiting for I/O: user, nice, system, irq, softirq, steal.
    pub busy: u64,
    /// All of the first eight columns.
    pub total: u64,
}

/// Reads `/proc/stat` text: the per-CPU `cpuN` lines (the summed `cpu` line is left out).
/// Lines too short to read are left out too.
pub fn parse_cpu_times(text: &str) -> Vec<CpuTime> {
    text.lines()
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let cpu = cols.next()?.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = cols.take(8).map_while(|x| x.parse().ok()).collect();
            if v.len() < 5 {
                return None;
            }
            let total: u64 = v.iter().sum();
            // idle + iowait are not busy.
            let idle = v[3] + v[4];
            Some(CpuTime {
                cpu,
                busy: total - idle.min(total),
                total,
            })
        })
        .collect()
}

/// This host's per-CPU times now (`/proc/stat` is not per namespace).
pub fn cpu_times() -> Result<Vec<CpuTime>, LabError> {
    std::fs::read_to_string("/proc/stat")
        .map(|t| parse_cpu_times(&t))
        .map_err(|e| LabError {
            what: "read /proc/stat".into(),
            detail: e.to_string(),
        })
}

/// The busy time of `cpus` together (each counted once), jiffies, from `/proc/stat`; `None`
/// if it cannot be read or does not list one of them.
pub fn busy_jiffies(cpus: &[usize]) -> Option<u64> {
    let times = cpu_times().ok()?;
    busy_of(&times, cpus)
}

fn busy_of(times: &[CpuTime], cpus: &[usize]) -> Option<u64> {
    let mut want = cpus.to_vec();
    want.sort_unstable();
    want.dedup();
    want.iter()
        .map(|c| times.iter().find(|t| t.cpu == *c).map(|t| t.busy))
        .sum()
}

#[cfg(test)]
mod cpu_time_tests {
    use super::*;

    #[test]
    fn busy_of_counts_each_cpu_once_and_needs_every_one() {
        let t = [
            CpuTime {
                cpu: 0,
                busy: 5,
                total: 9,
            },
            CpuTime {
                cpu: 1,
                busy: 7,
                total: 9,
            },
        ];
        assert_eq!(busy_of(&t, &[0, 1, 0]), Some(12));
        assert_eq!(busy_of(&t, &[1]), Some(7));
        assert_eq!(busy_of(&t, &[1, 2]), None);
    }

    #[test]
    fn per_cpu_lines_are_read_and_the_sum_line_is_not() {
        let text = "cpu  10 0 10 100 5 0 0 0 0 0\n\
                    cpu0 4 1 3 50 2 1 1 1 0 0\n\
                    cpu1 6 0 7 50 3 0 0 0 0 0\n\
                    intr 12345\n\
                    cpu2 1 2\n";
        assert_eq!(
            parse_cpu_times(text),
            vec![
                CpuTime {
                    cpu: 0,
                    busy: 4 + 1 + 3 + 1 + 1 + 1,
                    total: 63
                },
                CpuTime {
                    cpu: 1,
                    busy: 13,
                    total: 66
                },
            ]
        );
    }
}

#[cfg(test)]
mod softnet_tests {
    use super::*;

    #[test]
    fn softnet_lines_with_and_without_the_cpu_column() {
        let t = "17cf830e 00000000 00000058 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n\
                 10447121 00000002 0000001f 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000\n";
        let v = parse_softnet(t).expect("valid");
        assert_eq!(
            v[0],
            Softnet {
                cpu: 0,
                processed: 0x17cf830e,
                dropped: 0,
                time_squeeze: 0x58
            }
        );
        assert_eq!((v[1].cpu, v[1].dropped, v[1].time_squeeze), (3, 2, 0x1f));
        let old = parse_softnet("0000000a 00000000 00000001\n0000000b 00000001 00000000\n")
            .expect("valid");
        assert_eq!((old[1].cpu, old[1].processed), (1, 11));
        assert!(parse_softnet("zz 1 2\n").is_err());
        assert!(parse_softnet("1 2\n").is_err());
    }
}

/// One queue's counts as a driver names them, whatever the driver: `rx_queue_N_packets`
/// (ixgbe, igb, virtio_net; veth's `rx_queue_N_xdp_packets`), `rx-N.packets` (i40e, ice),
/// `rxN_packets` (mlx5), `queue_N_rx_cnt` (ena); drops as `…drops`, `…dropped`, `…drop`.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct QueueCounts {
    /// The queue.
    pub queue: u32,
    /// Packets received on it.
    pub rx_packets: u64,
    /// Packets it dropped (ring full, no buffer).
    pub rx_drops: u64,
    /// Packets sent on its transmit side.
    pub tx_packets: u64,
}

/// (receive?, queue, field) of a per-queue statistic's name, for the forms drivers use.
pub fn queue_stat(name: &str) -> Option<(bool, u32, &str)> {
    let num = |s: &str| s.parse::<u32>().ok();
    for (rx, prefix) in [(true, "rx_queue_"), (false, "tx_queue_")] {
        if let Some((q, f)) = name.strip_prefix(prefix).and_then(|r| r.split_once('_')) {
            return Some((rx, num(q)?, f));
        }
    }
    for (rx, prefix) in [(true, "rx-"), (false, "tx-")] {
        if let Some((q, f)) = name.strip_prefix(prefix).and_then(|r| r.split_once('.')) {
            return Some((rx, num(q)?, f));
        }
    }
    if let Some((q, f)) = name.strip_prefix("queue_").and_then(|r| r.split_once('_')) {
        let (dir, f) = f.split_once('_')?;
        return Some((dir == "rx", num(q)?, f)).filter(|_| dir == "rx" || dir == "tx");
    }
    for (rx, prefix) in [(true, "rx"), (false, "tx")] {
        if let Some((q, f)) = name.strip_prefix(prefix).and_then(|r| r.split_once('_')) {
            return Some((rx, num(q)?, f));
        }
    }
    None
}

/// Every queue's counts among a driver's statistics, by queue.
pub fn queue_counts(stats: &[(String, u64)]) -> Vec<QueueCounts> {
    let mut out: Vec<QueueCounts> = Vec::new();
    for (name, v) in stats {
        let Some((rx, q, field)) = queue_stat(name) else {
            continue;
        };
        let packets = matches!(field, "packets" | "xdp_packets" | "cnt");
        let drops = matches!(field, "drops" | "dropped" | "drop");
        if !(packets || (rx && drops)) {
            continue;
        }
        let r = row_of(
            &mut out,
            q,
            |r| r.queue,
            |queue| QueueCounts {
                queue,
                ..QueueCounts::default()
            },
        );
        match (rx, packets) {
            (true, true) => r.rx_packets += *v,
            (true, false) => r.rx_drops += *v,
            (false, _) => r.tx_packets += *v,
        }
    }
    out.sort_by_key(|r| r.queue);
    out
}

#[cfg(test)]
mod queue_count_tests {
    use super::*;

    fn stats(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn every_drivers_names_give_the_same_rows() {
        let want = vec![
            QueueCounts {
                queue: 0,
                rx_packets: 10,
                rx_drops: 1,
                tx_packets: 5,
            },
            QueueCounts {
                queue: 1,
                rx_packets: 20,
                rx_drops: 0,
                tx_packets: 0,
            },
        ];
        for names in [
            // ixgbe / virtio_net
            [
                ("rx_queue_0_packets", 10),
                ("rx_queue_0_drops", 1),
                ("tx_queue_0_packets", 5),
                ("rx_queue_1_packets", 20),
                ("rx_queue_1_bytes", 999),
            ],
            // i40e / ice
            [
                ("rx-0.packets", 10),
                ("rx-0.dropped", 1),
                ("tx-0.packets", 5),
                ("rx-1.packets", 20),
                ("rx-1.bytes", 999),
            ],
            // mlx5
            [
                ("rx0_packets", 10),
                ("rx0_drop", 1),
                ("tx0_packets", 5),
                ("rx1_packets", 20),
                ("rx_packets", 999),
            ],
            // ena
            [
                ("queue_0_rx_cnt", 10),
                ("queue_0_rx_drops", 1),
                ("queue_0_tx_cnt", 5),
                ("queue_1_rx_cnt", 20),
                ("queue_1_rx_bytes", 999),
            ],
        ] {
            assert_eq!(queue_counts(&stats(&names)), want, "{names:?}");
        }
        // veth: the XDP path's count is its per-queue packet count.
        let v = queue_counts(&stats(&[
            ("rx_queue_2_xdp_packets", 7),
            ("peer_ifindex", 3),
        ]));
        assert_eq!((v.len(), v[0].queue, v[0].rx_packets), (1, 2, 7));
        assert!(queue_counts(&stats(&[("rx_queue_x_packets", 1), ("rxq", 2)])).is_empty());
    }
}
