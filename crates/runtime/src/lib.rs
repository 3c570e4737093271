//! # flowlane-runtime — pinned per-core workers
//!
//! Layer: threads and time; no `unsafe` (pinning goes through `flowlane_io::os`).
//!
//! Each worker is pinned to its CPU *before* it opens anything, so its socket and buffers are
//! allocated where it runs. Workers are initialised one at a time in index order (a
//! `SO_REUSEPORT` group's index is its bind order), then wait until [`Runtime::go`]. The loop
//! is NAPI-style: poll up to `budget` packets; a full round polls again at once; a short round
//! sleeps on readiness with a timeout, so a stop request is noticed within `wait_ms`.
//! Counters are per worker, cache-line aligned, written only by their worker and read by the
//! control thread.

#![forbid(unsafe_code)]

pub mod blast;
pub mod cpus;
pub mod flowbook;
pub mod pace;
pub mod serve;
pub mod session;
pub mod sink;

pub use flowbook::{FlowBook, Recorded};
pub use session::{SessionEnd, StopRule, Tick};

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Declares the per-worker counters once: the atomic [`WorkerStats`], its plain copy
/// [`Snapshot`], and the field-wise arithmetic, so a new counter is one line.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// One worker's counters. Only its worker writes (plain load + store, no locked RMW);
        /// any thread may read.
        #[derive(Debug, Default)]
        #[repr(align(64))]
        pub struct WorkerStats {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A plain copy of [`WorkerStats`].
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
        pub struct Snapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl WorkerStats {
            /// Reads every counter.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl Snapshot {
            /// Field-wise `self - earlier` (saturating).
            pub fn since(&self, e: &Snapshot) -> Snapshot {
                Snapshot { $($name: self.$name.saturating_sub(e.$name),)* }
            }

            /// Field-wise sum.
            pub fn plus(&self, o: &Snapshot) -> Snapshot {
                Snapshot { $($name: self.$name.wrapping_add(o.$name),)* }
            }
        }
    };
}

counters! {
    /// Datagrams received.
    rx_packets,
    /// Payload bytes received.
    rx_bytes,
    /// Datagrams sent (echoed).
    tx_packets,
    /// Payload bytes sent.
    tx_bytes,
    /// Datagrams that could not be sent (socket send buffer full, or an error).
    tx_failed,
    /// Datagrams the kernel dropped because this socket's receive buffer was full
    /// (the socket's `sk_drops`, read with SO_MEMINFO; cumulative since it was opened).
    socket_drops,
    /// Datagrams longer than the receive buffer (MSG_TRUNC), or frames longer than a ring slot.
    truncated,
    /// Frames that do not parse (a header cut short or inconsistent) or fail their UDP
    /// checksum.
    malformed,
    /// Received datagrams without a valid flowlane header, or of a flow this worker does not
    /// own (echoes from something else).
    foreign,
    /// Sends the kernel took only partly or not at all (socket buffer or ring full).
    tx_full,
    /// ICMP errors reported on sends (e.g. port unreachable: nothing listens at the
    /// destination), or batches cut short by one; the unsent rest is retried at once.
    icmp_errors,
    /// Datagrams this worker's socket got that the kernel processed on another CPU
    /// (eBPF detector; includes ones then dropped for a full buffer).
    missteered,
    /// Receives that held several datagrams coalesced by UDP_GRO.
    gro_receives,
    /// Sends of several datagrams as GSO segments (UDP_SEGMENT).
    gso_sends,
    /// Poll rounds.
    rounds,
    /// Rounds that used the whole budget.
    full_rounds,
    /// Rounds that received at least one packet.
    busy_rounds,
    /// Times the worker slept on readiness.
    sleeps,
}

/// Adds to a counter that only the calling worker writes.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Sets a counter that only the calling worker writes.
#[inline]
pub fn set(c: &AtomicU64, v: u64) {
    c.store(v, Ordering::Relaxed);
}

impl Snapshot {
    /// Average packets per round that received anything (how full batches are).
    pub fn batch_fill(&self) -> f64 {
        if self.busy_rounds == 0 {
            0.0
        } else {
            self.rx_packets as f64 / self.busy_rounds as f64
        }
    }
}

/// What a worker does each round.
pub trait Poll: Send + 'static {
    /// Handles up to `budget` packets, updating `stats`; returns how many it handled.
    fn poll(&mut self, budget: usize, stats: &WorkerStats) -> Result<usize, String>;
    /// Blocks until work may be waiting or `timeout_ms` passes.
    fn wait(&mut self, timeout_ms: i32) -> Result<(), String>;
    /// Called before each sleep and once when the loop ends: a place for bookkeeping too
    /// costly for every round (e.g. reading a kernel counter with a system call).
    fn idle(&mut self, _stats: &WorkerStats) {}
    /// True when the worker has finished its job (e.g. a sender that sent its count); its loop
    /// then ends without a stop request.
    fn done(&self) -> bool {
        false
    }
    /// Called once when the loop has ended, after the last `idle`: hand results over.
    fn finish(&mut self, _stats: &WorkerStats) {}
}

