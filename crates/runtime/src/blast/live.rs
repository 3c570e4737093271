//! The live-frames sender: no socket, a generated XDP program run by `BPF_PROG_TEST_RUN`.

use std::sync::{Arc, Mutex};

use flowlane_io::os;

use flowlane_wire::{FlowHeader, HEADER_LEN};

use super::BlastStats;
use super::{BlastError, BlastJob, BlastReport, RawLink, TxBook};
use crate::Poll;

/// How long one live-frames run should last. Each `BPF_PROG_TEST_RUN` call costs about 20 ms
/// of set-up and tear-down whatever its length (measured on the development VM: one frame or
/// 8192 frames per call take the same time; docs/benchmarks-history.md), so runs must be long for that to
/// vanish, and short enough that a stop is seen quickly.
const LIVE_RUN_NS: u64 = 200_000_000;
/// Frames in the first run, before the rate is known, and the bounds of later runs.
const LIVE_FIRST: usize = 65_536;
const LIVE_MIN: usize = 4096;
const LIVE_MAX: usize = 1 << 24;

/// A sending worker that makes no socket at all: an XDP program, generated for its flows
/// ([`flowlane_io::ebpf::live_tx_program`]), is run by `BPF_PROG_TEST_RUN` in live-frames
/// mode on copies of one frame and sends each out of the interface with XDP_TX — no skb, no
/// ring to refill (what xdp-trafficgen does). The program stamps flow, sequence number and
/// time into every frame and counts the frames it released in a map this worker reads, so
/// `sent` is the kernel's own count. Needs Linux 5.18+ and CAP_BPF + CAP_NET_ADMIN; on veth the
/// peer must run NAPI (an XDP program or GRO), else veth drops the frames.
#[derive(Debug)]
pub struct LiveBlaster {
    job: BlastJob,
    prog: std::os::fd::OwnedFd,
    counter: flowlane_io::bpf::MappedArray,
    /// The frame each run starts from (flow 0's template; the program rewrites the headers).
    frame: Vec<u8>,
    ifindex: u32,
    batch: u32,
    /// Frames in the next run (sized from the rate the last run achieved).
    chunk: usize,
    book: TxBook,
    finished: bool,
    report: Arc<Mutex<Option<BlastReport>>>,
}

impl LiveBlaster {
    /// Builds the flows' header entries, the counter and the program.
    pub fn new(
        job: BlastJob,
        link: &RawLink,
        report: Arc<Mutex<Option<BlastReport>>>,
    ) -> Result<LiveBlaster, BlastError> {
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
            }
        }
        let counter = flowlane_io::bpf::MappedArray::new("fl_live_count", 1).map_err(bpf_err)?;
        let insns = live_tx_program(&LiveTx {
            counter_fd: counter.fd(),
            flows_fd: flows_map.raw_fd(),
            flows: job.flows.len() as u32,
            hdr_len: layout.0,
            seq_off: layout.1,
            csum_off: layout.2,
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
        Ok(LiveBlaster {
            book: TxBook::new(&job),
            batch: (job.batch as u32).clamp(1, 256),
            chunk: LIVE_FIRST,
            prog,
            counter,
            frame,
            ifindex: link.ifindex,
            finished: false,
            report,
            job,
        })
    }
}

impl Poll for LiveBlaster {
    type Stats = BlastStats;

    fn poll(&mut self, budget: usize, st: &BlastStats) -> Result<usize, String> {
        let start = os::monotonic_ns();
        if self.book.over(start) {
            self.finished = true;
            return Ok(0);
        }
        let mut want = self.chunk.max(budget);
        if let (Some(d), Some(pps)) = (self.book.deadline_ns, self.book.rate_so_far()) {
            // Do not run far past the deadline.
            let left = d.saturating_sub(start) as f64 / 1e9;
            want = want.min((left * pps) as usize + 1);
        }
        let n = self.book.allow(start, want);
        if n == 0 {
            return Ok(0);
        }
        let before = self.counter.get(0);
        flowlane_io::bpf::xdp_test_run_live(
            &self.prog,
            &self.frame,
            self.ifindex,
            0,
            n as u32,
            self.batch,
        )
        .map_err(|e| e.to_string())?;
        let ran = self.counter.get(0).saturating_sub(before) as usize;
        let end = os::monotonic_ns();
        let first = self.book.sent == 0;
        // The run takes milliseconds: the window ends when it returns, not when it began.
        self.book.record(st, end, n, ran, ran * self.frame.len());
        if first && ran > 0 {
            self.book.first_tx = start;
        }
        if n >= self.chunk / 2 && end > start {
            let pps = ran as f64 * 1e9 / (end - start) as f64;
            self.chunk = ((pps * LIVE_RUN_NS as f64 / 1e9) as usize).clamp(LIVE_MIN, LIVE_MAX);
        }
        Ok(ran)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), String> {
        self.book.sleep(timeout_ms);
        Ok(())
    }

    fn done(&self) -> bool {
        self.finished
    }

    fn finish(&mut self, _st: &BlastStats) {
        // Frame n went to flow n % flows: the per-flow counts follow from the total.
        let total = self.counter.get(0);
        let nflows = self.job.flows.len() as u64;
        let sent: Vec<u64> = (0..nflows)
            .map(|k| total / nflows + u64::from(k < total % nflows))
            .collect();
        self.book
            .publish(&self.report, &self.job.flows, &sent, None, None);
    }
}
