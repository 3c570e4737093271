//! AF_XDP: a UMEM of fixed-size frames shared with the kernel, a TX ring of descriptors the
//! user produces and a completion ring of frames the kernel is done with; for receiving, a
//! fill ring of free frames the user hands the kernel and an RX ring of frames it filled
//! (`Documentation/networking/af_xdp.rst`). Sockets are bound without forcing a mode: the
//! kernel takes zero-copy where the driver offers it, else copy mode. Copy mode works on any interface,
//! veth included; `need_wakeup` lets the kernel say when a kick is needed.
//!
//! [`XskTx`] only transmits: the UMEM is written once by the caller (template frames), per
//! packet only descriptors move. [`Xsk`] receives, and can send a received frame back out
//! from where it lies in the UMEM (the reflector): no frame is copied in user space.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{check, SysError};

pub(super) const AF_XDP: libc::c_int = 44;
pub(super) const SOL_XDP: libc::c_int = 283;
const XDP_MMAP_OFFSETS: libc::c_int = 1;
const XDP_RX_RING: libc::c_int = 2;
const XDP_TX_RING: libc::c_int = 3;
pub(super) const XDP_UMEM_REG: libc::c_int = 4;
const XDP_UMEM_FILL_RING: libc::c_int = 5;
const XDP_UMEM_COMPLETION_RING: libc::c_int = 6;
const XDP_STATISTICS: libc::c_int = 7;
/// Linux 6.17+: descriptors one send call takes in copy mode (default 32).
const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;
pub(super) const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
const XDP_RING_NEED_WAKEUP: u32 = 1;
const PGOFF_RX_RING: libc::off_t = 0;
const PGOFF_TX_RING: libc::off_t = 0x8000_0000;
const PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
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
pub(super) struct UmemReg {
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) chunk_size: u32,
    pub(super) headroom: u32,
    pub(super) flags: u32,
}

#[repr(C)]
#[derive(Default)]
pub(super) struct XdpStatistics {
    pub(super) rx_dropped: u64,
    pub(super) rx_invalid_descs: u64,
    pub(super) tx_invalid_descs: u64,
    pub(super) rx_ring_full: u64,
    pub(super) rx_fill_ring_empty_descs: u64,
    pub(super) tx_ring_empty_descs: u64,
}

impl XdpStatistics {
    /// Frames the kernel dropped for the socket: no room in the RX ring (`rx_ring_full`), or
    /// no free frame in the fill ring or a frame too large (`rx_dropped`). Not
    /// `rx_fill_ring_empty_descs`: in copy mode a frame dropped for an empty fill ring is
    /// counted there *and* in `rx_dropped` (`__xp_alloc` bumps the one, `__xsk_rcv` the
    /// other), and in zero-copy mode it counts a driver's failed refills, not frames. Summing
    /// all three counted such drops twice: measured as exactly twice the frames the interface
    /// received and no socket got.
    pub(super) fn dropped(&self) -> u64 {
        self.rx_dropped + self.rx_ring_full
    }
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
pub(super) struct Ring {
    pub(super) map: *mut u8,
    pub(super) len: usize,
    pub(super) producer: *const AtomicU32,
    pub(super) consumer: *const AtomicU32,
    pub(super) flags: *const AtomicU32,
    pub(super) desc: *mut u8,
    pub(super) mask: u32,
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

    pub(super) fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping (see `map`).
        unsafe { &*self.producer }
    }

    pub(super) fn consumer(&self) -> &AtomicU32 {
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
    umem: Umem,
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
        let s = Socket::open(ifindex, queue, frames, frame_size, false)?;
        Ok(XskTx {
            tx: s.tx,
            cr: s.cr,
            fd: s.fd,
            umem: s.umem,
            frame_size,
            frames: s.frames,
            outstanding: 0,
            next: 0,
            completed: 0,
        })
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
            std::slice::from_raw_parts_mut(self.umem.ptr.add(i * self.frame_size), self.frame_size)
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
        kick_tx(&self.fd, &self.tx)
    }

