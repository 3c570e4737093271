//! AF_XDP transmit: a UMEM of fixed-size frames shared with the kernel, a TX ring of
//! descriptors the user produces, and a completion ring of frames the kernel is done with
//! (`Documentation/networking/af_xdp.rst`). Copy mode (`XDP_COPY`) works on any interface,
//! veth included; `need_wakeup` lets the kernel say when a `sendto` kick is needed.
//!
//! The UMEM is written once by the caller (template frames); per packet only descriptors move.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{check, SysError};

const AF_XDP: libc::c_int = 44;
const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_TX_RING: libc::c_int = 3;
const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_STATISTICS: libc::c_int = 7;
const XDP_COPY: u16 = 1 << 1;
const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_RING_NEED_WAKEUP: u32 = 1;
const PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RingOffset {
    producer: u64,
    consumer: u64,
    desc: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct MmapOffsets {
    rx: RingOffset,
    tx: RingOffset,
    fr: RingOffset,
    cr: RingOffset,
}

#[repr(C)]
struct UmemReg {
    addr: u64,
    len: u64,
    chunk_size: u32,
    headroom: u32,
    flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct XdpStatistics {
    rx_dropped: u64,
    rx_invalid_descs: u64,
    tx_invalid_descs: u64,
    rx_ring_full: u64,
    rx_fill_ring_empty_descs: u64,
    tx_ring_empty_descs: u64,
}

#[repr(C)]
struct SockaddrXdp {
    family: u16,
    flags: u16,
    ifindex: u32,
    queue_id: u32,
    shared_umem_fd: u32,
}

/// One mapped ring: producer and consumer indices and `size` entries of `T`.
#[derive(Debug)]
struct Ring {
    map: *mut u8,
    len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    desc: *mut u8,
    mask: u32,
}

impl Ring {
    fn map(
        fd: &OwnedFd,
        off: &RingOffset,
        size: u32,
        entry: usize,
        pgoff: libc::off_t,
        call: &'static str,
    ) -> Result<Ring, SysError> {
        let len = off.desc as usize + size as usize * entry;
        // SAFETY: maps the ring the kernel made for this socket at its documented page offset,
        // shared read-write; the result is checked against MAP_FAILED.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(SysError {
                call,
                source: io::Error::last_os_error(),
            });
        }
        let map = map as *mut u8;
        // SAFETY: the kernel's offsets lie inside the mapping; indices and flags are u32s the
        // kernel also accesses atomically.
        unsafe {
            Ok(Ring {
                map,
                len,
                producer: map.add(off.producer as usize) as *const AtomicU32,
                consumer: map.add(off.consumer as usize) as *const AtomicU32,
                flags: map.add(off.flags as usize) as *const AtomicU32,
                desc: map.add(off.desc as usize),
                mask: size - 1,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`).
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.consumer }
    }

    fn flags(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*self.flags }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.map as *mut libc::c_void, self.len);
        }
    }
}

/// An AF_XDP socket that only transmits, with its own UMEM.
#[derive(Debug)]
pub struct XskTx {
    // Field order is drop order: rings are unmapped before the socket closes and the UMEM
    // (which the kernel pins while the socket lives) is freed last.
    tx: Ring,
    cr: Ring,
    fd: OwnedFd,
    umem: *mut u8,
    umem_len: usize,
    frame_size: usize,
    frames: u32,
    /// Frames handed to the kernel and not yet completed.
    outstanding: u32,
    /// Next frame (index) to use; frames are used and completed in ring order.
    next: u32,
    /// Frames the kernel completed (sent, or dropped by the driver).
    pub completed: u64,
}

// SAFETY: the mappings and descriptor are owned by this value; the kernel's concurrent access
// goes through the rings' atomic producer/consumer indices.
unsafe impl Send for XskTx {}

impl XskTx {
    /// Opens a TX-only AF_XDP socket in copy mode on `ifindex` queue `queue`, with `frames`
    /// (a power of two) UMEM frames of `frame_size` bytes (2048 or 4096). Needs CAP_NET_RAW
    /// (and CAP_IPC_LOCK or enough RLIMIT_MEMLOCK for the UMEM on older kernels).
    pub fn open(
        ifindex: u32,
        queue: u32,
        frames: u32,
        frame_size: usize,
    ) -> Result<XskTx, SysError> {
        let frames = frames.max(64).next_power_of_two();
        // SAFETY: plain socket(2); checked.
        let raw = check("socket(AF_XDP)", unsafe {
            libc::socket(AF_XDP, libc::SOCK_RAW, 0)
        })?;
        // SAFETY: a new descriptor owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem_len = frames as usize * frame_size;
        // SAFETY: an anonymous private mapping; checked against MAP_FAILED.
        let umem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if umem == libc::MAP_FAILED {
            return Err(SysError {
                call: "mmap(UMEM)",
                source: io::Error::last_os_error(),
            });
        }
        let umem = umem as *mut u8;
        let free_umem = |e: SysError| {
            // SAFETY: the mapping made just above, not referenced elsewhere yet.
            unsafe { libc::munmap(umem as *mut libc::c_void, umem_len) };
            e
        };
        let reg = UmemReg {
            addr: umem as u64,
            len: umem_len as u64,
            chunk_size: frame_size as u32,
            headroom: 0,
            flags: 0,
        };
        super::set_opt(&fd, SOL_XDP, XDP_UMEM_REG, &reg, "setsockopt(XDP_UMEM_REG)")
            .map_err(free_umem)?;
        let n = frames;
        super::set_opt(
            &fd,
            SOL_XDP,
            XDP_UMEM_FILL_RING,
            &n,
            "setsockopt(XDP_UMEM_FILL_RING)",
        )
        .map_err(free_umem)?;
        super::set_opt(
            &fd,
            SOL_XDP,
            XDP_UMEM_COMPLETION_RING,
            &n,
            "setsockopt(XDP_UMEM_COMPLETION_RING)",
        )
        .map_err(free_umem)?;
        super::set_opt(&fd, SOL_XDP, XDP_TX_RING, &n, "setsockopt(XDP_TX_RING)")
            .map_err(free_umem)?;
        let mut off = MmapOffsets::default();
        let mut len = std::mem::size_of::<MmapOffsets>() as libc::socklen_t;
        // SAFETY: `off` and `len` are valid for writes of the sizes given.
        let ret = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                SOL_XDP,
                XDP_MMAP_OFFSETS,
                &mut off as *mut MmapOffsets as *mut libc::c_void,
                &mut len,
            )
        };
        check("getsockopt(XDP_MMAP_OFFSETS)", ret).map_err(free_umem)?;
        let tx = Ring::map(&fd, &off.tx, n, 16, PGOFF_TX_RING, "mmap(XDP TX ring)")
            .map_err(free_umem)?;
        let cr = Ring::map(
            &fd,
            &off.cr,
            n,
            8,
            PGOFF_COMPLETION_RING,
            "mmap(XDP completion ring)",
        )
        .map_err(free_umem)?;
        let sxdp = SockaddrXdp {
            family: AF_XDP as u16,
            flags: XDP_COPY | XDP_USE_NEED_WAKEUP,
            ifindex,
            queue_id: queue,
            shared_umem_fd: 0,
        };
        // A queue released by a socket that just closed stays busy until the kernel's deferred
        // teardown runs: retry EBUSY for up to a second.
        let mut ret = -1;
        for _ in 0..50 {
            // SAFETY: `sxdp` is a valid sockaddr_xdp of the size passed.
            ret = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    &sxdp as *const SockaddrXdp as *const libc::sockaddr,
                    std::mem::size_of::<SockaddrXdp>() as libc::socklen_t,
                )
            };
            if ret == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EBUSY) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let x = XskTx {
            tx,
            cr,
            fd,
            umem,
            umem_len,
            frame_size,
            frames,
            outstanding: 0,
            next: 0,
            completed: 0,
        };
        check("bind(AF_XDP)", ret)?;
        Ok(x)
    }

    /// UMEM frames.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Frame `i` of the UMEM, to write (only while the kernel does not hold it: before the
    /// first send, or from within [`XskTx::send`]'s callback).
    pub fn frame_mut(&mut self, i: u32) -> &mut [u8] {
        let i = (i % self.frames) as usize;
        // SAFETY: frame i lies inside the UMEM mapping; the caller contract (and `send`)
        // ensure the kernel is not reading it.
        unsafe {
            std::slice::from_raw_parts_mut(self.umem.add(i * self.frame_size), self.frame_size)
        }
    }

    /// Frames not held by the kernel.
    pub fn free(&self) -> u32 {
        self.frames - self.outstanding
    }

    /// Reaps completions; returns how many frames came back.
    pub fn reap(&mut self) -> u32 {
        let prod = self.cr.producer().load(Ordering::Acquire);
        let cons = self.cr.consumer().load(Ordering::Relaxed);
        let n = prod.wrapping_sub(cons);
        if n > 0 {
            // Frames complete in the order they were sent, so the addresses need not be read.
            self.cr
                .consumer()
                .store(cons.wrapping_add(n), Ordering::Release);
            self.outstanding -= n.min(self.outstanding);
            self.completed += n as u64;
        }
        n
    }

    /// Queues up to `max` frames: `fill(frame_index, frame)` patches a frame (already holding
    /// its template) and returns its length. Returns how many were queued.
    pub fn send(&mut self, max: u32, mut fill: impl FnMut(u32, &mut [u8]) -> usize) -> u32 {
        self.reap();
        let free = self.frames - self.outstanding;
        let n = max.min(free);
        if n == 0 {
            return 0;
        }
        let prod = self.tx.producer().load(Ordering::Relaxed);
        for k in 0..n {
            let i = self.next;
            self.next = (self.next + 1) % self.frames;
            let len = fill(i, self.frame_mut(i)).min(self.frame_size);
            let slot = (prod.wrapping_add(k) & self.tx.mask) as usize;
            // SAFETY: slot < ring size; each descriptor is 16 bytes (u64 addr, u32 len,
            // u32 options) inside the TX ring mapping, owned by the producer (us) until the
            // producer index below is published.
            unsafe {
                let d = self.tx.desc.add(slot * 16);
                std::ptr::write_unaligned(d as *mut u64, i as u64 * self.frame_size as u64);
                std::ptr::write_unaligned(d.add(8) as *mut u32, len as u32);
                std::ptr::write_unaligned(d.add(12) as *mut u32, 0);
            }
        }
        self.tx
            .producer()
            .store(prod.wrapping_add(n), Ordering::Release);
        self.outstanding += n;
        n
    }

    /// Descriptors the kernel has not consumed from the TX ring yet.
    pub fn tx_pending(&self) -> u32 {
        self.tx
            .producer()
            .load(Ordering::Relaxed)
            .wrapping_sub(self.tx.consumer().load(Ordering::Acquire))
    }

    /// Wakes the kernel to transmit when it asks for it (need_wakeup). In copy mode each call
    /// sends a bounded batch; EAGAIN/EBUSY/ENOBUFS mean "more later" and are not errors.
    pub fn kick(&self) -> Result<(), SysError> {
        if self.tx.flags().load(Ordering::Acquire) & XDP_RING_NEED_WAKEUP == 0 {
            return Ok(());
        }
        // SAFETY: sendto with no buffer and no address: for AF_XDP it only triggers TX.
        let ret = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        match check("sendto(AF_XDP)", ret as libc::c_int) {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.source.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::EINTR)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Descriptors the kernel refused as invalid (XDP_STATISTICS tx_invalid_descs).
    pub fn tx_invalid(&self) -> u64 {
        let mut s = XdpStatistics::default();
        let mut len = std::mem::size_of::<XdpStatistics>() as libc::socklen_t;
        // SAFETY: `s` and `len` are valid for writes of the sizes given.
        let ret = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                SOL_XDP,
                XDP_STATISTICS,
                &mut s as *mut XdpStatistics as *mut libc::c_void,
                &mut len,
            )
        };
        if ret == 0 {
            s.tx_invalid_descs
        } else {
            0
        }
    }
}

impl Drop for XskTx {
    fn drop(&mut self) {
        // The kernel pins the UMEM's pages when it is registered and keeps its own reference
        // until the socket's UMEM is released, so unmapping this process's view before the
        // descriptor closes (fields drop after this body) is sound.
        // SAFETY: exactly the UMEM mapping made in `open`, unmapped once.
        unsafe {
            libc::munmap(self.umem as *mut libc::c_void, self.umem_len);
        }
    }
}
