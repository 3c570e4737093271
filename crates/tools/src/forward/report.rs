//! What `forward` reports (`flowlane forward --json`).

use serde::{Deserialize, Serialize};

use super::{ForwardMode, Job};
use crate::backend::BackendReport;

/// Frames not forwarded, by reason (`flowlane_wire::forward::Reason`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drops {
    /// Not IPv4/IPv6 (when addresses or ports are swapped); passed to the kernel or dropped
    /// as asked.
    pub not_ip: u64,
    /// Headers cut short or inconsistent.
    pub malformed: u64,
    /// Longer than a ring slot (AF_PACKET).
    pub truncated: u64,
    /// Received but not sent: the transmit ring was full (AF_PACKET).
    pub tx_full: u64,
}

impl Drops {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.not_ip + self.malformed + self.truncated + self.tx_full
    }

    /// Field-wise sum.
    pub fn plus(&self, o: &Drops) -> Drops {
        Drops {
            not_ip: self.not_ip + o.not_ip,
            malformed: self.malformed + o.malformed,
            truncated: self.truncated + o.truncated,
            tx_full: self.tx_full + o.tx_full,
        }
    }
}

/// One CPU's (or the whole run's) counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardCounts {
    /// Frames the forwarder looked at: forwarded + dropped.
    pub rx_packets: u64,
    /// Frames sent on.
    pub forwarded: u64,
    /// Frames not sent on, by reason.
    pub dropped: Drops,
    /// Frames the forwarder never saw (not in `rx_packets`): the interface received them but
    /// the receive ring had no room (AF_PACKET's `tp_drops`; the forwarder was the limit).
    pub ring_drops: u64,
}

impl ForwardCounts {
    /// Field-wise sum.
    pub fn plus(&self, o: &ForwardCounts) -> ForwardCounts {
        ForwardCounts {
            rx_packets: self.rx_packets + o.rx_packets,
            forwarded: self.forwarded + o.forwarded,
            dropped: self.dropped.plus(&o.dropped),
            ring_drops: self.ring_drops + o.ring_drops,
        }
    }

    /// Field-wise `self - earlier` (saturating).
    pub fn since(&self, e: &ForwardCounts) -> ForwardCounts {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        ForwardCounts {
            rx_packets: d(self.rx_packets, e.rx_packets),
            forwarded: d(self.forwarded, e.forwarded),
            dropped: Drops {
                not_ip: d(self.dropped.not_ip, e.dropped.not_ip),
                malformed: d(self.dropped.malformed, e.dropped.malformed),
                truncated: d(self.dropped.truncated, e.dropped.truncated),
                tx_full: d(self.dropped.tx_full, e.dropped.tx_full),
            },
            ring_drops: d(self.ring_drops, e.ring_drops),
        }
    }
}

/// One CPU's part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuCounts {
    /// The CPU.
    pub cpu: usize,
    /// Its counts.
    #[serde(flatten)]
    pub counts: ForwardCounts,
}

/// Counters over one status interval.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardTick {
    /// Seconds since the start.
    pub elapsed_s: f64,
    /// Seconds the interval lasted.
    pub interval_s: f64,
    /// All CPUs over the interval.
    pub delta: ForwardCounts,
}

/// What `forward` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardReport {
    /// The mode.
    pub mode: ForwardMode,
    /// The backend, as asked of the kernel.
    pub backend: BackendReport,
    /// What was swapped besides the MACs: `ip`, `ports`.
    pub swapped: Vec<String>,
    /// Seconds the forwarder ran.
    pub duration_s: f64,
    /// All CPUs.
    pub total: ForwardCounts,
    /// Per CPU that handled any frame (native XDP: where the driver received it).
    pub cpus: Vec<CpuCounts>,
    /// Frames forwarded per second over the run.
    pub forwarded_pps: f64,
    /// The interface's own receive counter over the run (sysfs): `rx_packets` + `ring_drops`
    /// when nothing else arrived.
    pub dev_rx_packets: Option<u64>,
    /// Its transmit counter over the run: frames that left (with reflect, the forwarded ones
    /// and anything the host sent).
    pub dev_tx_packets: Option<u64>,
    /// Forwarded frames that did not leave the interface (forwarded − the interface's sent
    /// count, at least): the device refused them — on veth, a peer that runs no NAPI.
    pub device_refused: Option<u64>,
    /// What went wrong, in words (the run's exit code is then 1).
    #[serde(default)]
    pub problems: Vec<String>,
    /// Why the forwarder stopped early, if it did.
    #[serde(default)]
    pub errors: Vec<String>,
}

/// The names of what `swap` swaps besides the MACs.
pub(super) fn swapped(swap: flowlane_wire::forward::Swap) -> Vec<String> {
    let mut v = Vec::new();
    if swap.ip {
        v.push("ip".to_string());
    }
    if swap.ports {
        v.push("ports".to_string());
    }
    v
}

/// The device's refusals and what they mean, from the forwarded count and the interface's
/// transmit counter.
pub(super) fn judge(dev: &str, forwarded: u64, dev_tx: Option<u64>) -> (Option<u64>, Vec<String>) {
    let refused = dev_tx.map(|t| forwarded.saturating_sub(t));
    let mut problems = Vec::new();
    if let Some(n) = refused.filter(|&n| n > 0) {
        problems.push(format!(
            "{dev} sent {} fewer frames than were forwarded: the device refused {n} (on veth \
             the peer must run an XDP program to take frames sent back by XDP_TX — GRO alone \
             is not enough on Linux 6.18 — and keep up)",
            n
        ));
    }
    (refused, problems)
}

/// The report from the per-CPU counts at the end, and the interface's counters before the run
/// (`rx`, `tx`): totals, rates, the cross-check against the interface and its verdict.
pub(super) fn assemble(
    job: &Job<'_>,
    elapsed_s: f64,
    cpus: Vec<CpuCounts>,
    before: (Option<u64>, Option<u64>),
    errors: Vec<String>,
) -> ForwardReport {
    let total = cpus
        .iter()
        .fold(ForwardCounts::default(), |t, c| t.plus(&c.counts));
    let (rx1, tx1) = super::dev_counters(job.dev);
    let delta =
        |now: Option<u64>, then: Option<u64>| now.zip(then).map(|(a, b)| a.saturating_sub(b));
    let dev_tx_packets = delta(tx1, before.1);
    let (device_refused, problems) = judge(job.dev, total.forwarded, dev_tx_packets);
    ForwardReport {
        mode: job.cfg.mode,
        backend: job.backend.clone(),
        swapped: swapped(job.swap),
        duration_s: (elapsed_s * 1000.0).round() / 1000.0,
        total,
        cpus,
        forwarded_pps: (total.forwarded as f64 / elapsed_s.max(1e-9)).round(),
        dev_rx_packets: delta(rx1, before.0),
        dev_tx_packets,
        device_refused,
        problems,
        errors,
    }
}
