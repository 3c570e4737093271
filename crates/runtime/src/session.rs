//! One skeleton for every long-running role: the control thread's part between [`Runtime::go`]
//! and [`Runtime::join`] — open the gate, tick every interval with the workers' counters, stop
//! by the [`StopRule`], join, and hand back the final counters. serve, blast and sink each had
//! their own copy of this loop; now they have this one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::counters::{sum, Counters, Snapshot, WorkerSnapshot};
use crate::Runtime;

/// When a session ends, besides every worker having finished (or one having failed, which
/// stops them all).
#[derive(Debug, Clone)]
pub struct StopRule {
    /// A stop request from outside (Ctrl-C, a caller): ends the session at the next check.
    pub external: Arc<AtomicBool>,
    /// How long the session may run, from `go`.
    pub deadline: Option<Duration>,
}

/// The counters at one status tick.
#[derive(Debug, Clone, Copy)]
pub struct Tick<'a, T> {
    /// Since `go`.
    pub elapsed: Duration,
    /// Since the last tick (or `go`).
    pub interval: Duration,
    /// Each worker's counters over the interval.
    pub deltas: &'a [WorkerSnapshot<T>],
    /// Each worker's counters since the start.
    pub totals: &'a [WorkerSnapshot<T>],
}

impl<T: Snapshot> Tick<'_, T> {
    /// All workers' counters over the interval.
    pub fn delta(&self) -> WorkerSnapshot<T> {
        sum(self.deltas)
    }

    /// All workers' counters since the start.
    pub fn total(&self) -> WorkerSnapshot<T> {
        sum(self.totals)
    }
}

/// How a session ended.
#[derive(Debug, Clone)]
pub struct SessionEnd<T, R = ()> {
    /// From `go` to the end of the last worker's loop.
    pub elapsed: Duration,
    /// Each worker's final counters.
    pub finals: Vec<WorkerSnapshot<T>>,
    /// Errors workers stopped on: (worker index, message).
    pub errors: Vec<(usize, crate::WorkerError)>,
    /// Each worker's report, in worker order (`None`: it made none, or its thread died).
    pub reports: Vec<Option<R>>,
}

impl<T: Snapshot, R> SessionEnd<T, R> {
    /// All workers' final counters.
    pub fn total(&self) -> WorkerSnapshot<T> {
        sum(&self.finals)
    }
}

/// How often the control thread looks at the rule and the clock.
const CHECK: Duration = Duration::from_millis(10);

