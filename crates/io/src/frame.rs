//! Whole frames in and out: the AF_PACKET TX and RX rings and AF_XDP transmit, and the one
//! vocabulary frame workers are written against — [`FrameTx`] to send, [`FrameRx`] to receive
//! — so a backend is chosen once at start-up, never per packet. (Live XDP frames have no ring:
//! the kernel runs a program on them, `bpf::xdp_test_run_live`.) [`Capabilities::probe`] asks
//! the kernel once what an interface offers, so a role picks a backend — or refuses one with
//! the reason — before it opens anything.

pub use crate::sys::packet::{
    RxFrame, RxRing, TxRing, PACKET_OUTGOING, TP_STATUS_CSUMNOTREADY, TP_STATUS_CSUM_VALID,
    TP_STATUS_VLAN_VALID,
};
pub use crate::sys::xsk::{Xsk, XskTx};
pub use crate::sys::xsk_group::{XskAction, XskGroup, XskPolled};

use crate::ebpf::{Asm, R0};
use crate::SysError;

/// The shape of an AF_PACKET ring (TPACKET_V2) of at least `slots` slots of `slot_size` bytes:
/// what [`TxRing::open`] and [`RxRing::open`] map, computed before anything is opened so a
/// role can size its rings from a memory budget ([`RingGeometry::within`]) and say what it
/// mapped.
///
/// Slots never straddle blocks, and the kernel allocates a block as a power of two of pages,
/// so a block is a power of two. Of the candidates (64 KiB or one slot, up to 4 MiB), the
/// smallest mapping within 1/16 of the fewest bytes for the slots asked is taken: a 64 KiB
/// MTU's 65 648-byte slot alone in a 128 KiB block wastes half of it; in 1 MiB blocks, 15 per
/// block, 6 %.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Bytes per slot (rounded up to 16, at least 64).
    pub slot_size: usize,
    /// Bytes per block.
    pub block_size: usize,
    /// Slots per block.
    pub per_block: usize,
    /// Blocks.
    pub blocks: usize,
    /// Slots: whole blocks of them, at least the number asked.
    pub slots: usize,
    /// Bytes mapped: `blocks × block_size`.
    pub bytes: usize,
}

/// The largest block tried: 4 MiB (the kernel falls back to vmalloc past its largest order).
const MAX_BLOCK: usize = 4 << 20;

impl RingGeometry {
    /// The ring of at least `slots` (≥ 1) slots of `slot_size` bytes mapping the fewest bytes.
    pub fn new(slots: usize, slot_size: usize) -> RingGeometry {
        let slot_size = slot_size.next_multiple_of(16).max(64);
        let slots = slots.max(1);
        let first = (1usize << 16).max(slot_size).next_power_of_two();
        let candidates = std::iter::successors(Some(first), |b| Some(b * 2))
            .take_while(|&b| b <= MAX_BLOCK.max(first))
            .map(|b| Self::with_block(slots, slot_size, b));
        let least = candidates
            .clone()
            .map(|g| g.bytes)
            .min()
            .unwrap_or(usize::MAX);
        // The smallest block within 1/16 of the least: a larger block is a larger contiguous
        // allocation, taken only for a real saving.
        candidates
            .clone()
            .find(|g| g.bytes <= least + least / 16)
            .unwrap_or_else(|| Self::with_block(slots, slot_size, first))
    }

    fn with_block(slots: usize, slot_size: usize, block_size: usize) -> RingGeometry {
        let per_block = block_size / slot_size;
        let blocks = slots.div_ceil(per_block);
        RingGeometry {
            slot_size,
            block_size,
            per_block,
            blocks,
            slots: blocks * per_block,
            bytes: blocks * block_size,
        }
    }

    /// The ring of the most slots (at most `max_slots`) of `slot_size` bytes mapping at most
    /// `bytes`; `None` if not even one slot fits.
    pub fn within(bytes: usize, slot_size: usize, max_slots: usize) -> Option<RingGeometry> {
        // Bytes grow with the slots asked: the largest count that fits, by bisection.
        let fits = |n: usize| RingGeometry::new(n, slot_size).bytes <= bytes;
        if max_slots == 0 || !fits(1) {
            return None;
        }
        let (mut lo, mut hi) = (1, max_slots);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fits(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        Some(RingGeometry::new(lo, slot_size))
    }
}

/// Bytes of an [`RxRing`] slot holding frames up to `max_frame` bytes: the frame starts at
/// TPACKET_ALIGN(TPACKET2_HDRLEN (52) + 16) − 14 = 66, and 14 more are room to spare.
pub const fn rx_slot_size(max_frame: usize) -> usize {
    max_frame + 80
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
/// receives) or an AF_XDP socket (the frames an XDP program redirected to it).
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
    /// The socket, to wait on several rings at once ([`crate::socket::poll_any_readable`]).
    fn raw_fd(&self) -> std::os::fd::RawFd;
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
    fn raw_fd(&self) -> std::os::fd::RawFd {
        RxRing::raw_fd(self)
    }
}

impl FrameRx for Xsk {
    fn next(&self) -> Option<RxFrame<'_>> {
        self.next_frame()
    }
    fn release(&mut self) {
        Xsk::release(self)
    }
    fn wait(&self, timeout_ms: i32) -> Result<bool, SysError> {
        Xsk::wait(self, timeout_ms)
    }
    fn take_drops(&self) -> Result<u64, SysError> {
        Ok(Xsk::take_drops(self))
    }
    fn raw_fd(&self) -> std::os::fd::RawFd {
        Xsk::raw_fd(self)
    }
}

