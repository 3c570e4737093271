//! The UDP echo/sink worker behind `flowlane serve`.

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use flowlane_io::socket::{self, MmsgBatch};
use flowlane_io::udp::MissteerDetector;

use flowlane_runtime::{bump, counters, set, Poll};

counters! {
    /// What a serve worker counts.
    pub struct ServeStats => ServeSnapshot {
        /// Datagrams received.
        rx_packets,
        /// Payload bytes received.
        rx_bytes,
        /// Datagrams sent back (echo mode).
        tx_packets,
        /// Payload bytes sent back.
        tx_bytes,
        /// Echoes that could not be sent (socket send buffer full, or an error).
        tx_failed,
        /// Datagrams the kernel dropped because this socket's receive buffer was full (the
        /// socket's `sk_drops`, read with SO_MEMINFO; cumulative since it was opened).
        socket_drops,
        /// Datagrams longer than the receive buffer (MSG_TRUNC).
        truncated,
        /// Datagrams this worker's socket got that the kernel processed on another CPU (eBPF
        /// detector; includes ones then dropped for a full buffer).
        missteered,
        /// Receives that held several datagrams coalesced by UDP_GRO.
        gro_receives,
        /// Sends of several datagrams as GSO segments (UDP_SEGMENT).
        gso_sends,
        /// Datagrams the kernel reassembled from IP fragments before this socket got them
        /// (IP_RECVFRAGSIZE).
        fragmented,
    }
}

impl ServeSnapshot {
    /// Average datagrams per round that received anything (how full batches are), given the
    /// loop's busy rounds.
    pub fn batch_fill(&self, busy_rounds: u64) -> f64 {
        if busy_rounds == 0 {
            0.0
        } else {
            self.rx_packets as f64 / busy_rounds as f64
        }
    }
}

/// What the server does with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Send it back to its source, unchanged (never larger than it came).
    Echo,
    /// Count it and drop it.
    Sink,
}

/// One worker: its own socket of the reuseport group, its own buffers.
#[derive(Debug)]
pub struct ServeWorker {
    sock: UdpSocket,
    batch: MmsgBatch,
    mode: Mode,
    cpu: usize,
    detector: Option<MissteerDetector>,
    gso: bool,
    busy_poll: Option<std::time::Duration>,
    polls: u32,
    /// Datagrams per source address, its report at the end (`with_source_counts`).
    sources: Option<HashMap<SocketAddr, u64>>,
}

/// A worker's report: datagrams per source address, when it was asked to count them.
pub type SourceCounts = HashMap<SocketAddr, u64>;

impl ServeWorker {
    /// A worker for `sock` on `cpu`, receiving up to `batch` datagrams per call.
    pub fn new(sock: UdpSocket, cpu: usize, mode: Mode, batch: usize) -> ServeWorker {
        ServeWorker {
            sock,
            batch: {
                let mut b = MmsgBatch::new(batch, socket::MAX_DATAGRAM);
                b.sources = mode == Mode::Echo;
                b
            },
            mode,
            cpu,
            detector: None,
            gso: false,
            busy_poll: None,
            polls: 0,
            sources: None,
        }
    }

    /// Counts datagrams per source address (one hash-map update per datagram), handed to
    /// `out` when the loop ends: which worker got which flow.
    pub fn with_source_counts(mut self) -> ServeWorker {
        self.batch.sources = true;
        self.sources = Some(HashMap::new());
        self
    }

    /// Reads IP_RECVFRAGSIZE control messages: the socket must have asked for them
    /// (`flowlane_io::udp::enable_fragment_size`). Datagrams reassembled by the kernel count as
    /// `fragmented`.
    pub fn with_fragment_count(mut self) -> ServeWorker {
        self.batch.fragments = true;
        self
    }

    /// Reads UDP_GRO control messages: the socket must have UDP_GRO on
    /// (`flowlane_io::udp::enable_gro`). Coalesced datagrams count one by one and are echoed as
    /// GSO segments of the size they arrived in.
    pub fn with_gro(mut self) -> ServeWorker {
        self.batch.gro = true;
        self
    }

    /// Echoes runs of equal-size datagrams from one source as one UDP_SEGMENT send.
    pub fn with_gso(mut self) -> ServeWorker {
        self.gso = true;
        self
    }

