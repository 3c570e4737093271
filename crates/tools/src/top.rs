//! `flowlane top`: a live per-queue and per-CPU view of interfaces, one line a second — the
//! seed's `netstat -Q` for Linux. Per queue: packets and drops from the driver's own per-queue
//! statistics (whatever it names them: `lab::counters::queue_counts`), the share of the traffic
//! it got, and the share its indirection-table entries predict. Per CPU: the receive path's
//! softnet counts (processed, dropped, time squeeze) and the interrupts of the interfaces' IRQs.
//! Everything is read from the kernel each tick; nothing is sent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowlane_lab::counters::{parse_softnet, queue_counts, read_proc, QueueCounts, Softnet};
use flowlane_lab::nic::parse_interrupts;
use serde::{Deserialize, Serialize};

use crate::ToolError;

/// What `top` watches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopConfig {
    /// The interfaces.
    pub devs: Vec<String>,
    /// Seconds between lines.
    pub interval_s: f64,
    /// Stop after this long (`None`: until stopped).
    pub duration_s: Option<f64>,
}

/// One queue over one interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct QueueRow {
    /// The interface.
    pub dev: String,
    /// The receive queue.
    pub queue: u32,
    /// Packets received in the interval (the whole watch, in the report).
    pub rx_packets: u64,
    /// Packets dropped in it.
    pub drops: u64,
    /// Packets received per second.
    pub rx_pps: f64,
    /// Packets dropped per second.
    pub drops_per_s: f64,
    /// Its share of the interface's received packets in the interval (`None`: none came).
    pub share: Option<f64>,
    /// The share its indirection-table entries predict (`None`: the interface reported no
    /// table).
    pub reta_share: Option<f64>,
}

/// One CPU over one interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CpuRow {
    /// The CPU.
    pub cpu: usize,
    /// Packets its receive path processed per second (softnet).
    pub processed_per_s: f64,
    /// Packets dropped at its full backlog per second.
    pub dropped_per_s: f64,
    /// Times per second its softirq ran out of budget with work left.
    pub squeezed_per_s: f64,
    /// Interrupts of the watched interfaces' IRQs it took per second.
    pub irqs_per_s: f64,
}

/// One line: the interval's rates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TopTick {
    /// Seconds since the start, at the end of the interval.
    pub t_s: f64,
    /// Per queue.
    pub queues: Vec<QueueRow>,
    /// Per CPU.
    pub cpus: Vec<CpuRow>,
    /// What reading every counter once took, microseconds (top's own cost).
    pub read_us: f64,
}

/// What one watched interface offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TopDev {
    /// The interface.
    pub dev: String,
    /// Queues whose counts it gives (none: it has no per-queue statistics).
    pub queues: usize,
    /// Where the per-queue counts come from: `netdev qstats` (the kernel's own per-queue
    /// statistics, where the driver offers them), `driver statistics` (its `ethtool -S`
    /// names), or `none`.
    pub source: String,
    /// Its IRQs (MSI/MSI-X; none for a virtual interface).
    pub irqs: Vec<u32>,
    /// Its indirection table, when it reported one.
    pub reta: Option<Vec<u32>>,
}

/// The whole watch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TopReport {
    /// The interfaces.
    pub devs: Vec<TopDev>,
    /// Lines made.
    pub ticks: u64,
    /// Seconds watched.
    pub duration_s: f64,
    /// Per queue over the whole watch (packets and drops counted, as rates).
    pub queues: Vec<QueueRow>,
    /// Per CPU over the whole watch.
    pub cpus: Vec<CpuRow>,
    /// top's own cost: mean and largest time to read every counter once, microseconds, and
    /// the CPU time its thread used over the watch, as a share of one CPU.
    pub read_us_mean: f64,
    pub read_us_max: f64,
    pub cpu_share: f64,
}

#[derive(Clone)]
struct Snap {
    at: Instant,
    queues: Vec<(String, Vec<QueueCounts>)>,
    softnet: Vec<Softnet>,
    /// Per CPU: interrupts of the watched IRQs since boot.
    irqs: Vec<u64>,
}

/// The kernel's per-queue statistics as queue counts (receive packets and hardware drops,
/// transmit packets).
fn qstats_counts(ifindex: u32) -> Option<Vec<QueueCounts>> {
    let stats = flowlane_io::netdev::queue_stats(ifindex).ok()??;
    let mut out: Vec<QueueCounts> = Vec::new();
    for q in stats {
        let row = flowlane_lab::counters::row_of(
            &mut out,
            q.queue,
            |c| c.queue,
            |queue| QueueCounts {
                queue,
                ..QueueCounts::default()
            },
        );
        if q.rx {
            row.rx_packets = q.packets.unwrap_or(0);
            row.rx_drops = q.hw_drops.unwrap_or(0);
        } else {
            row.tx_packets = q.packets.unwrap_or(0);
        }
    }
    out.sort_by_key(|c| c.queue);
    Some(out)
}

