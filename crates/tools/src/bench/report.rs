//! What `bench` reports: `report.json`, whose schema is docs/report.schema.json (a test checks
//! every report against it).

use serde::{Deserialize, Serialize};

use crate::Latency;

/// The schema name and version written in every report.
pub const SCHEMA: &str = "flowlane-bench-report/1";

/// The machine the run was on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// CPUs the server's workers used.
    pub cpus: u32,
    /// `uname -r`.
    pub kernel: String,
    /// `doctor`'s rules for the server's CPUs and the lab's interfaces, read once the lab
    /// was up, before the first step (none in reports of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checks: Option<crate::doctor::DoctorReport>,
}

/// The lab a run used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabInfo {
    /// Lab name.
    pub name: String,
    /// Buckets (receive queues).
    pub queues: u32,
    /// `rss`, `rps` or `none`.
    pub steer: String,
    /// RSS key, hex.
    pub key: String,
    /// Indirection table entries.
    pub reta_size: usize,
    /// `4-tuple` or `2-tuple`.
    pub hash: String,
    /// Symmetric hashing: `off` or `xor` (ethtool's symmetric-xor).
    #[serde(default = "symmetric_off")]
    pub symmetric: String,
}

fn symmetric_off() -> String {
    "off".into()
}

/// The five numbers of the FreeBSD RSS experiment. Interface counts are `None` on loopback;
/// echo counts are `None` in sink steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Five {
    /// Frames the client's interface sent.
    pub client_sent: Option<u64>,
    /// Frames the server's interface received.
    pub server_received: Option<u64>,
    /// Datagrams the server program read.
    pub server_seen: u64,
    /// Datagrams the server sent back.
    pub server_echoed: Option<u64>,
    /// Echoes the client program received.
    pub client_back: Option<u64>,
}

/// Rates over the step, per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pps {
    /// The client program's datagrams.
    pub sent: u64,
    /// Seen by the server program.
    pub server_seen: u64,
    /// Echoed by the server.
    pub echoed: Option<u64>,
    /// Back at the client.
    pub back: Option<u64>,
}

/// One server worker in a step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BenchWorker {
    /// Its CPU.
    pub cpu: u64,
    /// Datagrams it received.
    pub rx_packets: u64,
    /// What the client sent on the flows of the buckets this CPU owns.
    pub expected: u64,
    /// Datagrams it echoed.
    pub echoed: u64,
    /// Datagrams that reached its socket from another CPU (`None`: no detector).
    pub missteered: Option<u64>,
    /// Its socket's drops.
    pub socket_drops: u64,
    /// Frames this CPU's software-RSS queue dropped when full (`None`: no software RSS).
    pub queue_drops: Option<u64>,
    /// The worker's CPU time per datagram it received (its thread's CPU clock over its loop;
    /// the kernel's receive path in softirq is not in it), nanoseconds.
    pub cpu_ns_per_packet: Option<f64>,
}

/// One CPU's receive path over a step (`softnet_stat` differences).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelCpu {
    /// The CPU.
    pub cpu: u64,
    /// Frames its receive path processed.
    pub processed: u64,
    /// Frames dropped because its backlog was full.
    pub backlog_drops: u64,
    /// Times its receive softirq ran out of budget or time with work left.
    pub time_squeeze: u64,
}

