//! AF_XDP sockets on several interfaces (one queue each) over one UMEM (`XDP_SHARED_UMEM`;
//! zero-copy where the first port's driver offers it — the others must then offer it too):
//! a frame received on one port is sent out of another from where it lies — the router's and
//! the bridge's no-copy path. The first socket registers the UMEM; the others bind with its
//! descriptor and their own fill and completion rings (the kernel asks for those when the
//! device or queue differs; Linux 5.10+), inheriting its copy or zero-copy mode and
//! need_wakeup.
//!
//! Frames move between the rings of different sockets, so no ring owns them: a free pool in
//! user space holds every frame not in some ring. Each round tops each fill ring up from the
//! pool; a received frame is sent on (a TX descriptor on the chosen port, back to the pool
//! when that port's completion ring returns it) or dropped (back to the pool at once). Every
//! ring has a slot for every UMEM frame, so no producer ever finds one full. Nothing is
//! allocated per packet.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use super::xsk::{
    kick_tx, rings_and_bind, statistics, Ring, Umem, UmemReg, AF_XDP, SOL_XDP, XDP_UMEM_REG,
    XDP_USE_NEED_WAKEUP,
};
use super::{check, SysError};

/// `XDP_SHARED_UMEM`: bind with another socket's UMEM.
const XDP_SHARED_UMEM: u16 = 1 << 0;

/// What to do with a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XskAction {
    /// Back to the pool.
    Drop,
    /// Out of port `n`, from where it lies.
    Send(usize),
    /// Out of every port but `n` (the one it came in by): the first from where it lies, the
    /// others as copies into free frames.
    Flood(usize),
}

/// What one [`XskGroup::poll`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskPolled {
    /// Frames received and handed to the caller.
    pub received: usize,
    /// Frames queued for sending (flood copies included).
    pub queued: usize,
    /// Sends that found no free frame for a flood copy.
    pub no_frame: usize,
}

/// One port's socket and rings.
struct Port {
    rx: Ring,
    fr: Ring,
    tx: Ring,
    cr: Ring,
    fd: OwnedFd,
    /// TX descriptors produced, not yet handed to the kernel with the producer index.
    staged: u32,
    /// Frames queued for sending on this port, ever.
    queued: u64,
    drops_seen: u64,
}

/// Sockets on several ports sharing one UMEM, driven by one thread.
pub struct XskGroup {
    // Field order is drop order: sockets (and their rings) close before the UMEM is unmapped.
    ports: Vec<Port>,
    umem: Umem,
    frame_size: usize,
    /// Frames in no ring.
    free: Vec<u64>,
    /// Frames each fill ring is kept topped up to.
    fill_target: u32,
    frames: u32,
}

impl std::fmt::Debug for XskGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskGroup")
            .field("ports", &self.ports.len())
            .field("frames", &self.frames)
            .field("free", &self.free.len())
            .finish()
    }
}

// SAFETY: the mappings and descriptors are owned by this value; the kernel's concurrent
// access goes through the rings' atomic producer/consumer indices.
unsafe impl Send for XskGroup {}

impl Port {
    /// Frames the kernel filled, waiting for us.
    fn rx_ready(&self) -> u32 {
        self.rx
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.rx.consumer().load(Ordering::Relaxed))
    }

    /// Free frames the kernel holds to fill.
    fn fill_level(&self) -> u32 {
        self.fr
            .producer()
            .load(Ordering::Relaxed)
            .wrapping_sub(self.fr.consumer().load(Ordering::Acquire))
    }

    fn fill(&mut self, addr: u64) {
        let prod = self.fr.producer().load(Ordering::Relaxed);
        let slot = (prod & self.fr.mask) as usize;
        // SAFETY: slot < ring size; the entry is ours until the producer index is published.
        unsafe { std::ptr::write_unaligned(self.fr.desc.add(slot * 8) as *mut u64, addr) };
        self.fr
            .producer()
            .store(prod.wrapping_add(1), Ordering::Release);
    }

    /// Stages a TX descriptor (published by `publish_tx`).
    fn stage_tx(&mut self, addr: u64, len: u32) {
        let prod = self.tx.producer().load(Ordering::Relaxed);
        let slot = (prod.wrapping_add(self.staged) & self.tx.mask) as usize;
        // SAFETY: slot < ring size; the ring has a slot for every UMEM frame, so it is never
        // full; the descriptor is ours until the producer index is published.
        unsafe {
            let d = self.tx.desc.add(slot * 16);
            std::ptr::write_unaligned(d as *mut u64, addr);
            std::ptr::write_unaligned(d.add(8) as *mut u32, len);
            std::ptr::write_unaligned(d.add(12) as *mut u32, 0);
        }
        self.staged += 1;
        self.queued += 1;
    }

    fn publish_tx(&mut self) {
        if self.staged > 0 {
            let prod = self.tx.producer().load(Ordering::Relaxed);
            self.tx
                .producer()
                .store(prod.wrapping_add(self.staged), Ordering::Release);
            self.staged = 0;
        }
    }

    /// Completed frames, into `free`.
    fn reap(&mut self, free: &mut Vec<u64>) {
        let prod = self.cr.producer().load(Ordering::Acquire);
        let cons = self.cr.consumer().load(Ordering::Relaxed);
        let n = prod.wrapping_sub(cons);
        for k in 0..n {
            let slot = (cons.wrapping_add(k) & self.cr.mask) as usize;
            // SAFETY: slot < ring size; the kernel published these entries.
            free.push(unsafe {
                std::ptr::read_unaligned(self.cr.desc.add(slot * 8) as *const u64)
            });
        }
        self.cr
            .consumer()
            .store(cons.wrapping_add(n), Ordering::Release);
    }

    fn tx_pending(&self) -> u32 {
        self.tx
            .producer()
            .load(Ordering::Relaxed)
            .wrapping_sub(self.tx.consumer().load(Ordering::Acquire))
    }
}

