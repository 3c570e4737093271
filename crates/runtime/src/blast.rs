//! The UDP traffic generator behind `flowlane blast --mode udp`: one worker per CPU, each owning
//! a contiguous range of flows (one connected socket per flow), sending `sendmmsg` batches of
//! datagrams whose payload starts with the flowlane header (flow, sequence number, transmit
//! time). With `echo`, the same sockets take the echoes back and the worker accounts loss,
//! reordering, duplicates and round-trip time per flow.
//!
//! Nothing is allocated per packet: the batch's buffers are written in place.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flowlane_io::socket::{MmsgBatch, SendBatch};
use flowlane_io::{frame, os, socket, SysError};
use flowlane_wire::seq::SeqTracker;
use flowlane_wire::{FlowHeader, HEADER_LEN};
use hdrhistogram::Histogram;

use crate::pace::Pacer;
use crate::{bump, Poll, WorkerStats};

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
            pacer: job.pps.map(|p| Pacer::new(p, job.burst, now)),
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
    fn record(&mut self, st: &WorkerStats, now: u64, asked: usize, sent: usize, bytes: usize) {
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

    /// Datagrams per second so far (`None` before two sends).
    fn rate_so_far(&self) -> Option<f64> {
        let span = self.last_tx.saturating_sub(self.first_tx);
        (self.sent > 0 && span > 0).then(|| self.sent as f64 * 1e9 / span as f64)
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

    /// Hands the per-flow counts over as the worker's report.
    fn publish(
        &self,
        to: &Mutex<Option<BlastReport>>,
        flows: &[Flow],
        sent: &[u64],
        rx: Option<&[SeqTracker]>,
        rtt_ns: Option<Histogram<u64>>,
    ) {
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
        if let Ok(mut g) = to.lock() {
            *g = Some(BlastReport {
                flows,
                rtt_ns,
                tx_window_ns: (self.first_tx, self.last_tx),
            });
        }
    }
}

/// A sending worker.
#[derive(Debug)]
pub struct UdpBlaster {
    job: BlastJob,
    socks: Vec<UdpSocket>,
    seq: Vec<u64>,
    rx: Vec<SeqTracker>,
    out: SendBatch,
    out_dst: SocketAddr,
    inb: Option<MmsgBatch>,
    /// With echoes: every flow socket, so a wait ends when an echo arrives (its round-trip
    /// time then includes no pacing sleep), and a round reads only sockets with input.
    epoll: Option<socket::Epoll>,
    ready: Vec<u64>,
    book: TxBook,
    rtt: Histogram<u64>,
    /// Per flow: datagrams still to send (with a quota, split evenly over the flows).
    left: Option<Vec<u64>>,
    next_flow: usize,
    linger_until: Option<u64>,
    finished: bool,
    report: Arc<Mutex<Option<BlastReport>>>,
}

fn sock_err(src: SocketAddr, call: &'static str) -> impl FnOnce(std::io::Error) -> BlastError {
    move |source| BlastError::Socket {
        src,
        error: SysError { call, source },
    }
}

impl UdpBlaster {
    /// Opens one socket per flow (bound to its source, connected to its destination, so only
    /// the destination's datagrams come back to it). The report appears in `report` when the
    /// worker's loop ends.
    pub fn new(
        mut job: BlastJob,
        report: Arc<Mutex<Option<BlastReport>>>,
    ) -> Result<UdpBlaster, BlastError> {
        let first = *job
            .flows
            .first()
            .ok_or_else(|| BlastError::Job("a worker without flows".into()))?;
        let mut socks = Vec::with_capacity(job.flows.len());
        for f in job.flows.iter_mut() {
            let s = UdpSocket::bind(f.src).map_err(sock_err(f.src, "bind"))?;
            s.connect(f.dst).map_err(sock_err(f.src, "connect"))?;
            // The source as it is now: the port (and address) the kernel chose where the flow
            // left them open, so the report names the real 4-tuple (e.g. for `flowlane hash`).
            f.src = s.local_addr().map_err(sock_err(f.src, "getsockname"))?;
            s.set_nonblocking(true)
                .map_err(sock_err(f.src, "fcntl(O_NONBLOCK)"))?;
            // A deep send buffer: a scheduling hiccup on this core should not turn into EAGAIN.
            let deep = 4 << 20;
            if socket::set_int(
                &s,
                libc::SOL_SOCKET,
                libc::SO_SNDBUFFORCE,
                deep,
                "SO_SNDBUFFORCE",
            )
            .is_err()
            {
                let _ = socket::set_int(&s, libc::SOL_SOCKET, libc::SO_SNDBUF, deep, "SO_SNDBUF");
            }
            if job.echo {
                // Room for echoes while the thread is busy sending: forced where allowed
                // (CAP_NET_ADMIN), else whatever net.core.rmem_max grants. Drops that still
                // happen are counted (`socket_drops`) and reported as this host's own.
                let big = job.rcvbuf.unwrap_or(8 << 20).min(i32::MAX as usize) as i32;
                if socket::set_int(
                    &s,
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    big,
                    "SO_RCVBUFFORCE",
                )
                .is_err()
                {
                    let _ =
                        socket::set_int(&s, libc::SOL_SOCKET, libc::SO_RCVBUF, big, "SO_RCVBUF");
                }
            }
            socks.push(s);
        }
        let slots = job.batch.clamp(1, 1024);
        let largest = job.payloads.iter().copied().max().unwrap_or(0);
        let mut out = SendBatch::new(slots, largest.max(1), first.dst);
        for i in 0..slots {
            // Bytes after the header count up, so a capture shows a recognisable pattern.
            for (k, b) in out.slot_mut(i, largest).iter_mut().enumerate() {
                *b = k as u8;
            }
        }
        let n = job.flows.len();
        let epoll = if job.echo {
            let mut ep = socket::Epoll::new().map_err(|error| BlastError::Socket {
                src: first.src,
                error,
            })?;
            for (i, s) in socks.iter().enumerate() {
                ep.add(s, i as u64).map_err(|error| BlastError::Socket {
                    src: job.flows[i].src,
                    error,
                })?;
            }
            Some(ep)
        } else {
            None
        };
        Ok(UdpBlaster {
            inb: job.echo.then(|| MmsgBatch::new(64, 2048)),
            epoll,
            ready: Vec::new(),
            socks,
            seq: vec![0; n],
            rx: vec![SeqTracker::default(); n],
            out,
            out_dst: first.dst,
            book: TxBook::new(&job),
            // 1 ns .. 100 s, 3 significant digits.
            rtt: Histogram::new_with_bounds(1, 100_000_000_000, 3)
                .map_err(|e| BlastError::Job(format!("histogram: {e}")))?,
            left: job.quota.map(|q| {
                let n = job.flows.len() as u64;
                (0..n).map(|i| q / n + u64::from(i < q % n)).collect()
            }),
            next_flow: 0,
            linger_until: None,
            finished: false,
            report,
            job,
        })
    }

    /// Reads echoes waiting on flow `i`'s socket.
    fn drain(&mut self, i: usize, st: &WorkerStats) -> Result<usize, String> {
        let Some(inb) = self.inb.as_mut() else {
            return Ok(0);
        };
        let first_id = self.job.flows.first().map_or(0, |f| f.id);
        let mut total = 0;
        loop {
            let n = match inb.recv(&self.socks[i], 64) {
                Ok(n) => n,
                // The connected socket's pending ICMP error surfaces on whichever call comes
                // next, a receive as well as a send: count it, as on send, and go on.
                Err(e) if icmp_error(&e) => {
                    bump(&st.icmp_errors, 1);
                    break;
                }
                Err(e) => return Err(format!("receiving echoes: {e}")),
            };
            if n == 0 {
                break;
            }
            let now = os::monotonic_ns();
            let (mut bytes, mut foreign) = (0u64, 0u64);
            for k in 0..n {
                let p = inb.payload(k);
                bytes += p.len() as u64;
                let idx = FlowHeader::read(p)
                    .ok()
                    .and_then(|h| Some((h, h.flow.checked_sub(first_id)? as usize)))
                    .filter(|&(_, idx)| idx < self.rx.len());
                match idx {
                    Some((h, idx)) => {
                        self.rx[idx].record(h.seq);
                        if now >= h.tx_ns {
                            // Out-of-range values saturate instead of failing.
                            self.rtt.saturating_record(now - h.tx_ns);
                        }
                    }
                    None => foreign += 1,
                }
            }
            bump(&st.rx_packets, n as u64);
            bump(&st.rx_bytes, bytes);
            if foreign > 0 {
                bump(&st.foreign, foreign);
            }
            total += n;
            if n < 64 {
                break;
            }
        }
        Ok(total)
    }

    fn send_round(&mut self, budget: usize, now: u64, st: &WorkerStats) -> Result<usize, String> {
        let mut n = self.book.allow(now, budget.min(self.out.slots()));
        if n == 0 {
            return Ok(0);
        }
        // The next flow with datagrams left (all of them when there is no quota).
        let nflows = self.socks.len();
        let mut i = self.next_flow;
        if let Some(left) = &self.left {
            for _ in 0..nflows {
                if left[i] > 0 {
                    break;
                }
                i = (i + 1) % nflows;
            }
            n = n.min(left[i] as usize);
            if n == 0 {
                return Ok(0);
            }
        }
        self.next_flow = (i + 1) % nflows;
        let flow = self.job.flows[i];
        if flow.dst != self.out_dst {
            for s in 0..self.out.slots() {
                self.out.set_dest(s, flow.dst);
            }
            self.out_dst = flow.dst;
        }
        let seq0 = self.seq[i];
        let sizes = &self.job.payloads;
        for k in 0..n {
            let seq = seq0 + k as u64;
            let h = FlowHeader {
                flow: flow.id,
                seq: seq as u32,
                tx_ns: now,
            };
            let slot = self
                .out
                .slot_mut(k, sizes[(seq % sizes.len() as u64) as usize]);
            if slot.len() >= HEADER_LEN {
                h.write(slot);
            }
        }
        // A connected socket reports an ICMP error (port unreachable, …) that arrived for an
        // earlier datagram on its next send. If that send was the first of a sendmmsg batch the
        // call fails with it; if not, the kernel cuts the batch short and drops the error. So a
        // short batch is retried at once: taken now means the cut was such an error (counted),
        // refused (0) means the socket buffer is full.
        let mut sent = 0;
        let mut cut_short = false;
        for _ in 0..4 {
            match self.out.send_range(&self.socks[i], sent, n) {
                Ok(0) => break,
                Ok(k) => {
                    if cut_short {
                        bump(&st.icmp_errors, 1);
                    }
                    sent += k;
                    cut_short = sent < n;
                    if !cut_short {
                        break;
                    }
                }
                Err(e) if icmp_error(&e) => {
                    bump(&st.icmp_errors, 1);
                    cut_short = false;
                }
                Err(e) => return Err(format!("flow {}: {e}", flow.id)),
            }
        }
        if let Some(left) = self.left.as_mut() {
            left[i] -= sent as u64;
        }
        let bytes: usize = (0..sent).map(|k| self.out.len(k) + self.job.overhead).sum();
        self.seq[i] += sent as u64;
        self.book.record(st, now, n, sent, bytes);
        Ok(sent)
    }

    /// Reads the echoes waiting on every socket with input.
    fn drain_ready(&mut self, st: &WorkerStats) -> Result<usize, String> {
        let Some(ep) = self.epoll.as_mut() else {
            return Ok(0);
        };
        let mut ready = std::mem::take(&mut self.ready);
        ep.ready(&mut ready).map_err(|e| e.to_string())?;
        let mut got = 0;
        for &i in &ready {
            got += self.drain(i as usize, st)?;
        }
        self.ready = ready;
        Ok(got)
    }
}

impl Poll for UdpBlaster {
    fn poll(&mut self, budget: usize, st: &WorkerStats) -> Result<usize, String> {
        let now = os::monotonic_ns();
        if !self.book.over(now) {
            let got = self.drain_ready(st)?;
            return Ok(self.send_round(budget, now, st)? + got);
        }
        // Sending is over: collect the last echoes, then finish.
        let until = *self.linger_until.get_or_insert(
            now + if self.job.echo {
                self.job.linger.as_nanos() as u64
            } else {
                0
            },
        );
        let mut got = 0;
        for i in 0..self.socks.len() {
            got += self.drain(i, st)?;
        }
        let all_back = self.rx.iter().zip(&self.seq).all(|(r, &s)| r.unique >= s);
        if now >= until || !self.job.echo || all_back {
            self.finished = true;
        }
        Ok(got)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), String> {
        let now = os::monotonic_ns();
        let d = match self.linger_until {
            Some(_) => Duration::from_micros(200),
            // Unpaced and short: the socket buffer was full; let the kernel drain it.
            None => self.book.wait(now, Duration::from_micros(20)),
        };
        let max = Duration::from_millis(timeout_ms.max(1) as u64);
        match &self.epoll {
            Some(ep) => ep.wait(d.min(max)).map(drop).map_err(|e| e.to_string()),
            None => {
                pause(d, max);
                Ok(())
            }
        }
    }

    fn done(&self) -> bool {
        self.finished
    }

    fn idle(&mut self, st: &WorkerStats) {
        if self.finished || self.linger_until.is_some() {
            let drops: u64 = self
                .socks
                .iter()
                .filter_map(|s| socket::socket_drops(s).ok())
                .map(u64::from)
                .sum();
            crate::set(&st.socket_drops, drops);
        }
    }

    fn finish(&mut self, _st: &WorkerStats) {
        self.book.publish(
            &self.report,
            &self.job.flows,
            &self.seq,
            Some(&self.rx),
            self.job.echo.then(|| self.rtt.clone()),
        );
    }
}

/// A transmit ring of whole frames: AF_PACKET's TX ring or an AF_XDP socket's UMEM.
pub trait FrameTx: Send + std::fmt::Debug + 'static {
    /// Slots (frames) in the ring.
    fn slots(&self) -> usize;
    /// Slot `i`'s buffer, to write a template into before the first send.
    fn slot_buf(&mut self, i: usize) -> Option<&mut [u8]>;
    /// Queues up to `max` frames; `fill(slot, buf)` patches one and returns its length.
    fn queue(&mut self, max: usize, fill: &mut dyn FnMut(usize, &mut [u8]) -> usize) -> usize;
    /// Asks the kernel to transmit what is queued.
    fn kick(&mut self) -> Result<(), SysError>;
    /// Frames the kernel holds (queued or in transmission).
    fn in_flight(&mut self) -> usize;
    /// Frames the kernel refused as malformed.
    fn refused(&self) -> u64;
}

