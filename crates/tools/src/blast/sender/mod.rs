//! The traffic generator's senders behind `flowlane blast`: one worker per CPU, each owning a
//! contiguous range of flows, sending datagrams whose payload starts with the flowlane header
//! (flow, sequence number, transmit time). Three kinds, chosen once at start-up ([`Sender`]):
//!
//! * [`UdpSender`] (`udp.rs`): one connected socket per flow, `sendmmsg` batches; with
//!   `echo`, the same sockets take the echoes back and the worker accounts loss, reordering,
//!   duplicates and round-trip time per flow.
//! * [`RingSender`] (`frames.rs`): whole frames on a ring — AF_PACKET's TX ring or AF_XDP —
//!   through io's [`FrameTx`] vocabulary.
//! * [`LiveSender`] (`live.rs`): no socket: a generated XDP program run in live-frames mode.
//!
//! Nothing is allocated per packet: the batch's buffers are written in place. What every kind
//! keeps about its sending — pacing, quota, deadline, the send window — is one [`TxBook`].

mod live;
mod ring;
pub mod spray;
mod udp;

use std::net::SocketAddr;
use std::time::Duration;

use flowlane_io::{frame, os, SysError};
use flowlane_wire::seq::SeqTracker;
use hdrhistogram::Histogram;

pub use flowlane_io::frame::FrameTx;
pub use live::LiveSender;
pub use ring::{packet_ring, xdp_socket, RawLink, RingSender};
pub use udp::UdpSender;

use flowlane_runtime::pace::Pacer;
use flowlane_runtime::{bump, counters, Poll};

counters! {
    /// What a sender counts.
    pub struct BlastStats => BlastSnapshot {
        /// Datagrams (or frames) sent.
        tx_packets,
        /// Their bytes (UDP payload for sockets, whole frames for rings).
        tx_bytes,
        /// Sends the kernel took only partly or not at all (socket buffer or ring full).
        tx_full,
        /// Frame modes cutting datagrams: the datagrams cut, and the fragment frames they
        /// became (`tx_packets` counts datagrams).
        tx_fragmented,
        tx_fragments,
        /// Frames the ring handed back as refused by the device.
        ring_refused,
        /// ICMP errors reported on sends (e.g. port unreachable: nothing listens at the
        /// destination), or batches cut short by one; the unsent rest is retried at once.
        icmp_errors,
        /// Echoes received (echo mode).
        rx_packets,
        /// Their payload bytes.
        rx_bytes,
        /// Received datagrams without a valid flowlane header, or of a flow this worker does
        /// not own.
        foreign,
        /// Echoes the kernel dropped because this sender's receive buffer was full.
        echo_socket_drops,
    }
}

/// One flow: a source this worker binds and the destination it sends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// Flow id carried in the header (unique across workers).
    pub id: u16,
    /// Local address (bound).
    pub src: SocketAddr,
    /// Destination.
    pub dst: SocketAddr,
}

/// One worker's job.
#[derive(Debug, Clone)]
pub struct BlastJob {
    /// Flows, ids contiguous and ascending.
    pub flows: Vec<Flow>,
    /// UDP payload bytes per datagram: one size, or a pattern that each flow cycles through
    /// (datagram `seq` of a flow has `payloads[seq % len]`; IMIX). Never empty.
    pub payloads: Vec<usize>,
    /// Frame bytes around the payload (Ethernet, [VLAN,] IP and UDP headers): `tx_bytes` counts
    /// whole frames (FCS excluded) in every mode.
    pub overhead: usize,
    /// Datagrams to send (`None`: until the deadline or a stop).
    pub quota: Option<u64>,
    /// Datagrams per second for this worker (`None`: as fast as possible).
    pub pps: Option<f64>,
    /// Most datagrams that may leave at once when paced.
    pub burst: u32,
    /// When paced, how long a late sender may catch up on what fell due (bursts back to
    /// back); a longer stall gives up the rest (see [`flowlane_runtime::pace`]).
    pub catch_up: Duration,
    /// Datagrams per `sendmmsg`.
    pub batch: usize,
    /// Take echoes back and account them.
    pub echo: bool,
    /// After sending, wait this long for the last echoes.
    pub linger: Duration,
    /// Receive buffer for echoes, bytes (`None`: 8 MiB).
    pub rcvbuf: Option<usize>,
    /// Stop sending at this CLOCK_MONOTONIC time (ns).
    pub deadline_ns: Option<u64>,
    /// Frame modes: send these frames of a capture, in this order, round and round, instead
    /// of building one per (flow, size) (`payloads` is then unused).
    pub replay: Vec<ReplayFrame>,
    /// Frame modes: per-packet destinations from ranges, MAC counts and `flowlen`
    /// (pktgen's), written into each frame (`None`: every flow keeps its destination).
    pub spray: Option<spray::SprayJob>,
    /// Frame modes: datagrams cut into IP fragments, and this worker's share of the IP
    /// identification space (ids `w`, `w + n`, … for worker `w` of `n`).
    pub fragments: Option<(super::Fragmenting, u32, u32)>,
    /// UDP mode: per entry of `payloads`, the IP fragments the kernel cuts it into at the
    /// path MTU (empty: none is cut). The sockets then allow fragmenting, and each datagram
    /// sent is counted by them.
    pub kernel_pieces: Vec<u32>,
}

