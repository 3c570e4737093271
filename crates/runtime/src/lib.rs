//! # flowlane-runtime — pinned per-core workers
//!
//! Layer: threads and time; no `unsafe` (pinning goes through `flowlane_io::os`).
//!
//! Each worker is pinned to its CPU *before* it opens anything, so its socket and buffers are
//! allocated where it runs. Workers are initialised one at a time in index order (a
//! `SO_REUSEPORT` group's index is its bind order), then wait until [`Runtime::go`]. The loop
//! is NAPI-style: poll up to `budget` packets; a full round polls again at once; a short round
//! sleeps on readiness with a timeout, so a stop request is noticed within `wait_ms`. With
//! `busy_poll` set, a short round polls again instead of sleeping until no round has found
//! work for that long (user-space busy polling: the worker spends its CPU so that whoever
//! sends to it never has to wake it).
//! Counters are per worker and per role (see [`counters`]), cache-line aligned, written only by
//! their worker and read by the control thread.

#![forbid(unsafe_code)]

pub mod counters;
pub mod cpus;
pub mod flowbook;
pub mod latency;
pub mod pace;
pub mod session;

pub use counters::{
    bump, set, Counters, LoopSnapshot, LoopStats, Snapshot, WorkerCounters, WorkerSnapshot,
};
pub use flowbook::{FlowBook, Recorded};
pub use session::{SessionEnd, StopRule, Tick};

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Why a worker's loop stopped on an error: a failed system call (with the kernel's error
/// number, so a role can tell a device that went away from a full queue), or a fault the
/// worker found itself, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerError {
    /// A system call failed.
    Sys {
        /// The call or the step, e.g. `poll(AF_XDP socket)` or `CPU 3: recvmmsg`.
        what: String,
        /// `errno`, when the kernel gave one.
        errno: Option<i32>,
        /// What the kernel said, in words.
        message: String,
    },
    /// Anything else: a broken hand-over, an inconsistent ring, … in words.
    Failed(String),
}

impl WorkerError {
    /// A failed call: `what` says which (and where).
    pub fn sys(what: impl Into<String>, e: &std::io::Error) -> WorkerError {
        WorkerError::Sys {
            what: what.into(),
            errno: e.raw_os_error(),
            message: e.to_string(),
        }
    }

    /// The kernel's error number, for a failed system call.
    pub fn errno(&self) -> Option<i32> {
        match self {
            WorkerError::Sys { errno, .. } => *errno,
            WorkerError::Failed(_) => None,
        }
    }
}

impl fmt::Display for WorkerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerError::Sys { what, message, .. } if what.is_empty() => f.write_str(message),
            WorkerError::Sys { what, message, .. } => write!(f, "{what}: {message}"),
            WorkerError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for WorkerError {}

impl From<String> for WorkerError {
    fn from(m: String) -> Self {
        WorkerError::Failed(m)
    }
}

impl From<&str> for WorkerError {
    fn from(m: &str) -> Self {
        WorkerError::Failed(m.to_string())
    }
}

impl From<std::io::Error> for WorkerError {
    fn from(e: std::io::Error) -> Self {
        WorkerError::sys("", &e)
    }
}

impl From<flowlane_io::SysError> for WorkerError {
    fn from(e: flowlane_io::SysError) -> Self {
        WorkerError::sys(format!("`{}`", e.call), &e.source)
    }
}