impl FrameTx for frame::TxRing {
    fn slots(&self) -> usize {
        self.frames()
    }
    fn slot_buf(&mut self, i: usize) -> Option<&mut [u8]> {
        self.slot_mut(i)
    }
    fn queue(&mut self, max: usize, fill: &mut dyn FnMut(usize, &mut [u8]) -> usize) -> usize {
        frame::TxRing::queue(self, max, fill)
    }
    fn kick(&mut self) -> Result<(), SysError> {
        frame::TxRing::kick(self)
    }
    fn in_flight(&mut self) -> usize {
        frame::TxRing::in_flight(self)
    }
    fn refused(&self) -> u64 {
        self.wrong_format
    }
}

impl FrameTx for frame::XskTx {
    fn slots(&self) -> usize {
        self.frames() as usize
    }
    fn slot_buf(&mut self, i: usize) -> Option<&mut [u8]> {
        Some(self.frame_mut(i as u32))
    }
    fn queue(&mut self, max: usize, fill: &mut dyn FnMut(usize, &mut [u8]) -> usize) -> usize {
        self.send(max as u32, |i, b| fill(i as usize, b)) as usize
    }
    fn kick(&mut self) -> Result<(), SysError> {
        // In copy mode one wakeup transmits a bounded batch (32 by default): repeat while
        // descriptors wait, a few times at most per round.
        for _ in 0..8 {
            if self.tx_pending() == 0 {
                break;
            }
            frame::XskTx::kick(self)?;
        }
        Ok(())
    }
    fn in_flight(&mut self) -> usize {
        self.reap();
        self.frames() as usize - self.free() as usize
    }
    fn refused(&self) -> u64 {
        self.tx_invalid()
    }
}

