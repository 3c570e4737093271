//! Sharded runs: shard I of N takes a disjoint part of a run's work (flows, connections,
//! receive queues) and 1/N of its rate, so N shards together do what one run with the same
//! flags would; a wall-clock start (`--start-at`) begins every shard's traffic together. No
//! coordinator: a Kubernetes Indexed Job gives each pod its index (`JOB_COMPLETION_INDEX`),
//! and `merge` joins the reports afterwards.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::ToolError;

/// The environment variable a Kubernetes Indexed Job sets in each pod (stable since 1.24).
pub const INDEX_VAR: &str = "JOB_COMPLETION_INDEX";

/// The most shards a run may be cut into.
pub const MAX_SHARDS: u32 = 65_536;

/// Shard `index` of `count` (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Shard {
    /// This shard, 0 to `count` − 1.
    pub index: u32,
    /// How many shards the run has.
    pub count: u32,
}

impl Shard {
    /// The whole run (shard 0 of 1).
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// `I/N`, as `--shard` takes it.
    pub fn parse(s: &str) -> Result<Shard, ToolError> {
        let bad = || {
            ToolError::usage(format!(
                "--shard takes I/N (shard I of N, I from 0 to N-1, e.g. 0/4), not {s:?}"
            ))
        };
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        Shard::new(index, count)
    }

    /// Shard `index` of `count`, checked.
    pub fn new(index: u32, count: u32) -> Result<Shard, ToolError> {
        if count == 0 || count > MAX_SHARDS {
            return Err(ToolError::usage(format!(
                "a run has 1 to {MAX_SHARDS} shards, not {count}"
            )));
        }
        if index >= count {
            return Err(ToolError::usage(format!(
                "shard {index} of {count}: the index runs from 0 to {}",
                count - 1
            )));
        }
        Ok(Shard { index, count })
    }

    /// `--shards N` with the index from [`INDEX_VAR`] (`value`: the variable, if set).
    pub fn from_index_var(value: Option<&str>, count: u32) -> Result<Shard, ToolError> {
        let v = value.ok_or_else(|| {
            ToolError::usage(format!(
                "--shards {count} takes this shard's index from {INDEX_VAR} (an Indexed Job \
                 sets it), which is not set: give --shard I/{count} instead"
            ))
        })?;
        let index = v.trim().parse().map_err(|_| {
            ToolError::usage(format!("{INDEX_VAR}={v:?} is not a shard index (0, 1, …)"))
        })?;
        Shard::new(index, count)
    }

    /// Whether this is the whole run.
    pub fn whole(&self) -> bool {
        self.count == 1
    }

    /// This shard's contiguous part of `len` items: `[len·i/N, len·(i+1)/N)`. The parts of
    /// all shards cover `0..len` once, in order, and differ in length by at most one.
    pub fn part(&self, len: usize) -> Range<usize> {
        let at = |i: u32| (len as u128 * u128::from(i) / u128::from(self.count)) as usize;
        at(self.index)..at(self.index + 1)
    }

    /// This shard's share of `total` (the parts of all shards add up to it exactly).
    pub fn share(&self, total: u64) -> u64 {
        let at = |i: u32| (u128::from(total) * u128::from(i) / u128::from(self.count)) as u64;
        at(self.index + 1) - at(self.index)
    }

    /// The shard's items of `items` (its [`Shard::part`]), refused when it would get none.
    pub fn take<'a, T>(&self, items: &'a [T], what: &str) -> Result<&'a [T], ToolError> {
        let r = self.part(items.len());
        if r.is_empty() {
            return Err(ToolError::usage(format!(
                "shard {}/{} gets none of the run's {} {what}: give at least as many {what} \
                 as shards",
                self.index,
                self.count,
                items.len()
            )));
        }
        Ok(&items[r])
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// A start time on the wall clock: RFC 3339 (`2026-11-29T08:00:00Z`, fractions allowed,
/// UTC) or `@SECONDS` since the Unix epoch; nanoseconds since the epoch.
pub fn parse_start_at(s: &str) -> Result<u64, ToolError> {
    let bad = |why: String| {
        ToolError::usage(format!(
            "--start-at takes a wall-clock time, RFC 3339 in UTC (2026-11-29T08:00:00Z) or \
             @SECONDS since the epoch (@1795939200.5): {why}"
        ))
    };
    if let Some(secs) = s.strip_prefix('@') {
        let v: f64 = secs
            .parse()
            .map_err(|_| bad(format!("{secs:?} is not a number")))?;
        if !v.is_finite() || !(0.0..=4.0e9).contains(&v) {
            return Err(bad(format!("{v} is out of range")));
        }
        return Ok((v * 1e9).round() as u64);
    }
    let t = humantime::parse_rfc3339(s).map_err(|e| bad(format!("{s:?}: {e}")))?;
    let d = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| bad(format!("{s:?} is before 1970")))?;
    u64::try_from(d.as_nanos()).map_err(|_| bad(format!("{s:?} is too far away")))
}

