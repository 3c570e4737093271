//! The live-frames sender: no socket, a generated XDP program run by `BPF_PROG_TEST_RUN`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use flowlane_io::os;

use flowlane_wire::{FlowHeader, HEADER_LEN};

use super::BlastStats;
use super::{BlastError, BlastJob, BlastReport, RawLink, TxBook};
use flowlane_runtime::Poll;

/// Unpaced, frames in a group sharing one clock reading (a power of two, at most a batch).
const LIVE_CLOCK_EVERY: u32 = 8;

/// A sending worker that makes no socket at all: an XDP program, generated for its flows
/// ([`flowlane_io::ebpf::live_tx_program`]), is run by `BPF_PROG_TEST_RUN` in live-frames
/// mode on copies of one frame and sends each out of the interface with XDP_TX — no skb, no
/// ring to refill (what xdp-trafficgen does). The program stamps flow, sequence number and
/// time into every frame and counts the frames it released in a map this worker reads, so
/// `sent` is the kernel's own count. Paced or not, the whole send is one kernel run on a thread
/// of its own ([`Runner`]), bounded by the program (deadline, quota, pacing) and ended by a
/// signal: each `BPF_PROG_TEST_RUN` call costs ~20 ms of set-up and tear-down however many
/// frames it runs (measured: 64 Ki frames a call carry 2.0 Mpps, 1 Mi 6.1, 16 Mi 7.1 —
/// BENCHMARKS.md), so calls sized for 200 ms, as before, lost a tenth of the rate. Needs Linux
/// 5.18+ and CAP_BPF + CAP_NET_ADMIN; on veth the peer must run NAPI (an XDP program or GRO),
/// else veth drops the frames.
#[derive(Debug)]
pub struct LiveSender {
    job: BlastJob,
    prog: Arc<std::os::fd::OwnedFd>,
    counter: flowlane_io::bpf::MappedArray,
    /// The frame each run starts from (flow 0's template; the program rewrites the headers).
    frame: Vec<u8>,
    ifindex: u32,
    batch: u32,
    book: TxBook,
    finished: bool,
    /// The run's state ([`flowlane_io::ebpf::live_pace`]: deadline, quota, pacing, the send
    /// window the program stamps; kept for the program's lifetime) and, once sending has
    /// begun, the thread inside the one long kernel run.
    state: flowlane_io::bpf::ArrayMap,
    runner: Option<Runner>,
    /// When the run began (CLOCK_MONOTONIC ns).
    run_start: u64,
}

/// The thread that sits in one `BPF_PROG_TEST_RUN` for a whole send (a run of
/// `u32::MAX` program calls, restarted if it is ever spent): a kernel run costs ~30 ms of
/// set-up and tear-down, so runs cut short to poll would leave gaps; instead the program keeps
/// the time (deadline, limit, pacing) and the worker ends the run with a signal.
#[derive(Debug)]
struct Runner {
    stop: Arc<AtomicBool>,
    thread: flowlane_io::os::ThreadHandle,
    join: Option<std::thread::JoinHandle<Result<(), String>>>,
    /// The thread's CPU time, ns, as it ended (written by the thread itself, last).
    ended_cpu_ns: Arc<AtomicU64>,
}

