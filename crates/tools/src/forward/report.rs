//! What `forward` reports (`flowlane forward --json`).

use serde::{Deserialize, Serialize};

use super::{ForwardMode, Job};
use crate::backend::BackendReport;

/// Field-wise `plus` and `since` for a struct of `u64` counts.
macro_rules! fieldwise {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl $t {
            /// Field-wise sum.
            pub fn plus(&self, o: &$t) -> $t {
                $t { $($f: self.$f.wrapping_add(o.$f),)* }
            }

            /// Field-wise `self - earlier` (saturating).
            pub fn since(&self, e: &$t) -> $t {
                $t { $($f: self.$f.saturating_sub(e.$f),)* }
            }
        }
    };
}

/// Frames not forwarded, by reason (`flowlane_wire::forward::Reason`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Drops {
    /// Not IPv4/IPv6 (reflect: when addresses or ports are swapped; passed to the kernel or
    /// dropped as asked. Route: left to the kernel).
    pub not_ip: u64,
    /// Headers cut short or inconsistent.
    pub malformed: u64,
    /// Longer than a ring slot (AF_PACKET).
    pub truncated: u64,
    /// Received but not sent: the transmit ring was full (AF_PACKET).
    pub tx_full: u64,
    /// Route: no route, a blackhole, or a route out of an interface that is not the
    /// forwarder's.
    #[serde(default)]
    pub no_route: u64,
    /// Route: a route whose next hop has no known MAC.
    #[serde(default)]
    pub no_neighbour: u64,
    /// Route: TTL or hop limit would reach 0.
    #[serde(default)]
    pub ttl_exceeded: u64,
    /// Route: larger than the outgoing interface's MTU.
    #[serde(default)]
    pub too_big: u64,
    /// Bridge: the destination is on the port the frame came in by (not sent back).
    #[serde(default)]
    pub filtered: u64,
    /// Native XDP: a checksum left to offload over a segment longer than the program sums
    /// (`flowlane_io::ebpf::MAX_CSUM_WORDS`): not sent on with a checksum the peer rejects.
    #[serde(default)]
    pub checksum_unfinished: u64,
}

fieldwise!(Drops {
    not_ip,
    malformed,
    truncated,
    tx_full,
    no_route,
    no_neighbour,
    ttl_exceeded,
    too_big,
    filtered,
    checksum_unfinished
});

impl Drops {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.not_ip
            + self.malformed
            + self.truncated
            + self.tx_full
            + self.no_route
            + self.no_neighbour
            + self.ttl_exceeded
            + self.too_big
            + self.filtered
            + self.checksum_unfinished
    }
}

/// One CPU's (or the whole run's) counts.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct ForwardCounts {
    /// Frames the forwarder looked at: forwarded + to_host + dropped.
    pub rx_packets: u64,
    /// Frames sent on.
    pub forwarded: u64,
    /// Route: frames for this host (multicast, broadcast, its own addresses), left to the
    /// kernel.
    #[serde(default)]
    pub to_host: u64,
    /// Bridge: of the forwarded frames, those flooded (broadcast, multicast, unknown
    /// destination: out of every other port).
    #[serde(default)]
    pub flooded: u64,
    /// Bridge: copies flooding queued beyond one per frame (frames queued on the ports =
    /// forwarded + flood_copies).
    #[serde(default)]
    pub flood_copies: u64,
    /// Frames not sent on, by reason.
    pub dropped: Drops,
    /// Frames the forwarder never saw (not in `rx_packets`): the interface received them but
    /// the receive ring had no room (AF_PACKET's `tp_drops`; the forwarder was the limit).
    pub ring_drops: u64,
    /// Of the forwarded frames, those whose UDP or TCP checksum a sender on the forwarder's
    /// host had left to offload (only the pseudo header's sum) and the forwarder completed:
    /// sent on as they came, the peer would drop them as corrupt (user-space backends).
    #[serde(default)]
    pub checksum_completed: u64,
    /// Route with `--flow-cache`: what the cache did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_cache: Option<CacheCounts>,
}

/// The route workers' flow caches (`--flow-cache`), summed.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct CacheCounts {
    /// Frames looked up.
    pub lookups: u64,
    /// Of them, found (stale ones included).
    pub hits: u64,
    /// Of the hits, decided before the routes or neighbours last changed: decided again.
    pub stale: u64,
    /// Flows added.
    pub inserts: u64,
    /// Flows idle too long.
    pub expired: u64,
    /// Flows pushed out by new ones when full.
    pub evicted: u64,
    /// Records the expiry visited: its GC work (a timer wheel's, O(1) per expired flow).
    #[serde(default)]
    pub gc_visited: u64,
}