/// One interface's per-queue counts from its source.
fn dev_counts(d: &TopDev, ifindex: u32) -> Vec<QueueCounts> {
    match d.source.as_str() {
        QSTATS => qstats_counts(ifindex).unwrap_or_default(),
        _ => queue_counts(&flowlane_io::netdev::driver_stats(&d.dev).unwrap_or_default()),
    }
}

const QSTATS: &str = "netdev qstats";

fn snap(devs: &[TopDev], ifindexes: &[u32]) -> Snap {
    let queues = devs
        .iter()
        .zip(ifindexes)
        .map(|(d, &i)| (d.dev.clone(), dev_counts(d, i)))
        .collect();
    let softnet = read_proc("softnet_stat")
        .ok()
        .and_then(|t| parse_softnet(&t).ok())
        .unwrap_or_default();
    let watched: Vec<u32> = devs.iter().flat_map(|d| d.irqs.iter().copied()).collect();
    let mut irqs = Vec::new();
    if !watched.is_empty() {
        let text = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
        for (irq, _, per_cpu) in parse_interrupts(&text) {
            if watched.contains(&irq) {
                irqs.resize(irqs.len().max(per_cpu.len()), 0);
                for (sum, n) in irqs.iter_mut().zip(&per_cpu) {
                    *sum += n;
                }
            }
        }
    }
    Snap {
        at: Instant::now(),
        queues,
        softnet,
        irqs,
    }
}

/// The rates between two snapshots.
fn rates(devs: &[TopDev], a: &Snap, b: &Snap) -> (Vec<QueueRow>, Vec<CpuRow>) {
    let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
    let mut rows = Vec::new();
    for (d, ((_, qa), (_, qb))) in devs.iter().zip(a.queues.iter().zip(&b.queues)) {
        let delta: Vec<(u32, u64, u64)> = qb
            .iter()
            .map(|y| {
                let x = qa
                    .iter()
                    .find(|x| x.queue == y.queue)
                    .copied()
                    .unwrap_or_default();
                (
                    y.queue,
                    y.rx_packets.saturating_sub(x.rx_packets),
                    y.rx_drops.saturating_sub(x.rx_drops),
                )
            })
            .collect();
        let total: u64 = delta.iter().map(|r| r.1).sum();
        for (q, n, drops) in delta {
            rows.push(QueueRow {
                dev: d.dev.clone(),
                queue: q,
                rx_packets: n,
                drops,
                rx_pps: n as f64 / secs,
                drops_per_s: drops as f64 / secs,
                share: (total > 0).then(|| n as f64 / total as f64),
                reta_share: d
                    .reta
                    .as_ref()
                    .filter(|r| !r.is_empty())
                    .map(|r| r.iter().filter(|&&e| e == q).count() as f64 / r.len() as f64),
            });
        }
    }
    let cpus = b
        .softnet
        .iter()
        .map(|y| {
            let x = a
                .softnet
                .iter()
                .find(|x| x.cpu == y.cpu)
                .copied()
                .unwrap_or_default();
            let irq = |s: &Snap| s.irqs.get(y.cpu).copied().unwrap_or(0);
            CpuRow {
                cpu: y.cpu,
                processed_per_s: y.processed.saturating_sub(x.processed) as f64 / secs,
                dropped_per_s: y.dropped.saturating_sub(x.dropped) as f64 / secs,
                squeezed_per_s: y.time_squeeze.saturating_sub(x.time_squeeze) as f64 / secs,
                irqs_per_s: irq(b).saturating_sub(irq(a)) as f64 / secs,
            }
        })
        .collect();
    (rows, cpus)
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    Duration::from_nanos(flowlane_io::os::thread_cpu_ns().unwrap_or(0))
}

