//! What every long-running command shares: durations from the command line, stop signals, and
//! where live lines go.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::anyhow;

use crate::Failure;

/// The exit code of a run interrupted before its job was done (what it measured is printed,
/// marked interrupted): 128 + SIGINT, as a shell reports a command SIGINT ended.
pub const INTERRUPTED: u8 = 130;

/// SIGINT/SIGTERM (and a failed write to standard output) set `stop`. A second signal more
/// than half a second after the first ends the process at once (exit 130, no summary), for a
/// run that does not come to an end by itself; two within half a second are one request —
/// `timeout -s INT` signals the command and then its own process group, so the command gets
/// two at once, and the second ended it with an empty standard output.
pub fn stop_on_signals(stop: &Arc<AtomicBool>) -> Result<(), Failure> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    // A failed write to standard output stops the run as Ctrl-C does.
    crate::out::stop_on_failure(stop);
    let failed =
        |e: std::io::Error| Failure::runtime(anyhow!("cannot install signal handler: {e}"));
    for sig in [SIGINT, SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(failed)?;
    }
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(failed)?;
    std::thread::Builder::new()
        .name("flowlane-signals".into())
        .spawn(move || {
            let mut first: Option<std::time::Instant> = None;
            for _ in signals.forever() {
                match first {
                    None => first = Some(std::time::Instant::now()),
                    Some(t) if t.elapsed() > std::time::Duration::from_millis(500) => {
                        errln!("flowlane: interrupted again: ending now, without the summary");
                        std::process::exit(i32::from(INTERRUPTED));
                    }
                    Some(_) => {}
                }
            }
        })
        .map_err(failed)?;
    Ok(())
}

/// The flags of every command with live status lines: how often, none, or JSON at the end.
#[derive(Debug, clap::Args)]
pub struct LiveArgs {
    /// Seconds between status lines.
    #[arg(long, short = 'i', value_parser = crate::args::parse_duration, default_value_t = 1.0)]
    pub interval: f64,

    /// No status lines.
    #[arg(long)]
    pub quiet: bool,

    /// Final summary as JSON on stdout (status lines go to stderr).
    #[arg(long, short = 'J', conflicts_with = "json_stream")]
    pub json: bool,

    /// Newline-delimited JSON on stdout: `{"interval": …}` each interval, then
    /// `{"final": …}` holding the same report --json prints (status lines go to stderr).
    #[arg(long)]
    pub json_stream: bool,

    /// Serve the workers' counters in the OpenMetrics text format (Prometheus) at ADDR while
    /// running, e.g. 127.0.0.1:9464: `flowlane_<role>_<counter>_total{worker,cpu}`.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
}

impl LiveArgs {
    /// Where live lines go: stderr when stdout carries JSON.
    pub fn log(&self) -> Log {
        Log::new(self.json || self.json_stream)
    }

    /// The stream, on or off.
    pub fn stream(&self) -> JsonStream {
        JsonStream {
            on: self.json_stream,
        }
    }
}

/// `--json-stream`: one typed record per line.
#[derive(Debug, Clone, Copy)]
pub struct JsonStream {
    on: bool,
}

/// A line of the stream.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Record<'a, T: serde::Serialize, R: serde::Serialize> {
    Interval(&'a T),
    Final(&'a R),
}

impl JsonStream {
    /// A stream, written when `on`.
    pub fn new(on: bool) -> JsonStream {
        JsonStream { on }
    }

    /// Whether it is on.
    pub fn on(&self) -> bool {
        self.on
    }

    /// One interval's record.
    pub fn interval<T: serde::Serialize>(&self, t: &T) {
        if self.on {
            if let Ok(s) = serde_json::to_string(&Record::<T, ()>::Interval(t)) {
                outln!("{s}");
            }
        }
    }

    /// The last record: the final report.
    pub fn last<R: serde::Serialize>(&self, r: &R) -> Result<(), Failure> {
        if self.on {
            let s = serde_json::to_string(&Record::<(), R>::Final(r))
                .map_err(|e| Failure::runtime(anyhow!("cannot write the report as JSON: {e}")))?;
            outln!("{s}");
        }
        Ok(())
    }
}

/// Live lines go to stdout, or to stderr when stdout carries JSON.
#[derive(Debug)]
pub struct Log {
    to_stderr: bool,
}

impl Log {
    pub fn new(json: bool) -> Log {
        Log { to_stderr: json }
    }

    pub fn line(&mut self, s: &str) {
        if self.to_stderr {
            errln!("{s}");
        } else {
            outln!("{s}");
        }
    }
}

/// `LABEL µs: p50 …  p90 …  p99 …  p99.9 …  max …` (`None` when nothing was measured).
pub fn latency_line(l: Option<&flowlane_tools::Latency>, label: &str) -> Option<String> {
    let l = l?;
    let us = |ns: u64| ns as f64 / 1e3;
    Some(format!(
        "{label} µs: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        us(l.p50),
        us(l.p90),
        us(l.p99),
        us(l.p999),
        us(l.max)
    ))
}

/// `--histogram FILE`: the whole latency distribution in HdrHistogram's `.hgrm` text.
pub fn write_histogram(
    path: Option<&std::path::Path>,
    h: Option<&hdrhistogram::Histogram<u64>>,
) -> Result<(), Failure> {
    let Some(path) = path else { return Ok(()) };
    let mut w = crate::side::Writes::default();
    match h {
        // `.hlog`: HdrHistogram's log format, the compressed interchange form that its Java,
        // C, Go and Python readers load losslessly; anything else: the percentile text.
        Some(h) if path.extension().is_some_and(|e| e == "hlog") => {
            w.write("--histogram", path, flowlane_tools::report::hlog(h))
        }
        Some(h) => w.write("--histogram", path, flowlane_tools::hgrm(h)),
        None => w.nothing(
            "--histogram",
            path,
            "no latency was measured, nothing to hold",
        ),
    }
    w.done()
}

/// Says which workers stopped on an error; exit 1 if any did, else 0.
pub fn workers_exit(errors: &[flowlane_tools::WorkerError]) -> std::process::ExitCode {
    for e in errors {
        errln!("flowlane: worker {} stopped: {}", e.worker, e.error);
    }
    if errors.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    }
}

/// `cost: … ns of worker CPU per packet; cycles …` or why the cycles are not known.
pub fn pmu_line(what: &str, p: &flowlane_tools::PmuCost) -> String {
    match &p.unavailable {
        Some(why) => format!("hardware counters per {what}: unavailable — {why}"),
        None => format!(
            "hardware counters per {what}: {} cycles, {} instructions (IPC {}), {} LLC misses",
            p.cycles_per_packet
                .map_or("-".into(), |v| format!("{v:.0}")),
            p.instructions_per_packet
                .map_or("-".into(), |v| format!("{v:.0}")),
            p.ipc.map_or("-".into(), |v| format!("{v:.2}")),
            p.llc_misses_per_packet
                .map_or("-".into(), |v| format!("{v:.2}")),
        ),
    }
}