/// Where raw frames go and how they are addressed.
#[derive(Debug, Clone)]
pub struct RawLink {
    /// Interface index (in the worker's namespace).
    pub ifindex: u32,
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// 802.1Q tag, if any.
    pub vlan: Option<u16>,
    /// The largest frame sent (FCS excluded): ring slots hold it.
    pub max_frame: usize,
    /// Skip the qdisc layer.
    pub qdisc_bypass: bool,
}

/// A sending worker on a frame ring (AF_PACKET TX ring or AF_XDP UMEM). Every (flow, size)
/// has a template frame, built once; a slot keeps the frame last written into it, so when it
/// comes round for the same (flow, size) again only the flowlane header is patched (with an
/// incremental UDP checksum update) — with one size and a flow count dividing the ring, that is
/// every time after the first lap.
#[derive(Debug)]
pub struct RawBlaster<T: FrameTx> {
    job: BlastJob,
    ring: T,
    /// `templates[flow * sizes + size]`.
    templates: Vec<flowlane_wire::Template>,
    /// Per slot: the template index its frame was copied from (`u32::MAX`: none yet).
    slot_holds: Vec<u32>,
    seq: Vec<u64>,
    /// Frames queued by this worker (picks the flow: round robin).
    queued: u64,
    book: TxBook,
    finished: bool,
    report: Arc<Mutex<Option<BlastReport>>>,
}

