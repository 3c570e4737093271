//! What the RSS engine's commands report as JSON (`hash --json`, `pick --json`, `rss show
//! --json`): types, so the JSON contract is one (and has its schema, `docs/hash.schema.json`,
//! `docs/pick.schema.json`, `docs/rss-show.schema.json`); `rss show`'s figures are made here.

use std::net::Ipv4Addr;

use flowlane_rss::analysis::{spread, Spread};
use flowlane_rss::queue::QueueModel;
use flowlane_rss::toeplitz::Backend;
use flowlane_rss::{FreeBsdBuckets, Key, Symmetric, Toeplitz, Tuple};
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

/// `flowlane hash --json`: one tuple's hash and queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HashReport {
    /// The Toeplitz hash, 8 hex digits.
    pub hash: String,
    /// `ipv4-4tuple`, `ipv6-2tuple`, …
    pub kind: String,
    /// Source address.
    pub src: String,
    /// Destination address.
    pub dst: String,
    /// Source port (4-tuples).
    pub src_port: Option<u16>,
    /// Destination port (4-tuples).
    pub dst_port: Option<u16>,
    /// How the input was made symmetric (`off`, `xor`, `sort`).
    pub symmetric: String,
    /// The queue model.
    pub model: String,
    /// The indirection table index (RETA models).
    pub index: Option<u32>,
    /// The receive queue.
    pub queue: u32,
    /// Queues in the model.
    pub queues: u32,
    /// The key, hex.
    pub key: String,
    /// Where the key came from.
    pub key_source: String,
    /// This flow's fragments (no ports: hashed on the addresses): their hash…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragment_hash: Option<String>,
    /// …and queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragment_queue: Option<u32>,
}

/// `flowlane pick --json`: tuples per queue, every one verified.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PickReport {
    /// The key, hex.
    pub key: String,
    /// Where the key came from.
    pub key_source: String,
    /// How the input was made symmetric.
    pub symmetric: String,
    /// The queue model.
    pub model: String,
    /// Queues in the model.
    pub queues_in_model: u32,
    /// `2-tuple` or `4-tuple`.
    pub hash_fields: String,
    /// How they were found: `gf2` (solved) or `walk` (searched).
    pub method: String,
    /// Every tuple was hashed again and lands where it says.
    pub verified: bool,
    /// Per queue asked.
    pub queues: Vec<PickQueue>,
}

/// One queue's tuples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PickQueue {
    /// The queue.
    pub queue: u32,
    /// Tuples of the range that land on it.
    pub available: u128,
    /// As many as asked were found.
    pub complete: bool,
    /// The tuples.
    pub tuples: Vec<PickTuple>,
}

/// One tuple.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PickTuple {
    /// Source address.
    pub src: String,
    /// Source port.
    pub src_port: u16,
    /// Destination address.
    pub dst: String,
    /// Destination port.
    pub dst_port: u16,
    /// Its hash, 8 hex digits.
    pub hash: String,
}

/// `flowlane rss show --json`: what a key and a queue model do to a sample of flows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShowReport {
    /// The key, hex.
    pub key: String,
    /// The key as `ethtool -X … hkey` takes it (colon-separated bytes).
    pub key_ethtool: String,
    /// Key bytes.
    pub key_len: usize,
    /// Where the key came from.
    pub key_source: String,
    /// How the input is made symmetric (`off`, `xor`, `sort`).
    pub symmetric: String,
    /// Input bits this far apart hash alike (a key that repeats), if any.
    pub period_bits: Option<usize>,
    /// Distinct hash bits the key can give IPv4 4-tuples (of 32).
    pub hash_bits_ipv4_4tuple: u32,
    /// The same for IPv6 4-tuples.
    pub hash_bits_ipv6_4tuple: u32,
    /// The queue model.
    pub model: String,
    /// Queues in the model.
    pub queues: u32,
    /// The indirection table (RETA models): index → queue.
    pub reta: Option<Vec<u16>>,
    /// How the sample of flows spreads over the queues.
    pub spread: Spread,
    /// FreeBSD's bucket → CPU table for `freebsd.cpus` CPUs.
    pub freebsd: FreeBsdTable,
    /// The hash implementations this CPU can run.
    pub hash_backends: Vec<String>,
    /// With `--dev`: the interface's RSS and queues as read (the model above is its RSS when
    /// it has one flowlane models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<crate::nic::NicReport>,
}

/// FreeBSD's RSS buckets and the CPU each goes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FreeBsdTable {
    /// CPUs.
    pub cpus: u32,
    /// Hash bits used (bucket = hash & (buckets − 1)).
    pub bits: u32,
    /// Buckets.
    pub buckets: u32,
    /// Bucket → CPU.
    pub bucket_cpu: Vec<u32>,
}

/// What `rss show` reports for `queue` hashed with `key`: `sample` IPv4 4-tuples from
/// 198.18.0.0/15 with random ports (the same every run, so outputs compare across keys), and
/// FreeBSD's table for `cpus` CPUs (default: the model's own when it is FreeBSD's, else
/// `machine_cpus`).
pub fn show(
    queue: &QueueModel,
    key: &Key,
    key_source: String,
    symmetric: Symmetric,
    cpus: Option<u32>,
    machine_cpus: u32,
    sample: u64,
) -> ShowReport {
    let hasher = Toeplitz::new(key);
    let bsd = match queue {
        QueueModel::FreeBsd(b) if cpus.is_none() => *b,
        _ => FreeBsdBuckets::new(cpus.unwrap_or(machine_cpus)),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let tuples: Vec<Tuple> = (0..sample)
        .map(|_| {
            let src = Ipv4Addr::from(0xc612_0000 | (rng.random::<u32>() & 0x1_ffff));
            Tuple::v4(src, Ipv4Addr::new(198, 19, 0, 1), rng.random(), 8080).symmetric(symmetric)
        })
        .collect();
    ShowReport {
        key: key.to_hex(),
        key_ethtool: key.to_colon_hex(),
        key_len: key.len(),
        key_source,
        symmetric: symmetric.name().to_string(),
        period_bits: key.period_bits(),
        hash_bits_ipv4_4tuple: key.entropy_bits(12),
        hash_bits_ipv6_4tuple: key.entropy_bits(36),
        model: queue.name().to_string(),
        queues: queue.queues(),
        reta: match queue {
            QueueModel::Reta(r) => Some(r.entries().to_vec()),
            _ => None,
        },
        spread: spread(&hasher, queue, &tuples),
        freebsd: FreeBsdTable {
            cpus: bsd.ncpus(),
            bits: bsd.bits(),
            buckets: bsd.buckets(),
            bucket_cpu: (0..bsd.buckets()).map(|b| bsd.cpu(b)).collect(),
        },
        hash_backends: Backend::available()
            .iter()
            .map(|b| b.name().to_string())
            .collect(),
        nic: None,
    }
}
