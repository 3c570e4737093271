//! One measuring thread: pinned to its CPU, at its priority, waking on an absolute clock every
//! interval and recording how late each wake-up came.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use flowlane_io::os;
use flowlane_runtime::latency::Publisher;
use flowlane_runtime::{bump, counters, WorkerCounters};
use hdrhistogram::Histogram;

counters! {
    /// What a measuring thread counts.
    pub struct WakeStats => WakeSnapshot {
        /// Wake-ups measured.
        wakeups,
        /// Their latencies added up, nanoseconds.
        latency_ns,
        /// Wake-ups later than the threshold.
        over_threshold,
        /// Periods skipped because a wake-up came after the next one was due.
        overruns,
    }
}

/// The smallest and largest latency since the last status line (swapped out by the reader).
#[derive(Debug)]
pub struct Extremes {
    /// Smallest, nanoseconds (`u64::MAX`: none yet).
    pub min_ns: AtomicU64,
    /// Largest, nanoseconds.
    pub max_ns: AtomicU64,
}

impl Default for Extremes {
    fn default() -> Extremes {
        Extremes {
            min_ns: AtomicU64::new(u64::MAX),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl Extremes {
    /// Takes the interval's (min, max) and starts a new interval (`None`: nothing measured).
    pub fn take(&self) -> Option<(u64, u64)> {
        let min = self.min_ns.swap(u64::MAX, Ordering::Relaxed);
        let max = self.max_ns.swap(0, Ordering::Relaxed);
        (min != u64::MAX).then_some((min, max))
    }
}

/// One thread's task.
#[derive(Debug, Clone)]
pub struct WakeJob {
    /// The CPU it is pinned to.
    pub cpu: usize,
    /// Its wake-up interval, nanoseconds.
    pub interval_ns: u64,
    /// Its first wake-up is due at this CLOCK_MONOTONIC time.
    pub first_ns: u64,
    /// It stops at this CLOCK_MONOTONIC time (`None`: at `loops` or a stop).
    pub deadline_ns: Option<u64>,
    /// Wake-ups to measure (`None`: until the deadline or a stop).
    pub loops: Option<u64>,
    /// SCHED_FIFO priority (0: SCHED_OTHER).
    pub priority: i32,
    /// A wake-up later than this counts as over the threshold, nanoseconds.
    pub threshold_ns: u64,
    /// Join this cgroup `tasks` file (the thread alone) before anything else: the isolated
    /// cpuset, leaving the process's other threads (a load's) where they are.
    pub join_tasks: Option<std::path::PathBuf>,
}

/// What a thread hands back.
#[derive(Debug)]
pub struct WakeResult {
    /// Every latency, nanoseconds.
    pub histogram: Histogram<u64>,
    /// The policy it ran under: `Ok(priority)` when it got SCHED_FIFO, or why not.
    pub realtime: Result<i32, String>,
}

/// A histogram of 1 ns to 60 s at three significant digits, made whole before the first
/// wake-up (no allocation while measuring).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3)
        .unwrap_or_else(|_| unreachable!("constant, valid bounds"))
}

/// Measures until the deadline, the loop count or `stop`.
pub fn measure(
    job: &WakeJob,
    stop: &AtomicBool,
    st: &WorkerCounters<WakeStats>,
    ext: &Extremes,
    mut publisher: Publisher,
) -> Result<WakeResult, String> {
    if let Some(t) = &job.join_tasks {
        std::fs::write(t, os::thread_id().to_string())
            .map_err(|e| format!("join {}: {e}", t.display()))?;
    }
    os::pin_current_thread(job.cpu).map_err(|e| format!("CPU {}: {e}", job.cpu))?;
    let realtime = if job.priority > 0 {
        os::set_fifo_priority(job.priority)
            .map(|()| job.priority)
            .map_err(|e| e.to_string())
    } else {
        Err("asked for SCHED_OTHER (--priority 0)".into())
    };
    if realtime.is_err() {
        // Under SCHED_OTHER the default 50 µs timer slack would add itself to every
        // wake-up; a real-time thread has none.
        let _ = os::set_timer_slack_ns(1);
    }
    let mut h = new_histogram();
    let interval = job.interval_ns.max(1);
    let mut next = job.first_ns;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed)
        && job.loops.is_none_or(|l| n < l)
        && job.deadline_ns.is_none_or(|d| next <= d)
    {
        os::sleep_until_ns(next);
        let now = os::monotonic_ns();
        let late = now.saturating_sub(next);
        let _ = h.record(late.max(1));
        n += 1;
        bump(&st.role.wakeups, 1);
        bump(&st.role.latency_ns, late);
        if late > job.threshold_ns {
            bump(&st.role.over_threshold, 1);
        }
        ext.min_ns.fetch_min(late, Ordering::Relaxed);
        ext.max_ns.fetch_max(late, Ordering::Relaxed);
        next += interval;
        if next <= now {
            // Woken after the next period was due: those periods are skipped, not measured
            // back to back (cyclictest's absolute mode does the same). Only periods due
            // before the deadline count: the run ends there.
            let skipped = (now - next) / interval + 1;
            let counted = match job.deadline_ns {
                Some(d) if next <= d => skipped.min((d - next) / interval + 1),
                Some(_) => 0,
                None => skipped,
            };
            bump(&st.role.overruns, counted);
            next += skipped * interval;
        }
        publisher.offer(now, false, &h);
    }
    publisher.offer(os::monotonic_ns(), true, &h);
    if realtime.is_ok() {
        let _ = os::set_fifo_priority(0);
    }
    Ok(WakeResult {
        histogram: h,
        realtime,
    })
}

/// Shared handles of one thread, for the status lines and `--metrics`.
#[derive(Debug, Default, Clone)]
pub struct WakeHandles {
    /// Its counters.
    pub stats: Arc<WorkerCounters<WakeStats>>,
    /// Its interval's extremes.
    pub extremes: Arc<Extremes>,
}
