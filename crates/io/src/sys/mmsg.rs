//! Batched UDP I/O: `recvmmsg` and `sendmmsg` over preallocated arrays, with per-datagram
//! truncation flags, UDP_GRO receives and UDP_SEGMENT (GSO) sends. Nothing is allocated per
//! datagram.

use std::fmt;
use std::io;
use std::mem::zeroed;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use super::{check, SysError};

/// Largest datagram a buffer must hold (65 535 − 8-byte UDP header; IPv6 jumbograms aside).
/// A GRO-coalesced receive is bounded by the same 64 KiB.
pub const MAX_DATAGRAM: usize = 65_536;
/// Control-message space per datagram (UDP_GRO's int, with room).
const CMSG_SPACE: usize = 64;
/// Most segments one UDP_SEGMENT send may carry (`UDP_MAX_SEGMENTS`).
const MAX_GSO_SEGMENTS: usize = 64;
/// Largest segment [`MmsgBatch::send_back`] coalesces for GSO: it must fit a 1500-byte MTU
/// after IPv6 and UDP headers, or the kernel refuses the whole send (EINVAL).
pub const GSO_MAX_SEGMENT: usize = 1452;

/// An empty address, I/O vector and message header for the batch arrays (pointers set later).
fn zeroed_c_structs() -> (libc::sockaddr_storage, libc::iovec, libc::mmsghdr) {
    // SAFETY: sockaddr_storage is a plain C struct of integers: all zero bytes is valid.
    let addr = unsafe { zeroed() };
    // SAFETY: iovec is a null pointer and a zero length when zeroed: valid, never read so.
    let iov = unsafe { zeroed() };
    // SAFETY: mmsghdr is null pointers and zero lengths when zeroed: valid, filled before use.
    let hdr = unsafe { zeroed() };
    (addr, iov, hdr)
}

/// Per-datagram result of a receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvMeta {
    /// Bytes in the buffer (the datagram's length unless truncated).
    pub len: usize,
    /// The datagram was longer than the buffer (MSG_TRUNC).
    pub truncated: bool,
    /// With UDP_GRO: the buffer holds several datagrams of this size (the last may be
    /// shorter), coalesced by the kernel; 0 for a single datagram.
    pub segment: u16,
    /// With [`MmsgBatch::fragments`]: the largest fragment the kernel reassembled this
    /// datagram from (IP_RECVFRAGSIZE); 0 when it arrived whole.
    pub fragment_size: u16,
    namelen: libc::socklen_t,
}

impl RecvMeta {
    /// Datagrams in the buffer: 1, or the coalesced count with UDP_GRO.
    #[inline]
    pub fn datagrams(&self) -> usize {
        if self.segment == 0 || self.len == 0 {
            1
        } else {
            self.len.div_ceil(self.segment as usize)
        }
    }
}

/// What [`MmsgBatch::send_back`] did.
#[derive(Debug, Default)]
pub struct SendOutcome {
    /// Datagrams the kernel took (a GSO send counts its segments).
    pub datagrams: usize,
    /// Payload bytes the kernel took.
    pub bytes: usize,
    /// Datagrams not sent: buffer full, or refused for their destination.
    pub failed: usize,
    /// Messages sent as several GSO segments.
    pub gso_sends: usize,
    /// The last refusal (EPERM from a firewall, EINVAL, unreachable, …), if any.
    pub error: Option<SysError>,
}

/// Errors that concern one message's destination or contents, not the socket: the message is
/// counted as failed and the rest of the batch goes on.
fn per_message(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EPERM
                | libc::EACCES
                | libc::EINVAL
                | libc::EMSGSIZE
                | libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::ECONNREFUSED
                | libc::EADDRNOTAVAIL
                | libc::EIO
        )
    )
}

/// One outgoing message of a `send_back`: slots `first..first + count`, sent as one datagram or
/// as GSO segments of `segment` bytes.
#[derive(Debug, Clone, Copy, Default)]
struct OutMsg {
    first: usize,
    count: usize,
    segment: u16,
    datagrams: usize,
    bytes: usize,
}