/// Runtime settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// One worker per entry, pinned to that CPU.
    pub cpus: Vec<usize>,
    /// Packets per poll round (NAPI quota).
    pub budget: usize,
    /// Longest sleep on readiness, so stop requests are seen (ms).
    pub wait_ms: i32,
}

/// Why workers could not start.
#[derive(Debug)]
pub enum StartError<E> {
    /// A worker could not be pinned to its CPU (no such CPU, or not allowed).
    Pin {
        /// The CPU.
        cpu: usize,
        /// The failed call.
        error: flowlane_io::SysError,
    },
    /// A worker's `make` failed (e.g. its socket could not be bound).
    Open(E),
    /// A worker thread could not be started or died while starting.
    Thread(String),
}

impl<E: fmt::Display> fmt::Display for StartError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Pin { cpu, error } => {
                write!(f, "cannot pin a worker to CPU {cpu}: {error}")
            }
            StartError::Open(e) => e.fmt(f),
            StartError::Thread(e) => f.write_str(e),
        }
    }
}

impl<E: fmt::Display + fmt::Debug> std::error::Error for StartError<E> {}

/// A one-way gate: workers wait until it opens. Unlike a barrier it never waits for a worker
/// that died, so a failing start cannot hang.
#[derive(Debug, Default)]
struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut o = self.open.lock().unwrap_or_else(|p| p.into_inner());
        while !*o {
            o = self.cv.wait(o).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_all();
    }
}

/// Running workers.
#[derive(Debug)]
pub struct Runtime {
    handles: Vec<JoinHandle<()>>,
    stats: Vec<Arc<WorkerStats>>,
    stop: Arc<AtomicBool>,
    go: Arc<Gate>,
    errors: Arc<Mutex<Vec<(usize, String)>>>,
    started: bool,
}

impl Runtime {
    /// Spawns one pinned worker per CPU. Worker `i` pins itself, then (in index order) calls
    /// `make(i, cpu)` to open what it owns, then waits for [`Runtime::go`]. Returns once every
    /// worker is initialised, or the first initialisation error (all workers are then stopped).
    pub fn start<P, E, F>(
        cfg: &Config,
        stop: Arc<AtomicBool>,
        make: F,
    ) -> Result<Runtime, StartError<E>>
    where
        P: Poll,
        E: Send + 'static,
        F: Fn(usize, usize) -> Result<P, E> + Send + Sync + 'static,
    {
        let n = cfg.cpus.len();
        let make = Arc::new(make);
        let turn = Arc::new((Mutex::new(0usize), Condvar::new()));
        let go = Arc::new(Gate::default());
        let errors = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), StartError<E>>>();
        let mut handles = Vec::with_capacity(n);
        let mut stats = Vec::with_capacity(n);
        for (idx, &cpu) in cfg.cpus.iter().enumerate() {
            let st = Arc::new(WorkerStats::default());
            stats.push(st.clone());
            let (make, turn, go, stop, errors, ready) = (
                make.clone(),
                turn.clone(),
                go.clone(),
                stop.clone(),
                errors.clone(),
                ready_tx.clone(),
            );
            let (budget, wait_ms) = (cfg.budget.max(1), cfg.wait_ms.max(1));
            let h = std::thread::Builder::new()
                .name(format!("flowlane-w{idx}-cpu{cpu}"))
                .spawn(move || {
                    let pinned = flowlane_io::os::pin_current_thread(cpu)
                        .map_err(|error| StartError::Pin { cpu, error });
                    // Initialise in index order.
                    let made = {
                        let (lock, cv) = &*turn;
                        let mut t = lock.lock().unwrap_or_else(|p| p.into_inner());
                        while *t != idx {
                            t = cv.wait(t).unwrap_or_else(|p| p.into_inner());
                        }
                        // A panic in `make` must still pass the turn on, or later workers
                        // would wait forever.
                        let made = pinned.and_then(|()| {
                            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                make(idx, cpu)
                            }));
                            match r {
                                Ok(r) => r.map_err(StartError::Open),
                                Err(_) => Err(StartError::Thread(format!(
                                    "worker {idx} panicked while starting"
                                ))),
                            }
                        });
                        *t += 1;
                        cv.notify_all();
                        made
                    };
                    let mut poller = match made {
                        Ok(p) => {
                            let _ = ready.send(Ok(()));
                            p
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            go.wait();
                            return;
                        }
                    };
                    go.wait();
                    run_loop(&mut poller, &st, &stop, budget, wait_ms, idx, &errors);
                })
                .map_err(|e| StartError::Thread(format!("cannot start worker thread: {e}")))?;
            handles.push(h);
        }
        drop(ready_tx);
        let mut first_err = None;
        for _ in 0..n {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(StartError::Thread(
                        "a worker thread died while starting".into(),
                    ));
                }
            }
        }
        let mut rt = Runtime {
            handles,
            stats,
            stop,
            go,
            errors,
            started: false,
        };
        if let Some(e) = first_err {
            rt.stop.store(true, Ordering::Relaxed);
            rt.go();
            rt.join();
            return Err(e);
        }
        Ok(rt)
    }

    /// Lets the initialised workers start polling.
    pub fn go(&mut self) {
        if !self.started {
            self.started = true;
            self.go.open();
        }
    }

    /// Per-worker counters, in worker order.
    pub fn stats(&self) -> &[Arc<WorkerStats>] {
        &self.stats
    }

    /// Errors workers stopped on: (worker index, message).
    pub fn errors(&self) -> Vec<(usize, String)> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Whether every worker's loop has ended (each finished its job, failed, or was stopped).
    pub fn finished(&self) -> bool {
        self.handles.iter().all(|h| h.is_finished())
    }

    /// Whether a stop was requested (by a signal, a deadline or a failing worker).
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Asks every worker to stop and waits for them.
    pub fn join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.go();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.join();
    }
}