/// A captured frame to send (`blast --pcap`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayFrame {
    /// A UDP frame that carries the flowlane header of flow `flow` (an index into the job's
    /// flows) — stamped per packet like a built template.
    Stamp {
        /// The frame, checksums valid.
        template: flowlane_wire::Template,
        /// Its flow: an index into [`BlastJob::flows`].
        flow: usize,
    },
    /// A frame sent as it is, byte for byte.
    Verbatim(Vec<u8>),
}

/// What a flow saw, for the summary.
#[derive(Debug, Clone)]
pub struct FlowResult {
    /// The flow.
    pub flow: Flow,
    /// Datagrams sent.
    pub sent: u64,
    /// Echo accounting.
    pub rx: SeqTracker,
}

/// A worker's results, handed over when its loop ends.
#[derive(Debug, Clone)]
pub struct BlastReport {
    /// Per flow, in id order.
    pub flows: Vec<FlowResult>,
    /// Round-trip times of echoes, ns (none without echoes).
    pub rtt_ns: Option<Histogram<u64>>,
    /// When the first datagram left and the last one left (CLOCK_MONOTONIC ns).
    pub tx_window_ns: (u64, u64),
    /// Paced: datagrams whose time passed in stalls longer than the catch-up, and the most a
    /// due datagram waited for the sender (ns). Zero unpaced.
    pub forfeited: u64,
    pub late_max_ns: u64,
    /// With ranges: destinations drawn (each a new 5-tuple); else 0.
    pub flows_started: u64,
}

/// Why a worker could not be made.
#[derive(Debug)]
pub enum BlastError {
    /// A flow's socket could not be opened, bound or connected.
    Socket {
        /// The flow's source.
        src: SocketAddr,
        /// The failed call.
        error: SysError,
    },
    /// The job is impossible (e.g. no flows).
    Job(String),
    /// A generated BPF program was refused by the kernel's verifier (a flowlane bug).
    Program(String),
}

impl std::fmt::Display for BlastError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlastError::Socket { src, error } => write!(f, "flow from {src}: {error}"),
            BlastError::Job(s) | BlastError::Program(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for BlastError {}

/// What both senders keep about their sending: how much may leave now, what left, and when.
#[derive(Debug)]
struct TxBook {
    pacer: Option<Pacer>,
    quota: Option<u64>,
    deadline_ns: Option<u64>,
    sent: u64,
    first_tx: u64,
    last_tx: u64,
}

impl TxBook {
    fn new(job: &BlastJob) -> TxBook {
        let now = os::monotonic_ns();
        TxBook {
            pacer: job
                .pps
                .map(|p| Pacer::new(p, job.burst, job.catch_up.as_nanos() as u64, now)),
            quota: job.quota,
            deadline_ns: job.deadline_ns,
            sent: 0,
            first_tx: 0,
            last_tx: 0,
        }
    }

    /// Sending is over: quota reached or deadline passed.
    fn over(&self, now: u64) -> bool {
        self.quota.is_some_and(|q| self.sent >= q) || self.deadline_ns.is_some_and(|d| now >= d)
    }

    /// Datagrams that may leave now, at most `max`.
    fn allow(&mut self, now: u64, max: usize) -> usize {
        let mut n = max;
        if let Some(q) = self.quota {
            n = n.min(q.saturating_sub(self.sent) as usize);
        }
        if let Some(p) = self.pacer.as_mut() {
            n = p.allowed(now, n);
        }
        n
    }

    /// Records `sent` of `asked` datagrams (`bytes` in all) leaving at `now`.
    fn record(&mut self, st: &BlastStats, now: u64, asked: usize, sent: usize, bytes: usize) {
        if sent > 0 {
            if self.sent == 0 {
                self.first_tx = now;
            }
            self.last_tx = now;
        }
        self.sent += sent as u64;
        if let Some(p) = self.pacer.as_mut() {
            p.sent(sent);
        }
        bump(&st.tx_packets, sent as u64);
        bump(&st.tx_bytes, bytes as u64);
        if sent < asked {
            bump(&st.tx_full, 1);
        }
    }

    /// How long to wait before the next datagram is due (`idle` when unpaced).
    fn wait(&self, now: u64, idle: Duration) -> Duration {
        match &self.pacer {
            Some(p) => Duration::from_nanos(p.wait_ns(now)),
            None => idle,
        }
    }

    /// Sleeps until the next frame is due (20 µs when unpaced), at most `timeout_ms`.
    fn sleep(&self, timeout_ms: i32) {
        let d = self.wait(os::monotonic_ns(), Duration::from_micros(20));
        pause(d, Duration::from_millis(timeout_ms.max(1) as u64));
    }

    /// The per-flow counts as the worker's report.
    fn report(
        &self,
        flows: &[Flow],
        sent: &[u64],
        rx: Option<&[SeqTracker]>,
        rtt_ns: Option<Histogram<u64>>,
    ) -> BlastReport {
        let flows = flows
            .iter()
            .zip(sent)
            .enumerate()
            .map(|(i, (&flow, &sent))| FlowResult {
                flow,
                sent,
                rx: rx.and_then(|r| r.get(i)).cloned().unwrap_or_default(),
            })
            .collect();
        BlastReport {
            flows,
            rtt_ns,
            tx_window_ns: (self.first_tx, self.last_tx),
            forfeited: self.pacer.as_ref().map_or(0, Pacer::forfeited),
            late_max_ns: self.pacer.as_ref().map_or(0, Pacer::late_max_ns),
            flows_started: 0,
        }
    }
}

/// An error a connected UDP socket reports for an ICMP message (port or host unreachable).
fn icmp_error(e: &SysError) -> bool {
    matches!(
        e.source.raw_os_error(),
        Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH)
    )
}

