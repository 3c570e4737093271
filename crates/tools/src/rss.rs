//! What the RSS engine's commands report as JSON (`hash --json`, `pick --json`): types, so the
//! JSON contract is one (and has its schema, `docs/hash.schema.json`, `docs/pick.schema.json`).

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