/// Opens an AF_PACKET TX ring for `link`.
pub fn packet_ring(link: &RawLink) -> Result<frame::TxRing, SysError> {
    frame::TxRing::open(link.ifindex, 2048, link.max_frame + 32, link.qdisc_bypass)
}

/// Opens an AF_XDP socket (copy mode) on `link`'s interface, queue `queue`.
pub fn xdp_socket(link: &RawLink, queue: u32) -> Result<frame::XskTx, SysError> {
    frame::XskTx::open(link.ifindex, queue, 4096, link.max_frame.max(2048))
}

impl<T: FrameTx> RawBlaster<T> {
    /// Builds every (flow, size) template once.
    pub fn new(
        job: BlastJob,
        link: &RawLink,
        ring: T,
        report: Arc<Mutex<Option<BlastReport>>>,
    ) -> Result<RawBlaster<T>, BlastError> {
        if job.flows.is_empty() || job.payloads.is_empty() {
            return Err(BlastError::Job("a worker without flows or sizes".into()));
        }
        let mut templates = Vec::with_capacity(job.flows.len() * job.payloads.len());
        for f in &job.flows {
            for &p in &job.payloads {
                let t = flowlane_wire::Template::build(&flowlane_wire::TemplateSpec {
                    src_mac: link.src_mac,
                    dst_mac: link.dst_mac,
                    vlan: link.vlan,
                    src: f.src,
                    dst: f.dst,
                    frame_len: p + job.overhead,
                })
                .map_err(|e| BlastError::Job(format!("flow {}: {e}", f.id)))?;
                templates.push(t);
            }
        }
        let mut ring = ring;
        let largest = templates.iter().map(|t| t.bytes.len()).max().unwrap_or(0);
        if ring.slot_buf(0).is_some_and(|b| b.len() < largest) {
            return Err(BlastError::Job(format!(
                "a {largest}-byte frame does not fit a ring slot"
            )));
        }
        Ok(RawBlaster {
            book: TxBook::new(&job),
            seq: vec![0; job.flows.len()],
            slot_holds: vec![u32::MAX; ring.slots()],
            queued: 0,
            ring,
            templates,
            finished: false,
            report,
            job,
        })
    }
}