fn run_loop<P: Poll>(
    p: &mut P,
    st: &WorkerStats,
    stop: &AtomicBool,
    budget: usize,
    wait_ms: i32,
    idx: usize,
    errors: &Mutex<Vec<(usize, String)>>,
) {
    let fail = |e: String| {
        if let Ok(mut v) = errors.lock() {
            v.push((idx, e));
        }
        stop.store(true, Ordering::Relaxed);
    };
    while !stop.load(Ordering::Relaxed) && !p.done() {
        bump(&st.rounds, 1);
        match p.poll(budget, st) {
            Ok(n) if n >= budget => {
                bump(&st.full_rounds, 1);
                bump(&st.busy_rounds, 1);
            }
            Ok(n) => {
                if n > 0 {
                    bump(&st.busy_rounds, 1);
                }
                bump(&st.sleeps, 1);
                p.idle(st);
                if let Err(e) = p.wait(wait_ms) {
                    return fail(e);
                }
            }
            Err(e) => {
                p.idle(st);
                p.finish(st);
                return fail(e);
            }
        }
    }
    p.idle(st);
    p.finish(st);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poller that "receives" a fixed number of packets, then nothing.
    struct Fake {
        left: usize,
    }

    impl Poll for Fake {
        fn poll(&mut self, budget: usize, st: &WorkerStats) -> Result<usize, String> {
            let n = self.left.min(budget);
            self.left -= n;
            bump(&st.rx_packets, n as u64);
            Ok(n)
        }
        fn wait(&mut self, _ms: i32) -> Result<(), String> {
            std::thread::sleep(std::time::Duration::from_millis(1));
            Ok(())
        }
    }

    #[test]
    fn workers_pin_count_and_stop() {
        let cpus: Vec<usize> =
            (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let order = Arc::new(Mutex::new(Vec::new()));
        let o2 = order.clone();
        let cfg = Config {
            cpus: cpus.clone(),
            budget: 64,
            wait_ms: 5,
        };
        let mut rt = Runtime::start(&cfg, stop.clone(), move |idx, cpu| {
            o2.lock().expect("lock").push(idx);
            assert_eq!(
                flowlane_io::os::current_cpu(),
                Some(cpu),
                "pinned before make"
            );
            Ok::<_, ()>(Fake { left: 1000 })
        })
        .expect("start");
        assert_eq!(
            *order.lock().expect("lock"),
            (0..cpus.len()).collect::<Vec<_>>()
        );
        rt.go();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while rt
            .stats()
            .iter()
            .map(|s| s.snapshot().rx_packets)
            .sum::<u64>()
            < 1000 * cpus.len() as u64
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        rt.join();
        for s in rt.stats() {
            let s = s.snapshot();
            assert_eq!(s.rx_packets, 1000);
            // 1000 = 15 full rounds of 64 + one of 40.
            assert_eq!(s.full_rounds, 15);
            assert!(s.sleeps >= 1);
        }
        assert!(rt.errors().is_empty());
    }

    #[test]
    fn init_error_is_returned_and_workers_end() {
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = Config {
            cpus: vec![0, 0],
            budget: 8,
            wait_ms: 5,
        };
        let r = Runtime::start(&cfg, stop, |idx, _| {
            if idx == 1 {
                Err("no socket for you")
            } else {
                Ok(Fake { left: 0 })
            }
        });
        assert!(matches!(r, Err(StartError::Open("no socket for you"))));
    }

    #[test]
    fn a_panicking_worker_fails_the_start_instead_of_hanging() {
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = Config {
            cpus: vec![0, 0, 0],
            budget: 8,
            wait_ms: 5,
        };
        let r = Runtime::start(&cfg, stop, |idx, _| {
            assert_ne!(idx, 1, "deliberate panic in worker 1");
            Ok::<_, ()>(Fake { left: 0 })
        });
        assert!(matches!(r, Err(StartError::Thread(ref m)) if m.contains("worker 1 panicked")));
    }

    #[test]
    fn unknown_cpu_is_an_error() {
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = Config {
            cpus: vec![100_000],
            budget: 8,
            wait_ms: 5,
        };
        let r = Runtime::start(&cfg, stop, |_, _| Ok::<_, ()>(Fake { left: 0 }));
        assert!(matches!(r, Err(StartError::Pin { cpu: 100_000, .. })));
    }
}