/// One step: k active buckets, echo or sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchStep {
    /// `echo` or `sink`.
    pub mode: String,
    /// k: flows were placed on buckets 0..k-1.
    pub buckets: u32,
    /// Flows.
    pub flows: usize,
    /// Client sender threads.
    pub client_threads: u32,
    /// The client's send window, seconds.
    pub duration_s: f64,
    /// The five numbers.
    pub five: Five,
    /// Datagrams the client program sent.
    pub client_program_sent: u64,
    /// Frames the client's interface sent beyond the program's datagrams (other traffic on
    /// the link); `None` on loopback.
    pub link_other_frames: Option<u64>,
    /// Frames the client's interface received (echo steps).
    pub client_iface_back: Option<u64>,
    /// Frames the server's interface dropped on receive.
    pub server_iface_rx_dropped: Option<u64>,
    /// Rates.
    pub pps: Pps,
    /// Scaling efficiency: the server's rate at this k over k times its rate at k = 1 (same
    /// mode): 1.0 is perfect per-core scaling (`None`: no k = 1 step of this mode).
    #[serde(default)]
    pub scaling_efficiency: Option<f64>,
    /// Sent by the client program, never seen by the server program.
    pub lost: u64,
    /// Lost beyond what socket, CPU-queue and interface drops and link loss account for.
    pub lost_unexplained: u64,
    /// Per server worker.
    pub workers: Vec<BenchWorker>,
    /// Datagrams a worker received of flows whose bucket belongs to another CPU.
    pub misplaced: u64,
    /// Datagrams that reached a worker's socket after the kernel processed them elsewhere.
    pub missteered: u64,
    /// Socket drops, all workers.
    pub socket_drops: u64,
    /// Software-RSS CPU queue drops (`None`: no software RSS).
    pub queue_drops: Option<u64>,
    /// Per CPU, busy share of the step (/proc/stat).
    pub cpu_busy_pct: Vec<f64>,
    /// Per CPU, what the kernel's receive path did over the step (`/proc/net/softnet_stat`
    /// differences: the whole host's, as `netstat -Q` shows it).
    #[serde(default)]
    pub kernel_cpus: Vec<KernelCpu>,
    /// Per receive queue of the server's interface, what its driver counted over the step
    /// (`ethtool -S` differences; empty on loopback).
    #[serde(default)]
    pub server_queues: Vec<flowlane_lab::counters::RxQueue>,
    /// Round-trip percentiles (echo steps).
    pub latency_ns: Option<Latency>,
    /// How the server steered datagrams to workers: `cpu-bpf` (by the CPU the kernel
    /// processed each on), `hash-bpf` (by its own Toeplitz bucket), or a fallback.
    #[serde(default)]
    pub steering: String,
    /// Echo steps: echoes the client got back out of order, over all flows (blast's count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reordered: Option<u64>,
    /// Mixed flows (`--fragment-share`): the fragments, by the programs and by both kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<StepFragments>,
    /// What did not add up, in words.
    pub problems: Vec<String>,
}

/// A step's fragments: what the client sent long (fragmented by its kernel), what the server's
/// kernel made whole, where the server's workers got them — each count beside the kernel
/// counter that must agree with it (`/proc/net/snmp` of each namespace, over the step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepFragments {
    /// The share of each flow's datagrams sent long.
    pub share: f64,
    /// Datagrams the client sent long (blast's count).
    pub sent_datagrams: u64,
    /// The fragments they became at the path MTU (blast's count).
    pub sent_fragments: u64,
    /// The client kernel's `Ip: FragOKs`: datagrams it fragmented.
    pub client_frag_oks: u64,
    /// The client kernel's `Ip: FragCreates`: fragments it made.
    pub client_frag_creates: u64,
    /// The server kernel's `Ip: ReasmReqds`: fragments it took in for reassembly.
    pub server_reasm_reqds: u64,
    /// The server kernel's `Ip: ReasmOKs`: datagrams it made whole.
    pub server_reasm_oks: u64,
    /// The server kernel's `Ip: ReasmFails`: reassemblies it gave up.
    pub server_reasm_fails: u64,
    /// Datagrams the server's workers got that arrived in fragments (IP_RECVFRAGSIZE).
    pub server_fragmented: u64,
    /// Per worker, in the order of `workers`: of those, its share.
    pub worker_fragmented: Vec<u64>,
    /// Client flows whose datagrams reached more than one worker (fragmented and whole ones
    /// apart: the reordering the seed describes).
    pub split_flows: u64,
}

/// The report of a whole run (`report.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// [`SCHEMA`].
    pub schema: String,
    /// The flowlane version that measured.
    pub flowlane_version: String,
    /// When, seconds since the Unix epoch.
    pub created_unix: u64,
    /// The machine.
    pub host: Host,
    /// False for the loopback variant: no NIC queues, no steering.
    pub rss_faithful: bool,
    /// The lab (`None` on loopback).
    pub lab: Option<LabInfo>,
    /// Frame size, FCS excluded.
    pub frame_bytes: usize,
    /// Seconds of traffic per step.
    pub step_secs: f64,
    /// Flows per active bucket.
    pub per_bucket: u64,
    /// The steps, in order.
    pub steps: Vec<BenchStep>,
    /// Every step's problems, in order.
    pub problems: Vec<String>,
    /// A stop request (Ctrl-C) ended the run early.
    pub interrupted: bool,
}
