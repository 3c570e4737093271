//! The UDP sender: one connected socket per flow, `sendmmsg` batches, echoes taken back on
//! the same sockets.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use flowlane_io::socket::{self, MmsgBatch, SendBatch};
use flowlane_io::{os, SysError};
use flowlane_wire::{FlowHeader, HEADER_LEN};

use super::BlastStats;
use super::{icmp_error, pause, BlastError, BlastJob, BlastReport, TxBook};
use flowlane_runtime::{bump, FlowBook, Poll, Recorded};

/// A sending worker.
#[derive(Debug)]
pub struct UdpSender {
    job: BlastJob,
    socks: Vec<UdpSocket>,
    seq: Vec<u64>,
    /// Echoes per flow and their round-trip times.
    rx: FlowBook,
    out: SendBatch,
    out_dst: SocketAddr,
    inb: Option<MmsgBatch>,
    /// With echoes: every flow socket, so a wait ends when an echo arrives (its round-trip
    /// time then includes no pacing sleep), and a round reads only sockets with input.
    epoll: Option<socket::Epoll>,
    ready: Vec<u64>,
    book: TxBook,
    /// Per flow: datagrams still to send (with a quota, split evenly over the flows).
    left: Option<Vec<u64>>,
    next_flow: usize,
    linger_until: Option<u64>,
    finished: bool,
    latency: flowlane_runtime::latency::Publisher,
}

fn sock_err(src: SocketAddr, call: &'static str) -> impl FnOnce(std::io::Error) -> BlastError {
    move |source| BlastError::Socket {
        src,
        error: SysError { call, source },
    }
}

impl UdpSender {
    /// Publishes the round-trip histogram into `share` as it goes (`--metrics`).
    pub fn with_latency_share(
        mut self,
        share: flowlane_runtime::latency::LatencyShare,
    ) -> UdpSender {
        self.latency = flowlane_runtime::latency::Publisher::to(share);
        self
    }

    /// Opens one socket per flow (bound to its source, connected to its destination, so only
    /// the destination's datagrams come back to it). The report appears in `report` when the
    /// worker's loop ends.
    pub fn new(mut job: BlastJob) -> Result<UdpSender, BlastError> {
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
            if job.kernel_pieces.iter().any(|&n| n > 1) {
                // Datagrams above the path MTU are to be fragmented, whatever the host's
                // default policy.
                flowlane_io::udp::allow_fragmenting(&s, f.dst.is_ipv6())
                    .map_err(|error| BlastError::Socket { src: f.src, error })?;
            }
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
        Ok(UdpSender {
            inb: job.echo.then(|| MmsgBatch::new(64, 2048)),
            epoll,
            ready: Vec::new(),
            socks,
            seq: vec![0; n],
            rx: FlowBook::for_flows(first.id, n),
            out,
            out_dst: first.dst,
            book: TxBook::new(&job),
            left: job.quota.map(|q| {
                let n = job.flows.len() as u64;
                (0..n).map(|i| q / n + u64::from(i < q % n)).collect()
            }),
            next_flow: 0,
            linger_until: None,
            finished: false,
            latency: flowlane_runtime::latency::Publisher::default(),
            job,
        })
    }

    /// Reads echoes waiting on flow `i`'s socket.
    fn drain(&mut self, i: usize, st: &BlastStats) -> Result<usize, flowlane_runtime::WorkerError> {
        let Some(inb) = self.inb.as_mut() else {
            return Ok(0);
        };
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
                Err(e) => {
                    return Err(flowlane_runtime::WorkerError::sys(
                        format!("receiving echoes: `{}`", e.call),
                        &e.source,
                    ))
                }
            };
            if n == 0 {
                break;
            }
            let now = os::monotonic_ns();
            let (mut bytes, mut foreign) = (0u64, 0u64);
            for k in 0..n {
                let p = inb.payload(k);
                bytes += p.len() as u64;
                let known = FlowHeader::read(p)
                    .map(|h| self.rx.record(h.flow, h.seq, h.tx_ns, now))
                    .is_ok_and(|r| r != Recorded::Foreign);
                foreign += u64::from(!known);
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

    fn send_round(
        &mut self,
        budget: usize,
        now: u64,
        st: &BlastStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
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
                Err(e) => {
                    return Err(flowlane_runtime::WorkerError::sys(
                        format!("flow {}: `{}`", flow.id, e.call),
                        &e.source,
                    ))
                }
            }
        }
        if let Some(left) = self.left.as_mut() {
            left[i] -= sent as u64;
        }
        let bytes: usize = (0..sent).map(|k| self.out.len(k) + self.job.overhead).sum();
        if !self.job.kernel_pieces.is_empty() {
            let pieces = &self.job.kernel_pieces;
            let (mut cut, mut frags) = (0u64, 0u64);
            for k in 0..sent as u64 {
                let n = pieces[((seq0 + k) % pieces.len() as u64) as usize];
                if n > 1 {
                    cut += 1;
                    frags += u64::from(n);
                }
            }
            if cut > 0 {
                bump(&st.tx_fragmented, cut);
                bump(&st.tx_fragments, frags);
            }
        }
        self.seq[i] += sent as u64;
        self.book.record(st, now, n, sent, bytes);
        Ok(sent)
    }

    /// Reads the echoes waiting on every socket with input.
    fn drain_ready(&mut self, st: &BlastStats) -> Result<usize, flowlane_runtime::WorkerError> {
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

impl Poll for UdpSender {
    type Stats = BlastStats;
    type Report = BlastReport;

    fn poll(
        &mut self,
        budget: usize,
        st: &BlastStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
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
        let all_back = self
            .rx
            .flows()
            .iter()
            .zip(&self.seq)
            .all(|(r, &s)| r.unique >= s);
        if now >= until || !self.job.echo || all_back {
            self.finished = true;
        }
        Ok(got)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        let now = os::monotonic_ns();
        let d = match self.linger_until {
            Some(_) => Duration::from_micros(200),
            // Unpaced and short: the socket buffer was full; let the kernel drain it.
            None => self.book.wait(now, Duration::from_micros(20)),
        };
        let max = Duration::from_millis(timeout_ms.max(1) as u64);
        match &self.epoll {
            Some(ep) => ep
                .wait(d.min(max))
                .map(drop)
                .map_err(flowlane_runtime::WorkerError::from),
            None => {
                pause(d, max);
                Ok(())
            }
        }
    }

    fn done(&self) -> bool {
        self.finished
    }

    fn idle(&mut self, st: &BlastStats) {
        if self.finished || self.linger_until.is_some() {
            let drops: u64 = self
                .socks
                .iter()
                .filter_map(|s| socket::socket_drops(s).ok())
                .map(u64::from)
                .sum();
            flowlane_runtime::set(&st.echo_socket_drops, drops);
        }
    }

    fn publish(&mut self, last: bool) {
        if self.job.echo && self.latency.wanted() {
            self.latency
                .offer(os::monotonic_ns(), last, self.rx.latency());
        }
    }

    fn finish(&mut self, _st: &BlastStats) -> Option<BlastReport> {
        Some(self.book.report(
            &self.job.flows,
            &self.seq,
            Some(self.rx.flows()),
            self.job.echo.then(|| self.rx.latency().clone()),
        ))
    }
}