/// What a worker does each round.
pub trait Poll: Send + 'static {
    /// The role's counters (the loop's own are kept beside them by the runtime).
    type Stats: Counters;
    /// What the worker hands back when its loop has ended ([`Poll::finish`]): the runtime
    /// returns it from the join ([`Runtime::take_reports`], [`SessionEnd::reports`]), so no
    /// role needs a shared slot to carry results up.
    type Report: Send + 'static;
    /// Handles up to `budget` packets, updating `stats`; returns how many it handled.
    fn poll(&mut self, budget: usize, stats: &Self::Stats) -> Result<usize, WorkerError>;
    /// Blocks until work may be waiting or `timeout_ms` passes.
    fn wait(&mut self, timeout_ms: i32) -> Result<(), WorkerError>;
    /// Called before each sleep and once when the loop ends: a place for bookkeeping too
    /// costly for every round (e.g. reading a kernel counter with a system call).
    fn idle(&mut self, _stats: &Self::Stats) {}
    /// True when the worker has finished its job (e.g. a sender that sent its count); its loop
    /// then ends without a stop request.
    fn done(&self) -> bool {
        false
    }
    /// Called before each sleep, every 1024 rounds, and once as the loop ends (before
    /// `finish`, with `last`): a place to publish what other threads read while the run goes
    /// on — the latency histogram `--metrics` serves ([`latency::Publisher`] keeps it cheap).
    fn publish(&mut self, _last: bool) {}
    /// Whether the worker receives frames that must all be counted: stopped by request, it
    /// then polls until its rings are empty (bounded) before its last `idle` and `finish`.
    fn drains(&self) -> bool {
        false
    }
    /// Called once when the loop has ended, after the last `idle`: the worker's report, if it
    /// makes one.
    fn finish(&mut self, _stats: &Self::Stats) -> Option<Self::Report> {
        None
    }
    /// CPU time, ns, of threads this worker does its work on besides its own (e.g. the
    /// live-frames sender's kernel run): added to the worker's own in what each packet cost.
    fn helper_cpu_ns(&self) -> u64 {
        0
    }
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
    /// Keep polling without sleeping until no round has found work for this long (zero:
    /// sleep after every short round). Each such round counts in `spins`.
    pub busy_poll: std::time::Duration,
    /// Each worker gets a file table of its own before `make` (`unshare(CLONE_FILES)`), so the
    /// open-file limit bounds each worker rather than the process: for roles that hold more
    /// sockets than one table may. Where the system refuses, workers share the process's
    /// table and [`Runtime::own_files_refused`] says why. What a worker opens is then usable
    /// only on its thread, and a descriptor opened before the start is in every table. The
    /// runtime keeps `make` (and what it captured) until the workers are joined and drops it
    /// on the joining thread, so a file `make` shares into the workers is closed in the
    /// caller's table too; a file a worker sends elsewhere is the role's to close there.
    pub own_files: bool,
}