impl Runner {
    fn start(
        prog: Arc<std::os::fd::OwnedFd>,
        frame: Vec<u8>,
        ifindex: u32,
        batch: u32,
    ) -> Result<Runner, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let ended_cpu_ns = Arc::new(AtomicU64::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let (flag, ended) = (stop.clone(), ended_cpu_ns.clone());
        // The new thread inherits this worker's CPU pinning.
        let join = std::thread::Builder::new()
            .name("fl-live-run".into())
            .spawn(move || {
                let me = flowlane_io::os::ThreadHandle::current().map_err(|e| e.to_string());
                let ok = me.is_ok();
                let _ = tx.send(me);
                if !ok {
                    return Ok(());
                }
                let mut outcome = Ok(());
                while !flag.load(Ordering::Acquire) {
                    match flowlane_io::bpf::xdp_test_run_live(
                        &prog,
                        &frame,
                        ifindex,
                        0,
                        u32::MAX,
                        batch,
                    ) {
                        Ok(()) => {}
                        Err(e) if e.source.raw_os_error() == Some(libc::EINTR) => {}
                        Err(e) => {
                            outcome = Err(e.to_string());
                            break;
                        }
                    }
                }
                // What the sending cost, for the worker's cost per packet: the kernel run is
                // in this thread's CPU time, not the worker's.
                ended.store(
                    flowlane_io::os::thread_cpu_ns().unwrap_or(0),
                    Ordering::Release,
                );
                outcome
            })
            .map_err(|e| format!("cannot start the live-frames run thread: {e}"))?;
        let thread = rx
            .recv()
            .map_err(|_| "the live-frames run thread ended at once".to_string())??;
        Ok(Runner {
            stop,
            thread,
            join: Some(join),
            ended_cpu_ns,
        })
    }

    /// The run thread's CPU time so far, ns: its clock while it runs; once joined, what it
    /// said as it ended (its thread id may name another thread by then).
    fn cpu_ns(&self) -> u64 {
        let ended = self.ended_cpu_ns.load(Ordering::Acquire);
        match self.join {
            Some(_) => self.thread.cpu_ns().unwrap_or(0).max(ended),
            None => ended,
        }
    }

    /// The run thread's error, if it has ended with one.
    fn failed(&mut self) -> Option<String> {
        if self.join.as_ref().is_some_and(|j| j.is_finished()) {
            return self.end().err();
        }
        None
    }