impl CacheCounts {
    fn plus(&self, o: &CacheCounts) -> CacheCounts {
        CacheCounts {
            lookups: self.lookups + o.lookups,
            hits: self.hits + o.hits,
            stale: self.stale + o.stale,
            inserts: self.inserts + o.inserts,
            expired: self.expired + o.expired,
            evicted: self.evicted + o.evicted,
            gc_visited: self.gc_visited + o.gc_visited,
        }
    }
}

impl ForwardCounts {
    /// Field-wise sum.
    pub fn plus(&self, o: &ForwardCounts) -> ForwardCounts {
        ForwardCounts {
            rx_packets: self.rx_packets + o.rx_packets,
            forwarded: self.forwarded + o.forwarded,
            to_host: self.to_host + o.to_host,
            flooded: self.flooded + o.flooded,
            flood_copies: self.flood_copies + o.flood_copies,
            dropped: self.dropped.plus(&o.dropped),
            ring_drops: self.ring_drops + o.ring_drops,
            checksum_completed: self.checksum_completed + o.checksum_completed,
            flow_cache: match (&self.flow_cache, &o.flow_cache) {
                (Some(a), Some(b)) => Some(a.plus(b)),
                (a, b) => a.or(*b),
            },
        }
    }

    /// Field-wise `self - earlier` (saturating).
    pub fn since(&self, e: &ForwardCounts) -> ForwardCounts {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        ForwardCounts {
            rx_packets: d(self.rx_packets, e.rx_packets),
            forwarded: d(self.forwarded, e.forwarded),
            to_host: d(self.to_host, e.to_host),
            flooded: d(self.flooded, e.flooded),
            flood_copies: d(self.flood_copies, e.flood_copies),
            dropped: self.dropped.since(&e.dropped),
            ring_drops: d(self.ring_drops, e.ring_drops),
            checksum_completed: d(self.checksum_completed, e.checksum_completed),
            flow_cache: match (&self.flow_cache, &e.flow_cache) {
                (Some(a), Some(b)) => Some(CacheCounts {
                    lookups: d(a.lookups, b.lookups),
                    hits: d(a.hits, b.hits),
                    stale: d(a.stale, b.stale),
                    inserts: d(a.inserts, b.inserts),
                    expired: d(a.expired, b.expired),
                    evicted: d(a.evicted, b.evicted),
                    gc_visited: d(a.gc_visited, b.gc_visited),
                }),
                (a, _) => *a,
            },
        }
    }
}

/// One interface's own counters over the run (sysfs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PortCounts {
    /// The interface.
    pub dev: String,
    /// Frames it received.
    pub rx_packets: Option<u64>,
    /// Frames it sent.
    pub tx_packets: Option<u64>,
    /// Bridge: frames the forwarder looked at from this port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub looked_at: Option<u64>,
    /// Bridge: frames the forwarder queued on this port (unicast and flooded copies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<u64>,
}

/// What the bridge learnt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BridgeSummary {
    /// Seconds an unseen MAC is kept.
    pub ageing_s: u32,
    /// The MAC table at the end: (MAC, port).
    pub macs: Vec<(String, String)>,
    /// MACs forgotten by ageing during the run.
    pub aged_out: u64,
}

/// One CPU's part.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CpuCounts {
    /// The CPU.
    pub cpu: usize,
    /// Its counts.
    #[serde(flatten)]
    pub counts: ForwardCounts,
    /// The worker's CPU time per frame it looked at (its thread's CPU clock over its loop),
    /// nanoseconds; `None` for native XDP (no worker: the kernel's receive path does it all).
    #[serde(default)]
    pub cpu_ns_per_packet: Option<f64>,
}

/// Counters over one status interval.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ForwardTick {
    /// Seconds since the start.
    pub elapsed_s: f64,
    /// Seconds the interval lasted.
    pub interval_s: f64,
    /// All CPUs over the interval.
    pub delta: ForwardCounts,
    /// Route mode: the tables' upkeep so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<crate::route::tables::TablesTick>,
    /// Native XDP: frames forwarded in the interval that the interfaces did not send (their
    /// transmit counters), as the summary's `device_refused` — on veth, a peer that cannot
    /// take XDP_TX or redirected frames. Said in the first status line it shows in. The two
    /// counts are read a few µs apart, so an interval may be off by the frames in flight
    /// then; the summary's count, read after the program is gone, is exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_refused: Option<u64>,
}

