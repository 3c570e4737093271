//! TCP for stream roles: `SO_REUSEPORT` listen groups steered per CPU (the TCP form of
//! [`crate::udp`]'s steering: the same classic BPF program picks the listener of the worker on
//! the CPU that processed the SYN), non-blocking connects from chosen source addresses, the
//! CPU a connection's packets arrive on, an epoll set with fine timeouts, and `sendfile` from a
//! memfd so a large response leaves without a copy in user space.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, SockRef, Socket, Type};

pub use crate::sys::stream::{Interest, Poller, Readiness};
use crate::sys::{self, SysError};
pub use crate::udp::{attach_spread_steering, attach_steering, GroupError, GroupMember, Steering};

fn sys_err(call: &'static str, e: io::Error) -> SysError {
    SysError { call, source: e }
}

/// One listener of a group.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    /// Address every listener binds.
    pub addr: SocketAddr,
    /// Accept queue length asked for (the kernel caps it at `net.core.somaxconn`).
    pub backlog: i32,
    /// IPv6 listeners accept only IPv6.
    pub v6only: bool,
}

/// Opens, binds and listens one member of a `SO_REUSEPORT` group, non-blocking. Members must
/// be made in worker order: the order they start listening is the group's index.
pub fn listen_one(cfg: &ListenConfig) -> Result<TcpListener, GroupError> {
    let s = Socket::new(
        Domain::for_address(cfg.addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| GroupError::Sys(sys_err("socket", e)))?;
    s.set_reuse_port(true)
        .map_err(|e| GroupError::Sys(sys_err("setsockopt(SO_REUSEPORT)", e)))?;
    s.set_reuse_address(true)
        .map_err(|e| GroupError::Sys(sys_err("setsockopt(SO_REUSEADDR)", e)))?;
    if cfg.addr.is_ipv6() {
        s.set_only_v6(cfg.v6only)
            .map_err(|e| GroupError::Sys(sys_err("setsockopt(IPV6_V6ONLY)", e)))?;
    }
    s.set_nonblocking(true)
        .map_err(|e| GroupError::Sys(sys_err("fcntl(O_NONBLOCK)", e)))?;
    crate::udp::bind(&s, cfg.addr)?;
    s.listen(cfg.backlog).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => GroupError::AddrInUse(cfg.addr),
        _ => GroupError::Sys(sys_err("listen", e)),
    })?;
    Ok(TcpListener::from(s))
}

/// Starts a non-blocking connect to `remote`, from `local` if given. A local port of 0 is
/// chosen at connect time (`IP_BIND_ADDRESS_NO_PORT`, so one source address is not limited
/// to the ephemeral range once for every destination); a given port is bound as it is, with
/// `SO_REUSEADDR` so that a port whose earlier connection to another peer lingers in
/// TIME_WAIT can be bound again (the same 4-tuple still cannot: the connect then fails with
/// `AddrNotAvailable`, and the bind with `AddrInUse` while the port is busy otherwise). Nagle
/// is off. The connect completes when the socket becomes writable; [`connect_result`] then
/// says how it ended.
pub fn connect(local: Option<SocketAddr>, remote: SocketAddr) -> io::Result<TcpStream> {
    let s = Socket::new(
        Domain::for_address(remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.set_nonblocking(true)?;
    s.set_tcp_nodelay(true)?;
    match local {
        Some(a) if a.port() == 0 => {
            // An IPPROTO_IP option for IPv6 sockets too.
            sys::set_int(
                &s,
                libc::SOL_IP,
                libc::IP_BIND_ADDRESS_NO_PORT,
                1,
                "setsockopt(IP_BIND_ADDRESS_NO_PORT)",
            )
            .map_err(|e| e.source)?;
            s.bind(&a.into())?;
        }
        Some(a) => {
            s.set_reuse_address(true)?;
            s.bind(&a.into())?;
        }
        None => {}
    }
    match s.connect(&remote.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(TcpStream::from(s))
}

/// How a non-blocking connect ended, once its socket is writable: `Ok` if connected, else the
/// error (refused, unreachable, timed out).
pub fn connect_result(s: &TcpStream) -> io::Result<()> {
    match s.take_error()? {
        Some(e) => Err(e),
        None => s.peer_addr().map(drop),
    }
}

/// The CPU that processed this connection's last received packet (`SO_INCOMING_CPU`).
pub fn incoming_cpu(s: &impl AsRawFd) -> Option<usize> {
    sys::get_int(
        s,
        libc::SOL_SOCKET,
        libc::SO_INCOMING_CPU,
        "getsockopt(SO_INCOMING_CPU)",
    )
    .ok()
    .and_then(|c| usize::try_from(c).ok())
}

/// Sends `buf` with `MSG_MORE` (more follows at once, e.g. a body by `sendfile` after its
/// header: one segment, not two); returns the bytes taken. A peer that reset is an error
/// (`MSG_NOSIGNAL`), never a SIGPIPE.
pub fn send_more(s: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    SockRef::from(s).send_with_flags(buf, libc::MSG_MORE | libc::MSG_NOSIGNAL)
}

/// Up to `count` bytes of `file` from `*offset` into `s` by `sendfile(2)`, advancing
/// `*offset`; `WouldBlock` when the socket's buffer is full.
pub fn sendfile(s: &TcpStream, file: &File, offset: &mut i64, count: usize) -> io::Result<usize> {
    sys::stream::sendfile(s, file, offset, count)
}

/// Drops up to `max.len()` bytes waiting on `s` without copying them into user space (TCP's
/// `MSG_TRUNC`): how a load generator takes in a body it only counts. `max` is not written.
pub fn discard(s: &TcpStream, max: &mut [u8]) -> io::Result<usize> {
    sys::stream::recv_discard(s, max)
}

/// Turns on the kernel's receive timestamps on `s` (`SO_TIMESTAMPNS`), for [`read_stamped`].
pub fn set_rx_timestamps(s: &TcpStream) -> Result<(), SysError> {
    sys::stream::set_rx_timestamps(s)
}

/// A read into `buf` (or, with `discard`, a drop of up to `buf.len()` bytes as [`discard`]) that
/// also says when the kernel received the last segment it took: `CLOCK_REALTIME` ns, when
/// receive timestamps are on ([`set_rx_timestamps`]). How a client's latency can end where the
/// answer arrived rather than where the client got round to reading it.
pub fn read_stamped(
    s: &TcpStream,
    buf: &mut [u8],
    discard: bool,
) -> io::Result<(usize, Option<u64>)> {
    sys::stream::recv_stamped(s, buf, discard)
}

/// An in-memory file holding `contents` (`memfd_create`): the source `sendfile` reads large
/// responses from.
pub fn memfd_with(name: &CStr, contents: &[u8]) -> Result<File, SysError> {
    let mut f = sys::stream::memfd(name)?;
    f.write_all(contents)
        .map_err(|e| sys_err("write(memfd)", e))?;
    Ok(f)
}

/// Whether `e` says the file table is full (`EMFILE`, or the system's: `ENFILE`).
pub fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}