    /// Before sleeping, spins on the socket for `usec` µs (pair with SO_BUSY_POLL on the
    /// socket, `flowlane_io::udp::set_busy_poll`, so each check also polls the device queue).
    pub fn with_busy_poll(mut self, usec: u32) -> ServeWorker {
        self.busy_poll = Some(std::time::Duration::from_micros(usec.into()));
        self
    }

    /// Counts mis-steered datagrams with `d` (attached to this worker's socket).
    pub fn with_detector(mut self, d: MissteerDetector) -> ServeWorker {
        self.detector = Some(d);
        self
    }

    /// The worker's socket (e.g. to attach steering to the group).
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }
}

impl Poll for ServeWorker {
    type Stats = ServeStats;
    type Report = SourceCounts;

    fn poll(
        &mut self,
        budget: usize,
        st: &ServeStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        let mut done = 0;
        // A budget above the batch size takes several receives.
        while done < budget {
            let want = (budget - done).min(self.batch.slots());
            let n = self
                .batch
                .recv(&self.sock, want)
                .map_err(|e| format!("CPU {}: {e}", self.cpu))?;
            if n == 0 {
                break;
            }
            done += n;
            let (mut dgrams, mut bytes, mut trunc, mut gro, mut frag) =
                (0u64, 0u64, 0u64, 0u64, 0u64);
            for i in 0..n {
                let m = self.batch.meta(i);
                let d = m.datagrams() as u64;
                // Only when asked: decoding the source costs on every datagram.
                if let Some(counts) = self.sources.as_mut() {
                    if let Some(src) = self.batch.source(i) {
                        *counts.entry(src).or_default() += d;
                    }
                }
                dgrams += d;
                gro += (d > 1) as u64;
                bytes += m.len as u64;
                trunc += m.truncated as u64;
                frag += (m.fragment_size != 0) as u64;
            }
            bump(&st.rx_packets, dgrams);
            bump(&st.rx_bytes, bytes);
            if trunc > 0 {
                bump(&st.truncated, trunc);
            }
            if gro > 0 {
                bump(&st.gro_receives, gro);
            }
            if frag > 0 {
                bump(&st.fragmented, frag);
            }
            if self.mode == Mode::Echo {
                let r = self
                    .batch
                    .send_back(&self.sock, n, self.gso)
                    .map_err(|e| format!("CPU {}: {e}", self.cpu))?;
                bump(&st.tx_packets, r.datagrams as u64);
                bump(&st.tx_bytes, r.bytes as u64);
                if r.gso_sends > 0 {
                    bump(&st.gso_sends, r.gso_sends as u64);
                }
                if r.failed > 0 {
                    bump(&st.tx_failed, r.failed as u64);
                }
            }
            if n < want {
                break;
            }
        }
        if let Some(d) = &self.detector {
            // One load from the detector's mapped counter.
            set(&st.missteered, d.count());
        }
        // A worker that never sleeps (overload) still refreshes its drop count now and then:
        // one system call per 256 rounds.
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(256) {
            self.idle(st);
        }
        Ok(done)
    }

    fn idle(&mut self, st: &ServeStats) {
        // The kernel's drop counter for this socket, read with a system call: before each
        // sleep, every 256 rounds, and at the end.
        if let Ok(d) = socket::socket_drops(&self.sock) {
            set(&st.socket_drops, d as u64);
        }
        if let Some(d) = &self.detector {
            set(&st.missteered, d.count());
        }
    }

    fn finish(&mut self, _st: &ServeStats) -> Option<SourceCounts> {
        self.sources.take()
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        let fd = self.sock.as_raw_fd();
        if let Some(spin) = self.busy_poll {
            let start = std::time::Instant::now();
            while start.elapsed() < spin {
                if socket::poll_readable(fd, 0).map_err(|e| poll_failed(self.cpu, e))? {
                    return Ok(());
                }
            }
        }
        socket::poll_readable(fd, timeout_ms)
            .map(drop)
            .map_err(|e| poll_failed(self.cpu, e))
    }
}

fn poll_failed(
    cpu: usize,
    e: impl Into<flowlane_runtime::WorkerError>,
) -> flowlane_runtime::WorkerError {
    match e.into() {
        flowlane_runtime::WorkerError::Sys {
            what,
            errno,
            message,
        } => flowlane_runtime::WorkerError::Sys {
            what: format!("CPU {cpu}: {what}"),
            errno,
            message,
        },
        other => other,
    }
}
