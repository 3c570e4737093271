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

/// `ETHTOOL_GSSET_INFO`, `ETHTOOL_GSTRINGS`, `ETHTOOL_GSTATS`; the statistics string set.
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSTATS: u32 = 0x1d;
const ETH_SS_STATS: u32 = 1;
/// `ETH_GSTRING_LEN`.
const GSTRING_LEN: usize = 32;
/// More statistics than any driver names (mlx5 has a few thousand): a bound on what is asked.
const MAX_STATS: usize = 1 << 16;

/// Issues one SIOCETHTOOL command whose request and answer live in `buf` (the command word
/// first, as every ethtool structure begins).
pub(super) fn ethtool_buf(
    ifname: &str,
    buf: &mut [u64],
    call: &'static str,
) -> Result<(), SysError> {
    let sock = dgram_socket(call)?;
    let mut req = IfreqData {
        name: ifname_bytes(ifname, call)?,
        data: buf.as_mut_ptr().cast(),
        _pad: [0; 16],
    };
    // SAFETY: `req` is a valid ifreq whose data pointer points at `buf`, which outlives the
    // call; each caller sizes `buf` for the command's structure and the lengths it states in
    // it, which bound what the kernel writes back.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    check(call, ret).map(drop)
}

/// The driver's own statistics of `ifname` by name (`ethtool -S IF`): veth's per-queue
/// `rx_queue_N_xdp_packets`, `rx_queue_N_drops` …, a NIC's per-queue packets and drops.
/// An interface whose driver names none gives an empty list.
pub fn driver_stats(ifname: &str) -> Result<Vec<(String, u64)>, SysError> {
    const CALL: &str = "ioctl(SIOCETHTOOL, ETHTOOL_GSTATS)";
    // ethtool_sset_info: cmd, reserved (u32 each), sset_mask (u64), then one u32 per set.
    let mut info = [0u64; 3];
    info[0] = u64::from(ETHTOOL_GSSET_INFO);
    info[1] = 1 << ETH_SS_STATS;
    ethtool_buf(ifname, &mut info, "ioctl(SIOCETHTOOL, ETHTOOL_GSSET_INFO)")?;
    let n = if info[1] & (1 << ETH_SS_STATS) != 0 {
        (info[2] & 0xffff_ffff) as usize
    } else {
        0
    };
    if n == 0 {
        return Ok(Vec::new());
    }
    if n > MAX_STATS {
        return Err(SysError {
            call: CALL,
            source: io::Error::new(io::ErrorKind::InvalidData, format!("{n} statistics")),
        });
    }
    // ethtool_gstrings: cmd, string_set, len (u32 each, 12 bytes), then len × 32 bytes — in
    // u64 words: 12 bytes round up into 2 words with the strings starting at byte 12.
    let mut strings = vec![0u64; (12 + n * GSTRING_LEN).div_ceil(8)];
    let head = [ETHTOOL_GSTRINGS, ETH_SS_STATS, n as u32];
    let mut bytes: Vec<u8> = head.iter().flat_map(|w| w.to_ne_bytes()).collect();
    bytes.resize(strings.len() * 8, 0);
    for (w, c) in strings.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
    }
    ethtool_buf(ifname, &mut strings, "ioctl(SIOCETHTOOL, ETHTOOL_GSTRINGS)")?;
    let raw: Vec<u8> = strings.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let got = u32::from_ne_bytes([raw[8], raw[9], raw[10], raw[11]]) as usize;
    let names: Vec<String> = raw[12..]
        .chunks_exact(GSTRING_LEN)
        .take(got.min(n))
        .map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(GSTRING_LEN);
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect();
    // ethtool_stats: cmd, n_stats (u32 each: one word), then n × u64.
    let mut stats = vec![0u64; 1 + n];
    stats[0] = u64::from(ETHTOOL_GSTATS)
        | if cfg!(target_endian = "little") {
            (n as u64) << 32
        } else {
            n as u64
        };
    ethtool_buf(ifname, &mut stats, CALL)?;
    Ok(names.into_iter().zip(stats[1..].iter().copied()).collect())
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
    fn loopback_has_no_driver_statistics_and_a_missing_interface_is_an_error() {
        // Loopback's driver has no ethtool statistics: none, or "not supported".
        match driver_stats("lo") {
            Ok(v) => assert!(v.is_empty(), "{v:?}"),
            Err(e) => assert_eq!(e.source.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
        }
        let e = driver_stats("fl-no-such-if").expect_err("no such interface");
        assert_eq!(e.source.raw_os_error(), Some(libc::ENODEV), "{e}");
    }

    #[test]
    fn a_long_interface_name_is_refused_before_any_call() {
        let e = set_offload("a-name-far-too-long", Offload::Gro, true).expect_err("refused");
        assert_eq!(e.source.kind(), io::ErrorKind::InvalidInput);
    }
}
