//! Interface settings without external programs: offloads through the `SIOCETHTOOL` ioctl (what
//! `ethtool -K` does), an XDP program attached through rtnetlink's `IFLA_XDP` (what `ip link set
//! xdpdrv` does, so it stays attached after the process ends), and a thread-private view of a
//! namespace's sysfs (what `ip netns exec` mounts) for the per-queue files XPS and RPS live in.
//!
//! Every call acts in the calling thread's network namespace: the socket it opens belongs there.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{check, SysError};

/// An offload `ethtool -K` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    /// Generic receive offload (`gro`): with it on, veth runs NAPI per receive queue.
    Gro,
    /// Transmit checksum offload (`tx`): off, the sender computes every checksum itself.
    TxChecksum,
}

impl Offload {
    /// (get, set) commands of the legacy ethtool interface, which the kernel maps onto its
    /// feature bits (`ethtool_get_feature_mask`) — the same bits `ethtool -K` changes.
    fn commands(self) -> (u32, u32) {
        match self {
            Offload::Gro => (0x2b, 0x2c),        // ETHTOOL_GGRO, ETHTOOL_SGRO
            Offload::TxChecksum => (0x16, 0x17), // ETHTOOL_GTXCSUM, ETHTOOL_STXCSUM
        }
    }
}

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` as SIOCETHTOOL reads it: the name, then a pointer to the command (40 bytes).
#[repr(C)]
struct IfreqData {
    name: [u8; libc::IFNAMSIZ],
    data: *mut EthtoolValue,
    _pad: [u8; 16],
}

fn ifname_bytes(ifname: &str, call: &'static str) -> Result<[u8; libc::IFNAMSIZ], SysError> {
    let mut name = [0u8; libc::IFNAMSIZ];
    if ifname.is_empty() || ifname.len() >= libc::IFNAMSIZ || ifname.contains('\0') {
        return Err(SysError {
            call,
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{ifname}` is not an interface name (1-15 bytes)"),
            ),
        });
    }
    name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    Ok(name)
}

