//! Whole frames in and out: the AF_PACKET TX and RX rings and AF_XDP transmit, and the one
//! vocabulary frame workers are written against — [`FrameTx`] to send, [`FrameRx`] to receive
//! — so a backend is chosen once at start-up, never per packet. (Live XDP frames have no ring:
//! the kernel runs a program on them, `bpf::xdp_test_run_live`.)

pub use crate::sys::packet::{
    RxFrame, RxRing, TxRing, TP_STATUS_CSUMNOTREADY, TP_STATUS_CSUM_VALID, TP_STATUS_VLAN_VALID,
};
pub use crate::sys::xsk::XskTx;

use crate::SysError;

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

impl FrameTx for TxRing {
    fn slots(&self) -> usize {
        self.frames()
    }
    fn slot_buf(&mut self, i: usize) -> Option<&mut [u8]> {
        self.slot_mut(i)
    }
    fn queue(&mut self, max: usize, fill: &mut dyn FnMut(usize, &mut [u8]) -> usize) -> usize {
        TxRing::queue(self, max, fill)
    }
    fn kick(&mut self) -> Result<(), SysError> {
        TxRing::kick(self)
    }
    fn in_flight(&mut self) -> usize {
        TxRing::in_flight(self)
    }
    fn refused(&self) -> u64 {
        self.wrong_format
    }
}

impl FrameTx for XskTx {
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
            XskTx::kick(self)?;
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

/// A receive ring of whole frames: AF_PACKET's RX ring (a copy of every frame the interface
/// receives; AF_XDP receive is the next backend).
pub trait FrameRx: Send + std::fmt::Debug + 'static {
    /// The next received frame, if one waits. Hand it back with [`FrameRx::release`] before
    /// asking for the next.
    fn next(&self) -> Option<RxFrame<'_>>;
    /// Hands the frame returned by the last [`FrameRx::next`] back to the kernel.
    fn release(&mut self);
    /// Waits up to `timeout_ms` for a frame; whether one may be waiting.
    fn wait(&self, timeout_ms: i32) -> Result<bool, SysError>;
    /// Frames the kernel dropped because the ring was full, since the last call.
    fn take_drops(&self) -> Result<u64, SysError>;
}

impl FrameRx for RxRing {
    fn next(&self) -> Option<RxFrame<'_>> {
        RxRing::next(self)
    }
    fn release(&mut self) {
        RxRing::release(self)
    }
    fn wait(&self, timeout_ms: i32) -> Result<bool, SysError> {
        crate::socket::poll_readable(self.raw_fd(), timeout_ms)
    }
    fn take_drops(&self) -> Result<u64, SysError> {
        RxRing::take_drops(self)
    }
}
