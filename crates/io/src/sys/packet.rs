//! AF_PACKET rings (TPACKET_V2). The transmit ring (`PACKET_TX_RING`), optionally bypassing
//! the qdisc layer (`PACKET_QDISC_BYPASS`): frames are written into a ring shared with the
//! kernel, marked for sending, and one `send()` hands every marked frame to the driver. The
//! receive ring (`PACKET_RX_RING`): the kernel copies each frame the interface receives into the
//! next free slot and marks it the user's; the user reads it in place and hands the slot back.
//!
//! Slot layout (TPACKET_V2): a 32-byte `tpacket2_hdr` whose first word is the status; on TX the
//! frame follows at `TPACKET_ALIGN(sizeof(tpacket2_hdr))` = 32, on RX at the header's `tp_mac`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{check, SysError};

const SOL_PACKET: libc::c_int = 263;
const PACKET_RX_RING: libc::c_int = 5;
const PACKET_STATISTICS: libc::c_int = 6;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_TX_RING: libc::c_int = 13;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_FANOUT: libc::c_int = 18;
const PACKET_ADD_MEMBERSHIP: libc::c_int = 1;
const PACKET_MR_PROMISC: u16 = 1;
/// Fanout by the CPU that received the frame.
const PACKET_FANOUT_CPU: u32 = 2;
const TPACKET_V2: libc::c_int = 1;
const ETH_P_ALL: u16 = 0x0003;
/// The frame is the user's to fill.
const TP_STATUS_AVAILABLE: u32 = 0;
/// The user asks the kernel to send the frame.
const TP_STATUS_SEND_REQUEST: u32 = 1;
/// The kernel is sending it.
const TP_STATUS_SENDING: u32 = 2;
/// The kernel refused it (malformed); the user must reset the slot.
const TP_STATUS_WRONG_FORMAT: u32 = 4;
/// RX: the slot holds a received frame (the user's until reset to 0).
const TP_STATUS_USER: u32 = 1;
/// RX: the frame was longer than the slot and is cut short.
const TP_STATUS_COPY: u32 = 2;
/// RX: the checksum is not filled in yet (a locally sent packet with checksum offload).
pub const TP_STATUS_CSUMNOTREADY: u32 = 8;
/// RX: a VLAN tag was taken off the frame into `tp_vlan_tci`.
pub const TP_STATUS_VLAN_VALID: u32 = 0x10;
/// RX: the driver (or the sender's stack) verified the checksum.
pub const TP_STATUS_CSUM_VALID: u32 = 0x80;
/// Offset of the frame in a TX slot.
const DATA_OFF: usize = 32;
/// tpacket2_hdr.tp_len.
const LEN_OFF: usize = 4;
/// tpacket2_hdr.tp_snaplen.
const SNAPLEN_OFF: usize = 8;
/// tpacket2_hdr.tp_mac (u16).
const MAC_OFF: usize = 12;
/// tpacket2_hdr.tp_sec (u32): when the kernel took the frame in, CLOCK_REALTIME seconds.
const SEC_OFF: usize = 16;
/// tpacket2_hdr.tp_nsec (u32).
const NSEC_OFF: usize = 20;
/// tpacket2_hdr.tp_vlan_tci (u16).
const VLAN_TCI_OFF: usize = 24;
/// The `sockaddr_ll` after the header (at TPACKET_ALIGN(32)), its `sll_pkttype` (u8, the low
/// byte of a little-endian u16 read; `sll_halen` is the high one).
const PKTTYPE_OFF: usize = 32 + 10;
/// `PACKET_OUTGOING`: a frame this host sent.
pub const PACKET_OUTGOING: u8 = 4;
/// `PACKET_FANOUT_FLAG_IGNORE_OUTGOING` (Linux 6.9+): a fanout group's sockets do not see
/// what the host sends (`PACKET_IGNORE_OUTGOING` on a socket does not reach its group).
const PACKET_FANOUT_FLAG_IGNORE_OUTGOING: u32 = 0x4000;

#[repr(C)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
}

#[repr(C)]
#[derive(Default)]
struct TpacketStats {
    tp_packets: u32,
    tp_drops: u32,
}