/// RFC 3339 with nanoseconds, UTC.
pub fn rfc3339(unix_ns: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(unix_ns);
    humantime::format_rfc3339_nanos(t).to_string()
}

/// The clock a run's start was taken from, and what the kernel said of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClockReport {
    /// `CLOCK_REALTIME`: the wall clock, the one every host agrees on through NTP or PTP.
    pub source: String,
    /// A time daemon keeps it synchronized (the kernel's `STA_UNSYNC` is clear).
    pub synchronized: Option<bool>,
    /// The kernel's maximum error of the clock, microseconds (`adjtimex`).
    pub max_error_us: Option<i64>,
    /// Its estimated error, microseconds.
    pub est_error_us: Option<i64>,
}

impl ClockReport {
    /// The wall clock as the kernel describes it now.
    pub fn now() -> ClockReport {
        let c = flowlane_io::os::wall_clock().ok();
        ClockReport {
            source: "CLOCK_REALTIME".into(),
            synchronized: c.map(|c| c.synchronized),
            max_error_us: c.map(|c| c.max_error_us),
            est_error_us: c.map(|c| c.est_error_us),
        }
    }
}

/// What a report records of its place in a sharded run and of its start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShardReport {
    /// This report's shard (0/1 for a run that was not cut).
    pub shard: Shard,
    /// The wall-clock start asked for (`--start-at`), RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<String>,
    /// When its traffic started, RFC 3339 (the wall clock).
    pub started: String,
    /// The same, nanoseconds since the Unix epoch.
    pub started_unix_ns: u64,
    /// How long after the asked start it began, microseconds (the wake-up's lateness).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_us: Option<f64>,
    /// The clock used.
    pub clock: ClockReport,
}

/// How a run is cut and started: the shard and the wall-clock start, from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharding {
    /// This run's shard.
    pub shard: Shard,
    /// Start the traffic at this wall-clock time (ns since the epoch).
    pub start_at_ns: Option<u64>,
}

impl Default for Sharding {
    fn default() -> Sharding {
        Sharding {
            shard: Shard::WHOLE,
            start_at_ns: None,
        }
    }
}

/// The longest a run waits for its `--start-at`: a day. A start further off is a mistake.
pub const MAX_WAIT_S: u64 = 86_400;

/// A start this much past is still a start together: the shards' pods are scheduled within
/// it of each other, and the report says how late each began.
pub const MAX_LATE_NS: u64 = 500_000_000;

impl Sharding {
    /// Whether anything was asked (a shard or a start time): then reports carry a
    /// [`ShardReport`].
    pub fn asked(&self) -> bool {
        !self.shard.whole() || self.start_at_ns.is_some()
    }

    /// Refuses a start that is too far off or already past, before anything is set up.
    pub fn check(&self) -> Result<(), ToolError> {
        let Some(at) = self.start_at_ns else {
            return Ok(());
        };
        let now = flowlane_io::os::realtime_ns();
        if at > now + MAX_WAIT_S * 1_000_000_000 {
            return Err(ToolError::usage(format!(
                "--start-at {} is more than a day away",
                rfc3339(at)
            )));
        }
        self.late(now)
    }

    fn late(&self, now: u64) -> Result<(), ToolError> {
        match self.start_at_ns {
            Some(at) if now > at + MAX_LATE_NS => Err(ToolError::usage(format!(
                "--start-at {} passed {:.1} s ago: a shard this late would not run with the \
                 others; give a later start (the wall clock here reads {})",
                rfc3339(at),
                (now - at) as f64 / 1e9,
                rfc3339(now)
            ))),
            _ => Ok(()),
        }
    }

