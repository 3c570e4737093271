//! `--shard`, `--shards` and `--start-at`: the flags of every command a sharded run cuts.

use flowlane_tools::shard::{parse_start_at, Shard, Sharding, INDEX_VAR};

use crate::Failure;

/// How a run is cut into shards and when its traffic starts.
#[derive(Debug, Default, clap::Args)]
pub struct ShardArgs {
    /// Run shard I of N (0-based, e.g. 2/8), so N shards together do what one run with the
    /// same flags would, and `flowlane merge` joins their reports into one. blast: its part of
    /// the flows, each at its share of the count and rate; http load: its part of each pool's
    /// connections, rate and source addresses; sink: the receive queues whose recorded
    /// mapping is I mod N; serve: its part of --cpus (the shards share the host's port, shard
    /// I binding after the earlier ones, so steering covers the whole list; servers on hosts
    /// of their own need no --shard).
    #[arg(long, value_name = "I/N", value_parser = parse_shard, conflicts_with = "shards",
          help_heading = "Sharded runs")]
    pub shard: Option<Shard>,

    /// N shards in all, this one's index read from JOB_COMPLETION_INDEX (what a Kubernetes
    /// Indexed Job sets in each pod).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536),
          help_heading = "Sharded runs")]
    pub shards: Option<u32>,

    /// Start the traffic at this wall-clock time, RFC 3339 in UTC (2026-11-29T08:00:00Z) or
    /// @SECONDS since the epoch, so every shard starts together (as together as NTP or PTP
    /// keeps the hosts' clocks: the report records the clock's error bounds). A start more
    /// than 0.5 s past is refused.
    #[arg(long, value_name = "TIME", value_parser = parse_start, help_heading = "Sharded runs")]
    pub start_at: Option<u64>,
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    Shard::parse(s).map_err(|e| e.to_string())
}

fn parse_start(s: &str) -> Result<u64, String> {
    parse_start_at(s).map_err(|e| e.to_string())
}

impl ShardArgs {
    /// The run's shard and start, `--shards` reading the index from the environment.
    pub fn sharding(&self) -> Result<Sharding, Failure> {
        let shard = match (self.shard, self.shards) {
            (Some(s), _) => s,
            (None, Some(n)) => {
                let v = std::env::var(INDEX_VAR).ok();
                Shard::from_index_var(v.as_deref(), n).map_err(Failure::from_tool)?
            }
            (None, None) => Shard::WHOLE,
        };
        Ok(Sharding {
            shard,
            start_at_ns: self.start_at,
        })
    }
}