/// The index of a network interface (in the calling thread's namespace).
pub fn ifindex(name: &str) -> Result<u32, SysError> {
    let c = std::ffi::CString::new(name).map_err(|_| SysError {
        call: "if_nametoindex",
        source: io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(SysError {
            call: "if_nametoindex",
            source: io::Error::last_os_error(),
        });
    }
    Ok(i)
}

/// An AF_PACKET socket with a mapped TPACKET_V2 ring of either direction: what both rings
/// share (socket, geometry, mapping, slot status words).
#[derive(Debug)]
struct Ring {
    fd: OwnedFd,
    map: *mut u8,
    map_len: usize,
    frame_size: usize,
    frames: usize,
    block_size: usize,
    per_block: usize,
}

impl Ring {
    /// An unbound AF_PACKET socket (protocol 0: it receives nothing until bound) with a ring
    /// (`which`: PACKET_TX_RING or PACKET_RX_RING) of at least `frames` slots of `frame_size`
    /// bytes (rounded up to 16), mapped. `setup` sets options that must precede the ring.
    fn open(
        which: libc::c_int,
        frames: usize,
        frame_size: usize,
        setup: impl FnOnce(&OwnedFd) -> Result<(), SysError>,
    ) -> Result<Ring, SysError> {
        // SAFETY: plain socket(2) call; the result is checked.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        let raw = check("socket(AF_PACKET)", raw)?;
        // SAFETY: `raw` is a new descriptor owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        super::set_int(
            &fd,
            SOL_PACKET,
            PACKET_VERSION,
            TPACKET_V2,
            "setsockopt(PACKET_VERSION)",
        )?;
        setup(&fd)?;
        let g = crate::frame::RingGeometry::new(frames, frame_size);
        let (frame_size, block_size, per_block, blocks, frames) =
            (g.slot_size, g.block_size, g.per_block, g.blocks, g.slots);
        let req = TpacketReq {
            block_size: block_size as u32,
            block_nr: blocks as u32,
            frame_size: frame_size as u32,
            frame_nr: frames as u32,
        };
        let (ring_call, map_call) = if which == PACKET_RX_RING {
            ("setsockopt(PACKET_RX_RING)", "mmap(PACKET_RX_RING)")
        } else {
            ("setsockopt(PACKET_TX_RING)", "mmap(PACKET_TX_RING)")
        };
        super::set_opt(&fd, SOL_PACKET, which, &req, ring_call)?;
        let map_len = g.bytes;
        // SAFETY: maps the ring the kernel just made for this socket, shared, read-write; the
        // result is checked against MAP_FAILED.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(SysError {
                call: map_call,
                source: io::Error::last_os_error(),
            });
        }
        Ok(Ring {
            fd,
            map: map as *mut u8,
            map_len,
            frame_size,
            frames,
            block_size,
            per_block,
        })
    }

    /// Binds the socket to interface `ifindex` for `protocol` (network byte order; 0: none).
    fn bind(&self, ifindex: u32, protocol: u16) -> Result<(), SysError> {
        // SAFETY: an all-zero sockaddr_ll is valid; the fields set below are the ones bind reads.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex as i32;
        sll.sll_protocol = protocol;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        let ret = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        check("bind(AF_PACKET)", ret).map(drop)
    }

    /// Byte offset of slot `i`: frames never straddle blocks, so a block may end in a gap.
    fn offset(&self, i: usize) -> usize {
        (i / self.per_block) * self.block_size + (i % self.per_block) * self.frame_size
    }

    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: slot i (< frames) starts inside the mapping, at a 16-byte aligned offset;
        // its first word is the status, which the kernel also accesses atomically.
        unsafe { &*(self.map.add(self.offset(i)) as *const AtomicU32) }
    }

    /// Reads a header field of slot `i` at byte offset `off` (< 32).
    fn header_u32(&self, i: usize, off: usize) -> u32 {
        // SAFETY: the header lies inside slot i of the mapping; an unaligned plain read.
        unsafe { std::ptr::read_unaligned(self.map.add(self.offset(i) + off) as *const u32) }
    }

    fn header_u16(&self, i: usize, off: usize) -> u16 {
        // SAFETY: as `header_u32`.
        unsafe { std::ptr::read_unaligned(self.map.add(self.offset(i) + off) as *const u16) }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `Ring::open`, unmapped once.
        unsafe {
            libc::munmap(self.map as *mut libc::c_void, self.map_len);
        }
    }
}

/// A mapped TX ring on one interface.
#[derive(Debug)]
pub struct TxRing {
    ring: Ring,
    head: usize,
    /// Frames refused by the kernel (TP_STATUS_WRONG_FORMAT) and reclaimed.
    pub wrong_format: u64,
}

// SAFETY: the mapping and descriptor are owned by this value; the kernel's concurrent access to
// the slots goes only through the status words, read and written atomically.
unsafe impl Send for TxRing {}

