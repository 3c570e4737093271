//! What a `bench` run is asked to do.

use flowlane_lab::setup::LabConfig;
use serde::{Deserialize, Serialize};

use crate::blast::Rate;

/// Which steps run at each k.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchMode {
    /// The server echoes; the client takes the echoes back.
    Echo,
    /// One way.
    Sink,
    /// A sink step and an echo step for each k.
    Both,
}

/// Where the steps run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchTarget {
    /// The lab of this name: used as it is when up, else brought up with this configuration
    /// (and taken down after the run unless `keep`).
    Lab {
        /// The lab to bring up if none of its name is up.
        config: LabConfig,
        /// Leave a lab this run brought up in place afterwards.
        keep: bool,
    },
    /// 127.0.0.1 in this namespace: no interfaces, no steering (not RSS-faithful).
    Loopback {
        /// The RSS key the picker places flows with (hex).
        key: String,
    },
}

/// How the server hands datagrams to its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServeSteering {
    /// By the CPU the kernel processed the datagram on (serve's default).
    Cpu,
    /// By the datagram's own Toeplitz bucket (`serve --steer-hash`, with the lab's key and
    /// table), wherever the kernel finished it — FreeBSD's re-steering of reassembled
    /// datagrams.
    Hash,
    /// A step of each for every k, CPU first.
    Both,
}

/// A share of each client flow's datagrams long enough for the kernel to fragment
/// (`blast --fragment-datagram`), the seed's mixed flows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchFragments {
    /// The share of each flow's datagrams sent long, 0 to 1 (whole percents).
    pub share: f64,
    /// Their UDP payload bytes (above the lab's MTU).
    pub payload: usize,
}

/// The configuration of one `bench` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    /// Where.
    pub target: BenchTarget,
    /// Steps k = lo..=hi (default: 1..=buckets).
    pub buckets: Option<(u32, u32)>,
    /// Echo, sink or both.
    pub mode: BenchMode,
    /// Frame size without FCS, 60-1514.
    pub frame_bytes: usize,
    /// Seconds of traffic per step.
    pub step_secs: f64,
    /// Flows per active bucket.
    pub per_bucket: u64,
    /// Client rate per step (default: as fast as it can).
    pub rate: Option<Rate>,
    /// CPUs the server's workers run on (and the client's threads, the first k).
    pub cpus: Vec<usize>,
    /// How the server steers datagrams to workers (CPU, hash, or a step of each).
    #[serde(default = "cpu_steering")]
    pub serve_steering: ServeSteering,
    /// Mixed flows: a share of each flow's datagrams fragmented by the client's kernel.
    #[serde(default)]
    pub fragments: Option<BenchFragments>,
}

fn cpu_steering() -> ServeSteering {
    ServeSteering::Cpu
}