    /// Descriptors the kernel refused as invalid (XDP_STATISTICS tx_invalid_descs).
    pub fn tx_invalid(&self) -> u64 {
        statistics(&self.fd).tx_invalid_descs
    }
}

/// The UMEM: an anonymous mapping the kernel pins while a socket has it registered.
#[derive(Debug)]
pub(super) struct Umem {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

impl Umem {
    pub(super) fn new(len: usize) -> Result<Umem, SysError> {
        // SAFETY: an anonymous private mapping; checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(SysError {
                call: "mmap(UMEM)",
                source: io::Error::last_os_error(),
            });
        }
        Ok(Umem {
            ptr: ptr as *mut u8,
            len,
        })
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // The kernel keeps its own reference to the pinned pages until the socket's UMEM is
        // released, so this process's view may go first.
        // SAFETY: exactly the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

/// What opening a socket makes: the descriptor, the UMEM and the mapped rings.
struct Socket {
    tx: Ring,
    cr: Ring,
    rx: Option<(Ring, Ring)>,
    fd: OwnedFd,
    umem: Umem,
    frames: u32,
}

impl Socket {
    /// An AF_XDP socket in copy mode with need_wakeup on `ifindex` queue `queue`: `frames`
    /// (rounded up to a power of two, at least 64) UMEM frames of `frame_size` bytes, TX and
    /// completion rings, and with `rx` also fill and RX rings; bound.
    fn open(
        ifindex: u32,
        queue: u32,
        frames: u32,
        frame_size: usize,
        rx: bool,
    ) -> Result<Socket, SysError> {
        let frames = frames.max(64).next_power_of_two();
        // SAFETY: plain socket(2); checked.
        let raw = check("socket(AF_XDP)", unsafe {
            libc::socket(AF_XDP, libc::SOCK_RAW, 0)
        })?;
        // SAFETY: a new descriptor owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let umem = Umem::new(frames as usize * frame_size)?;
        let reg = UmemReg {
            addr: umem.ptr as u64,
            len: umem.len as u64,
            chunk_size: frame_size as u32,
            headroom: 0,
            flags: 0,
        };
        super::set_opt(&fd, SOL_XDP, XDP_UMEM_REG, &reg, "setsockopt(XDP_UMEM_REG)")?;
        // Neither XDP_COPY nor XDP_ZEROCOPY: the kernel binds zero-copy where the driver
        // offers it (NETDEV_XDP_ACT_XSK_ZEROCOPY) and copy mode otherwise (veth).
        let flags = XDP_USE_NEED_WAKEUP;
        let (tx, cr, rx) = rings_and_bind(&fd, ifindex, queue, frames, rx, flags, 0)?;
        Ok(Socket {
            tx,
            cr,
            rx,
            fd,
            umem,
            frames,
        })
    }
}

