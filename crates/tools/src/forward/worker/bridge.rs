//! The learning bridge behind `flowlane forward --mode bridge`: every worker learns from the
//! source MAC of what it receives into one [`MacTable`] shared by all workers, looks the
//! destination MAC up in it, and sends the frame out of that port — or, for broadcast,
//! multicast and unknown unicast, out of every other port (flooding). A frame whose
//! destination sits on the port it came in by is filtered (not sent back).
//!
//! The table takes no lock: each MAC hashes to a bucket of eight slots (one cache line), and
//! a slot is one atomic word (MAC and port) with its last-seen second beside it. Learning
//! writes only when something changed (a new MAC, a port change, a new second), so the
//! steady state reads shared lines and never bounces them. A full bucket gives its oldest
//! slot to the new MAC. Ageing clears slots unseen for the ageing time, on the control
//! thread's clock ([`MacTable::age`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use flowlane_io::frame::{FrameRx, FrameTx, XskAction, XskGroup, TP_STATUS_CSUMNOTREADY};

use super::ports::{PortInfo, Ports, SendError};
use super::reflect::{finish_checksum, ForwardStats};
use flowlane_runtime::{bump, Poll};

const WAYS: usize = 8;

/// The shared MAC table.
#[derive(Debug)]
pub struct MacTable {
    /// MAC in the low 48 bits, port + 1 in the top 16 (0: empty).
    slots: Box<[AtomicU64]>,
    /// Second each slot was last seen.
    seen: Box<[AtomicU32]>,
    mask: usize,
    /// The current second (the control thread advances it).
    now: AtomicU32,
}

fn mac_u64(m: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[2..].copy_from_slice(&m[..6]);
    u64::from_be_bytes(b)
}

impl MacTable {
    /// A table of at least `entries` slots (rounded up to whole buckets, a power of two).
    pub fn new(entries: usize) -> MacTable {
        let buckets = entries.div_ceil(WAYS).next_power_of_two().max(1);
        MacTable {
            slots: (0..buckets * WAYS).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..buckets * WAYS).map(|_| AtomicU32::new(0)).collect(),
            mask: buckets - 1,
            now: AtomicU32::new(1),
        }
    }

    fn bucket(&self, mac: u64) -> usize {
        // Multiplicative hash of the 48 bits: the vendor half alone would crowd a bucket.
        (((mac.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 40) as usize & self.mask) * WAYS
    }

    /// The port `mac` was last seen on.
    pub fn lookup(&self, mac: &[u8]) -> Option<u16> {
        let m = mac_u64(mac);
        let b = self.bucket(m);
        self.slots[b..b + WAYS].iter().find_map(|s| {
            let v = s.load(Ordering::Relaxed);
            (v != 0 && v & 0xffff_ffff_ffff == m).then(|| (v >> 48) as u16 - 1)
        })
    }

    /// Notes that `mac` was seen on `port`: whether it was new or moved (a learning event).
    pub fn learn(&self, mac: &[u8], port: u16) -> bool {
        let m = mac_u64(mac);
        let want = m | (u64::from(port) + 1) << 48;
        let now = self.now.load(Ordering::Relaxed);
        let b = self.bucket(m);
        let mut oldest = b;
        for i in b..b + WAYS {
            let v = self.slots[i].load(Ordering::Relaxed);
            if v != 0 && v & 0xffff_ffff_ffff == m {
                if self.seen[i].load(Ordering::Relaxed) != now {
                    self.seen[i].store(now, Ordering::Relaxed);
                }
                if v != want {
                    self.slots[i].store(want, Ordering::Relaxed);
                    return true;
                }
                return false;
            }
            if v == 0 {
                if self.slots[i]
                    .compare_exchange(0, want, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    self.seen[i].store(now, Ordering::Relaxed);
                    return true;
                }
                // Another worker took it this instant: look on.
                continue;
            }
            if self.seen[i].load(Ordering::Relaxed) < self.seen[oldest].load(Ordering::Relaxed) {
                oldest = i;
            }
        }
        self.slots[oldest].store(want, Ordering::Relaxed);
        self.seen[oldest].store(now, Ordering::Relaxed);
        true
    }

    /// Advances the table's clock to `now` seconds (since any fixed start) and forgets MACs
    /// unseen for `ageing_s`; how many were forgotten.
    pub fn age(&self, now: u32, ageing_s: u32) -> usize {
        self.now.store(now.max(1), Ordering::Relaxed);
        let mut n = 0;
        for (s, t) in self.slots.iter().zip(self.seen.iter()) {
            if s.load(Ordering::Relaxed) != 0
                && now.saturating_sub(t.load(Ordering::Relaxed)) > ageing_s
            {
                s.store(0, Ordering::Relaxed);
                n += 1;
            }
        }
        n
    }

    /// Every entry: (MAC, port).
    pub fn entries(&self) -> Vec<([u8; 6], u16)> {
        self.slots
            .iter()
            .filter_map(|s| {
                let v = s.load(Ordering::Relaxed);
                let b = v.to_be_bytes();
                (v != 0).then(|| ([b[2], b[3], b[4], b[5], b[6], b[7]], (v >> 48) as u16 - 1))
            })
            .collect()
    }
}