impl TxRing {
    /// Opens an AF_PACKET socket on interface `ifindex` with a TX ring of `frames` slots of
    /// `frame_size` bytes each (a multiple of 16, at least frame + 32). `bypass` skips the
    /// qdisc layer. Needs CAP_NET_RAW.
    pub fn open(
        ifindex: u32,
        frames: usize,
        frame_size: usize,
        bypass: bool,
    ) -> Result<TxRing, SysError> {
        let ring = Ring::open(PACKET_TX_RING, frames, frame_size, |fd| {
            if bypass {
                super::set_int(
                    fd,
                    SOL_PACKET,
                    PACKET_QDISC_BYPASS,
                    1,
                    "setsockopt(PACKET_QDISC_BYPASS)",
                )?;
            }
            Ok(())
        })?;
        // Protocol 0: this socket receives nothing; it only sends.
        ring.bind(ifindex, 0)?;
        Ok(TxRing {
            ring,
            head: 0,
            wrong_format: 0,
        })
    }

    /// Slots in the ring.
    pub fn frames(&self) -> usize {
        self.ring.frames
    }

    /// Largest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.ring.frame_size - DATA_OFF
    }

    fn status(&self, i: usize) -> &AtomicU32 {
        self.ring.status(i)
    }

    /// Slot `i`'s frame bytes, if the slot is the user's (not queued or being sent).
    pub fn slot_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        if i >= self.ring.frames {
            return None;
        }
        let st = self.status(i).load(Ordering::Acquire);
        if st == TP_STATUS_WRONG_FORMAT {
            self.wrong_format += 1;
            self.status(i).store(TP_STATUS_AVAILABLE, Ordering::Release);
        } else if st != TP_STATUS_AVAILABLE {
            return None;
        }
        // SAFETY: the slot is the user's (status AVAILABLE): the kernel does not touch its data
        // until the status says SEND_REQUEST. The range lies inside slot i of the mapping.
        Some(unsafe {
            std::slice::from_raw_parts_mut(
                self.ring.map.add(self.ring.offset(i) + DATA_OFF),
                self.ring.frame_size - DATA_OFF,
            )
        })
    }

    /// Queues up to `max` frames from the ring's head: `fill(slot, frame)` writes slot `slot`'s
    /// frame and returns its length. Stops at a slot the kernel still owns (ring full). Returns
    /// how many were queued; [`TxRing::kick`] sends them.
    pub fn queue(&mut self, max: usize, mut fill: impl FnMut(usize, &mut [u8]) -> usize) -> usize {
        let mut n = 0;
        while n < max {
            let i = self.head;
            let Some(buf) = self.slot_mut(i) else {
                break;
            };
            let len = fill(i, buf).min(self.ring.frame_size - DATA_OFF);
            let (map, base) = (self.ring.map, self.ring.offset(i));
            // SAFETY: tp_len and tp_snaplen are u32 fields inside slot i's header, which is the
            // user's until the status store below hands it over (Release orders these writes
            // before it).
            unsafe {
                std::ptr::write_unaligned(map.add(base + LEN_OFF) as *mut u32, len as u32);
                std::ptr::write_unaligned(map.add(base + SNAPLEN_OFF) as *mut u32, len as u32);
            }
            self.status(i)
                .store(TP_STATUS_SEND_REQUEST, Ordering::Release);
            self.head = (i + 1) % self.ring.frames;
            n += 1;
        }
        n
    }

    /// Asks the kernel to send every queued frame, without waiting.
    pub fn kick(&self) -> Result<(), SysError> {
        // SAFETY: send(2) with no buffer: for a TX ring it only flushes queued slots.
        let ret = unsafe {
            libc::send(
                self.ring.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
            )
        };
        match check("send(PACKET_TX_RING)", ret as libc::c_int) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.source.raw_os_error(),
                    Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Slots the kernel still holds (queued or being sent).
    pub fn in_flight(&self) -> usize {
        (0..self.ring.frames)
            .filter(|&i| {
                let s = self.status(i).load(Ordering::Acquire);
                s == TP_STATUS_SEND_REQUEST || s == TP_STATUS_SENDING
            })
            .count()
    }
}

