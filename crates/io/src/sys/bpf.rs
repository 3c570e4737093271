//! `bpf(2)`: maps, program loading with the verifier's log, socket-filter attachment, and
//! memory-mapped array maps (read with plain loads, no system call per read).

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{check, SysError};
use crate::ebpf::Insn;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_PROG_LOAD: libc::c_long = 5;

/// `BPF_MAP_TYPE_ARRAY`.
pub const MAP_ARRAY: u32 = 2;
/// `BPF_PROG_TYPE_SOCKET_FILTER`.
pub const PROG_SOCKET_FILTER: u32 = 1;
/// `BPF_F_MMAPABLE`: the array's values can be mapped into user memory (Linux 5.5+).
const F_MMAPABLE: u32 = 1 << 10;

/// The prefix of `union bpf_attr` used by `BPF_MAP_CREATE`.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// The prefix of `union bpf_attr` used by `BPF_PROG_LOAD`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `bpf(cmd, attr, sizeof attr)`; returns the new file descriptor.
fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T, call: &'static str) -> Result<OwnedFd, SysError> {
    // SAFETY: `attr` is a live, initialised `repr(C)` prefix of `union bpf_attr` and its exact
    // size is passed; the kernel zero-extends shorter attributes and writes nothing back for
    // these commands except through pointers we set to our own live buffers.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    let fd = check(call, ret as libc::c_int)?;
    // SAFETY: on success `bpf` returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    // At most 15 bytes of [A-Za-z0-9_.], NUL-terminated, as the kernel requires.
    for (o, b) in out[..15].iter_mut().zip(
        name.bytes()
            .filter(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.'),
    ) {
        *o = b;
    }
    out
}

/// An array map of `u64` values mapped into this process; values are read with atomic loads.
#[derive(Debug)]
pub struct MappedArray {
    fd: OwnedFd,
    ptr: *mut libc::c_void,
    len: usize,
    entries: usize,
}

// SAFETY: the mapping is shared memory read only through atomic loads; the pointer is owned by
// this value and unmapped once, in Drop.
unsafe impl Send for MappedArray {}
// SAFETY: as above; concurrent atomic loads from several threads are sound.
unsafe impl Sync for MappedArray {}

impl MappedArray {
    /// A new `BPF_MAP_TYPE_ARRAY` of `entries` u64 values (all zero), mapped read-only.
    pub fn new(name: &str, entries: u32) -> Result<MappedArray, SysError> {
        let mut attr = MapCreateAttr {
            map_type: MAP_ARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: entries.max(1),
            map_flags: F_MMAPABLE,
            map_name: name16(name),
            ..Default::default()
        };
        let fd = bpf_fd(BPF_MAP_CREATE, &mut attr, "bpf(BPF_MAP_CREATE)")?;
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = (entries.max(1) as usize * 8).div_ceil(page) * page;
        // SAFETY: mapping a BPF_F_MMAPABLE array fd read-only and shared, at offset 0, for the
        // page-rounded size of its values; the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(SysError {
                call: "mmap(bpf array)",
                source: io::Error::last_os_error(),
            });
        }
        Ok(MappedArray {
            fd,
            ptr,
            len,
            entries: entries.max(1) as usize,
        })
    }

    /// The map's file descriptor (to reference it from a program).
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Value `i` (0 when out of range).
    pub fn get(&self, i: usize) -> u64 {
        if i >= self.entries {
            return 0;
        }
        // SAFETY: `i < entries`, so the 8-byte value lies inside the mapping, which is
        // page-aligned (so 8-byte aligned) and lives as long as `self`. Programs update it with
        // atomic adds; an atomic load reads it whole.
        let v = unsafe { &*(self.ptr.cast::<AtomicU64>().add(i)) };
        v.load(Ordering::Relaxed)
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `new`, unmapped only here.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// A program refused by the kernel, with the verifier's explanation.
#[derive(Debug)]
pub struct LoadError {
    /// The failed call.
    pub error: SysError,
    /// The verifier log (may be empty).
    pub log: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error)?;
        let tail: Vec<&str> = self.log.lines().rev().take(3).collect();
        if !tail.is_empty() {
            write!(f, " (verifier: ")?;
            for (i, l) in tail.iter().rev().enumerate() {
                write!(f, "{}{}", if i > 0 { " | " } else { "" }, l.trim())?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// Loads a program; on refusal, loads it again with the verifier log on to say why.
pub fn prog_load(prog_type: u32, name: &str, insns: &[Insn]) -> Result<OwnedFd, LoadError> {
    const LICENSE: &CStr = c"Dual MIT/GPL";
    let mut log = vec![0u8; 1 << 16];
    let mut attempt = |with_log: bool| {
        let mut attr = ProgLoadAttr {
            prog_type,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: LICENSE.as_ptr() as u64,
            prog_name: name16(name),
            ..Default::default()
        };
        if with_log {
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
        }
        bpf_fd(BPF_PROG_LOAD, &mut attr, "bpf(BPF_PROG_LOAD)")
    };
    match attempt(false) {
        Ok(fd) => Ok(fd),
        Err(first) => {
            let error = attempt(true).err().unwrap_or(first);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err(LoadError {
                error,
                log: String::from_utf8_lossy(&log[..end]).into_owned(),
            })
        }
    }
}

/// Attaches an eBPF socket filter (`SO_ATTACH_BPF`); the socket keeps the program alive.
pub fn attach_socket_filter(sock: &impl AsRawFd, prog: &OwnedFd) -> Result<(), SysError> {
    super::set_int(
        sock,
        libc::SOL_SOCKET,
        libc::SO_ATTACH_BPF,
        prog.as_raw_fd(),
        "setsockopt(SO_ATTACH_BPF)",
    )
}