impl XskGroup {
    /// Opens one socket per `(ifindex, queue)` with need_wakeup over one UMEM of
    /// `frames` (rounded up to a power of two, at least 64 per port) frames of `frame_size`
    /// bytes. Frames reach port `i` once an XDP program redirects them to
    /// [`XskGroup::raw_fd`]`(i)` through an XSKMAP. Needs CAP_NET_RAW.
    pub fn open(
        ports: &[(u32, u32)],
        frames: u32,
        frame_size: usize,
    ) -> Result<XskGroup, SysError> {
        if ports.is_empty() {
            return Err(SysError {
                call: "AF_XDP group",
                source: io::Error::new(io::ErrorKind::InvalidInput, "no port"),
            });
        }
        let frames = frames.max(64 * ports.len() as u32).next_power_of_two();
        let umem = Umem::new(frames as usize * frame_size)?;
        let mut socks: Vec<Port> = Vec::with_capacity(ports.len());
        for (i, &(ifindex, queue)) in ports.iter().enumerate() {
            // SAFETY: plain socket(2); checked.
            let raw = check("socket(AF_XDP)", unsafe {
                libc::socket(AF_XDP, libc::SOCK_RAW, 0)
            })?;
            // SAFETY: a new descriptor owned by nothing else.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let (flags, shared) = if i == 0 {
                let reg = UmemReg {
                    addr: umem.ptr as u64,
                    len: umem.len as u64,
                    chunk_size: frame_size as u32,
                    headroom: 0,
                    flags: 0,
                };
                super::set_opt(&fd, SOL_XDP, XDP_UMEM_REG, &reg, "setsockopt(XDP_UMEM_REG)")?;
                // Zero-copy where the driver offers it, else copy (the kernel's choice).
                (XDP_USE_NEED_WAKEUP, 0)
            } else {
                // A sharing socket may not name a mode: it takes the first one's.
                (XDP_SHARED_UMEM, socks[0].fd.as_raw_fd() as u32)
            };
            let (tx, cr, rx) = rings_and_bind(&fd, ifindex, queue, frames, true, flags, shared)?;
            let (rx, fr) = rx.ok_or(SysError {
                call: "mmap(XDP RX ring)",
                source: io::Error::other("no RX ring"),
            })?;
            socks.push(Port {
                rx,
                fr,
                tx,
                cr,
                fd,
                staged: 0,
                queued: 0,
                drops_seen: 0,
            });
        }
        let mut g = XskGroup {
            ports: socks,
            umem,
            frame_size,
            free: (0..frames as u64)
                .rev()
                .map(|i| i * frame_size as u64)
                .collect(),
            // Half the frames wait in fill rings, the rest in flight or free.
            fill_target: frames / 2 / ports.len() as u32,
            frames,
        };
        g.refill();
        Ok(g)
    }

    /// Port `i`'s socket, for its XSKMAP entry.
    pub fn raw_fd(&self, i: usize) -> Option<std::os::fd::RawFd> {
        self.ports.get(i).map(|p| p.fd.as_raw_fd())
    }

    /// Frames queued for sending on `port` since the group opened.
    pub fn queued(&self, port: usize) -> u64 {
        self.ports.get(port).map_or(0, |p| p.queued)
    }

    /// How many ports.
    pub fn ports(&self) -> usize {
        self.ports.len()
    }

    /// Completed frames back to the pool, then each fill ring topped up from it.
    fn refill(&mut self) {
        for p in &mut self.ports {
            p.reap(&mut self.free);
        }
        for p in &mut self.ports {
            let level = p.fill_level();
            for _ in level..self.fill_target {
                let Some(addr) = self.free.pop() else { return };
                p.fill(addr);
            }
        }
    }

    /// Handles up to `max` frames received on `port`: `act(frame)` may change the frame in
    /// place and says where it goes. Then publishes what was queued (kick with
    /// [`XskGroup::kick`]).
    pub fn poll(
        &mut self,
        port: usize,
        max: usize,
        mut act: impl FnMut(&mut [u8]) -> XskAction,
    ) -> XskPolled {
        let mut done = XskPolled::default();
        if port >= self.ports.len() {
            return done;
        }
        self.refill();
        let n = (self.ports[port].rx_ready() as usize).min(max);
        let cons = self.ports[port].rx.consumer().load(Ordering::Relaxed);
        for k in 0..n as u32 {
            let rx = &self.ports[port].rx;
            let slot = (cons.wrapping_add(k) & rx.mask) as usize;
            // SAFETY: slot < ring size; the kernel published this descriptor (Acquire in
            // rx_ready) and leaves it until the consumer index passes it.
            let (addr, len) = unsafe {
                let d = rx.desc.add(slot * 16);
                (
                    std::ptr::read_unaligned(d as *const u64),
                    std::ptr::read_unaligned(d.add(8) as *const u32) as usize,
                )
            };
            let start = (addr as usize).min(self.umem.len);
            let len = len.min(self.umem.len - start).min(self.frame_size);
            // SAFETY: [start, start + len) lies inside the UMEM; the frame came off the RX
            // ring and is in no ring until we put it in one, so only this borrow touches it.
            let frame = unsafe { std::slice::from_raw_parts_mut(self.umem.ptr.add(start), len) };
            let action = act(frame);
            done.received += 1;
            match action {
                XskAction::Send(out) if out < self.ports.len() => {
                    self.ports[out].stage_tx(addr, len as u32);
                    done.queued += 1;
                }
                XskAction::Flood(from) => {
                    let Some(first) = (0..self.ports.len()).find(|&q| q != from) else {
                        self.free.push(addr);
                        continue;
                    };
                    for q in (first + 1..self.ports.len()).filter(|&q| q != from) {
                        let Some(copy) = self.free.pop() else {
                            done.no_frame += 1;
                            continue;
                        };
                        let at = copy as usize;
                        // SAFETY: both frames lie inside the UMEM (`copy` is a frame start,
                        // len ≤ frame_size) and are distinct (`copy` was free, `addr` is
                        // the received one).
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                self.umem.ptr.add(start),
                                self.umem.ptr.add(at),
                                len,
                            );
                        }
                        self.ports[q].stage_tx(copy, len as u32);
                        done.queued += 1;
                    }
                    self.ports[first].stage_tx(addr, len as u32);
                    done.queued += 1;
                }
                XskAction::Drop | XskAction::Send(_) => self.free.push(addr),
            }
        }
        let rx = &self.ports[port].rx;
        rx.consumer()
            .store(cons.wrapping_add(n as u32), Ordering::Release);
        for p in &mut self.ports {
            p.publish_tx();
        }
        done
    }

    /// Wakes the kernel to transmit on every port where frames wait (in copy mode one wakeup
    /// sends a bounded batch: repeated a few times while descriptors wait).
    pub fn kick(&self) -> Result<(), SysError> {
        for p in &self.ports {
            for _ in 0..8 {
                if p.tx_pending() == 0 {
                    break;
                }
                kick_tx(&p.fd, &p.tx)?;
            }
        }
        Ok(())
    }

    /// Frames queued for sending that the kernel has not completed.
    pub fn in_flight(&mut self) -> usize {
        self.refill();
        let in_rings: u32 = self
            .ports
            .iter()
            .map(|p| p.fill_level() + p.rx_ready())
            .sum();
        (self.frames as usize).saturating_sub(self.free.len() + in_rings as usize)
    }

    /// Waits up to `timeout_ms` for a frame on any port.
    pub fn wait(&self, timeout_ms: i32) -> Result<bool, SysError> {
        let fds: Vec<_> = self.ports.iter().map(|p| p.fd.as_raw_fd()).collect();
        super::poll_any_readable(&fds, timeout_ms)
    }

    /// Frames the kernel dropped on `port`'s socket since the last call
    /// ([`super::xsk::XdpStatistics::dropped`]: once each, not twice).
    pub fn take_drops(&mut self, port: usize) -> u64 {
        let Some(p) = self.ports.get_mut(port) else {
            return 0;
        };
        let total = statistics(&p.fd).dropped();
        total.saturating_sub(std::mem::replace(&mut p.drops_seen, total))
    }
}