/// One received frame, borrowed from the ring until [`RxRing::release`].
#[derive(Debug)]
pub struct RxFrame<'a> {
    /// The frame bytes as captured (at most the slot's room: see `truncated`).
    pub data: &'a [u8],
    /// The frame's length on the wire (FCS excluded); more than `data.len()` when cut short.
    pub wire_len: usize,
    /// TP_STATUS_* flags (checksum state, VLAN taken off).
    pub status: u32,
    /// The VLAN id the kernel took off the frame, if any.
    pub vlan: Option<u16>,
    /// `sll_pkttype`: to this host, broadcast, multicast, to another host, or
    /// [`PACKET_OUTGOING`] (sent by this host; a ring that cannot have the kernel leave those
    /// out hands them over, and its reader skips them).
    pub pkt_type: u8,
    /// When the kernel took the frame in, CLOCK_REALTIME nanoseconds (0: not known, e.g. on
    /// AF_XDP).
    pub ts_ns: u64,
}

impl RxFrame<'_> {
    /// The frame was longer than the ring's slots.
    pub fn truncated(&self) -> bool {
        self.data.len() < self.wire_len || self.status & TP_STATUS_COPY != 0
    }

    /// Whether the UDP checksum cannot be judged from the bytes: already verified by the
    /// driver, or not filled in yet (sent from this host with checksum offload).
    pub fn checksum_settled(&self) -> bool {
        self.status & (TP_STATUS_CSUMNOTREADY | TP_STATUS_CSUM_VALID) != 0
    }
}

/// A mapped RX ring: every frame one interface receives (not the ones this host sends on it),
/// copied by the kernel into the next free slot.
#[derive(Debug)]
pub struct RxRing {
    ring: Ring,
    head: usize,
}

// SAFETY: as TxRing: owned mapping and descriptor; slot hand-over only through the status words.
unsafe impl Send for RxRing {}

impl RxRing {
    /// Opens an AF_PACKET socket receiving every frame on interface `ifindex` into a ring of
    /// `frames` slots, each holding frames up to `max_frame` bytes. Frames this host sends on
    /// the interface are ignored. Needs CAP_NET_RAW.
    pub fn open(ifindex: u32, frames: usize, max_frame: usize) -> Result<RxRing, SysError> {
        // The frame starts at tp_mac = TPACKET_ALIGN(TPACKET2_HDRLEN (52) + 16) − 14 = 66: a
        // slot of max_frame + 80 bytes holds max_frame + 14.
        let ring = Ring::open(
            PACKET_RX_RING,
            frames,
            crate::frame::rx_slot_size(max_frame),
            |fd| {
                super::set_int(
                    fd,
                    SOL_PACKET,
                    PACKET_IGNORE_OUTGOING,
                    1,
                    "setsockopt(PACKET_IGNORE_OUTGOING)",
                )
            },
        )?;
        // Bound last, with its protocol: before this the socket receives nothing, so no frame
        // of another interface slips in.
        ring.bind(ifindex, ETH_P_ALL.to_be())?;
        Ok(RxRing { ring, head: 0 })
    }

    /// [`RxRing::open`], joined to fanout group `group` by CPU (`PACKET_FANOUT_CPU`): of the
    /// group's sockets, the one opened `k`-th receives the frames the kernel received on the
    /// `k`-th CPU modulo the group's size — open them in CPU order, one per worker.
    pub fn open_fanout(
        ifindex: u32,
        frames: usize,
        max_frame: usize,
        group: u16,
    ) -> Result<RxRing, SysError> {
        let r = RxRing::open(ifindex, frames, max_frame)?;
        let arg = u32::from(group) | (PACKET_FANOUT_CPU << 16);
        let fanout = |flags: u32| {
            super::set_int(
                &r.ring.fd,
                SOL_PACKET,
                PACKET_FANOUT,
                (arg | flags << 16) as i32,
                "setsockopt(PACKET_FANOUT)",
            )
        };
        // The group's own hook decides what its sockets see: without the flag (before Linux
        // 6.9: EINVAL) it hands over what the host sends too, marked PACKET_OUTGOING.
        if fanout(PACKET_FANOUT_FLAG_IGNORE_OUTGOING).is_err() {
            fanout(0)?;
        }
        Ok(r)
    }

    /// Keeps only the frames whose recorded queue `m` has `m mod count == index` (a socket
    /// filter on `SKF_AD_QUEUE`, the skb's `queue_mapping`: on a NIC the receive queue + 1 as
    /// the driver recorded it, 0 where none was; on veth the peer's transmit queue, which is
    /// this end's receive queue), so `count` sinks on one interface each take a disjoint share
    /// of its queues, every frame in exactly one.
    pub fn keep_rx_queues(&self, index: u32, count: u32) -> Result<(), SysError> {
        let prog = rx_queue_filter(index, count);
        super::attach_socket_cbpf(&self.ring.fd, &prog)
    }