/// A bridge worker's tallies for one round, added to its counters once.
#[derive(Default)]
struct Tally {
    fwd: u64,
    flooded: u64,
    copies: u64,
    filtered: u64,
    malformed: u64,
    trunc: u64,
    full: u64,
    completed: u64,
}

impl Tally {
    fn add_to(&self, st: &ForwardStats, rx: usize) {
        bump(&st.rx_packets, rx as u64);
        bump(&st.forwarded, self.fwd);
        bump(&st.flooded, self.flooded);
        bump(&st.flood_copies, self.copies);
        bump(&st.filtered, self.filtered);
        bump(&st.malformed, self.malformed);
        bump(&st.truncated, self.trunc);
        bump(&st.tx_full, self.full);
        bump(&st.checksum_completed, self.completed);
    }
}

/// Per-port counts, shared by the workers (one add per port per poll round).
#[derive(Debug, Default)]
pub struct PortCounters {
    /// Frames received on the port and looked at.
    pub rx: AtomicU64,
    /// Frames queued for sending on it (unicast and flooded copies).
    pub tx: AtomicU64,
}

/// One bridge worker: its rings on every port, the shared table and per-port counts.
#[derive(Debug)]
pub struct BridgeWorker<R, T> {
    ports: Ports<R, T>,
    table: Arc<MacTable>,
    counts: Arc<[PortCounters]>,
    rx: Vec<u64>,
    tx: Vec<u64>,
}

impl<R: FrameRx, T: FrameTx> BridgeWorker<R, T> {
    /// A worker over its rings.
    pub fn new(
        ports: Vec<(R, T, PortInfo)>,
        table: Arc<MacTable>,
        counts: Arc<[PortCounters]>,
    ) -> BridgeWorker<R, T> {
        let n = ports.len();
        BridgeWorker {
            ports: Ports::new(ports),
            table,
            counts,
            rx: vec![0; n],
            tx: vec![0; n],
        }
    }
}

impl<R: FrameRx, T: FrameTx> Poll for BridgeWorker<R, T> {
    type Stats = ForwardStats;
    type Report = ();

    fn drains(&self) -> bool {
        true
    }

    fn poll(
        &mut self,
        budget: usize,
        st: &ForwardStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        let mut t = Tally::default();
        let (table, rx, tx) = (&self.table, &mut self.rx, &mut self.tx);
        let n = self.ports.poll(budget, |p, f, out| {
            rx[p] += 1;
            let data = f.data;
            if data.len() < 14 {
                t.malformed += 1;
                return;
            }
            if f.truncated() {
                t.trunc += 1;
                return;
            }
            // A source that is multicast is not a station: not learnt.
            if data[6] & 1 == 0 {
                table.learn(&data[6..12], p as u16);
            }
            let n_ports = out.ports();
            // Sent from this host with checksum offload: each copy leaves with its checksum
            // computed (counted once a frame).
            let partial = f.status & TP_STATUS_CSUMNOTREADY != 0;
            let mut completed = false;
            let mut send = |q: usize, tx: &mut Vec<u64>| match out.send(q, data.len(), &mut |buf| {
                buf[..data.len()].copy_from_slice(data);
                completed |= finish_checksum(&mut buf[..data.len()], Some(partial));
                data.len()
            }) {
                Ok(()) => {
                    tx[q] += 1;
                    true
                }
                Err(SendError::TooLong) => {
                    t.trunc += 1;
                    false
                }
                Err(SendError::Full) => {
                    t.full += 1;
                    false
                }
            };
            let known = if data[0] & 1 == 0 {
                table.lookup(&data[..6])
            } else {
                None
            };
            match known {
                Some(q) if q as usize == p => t.filtered += 1,
                Some(q) => t.fwd += u64::from(send(q as usize, tx)),
                None => {
                    // Broadcast, multicast or unknown: every other port.
                    let mut sent = 0;
                    for q in (0..n_ports).filter(|&q| q != p) {
                        sent += u64::from(send(q, tx));
                    }
                    if sent > 0 {
                        t.fwd += 1;
                        t.flooded += 1;
                        t.copies += sent - 1;
                    }
                }
            }
            t.completed += u64::from(completed);
        })?;
        for (i, c) in self.counts.iter().enumerate() {
            bump(&c.rx, std::mem::take(&mut self.rx[i]));
            bump(&c.tx, std::mem::take(&mut self.tx[i]));
        }
        t.add_to(st, n);
        Ok(n)
    }