/// Sleeps `d` (at most `max`); below a sleep's own overhead, yields until due.
fn pause(d: Duration, max: Duration) {
    if d >= Duration::from_micros(60) {
        std::thread::sleep(d.min(max));
    } else if !d.is_zero() {
        let end = os::monotonic_ns() + d.as_nanos() as u64;
        while os::monotonic_ns() < end {
            std::thread::yield_now();
        }
    }
}

/// A sender of either kind, chosen once at start-up (one `match` per batch, none per packet).
#[derive(Debug)]
pub enum Sender {
    /// UDP sockets (boxed, as is Raw: one per worker, so the indirection costs nothing).
    Udp(Box<UdpSender>),
    /// AF_PACKET TX ring.
    Raw(Box<RingSender<frame::TxRing>>),
    /// AF_XDP socket (copy mode where the driver has no zero-copy).
    Xdp(Box<RingSender<frame::XskTx>>),
    /// Live XDP frames (`BPF_PROG_TEST_RUN`), no socket.
    Live(Box<LiveSender>),
}

impl Poll for Sender {
    type Stats = BlastStats;
    type Report = BlastReport;

    fn poll(
        &mut self,
        budget: usize,
        st: &BlastStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        match self {
            Sender::Udp(s) => s.poll(budget, st),
            Sender::Raw(s) => s.poll(budget, st),
            Sender::Xdp(s) => s.poll(budget, st),
            Sender::Live(s) => s.poll(budget, st),
        }
    }
    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        match self {
            Sender::Udp(s) => s.wait(timeout_ms),
            Sender::Raw(s) => s.wait(timeout_ms),
            Sender::Xdp(s) => s.wait(timeout_ms),
            Sender::Live(s) => s.wait(timeout_ms),
        }
    }
    fn idle(&mut self, st: &BlastStats) {
        match self {
            Sender::Udp(s) => s.idle(st),
            Sender::Raw(s) => s.idle(st),
            Sender::Xdp(s) => s.idle(st),
            Sender::Live(s) => s.idle(st),
        }
    }
    fn done(&self) -> bool {
        match self {
            Sender::Udp(s) => s.done(),
            Sender::Raw(s) => s.done(),
            Sender::Xdp(s) => s.done(),
            Sender::Live(s) => s.done(),
        }
    }
    fn publish(&mut self, last: bool) {
        // Only UDP echoes are timed.
        if let Sender::Udp(s) = self {
            s.publish(last);
        }
    }

    fn finish(&mut self, st: &BlastStats) -> Option<BlastReport> {
        match self {
            Sender::Udp(s) => s.finish(st),
            Sender::Raw(s) => s.finish(st),
            Sender::Xdp(s) => s.finish(st),
            Sender::Live(s) => s.finish(st),
        }
    }

    fn helper_cpu_ns(&self) -> u64 {
        // Only the live-frames sender sends from another thread (its kernel run).
        match self {
            Sender::Live(s) => s.helper_cpu_ns(),
            _ => 0,
        }
    }
}
