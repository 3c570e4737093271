//! Interface settings without external programs: offloads through the `SIOCETHTOOL` ioctl (what
//! `ethtool -K` does), and a thread-private view of a namespace's sysfs (what `ip netns exec`
//! mounts) for the per-queue files XPS and RPS live in. Netlink (XDP attach, neighbours,
//! routes) is in [`super::netlink`].
//!
//! Every call acts in the calling thread's network namespace: the socket it opens belongs there.

use std::io;
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
    fn a_long_interface_name_is_refused_before_any_call() {
        let e = set_offload("a-name-far-too-long", Offload::Gro, true).expect_err("refused");
        assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput);
    }
}
