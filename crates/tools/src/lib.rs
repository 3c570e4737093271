//! # flowlane-tools — the roles as library code
//!
//! Layer: roles, above the runtime (workers, poll loop) and io (sockets, BPF); below the CLI,
//! which only parses flags into a role's configuration, calls its `run` and prints its report.
//! Each role is one module: a typed configuration (serde, no clap), a `run` that takes it and
//! returns a typed report (Serialize + Deserialize: the JSON contract, read back by `bench`),
//! and a [`ToolError`] whose [`ErrorKind`] says whether the user can fix the command line
//! (usage, privilege) or the job could not be done (runtime). Nothing here depends on clap or
//! anyhow, and nothing prints: live status reaches the caller as typed events.

#![forbid(unsafe_code)]

pub mod backend;
pub mod bench;
pub mod blast;
pub mod doctor;
pub mod error;
pub mod forward;
pub mod http;
pub mod input;
pub mod isolate;
pub mod latency;
pub mod merge;
pub mod metrics;
pub mod nic;
pub mod report;
pub mod rfc2544;
pub mod rings;
pub mod route;
pub mod rss;
pub mod schema;
pub mod serve;
pub mod shard;
pub mod sink;
pub mod top;
pub mod verify;

pub(crate) use error::seconds;
pub use error::{Cause, ErrorKind, ToolError};
pub use report::{hgrm, ns_per, Latency, PmuCost, WorkerError};
