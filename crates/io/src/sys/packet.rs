//! AF_PACKET transmit ring (TPACKET_V2, `PACKET_TX_RING`), optionally bypassing the qdisc
//! layer (`PACKET_QDISC_BYPASS`): frames are written into a ring shared with the kernel, marked
//! for sending, and one `send()` hands every marked frame to the driver.
//!
//! Slot layout (TPACKET_V2 without PACKET_TX_HAS_OFF): a 32-byte `tpacket2_hdr` whose first
//! word is the status, then the frame at offset `TPACKET_ALIGN(sizeof(tpacket2_hdr))` = 32.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{check, SysError};

const SOL_PACKET: libc::c_int = 263;
const PACKET_VERSION: libc::c_int = 10;
const PACKET_TX_RING: libc::c_int = 13;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const TPACKET_V2: libc::c_int = 1;
/// The frame is the user's to fill.
const TP_STATUS_AVAILABLE: u32 = 0;
/// The user asks the kernel to send the frame.
const TP_STATUS_SEND_REQUEST: u32 = 1;
/// The kernel is sending it.
const TP_STATUS_SENDING: u32 = 2;
/// The kernel refused it (malformed); the user must reset the slot.
const TP_STATUS_WRONG_FORMAT: u32 = 4;
/// Offset of the frame in a slot.
const DATA_OFF: usize = 32;
/// tpacket2_hdr.tp_len.
const LEN_OFF: usize = 4;
/// tpacket2_hdr.tp_snaplen.
const SNAPLEN_OFF: usize = 8;

#[repr(C)]
struct TpacketReq {
    block_size: u32,
    block_nr: u32,
    frame_size: u32,
    frame_nr: u32,
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

/// A mapped TX ring on one interface.
#[derive(Debug)]
pub struct TxRing {
    fd: OwnedFd,
    map: *mut u8,
    map_len: usize,
    frame_size: usize,
    frames: usize,
    block_size: usize,
    per_block: usize,
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
        // Protocol 0: this socket receives nothing; it only sends.
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
        if bypass {
            super::set_int(
                &fd,
                SOL_PACKET,
                PACKET_QDISC_BYPASS,
                1,
                "setsockopt(PACKET_QDISC_BYPASS)",
            )?;
        }
        let frame_size = frame_size.next_multiple_of(16).max(64);
        // Blocks of 64 KiB (or one frame if larger), whole frames per block.
        let block_size = (1usize << 16).max(frame_size).next_power_of_two();
        let per_block = block_size / frame_size;
        let blocks = frames.max(1).div_ceil(per_block);
        let frames = blocks * per_block;
        let req = TpacketReq {
            block_size: block_size as u32,
            block_nr: blocks as u32,
            frame_size: frame_size as u32,
            frame_nr: frames as u32,
        };
        super::set_opt(
            &fd,
            SOL_PACKET,
            PACKET_TX_RING,
            &req,
            "setsockopt(PACKET_TX_RING)",
        )?;
        let map_len = block_size * blocks;
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
                call: "mmap(PACKET_TX_RING)",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: an all-zero sockaddr_ll is valid; the fields set below are the ones bind reads.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        let ret = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        let ring = TxRing {
            fd,
            map: map as *mut u8,
            map_len,
            frame_size,
            frames,
            block_size,
            per_block,
            head: 0,
            wrong_format: 0,
        };
        check("bind(AF_PACKET)", ret)?;
        Ok(ring)
    }

    /// Slots in the ring.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Largest frame a slot holds.
    pub fn max_frame(&self) -> usize {
        self.frame_size - DATA_OFF
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

    /// Slot `i`'s frame bytes, if the slot is the user's (not queued or being sent).
    pub fn slot_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        if i >= self.frames {
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
                self.map.add(self.offset(i) + DATA_OFF),
                self.frame_size - DATA_OFF,
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
            let len = fill(i, buf).min(self.frame_size - DATA_OFF);
            let base = self.offset(i);
            // SAFETY: tp_len and tp_snaplen are u32 fields inside slot i's header, which is the
            // user's until the status store below hands it over (Release orders these writes
            // before it).
            unsafe {
                std::ptr::write_unaligned(self.map.add(base + LEN_OFF) as *mut u32, len as u32);
                std::ptr::write_unaligned(self.map.add(base + SNAPLEN_OFF) as *mut u32, len as u32);
            }
            self.status(i)
                .store(TP_STATUS_SEND_REQUEST, Ordering::Release);
            self.head = (i + 1) % self.frames;
            n += 1;
        }
        n
    }

    /// Asks the kernel to send every queued frame, without waiting.
    pub fn kick(&self) -> Result<(), SysError> {
        // SAFETY: send(2) with no buffer: for a TX ring it only flushes queued slots.
        let ret =
            unsafe { libc::send(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT) };
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
        (0..self.frames)
            .filter(|&i| {
                let s = self.status(i).load(Ordering::Acquire);
                s == TP_STATUS_SEND_REQUEST || s == TP_STATUS_SENDING
            })
            .count()
    }
}

impl Drop for TxRing {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `open`, unmapped once.
        unsafe {
            libc::munmap(self.map as *mut libc::c_void, self.map_len);
        }
    }
}
