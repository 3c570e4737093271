//! A worker's ports: a receive and a transmit ring on each interface of a multi-port role
//! (the router, the bridge), polled round-robin within one budget, with the transmit side
//! handed to the role's logic as a [`Sender`] while a received frame is still borrowed.

use flowlane_io::frame::{FrameRx, FrameTx, RxFrame, PACKET_OUTGOING};

use super::reflect::ForwardStats;
use flowlane_runtime::bump;

/// The `wait`, `idle` and `finish` of a [`Poll`](flowlane_runtime::Poll) worker whose rings are the
/// `Ports` field named: wait on every port, count the receive rings' drops, drain on exit.
macro_rules! ports_upkeep {
    ($field:ident) => {
        fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
            self.$field.wait(timeout_ms)
        }

        fn idle(&mut self, st: &ForwardStats) {
            self.$field.count_drops(st);
        }

        fn finish(&mut self, _st: &ForwardStats) -> Option<()> {
            self.$field.drain();
            None
        }
    };
}

/// The same for a worker whose sockets are the `XskGroup` field named.
macro_rules! xsk_upkeep {
    ($field:ident) => {
        fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
            self.$field
                .wait(timeout_ms)
                .map(drop)
                .map_err(flowlane_runtime::WorkerError::from)
        }

        fn idle(&mut self, st: &ForwardStats) {
            for p in 0..self.$field.ports() {
                flowlane_runtime::bump(&st.ring_drops, self.$field.take_drops(p));
            }
        }

        fn finish(&mut self, _st: &ForwardStats) -> Option<()> {
            $crate::forward::worker::route::drain_group(&mut self.$field);
            None
        }
    };
}

pub(crate) use {ports_upkeep, xsk_upkeep};

/// A port's fixed facts: its MAC and the largest IP packet it sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// The interface's MAC (the source of what a router sends by it).
    pub mac: [u8; 6],
    /// Its MTU.
    pub mtu: usize,
}

/// Why a frame was not queued on a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// Longer than a transmit slot.
    TooLong,
    /// The transmit ring had no free slot.
    Full,
}

/// The transmit side of a worker's ports.
#[derive(Debug)]
pub struct Sender<'a, T> {
    /// Each port's facts.
    pub info: &'a [PortInfo],
    txs: &'a mut [T],
    room: &'a [usize],
    queued: &'a mut [bool],
}

impl<T: FrameTx> Sender<'_, T> {
    /// Queues a frame of `len` bytes on `port`, written by `fill` into the slot (it returns
    /// the length written).
    pub fn send(
        &mut self,
        port: usize,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), SendError> {
        if self.room.get(port).is_none_or(|&r| len > r) {
            return Err(SendError::TooLong);
        }
        let tx = &mut self.txs[port];
        if tx.queue(1, &mut |_, buf| fill(buf)) == 1 {
            self.queued[port] = true;
            Ok(())
        } else {
            Err(SendError::Full)
        }
    }

    /// How many ports there are.
    pub fn ports(&self) -> usize {
        self.txs.len()
    }
}

/// A worker's rings on every port.
#[derive(Debug)]
pub struct Ports<R, T> {
    rxs: Vec<R>,
    txs: Vec<T>,
    /// Each port's facts.
    pub info: Vec<PortInfo>,
    room: Vec<usize>,
    queued: Vec<bool>,
    next: usize,
}

impl<R: FrameRx, T: FrameTx> Ports<R, T> {
    /// The rings (`ports[i]` = port i's receive and transmit rings and facts).
    pub fn new(ports: Vec<(R, T, PortInfo)>) -> Ports<R, T> {
        let mut p = Ports {
            rxs: Vec::new(),
            txs: Vec::new(),
            info: Vec::new(),
            room: Vec::new(),
            queued: Vec::new(),
            next: 0,
        };
        for (rx, mut tx, info) in ports {
            p.room.push(tx.slot_buf(0).map_or(0, |b| b.len()));
            p.rxs.push(rx);
            p.txs.push(tx);
            p.info.push(info);
            p.queued.push(false);
        }
        p
    }

    /// Hands up to `budget` received frames to `each(port, frame, sender)`, a share of the
    /// budget per port starting with a different port each round, then asks the kernel to
    /// send what was queued. Frames the host itself sent (a fanout group before Linux 6.9
    /// hands them over) are passed by. Returns how many frames were handed over.
    pub fn poll(
        &mut self,
        budget: usize,
        mut each: impl FnMut(usize, &RxFrame<'_>, &mut Sender<'_, T>),
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        let n_ports = self.rxs.len().max(1);
        let share = (budget / n_ports).max(1);
        let mut total = 0;
        let mut sender = Sender {
            info: &self.info,
            txs: &mut self.txs,
            room: &self.room,
            queued: &mut self.queued,
        };
        for k in 0..self.rxs.len() {
            let p = (self.next + k) % n_ports;
            let rx = &mut self.rxs[p];
            // Bounded in frames looked at, outgoing ones included.
            let (mut n, mut looked) = (0, 0);
            while n < share && looked < 2 * share {
                let Some(f) = rx.next() else { break };
                looked += 1;
                if f.pkt_type != PACKET_OUTGOING {
                    each(p, &f, &mut sender);
                    n += 1;
                }
                rx.release();
            }
            total += n;
        }
        self.next = (self.next + 1) % n_ports;
        for (tx, q) in self.txs.iter_mut().zip(self.queued.iter_mut()) {
            if std::mem::take(q) {
                tx.kick().map_err(flowlane_runtime::WorkerError::from)?;
            }
        }
        Ok(total)
    }

    /// Waits until any port has a frame, or `timeout_ms`.
    pub fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        let fds: Vec<_> = self.rxs.iter().map(|r| r.raw_fd()).collect();
        flowlane_io::socket::poll_any_readable(&fds, timeout_ms)
            .map(drop)
            .map_err(flowlane_runtime::WorkerError::from)
    }

    /// Adds the receive rings' drops to `ring_drops`.
    pub fn count_drops(&mut self, st: &ForwardStats) {
        for rx in &self.rxs {
            if let Ok(d) = rx.take_drops() {
                bump(&st.ring_drops, d);
            }
        }
    }

    /// Lets what is queued leave before the rings close (at most 2 s).
    pub fn drain(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        for tx in &mut self.txs {
            while tx.in_flight() > 0 && std::time::Instant::now() < deadline {
                if tx.kick().is_err() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}