/// Sizes and maps a socket's rings — TX, completion and, with `rx`, RX and fill, `n` entries
/// each — and binds it to `ifindex` queue `queue` with `flags` (sharing `shared_fd`'s UMEM
/// when `flags` says `XDP_SHARED_UMEM`).
#[allow(clippy::type_complexity)]
pub(super) fn rings_and_bind(
    fd: &OwnedFd,
    ifindex: u32,
    queue: u32,
    n: u32,
    rx: bool,
    flags: u16,
    shared_fd: u32,
) -> Result<(Ring, Ring, Option<(Ring, Ring)>), SysError> {
    for (opt, call) in [
        (XDP_UMEM_FILL_RING, "setsockopt(XDP_UMEM_FILL_RING)"),
        (
            XDP_UMEM_COMPLETION_RING,
            "setsockopt(XDP_UMEM_COMPLETION_RING)",
        ),
        (XDP_TX_RING, "setsockopt(XDP_TX_RING)"),
    ] {
        super::set_opt(fd, SOL_XDP, opt, &n, call)?;
    }
    if rx {
        super::set_opt(fd, SOL_XDP, XDP_RX_RING, &n, "setsockopt(XDP_RX_RING)")?;
    }
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
    check("getsockopt(XDP_MMAP_OFFSETS)", ret)?;
    let tx = Ring::map(fd, &off.tx, n, 16, PGOFF_TX_RING, "mmap(XDP TX ring)")?;
    let cr = Ring::map(
        fd,
        &off.cr,
        n,
        8,
        PGOFF_COMPLETION_RING,
        "mmap(XDP completion ring)",
    )?;
    let rx = if rx {
        Some((
            Ring::map(fd, &off.rx, n, 16, PGOFF_RX_RING, "mmap(XDP RX ring)")?,
            Ring::map(fd, &off.fr, n, 8, PGOFF_FILL_RING, "mmap(XDP fill ring)")?,
        ))
    } else {
        None
    };
    let sxdp = SockaddrXdp {
        family: AF_XDP as u16,
        flags,
        ifindex,
        queue_id: queue,
        shared_umem_fd: shared_fd,
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
    check("bind(AF_XDP)", ret)?;
    // In copy mode one wakeup sends 32 frames unless told more: the whole ring per call where
    // the kernel takes the option (a socket that shares a UMEM in zero-copy mode ignores it;
    // older kernels refuse it, and keep 32).
    let _ = super::set_opt(
        fd,
        SOL_XDP,
        XDP_MAX_TX_SKB_BUDGET,
        &n,
        "setsockopt(XDP_MAX_TX_SKB_BUDGET)",
    );
    Ok((tx, cr, rx))
}

/// The socket's XDP_STATISTICS (zeros where the call fails).
pub(super) fn statistics(fd: &OwnedFd) -> XdpStatistics {
    let mut s = XdpStatistics::default();
    let mut len = std::mem::size_of::<XdpStatistics>() as libc::socklen_t;
    // SAFETY: `s` and `len` are valid for writes of the sizes given.
    let ret = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            SOL_XDP,
            XDP_STATISTICS,
            &mut s as *mut XdpStatistics as *mut libc::c_void,
            &mut len,
        )
    };
    if ret == 0 {
        s
    } else {
        XdpStatistics::default()
    }
}

