//! What `serve` reports: the JSON contract (`flowlane serve --json`), read back by `bench`.

use super::worker::ServeSnapshot;
use flowlane_runtime::WorkerSnapshot;
use serde::{Deserialize, Serialize};

use super::ServeMode;
pub use crate::report::WorkerError;

/// Serve's counters: the runtime's counters that a serve worker writes, and no others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServeCounts {
    /// Datagrams received (GRO-coalesced ones counted one by one).
    pub rx_packets: u64,
    /// Payload bytes received.
    pub rx_bytes: u64,
    /// Datagrams echoed.
    pub tx_packets: u64,
    /// Payload bytes echoed.
    pub tx_bytes: u64,
    /// Echoes that could not be sent (send buffer full, or an error).
    pub tx_failed: u64,
    /// Datagrams the kernel dropped because the socket's receive buffer was full.
    pub socket_drops: u64,
    /// Datagrams longer than the receive buffer.
    pub truncated: u64,
    /// Datagrams the kernel processed on another CPU, counted by the eBPF filter as they
    /// reached the socket — before its buffer could drop them (`None`: no detector).
    pub missteered: Option<u64>,
    /// Of those, the fewest the worker can have received (`missteered` − `socket_drops`).
    pub missteered_received_min: Option<u64>,
    /// Of those, the most the worker can have received (at most all it received).
    pub missteered_received_max: Option<u64>,
    /// Receives that held several datagrams coalesced by UDP_GRO.
    pub gro_receives: u64,
    /// Sends of several datagrams as GSO segments.
    pub gso_sends: u64,
    /// Datagrams the kernel reassembled from IP fragments before this socket got them
    /// (IP_RECVFRAGSIZE); 0 on a kernel without it (then a notice says so).
    #[serde(default)]
    pub fragmented: u64,
    /// Poll rounds.
    pub rounds: u64,
    /// Rounds that used the whole budget.
    pub full_rounds: u64,
    /// Rounds that received at least one datagram.
    pub busy_rounds: u64,
    /// Times the worker slept on readiness.
    pub sleeps: u64,
    /// Datagrams per round that received any (how full batches are), two decimals.
    pub batch_fill: f64,
    /// CPU time the workers' threads used in their loops (user and system), nanoseconds.
    #[serde(default)]
    pub cpu_ns: u64,
    /// Of that, nanoseconds per datagram received: what each one cost.
    #[serde(default)]
    pub cpu_ns_per_packet: Option<f64>,
}

impl ServeCounts {
    /// Serve's view of a worker's counters; `detected`: the mis-steering detector ran.
    pub fn from_snapshot(w: &WorkerSnapshot<ServeSnapshot>, detected: bool) -> ServeCounts {
        let (s, l) = (&w.role, &w.looped);
        ServeCounts {
            rx_packets: s.rx_packets,
            rx_bytes: s.rx_bytes,
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            tx_failed: s.tx_failed,
            socket_drops: s.socket_drops,
            truncated: s.truncated,
            missteered: detected.then_some(s.missteered),
            missteered_received_min: detected.then(|| s.missteered.saturating_sub(s.socket_drops)),
            missteered_received_max: detected.then(|| s.missteered.min(s.rx_packets)),
            gro_receives: s.gro_receives,
            gso_sends: s.gso_sends,
            fragmented: s.fragmented,
            rounds: l.rounds,
            full_rounds: l.full_rounds,
            busy_rounds: l.busy_rounds,
            sleeps: l.sleeps,
            batch_fill: (s.batch_fill(l.busy_rounds) * 100.0).round() / 100.0,
            cpu_ns: l.cpu_ns,
            cpu_ns_per_packet: crate::ns_per(l.cpu_ns, s.rx_packets),
        }
    }
}

/// Datagrams one worker got from one source address (`--by-source`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SourceCount {
    /// The source, `IP:PORT`.
    pub src: String,
    /// Datagrams from it.
    pub packets: u64,
}

/// One worker's part of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServeWorkerReport {
    /// The CPU it was pinned to.
    pub cpu: usize,
    /// Its counters.
    #[serde(flatten)]
    pub counts: ServeCounts,
    /// Datagrams per source address (with `by_source`), sorted by source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<SourceCount>>,
}

/// The report of one `serve` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServeReport {
    /// Per worker, in CPU-list order.
    pub workers: Vec<ServeWorkerReport>,
    /// All workers together.
    pub total: ServeCounts,
    /// From the start of the workers' loops to their end.
    pub duration_s: f64,
    /// `cpu-bpf` (each datagram to the worker on the CPU that processed it) or
    /// `reuseport-hash`.
    pub steering: String,
    /// Why steering is the kernel's hash, when it is.
    pub steering_reason: Option<String>,
    /// `ebpf`, or why the mis-steering detector is off.
    pub missteer_detector: String,
    /// Echo or sink.
    pub mode: ServeMode,
    /// The address served.
    pub bind: String,
    /// UDP_GRO was on.
    pub gro: bool,
    /// UDP_SEGMENT was on.
    pub gso: bool,
    /// Busy polling, microseconds.
    pub busy_poll_us: Option<u32>,
    /// Features turned off at start, and why.
    pub notices: Vec<String>,
    /// Receive buffer the kernel granted, bytes.
    pub rcvbuf: usize,
    /// Send buffer the kernel granted, bytes.
    pub sndbuf: usize,
    /// What each packet cost in cycles, instructions and cache misses, or why not known.
    #[serde(default)]
    pub pmu: crate::PmuCost,
    /// Workers that stopped with an error (the run's exit code is then 1).
    pub errors: Vec<WorkerError>,
    /// The host's conditions when it ran (`doctor`'s rules for its CPUs and interfaces),
    /// read by the caller before the run; none when not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<crate::doctor::DoctorReport>,
    /// With `--shard` or `--start-at`: which shard of the run this is, and when it started by
    /// which clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<crate::shard::ShardReport>,
}