/// `NETDEV_XDP_ACT_*`: what an interface's driver does with XDP (`uapi/linux/netdev.h`).
pub mod xdp_act {
    /// XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX in the driver (native XDP).
    pub const BASIC: u64 = 1;
    /// XDP_REDIRECT from this interface.
    pub const REDIRECT: u64 = 2;
    /// Frames redirected *to* this interface (`ndo_xdp_xmit`).
    pub const NDO_XMIT: u64 = 4;
    /// AF_XDP zero-copy.
    pub const XSK_ZEROCOPY: u64 = 8;
    /// Offload to the NIC.
    pub const HW_OFFLOAD: u64 = 16;
    /// Multi-buffer frames on receive.
    pub const RX_SG: u64 = 32;
    /// Multi-buffer frames through `ndo_xdp_xmit`.
    pub const NDO_XMIT_SG: u64 = 64;
    /// Names, in bit order.
    pub const NAMES: [(u64, &str); 7] = [
        (BASIC, "basic"),
        (REDIRECT, "redirect"),
        (NDO_XMIT, "ndo-xmit"),
        (XSK_ZEROCOPY, "xsk-zerocopy"),
        (HW_OFFLOAD, "hw-offload"),
        (RX_SG, "rx-sg"),
        (NDO_XMIT_SG, "ndo-xmit-sg"),
    ];
}

/// Why a backend is not available here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The failed call and the kernel's words.
    pub reason: String,
    /// Whether it was for want of a privilege (EPERM/EACCES): running as root, or with the
    /// capability, would help.
    pub permission: bool,
}

impl From<SysError> for Refused {
    fn from(e: SysError) -> Refused {
        let permission = matches!(e.source.raw_os_error(), Some(libc::EPERM | libc::EACCES));
        Refused {
            reason: e.to_string(),
            permission,
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// What the kernel and an interface offer the frame backends, asked once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// The interface.
    pub ifindex: u32,
    /// Its receive and transmit queues (sysfs; `None`: not readable here).
    pub queues: Option<(u32, u32)>,
    /// An `AF_PACKET` socket can be opened (the rings; needs CAP_NET_RAW).
    pub af_packet: Result<(), Refused>,
    /// An `AF_XDP` socket can be opened (kernel built with XDP sockets; CAP_NET_RAW).
    pub af_xdp: Result<(), Refused>,
    /// The driver's XDP features ([`xdp_act`] bits) from generic netlink (Linux 6.3+);
    /// `Err`: not known here, and why.
    pub xdp_features: Result<u64, String>,
    /// `BPF_PROG_TEST_RUN` runs XDP programs on live frames for this interface (Linux
    /// 5.18+; CAP_BPF and CAP_NET_ADMIN): tried once with a program that drops.
    pub live_frames: Result<(), Refused>,
}

impl Capabilities {
    /// Asks the kernel, in the calling thread's network namespace. Fails only for an
    /// interface that does not exist; each answer that could not be had says why.
    pub fn probe(ifname: &str) -> Result<Capabilities, SysError> {
        let ifindex = crate::sys::packet::ifindex(ifname)?;
        let open = |domain, ty, call| {
            crate::sys::socket_available(domain, ty, call).map_err(Refused::from)
        };
        let xdp_features = match crate::sys::netlink::xdp_features(ifindex) {
            Ok(Some(bits)) => Ok(bits),
            Ok(None) => Err("this kernel has no netdev netlink family (Linux 6.3+)".into()),
            Err(e) => Err(e.to_string()),
        };
        Ok(Capabilities {
            ifindex,
            queues: crate::link::queues(ifname),
            af_packet: open(libc::AF_PACKET, libc::SOCK_RAW, "socket(AF_PACKET)"),
            af_xdp: open(libc::AF_XDP, libc::SOCK_RAW, "socket(AF_XDP)"),
            xdp_features,
            live_frames: live_frames(ifindex),
        })
    }

    /// Whether the driver says it has feature `bit` ([`xdp_act`]); `None`: not known.
    pub fn xdp(&self, bit: u64) -> Option<bool> {
        self.xdp_features.as_ref().ok().map(|f| f & bit != 0)
    }

    /// The driver's XDP features by name (empty when not known).
    pub fn xdp_feature_names(&self) -> Vec<&'static str> {
        xdp_act::NAMES
            .iter()
            .filter(|(bit, _)| self.xdp(*bit) == Some(true))
            .map(|(_, n)| *n)
            .collect()
    }

    /// How an AF_XDP socket binds here: `"zero-copy"` where the driver offers it, else
    /// `"copy"`.
    pub fn af_xdp_mode(&self) -> &'static str {
        if self.xdp(xdp_act::XSK_ZEROCOPY) == Some(true) {
            "zero-copy"
        } else {
            "copy"
        }
    }
}

