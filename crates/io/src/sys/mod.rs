//! Every system call flowlane makes goes through this module: each `unsafe` block is here, with
//! a `// SAFETY:` comment, and every failure names the call (`SysError { call, source }`).

use std::fmt;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

pub mod bpf;

/// A failed system call.
#[derive(Debug)]
pub struct SysError {
    /// The call, e.g. `setsockopt(SO_REUSEPORT)`.
    pub call: &'static str,
    /// What the kernel said.
    pub source: io::Error,
}

impl fmt::Display for SysError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` failed: {}", self.call, self.source)
    }
}

impl std::error::Error for SysError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Turns a -1 return into a `SysError` carrying errno.
fn check(call: &'static str, ret: libc::c_int) -> Result<libc::c_int, SysError> {
    if ret < 0 {
        Err(SysError {
            call,
            source: io::Error::last_os_error(),
        })
    } else {
        Ok(ret)
    }
}

/// `setsockopt` with an integer value.
pub fn set_int(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
    call: &'static str,
) -> Result<(), SysError> {
    // SAFETY: `value` lives across the call and its exact size is passed.
    let ret = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(call, ret).map(drop)
}

/// `getsockopt` of an integer value.
pub fn get_int(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    call: &'static str,
) -> Result<libc::c_int, SysError> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of the sizes given.
    let ret = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &mut value as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    check(call, ret).map(|_| value)
}

/// One classic BPF instruction (`struct sock_filter`).
pub type BpfInsn = libc::sock_filter;

/// Attaches a classic BPF program choosing the socket of a `SO_REUSEPORT` group
/// (`SO_ATTACH_REUSEPORT_CBPF`, Linux 4.5+). The program returns the index of the socket in
/// bind order.
pub fn attach_reuseport_cbpf(fd: &impl AsRawFd, prog: &[BpfInsn]) -> Result<(), SysError> {
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_ptr() as *mut BpfInsn,
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies it.
    let ret = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    check("setsockopt(SO_ATTACH_REUSEPORT_CBPF)", ret).map(drop)
}

/// Waits up to `timeout_ms` for `fd` to become readable; true if it is.
pub fn poll_readable(fd: RawFd, timeout_ms: i32) -> Result<bool, SysError> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ret = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    match check("poll", ret) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.source.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> Result<(), SysError> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays inside it for
    // cpu < CPU_SETSIZE, which is checked.
    let ret = unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(SysError {
                call: "sched_setaffinity",
                source: io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        let mut set: libc::cpu_set_t = zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    check("sched_setaffinity", ret).map(drop)
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no arguments and no memory effects.
    let c = unsafe { libc::sched_getcpu() };
    (c >= 0).then_some(c as usize)
}

/// Largest datagram a buffer must hold (65 535 − 8-byte UDP header; IPv6 jumbograms aside).
pub const MAX_DATAGRAM: usize = 65_536;
/// Control-message space per datagram (SO_RXQ_OVFL's u32, with room to spare).
const CMSG_SPACE: usize = 64;

/// Per-datagram result of a receive.
#[derive(Debug, Clone, Copy)]
pub struct RecvMeta {
    /// Bytes in the buffer (the datagram's length unless truncated).
    pub len: usize,
    /// The datagram was longer than the buffer (MSG_TRUNC).
    pub truncated: bool,
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
    /// Last SO_RXQ_OVFL value seen (the socket's cumulative drop count), if any.
    pub rxq_ovfl: Option<u32>,
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
        MmsgBatch {
            bufs: vec![0; slots * buf_size],
            buf_size,
            // SAFETY: sockaddr_storage, iovec and mmsghdr are plain C structs for which all
            // zero bytes is a valid value.
            addrs: vec![unsafe { zeroed() }; slots],
            cmsgs: vec![[0; CMSG_SPACE / 8]; slots],
            iovs: vec![unsafe { zeroed() }; slots],
            hdrs: vec![unsafe { zeroed() }; slots],
            meta: vec![
                RecvMeta {
                    len: 0,
                    truncated: false
                };
                slots
            ],
            rxq_ovfl: None,
        }
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.hdrs.len()
    }

    /// Points the first `n` headers at their buffers: whole buffers to receive, or the received
    /// lengths and source addresses to send back.
    fn prepare(&mut self, n: usize, send: bool) {
        let base = self.bufs.as_mut_ptr();
        for i in 0..n {
            let len = if send {
                self.meta[i].len
            } else {
                self.buf_size
            };
            self.iovs[i] = libc::iovec {
                // In bounds: slot i starts at i * buf_size < bufs.len().
                iov_base: base.wrapping_add(i * self.buf_size) as *mut libc::c_void,
                iov_len: len,
            };
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = &mut self.addrs[i] as *mut _ as *mut libc::c_void;
            h.msg_hdr.msg_namelen = if send {
                h.msg_hdr.msg_namelen // keep the source address length from the receive
            } else {
                size_of::<libc::sockaddr_storage>() as libc::socklen_t
            };
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = self.cmsgs[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = if send { 0 } else { CMSG_SPACE };
            h.msg_hdr.msg_flags = 0;
        }
    }

    /// Receives up to `max` datagrams without blocking; returns how many (0 when none waits).
    pub fn recv(&mut self, fd: &impl AsRawFd, max: usize) -> Result<usize, SysError> {
        let n = max.min(self.slots());
        self.prepare(n, false);
        // SAFETY: `prepare` pointed the first `n` headers at live buffers, addresses and
        // control space owned by `self`, which is not touched until the call returns.
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
            self.meta[i] = RecvMeta {
                len: (h.msg_len as usize).min(self.buf_size),
                truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
            };
        }
        // The drop counter is cumulative: the newest datagram's value is the only one needed.
        if let Some(v) = got
            .checked_sub(1)
            .and_then(|l| rxq_ovfl(&self.hdrs[l].msg_hdr))
        {
            self.rxq_ovfl = Some(v);
        }
        Ok(got)
    }

    /// Sends datagrams `0..n` of the last receive back to their sources, each exactly as long
    /// as it arrived (never larger); returns how many the kernel took.
    pub fn send_back(&mut self, fd: &impl AsRawFd, n: usize) -> Result<usize, SysError> {
        let n = n.min(self.slots());
        self.prepare(n, true);
        let mut sent = 0;
        while sent < n {
            // SAFETY: as in `recv`; headers `sent..n` point at live buffers and addresses.
            let ret = unsafe {
                libc::sendmmsg(
                    fd.as_raw_fd(),
                    self.hdrs.as_mut_ptr().add(sent),
                    (n - sent) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            match check("sendmmsg", ret) {
                Ok(0) => break,
                Ok(k) => sent += k as usize,
                Err(e) if e.source.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.source.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    if sent > 0 {
                        break;
                    }
                    return Err(e);
                }
            }
        }
        Ok(sent)
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
        let len = self.hdrs[i].msg_hdr.msg_namelen as usize;
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

/// Reads an SO_RXQ_OVFL control message (the socket's cumulative drop count).
fn rxq_ovfl(h: &libc::msghdr) -> Option<u32> {
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, bounded by
    // msg_controllen; data is read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_RXQ_OVFL {
                return Some(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const u32));
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}
