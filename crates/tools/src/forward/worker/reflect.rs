//! The reflector workers behind `flowlane forward --mode reflect`, each turning frames around
//! with `flowlane_wire::forward::reflect`:
//!
//! * [`ReflectWorker`] (AF_PACKET): frames from its receive ring (the ones the kernel received
//!   on this worker's CPU, by fanout), copied into a transmit-ring slot and sent. The kernel's
//!   own path still sees each frame (AF_PACKET receives a copy): give the interface no
//!   address, or the host answers too.
//! * [`XskReflectWorker`] (AF_XDP): frames an XDP program redirected to this worker's queue's
//!   socket, turned around where they lie in the UMEM and sent — no copy, and the kernel's
//!   stack never sees them.

use flowlane_io::frame::{FrameRx, FrameTx, Xsk, PACKET_OUTGOING, TP_STATUS_CSUMNOTREADY};
use flowlane_wire::forward::{complete_partial, fill_checksum, reflect_parsed, Reason, Swap, L3};

use flowlane_runtime::{bump, counters, Poll};

counters! {
    /// What a forwarding worker counts.
    pub struct ForwardStats => ForwardSnapshot {
        /// Frames taken from the receive ring.
        rx_packets,
        /// Frames queued for sending (turned around).
        forwarded,
        /// Not IP, where addresses or ports are swapped (left to the kernel).
        not_ip,
        /// Headers cut short or inconsistent.
        malformed,
        /// Longer than a receive slot, or (with a VLAN tag put back) than a transmit slot.
        truncated,
        /// Received but not sent: the transmit ring had no free slot.
        tx_full,
        /// Frames the kernel dropped because the receive ring was full (`tp_drops`).
        ring_drops,
        /// Route: multicast, broadcast, to this host's own addresses or to another MAC (the
        /// kernel's).
        to_host,
        /// Route: no route (or one leaving by an interface that is not the forwarder's, or a
        /// blackhole).
        no_route,
        /// Route: a route, but no MAC for its next hop.
        no_neighbour,
        /// Route: TTL or hop limit 1 or 0.
        ttl_exceeded,
        /// Route: larger than the outgoing interface's MTU.
        too_big,
        /// Bridge: of the forwarded frames, those sent out of every other port (broadcast,
        /// multicast, unknown destination).
        flooded,
        /// Bridge: copies flooding made beyond one per frame (frames queued = forwarded +
        /// flood_copies).
        flood_copies,
        /// Bridge: not sent, the destination being on the port the frame came in by.
        filtered,
        /// Of the forwarded frames, those whose UDP or TCP checksum a local sender had left to
        /// offload (only the pseudo header's sum) and the forwarder completed.
        checksum_completed,
        /// Route with a flow cache: frames looked up in it.
        cache_lookups,
        /// Of them, found (decided before; stale ones count too).
        cache_hits,
        /// Of the hits, decided before the routes or neighbours last changed: decided again.
        cache_stale,
        /// Flows added.
        cache_inserts,
        /// Flows idle too long.
        cache_expired,
        /// Flows pushed out by new ones when full.
        cache_evicted,
        /// Records the cache's expiry visited (its GC work: O(1) per expired flow).
        cache_gc_visited,
    }
}

/// One worker: its receive ring, its transmit ring on the same interface.
#[derive(Debug)]
pub struct ReflectWorker<R, T> {
    rx: R,
    tx: T,
    swap: Swap,
    /// Bytes a transmit slot holds.
    tx_room: usize,
}

impl<R: FrameRx, T: FrameTx> ReflectWorker<R, T> {
    /// A worker over its own rings.
    pub fn new(rx: R, mut tx: T, swap: Swap) -> ReflectWorker<R, T> {
        let tx_room = tx.slot_buf(0).map_or(0, |b| b.len());
        ReflectWorker {
            rx,
            tx,
            swap,
            tx_room,
        }
    }
}