impl Config {
    /// The settings of workers that move frames through rings (sink, forward, blast's frame
    /// senders): 256 frames a round, at most 50 ms asleep (a stop is seen within that), no
    /// busy polling, the process's file table.
    pub fn frames(cpus: Vec<usize>) -> Config {
        Config {
            cpus,
            budget: 256,
            wait_ms: 50,
            busy_poll: std::time::Duration::ZERO,
            own_files: false,
        }
    }
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

/// Running workers of one role, whose counters are `S` and whose reports are `R`.
#[derive(Debug)]
pub struct Runtime<S: Counters, R = ()> {
    handles: Vec<JoinHandle<Option<R>>>,
    /// Each worker's report once joined (`None`: it made none, or its thread died).
    reports: Vec<Option<R>>,
    stats: Vec<Arc<WorkerCounters<S>>>,
    stop: Arc<AtomicBool>,
    go: Arc<Gate>,
    errors: Arc<Mutex<Vec<(usize, WorkerError)>>>,
    /// Why the workers' hardware counters could not be opened (the first worker's reason).
    pmu: Arc<Mutex<Option<String>>>,
    /// Why workers asked for file tables of their own share the process's (the first reason).
    own_files_refused: Arc<Mutex<Option<String>>>,
    /// The workers' `make`, dropped in [`Runtime::join`] after them: what it captured is then
    /// dropped last on the joining thread (see [`Config::own_files`]).
    make: Option<Arc<dyn std::any::Any + Send + Sync>>,
    started: bool,
}

impl<S: Counters, R> Runtime<S, R> {
    /// Spawns one pinned worker per CPU. Worker `i` pins itself, then (in index order) calls
    /// `make(i, cpu)` to open what it owns, then waits for [`Runtime::go`]. Returns once every
    /// worker is initialised, or the first initialisation error (all workers are then stopped).
    ///
    /// Long: a worker thread's start-up (pin, `make` in index order, panics caught, readiness
    /// said, the gate) is one closure, since its steps share the thread's state.
    pub fn start<P, E, F>(
        cfg: &Config,
        stop: Arc<AtomicBool>,
        make: F,
    ) -> Result<Runtime<S, R>, StartError<E>>
    where
        P: Poll<Stats = S, Report = R>,
        R: Send + 'static,
        E: Send + 'static,
        F: Fn(usize, usize) -> Result<P, E> + Send + Sync + 'static,
    {
        let n = cfg.cpus.len();
        let make = Arc::new(make);
        let turn = Arc::new((Mutex::new(0usize), Condvar::new()));
        let go = Arc::new(Gate::default());
        let errors = Arc::new(Mutex::new(Vec::new()));
        let pmu = Arc::new(Mutex::new(None));
        let own_files_refused = Arc::new(Mutex::new(None));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), StartError<E>>>();
        let mut handles = Vec::with_capacity(n);
        let mut stats = Vec::with_capacity(n);
        for (idx, &cpu) in cfg.cpus.iter().enumerate() {
            let st = Arc::new(WorkerCounters::<S>::default());
            stats.push(st.clone());
            let (pmu, refused) = (pmu.clone(), own_files_refused.clone());
            let (make, turn, go, stop, errors, ready) = (
                make.clone(),
                turn.clone(),
                go.clone(),
                stop.clone(),
                errors.clone(),
                ready_tx.clone(),
            );
            let (budget, wait_ms, busy_poll, own_files) = (
                cfg.budget.max(1),
                cfg.wait_ms.max(1),
                cfg.busy_poll,
                cfg.own_files,
            );
            let h = std::thread::Builder::new()
                .name(format!("flowlane-w{idx}-cpu{cpu}"))
                .spawn(move || {
                    // A table of its own where the system allows one (a seccomp filter, e.g. a
                    // container's, may refuse `unshare`): else the shared one, and why.
                    if own_files {
                        if let Err(e) = flowlane_io::os::unshare_files() {
                            if let Ok(mut r) = refused.lock() {
                                r.get_or_insert_with(|| e.to_string());
                            }
                        }
                    }
                    // A send to a peer that reset fails (EPIPE) instead of ending the process.
                    let pinned = match flowlane_io::os::block_sigpipe_here() {
                        Err(e) => Err(StartError::Thread(format!("worker {idx}: {e}"))),
                        Ok(()) => flowlane_io::os::pin_current_thread(cpu)
                            .map_err(|error| StartError::Pin { cpu, error }),
                    };
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
                    // The runtime holds `make` until after the join (see `Runtime::make`).
                    drop(make);
                    let mut poller = match made {
                        Ok(p) => {
                            let _ = ready.send(Ok(()));
                            p
                        }
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            go.wait();
                            return None;
                        }
                    };
                    go.wait();
                    let ctx = LoopCtx {
                        stop: &stop,
                        budget,
                        wait_ms,
                        busy_poll,
                        idx,
                        errors: &errors,
                        pmu: &pmu,
                    };
                    run_loop(&mut poller, &st, &ctx)
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
            reports: Vec::new(),
            stats,
            stop,
            go,
            errors,
            pmu,
            own_files_refused,
            make: Some(make),
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
    pub fn stats(&self) -> &[Arc<WorkerCounters<S>>] {
        &self.stats
    }

    /// Why the workers count no cycles or instructions (`None`: they do).
    pub fn pmu_unavailable(&self) -> Option<String> {
        self.pmu.lock().ok().and_then(|g| g.clone())
    }

    /// With [`Config::own_files`]: why the workers (some or all) share the process's file
    /// table after all (`None`: each has its own). The system may refuse `unshare` (a
    /// seccomp filter, as containers' default profiles have); the workers run on regardless.
    pub fn own_files_refused(&self) -> Option<String> {
        self.own_files_refused.lock().ok().and_then(|g| g.clone())
    }

    /// Errors workers stopped on: (worker index, message).
    pub fn errors(&self) -> Vec<(usize, WorkerError)> {
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

    /// Asks every worker to stop and waits for them; their reports are then kept for
    /// [`Runtime::take_reports`].
    pub fn join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.go();
        if !self.handles.is_empty() {
            self.reports = self
                .handles
                .drain(..)
                .map(|h| h.join().ok().flatten())
                .collect();
        }
        self.make = None;
    }

    /// The workers' reports, in worker order, once joined (`None` for a worker that made
    /// none or whose thread died); empty before the join or when taken already.
    pub fn take_reports(&mut self) -> Vec<Option<R>> {
        std::mem::take(&mut self.reports)
    }
}

impl<S: Counters, R> Drop for Runtime<S, R> {
    fn drop(&mut self) {
        self.join();
    }
}

/// What a worker's loop needs besides its poller and counters.
struct LoopCtx<'a> {
    stop: &'a AtomicBool,
    budget: usize,
    wait_ms: i32,
    busy_poll: std::time::Duration,
    idx: usize,
    errors: &'a Mutex<Vec<(usize, WorkerError)>>,
    pmu: &'a Mutex<Option<String>>,
}

fn run_loop<P: Poll>(
    p: &mut P,
    counters: &WorkerCounters<P::Stats>,
    ctx: &LoopCtx<'_>,
) -> Option<P::Report> {
    let LoopCtx {
        stop,
        budget,
        wait_ms,
        busy_poll,
        idx,
        errors,
        pmu,
    } = *ctx;
    let fail = |e: WorkerError| {
        if let Ok(mut v) = errors.lock() {
            v.push((idx, e));
        }
        stop.store(true, Ordering::Relaxed);
    };
    let (lp, st) = (&counters.looped, &counters.role);
    // The thread's CPU time, from when its loop starts: what each packet cost.
    let cpu0 = flowlane_io::os::thread_cpu_ns();
    // Cycles, instructions and LLC misses where the machine has a PMU; else why not.
    let mut hw = match flowlane_io::perf::ThreadCounters::open(&flowlane_io::perf::HARDWARE) {
        Ok(c) => Some(c),
        Err(why) => {
            if let Ok(mut g) = pmu.lock() {
                g.get_or_insert(why);
            }
            None
        }
    };
    // `helper`: the CPU time of the threads the worker does its work on besides this one.
    let mut cpu = |helper: u64| {
        if let (Some(a), Some(b)) = (cpu0, flowlane_io::os::thread_cpu_ns()) {
            set(&lp.cpu_ns, b.saturating_sub(a) + helper);
        }
        if let Some(v) = hw.as_mut().and_then(|h| h.read()) {
            set(&lp.pmu_cycles, v[0]);
            set(&lp.pmu_instructions, v[1]);
            set(&lp.pmu_llc_misses, v[2]);
        }
    };
    // A poll or wait error ends the loop as a stop does: the worker finishes (its counts and
    // report are kept), then the error is reported.
    let (mut rounds, mut sleeps) = (0u32, 0u32);
    // Busy polling: when a round last found work (read only when `busy_poll` is set).
    let mut worked = std::time::Instant::now();
    let outcome = 'run: {
        while !stop.load(Ordering::Relaxed) && !p.done() {
            bump(&lp.rounds, 1);
            rounds = rounds.wrapping_add(1);
            if rounds.is_multiple_of(1024) {
                cpu(p.helper_cpu_ns());
                p.publish(false);
            }
            match p.poll(budget, st) {
                Ok(n) if n >= budget => {
                    bump(&lp.full_rounds, 1);
                    bump(&lp.busy_rounds, 1);
                    if !busy_poll.is_zero() {
                        worked = std::time::Instant::now();
                    }
                }
                Ok(n) => {
                    if n > 0 {
                        bump(&lp.busy_rounds, 1);
                    }
                    if !busy_poll.is_zero() {
                        let now = std::time::Instant::now();
                        if n > 0 {
                            worked = now;
                        }
                        if now.duration_since(worked) < busy_poll {
                            bump(&lp.spins, 1);
                            continue;
                        }
                    }
                    bump(&lp.sleeps, 1);
                    sleeps = sleeps.wrapping_add(1);
                    if sleeps % 64 == 0 {
                        cpu(p.helper_cpu_ns());
                    }
                    p.idle(st);
                    p.publish(false);
                    if let Err(e) = p.wait(wait_ms) {
                        break 'run Err(e);
                    }
                }
                Err(e) => break 'run Err(e),
            }
        }
        // A receiver stopped by request first reads what already waits in its rings: frames that
        // arrived before the stop are then counted, not left between the last read and the
        // interface counters the report is checked against (bounded: 64 rounds, 20 ms).
        if p.drains() && !p.done() {
            let until = std::time::Instant::now() + std::time::Duration::from_millis(20);
            for _ in 0..64 {
                match p.poll(budget, st) {
                    Ok(0) => break,
                    Ok(_) if std::time::Instant::now() >= until => break,
                    Ok(_) => {}
                    Err(e) => break 'run Err(e),
                }
            }
        }
        Ok(())
    };
    p.idle(st);
    p.publish(true);
    let report = p.finish(st);
    cpu(p.helper_cpu_ns());
    if let Err(e) = outcome {
        fail(e);
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poller that "receives" a fixed number of packets, then nothing.
    struct Fake {
        left: usize,
    }

    counters! {
        /// What [`Fake`] counts.
        pub(crate) struct FakeStats => FakeSnap {
            /// "Packets" handled.
            rx_packets,
        }
    }

    impl Poll for Fake {
        type Stats = FakeStats;
        type Report = ();
        fn poll(&mut self, budget: usize, st: &FakeStats) -> Result<usize, WorkerError> {
            let n = self.left.min(budget);
            self.left -= n;
            bump(&st.rx_packets, n as u64);
            Ok(n)
        }
        fn wait(&mut self, _ms: i32) -> Result<(), WorkerError> {
            std::thread::sleep(std::time::Duration::from_millis(1));
            Ok(())
        }
    }

    /// A receiver whose frames wait in its ring when the stop comes: they are read before it
    /// finishes — if it says it drains — and left otherwise.
    struct Ring {
        /// Its frames, as [`Fake`] hands them out.
        waiting: Fake,
        drains: bool,
    }

    impl Poll for Ring {
        type Stats = FakeStats;
        /// The frames left in its ring when it finished.
        type Report = usize;
        fn poll(&mut self, budget: usize, st: &FakeStats) -> Result<usize, WorkerError> {
            self.waiting.poll(budget, st)
        }
        fn wait(&mut self, ms: i32) -> Result<(), WorkerError> {
            self.waiting.wait(ms)
        }
        fn drains(&self) -> bool {
            self.drains
        }
        fn finish(&mut self, _st: &FakeStats) -> Option<usize> {
            Some(self.waiting.left)
        }
    }

    #[test]
    fn a_draining_receiver_reads_its_ring_after_the_stop() {
        let here = flowlane_io::os::current_cpu().unwrap_or(0);
        for drains in [true, false] {
            // Stopped before it ever polls: 1000 frames wait.
            let stop = Arc::new(AtomicBool::new(true));
            let cfg = Config {
                cpus: vec![here],
                budget: 64,
                wait_ms: 5,
                busy_poll: std::time::Duration::ZERO,
                own_files: false,
            };
            let mut rt = Runtime::start(&cfg, stop.clone(), move |_, _| {
                Ok::<_, ()>(Ring {
                    waiting: Fake { left: 1000 },
                    drains,
                })
            })
            .expect("start");
            rt.go();
            rt.join();
            let got = rt.stats()[0].snapshot().role.rx_packets;
            // The report comes back through the join, not a shared slot.
            let left = rt.take_reports()[0].expect("finished");
            assert_eq!(got + left as u64, 1000);
            if drains {
                assert_eq!((got, left), (1000, 0), "read before finishing");
            } else {
                assert_eq!(got, 0, "left in the ring");
            }
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
            busy_poll: std::time::Duration::ZERO,
            own_files: false,
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
            .map(|s| s.snapshot().role.rx_packets)
            .sum::<u64>()
            < 1000 * cpus.len() as u64
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        rt.join();
        for s in rt.stats() {
            let s = s.snapshot();
            assert_eq!(s.role.rx_packets, 1000);
            // 1000 = 15 full rounds of 64 + one of 40.
            assert_eq!(s.looped.full_rounds, 15);
            assert_eq!(s.looped.busy_rounds, 16);
            assert!(s.looped.sleeps >= 1);
        }
        assert!(rt.errors().is_empty());
    }

    /// A worker whose device goes away after 100 packets.
    struct Vanishing(Fake);

    impl Poll for Vanishing {
        type Stats = FakeStats;
        type Report = ();
        fn poll(&mut self, budget: usize, st: &FakeStats) -> Result<usize, WorkerError> {
            if self.0.left == 0 {
                let e = std::io::Error::from_raw_os_error(libc::ENXIO);
                return Err(WorkerError::sys("recvmmsg", &e));
            }
            self.0.poll(budget, st)
        }
        fn wait(&mut self, ms: i32) -> Result<(), WorkerError> {
            self.0.wait(ms)
        }
    }

    /// A worker's error stops every worker, keeps what was counted, and reaches the role
    /// typed: the call, the kernel's error number and its words.
    #[test]
    fn a_worker_error_stops_the_run_and_keeps_its_errno() {
        let cfg = Config {
            cpus: vec![0],
            budget: 64,
            wait_ms: 5,
            busy_poll: std::time::Duration::ZERO,
            own_files: false,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut rt = Runtime::start(&cfg, stop.clone(), |_, _| {
            Ok::<_, ()>(Vanishing(Fake { left: 100 }))
        })
        .expect("start");
        rt.go();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !rt.finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        rt.join();
        assert!(
            stop.load(Ordering::Relaxed),
            "the error asked every worker to stop"
        );
        assert_eq!(rt.stats()[0].snapshot().role.rx_packets, 100);
        let errors = rt.errors();
        assert_eq!(errors.len(), 1, "{errors:?}");
        let (worker, e) = &errors[0];
        assert_eq!((*worker, e.errno()), (0, Some(libc::ENXIO)));
        assert!(e.to_string().starts_with("recvmmsg: "), "{e}");
        assert_eq!(WorkerError::from("a broken ring").errno(), None);
    }

    /// Hands out `left` packets, then nothing, taking 40 ms over each round that has some;
    /// notes when it last handed some out and when it was first asked to sleep.
    struct Timed {
        fake: Fake,
        seen: Arc<Mutex<(Option<std::time::Instant>, Option<std::time::Instant>)>>,
    }

    impl Poll for Timed {
        type Stats = FakeStats;
        type Report = ();
        fn poll(&mut self, budget: usize, st: &FakeStats) -> Result<usize, WorkerError> {
            let n = self.fake.poll(budget, st)?;
            if n > 0 {
                std::thread::sleep(std::time::Duration::from_millis(40));
                if let Ok(mut g) = self.seen.lock() {
                    g.0 = Some(std::time::Instant::now());
                }
            }
            Ok(n)
        }
        fn wait(&mut self, ms: i32) -> Result<(), WorkerError> {
            if let Ok(mut g) = self.seen.lock() {
                g.1.get_or_insert_with(std::time::Instant::now);
            }
            self.fake.wait(ms)
        }
    }

    #[test]
    fn busy_polling_keeps_polling_after_the_last_work_before_it_sleeps() {
        let here = flowlane_io::os::current_cpu().unwrap_or(0);
        for busy in [
            std::time::Duration::ZERO,
            std::time::Duration::from_millis(30),
        ] {
            let stop = Arc::new(AtomicBool::new(false));
            let seen = Arc::new(Mutex::new((None, None)));
            let s2 = seen.clone();
            let cfg = Config {
                cpus: vec![here],
                budget: 64,
                wait_ms: 5,
                busy_poll: busy,
                own_files: false,
            };
            let mut rt = Runtime::start(&cfg, stop.clone(), move |_, _| {
                Ok::<_, ()>(Timed {
                    // Two full rounds of 64 (80 ms, longer than the busy poll), then nothing:
                    // the busy poll counts from the last full round, not from the start.
                    fake: Fake { left: 128 },
                    seen: s2.clone(),
                })
            })
            .expect("start");
            rt.go();
            // Bounded: the first sleep comes 30 ms after the last packet at the latest, plus
            // whatever a busy machine adds.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while seen.lock().expect("lock").1.is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            stop.store(true, Ordering::Relaxed);
            rt.join();
            let (last_work, first_sleep) = *seen.lock().expect("lock");
            let (last_work, first_sleep) = (
                last_work.expect("packets handed out"),
                first_sleep.expect("slept within 10 s"),
            );
            let l = rt.stats()[0].snapshot().looped;
            assert_eq!(
                (l.full_rounds, l.busy_rounds),
                (2, 2),
                "128 packets: two full rounds"
            );
            if busy.is_zero() {
                assert_eq!(l.spins, 0);
                assert!(first_sleep >= last_work, "slept after the last work");
            } else {
                assert!(
                    first_sleep.duration_since(last_work) >= busy,
                    "kept polling {:?} after the last work, asked {busy:?}",
                    first_sleep.duration_since(last_work)
                );
                assert!(l.spins >= 1, "the polls in between count as spins");
                assert_eq!(
                    l.rounds,
                    l.full_rounds + l.spins + l.sleeps,
                    "every round counted once"
                );
            }
        }
    }

    /// A worker holding one open file (`File`, or a reference to one `make` shares among the
    /// workers), dropped on its own thread when the worker ends.
    struct Holding<F> {
        _file: F,
    }

    impl<F: Send + 'static> Poll for Holding<F> {
        type Stats = FakeStats;
        type Report = ();
        fn poll(&mut self, _budget: usize, _st: &FakeStats) -> Result<usize, WorkerError> {
            Ok(0)
        }
        fn wait(&mut self, _ms: i32) -> Result<(), WorkerError> {
            std::thread::sleep(std::time::Duration::from_millis(1));
            Ok(())
        }
    }

    /// Workers on `cpus` with a small budget and short waits, as the tests below run them.
    fn small_cfg(cpus: Vec<usize>, own_files: bool) -> Config {
        Config {
            cpus,
            budget: 8,
            wait_ms: 5,
            busy_poll: std::time::Duration::ZERO,
            own_files,
        }
    }

    /// The files a thread's table holds, as the paths they name.
    fn open_here() -> Vec<std::path::PathBuf> {
        std::fs::read_dir("/proc/thread-self/fd")
            .expect("/proc/thread-self/fd")
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .collect()
    }

    #[test]
    fn workers_with_their_own_file_tables_open_files_the_process_table_does_not_hold() {
        let here = flowlane_io::os::current_cpu().unwrap_or(0);
        for own_files in [false, true] {
            let dir = std::env::temp_dir();
            let paths: Vec<std::path::PathBuf> = (0..2)
                .map(|i| {
                    dir.join(format!(
                        "flowlane-own-files-{}-{own_files}-{i}",
                        std::process::id()
                    ))
                })
                .collect();
            let stop = Arc::new(AtomicBool::new(false));
            let cfg = small_cfg(vec![here, here], own_files);
            let (p2, seen) = (paths.clone(), Arc::new(Mutex::new(Vec::new())));
            let seen2 = seen.clone();
            let mut rt = Runtime::start(&cfg, stop, move |idx, _| {
                let file = std::fs::File::create(&p2[idx]).map_err(|e| e.to_string())?;
                // The worker sees its own file either way.
                let mine = open_here();
                seen2.lock().expect("lock").push(mine.contains(&p2[idx]));
                Ok::<_, String>(Holding { _file: file })
            })
            .expect("start");
            rt.go();
            let in_process_table = open_here();
            rt.join();
            for p in &paths {
                let _ = std::fs::remove_file(p);
            }
            assert_eq!(*seen.lock().expect("lock"), vec![true, true]);
            for p in &paths {
                assert_eq!(
                    in_process_table.contains(p),
                    !own_files,
                    "{p:?} in the main thread's table, own_files {own_files}"
                );
            }
        }
    }

    #[test]
    fn a_file_the_workers_share_is_closed_in_the_callers_table_when_they_end() {
        let here = flowlane_io::os::current_cpu().unwrap_or(0);
        let path =
            std::env::temp_dir().join(format!("flowlane-shared-file-{}", std::process::id()));
        let file = Arc::new(std::fs::File::create(&path).expect("a temporary file"));
        let cfg = small_cfg(vec![here, here], true);
        let stop = Arc::new(AtomicBool::new(false));
        // Only the closure holds the file: its workers' tables are copies of this one, so
        // wherever the last reference drops, the descriptor must be closed in this table too.
        let mut rt = Runtime::start(&cfg, stop, move |_, _| {
            Ok::<_, String>(Holding {
                _file: file.clone(),
            })
        })
        .expect("start");
        rt.go();
        std::thread::sleep(std::time::Duration::from_millis(20));
        rt.join();
        let left_open = open_here().contains(&path);
        let _ = std::fs::remove_file(&path);
        assert!(!left_open, "{path:?} still open in the caller's table");
    }

    #[test]
    fn where_the_system_refuses_own_file_tables_workers_share_the_process_table_and_say_why() {
        let here = flowlane_io::os::current_cpu().unwrap_or(0);
        // A thread under a seccomp filter that refuses `unshare`, as in a container; the
        // workers it starts inherit it.
        std::thread::spawn(move || {
            flowlane_io::os::refuse_unshare_here().expect("seccomp filter");
            let path = std::env::temp_dir()
                .join(format!("flowlane-own-files-refused-{}", std::process::id()));
            let p2 = path.clone();
            let cfg = small_cfg(vec![here], true);
            let stop = Arc::new(AtomicBool::new(false));
            let mut rt = Runtime::start(&cfg, stop, move |_, _| {
                let file = std::fs::File::create(&p2).map_err(|e| e.to_string())?;
                Ok::<_, String>(Holding { _file: file })
            })
            .expect("workers start regardless");
            rt.go();
            let shared = open_here().contains(&path);
            let why = rt.own_files_refused();
            rt.join();
            let _ = std::fs::remove_file(&path);
            assert!(shared, "the worker's file is in the shared table");
            let why = why.expect("a reason");
            assert!(
                why.contains("unshare") && why.contains("not permitted"),
                "{why}"
            );
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn init_error_is_returned_and_workers_end() {
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = small_cfg(vec![0, 0], false);
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
        let cfg = small_cfg(vec![0, 0, 0], false);
        let r = Runtime::start(&cfg, stop, |idx, _| {
            assert_ne!(idx, 1, "deliberate panic in worker 1");
            Ok::<_, ()>(Fake { left: 0 })
        });
        assert!(matches!(r, Err(StartError::Thread(ref m)) if m.contains("worker 1 panicked")));
    }

    #[test]
    fn unknown_cpu_is_an_error() {
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = small_cfg(vec![100_000], false);
        let r = Runtime::start(&cfg, stop, |_, _| Ok::<_, ()>(Fake { left: 0 }));
        assert!(matches!(r, Err(StartError::Pin { cpu: 100_000, .. })));
    }
}
