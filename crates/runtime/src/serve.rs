//! The UDP echo/sink worker behind `flowlane serve`.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;

use flowlane_io::sys::{self, MmsgBatch};
use flowlane_io::udp::MissteerDetector;

use crate::{bump, set, Poll, WorkerStats};

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
}

impl ServeWorker {
    /// A worker for `sock` on `cpu`, receiving up to `batch` datagrams per call.
    pub fn new(sock: UdpSocket, cpu: usize, mode: Mode, batch: usize) -> ServeWorker {
        ServeWorker {
            sock,
            batch: MmsgBatch::new(batch, sys::MAX_DATAGRAM),
            mode,
            cpu,
            detector: None,
        }
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
    fn poll(&mut self, budget: usize, st: &WorkerStats) -> Result<usize, String> {
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
            let (mut bytes, mut trunc) = (0u64, 0u64);
            for i in 0..n {
                let m = self.batch.meta(i);
                bytes += m.len as u64;
                trunc += m.truncated as u64;
            }
            bump(&st.rx_packets, n as u64);
            bump(&st.rx_bytes, bytes);
            if trunc > 0 {
                bump(&st.truncated, trunc);
            }
            if let Some(v) = self.batch.rxq_ovfl {
                set(&st.socket_drops, v as u64);
            }
            if self.mode == Mode::Echo {
                let sent = self
                    .batch
                    .send_back(&self.sock, n)
                    .map_err(|e| format!("CPU {}: {e}", self.cpu))?;
                let sent_bytes: u64 = (0..sent).map(|i| self.batch.meta(i).len as u64).sum();
                bump(&st.tx_packets, sent as u64);
                bump(&st.tx_bytes, sent_bytes);
                if sent < n {
                    bump(&st.tx_failed, (n - sent) as u64);
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
        Ok(done)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), String> {
        sys::poll_readable(self.sock.as_raw_fd(), timeout_ms)
            .map(drop)
            .map_err(|e| format!("CPU {}: {e}", self.cpu))
    }
}