/// Writes `data` into `buf`, with the 802.1Q tag `vlan` put back after the MACs where the
/// receive ring took it out; the frame's length (0: it does not fit).
fn copy_frame(data: &[u8], vlan: Option<u16>, buf: &mut [u8]) -> usize {
    let extra = if vlan.is_some() { 4 } else { 0 };
    let len = data.len() + extra;
    if len > buf.len() || data.len() < 14 {
        return 0;
    }
    match vlan {
        None => buf[..len].copy_from_slice(data),
        Some(vid) => {
            buf[..12].copy_from_slice(&data[..12]);
            buf[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
            buf[14..16].copy_from_slice(&vid.to_be_bytes());
            buf[16..len].copy_from_slice(&data[12..]);
        }
    }
    len
}

impl<R: FrameRx, T: FrameTx> Poll for ReflectWorker<R, T> {
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
        let (mut n, mut fwd, mut not_ip, mut malformed, mut trunc, mut full) = (0, 0, 0, 0, 0, 0);
        let mut completed = 0u64;
        while n < budget {
            let Some(f) = self.rx.next() else { break };
            if f.pkt_type == PACKET_OUTGOING {
                // Sent by this host: not received (a kernel before 6.9 hands these to a
                // fanout group); turning it around would send the host's own frame back.
                self.rx.release();
                continue;
            }
            n += 1;
            let out_len = f.data.len() + if f.vlan.is_some() { 4 } else { 0 };
            let refused = if f.truncated() || out_len > self.tx_room {
                trunc += 1;
                true
            } else {
                match admit(f.data, self.swap) {
                    Ok(_) => false,
                    Err(Reason::NotIp) => {
                        not_ip += 1;
                        true
                    }
                    Err(_) => {
                        malformed += 1;
                        true
                    }
                }
            };
            if !refused {
                let (data, vlan, swap) = (f.data, f.vlan, self.swap);
                // Sent from this host with checksum offload: only the pseudo-header sum is
                // there; the frame leaves with its checksum computed.
                let partial = f.status & TP_STATUS_CSUMNOTREADY != 0;
                let queued = self.tx.queue(1, &mut |_, buf| {
                    // Fits: checked against the slot size above.
                    let len = copy_frame(data, vlan, buf);
                    let frame = &mut buf[..len];
                    // Parsed once here: the copy may carry a tag the ring had taken off.
                    let l3 = L3::parse(frame).ok();
                    if let Some(l3) = &l3 {
                        completed += u64::from(finish_parsed(frame, l3, Some(partial)));
                    }
                    // Cannot fail: an IP frame (where it matters) of at least 14 bytes, checked
                    // above.
                    let _ = reflect_parsed(frame, l3.as_ref(), swap);
                    len
                });
                if queued == 1 {
                    fwd += 1;
                } else {
                    full += 1;
                }
            }
            self.rx.release();
        }
        if fwd > 0 {
            self.tx
                .kick()
                .map_err(flowlane_runtime::WorkerError::from)?;
        }
        bump(&st.rx_packets, n as u64);
        bump(&st.forwarded, fwd);
        bump(&st.not_ip, not_ip);
        bump(&st.malformed, malformed);
        bump(&st.truncated, trunc);
        bump(&st.tx_full, full);
        bump(&st.checksum_completed, completed);
        Ok(n)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        self.rx
            .wait(timeout_ms)
            .map(drop)
            .map_err(flowlane_runtime::WorkerError::from)
    }

    fn idle(&mut self, st: &ForwardStats) {
        if let Ok(d) = self.rx.take_drops() {
            bump(&st.ring_drops, d);
        }
    }

    fn finish(&mut self, _st: &ForwardStats) -> Option<()> {
        // Let what is queued leave before the ring is closed (at most 2 s).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.tx.in_flight() > 0 && std::time::Instant::now() < deadline {
            if self.tx.kick().is_err() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        None
    }
}

/// Completes the UDP or TCP checksum of a frame a local sender left to offload (only the
/// pseudo header's sum in place; the device would add the rest, and a forwarded copy has no
/// device to do it): `Some(true)` the receive ring said so (AF_PACKET's
/// `TP_STATUS_CSUMNOTREADY`), `Some(false)` it said not, `None` nothing says (AF_XDP: the
/// field is compared with the pseudo header's sum, see [`complete_partial`]). Returns whether
/// one was completed, for the `checksum_completed` counter.
pub(crate) fn finish_checksum(frame: &mut [u8], flagged: Option<bool>) -> bool {
    L3::parse(frame).is_ok_and(|l3| finish_parsed(frame, &l3, flagged))
}