impl<S: Counters, R> Runtime<S, R> {
    /// Runs the session: lets the workers go, calls `on_tick` every `interval` (not at all
    /// when `interval` is `None`), and ends when every worker has finished, a worker failed,
    /// the stop rule holds, or the deadline has passed; then joins the workers and calls
    /// `on_tick` once more for what is left since the last tick (a shorter interval), so the
    /// ticks add up to the final counters.
    pub fn session(
        &mut self,
        interval: Option<Duration>,
        rule: &StopRule,
        on_tick: &mut dyn FnMut(&Tick<'_, S::Snapshot>),
    ) -> SessionEnd<S::Snapshot, R> {
        type Snaps<T> = Vec<WorkerSnapshot<T>>;
        let snap = |rt: &Runtime<S, R>| -> Snaps<S::Snapshot> {
            rt.stats().iter().map(|s| s.snapshot()).collect()
        };
        let since = |cur: &Snaps<S::Snapshot>, prev: &Snaps<S::Snapshot>| -> Snaps<S::Snapshot> {
            cur.iter().zip(prev).map(|(c, p)| c.since(p)).collect()
        };
        self.go();
        let start = Instant::now();
        let deadline = rule.deadline.and_then(|d| start.checked_add(d));
        // From zero, not from a first look: what the workers count between `go` and that look
        // would be in no tick (the ticks would not add up to the final counters).
        let mut prev: Snaps<S::Snapshot> = vec![WorkerSnapshot::default(); self.stats().len()];
        let mut prev_t = start;
        let mut next = interval.map(|i| start + i);
        loop {
            let now = Instant::now();
            if rule.external.load(Ordering::Relaxed)
                || self.stopping()
                || self.finished()
                || deadline.is_some_and(|d| now >= d)
            {
                break;
            }
            if let (Some(n), Some(i)) = (next, interval) {
                if now >= n {
                    let cur = snap(self);
                    let deltas = since(&cur, &prev);
                    on_tick(&Tick {
                        elapsed: now.duration_since(start),
                        interval: now.duration_since(prev_t),
                        deltas: &deltas,
                        totals: &cur,
                    });
                    prev = cur;
                    prev_t = now;
                    next = Some(n + i);
                }
            }
            std::thread::sleep(CHECK);
        }
        self.join();
        let finals = snap(self);
        let elapsed = start.elapsed();
        if interval.is_some() {
            let deltas = since(&finals, &prev);
            on_tick(&Tick {
                elapsed,
                interval: elapsed.saturating_sub(prev_t.duration_since(start)),
                deltas: &deltas,
                totals: &finals,
            });
        }
        SessionEnd {
            elapsed,
            finals,
            errors: self.errors(),
            reports: self.take_reports(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bump, counters, Config, Poll};

    /// Counts `n` packets, one per poll, then is done.
    struct Counter(u64);

    counters! {
        /// What [`Counter`] counts.
        struct CounterStats => CounterSnap {
            /// "Packets" handled.
            rx_packets,
        }
    }

    impl Poll for Counter {
        type Stats = CounterStats;
        type Report = ();
        fn poll(&mut self, _budget: usize, st: &CounterStats) -> Result<usize, crate::WorkerError> {
            if self.0 == 0 {
                return Ok(0);
            }
            self.0 -= 1;
            bump(&st.rx_packets, 1);
            std::thread::sleep(Duration::from_micros(200));
            Ok(1)
        }
        fn wait(&mut self, _ms: i32) -> Result<(), crate::WorkerError> {
            Ok(())
        }
        fn done(&self) -> bool {
            self.0 == 0
        }
    }

    fn start(n: u64) -> Runtime<CounterStats> {
        let cpu = flowlane_io::os::current_cpu().unwrap_or(0);
        Runtime::start(
            &Config {
                cpus: vec![cpu],
                budget: 1,
                wait_ms: 1,
                busy_poll: std::time::Duration::ZERO,
                own_files: false,
            },
            Arc::new(AtomicBool::new(false)),
            move |_, _| Ok::<_, String>(Counter(n)),
        )
        .expect("starts")
    }

    #[test]
    fn a_session_ends_when_its_workers_are_done_and_ticks_add_up() {
        let mut rt = start(500);
        let rule = StopRule {
            external: Arc::new(AtomicBool::new(false)),
            deadline: Some(Duration::from_secs(30)),
        };
        let mut ticked = 0;
        let end = rt.session(Some(Duration::from_millis(20)), &rule, &mut |t| {
            ticked += t.delta().role.rx_packets;
            assert!(t.total().role.rx_packets >= ticked);
        });
        assert_eq!(end.total().role.rx_packets, 500);
        // The last tick (after the workers ended) brings the rest: the ticks add up.
        assert_eq!(ticked, 500);
        assert!(end.errors.is_empty());
        assert!(
            end.elapsed < Duration::from_secs(30),
            "ended by the workers"
        );
    }

    #[test]
    fn a_deadline_or_an_external_stop_ends_it() {
        let mut rt = start(u64::MAX);
        let rule = StopRule {
            external: Arc::new(AtomicBool::new(false)),
            deadline: Some(Duration::from_millis(100)),
        };
        let end = rt.session(None, &rule, &mut |_| panic!("no interval, no tick"));
        assert!(end.elapsed >= Duration::from_millis(100));
        assert!(end.total().role.rx_packets > 0);
        let mut rt = start(u64::MAX);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            stop2.store(true, Ordering::Relaxed);
        });
        let rule = StopRule {
            external: stop,
            deadline: None,
        };
        let end = rt.session(None, &rule, &mut |_| {});
        t.join().expect("stopper");
        assert!(end.elapsed < Duration::from_secs(10));
    }
}
