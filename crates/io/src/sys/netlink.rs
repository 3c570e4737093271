//! rtnetlink without `ip`: attach an XDP program to an interface (`IFLA_XDP`, what `ip link set
//! xdpdrv` does, so it outlives the process), look up a neighbour's MAC (`RTM_GETNEIGH`, what
//! `ip neigh show` reads) and the interface a route leaves by (`RTM_GETROUTE`, `ip route get`).
//! And generic netlink's `netdev` family (Linux 6.3+): an interface's XDP features (what
//! `ynl --family netdev --do dev-get` prints), e.g. whether AF_XDP can run zero-copy there.
//!
//! Every call acts in the calling thread's network namespace: the socket it opens belongs
//! there. The message builders and parsers are plain functions over bytes, tested with byte
//! vectors and fuzzed (`parse_ack`); they never panic on what the kernel sends.

use std::io;
use std::mem::size_of;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{check, SysError};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub(super) const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
pub(super) const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CAPPED: u16 = 0x100;
const NLM_F_ACK_TLVS: u16 = 0x200;
/// For new objects: replace one that exists, create one that does not.
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_CREATE: u16 = 0x400;
/// `ndm_flags`: use the entry (resolve it as a packet to send would), change nothing else.
const NTF_USE: u8 = 0x01;
const RTM_SETLINK: u16 = 19;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
/// Multicast groups (as `nl_groups` bits): IPv4 and IPv6 route changes.
const RTMGRP_IPV4_ROUTE: u32 = 0x40;
const RTMGRP_IPV6_ROUTE: u32 = 0x400;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const IFLA_XDP: u16 = 43;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const IFLA_LINK: u16 = 5;
const IFLA_MTU: u16 = 4;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFINFOMSG_LEN: usize = 16;
pub(super) const NLA_F_NESTED: u16 = 0x8000;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_MULTIPATH: u16 = 9;
const RTA_TABLE: u16 = 15;
const RTA_VIA: u16 = 18;
/// `struct rtnexthop`: len, flags, hops, ifindex.
const RTNH_LEN: usize = 8;
/// `ndmsg` and `rtmsg` are 12 bytes; `ifinfomsg` 16.
const NDMSG_LEN: usize = 12;
const RTMSG_LEN: usize = 12;
/// Neighbour states that carry no usable address (`NUD_INCOMPLETE`, `NUD_FAILED`).
const NUD_UNUSABLE: u16 = 0x01 | 0x20;
/// Generic netlink's controller (`GENL_ID_CTRL`), its get-family command and attributes.
pub(super) const GENL_ID_CTRL: u16 = 0x10;
pub(super) const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub(super) const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// `struct genlmsghdr`: cmd, version, reserved.
pub(super) const GENL_HDRLEN: usize = 4;
/// The `netdev` family's dev-get command and attributes (`uapi/linux/netdev.h`).
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;
/// `XDP_FLAGS_DRV_MODE`: the driver's own (native) XDP hook.
pub const XDP_FLAGS_DRV_MODE: u32 = 4;

pub(super) fn push_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// A whole message: the header, then `body` (the family header and attributes).
pub(super) fn message(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
    msg.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&flags.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(body);
    msg
}

pub(super) fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(
        b.get(o..o.checked_add(2)?)?.try_into().ok()?,
    ))
}