impl<T: FrameTx> Poll for RawBlaster<T> {
    fn poll(&mut self, budget: usize, st: &WorkerStats) -> Result<usize, String> {
        let now = os::monotonic_ns();
        if self.book.over(now) {
            // Hand every queued frame to the driver before finishing (bounded: 1 s).
            let until = now + 1_000_000_000;
            while self.ring.in_flight() > 0 && os::monotonic_ns() < until {
                self.ring.kick().map_err(|e| e.to_string())?;
                std::thread::yield_now();
            }
            self.finished = true;
            return Ok(0);
        }
        let n = self.book.allow(now, budget);
        if n == 0 {
            return Ok(0);
        }
        let nflows = self.seq.len() as u64;
        let nsizes = self.job.payloads.len() as u64;
        let (templates, seq, flows) = (&self.templates, &mut self.seq, &self.job.flows);
        let (holds, queued) = (&mut self.slot_holds, &mut self.queued);
        let mut bytes = 0usize;
        let queued_now = self.ring.queue(n, &mut |slot, buf| {
            let f = (*queued % nflows) as usize;
            *queued += 1;
            let ti = f * nsizes as usize + (seq[f] % nsizes) as usize;
            let t = &templates[ti];
            let len = t.bytes.len();
            let Some(frame) = buf.get_mut(..len) else {
                return 0;
            };
            if holds.get(slot) != Some(&(ti as u32)) {
                frame.copy_from_slice(&t.bytes);
                if let Some(h) = holds.get_mut(slot) {
                    *h = ti as u32;
                }
            }
            let h = FlowHeader {
                flow: flows[f].id,
                seq: seq[f] as u32,
                tx_ns: now,
            };
            t.patch(frame, &h);
            seq[f] += 1;
            bytes += len;
            len
        });
        self.ring.kick().map_err(|e| e.to_string())?;
        self.book.record(st, now, n, queued_now, bytes);
        Ok(queued_now)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), String> {
        self.book.sleep(timeout_ms);
        Ok(())
    }