/// Watches until the duration ends or `stop` is raised, calling `on_tick` each interval.
pub fn run(
    cfg: &TopConfig,
    stop: &Arc<AtomicBool>,
    on_tick: &mut dyn FnMut(&TopTick),
) -> Result<TopReport, ToolError> {
    if cfg.devs.is_empty() {
        return Err(ToolError::usage("top needs an interface: --dev IF"));
    }
    let interval = crate::seconds("interval", cfg.interval_s)?;
    let duration = cfg
        .duration_s
        .map(|d| crate::seconds("duration", d))
        .transpose()?;
    let mut devs = Vec::new();
    let mut ifindexes = Vec::new();
    for dev in &cfg.devs {
        let nic = crate::nic::read(dev)?;
        let ifindex = flowlane_io::netdev::ifindex(dev)
            .map_err(|e| ToolError::usage(format!("{dev}: {e}")))?;
        // The kernel's own per-queue statistics where the driver offers them, else the
        // driver's names.
        let (source, queues) = match qstats_counts(ifindex).filter(|q| !q.is_empty()) {
            Some(q) => (QSTATS, q.len()),
            None => {
                let stats = flowlane_io::netdev::driver_stats(dev).unwrap_or_default();
                match queue_counts(&stats).len() {
                    0 => ("none", 0),
                    n => ("driver statistics", n),
                }
            }
        };
        ifindexes.push(ifindex);
        devs.push(TopDev {
            dev: dev.clone(),
            queues,
            source: source.into(),
            irqs: nic.host.irqs.iter().map(|i| i.irq).collect(),
            reta: nic
                .rss
                .value
                .as_ref()
                .and_then(|cs| cs.iter().find(|c| c.context == 0))
                .map(|c| c.indir.clone()),
        });
    }
    let cpu0 = thread_cpu();
    let first = snap(&devs, &ifindexes);
    let (start, mut last) = (first.at, first.clone());
    let (mut ticks, mut read_sum, mut read_max) = (0u64, 0.0f64, 0.0f64);
    while !stop.load(Ordering::Relaxed) {
        let next = last.at + interval;
        let end = duration.map(|d| start + d);
        let wake = end.map_or(next, |e| e.min(next));
        while Instant::now() < wake && !stop.load(Ordering::Relaxed) {
            std::thread::sleep((wake - Instant::now()).min(Duration::from_millis(50)));
        }
        let t0 = Instant::now();
        let now = snap(&devs, &ifindexes);
        let read_us = t0.elapsed().as_secs_f64() * 1e6;
        read_sum += read_us;
        read_max = read_max.max(read_us);
        ticks += 1;
        let (queues, cpus) = rates(&devs, &last, &now);
        on_tick(&TopTick {
            t_s: now.at.duration_since(start).as_secs_f64(),
            queues,
            cpus,
            read_us,
        });
        last = now;
        if end.is_some_and(|e| Instant::now() >= e) {
            break;
        }
    }
    let (queues, cpus) = rates(&devs, &first, &last);
    let watched = last.at.duration_since(start).as_secs_f64();
    Ok(TopReport {
        devs,
        ticks,
        duration_s: watched,
        queues,
        cpus,
        read_us_mean: if ticks > 0 {
            read_sum / ticks as f64
        } else {
            0.0
        },
        read_us_max: read_max,
        cpu_share: (thread_cpu().saturating_sub(cpu0)).as_secs_f64() / watched.max(1e-9),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(queue: u32, rx_packets: u64, rx_drops: u64) -> QueueCounts {
        QueueCounts {
            queue,
            rx_packets,
            rx_drops,
            tx_packets: 0,
        }
    }

    fn s(cpu: usize, processed: u64, dropped: u64, time_squeeze: u64) -> Softnet {
        Softnet {
            cpu,
            processed,
            dropped,
            time_squeeze,
        }
    }

    #[test]
    fn rates_are_deltas_over_the_interval_with_shares_against_the_table() {
        let dev = TopDev {
            dev: "eth0".into(),
            queues: 2,
            source: "driver statistics".into(),
            irqs: vec![40, 41],
            // Queue 0 holds 3 of the 4 entries.
            reta: Some(vec![0, 0, 1, 0]),
        };
        let t0 = Instant::now();
        let a = Snap {
            at: t0,
            queues: vec![("eth0".into(), vec![q(0, 1000, 5), q(1, 500, 0)])],
            softnet: vec![s(0, 100, 0, 1), s(1, 200, 2, 0)],
            irqs: vec![10, 20],
        };
        let b = Snap {
            at: t0 + Duration::from_secs(2),
            queues: vec![("eth0".into(), vec![q(0, 7000, 9), q(1, 2500, 0)])],
            softnet: vec![s(0, 8100, 0, 5), s(1, 200, 6, 0)],
            irqs: vec![410, 20],
        };
        let (rows, cpus) = rates(std::slice::from_ref(&dev), &a, &b);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].rx_packets, rows[0].drops), (6000, 4));
        assert_eq!((rows[0].rx_pps, rows[0].drops_per_s), (3000.0, 2.0));
        assert_eq!(rows[0].share, Some(0.75));
        assert_eq!(rows[0].reta_share, Some(0.75));
        assert_eq!((rows[1].rx_packets, rows[1].share), (2000, Some(0.25)));
        assert_eq!(rows[1].reta_share, Some(0.25));
        assert_eq!(cpus.len(), 2);
        assert_eq!(
            (
                cpus[0].processed_per_s,
                cpus[0].squeezed_per_s,
                cpus[0].irqs_per_s
            ),
            (4000.0, 2.0, 200.0)
        );
        assert_eq!((cpus[1].dropped_per_s, cpus[1].irqs_per_s), (2.0, 0.0));

        // Nothing received: no share (not 0 % or NaN); no table: no prediction; a counter
        // that went backwards (driver reset) counts 0, not a wrapped huge rate.
        let quiet = TopDev { reta: None, ..dev };
        let c = Snap {
            at: t0 + Duration::from_secs(3),
            queues: vec![("eth0".into(), vec![q(0, 10, 0), q(1, 2500, 0)])],
            ..b.clone()
        };
        let (rows, _) = rates(&[quiet], &b, &c);
        assert_eq!(rows[0].rx_packets, 0);
        assert_eq!((rows[0].share, rows[0].reta_share), (None, None));
    }
}