/// Buffers and headers for batched `recvmmsg`/`sendmmsg` on one socket. Pointers are rebuilt
/// before each call, so the struct may move freely between calls.
pub struct MmsgBatch {
    bufs: Vec<u8>,
    buf_size: usize,
    addrs: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<[u64; CMSG_SPACE / 8]>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    meta: Vec<RecvMeta>,
    out: Vec<OutMsg>,
    /// Read UDP_GRO control messages (set when the socket has UDP_GRO on); without it no
    /// control space is passed at all.
    pub gro: bool,
    /// Record each datagram's source address (needed to reply; a sink can skip the copy).
    pub sources: bool,
    /// Read IP_RECVFRAGSIZE/IPV6_RECVFRAGSIZE control messages (set when the socket asked for
    /// them, `flowlane_io::udp::enable_fragment_size`): which datagrams arrived fragmented.
    pub fragments: bool,
}

// SAFETY: the raw pointers inside the headers point only into this struct's own heap
// allocations (buffers, addresses, control space, iovecs), are rebuilt before every system call,
// and are never shared; moving the whole batch to another thread moves everything they refer to.
unsafe impl Send for MmsgBatch {}

impl fmt::Debug for MmsgBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmsgBatch")
            .field("slots", &self.hdrs.len())
            .field("buf_size", &self.buf_size)
            .finish_non_exhaustive()
    }
}