    /// Puts the interface in promiscuous mode for as long as this socket is open (a
    /// `PACKET_MR_PROMISC` membership: the kernel counts holders and undoes it at close), so
    /// frames to other MACs are received — what a bridge port needs on a real NIC.
    pub fn set_promiscuous(&self, ifindex: u32) -> Result<(), SysError> {
        let mreq = libc::packet_mreq {
            mr_ifindex: ifindex as i32,
            mr_type: PACKET_MR_PROMISC,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        // SAFETY: `mreq` is a valid packet_mreq for the call's duration.
        let r = unsafe {
            libc::setsockopt(
                self.ring.fd.as_raw_fd(),
                SOL_PACKET,
                PACKET_ADD_MEMBERSHIP,
                (&mreq as *const libc::packet_mreq).cast(),
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        };
        super::check("setsockopt(PACKET_ADD_MEMBERSHIP, PACKET_MR_PROMISC)", r).map(drop)
    }

    /// The descriptor, to wait on for POLLIN.
    pub fn raw_fd(&self) -> RawFd {
        self.ring.fd.as_raw_fd()
    }

    /// The next received frame, if one is waiting. Hand it back with [`RxRing::release`]
    /// before asking for the next.
    pub fn next(&self) -> Option<RxFrame<'_>> {
        let i = self.head;
        let st = self.ring.status(i).load(Ordering::Acquire);
        if st & TP_STATUS_USER == 0 {
            return None;
        }
        let wire_len = self.ring.header_u32(i, LEN_OFF) as usize;
        let snap = self.ring.header_u32(i, SNAPLEN_OFF) as usize;
        let mac = self.ring.header_u16(i, MAC_OFF) as usize;
        // The kernel's offsets are trusted only as far as the slot reaches.
        let room = self.ring.frame_size.saturating_sub(mac);
        let len = snap.min(room);
        // SAFETY: the slot is the user's (TP_STATUS_USER, read with Acquire after the kernel's
        // release); [mac, mac + len) lies inside slot i of the mapping (len ≤ frame_size − mac).
        let data = unsafe {
            std::slice::from_raw_parts(self.ring.map.add(self.ring.offset(i) + mac), len)
        };
        let vlan = (st & TP_STATUS_VLAN_VALID != 0)
            .then(|| self.ring.header_u16(i, VLAN_TCI_OFF) & 0x0fff);
        let pkt_type = (self.ring.header_u16(i, PKTTYPE_OFF) & 0xff) as u8;
        let ts_ns = u64::from(self.ring.header_u32(i, SEC_OFF)) * 1_000_000_000
            + u64::from(self.ring.header_u32(i, NSEC_OFF));
        Some(RxFrame {
            data,
            wire_len,
            status: st,
            vlan,
            pkt_type,
            ts_ns,
        })
    }

    /// Hands the frame returned by the last [`RxRing::next`] back to the kernel.
    pub fn release(&mut self) {
        self.ring
            .status(self.head)
            .store(TP_STATUS_AVAILABLE, Ordering::Release);
        self.head = (self.head + 1) % self.ring.frames;
    }

    /// Frames the kernel dropped because the ring was full, since the last call
    /// (PACKET_STATISTICS; reading resets the kernel's counters).
    pub fn take_drops(&self) -> Result<u64, SysError> {
        let mut st = TpacketStats::default();
        super::get_opt(
            &self.ring.fd,
            SOL_PACKET,
            PACKET_STATISTICS,
            &mut st,
            "getsockopt(PACKET_STATISTICS)",
        )?;
        Ok(u64::from(st.tp_drops))
    }
}

/// The classic BPF program of [`RxRing::keep_rx_queues`].
pub(crate) fn rx_queue_filter(index: u32, count: u32) -> [super::BpfInsn; 5] {
    let ins = |code: u16, jt: u8, jf: u8, k: u32| super::BpfInsn { code, jt, jf, k };
    // BPF_LD|BPF_W|BPF_ABS 0x20, BPF_ALU|BPF_MOD|BPF_K 0x94, BPF_JMP|BPF_JEQ|BPF_K 0x15,
    // BPF_RET|BPF_K 0x06. SKF_AD_OFF + SKF_AD_QUEUE.
    const AD_QUEUE: u32 = (-0x1000i32 + 24) as u32;
    [
        ins(0x20, 0, 0, AD_QUEUE),
        ins(0x94, 0, 0, count.max(1)),
        ins(0x15, 0, 1, index),
        ins(0x06, 0, 0, u32::MAX),
        ins(0x06, 0, 0, 0),
    ]
}