pub(super) fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(
        b.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// The messages in one datagram from the kernel: (type, flags, seq, payload after the
/// header). A message whose length lies ends the list.
pub(super) fn messages(buf: &[u8]) -> Vec<(u16, u16, u32, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while let (Some(len), Some(kind), Some(flags), Some(seq)) = (
        u32_at(buf, at),
        u16_at(buf, at + 4),
        u16_at(buf, at + 6),
        u32_at(buf, at + 8),
    ) {
        let len = len as usize;
        let Some(payload) = (len >= NLMSG_HDRLEN)
            .then(|| buf.get(at + NLMSG_HDRLEN..at + len))
            .flatten()
        else {
            break;
        };
        out.push((kind, flags, seq, payload));
        at += len.next_multiple_of(4);
    }
    out
}

/// The attributes after a family header: (type without flags, payload).
pub(super) fn attributes(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while let (Some(len), Some(kind)) = (u16_at(buf, at), u16_at(buf, at + 2)) {
        let len = len as usize;
        let Some(payload) = (len >= 4).then(|| buf.get(at + 4..at + len)).flatten() else {
            break;
        };
        out.push((kind & !NLA_F_NESTED, payload));
        at += len.next_multiple_of(4);
    }
    out
}

/// The request `ip link set dev IF xdpdrv fd PROG` sends (`prog_fd` −1 detaches).
fn xdp_request(ifindex: u32, prog_fd: i32, flags: u32, seq: u32) -> Vec<u8> {
    let mut nested = Vec::new();
    push_attr(&mut nested, IFLA_XDP_FD, &prog_fd.to_ne_bytes());
    push_attr(&mut nested, IFLA_XDP_FLAGS, &flags.to_ne_bytes());
    let mut body = vec![0u8; 16]; // struct ifinfomsg: family AF_UNSPEC, index at offset 4
    body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    push_attr(&mut body, IFLA_XDP | NLA_F_NESTED, &nested);
    message(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, seq, &body)
}

/// The outcome in a netlink acknowledgement: `Ok` for error 0, else the errno with the
/// kernel's extended-ack message where it sent one. `None`: not an acknowledgement of `seq`
/// (or too short to be one). Never panics, whatever the bytes say their lengths are.
pub fn parse_ack(reply: &[u8], seq: u32) -> Option<Result<(), (i32, Option<String>)>> {
    let len = u32_at(reply, 0)? as usize;
    if u16_at(reply, 4)? != NLMSG_ERROR || u32_at(reply, 8)? != seq || len > reply.len() {
        return None;
    }
    let flags = u16_at(reply, 6)?;
    let errno = i32::from_ne_bytes(reply.get(16..20)?.try_into().ok()?);
    if errno == 0 {
        return Some(Ok(()));
    }
    let mut msg = None;
    if flags & NLM_F_ACK_TLVS != 0 {
        // struct nlmsgerr: the error, then the request's header (only the header if capped,
        // else the whole request), then the attributes.
        let echoed = if flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            u32_at(reply, 20)? as usize
        };
        let start = (20 + echoed).next_multiple_of(4);
        // Attributes that do not fit are passed over: the error itself still stands.
        for (kind, payload) in attributes(reply.get(start..len).unwrap_or_default()) {
            if kind == NLMSGERR_ATTR_MSG {
                let text = payload.split(|&b| b == 0).next().unwrap_or_default();
                msg = Some(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    // A kernel errno is small and negative; anything else (i32::MIN would overflow a plain
    // negation) is passed on as it reads.
    Some(Err((errno.checked_neg().unwrap_or(errno), msg)))
}

/// An rtnetlink socket in the calling thread's namespace.
#[derive(Debug)]
pub(super) struct Rtnl {
    sock: OwnedFd,
    call: &'static str,
}

impl Rtnl {
    fn open(call: &'static str) -> Result<Rtnl, SysError> {
        Rtnl::open_protocol(libc::NETLINK_ROUTE, call)
    }

    /// A netlink socket of another protocol (e.g. `NETLINK_GENERIC`).
    pub(super) fn open_protocol(
        protocol: libc::c_int,
        call: &'static str,
    ) -> Result<Rtnl, SysError> {
        // SAFETY: socket() takes integers; a non-negative return is a new descriptor we own.
        let fd = check(call, unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        })?;
        // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // The kernel's reason in words where it has one (e.g. the MTU is too large for XDP);
        // older kernels lack the option, which only costs the words.
        let _ = super::set_int(&sock, libc::SOL_NETLINK, NETLINK_EXT_ACK, 1, call);
        Ok(Rtnl { sock, call })
    }

    fn err(&self, source: io::Error) -> SysError {
        SysError {
            call: self.call,
            source,
        }
    }

    fn send(&self, req: &[u8]) -> Result<(), SysError> {
        // SAFETY: a zeroed sockaddr_nl addresses the kernel (pid 0, no groups).
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `req` and `kernel` are valid for the lengths passed and outlive the call.
        let sent = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                req.as_ptr().cast(),
                req.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(self.err(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// One datagram from the kernel into `buf`; its length.
    fn recv(&self, buf: &mut [u8]) -> Result<usize, SysError> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(self.err(io::Error::last_os_error()));
        }
        Ok(n as usize)
    }

    /// The error in a negative acknowledgement, with the kernel's words.
    fn nack(&self, errno: i32, msg: Option<String>) -> SysError {
        let os = io::Error::from_raw_os_error(errno);
        self.err(match msg {
            Some(m) => io::Error::new(os.kind(), format!("{os}: {m}")),
            None => os,
        })
    }

    /// Sends a request with NLM_F_ACK and waits for its acknowledgement.
    fn acked(&self, req: &[u8], seq: u32) -> Result<(), SysError> {
        self.send(req)?;
        let mut buf = vec![0u8; 8192];
        // At most a few messages: the acknowledgement of our one request comes first.
        for _ in 0..8 {
            let n = self.recv(&mut buf)?;
            match parse_ack(&buf[..n], seq) {
                Some(Ok(())) => return Ok(()),
                Some(Err((errno, msg))) => return Err(self.nack(errno, msg)),
                None => continue,
            }
        }
        Err(self.err(io::Error::new(
            io::ErrorKind::InvalidData,
            "no acknowledgement from the kernel",
        )))
    }

    /// Sends a request and collects the payloads of the replies of type `kind` until the
    /// dump is done (or, for a single answer, the first one). At most `limit` messages.
    pub(super) fn collect(
        &self,
        req: &[u8],
        seq: u32,
        kind: u16,
        dump: bool,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, SysError> {
        self.send(req)?;
        let mut buf = vec![0u8; 32 * 1024];
        let mut out = Vec::new();
        while out.len() < limit {
            let n = self.recv(&mut buf)?;
            for (t, _, s, payload) in messages(&buf[..n]) {
                if s != seq {
                    continue;
                }
                match t {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        return match parse_ack(&buf[..n], seq) {
                            Some(Err((errno, msg))) => Err(self.nack(errno, msg)),
                            _ => Ok(out),
                        }
                    }
                    t if t == kind => {
                        out.push(payload.to_vec());
                        if !dump {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(out)
    }
}

/// Attaches XDP program `prog` to interface `ifindex` through rtnetlink (`IFLA_XDP`), as `ip
/// link set dev IF xdpdrv fd PROG` does: the interface holds the program, so it stays attached
/// when the process ends and goes with the interface (or its namespace). `flags`:
/// [`XDP_FLAGS_DRV_MODE`] for native XDP; a program already attached is replaced.
pub fn attach_xdp_to_link(prog: &OwnedFd, ifindex: u32, flags: u32) -> Result<(), SysError> {
    let nl = Rtnl::open("netlink RTM_SETLINK IFLA_XDP")?;
    let seq = 1;
    nl.acked(&xdp_request(ifindex, prog.as_raw_fd(), flags, seq), seq)
}

fn family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// The MAC of neighbour `ip` on interface `ifindex`, from one `RTM_NEWNEIGH` payload (`None`:
/// another neighbour, or an entry without a usable address).
fn neighbour_of(payload: &[u8], ifindex: u32, ip: IpAddr) -> Option<[u8; 6]> {
    let n = neighbour_entry(payload)?;
    (n.ifindex == ifindex && n.ip == ip)
        .then_some(n.mac)
        .flatten()
}

/// The MAC address of neighbour `ip` on interface `ifindex` (`ip neigh show to IP dev IF`), or
/// `None` when the table has no usable entry for it.
pub fn neighbour_mac(ifindex: u32, ip: IpAddr) -> Result<Option<[u8; 6]>, SysError> {
    let nl = Rtnl::open("netlink RTM_GETNEIGH")?;
    let seq = 1;
    let mut body = vec![0u8; NDMSG_LEN];
    body[0] = family(ip);
    body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    let req = message(RTM_GETNEIGH, NLM_F_REQUEST | NLM_F_DUMP, seq, &body);
    let entries = nl.collect(&req, seq, RTM_NEWNEIGH, true, 1 << 20)?;
    Ok(entries.iter().find_map(|e| neighbour_of(e, ifindex, ip)))
}

/// The request that asks the kernel to resolve neighbour `ip` on interface `ifindex`:
/// `RTM_NEWNEIGH` with `NTF_USE` (the entry made, with no state, where there is none).
fn resolve_request(ifindex: u32, ip: IpAddr, seq: u32) -> Vec<u8> {
    let mut body = vec![0u8; NDMSG_LEN];
    body[0] = family(ip);
    body[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    body[10] = NTF_USE;
    push_attr(&mut body, NDA_DST, &ip_bytes(ip));
    let flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
    message(RTM_NEWNEIGH, flags, seq, &body)
}

/// Asks the kernel to resolve neighbour `ip` on interface `ifindex` (ARP, or IPv6 neighbour
/// solicitation) as it does when it has a packet for it: a router that forwards past the
/// kernel learns its next hops' MACs from the neighbour table ([`neighbours`]), and without
/// traffic of the kernel's own to a gateway nothing else would put it there.
pub fn resolve_neighbour(ifindex: u32, ip: IpAddr) -> Result<(), SysError> {
    let nl = Rtnl::open("netlink RTM_NEWNEIGH (NTF_USE)")?;
    nl.acked(&resolve_request(ifindex, ip, 1), 1)
}

/// The request `ip route get IP` sends.
fn route_request(ip: IpAddr, seq: u32) -> Vec<u8> {
    let bytes = ip_bytes(ip);
    let mut body = vec![0u8; RTMSG_LEN];
    body[0] = family(ip);
    body[1] = (bytes.len() * 8) as u8; // rtm_dst_len: a host route
    push_attr(&mut body, RTA_DST, &bytes);
    message(RTM_GETROUTE, NLM_F_REQUEST, seq, &body)
}

/// The interface index a route to `ip` leaves by (`ip route get IP`), or `None` when the
/// answer names none.
pub fn route_oif(ip: IpAddr) -> Result<Option<u32>, SysError> {
    Ok(route_get(ip)?.and_then(|r| r.oif))
}

/// What kind of route a dump entry is (`rtm_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// A route with a next hop (a gateway, or the link itself).
    Unicast,
    /// Dropped silently (`blackhole`).
    Blackhole,
    /// Refused: `unreachable` or `prohibit`.
    Unreachable,
    /// Anything else (local, broadcast, multicast, throw, nat): not a forwarding route.
    Other(u8),
}

/// One route of the kernel's tables, as `ip route show` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRoute {
    /// The prefix's address (the unspecified address for a default route).
    pub dst: IpAddr,
    /// The prefix length.
    pub len: u8,
    /// Which kind of route.
    pub kind: RouteKind,
    /// The routing table (254 is `main`, 255 `local`).
    pub table: u32,
    /// The gateway, for a route `via` one (`None`: directly connected).
    pub gateway: Option<IpAddr>,
    /// The interface it leaves by.
    pub oif: Option<u32>,
    /// Next hops of a multipath (ECMP) route; the first is in `gateway` and `oif`.
    pub paths: u32,
}

fn ip_from(family: u8, b: &[u8]) -> Option<IpAddr> {
    match (family as i32, b.len()) {
        (libc::AF_INET, 4) => Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?)),
        (libc::AF_INET6, 16) => Some(IpAddr::from(<[u8; 16]>::try_from(b).ok()?)),
        _ => None,
    }
}

/// `RTA_VIA`: a family, then the address (an IPv4 route through an IPv6 gateway).
fn via_of(b: &[u8]) -> Option<IpAddr> {
    ip_from(u16_at(b, 0)? as u8, b.get(2..)?)
}

/// The route in one `RTM_NEWROUTE` payload (`None`: cut short or of another family).
pub fn route_of(payload: &[u8]) -> Option<KernelRoute> {
    let fam = *payload.first()?;
    let len = *payload.get(1)?;
    let kind = match *payload.get(7)? {
        1 => RouteKind::Unicast,
        6 => RouteKind::Blackhole,
        7 | 8 => RouteKind::Unreachable,
        k => RouteKind::Other(k),
    };
    let unspecified = ip_from(
        fam,
        &[0u8; 16][..if fam as i32 == libc::AF_INET { 4 } else { 16 }],
    )?;
    let mut r = KernelRoute {
        dst: unspecified,
        len,
        kind,
        table: u32::from(*payload.get(4)?),
        gateway: None,
        oif: None,
        paths: 1,
    };
    if u32::from(len) > if r.dst.is_ipv4() { 32 } else { 128 } {
        return None;
    }
    for (kind, a) in attributes(payload.get(RTMSG_LEN..)?) {
        match kind {
            RTA_DST => r.dst = ip_from(fam, a)?,
            RTA_OIF => r.oif = u32_at(a, 0),
            RTA_GATEWAY => r.gateway = ip_from(fam, a),
            RTA_VIA => r.gateway = via_of(a),
            RTA_TABLE => r.table = u32_at(a, 0)?,
            RTA_MULTIPATH => {
                // struct rtnexthop, its attributes, the next one; the first path is used.
                let mut at = 0;
                r.paths = 0;
                while let Some(l) = u16_at(a, at) {
                    let l = l as usize;
                    if l < RTNH_LEN || at + l > a.len() {
                        break;
                    }
                    if r.paths == 0 {
                        r.oif = u32_at(a, at + 4);
                        for (k, v) in attributes(&a[at + RTNH_LEN..at + l]) {
                            match k {
                                RTA_GATEWAY => r.gateway = ip_from(fam, v),
                                RTA_VIA => r.gateway = via_of(v),
                                _ => {}
                            }
                        }
                    }
                    r.paths += 1;
                    at += l.next_multiple_of(4);
                }
            }
            _ => {}
        }
    }
    Some(r)
}

/// Every route of the kernel's tables in both families (`ip route show table all` and `ip -6
/// …`), in the calling thread's namespace. Filter on [`KernelRoute::table`].
pub fn routes() -> Result<Vec<KernelRoute>, SysError> {
    let nl = Rtnl::open("netlink RTM_GETROUTE dump")?;
    let mut out = Vec::new();
    for (seq, fam) in [(1, libc::AF_INET), (2, libc::AF_INET6)] {
        let mut body = vec![0u8; RTMSG_LEN];
        body[0] = fam as u8;
        let req = message(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, seq, &body);
        for p in nl.collect(&req, seq, RTM_NEWROUTE, true, usize::MAX)? {
            out.extend(route_of(&p));
        }
    }
    Ok(out)
}

/// A change to the kernel's routes, as a [`RouteMonitor`] hears it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteChange {
    /// Added or replaced.
    Added(KernelRoute),
    /// Removed.
    Removed(KernelRoute),
    /// Changes were lost (the socket's buffer overflowed): read the whole table again.
    Overrun,
}

/// The route changes in one datagram of the route groups.
pub fn route_changes(buf: &[u8]) -> Vec<RouteChange> {
    messages(buf)
        .into_iter()
        .filter_map(|(t, _, _, p)| match t {
            RTM_NEWROUTE => route_of(p).map(RouteChange::Added),
            RTM_DELROUTE => route_of(p).map(RouteChange::Removed),
            _ => None,
        })
        .collect()
}

/// Listens to the kernel's route changes (both families), as `ip monitor route` does, in the
/// calling thread's namespace. Never blocks: [`RouteMonitor::drain`] takes what has come.
#[derive(Debug)]
pub struct RouteMonitor {
    nl: Rtnl,
    buf: Vec<u8>,
}

impl RouteMonitor {
    /// Joins the IPv4 and IPv6 route groups.
    pub fn open() -> Result<RouteMonitor, SysError> {
        let nl = Rtnl::open("netlink route monitor")?;
        // SAFETY: a zeroed sockaddr_nl with the family and groups set is a valid address.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE;
        // SAFETY: `addr` is valid for its size for the call's duration.
        let r = unsafe {
            libc::bind(
                nl.sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        check("bind(netlink route groups)", r)?;
        // A burst of changes (a table loaded at once) fits; past that, Overrun says so.
        let _ = super::set_int(
            &nl.sock,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            8 << 20,
            "SO_RCVBUF",
        );
        Ok(RouteMonitor {
            nl,
            buf: vec![0u8; 64 * 1024],
        })
    }

    /// Every change that has come since the last call (at most `limit` datagrams' worth).
    pub fn drain(&mut self, limit: usize) -> Result<Vec<RouteChange>, SysError> {
        let mut out = Vec::new();
        for _ in 0..limit {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe {
                libc::recv(
                    self.nl.sock.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    Some(libc::ENOBUFS) => out.push(RouteChange::Overrun),
                    Some(libc::EINTR) => {}
                    _ => return Err(self.nl.err(e)),
                }
                continue;
            }
            out.extend(route_changes(&self.buf[..n as usize]));
        }
        Ok(out)
    }
}

/// One entry of the kernel's neighbour table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    /// The interface.
    pub ifindex: u32,
    /// The neighbour's address.
    pub ip: IpAddr,
    /// Its link-layer address (`None`: incomplete or failed).
    pub mac: Option<[u8; 6]>,
}

/// The neighbour in one `RTM_NEWNEIGH` payload.
pub fn neighbour_entry(payload: &[u8]) -> Option<Neighbour> {
    let fam = *payload.first()?;
    let ifindex = u32_at(payload, 4)?;
    let state = u16_at(payload, 8)?;
    let attrs = attributes(payload.get(NDMSG_LEN..)?);
    let ip = ip_from(fam, attrs.iter().find(|a| a.0 == NDA_DST)?.1)?;
    let mac = attrs
        .iter()
        .find(|a| a.0 == NDA_LLADDR)
        .and_then(|a| <[u8; 6]>::try_from(a.1).ok())
        .filter(|_| state & NUD_UNUSABLE == 0);
    Some(Neighbour { ifindex, ip, mac })
}

/// The whole neighbour table, both families (`ip neigh show`).
pub fn neighbours() -> Result<Vec<Neighbour>, SysError> {
    let nl = Rtnl::open("netlink RTM_GETNEIGH dump")?;
    let req = message(
        RTM_GETNEIGH,
        NLM_F_REQUEST | NLM_F_DUMP,
        1,
        &[0u8; NDMSG_LEN],
    );
    Ok(nl
        .collect(&req, 1, RTM_NEWNEIGH, true, usize::MAX)?
        .iter()
        .filter_map(|p| neighbour_entry(p))
        .collect())
}

/// What the kernel would do with a packet to `ip` (`ip route get IP`): the route's kind, the
/// interface and the gateway. `None` when it answers nothing.
pub fn route_get(ip: IpAddr) -> Result<Option<KernelRoute>, SysError> {
    let nl = Rtnl::open("netlink RTM_GETROUTE")?;
    let seq = 1;
    let routes = nl.collect(&route_request(ip, seq), seq, RTM_NEWROUTE, false, 1)?;
    Ok(routes.first().and_then(|r| route_of(r)))
}

/// A generic netlink request: the header, `genlmsghdr` {cmd, version 1}, then `attrs`.
pub(super) fn genl_request(family: u16, cmd: u8, seq: u32, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut body = vec![cmd, 1, 0, 0];
    for (kind, payload) in attrs {
        push_attr(&mut body, *kind, payload);
    }
    message(family, NLM_F_REQUEST, seq, &body)
}

/// The attribute `kind` of a generic netlink reply's payload (after `genlmsghdr`).
pub(super) fn genl_attr(payload: &[u8], kind: u16) -> Option<&[u8]> {
    attributes(payload.get(GENL_HDRLEN..)?)
        .into_iter()
        .find(|a| a.0 == kind)
        .map(|a| a.1)
}

/// The family id in a `CTRL_CMD_NEWFAMILY` reply.
pub(super) fn family_id_of(payload: &[u8]) -> Option<u16> {
    genl_attr(payload, CTRL_ATTR_FAMILY_ID).and_then(|a| u16_at(a, 0))
}

/// The id of generic netlink family `name` (NUL-terminated), asked on `nl` with sequence 1;
/// `None` where the kernel has no such family (`ENOENT`).
pub(super) fn genl_family(nl: &Rtnl, name: &[u8]) -> Result<Option<u16>, SysError> {
    let req = genl_request(
        GENL_ID_CTRL,
        CTRL_CMD_GETFAMILY,
        1,
        &[(CTRL_ATTR_FAMILY_NAME, name)],
    );
    match nl.collect(&req, 1, GENL_ID_CTRL, false, 1) {
        Ok(r) => Ok(r.first().and_then(|p| family_id_of(p))),
        Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The XDP feature bits (`NETDEV_XDP_ACT_*`) in a netdev dev-get reply.
pub fn xdp_features_of(payload: &[u8]) -> Option<u64> {
    genl_attr(payload, NETDEV_A_DEV_XDP_FEATURES)
        .and_then(|a| Some(u64::from_ne_bytes(a.get(..8)?.try_into().ok()?)))
}

/// Interface `ifindex`'s XDP features (`NETDEV_XDP_ACT_*` bits), from generic netlink's
/// `netdev` family; `None` where the kernel has no such family (before Linux 6.3).
pub fn xdp_features(ifindex: u32) -> Result<Option<u64>, SysError> {
    let nl = Rtnl::open_protocol(libc::NETLINK_GENERIC, "netlink genl netdev dev-get")?;
    let Some(family) = genl_family(&nl, b"netdev\0")? else {
        return Ok(None);
    };
    let idx = ifindex.to_ne_bytes();
    let req = genl_request(
        family,
        NETDEV_CMD_DEV_GET,
        2,
        &[(NETDEV_A_DEV_IFINDEX, &idx)],
    );
    let r = nl.collect(&req, 2, family, false, 1)?;
    Ok(r.first().and_then(|p| xdp_features_of(p)))
}

/// What `ip -d link show` says of an interface that matters to a forwarder: its kind, the
/// link it is paired with, and whether an XDP program is attached.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LinkFacts {
    /// `IFLA_INFO_KIND` (`veth`, `bridge`, …); `None` for a physical device.
    pub kind: Option<String>,
    /// `IFLA_LINK`: for veth, the peer's index (in the peer's namespace when `link_netnsid`
    /// is set).
    pub link: Option<u32>,
    /// `IFLA_LINK_NETNSID`: the peer lives in another namespace (this one's id for it).
    pub link_netnsid: Option<i32>,
    /// `IFLA_XDP_ATTACHED`: 0 none, 1 driver, 2 generic (skb), 3 offloaded, 4 several.
    pub xdp_attached: u8,
    /// `IFLA_MTU` (read in the caller's namespace, unlike sysfs from a thread that entered
    /// another one).
    pub mtu: Option<u32>,
}

/// The facts in one `RTM_NEWLINK` payload (`None`: cut short).
pub fn link_facts_of(payload: &[u8]) -> Option<LinkFacts> {
    let mut f = LinkFacts::default();
    for (kind, a) in attributes(payload.get(IFINFOMSG_LEN..)?) {
        match kind {
            IFLA_LINK => f.link = u32_at(a, 0),
            IFLA_MTU => f.mtu = u32_at(a, 0),
            IFLA_LINK_NETNSID => f.link_netnsid = u32_at(a, 0).map(|v| v as i32),
            IFLA_XDP => {
                for (k, v) in attributes(a) {
                    if k == IFLA_XDP_ATTACHED {
                        f.xdp_attached = v.first().copied().unwrap_or(0);
                    }
                }
            }
            IFLA_LINKINFO => {
                for (k, v) in attributes(a) {
                    if k == IFLA_INFO_KIND {
                        let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
                        f.kind = Some(String::from_utf8_lossy(&v[..end]).into_owned());
                    }
                }
            }
            _ => {}
        }
    }
    Some(f)
}

/// Interface `ifindex`'s [`LinkFacts`] (`RTM_GETLINK`, as `ip -d link show` asks).
pub fn link_facts(ifindex: u32) -> Result<Option<LinkFacts>, SysError> {
    let nl = Rtnl::open("netlink RTM_GETLINK")?;
    let mut body = vec![0u8; IFINFOMSG_LEN];
    body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    let req = message(RTM_GETLINK, NLM_F_REQUEST, 1, &body);
    let r = nl.collect(&req, 1, RTM_NEWLINK, false, 1)?;
    Ok(r.first().and_then(|p| link_facts_of(p)))
}

/// The name of interface `ifindex` (`if_indextoname`).
pub fn ifname(ifindex: u32) -> Result<String, SysError> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: `buf` holds IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(SysError {
            call: "if_indextoname",
            source: io::Error::last_os_error(),
        });
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16v(m: &[u8], o: usize) -> u16 {
        u16_at(m, o).expect("2 bytes")
    }

    fn u32v(m: &[u8], o: usize) -> u32 {
        u32_at(m, o).expect("4 bytes")
    }

    #[test]
    fn the_xdp_request_is_the_one_ip_sends() {
        // `ip link set dev 7 xdpdrv fd 9` (strace): header, ifinfomsg, IFLA_XDP{FD, FLAGS}.
        let m = xdp_request(7, 9, XDP_FLAGS_DRV_MODE, 1);
        assert_eq!(m.len(), 16 + 16 + 4 + 8 + 8);
        assert_eq!(u32v(&m, 0), 52);
        assert_eq!(u16v(&m, 4), RTM_SETLINK);
        assert_eq!(u32v(&m, 20), 7);
        assert_eq!(u16v(&m, 32), 20);
        assert_eq!(u16v(&m, 34), IFLA_XDP | NLA_F_NESTED);
        assert_eq!(u32v(&m, 40), 9);
        assert_eq!(u32v(&m, 48), 4);
    }

    #[test]
    fn an_ack_with_a_reason_says_it() {
        let msg = b"veth: Peer MTU is too large to set XDP\0";
        let mut body = (-libc::ERANGE).to_ne_bytes().to_vec();
        body.extend_from_slice(&[0; 16]);
        push_attr(&mut body, NLMSGERR_ATTR_MSG, msg);
        let r = message(NLMSG_ERROR, NLM_F_CAPPED | NLM_F_ACK_TLVS, 5, &body);
        assert_eq!(
            parse_ack(&r, 5),
            Some(Err((
                libc::ERANGE,
                Some("veth: Peer MTU is too large to set XDP".into())
            )))
        );
        assert_eq!(parse_ack(&r, 6), None, "another request's answer");
        assert_eq!(parse_ack(&r[..10], 5), None, "a short message");
        let ok = message(NLMSG_ERROR, 0, 5, &[0; 20]);
        assert_eq!(parse_ack(&ok, 5), Some(Ok(())));
    }

    #[test]
    fn an_errno_of_i32_min_is_no_overflow() {
        // Found by the fuzz target: error field 0x80000000.
        let r = [
            8, 0, 0, 0, 2, 0, 39, 255, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 128, 1, 0, 0, 0,
        ];
        assert_eq!(parse_ack(&r, 1), Some(Err((i32::MIN, None))));
    }

    /// An RTM_NEWNEIGH payload as the kernel sends it for `ip neigh`.
    fn neigh(ifindex: u32, state: u16, ip: &[u8], mac: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; NDMSG_LEN];
        p[0] = if ip.len() == 4 {
            libc::AF_INET
        } else {
            libc::AF_INET6
        } as u8;
        p[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        p[8..10].copy_from_slice(&state.to_ne_bytes());
        push_attr(&mut p, NDA_DST, ip);
        push_attr(&mut p, NDA_LLADDR, mac);
        p
    }

    #[test]
    fn a_neighbour_entry_gives_its_mac_only_for_its_address_and_interface() {
        let ip: IpAddr = "198.18.0.2".parse().expect("ip");
        let mac = [2, 0xf1, 0x0e, 0, 0, 2];
        let e = neigh(3, 0x80, &[198, 18, 0, 2], &mac); // NUD_PERMANENT
        assert_eq!(neighbour_of(&e, 3, ip), Some(mac));
        assert_eq!(neighbour_of(&e, 4, ip), None, "another interface");
        assert_eq!(
            neighbour_of(&e, 3, "198.18.0.3".parse().expect("ip")),
            None,
            "another address"
        );
        let failed = neigh(3, 0x20, &[198, 18, 0, 2], &mac);
        assert_eq!(neighbour_of(&failed, 3, ip), None, "NUD_FAILED");
        assert_eq!(neighbour_of(&e[..14], 3, ip), None, "cut short");
    }

    #[test]
    fn dumps_split_into_messages_and_lying_lengths_end_them() {
        let a = message(RTM_NEWNEIGH, 2, 1, &[1, 2, 3, 4]);
        let b = message(NLMSG_DONE, 2, 1, &[0; 4]);
        let mut both = a.clone();
        both.extend_from_slice(&b);
        let m = messages(&both);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].0, m[0].3), (RTM_NEWNEIGH, &[1u8, 2, 3, 4][..]));
        assert_eq!(m[1].0, NLMSG_DONE);
        let mut lying = a;
        lying[0] = 200;
        assert!(messages(&lying).is_empty());
    }

    #[test]
    fn the_route_request_asks_for_a_host_route() {
        let m = route_request("2001:2::2".parse().expect("ip"), 1);
        assert_eq!(u16v(&m, 4), RTM_GETROUTE);
        assert_eq!(m[16], libc::AF_INET6 as u8);
        assert_eq!(m[17], 128);
        assert_eq!(u16v(&m, 28), 20, "RTA_DST with 16 bytes");
    }

    /// An RTM_NEWROUTE payload: rtmsg, then attributes.
    fn route(fam: i32, len: u8, kind: u8, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut p = vec![fam as u8, len, 0, 0, 254, 3, 0, kind, 0, 0, 0, 0];
        for (k, v) in attrs {
            push_attr(&mut p, *k, v);
        }
        p
    }

    #[test]
    fn a_route_entry_gives_prefix_gateway_and_interface() {
        let p = route(
            libc::AF_INET,
            15,
            1,
            &[
                (RTA_TABLE, 254u32.to_ne_bytes().to_vec()),
                (RTA_DST, vec![198, 18, 0, 0]),
                (RTA_GATEWAY, vec![198, 18, 0, 2]),
                (RTA_OIF, 7u32.to_ne_bytes().to_vec()),
            ],
        );
        let r = route_of(&p).expect("a route");
        assert_eq!(r.dst, "198.18.0.0".parse::<IpAddr>().expect("ip"));
        assert_eq!(
            (r.len, r.kind, r.table, r.oif),
            (15, RouteKind::Unicast, 254, Some(7))
        );
        assert_eq!(r.gateway, Some("198.18.0.2".parse().expect("ip")));
        // A default route has no RTA_DST; a blackhole no gateway.
        let d = route_of(&route(libc::AF_INET6, 0, 6, &[])).expect("a route");
        assert_eq!(
            (d.dst, d.len, d.kind),
            ("::".parse().expect("ip"), 0, RouteKind::Blackhole)
        );
        // A multipath route: two rtnexthops, the first one's gateway and interface.
        let mut mp = Vec::new();
        for (oif, gw) in [(4u32, [198, 18, 1, 1]), (5, [198, 18, 2, 1])] {
            let mut hop = vec![0u8; RTNH_LEN];
            hop[4..8].copy_from_slice(&oif.to_ne_bytes());
            push_attr(&mut hop, RTA_GATEWAY, &gw);
            let l = hop.len() as u16;
            hop[0..2].copy_from_slice(&l.to_ne_bytes());
            mp.extend_from_slice(&hop);
        }
        let m = route_of(&route(libc::AF_INET, 24, 1, &[(RTA_MULTIPATH, mp)])).expect("a route");
        assert_eq!((m.paths, m.oif), (2, Some(4)));
        assert_eq!(m.gateway, Some("198.18.1.1".parse().expect("ip")));
        // Lengths past the family, cut anywhere: absent or whole, never a panic.
        assert_eq!(route_of(&route(libc::AF_INET, 33, 1, &[])), None);
        for cut in 0..p.len() {
            let _ = route_of(&p[..cut]);
        }
    }

    /// Against the kernel itself: the dumps hold loopback's routes and `ip route get` agrees.
    #[test]
    fn the_kernel_dumps_its_tables() {
        let all = routes().expect("RTM_GETROUTE dump");
        assert!(
            all.iter().any(|r| r.table == 255
                && r.dst == "127.0.0.0".parse::<IpAddr>().expect("ip")
                && r.len == 8),
            "the local table holds 127.0.0.0/8: {all:?}"
        );
        neighbours().expect("RTM_GETNEIGH dump");
    }

    /// Against the kernel itself: loopback routes leave by `lo`, whose index is 1.
    #[test]
    fn the_kernel_routes_loopback_by_lo() {
        let oif = route_oif("127.0.0.1".parse().expect("ip")).expect("RTM_GETROUTE");
        let oif = oif.expect("an output interface");
        assert_eq!(ifname(oif).expect("its name"), "lo");
    }
}

#[cfg(test)]
mod genl_tests {
    use super::*;

    #[test]
    fn genl_replies_parse_and_lie_safely() {
        // A netdev reply: genlmsghdr, IFINDEX 7, XDP_FEATURES 0b1011.
        let mut p = vec![NETDEV_CMD_DEV_GET, 1, 0, 0];
        push_attr(&mut p, NETDEV_A_DEV_IFINDEX, &7u32.to_ne_bytes());
        push_attr(&mut p, NETDEV_A_DEV_XDP_FEATURES, &0b1011u64.to_ne_bytes());
        assert_eq!(xdp_features_of(&p), Some(0b1011));
        // Cut anywhere, it is absent or whole, never a panic.
        for cut in 0..p.len() {
            let r = xdp_features_of(&p[..cut]);
            assert!(r.is_none() || r == Some(0b1011));
        }
        let mut c = vec![CTRL_CMD_GETFAMILY, 1, 0, 0];
        push_attr(&mut c, CTRL_ATTR_FAMILY_NAME, b"netdev\0");
        push_attr(&mut c, CTRL_ATTR_FAMILY_ID, &0x22u16.to_ne_bytes());
        assert_eq!(family_id_of(&c), Some(0x22));
        assert_eq!(family_id_of(&c[..3]), None);
    }

    #[test]
    fn the_kernel_answers_for_loopback() {
        // Linux 6.3+ has the netdev family; before it the answer is None, not an error.
        let f = xdp_features(1).expect("genl netdev dev-get on lo");
        if let Some(bits) = f {
            assert_eq!(bits & !0x7f, 0, "only NETDEV_XDP_ACT_* bits: {bits:#x}");
        }
        assert!(xdp_features(u32::MAX).is_err(), "no such interface");
    }
}