impl MmsgBatch {
    /// `slots` datagrams of up to `buf_size` bytes each.
    pub fn new(slots: usize, buf_size: usize) -> MmsgBatch {
        let slots = slots.max(1);
        let (addr, iov, hdr) = zeroed_c_structs();
        MmsgBatch {
            bufs: vec![0; slots * buf_size],
            buf_size,
            addrs: vec![addr; slots],
            cmsgs: vec![[0; CMSG_SPACE / 8]; slots],
            iovs: vec![iov; slots],
            hdrs: vec![hdr; slots],
            meta: vec![
                RecvMeta {
                    len: 0,
                    truncated: false,
                    segment: 0,
                    fragment_size: 0,
                    namelen: 0,
                };
                slots
            ],
            out: Vec::with_capacity(slots),
            gro: false,
            sources: true,
            fragments: false,
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.hdrs.len()
    }

    /// Receives up to `max` datagrams without blocking; returns how many buffers were filled
    /// (0 when none waits). With UDP_GRO a buffer may hold several datagrams
    /// ([`RecvMeta::datagrams`]).
    pub fn recv(&mut self, fd: &impl AsRawFd, max: usize) -> Result<usize, SysError> {
        let n = max.min(self.slots());
        let base = self.bufs.as_mut_ptr();
        for i in 0..n {
            self.iovs[i] = libc::iovec {
                // In bounds: slot i starts at i * buf_size < bufs.len().
                iov_base: base.wrapping_add(i * self.buf_size) as *mut libc::c_void,
                iov_len: self.buf_size,
            };
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            if self.sources {
                h.msg_hdr.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            } else {
                h.msg_hdr.msg_name = std::ptr::null_mut();
                h.msg_hdr.msg_namelen = 0;
            }
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            if self.gro || self.fragments {
                h.msg_hdr.msg_control = self.cmsgs[i].as_mut_ptr() as *mut libc::c_void;
                h.msg_hdr.msg_controllen = CMSG_SPACE;
            } else {
                h.msg_hdr.msg_control = std::ptr::null_mut();
                h.msg_hdr.msg_controllen = 0;
            }
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: the first `n` headers point at live buffers, addresses and control space
        // owned by `self`, which is not touched until the call returns.
        let ret = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let got = match check("recvmmsg", ret) {
            Ok(k) => k as usize,
            Err(e) if e.source.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) if e.source.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => return Err(e),
        };
        for i in 0..got {
            let h = &self.hdrs[i];
            let segment = if self.gro {
                read_cmsg(&h.msg_hdr, libc::SOL_UDP, libc::UDP_GRO).unwrap_or(0)
            } else {
                0
            };
            // The kernel adds the message only for a datagram it reassembled; one family's
            // socket gets one of the two.
            let fragment_size = if self.fragments {
                read_cmsg(&h.msg_hdr, libc::SOL_IP, libc::IP_RECVFRAGSIZE)
                    .or_else(|| read_cmsg(&h.msg_hdr, libc::SOL_IPV6, libc::IPV6_RECVFRAGSIZE))
                    .unwrap_or(0)
            } else {
                0
            };
            self.meta[i] = RecvMeta {
                len: (h.msg_len as usize).min(self.buf_size),
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                segment: u16::try_from(segment).unwrap_or(0),
                fragment_size: u16::try_from(fragment_size).unwrap_or(u16::MAX),
                namelen: h.msg_hdr.msg_namelen,
            };
        }
        Ok(got)
    }

    /// True when slots `a` and `b` came from the same source address.
    fn same_source(&self, a: usize, b: usize) -> bool {
        let n = self.meta[a].namelen as usize;
        if n != self.meta[b].namelen as usize || n > size_of::<libc::sockaddr_storage>() {
            return false;
        }
        let bytes = |s: &libc::sockaddr_storage| {
            // SAFETY: viewing the first `n` bytes (checked ≤ its size) of a plain C struct.
            unsafe { std::slice::from_raw_parts(s as *const _ as *const u8, n) }
        };
        bytes(&self.addrs[a]) == bytes(&self.addrs[b])
    }

    /// Groups slots `0..n` into outgoing messages. A GRO buffer goes back as GSO segments of
    /// the size it arrived in; with `gso`, runs of equal-size datagrams (≤ GSO_MAX_SEGMENT)
    /// from one source are coalesced into one GSO send.
    fn plan(&mut self, n: usize, gso: bool) {
        self.out.clear();
        let mut i = 0;
        while i < n {
            let m = self.meta[i];
            let mut msg = OutMsg {
                first: i,
                count: 1,
                segment: m.segment,
                datagrams: m.datagrams(),
                bytes: m.len,
            };
            if gso && m.segment == 0 && m.len > 0 && m.len <= GSO_MAX_SEGMENT {
                let cap = MAX_GSO_SEGMENTS.min(MAX_DATAGRAM / m.len - 1);
                while i + msg.count < n && msg.count < cap {
                    let j = i + msg.count;
                    let mj = self.meta[j];
                    if mj.segment != 0 || mj.len != m.len || !self.same_source(i, j) {
                        break;
                    }
                    msg.count += 1;
                }
                if msg.count > 1 {
                    msg.segment = m.len as u16;
                    msg.datagrams = msg.count;
                    msg.bytes = m.len * msg.count;
                }
            }
            i += msg.count;
            self.out.push(msg);
        }
    }

    /// Points send header `k` at its message's slots, destination and (for GSO) a UDP_SEGMENT
    /// control message. Header `k` is never ahead of the slots it reads (`k <= first`).
    fn prepare_send(&mut self, k: usize) {
        let m = self.out[k];
        for s in m.first..m.first + m.count {
            self.iovs[s].iov_len = self.meta[s].len;
        }
        let h = &mut self.hdrs[k];
        h.msg_len = 0;
        h.msg_hdr.msg_name = &mut self.addrs[m.first] as *mut _ as *mut libc::c_void;
        h.msg_hdr.msg_namelen = self.meta[m.first].namelen;
        h.msg_hdr.msg_iov = &mut self.iovs[m.first];
        h.msg_hdr.msg_iovlen = m.count;
        h.msg_hdr.msg_flags = 0;
        if m.segment != 0 && m.datagrams > 1 {
            let c = &mut self.cmsgs[k];
            h.msg_hdr.msg_control = c.as_mut_ptr() as *mut libc::c_void;
            // SAFETY: CMSG_SPACE/LEN are pure arithmetic on sizes.
            let (space, len) = unsafe {
                (
                    libc::CMSG_SPACE(size_of::<u16>() as u32) as usize,
                    libc::CMSG_LEN(size_of::<u16>() as u32) as usize,
                )
            };
            h.msg_hdr.msg_controllen = space;
            // SAFETY: the control buffer (CMSG_SPACE bytes, 8-byte aligned) holds one header
            // and a u16; CMSG_FIRSTHDR is non-null because msg_controllen ≥ a header.
            unsafe {
                let cm = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                (*cm).cmsg_level = libc::SOL_UDP;
                (*cm).cmsg_type = libc::UDP_SEGMENT;
                (*cm).cmsg_len = len;
                std::ptr::write_unaligned(libc::CMSG_DATA(cm) as *mut u16, m.segment);
            }
        } else {
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
        }
    }

    /// Sends buffers `0..n` of the last receive back to their sources, each datagram exactly as
    /// long as it arrived (never larger). `gso` coalesces same-size runs (see [`Self::plan`]).
    /// A full send buffer ends the batch (the rest count as failed); a refusal that concerns
    /// one message (firewall, unreachable, bad size) fails that message only.
    pub fn send_back(
        &mut self,
        fd: &impl AsRawFd,
        n: usize,
        gso: bool,
    ) -> Result<SendOutcome, SysError> {
        let n = n.min(self.slots());
        self.plan(n, gso);
        let k = self.out.len();
        for m in 0..k {
            self.prepare_send(m);
        }
        let mut r = SendOutcome::default();
        let mut at = 0;
        while at < k {
            // SAFETY: headers `at..k` were prepared above and point at live buffers,
            // addresses, iovecs and control space owned by `self`.
            let ret = unsafe {
                libc::sendmmsg(
                    fd.as_raw_fd(),
                    self.hdrs.as_mut_ptr().add(at),
                    (k - at) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            match check("sendmmsg", ret) {
                Ok(0) => break,
                Ok(c) => {
                    for m in &self.out[at..at + c as usize] {
                        r.datagrams += m.datagrams;
                        r.bytes += m.bytes;
                        r.gso_sends += (m.datagrams > 1) as usize;
                    }
                    at += c as usize;
                }
                Err(e) if e.source.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.source.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.source.raw_os_error() == Some(libc::ENOBUFS) => break,
                Err(e) if per_message(&e.source) => {
                    r.failed += self.out[at].datagrams;
                    r.error = Some(e);
                    at += 1;
                }
                Err(e) => {
                    if r.datagrams > 0 || r.failed > 0 {
                        r.error = Some(e);
                        break;
                    }
                    return Err(e);
                }
            }
        }
        r.failed += self.out[at.min(k)..]
            .iter()
            .map(|m| m.datagrams)
            .sum::<usize>();
        Ok(r)
    }

    /// Metadata of received datagram `i`.
    pub fn meta(&self, i: usize) -> RecvMeta {
        self.meta[i]
    }

    /// Payload of received datagram `i`.
    pub fn payload(&self, i: usize) -> &[u8] {
        let m = self.meta[i];
        &self.bufs[i * self.buf_size..i * self.buf_size + m.len]
    }

    /// Source address of received datagram `i`.
    pub fn source(&self, i: usize) -> Option<SocketAddr> {
        let len = self.meta[i].namelen as usize;
        let ss = &self.addrs[i];
        match ss.ss_family as libc::c_int {
            libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
                // SAFETY: the family says the storage holds a sockaddr_in, and the storage is
                // larger and suitably aligned for it.
                let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
                Some(SocketAddr::from((
                    u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
                // SAFETY: as above, for sockaddr_in6.
                let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
                Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                    a.sin6_addr.s6_addr.into(),
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// Writes `addr` into a `sockaddr_storage`; returns the length to pass with it.
pub fn encode_sockaddr(addr: SocketAddr, ss: &mut libc::sockaddr_storage) -> libc::socklen_t {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    *ss = unsafe { zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin = unsafe { &mut *(ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Outgoing datagrams for `sendmmsg`: `slots` buffers, each with its own length and
/// destination, built once and patched in place between sends (no per-packet allocation).
pub struct SendBatch {
    bufs: Vec<u8>,
    slot_size: usize,
    lens: Vec<usize>,
    addrs: Vec<libc::sockaddr_storage>,
    namelens: Vec<libc::socklen_t>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: as for MmsgBatch: header pointers refer only to this struct's own allocations and are
// rebuilt before every call.
unsafe impl Send for SendBatch {}

impl fmt::Debug for SendBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendBatch")
            .field("slots", &self.hdrs.len())
            .field("slot_size", &self.slot_size)
            .finish_non_exhaustive()
    }
}

impl SendBatch {
    /// `slots` datagrams of up to `slot_size` bytes, all empty and addressed to `to`.
    pub fn new(slots: usize, slot_size: usize, to: SocketAddr) -> SendBatch {
        let slots = slots.max(1);
        let (addr, iov, hdr) = zeroed_c_structs();
        let mut b = SendBatch {
            bufs: vec![0; slots * slot_size],
            slot_size,
            lens: vec![0; slots],
            addrs: vec![addr; slots],
            namelens: vec![0; slots],
            iovs: vec![iov; slots],
            hdrs: vec![hdr; slots],
        };
        for i in 0..slots {
            b.set_dest(i, to);
        }
        b
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.hdrs.len()
    }

    /// Sets slot `i`'s destination.
    pub fn set_dest(&mut self, i: usize, to: SocketAddr) {
        self.namelens[i] = encode_sockaddr(to, &mut self.addrs[i]);
    }

    /// Sets slot `i`'s length (at most the slot size) and returns its bytes to fill.
    pub fn slot_mut(&mut self, i: usize, len: usize) -> &mut [u8] {
        let len = len.min(self.slot_size);
        self.lens[i] = len;
        &mut self.bufs[i * self.slot_size..i * self.slot_size + len]
    }

    /// Slot `i`'s length as last set.
    pub fn len(&self, i: usize) -> usize {
        self.lens.get(i).copied().unwrap_or(0)
    }

    /// Sends slots `0..n` with one `sendmmsg`; returns how many the kernel took (0 when the
    /// send buffer is full).
    pub fn send(&mut self, fd: &impl AsRawFd, n: usize) -> Result<usize, SysError> {
        self.send_range(fd, 0, n)
    }

    /// Sends slots `from..to` with one `sendmmsg` (the rest of a batch the kernel cut short);
    /// returns how many the kernel took.
    pub fn send_range(
        &mut self,
        fd: &impl AsRawFd,
        from: usize,
        to: usize,
    ) -> Result<usize, SysError> {
        let to = to.min(self.slots());
        if from >= to {
            return Ok(0);
        }
        let base = self.bufs.as_mut_ptr();
        for i in from..to {
            self.iovs[i] = libc::iovec {
                // In bounds: slot i starts at i * slot_size < bufs.len().
                iov_base: base.wrapping_add(i * self.slot_size) as *mut libc::c_void,
                iov_len: self.lens[i],
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            h.msg_namelen = self.namelens[i];
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
        }
        // SAFETY: headers from..to point at live buffers, addresses and iovecs owned by `self`.
        let ret = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr().add(from),
                (to - from) as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        match check("sendmmsg", ret) {
            Ok(k) => Ok(k as usize),
            Err(e)
                if matches!(
                    e.source.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) || e.source.raw_os_error() == Some(libc::ENOBUFS) =>
            {
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }
}

/// Reads an integer control message (`level`, `kind`) from a received header, e.g. UDP_GRO's
/// segment size.
fn read_cmsg(h: &libc::msghdr, level: libc::c_int, kind: libc::c_int) -> Option<u32> {
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, bounded by
    // msg_controllen; data is read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == level && (*c).cmsg_type == kind {
                return Some(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const u32));
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}