    /// Waits for the start (if one was asked), a stop request ending the wait; then the
    /// report of the start. `Ok(None)`: stopped before the start.
    pub fn start(&self, stop: &AtomicBool) -> Result<Option<ShardReport>, ToolError> {
        if let Some(at) = self.start_at_ns {
            // Slices of 100 ms, so Ctrl-C ends the wait; the last one wakes at the time.
            while !flowlane_io::os::sleep_until_realtime_ns(at, 100_000_000) {
                if stop.load(Ordering::Relaxed) {
                    return Ok(None);
                }
            }
            self.late(flowlane_io::os::realtime_ns())?;
        }
        let now = flowlane_io::os::realtime_ns();
        Ok(Some(ShardReport {
            shard: self.shard,
            start_at: self.start_at_ns.map(rfc3339),
            started: rfc3339(now),
            started_unix_ns: now,
            late_us: self
                .start_at_ns
                .map(|at| (now.saturating_sub(at) as f64 / 100.0).round() / 10.0),
            clock: ClockReport::now(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_items_once_and_shares_add_up() {
        for n in 1..=9u32 {
            for len in [0usize, 1, 5, 8, 9, 100, 65_536] {
                let mut next = 0;
                let mut sum = 0;
                for i in 0..n {
                    let s = Shard::new(i, n).expect("shard");
                    let r = s.part(len);
                    assert_eq!(r.start, next, "contiguous");
                    assert!(r.len() <= len / n as usize + 1);
                    next = r.end;
                    sum += s.share(len as u64 * 7 + 3);
                }
                assert_eq!(next, len);
                assert_eq!(sum, len as u64 * 7 + 3);
            }
        }
    }

    #[test]
    fn shards_parse_and_refuse_what_makes_no_sense() {
        assert_eq!(
            Shard::parse("2/4").expect("ok"),
            Shard { index: 2, count: 4 }
        );
        for bad in ["4/4", "1/0", "x/2", "1", "-1/2", "1/2/3", ""] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Shard::from_index_var(Some("3"), 5).expect("ok"),
            Shard { index: 3, count: 5 }
        );
        assert!(Shard::from_index_var(None, 5).is_err());
        assert!(Shard::from_index_var(Some("5"), 5).is_err());
        let none: [u8; 2] = [1, 2];
        assert!(Shard::new(0, 3).expect("ok").take(&none, "flows").is_err());
        assert_eq!(
            Shard::new(2, 3).expect("ok").take(&none, "flows").ok(),
            Some(&none[1..])
        );
    }

    #[test]
    fn start_times_read_both_ways() {
        let a = parse_start_at("2026-11-29T08:00:00.5Z").expect("rfc3339");
        let b = parse_start_at("@1795939200.5").expect("epoch");
        assert_eq!(a, b);
        assert_eq!(rfc3339(a), "2026-11-29T08:00:00.500000000Z");
        for bad in ["tomorrow", "@x", "@-1", "2026-13-01T00:00:00Z"] {
            assert!(parse_start_at(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_start_waits_for_its_time_and_a_late_one_is_refused() {
        let stop = AtomicBool::new(false);
        let at = flowlane_io::os::realtime_ns() + 50_000_000;
        let s = Sharding {
            shard: Shard::new(1, 2).expect("shard"),
            start_at_ns: Some(at),
        };
        s.check().expect("in the future");
        let r = s.start(&stop).expect("started").expect("not stopped");
        assert!(r.started_unix_ns >= at);
        assert_eq!(r.clock.source, "CLOCK_REALTIME");
        let past = Sharding {
            start_at_ns: Some(at - 10_000_000_000),
            ..s
        };
        assert!(past.check().is_err());
        // A stop ends the wait.
        stop.store(true, Ordering::Relaxed);
        let far = Sharding {
            start_at_ns: Some(flowlane_io::os::realtime_ns() + 60_000_000_000),
            ..s
        };
        assert_eq!(far.start(&stop).expect("no error"), None);
    }
}