/// [`finish_checksum`] of a frame already parsed.
pub(crate) fn finish_parsed(frame: &mut [u8], l3: &L3, flagged: Option<bool>) -> bool {
    match flagged {
        Some(true) => fill_checksum(frame, l3) == Ok(true),
        Some(false) => false,
        None => complete_partial(frame, l3) == Ok(true),
    }
}

/// Whether a frame may be turned around with `swap`, or why not (counted by the caller);
/// when admitted, its IP header where it has one (parsed once, for the checksum and the
/// swap: it was parsed three times a frame before).
fn admit(frame: &[u8], swap: Swap) -> Result<Option<L3>, Reason> {
    if frame.len() < 14 {
        return Err(Reason::Malformed);
    }
    match L3::parse(frame) {
        Ok(l3) => Ok(Some(l3)),
        Err(e) if swap.ip || swap.ports => Err(e),
        Err(_) => Ok(None),
    }
}

/// One AF_XDP worker: the socket of one receive queue, with its own UMEM.
#[derive(Debug)]
pub struct XskReflectWorker {
    xsk: Xsk,
    swap: Swap,
}

impl XskReflectWorker {
    /// A worker over its queue's socket.
    pub fn new(xsk: Xsk, swap: Swap) -> XskReflectWorker {
        XskReflectWorker { xsk, swap }
    }
}

impl Poll for XskReflectWorker {
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
        let (mut not_ip, mut malformed, mut completed) = (0u64, 0u64, 0u64);
        let swap = self.swap;
        let (n, sent) = self.xsk.reflect(budget, |frame| match admit(frame, swap) {
            // Admitted frames reflect without error; AF_XDP does not say which were left to
            // checksum offload, so the field tells.
            Ok(l3) => {
                if let Some(l3) = &l3 {
                    completed += u64::from(finish_parsed(frame, l3, None));
                }
                reflect_parsed(frame, l3.as_ref(), swap).is_ok()
            }
            Err(Reason::NotIp) => {
                not_ip += 1;
                false
            }
            Err(_) => {
                malformed += 1;
                false
            }
        });
        if sent > 0 {
            self.xsk
                .kick()
                .map_err(flowlane_runtime::WorkerError::from)?;
        }
        bump(&st.rx_packets, n as u64);
        bump(&st.forwarded, sent as u64);
        bump(&st.not_ip, not_ip);
        bump(&st.malformed, malformed);
        bump(&st.checksum_completed, completed);
        Ok(n)
    }

    fn wait(&mut self, timeout_ms: i32) -> Result<(), flowlane_runtime::WorkerError> {
        self.xsk
            .wait(timeout_ms)
            .map(drop)
            .map_err(flowlane_runtime::WorkerError::from)
    }

    fn idle(&mut self, st: &ForwardStats) {
        bump(&st.ring_drops, self.xsk.take_drops());
    }

    fn finish(&mut self, _st: &ForwardStats) -> Option<()> {
        // Let what was sent on leave before the socket closes: in copy mode each kick sends
        // a bounded batch, so kick until the ring is drained (at most 2 s).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while self.xsk.in_flight() > 0 && std::time::Instant::now() < deadline {
            if self.xsk.kick().is_err() {
                break;
            }
            std::thread::yield_now();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stripped_tag_is_put_back_after_the_macs() {
        let data: Vec<u8> = (0..60u8).collect();
        let mut buf = [0u8; 128];
        assert_eq!(copy_frame(&data, None, &mut buf), 60);
        assert_eq!(&buf[..60], &data[..]);
        assert_eq!(copy_frame(&data, Some(7), &mut buf), 64);
        assert_eq!(&buf[..12], &data[..12]);
        assert_eq!(&buf[12..16], &[0x81, 0, 0, 7]);
        assert_eq!(&buf[16..64], &data[12..]);
        assert_eq!(copy_frame(&data, None, &mut [0u8; 59]), 0, "does not fit");
    }
}