    fn done(&self) -> bool {
        self.finished
    }

    fn finish(&mut self, st: &WorkerStats) {
        let refused = self.ring.refused();
        if refused > 0 {
            crate::set(&st.tx_failed, refused);
        }
        self.book
            .publish(&self.report, &self.job.flows, &self.seq, None, None);
    }
}

/// How long one live-frames run should last. Each `BPF_PROG_TEST_RUN` call costs about 20 ms
/// of set-up and tear-down whatever its length (measured on the development VM: one frame or
/// 8192 frames per call take the same time; BENCHMARKS.md), so runs must be long for that to
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
        let flows_map = flowlane_io::bpf::create_map(
            flowlane_io::bpf::MAP_ARRAY,
            4,
            live_flow::VALUE_SIZE as u32,
            job.flows.len() as u32,
            0,
            "fl_live_flows",
        )
        .map_err(bpf_err)?;
        let mut frame = Vec::new();
        let mut layout = (0, 0, 0);
        for (k, f) in job.flows.iter().enumerate() {
            let t = flowlane_wire::Template::build(&flowlane_wire::TemplateSpec {
                src_mac: link.src_mac,
                dst_mac: link.dst_mac,
                vlan: link.vlan,
                src: f.src,
                dst: f.dst,
                frame_len: payload + job.overhead,
            })
            .map_err(|e| BlastError::Job(format!("flow {}: {e}", f.id)))?;
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
            flowlane_io::bpf::map_update(
                &flows_map,
                &(k as u32).to_ne_bytes(),
                &value,
                4,
                live_flow::VALUE_SIZE,
            )
            .map_err(bpf_err)?;
            if k == 0 {
                frame = bytes;
                layout = (hdr_len, t.payload + 4, t.l4 + 6);
            }
        }
        let counter = flowlane_io::bpf::MappedArray::new("fl_live_count", 1).map_err(bpf_err)?;
        let insns = live_tx_program(&LiveTx {
            counter_fd: counter.fd(),
            flows_fd: flows_map.as_raw_fd(),
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
    fn poll(&mut self, budget: usize, st: &WorkerStats) -> Result<usize, String> {
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

    fn finish(&mut self, _st: &WorkerStats) {
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
    Udp(Box<UdpBlaster>),
    /// AF_PACKET TX ring.
    Raw(Box<RawBlaster<frame::TxRing>>),
    /// AF_XDP socket (copy mode where the driver has no zero-copy).
    Xdp(Box<RawBlaster<frame::XskTx>>),
    /// Live XDP frames (`BPF_PROG_TEST_RUN`), no socket.
    Live(Box<LiveBlaster>),
}

impl Poll for Sender {
    fn poll(&mut self, budget: usize, st: &WorkerStats) -> Result<usize, String> {
        match self {
            Sender::Udp(s) => s.poll(budget, st),
            Sender::Raw(s) => s.poll(budget, st),
            Sender::Xdp(s) => s.poll(budget, st),
            Sender::Live(s) => s.poll(budget, st),
        }
    }
    fn wait(&mut self, timeout_ms: i32) -> Result<(), String> {
        match self {
            Sender::Udp(s) => s.wait(timeout_ms),
            Sender::Raw(s) => s.wait(timeout_ms),
            Sender::Xdp(s) => s.wait(timeout_ms),
            Sender::Live(s) => s.wait(timeout_ms),
        }
    }
    fn idle(&mut self, st: &WorkerStats) {
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
    fn finish(&mut self, st: &WorkerStats) {
        match self {
            Sender::Udp(s) => s.finish(st),
            Sender::Raw(s) => s.finish(st),
            Sender::Xdp(s) => s.finish(st),
            Sender::Live(s) => s.finish(st),
        }
    }
}