impl ForwardTick {
    /// Frames the device refused in the interval, where they are more than can be in flight
    /// between the two counter reads (64, or 1 % of what was queued): the figure a status
    /// line reports, not read noise.
    pub fn refused_beyond_in_flight(&self) -> Option<u64> {
        let queued = self.delta.forwarded + self.delta.flood_copies;
        self.device_refused.filter(|&n| n > 64.max(queued / 100))
    }
}

/// What `forward` reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Each interface's own counters over the run (reflect: the one).
    #[serde(default)]
    pub ports: Vec<PortCounts>,
    /// Route: where the tables came from and what they hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<crate::route::tables::RouteSummary>,
    /// Bridge: what it learnt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<BridgeSummary>,
    /// AF_PACKET: what the rings mapped, of what budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rings: Option<crate::rings::RingMemory>,
    /// The interfaces' own receive counters over the run, summed (sysfs): `rx_packets` +
    /// `ring_drops` when nothing else arrived.
    pub dev_rx_packets: Option<u64>,
    /// Their transmit counters over the run, summed: frames that left (the forwarded ones and
    /// anything the host sent).
    pub dev_tx_packets: Option<u64>,
    /// Forwarded frames that did not leave the interface (forwarded − the interface's sent
    /// count, at least): the device refused them — on veth, a peer that runs no NAPI.
    pub device_refused: Option<u64>,
    /// What went wrong, in words (the run's exit code is then 1).
    #[serde(default)]
    pub problems: Vec<String>,
    /// What each packet cost in cycles, instructions and cache misses, or why not known.
    #[serde(default)]
    pub pmu: crate::PmuCost,
    /// Why the forwarder stopped early, if it did.
    #[serde(default)]
    pub errors: Vec<String>,
    /// The host's conditions when it ran (`doctor`'s rules for its CPUs and interfaces),
    /// read by the caller before the run; none when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::doctor::DoctorReport>,
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
            "{dev} sent {n} fewer frames than were forwarded: the device refused {n} ({})",
            REFUSED_FIX
        ));
    }
    (refused, problems)
}

/// Why a veth refuses frames XDP sends, and the fix: said in the status line where refusals
/// first show, and in the verdict.
pub const REFUSED_FIX: &str = "on veth the peer must run an XDP program to take frames sent \
    back by XDP_TX or redirected — GRO alone is not enough on Linux 6.18 — and keep up: load \
    one on the peer (`flowlane lab up` does; `ip link set dev PEER xdp obj …`), or use \
    --backend af-xdp or af-packet";

/// The report from the per-CPU counts at the end, and the interfaces' counters before the
/// run: totals, rates, the cross-check against the interfaces and its verdict.
pub(super) fn assemble(
    job: &Job<'_>,
    elapsed_s: f64,
    cpus: Vec<CpuCounts>,
    before: &[(Option<u64>, Option<u64>)],
    errors: Vec<String>,
) -> ForwardReport {
    let total = cpus
        .iter()
        .fold(ForwardCounts::default(), |t, c| t.plus(&c.counts));
    let delta =
        |now: Option<u64>, then: Option<u64>| now.zip(then).map(|(a, b)| a.saturating_sub(b));
    let ports: Vec<PortCounts> = job
        .ports
        .iter()
        .zip(before)
        .map(|((dev, _), b)| {
            let (rx1, tx1) = super::dev_counters(dev);
            PortCounts {
                dev: dev.clone(),
                rx_packets: delta(rx1, b.0),
                tx_packets: delta(tx1, b.1),
                looked_at: None,
                queued: None,
            }
        })
        .collect();
    let sum = |f: fn(&PortCounts) -> Option<u64>| {
        ports.iter().try_fold(0u64, |acc, p| f(p).map(|v| acc + v))
    };
    let dev_tx_packets = sum(|p| p.tx_packets);
    let dev_rx_packets = sum(|p| p.rx_packets);
    let names: Vec<&str> = job.ports.iter().map(|p| p.0.as_str()).collect();
    let queued = total.forwarded + total.flood_copies;
    let (device_refused, problems) = judge(&names.join("+"), queued, dev_tx_packets);
    ForwardReport {
        host: None,
        pmu: crate::PmuCost::default(),
        mode: job.cfg.mode.kind(),
        backend: job.backend.clone(),
        swapped: swapped(job.swap),
        duration_s: (elapsed_s * 1000.0).round() / 1000.0,
        total,
        cpus,
        forwarded_pps: (total.forwarded as f64 / elapsed_s.max(1e-9)).round(),
        ports,
        routes: job.routes.clone(),
        bridge: None,
        rings: None,
        dev_rx_packets,
        dev_tx_packets,
        device_refused,
        problems,
        errors,
    }
}