fn dgram_socket(call: &'static str) -> Result<OwnedFd, SysError> {
    // SAFETY: socket() takes integers; a non-negative return is a new descriptor we own.
    let fd = check(call, unsafe {
        libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ethtool(ifname: &str, cmd: u32, data: u32, call: &'static str) -> Result<u32, SysError> {
    let sock = dgram_socket(call)?;
    let mut value = EthtoolValue { cmd, data };
    let mut req = IfreqData {
        name: ifname_bytes(ifname, call)?,
        data: &mut value,
        _pad: [0; 16],
    };
    // SAFETY: `req` is a valid ifreq whose data pointer points at `value`, which outlives the
    // call; SIOCETHTOOL reads the command there and writes at most the same 8 bytes back.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    check(call, ret)?;
    Ok(value.data)
}

/// Turns an offload on or off on `ifname` (`ethtool -K IF gro on`, `tx off`).
pub fn set_offload(ifname: &str, offload: Offload, on: bool) -> Result<(), SysError> {
    let (_, set) = offload.commands();
    ethtool(
        ifname,
        set,
        u32::from(on),
        "ioctl(SIOCETHTOOL, set offload)",
    )
    .map(drop)
}

/// Whether an offload is on (`ethtool -k IF`).
pub fn offload(ifname: &str, offload: Offload) -> Result<bool, SysError> {
    let (get, _) = offload.commands();
    ethtool(ifname, get, 0, "ioctl(SIOCETHTOOL, get offload)").map(|v| v != 0)
}

// rtnetlink: just enough for one RTM_SETLINK request with an acknowledgement.
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_CAPPED: u16 = 0x100;
const NLM_F_ACK_TLVS: u16 = 0x200;
const RTM_SETLINK: u16 = 19;
const IFLA_XDP: u16 = 43;
const NLA_F_NESTED: u16 = 0x8000;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
const NLMSGERR_ATTR_MSG: u16 = 1;
const NETLINK_EXT_ACK: libc::c_int = 11;
/// `XDP_FLAGS_DRV_MODE`: the driver's own (native) XDP hook.
pub const XDP_FLAGS_DRV_MODE: u32 = 4;

fn push_attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// The request `ip link set dev IF xdpdrv fd PROG` sends (`prog_fd` −1 detaches).
fn xdp_request(ifindex: u32, prog_fd: i32, flags: u32, seq: u32) -> Vec<u8> {
    let mut nested = Vec::new();
    push_attr(&mut nested, IFLA_XDP_FD, &prog_fd.to_ne_bytes());
    push_attr(&mut nested, IFLA_XDP_FLAGS, &flags.to_ne_bytes());
    let mut body = vec![0u8; 16]; // struct ifinfomsg: family AF_UNSPEC, index at offset 4
    body[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
    push_attr(&mut body, IFLA_XDP | NLA_F_NESTED, &nested);
    let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
    msg.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&RTM_SETLINK.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// The outcome in a netlink acknowledgement: `Ok` for error 0, else the errno with the
/// kernel's extended-ack message where it sent one. `None`: not an acknowledgement of `seq`
/// (or too short to be one). Never panics, whatever the bytes say their lengths are.
pub fn parse_ack(reply: &[u8], seq: u32) -> Option<Result<(), (i32, Option<String>)>> {
    let u16_at = |o: usize| Some(u16::from_ne_bytes(reply.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_ne_bytes(reply.get(o..o + 4)?.try_into().ok()?));
    let len = u32_at(0)? as usize;
    if u16_at(4)? != NLMSG_ERROR || u32_at(8)? != seq || len > reply.len() {
        return None;
    }
    let flags = u16_at(6)?;
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
            u32_at(20)? as usize
        };
        let mut at = (20 + echoed).next_multiple_of(4);
        while at + 4 <= len {
            let alen = u16_at(at)? as usize;
            if alen < 4 {
                break;
            }
            if u16_at(at + 2)? & !NLA_F_NESTED == NLMSGERR_ATTR_MSG {
                let text = reply.get(at + 4..(at + alen).min(len))?;
                let text = text.split(|&b| b == 0).next().unwrap_or_default();
                msg = Some(String::from_utf8_lossy(text).into_owned());
            }
            at += alen.next_multiple_of(4);
        }
    }
    // A kernel errno is small and negative; anything else (i32::MIN would overflow a plain
    // negation) is passed on as it reads.
    Some(Err((errno.checked_neg().unwrap_or(errno), msg)))
}

/// Attaches XDP program `prog` to interface `ifindex` through rtnetlink (`IFLA_XDP`), as `ip
/// link set dev IF xdpdrv fd PROG` does: the interface holds the program, so it stays attached
/// when the process ends and goes with the interface (or its namespace). `flags`:
/// [`XDP_FLAGS_DRV_MODE`] for native XDP; a program already attached is replaced.
pub fn attach_xdp_to_link(prog: &OwnedFd, ifindex: u32, flags: u32) -> Result<(), SysError> {
    const CALL: &str = "netlink RTM_SETLINK IFLA_XDP";
    let err = |source: io::Error| SysError { call: CALL, source };
    // SAFETY: socket() takes integers; a non-negative return is a new descriptor we own.
    let fd = check(CALL, unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    })?;
    // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // The kernel's reason in words where it has one (e.g. the MTU is too large for XDP);
    // older kernels lack the option, which only costs the words.
    let _ = super::set_int(&sock, libc::SOL_NETLINK, NETLINK_EXT_ACK, 1, CALL);
    let seq = 1;
    let req = xdp_request(ifindex, prog.as_raw_fd(), flags, seq);
    // SAFETY: a zeroed sockaddr_nl addresses the kernel (pid 0, no groups).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `req` and `kernel` are valid for the lengths passed and outlive the call.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    let mut reply = vec![0u8; 8192];
    // At most a few messages: the acknowledgement of our one request comes first.
    for _ in 0..8 {
        // SAFETY: `reply` is valid for writes of its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), reply.as_mut_ptr().cast(), reply.len(), 0) };
        if n < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        match parse_ack(&reply[..n as usize], seq) {
            Some(Ok(())) => return Ok(()),
            Some(Err((errno, msg))) => {
                let os = io::Error::from_raw_os_error(errno);
                return Err(err(match msg {
                    Some(m) => io::Error::new(os.kind(), format!("{os}: {m}")),
                    None => os,
                }));
            }
            None => continue,
        }
    }
    Err(err(io::Error::new(
        io::ErrorKind::InvalidData,
        "no acknowledgement from the kernel",
    )))
}

/// Gives the calling *thread* its own mount namespace with a fresh sysfs on `/sys`, so that
/// `/sys/class/net` shows the thread's network namespace (as `ip netns exec` arranges for the
/// programs it runs). Mounts made here do not propagate back; they vanish with the thread.
/// Call after entering the network namespace; needs CAP_SYS_ADMIN.
pub fn private_sysfs() -> Result<(), SysError> {
    // SAFETY: unshare takes a flag; CLONE_NEWNS gives only this thread (with its own copy of
    // the fs_struct) a new mount namespace.
    check("unshare(CLONE_NEWNS)", unsafe {
        libc::unshare(libc::CLONE_NEWNS)
    })?;
    let root = c"/";
    let sys = c"/sys";
    // SAFETY: the strings are NUL-terminated literals; a null source/type/data is allowed for
    // a propagation change.
    check("mount(/, MS_SLAVE | MS_REC)", unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_SLAVE | libc::MS_REC,
            std::ptr::null(),
        )
    })?;
    // SAFETY: a NUL-terminated path; a lazy detach of whatever is mounted there (EINVAL when
    // nothing is, which is fine).
    let _ = unsafe { libc::umount2(sys.as_ptr(), libc::MNT_DETACH) };
    mount_fs("sysfs", std::path::Path::new("/sys"))
}

/// Mounts a kernel file system of type `fstype` (`sysfs`, `tracefs`, …) on `target`, as
/// `mount -t FSTYPE none TARGET` does.
pub fn mount_fs(fstype: &str, target: &std::path::Path) -> Result<(), SysError> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let invalid = || SysError {
        call: "mount",
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            "a NUL byte in a mount argument",
        ),
    };
    let kind = CString::new(fstype).map_err(|_| invalid())?;
    let path = CString::new(target.as_os_str().as_bytes()).map_err(|_| invalid())?;
    // SAFETY: both strings are NUL-terminated and outlive the call; these file systems take
    // no data.
    check("mount", unsafe {
        libc::mount(
            kind.as_ptr(),
            path.as_ptr(),
            kind.as_ptr(),
            0,
            std::ptr::null(),
        )
    })
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_xdp_request_is_the_one_ip_sends() {
        // `ip link set dev 7 xdpdrv fd 9` (strace): header, ifinfomsg, IFLA_XDP{FD, FLAGS}.
        let m = xdp_request(7, 9, XDP_FLAGS_DRV_MODE, 1);
        assert_eq!(m.len(), 16 + 16 + 4 + 8 + 8);
        assert_eq!(
            u32::from_ne_bytes(m[0..4].try_into().expect("4 or 2 bytes")),
            52
        );
        assert_eq!(
            u16::from_ne_bytes(m[4..6].try_into().expect("4 or 2 bytes")),
            RTM_SETLINK
        );
        assert_eq!(
            i32::from_ne_bytes(m[20..24].try_into().expect("4 or 2 bytes")),
            7
        );
        assert_eq!(
            u16::from_ne_bytes(m[32..34].try_into().expect("4 or 2 bytes")),
            20
        );
        assert_eq!(
            u16::from_ne_bytes(m[34..36].try_into().expect("4 or 2 bytes")),
            IFLA_XDP | NLA_F_NESTED
        );
        assert_eq!(
            i32::from_ne_bytes(m[40..44].try_into().expect("4 or 2 bytes")),
            9
        );
        assert_eq!(
            u32::from_ne_bytes(m[48..52].try_into().expect("4 or 2 bytes")),
            4
        );
    }

    #[test]
    fn an_ack_with_a_reason_says_it() {
        let mut r = Vec::new();
        let msg = b"veth: Peer MTU is too large to set XDP\0";
        let attr_len = 4 + msg.len();
        let total = 16 + 4 + 16 + attr_len.next_multiple_of(4);
        r.extend_from_slice(&(total as u32).to_ne_bytes());
        r.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        r.extend_from_slice(&(NLM_F_CAPPED | NLM_F_ACK_TLVS).to_ne_bytes());
        r.extend_from_slice(&5u32.to_ne_bytes());
        r.extend_from_slice(&0u32.to_ne_bytes());
        r.extend_from_slice(&(-libc::ERANGE).to_ne_bytes());
        r.extend_from_slice(&[0; 16]);
        push_attr(&mut r, NLMSGERR_ATTR_MSG, msg);
        assert_eq!(
            parse_ack(&r, 5),
            Some(Err((
                libc::ERANGE,
                Some("veth: Peer MTU is too large to set XDP".into())
            )))
        );
        assert_eq!(parse_ack(&r, 6), None, "another request's answer");
        assert_eq!(parse_ack(&r[..10], 5), None, "a short message");
        r[16..20].copy_from_slice(&0i32.to_ne_bytes());
        assert_eq!(parse_ack(&r, 5), Some(Ok(())));
    }

    #[test]
    fn an_errno_of_i32_min_is_no_overflow() {
        // Found by the fuzz target: error field 0x80000000.
        let r = [
            8, 0, 0, 0, 2, 0, 39, 255, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 128, 1, 0, 0, 0,
        ];
        assert_eq!(parse_ack(&r, 1), Some(Err((i32::MIN, None))));
    }

    #[test]
    fn a_long_interface_name_is_refused_before_any_call() {
        let e = set_offload("a-name-far-too-long", Offload::Gro, true).expect_err("refused");
        assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput);
    }
}