    /// Ends the kernel run and the thread. A signal that lands between two runs is lost, so
    /// it is sent again until the thread is gone (bounded: 10 s).
    fn end(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Release);
        let Some(join) = self.join.take() else {
            return Ok(());
        };
        let t0 = std::time::Instant::now();
        while !join.is_finished() {
            if t0.elapsed() > std::time::Duration::from_secs(10) {
                return Err("the live-frames run did not end on a signal within 10 s".into());
            }
            let _ = self.thread.interrupt();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        join.join()
            .unwrap_or_else(|_| Err("the live-frames run thread panicked".into()))
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

impl LiveSender {
    /// Builds the flows' header entries, the counter and the program.
    pub fn new(job: BlastJob, link: &RawLink) -> Result<LiveSender, BlastError> {
        use flowlane_io::ebpf::{live_flow, live_tx_program, LiveTx};
        let &[payload] = job.payloads.as_slice() else {
            return Err(BlastError::Job(
                "xdp-live sends one frame size per step (no IMIX): use --mode xdp or raw for a \
                 mix"
                .into(),
            ));
        };
        let first_src = job
            .flows
            .first()
            .map(|f| f.src)
            .ok_or_else(|| BlastError::Job("a worker without flows".into()))?;
        let bpf_err = |error| BlastError::Socket {
            src: first_src,
            error,
        };
        let flows_map = flowlane_io::bpf::ArrayMap::create(
            "fl_live_flows",
            live_flow::VALUE_SIZE,
            job.flows.len() as u32,
        )
        .map_err(bpf_err)?;
        let mut frame = Vec::new();
        let mut layout = (0, 0, 0);
        let mut entry0 = [0u8; live_flow::VALUE_SIZE];
        for (k, f) in job.flows.iter().enumerate() {
            let mut t = flowlane_wire::Template::build(&flowlane_wire::TemplateSpec {
                src_mac: link.src_mac,
                dst_mac: link.dst_mac,
                vlan: link.vlan,
                src: f.src,
                dst: f.dst,
                frame_len: payload + job.overhead,
            })
            .map_err(|e| BlastError::Job(format!("flow {}: {e}", f.id)))?;
            if let Some(ttl) = link.ttl {
                t.set_ttl(ttl);
            }
            let hdr_len = t.payload + HEADER_LEN;
            if t.payload_len() < HEADER_LEN || hdr_len > live_flow::HDR_MAX {
                return Err(BlastError::Job(format!(
                    "xdp-live stamps the {HEADER_LEN}-byte flowlane header into every frame: \
                     frames must be at least {hdr_len} bytes here"
                )));
            }
            let mut bytes = t.bytes.clone();
            t.patch(
                &mut bytes,
                &FlowHeader {
                    flow: f.id,
                    seq: 0,
                    tx_ns: 0,
                },
            );
            let mut value = [0u8; live_flow::VALUE_SIZE];
            value[..hdr_len].copy_from_slice(&bytes[..hdr_len]);
            let csum = u16::from_ne_bytes([bytes[t.l4 + 6], bytes[t.l4 + 7]]);
            value[live_flow::SEED..live_flow::SEED + 4]
                .copy_from_slice(&u32::from(!csum).to_ne_bytes());
            flows_map.set(k as u32, &value).map_err(bpf_err)?;
            if k == 0 {
                frame = bytes;
                layout = (hdr_len, t.payload + 4, t.l4 + 6);
                entry0 = value;
            }
        }
        // Word 0: frames released; word 1: the clock reading unpaced frames share.
        let counter = flowlane_io::bpf::MappedArray::words("fl_live_count", 2).map_err(bpf_err)?;
        // Zeroed until sending begins (deadline and limit 0: nothing leaves).
        let state = flowlane_io::bpf::ArrayMap::create(
            "fl_live_state",
            flowlane_io::ebpf::live_pace::VALUE_SIZE,
            1,
        )
        .map_err(bpf_err)?;
        let insns = live_tx_program(&LiveTx {
            state_fd: state.raw_fd(),
            paced: job.pps.is_some(),
            counter_fd: counter.fd(),
            flows_fd: flows_map.raw_fd(),
            flows: job.flows.len() as u32,
            hdr_len: layout.0,
            seq_off: layout.1,
            csum_off: layout.2,
            one_flow: (job.flows.len() == 1).then_some(entry0),
            // At most a batch of frames shares a reading (see `LiveTx::clock_every`).
            clock_every: LIVE_CLOCK_EVERY
                .min(((job.batch as u32).clamp(1, 256) + 1).next_power_of_two() / 2),
        })
        .map_err(|e| BlastError::Program(format!("live-frames program: {e}")))?;
        // The program holds its maps: `flows_map` may close when this returns.
        let prog = flowlane_io::bpf::prog_load(flowlane_io::bpf::PROG_XDP, "fl_live_tx", &insns)
            .map_err(|e| {
                if e.log.is_empty() {
                    bpf_err(e.error)
                } else {
                    BlastError::Program(format!("live-frames program refused: {e}"))
                }
            })?;
        Ok(LiveSender {
            book: TxBook::new(&job),
            batch: (job.batch as u32).clamp(1, 256),
            prog: Arc::new(prog),
            counter,
            frame,
            ifindex: link.ifindex,
            finished: false,
            job,
            state,
            runner: None,
            run_start: 0,
        })
    }
}

/// Writes the run's state when sending begins: the job's deadline and quota, and for a worker
/// sending `job.pps` frames per second the pacing — due from now on, bursts of at most
/// `job.burst` (written now, so no credit has piled up since the map was made: the first
/// frame is due at once, the next one step later).
fn arm(map: &flowlane_io::bpf::ArrayMap, job: &BlastJob) -> Result<(), flowlane_io::SysError> {
    use flowlane_io::ebpf::live_pace::*;
    let mut v = [0u8; VALUE_SIZE];
    let mut put = |at: usize, x: u64| v[at..at + 8].copy_from_slice(&x.to_ne_bytes());
    if let Some(pps) = job.pps {
        let step = ((1e9 * 1024.0) / pps.max(1e-3)).round().max(1.0) as u64;
        put(BASE, os::monotonic_ns());
        put(NEXT, 0);
        put(STEP, step);
        put(SLACK, step.saturating_mul(u64::from(job.burst.max(1)) - 1));
    }
    put(DEADLINE, job.deadline_ns.unwrap_or(u64::MAX));
    put(LIMIT, job.quota.unwrap_or(u64::MAX));
    map.set(0, &v)
}

impl LiveSender {
    /// Starts the run thread once, then books what the program's counter says left.
    fn poll_run(&mut self, st: &BlastStats) -> Result<usize, String> {
        let now = os::monotonic_ns();
        match self.runner.as_mut() {
            None => {
                arm(&self.state, &self.job).map_err(|e| e.to_string())?;
                self.runner = Some(Runner::start(
                    self.prog.clone(),
                    self.frame.clone(),
                    self.ifindex,
                    self.batch,
                )?);
                // Until the program's stamp of its first frame is read at the end (the
                // kernel sets a run up first), the window opens here.
                self.run_start = now;
                return Ok(0);
            }
            Some(r) => {
                if let Some(e) = r.failed() {
                    return Err(e);
                }
            }
        }
        let n = self.book_counter(st, now);
        if self.book.over(now) {
            self.finished = true;
            // Ended, not dropped: its CPU time is still asked for.
            if let Some(r) = self.runner.as_mut() {
                r.end()?;
                self.book_counter(st, os::monotonic_ns());
            }
        }
        Ok(n)
    }

    /// The send window as the program stamped it (first and latest frame, kernel clock; no
    /// later than the deadline), more exact than when this worker looked.
    fn window_from_program(&mut self) {
        use flowlane_io::ebpf::live_pace::{FIRST, LAST};
        let Ok(v) = self.state.get(0) else {
            return;
        };
        let at = |o: usize| {
            v.get(o..o + 8)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u64::from_ne_bytes)
        };
        let (first, last) = (
            at(FIRST),
            at(LAST).min(self.job.deadline_ns.unwrap_or(u64::MAX)),
        );
        if first > 0 && last >= first {
            self.book.first_tx = first;
            self.book.last_tx = last;
        }
    }

    /// Books the frames the program counted since the last look; returns how many.
    fn book_counter(&mut self, st: &BlastStats, now: u64) -> usize {
        let n = self.counter.get(0).saturating_sub(self.book.sent) as usize;
        if n > 0 {
            let first = self.book.sent == 0;
            // No frame leaves after the deadline (the program's rule), whenever this looks.
            let at = now.min(self.job.deadline_ns.unwrap_or(u64::MAX));
            self.book.record(st, at, n, n, n * self.frame.len());
            if first {
                self.book.first_tx = self.run_start.min(at);
            }
        }
        n
    }
}

impl Poll for LiveSender {
    type Stats = BlastStats;
    type Report = BlastReport;

    fn poll(
        &mut self,
        _budget: usize,
        st: &BlastStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        Ok(self.poll_run(st)?)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        // The run thread shares this CPU: look in every few ms only.
        std::thread::sleep(std::time::Duration::from_millis(
            timeout_ms.clamp(1, 5) as u64
        ));
        Ok(())
    }

    fn done(&self) -> bool {
        self.finished
    }

    fn helper_cpu_ns(&self) -> u64 {
        self.runner.as_ref().map_or(0, Runner::cpu_ns)
    }

    fn finish(&mut self, st: &BlastStats) -> Option<BlastReport> {
        if let Some(r) = self.runner.as_mut() {
            // An error here has no one left to hear it; the counter below is still exact.
            let _ = r.end();
            self.book_counter(st, os::monotonic_ns());
        }
        self.window_from_program();
        // Frame n went to flow n % flows: the per-flow counts follow from the total.
        let total = self.counter.get(0);
        let nflows = self.job.flows.len() as u64;
        let sent: Vec<u64> = (0..nflows)
            .map(|k| total / nflows + u64::from(k < total % nflows))
            .collect();
        Some(self.book.report(&self.job.flows, &sent, None, None))
    }
}