/// Runs a one-instruction-pair XDP program (`XDP_DROP`) once on a live frame of `ifindex`.
fn live_frames(ifindex: u32) -> Result<(), Refused> {
    const XDP_DROP: i32 = 1;
    let insns = Asm::new()
        .mov_imm(R0, XDP_DROP)
        .exit()
        .finish()
        .map_err(|e| Refused {
            reason: format!("{e:?}"),
            permission: false,
        })?;
    let prog = crate::sys::bpf::prog_load(crate::sys::bpf::PROG_XDP, "fl_probe", &insns)
        .map_err(|e| Refused::from(e.error))?;
    let frame = [0u8; 64];
    crate::sys::bpf::xdp_test_run_live(&prog, &frame, ifindex, 0, 1, 1)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_maps_whole_blocks_and_the_fewest_bytes() {
        // A 1 500-byte MTU: 1 598 → 1 600-byte slots, 40 in a 64 KiB block.
        let g = RingGeometry::new(4096, rx_slot_size(1518));
        assert_eq!((g.slot_size, g.block_size, g.per_block), (1600, 65536, 40));
        assert_eq!((g.blocks, g.slots, g.bytes), (103, 4120, 103 * 65536));
        // lo's 64 KiB MTU: one slot per 128 KiB block would map 512 MiB for 4 096 slots;
        // 2 MiB blocks of 31 map 264 MiB.
        let g = RingGeometry::new(4096, rx_slot_size(65536 + 18));
        assert_eq!(g.slot_size, 65648);
        assert!(g.bytes < 280 << 20, "{g:?}");
        assert_eq!(g.slots, g.blocks * g.per_block);
        assert!(g.slots >= 4096 && g.per_block * g.slot_size <= g.block_size);
        assert!(g.block_size.is_power_of_two() && g.block_size <= MAX_BLOCK);
    }

    #[test]
    fn a_budget_gives_the_most_slots_that_fit() {
        let slot = rx_slot_size(65536 + 18);
        let g = RingGeometry::within(32 << 20, slot, 4096).expect("fits");
        assert!(g.bytes <= 32 << 20);
        // One more slot would not fit.
        assert!(
            RingGeometry::new(g.slots + 1, slot).bytes > 32 << 20,
            "{g:?}"
        );
        // A cap below what fits is the cap (rounded up to whole blocks, within the budget).
        let g = RingGeometry::within(1 << 30, 1600, 64).expect("fits");
        assert_eq!((g.slots, g.bytes), (80, 2 * 65536));
        assert!(RingGeometry::within(65535, 1600, 64).is_none());
        assert!(RingGeometry::within(1 << 30, 1600, 0).is_none());
    }

    #[test]
    fn loopback_is_probed_and_every_answer_is_explained() {
        let c = Capabilities::probe("lo").expect("lo exists");
        assert_eq!(c.ifindex, 1);
        assert!(c.queues.is_some_and(|(rx, tx)| rx >= 1 && tx >= 1), "{c:?}");
        // As root on Linux 6.18 every backend is there; elsewhere each refusal says why.
        for (what, r) in [("af_packet", &c.af_packet), ("af_xdp", &c.af_xdp)] {
            if let Err(e) = r {
                assert!(e.reason.contains("socket("), "{what}: {e}");
            }
        }
        if let Ok(bits) = c.xdp_features {
            assert_eq!(bits & !0x7f, 0);
            assert_eq!(c.xdp_feature_names().len(), bits.count_ones() as usize);
        }
        assert!(Capabilities::probe("no-such-if0").is_err());
    }
}
