//! `flowlane` — RSS-aware packet I/O and network testing.
//!
//! Layer: command line only. Each subcommand module parses its arguments, wires library pieces
//! together and prints; all logic lives in the library crates.
//!
//! Exit codes: 0 ok, 1 runtime failure (the job could not be done as asked), 2 bad usage.

#![forbid(unsafe_code)]

#[macro_use]
mod out;
mod args;
mod cmd_bench;
mod cmd_blast;
mod cmd_completions;
mod cmd_doctor;
mod cmd_forward;
mod cmd_hash;
mod cmd_http;
mod cmd_isolate;
mod cmd_lab;
mod cmd_latency;
mod cmd_merge;
mod cmd_pick;
mod cmd_rfc2544;
mod cmd_route;
mod cmd_rss;
mod cmd_serve;
mod cmd_sink;
mod cmd_top;
mod host;
mod live;
mod report;
mod shard;
mod side;

use std::process::ExitCode;

/// Allocations of 2 MiB and more (lookup tables, packet and address buffers) go on huge
/// pages, as DPDK's do: without that, random lookups over megabytes miss the TLB, and
/// flowlane's figures would not compare with those measured so (docs/benchmarks-history.md).
#[global_allocator]
static ALLOC: flowlane_io::huge::HugeAlloc = flowlane_io::huge::HugeAlloc;

use clap::{Parser, Subcommand};

/// flowlane: does this host scale per core, how many packets per second does each stage carry,
/// and where do packets go missing?
///
/// Start with the RSS engine: `flowlane rss show` explains a key and an indirection table,
/// `flowlane hash` computes where a flow lands, `flowlane pick` chooses flows that land on the
/// queues you want.
#[derive(Debug, Parser)]
#[command(
    name = "flowlane",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Hash(cmd_hash::HashArgs),
    Pick(cmd_pick::PickArgs),
    #[command(subcommand)]
    Rss(cmd_rss::RssCommand),
    Top(cmd_top::TopArgs),
    Latency(cmd_latency::LatencyArgs),
    Isolate(cmd_isolate::IsolateArgs),
    Doctor(cmd_doctor::DoctorArgs),
    Serve(cmd_serve::ServeArgs),
    Blast(Box<cmd_blast::BlastArgs>),
    Sink(cmd_sink::SinkArgs),
    Forward(cmd_forward::ForwardArgs),
    Rfc2544(Box<cmd_rfc2544::Rfc2544Args>),
    #[command(subcommand)]
    Http(cmd_http::HttpCommand),
    Bench(Box<cmd_bench::BenchArgs>),
    Merge(cmd_merge::MergeArgs),
    #[command(subcommand)]
    Lab(cmd_lab::LabCommand),
    #[command(subcommand)]
    Route(cmd_route::RouteCommand),
    Completions(cmd_completions::CompletionsArgs),
    Man(cmd_completions::ManArgs),
}

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    code: u8,
    err: anyhow::Error,
}

impl Failure {
    /// Bad usage: the user can fix the command line (exit 2).
    pub fn usage(err: impl Into<anyhow::Error>) -> Failure {
        Failure {
            code: 2,
            err: err.into(),
        }
    }

    /// The job could not be done (exit 1).
    pub fn runtime(err: impl Into<anyhow::Error>) -> Failure {
        Failure {
            code: 1,
            err: err.into(),
        }
    }

    /// A role's error, with the exit code its kind maps to: usage and privilege 2 (the
    /// command line can fix it), runtime 1.
    pub fn from_tool(e: flowlane_tools::ToolError) -> Failure {
        let code = match e.kind {
            flowlane_tools::ErrorKind::Usage | flowlane_tools::ErrorKind::Privilege => 2,
            flowlane_tools::ErrorKind::Runtime => 1,
        };
        Failure {
            code,
            err: anyhow::anyhow!(e.message),
        }
    }
}

/// What a subcommand returns.
pub type CmdResult = Result<ExitCode, Failure>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Hash(a) => cmd_hash::run(a),
        Command::Pick(a) => cmd_pick::run(a),
        Command::Rss(c) => cmd_rss::run(c),
        Command::Top(a) => cmd_top::run(a),
        Command::Latency(a) => cmd_latency::run(a),
        Command::Isolate(a) => cmd_isolate::run(a),
        Command::Doctor(a) => cmd_doctor::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Blast(a) => cmd_blast::run(*a),
        Command::Sink(a) => cmd_sink::run(a),
        Command::Forward(a) => cmd_forward::run(a),
        Command::Rfc2544(a) => cmd_rfc2544::run(*a),
        Command::Http(c) => cmd_http::run(c),
        Command::Bench(a) => cmd_bench::run(*a),
        Command::Merge(a) => cmd_merge::run(a),
        Command::Lab(c) => cmd_lab::run(c),
        Command::Route(c) => cmd_route::run(c),
        Command::Completions(a) => cmd_completions::completions(a),
        Command::Man(a) => cmd_completions::man(a),
    };
    let code = match result {
        Ok(code) => code,
        Err(f) => {
            errln!("flowlane: error: {:#}", f.err);
            ExitCode::from(f.code)
        }
    };
    match out::finish() {
        // What was asked for did not reach standard output: the run failed, whatever it
        // measured (the clean-up ran; a stop was asked on the first failed write).
        Some(e) => {
            errln!("flowlane: error: writing standard output: {e}");
            ExitCode::from(1)
        }
        None => code,
    }
}