/// Wakes the kernel to transmit when the TX ring asks for it (need_wakeup). EAGAIN, EBUSY,
/// ENOBUFS and EINTR mean "more later" and are not errors.
pub(super) fn kick_tx(fd: &OwnedFd, tx: &Ring) -> Result<(), SysError> {
    if tx.flags().load(Ordering::Acquire) & XDP_RING_NEED_WAKEUP == 0 {
        return Ok(());
    }
    // SAFETY: sendto with no buffer and no address: for AF_XDP it only triggers TX.
    let ret = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
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

/// An AF_XDP socket that receives — the frames an XDP program redirects to it through an
/// XSKMAP — and can send a received frame back out from where it lies in the UMEM.
///
/// Every UMEM frame is always in exactly one place: the fill ring (free, for the kernel to
/// fill), the RX ring (received, for us), the TX ring or in transmission (sent on), or the
/// completion ring (sent, to go back to the fill ring). Nothing is allocated per packet.
#[derive(Debug)]
pub struct Xsk {
    rx: Ring,
    fr: Ring,
    tx: Ring,
    cr: Ring,
    fd: OwnedFd,
    umem: Umem,
    frame_size: usize,
    /// Frames sent on and not completed yet.
    outstanding: u32,
    /// The kernel's drop counters at the last `take_drops`.
    drops_seen: std::cell::Cell<u64>,
}

// SAFETY: the mappings and descriptor are owned by this value; the kernel's concurrent access
// goes through the rings' atomic producer/consumer indices.
unsafe impl Send for Xsk {}

impl Xsk {
    /// Opens a receiving AF_XDP socket in copy mode on `ifindex` queue `queue`, with `frames`
    /// UMEM frames of `frame_size` bytes (2048 or 4096), every one handed to the kernel to
    /// fill. Frames reach it once an XDP program redirects them to it (an XSKMAP entry for
    /// `queue` holding [`Xsk::raw_fd`]). Needs CAP_NET_RAW.
    pub fn open(ifindex: u32, queue: u32, frames: u32, frame_size: usize) -> Result<Xsk, SysError> {
        let s = Socket::open(ifindex, queue, frames, frame_size, true)?;
        let (rx, fr) = s.rx.ok_or(SysError {
            call: "mmap(XDP RX ring)",
            source: io::Error::other("no RX ring"),
        })?;
        let x = Xsk {
            rx,
            fr,
            tx: s.tx,
            cr: s.cr,
            fd: s.fd,
            umem: s.umem,
            frame_size,
            outstanding: 0,
            drops_seen: std::cell::Cell::new(0),
        };
        for i in 0..s.frames {
            x.fill(i as u64 * frame_size as u64);
        }
        Ok(x)
    }

    /// The socket's descriptor, for the XSKMAP entry.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Hands the frame at `addr` to the kernel to fill. The fill ring has a slot for every
    /// UMEM frame, so it is never full.
    fn fill(&self, addr: u64) {
        let prod = self.fr.producer().load(Ordering::Relaxed);
        let slot = (prod & self.fr.mask) as usize;
        // SAFETY: slot < ring size; each fill entry is a u64 inside the fill ring mapping,
        // owned by the producer (us) until the index below is published.
        unsafe { std::ptr::write_unaligned(self.fr.desc.add(slot * 8) as *mut u64, addr) };
        self.fr
            .producer()
            .store(prod.wrapping_add(1), Ordering::Release);
    }

    /// The next received descriptor (address, length), if one waits.
    fn peek(&self) -> Option<(u64, usize)> {
        let at = self.rx.consumer().load(Ordering::Relaxed);
        if self.rx.producer().load(Ordering::Acquire).wrapping_sub(at) == 0 {
            return None;
        }
        let slot = (at & self.rx.mask) as usize;
        // SAFETY: slot < ring size; the kernel published this 16-byte descriptor (Acquire
        // above) and does not touch it until the consumer index passes it.
        let (addr, len) = unsafe {
            let d = self.rx.desc.add(slot * 16);
            (
                std::ptr::read_unaligned(d as *const u64),
                std::ptr::read_unaligned(d.add(8) as *const u32),
            )
        };
        Some((addr, len as usize))
    }

    /// Where the frame at `addr`, `len` long, lies in the UMEM: (offset, length) — as far as
    /// the UMEM reaches (the kernel's values are trusted no further).
    fn span(&self, addr: u64, len: usize) -> (usize, usize) {
        let start = (addr as usize).min(self.umem.len);
        let end = start.saturating_add(len).min(self.umem.len);
        (start, end - start)
    }

    /// Consumes the RX descriptor just peeked.
    fn consume(&mut self) {
        let cons = self.rx.consumer().load(Ordering::Relaxed);
        self.rx
            .consumer()
            .store(cons.wrapping_add(1), Ordering::Release);
    }

    /// Takes completed frames back into the fill ring.
    fn recycle(&mut self) {
        let prod = self.cr.producer().load(Ordering::Acquire);
        let cons = self.cr.consumer().load(Ordering::Relaxed);
        let n = prod.wrapping_sub(cons);
        for k in 0..n {
            let slot = (cons.wrapping_add(k) & self.cr.mask) as usize;
            // SAFETY: slot < ring size; the kernel published these completion entries.
            let addr =
                unsafe { std::ptr::read_unaligned(self.cr.desc.add(slot * 8) as *const u64) };
            self.fill(addr);
        }
        self.cr
            .consumer()
            .store(cons.wrapping_add(n), Ordering::Release);
        self.outstanding -= n.min(self.outstanding);
    }

    /// Handles up to `max` received frames in place: `turn(frame)` may change the frame and
    /// says whether to send it back out (`true`, from where it lies: no copy) or hand it back
    /// to the kernel to fill again (`false`). Returns (handled, sent). Kick with
    /// [`Xsk::kick`].
    pub fn reflect(
        &mut self,
        max: usize,
        mut turn: impl FnMut(&mut [u8]) -> bool,
    ) -> (usize, usize) {
        self.recycle();
        let (mut n, mut sent) = (0, 0);
        let tx_prod = self.tx.producer().load(Ordering::Relaxed);
        while n < max {
            let Some((addr, len)) = self.peek() else {
                break;
            };
            let (start, len) = self.span(addr, len);
            // SAFETY: [start, start + len) lies inside the UMEM mapping; the frame came off
            // the RX ring and is in no ring until we put it in one below, so only this
            // borrow (which ends with `turn`) touches it.
            let frame = unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(start), len) };
            let keep = turn(frame);
            self.consume();
            n += 1;
            if keep {
                let slot = (tx_prod.wrapping_add(sent as u32) & self.tx.mask) as usize;
                // SAFETY: slot < ring size (the TX ring has a slot for every UMEM frame, so
                // it cannot be full); the 16-byte descriptor is ours until the producer index
                // below is published.
                unsafe {
                    let d = self.tx.desc.add(slot * 16);
                    std::ptr::write_unaligned(d as *mut u64, addr);
                    std::ptr::write_unaligned(d.add(8) as *mut u32, len as u32);
                    std::ptr::write_unaligned(d.add(12) as *mut u32, 0);
                }
                sent += 1;
            } else {
                self.fill(addr);
            }
        }
        if sent > 0 {
            self.tx
                .producer()
                .store(tx_prod.wrapping_add(sent as u32), Ordering::Release);
            self.outstanding += sent as u32;
        }
        (n, sent)
    }

    /// Wakes the kernel to transmit what was sent on, where it asks for it. In copy mode one
    /// wakeup transmits a bounded batch (32 by default): repeated while descriptors wait, a
    /// few times at most.
    pub fn kick(&self) -> Result<(), SysError> {
        for _ in 0..8 {
            let pending = self
                .tx
                .producer()
                .load(Ordering::Relaxed)
                .wrapping_sub(self.tx.consumer().load(Ordering::Acquire));
            if pending == 0 {
                break;
            }
            kick_tx(&self.fd, &self.tx)?;
        }
        Ok(())
    }

    /// Frames sent on that the kernel has not completed yet.
    pub fn in_flight(&mut self) -> usize {
        self.recycle();
        self.outstanding as usize
    }

    /// The next received frame, if one waits (the frame vocabulary's receive side; hand it
    /// back with [`Xsk::release`]).
    pub fn next_frame(&self) -> Option<super::packet::RxFrame<'_>> {
        let (addr, len) = self.peek()?;
        let (start, len) = self.span(addr, len);
        // SAFETY: inside the UMEM mapping; the frame is ours until `release` (which takes
        // `&mut self`, so this borrow has ended by then).
        let data = unsafe { std::slice::from_raw_parts(self.umem.ptr.add(start), len) };
        Some(super::packet::RxFrame {
            wire_len: data.len(),
            data,
            status: 0,
            vlan: None,
            // Received (an XDP program redirected it here).
            pkt_type: 0,
            // AF_XDP descriptors carry no time.
            ts_ns: 0,
        })
    }

    /// Hands the frame returned by [`Xsk::next_frame`] back to the kernel to fill.
    pub fn release(&mut self) {
        if let Some((addr, _)) = self.peek() {
            self.consume();
            self.fill(addr);
        }
    }

    /// Waits up to `timeout_ms` for a received frame; whether one may be waiting.
    pub fn wait(&self, timeout_ms: i32) -> Result<bool, SysError> {
        super::poll_readable(self.fd.as_raw_fd(), timeout_ms)
    }

    /// Frames the kernel dropped for this socket since the last call
    /// ([`XdpStatistics::dropped`]).
    pub fn take_drops(&self) -> u64 {
        let total = statistics(&self.fd).dropped();
        total.saturating_sub(self.drops_seen.replace(total))
    }

    /// Descriptors the kernel refused as invalid (`tx_invalid_descs`).
    pub fn tx_invalid(&self) -> u64 {
        statistics(&self.fd).tx_invalid_descs
    }

    /// Bytes per UMEM frame.
    pub fn frame_size(&self) -> usize {
        self.frame_size
    }
}