    super::ports::ports_upkeep!(ports);
}

/// One AF_XDP bridge worker: a socket on every port over one UMEM (its queue's); a frame
/// leaves by its port from where it lies, flooded copies go into free frames.
#[derive(Debug)]
pub struct XskBridgeWorker {
    group: XskGroup,
    table: Arc<MacTable>,
    counts: Arc<[PortCounters]>,
    next: usize,
    /// Each port's queued count at the last round.
    queued: Vec<u64>,
}

impl XskBridgeWorker {
    /// A worker over its group.
    pub fn new(group: XskGroup, table: Arc<MacTable>, counts: Arc<[PortCounters]>) -> Self {
        let queued = vec![0; group.ports()];
        XskBridgeWorker {
            group,
            table,
            counts,
            next: 0,
            queued,
        }
    }
}

impl Poll for XskBridgeWorker {
    type Stats = ForwardStats;
    type Report = ();

    fn drains(&self) -> bool {
        true
    }

    fn poll(
        &mut self,
        budget: usize,
        st: &ForwardStats,
    ) -> Result<usize, flowlane_runtime::WorkerError> {
        let ports = self.group.ports();
        let share = (budget / ports.max(1)).max(1);
        let (mut n, mut t) = (0, Tally::default());
        let table = &self.table;
        for k in 0..ports {
            let p = (self.next + k) % ports;
            let mut flood_now = 0u64;
            let done = self.group.poll(p, share, |data| {
                if data.len() < 14 {
                    t.malformed += 1;
                    return XskAction::Drop;
                }
                if data[6] & 1 == 0 {
                    table.learn(&data[6..12], p as u16);
                }
                let known = if data[0] & 1 == 0 {
                    table.lookup(&data[..6])
                } else {
                    None
                };
                match known {
                    Some(q) if q as usize == p => {
                        t.filtered += 1;
                        XskAction::Drop
                    }
                    // AF_XDP does not say which frames were left to checksum offload: the
                    // field tells (completed where the frame lies, before a copy is made).
                    Some(q) => {
                        t.fwd += 1;
                        t.completed += u64::from(finish_checksum(data, None));
                        XskAction::Send(q as usize)
                    }
                    None => {
                        t.fwd += 1;
                        t.completed += u64::from(finish_checksum(data, None));
                        flood_now += 1;
                        XskAction::Flood(p)
                    }
                }
            });
            // Copies that found no free frame were not sent.
            t.full += done.no_frame as u64;
            t.flooded += flood_now;
            t.copies += (flood_now * (ports as u64 - 2)).saturating_sub(done.no_frame as u64);
            n += done.received;
            bump(&self.counts[p].rx, done.received as u64);
        }
        for (q, last) in self.queued.iter_mut().enumerate() {
            let now = self.group.queued(q);
            bump(&self.counts[q].tx, now - *last);
            *last = now;
        }
        self.next = (self.next + 1) % ports.max(1);
        if t.fwd > 0 {
            self.group.kick().map_err(|e| e.to_string())?;
        }
        t.add_to(st, n);
        Ok(n)
    }

    super::ports::xsk_upkeep!(group);
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

    #[test]
    fn a_mac_is_learnt_moves_and_ages_out() {
        let t = MacTable::new(64);
        assert_eq!(t.lookup(&A), None);
        assert!(t.learn(&A, 0), "new");
        assert!(!t.learn(&A, 0), "seen again: no event");
        assert_eq!(t.lookup(&A), Some(0));
        assert!(t.learn(&A, 3), "moved");
        assert_eq!(t.lookup(&A), Some(3));
        t.age(10, 300);
        assert!(t.learn(&B, 1));
        assert_eq!(t.age(305, 300), 1, "A last seen at 1, B at 10");
        assert_eq!(t.lookup(&A), None);
        assert_eq!(t.lookup(&B), Some(1));
        assert_eq!(t.entries(), vec![(B, 1)]);
    }

    #[test]
    fn a_full_bucket_gives_its_oldest_slot_away() {
        let t = MacTable::new(8); // one bucket
        for i in 0..8u8 {
            t.age(u32::from(i) + 1, 1000);
            t.learn(&[2, 0, 0, 0, 1, i], 0);
        }
        t.age(100, 1000);
        t.learn(&[2, 0, 0, 0, 2, 0], 1);
        assert_eq!(t.lookup(&[2, 0, 0, 0, 1, 0]), None, "the oldest went");
        assert_eq!(t.lookup(&[2, 0, 0, 0, 2, 0]), Some(1));
        assert_eq!(t.entries().len(), 8);
    }
}
