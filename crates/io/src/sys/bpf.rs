//! `bpf(2)`: maps, program loading with the verifier's log, socket-filter attachment, and
//! memory-mapped array maps (read with plain loads, no system call per read).
//!
//! A little over ~600 lines: every `bpf(2)` command's attribute struct sits beside the one
//! call that fills it, which is what lets each `unsafe` block's `SAFETY:` comment be checked
//! against the layout it relies on.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{check, SysError};
use crate::ebpf::Insn;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
/// `BPF_XDP` attach type (for `BPF_LINK_CREATE`).
const ATTACH_XDP: u32 = 37;
/// `BPF_XDP_CPUMAP`: the expected attach type of an XDP program run by a cpumap entry's kernel
/// thread on the frames redirected to it (set in the entry's `struct bpf_cpumap_val`).
pub const ATTACH_XDP_CPUMAP: u32 = 35;
/// `BPF_F_TEST_XDP_LIVE_FRAMES`: frames the program redirects or transmits really leave.
const F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

/// `BPF_MAP_TYPE_HASH`.
pub const MAP_HASH: u32 = 1;
/// `BPF_MAP_TYPE_ARRAY`.
pub const MAP_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_PERCPU_ARRAY`: each CPU its own copy of every value.
pub const MAP_PERCPU_ARRAY: u32 = 6;
/// `BPF_MAP_TYPE_DEVMAP`: redirect targets that are interfaces, by index.
pub const MAP_DEVMAP: u32 = 14;
/// `BPF_MAP_TYPE_LPM_TRIE`: longest-prefix match on keys of a u32 length and the address.
pub const MAP_LPM_TRIE: u32 = 11;
/// `BPF_F_NO_PREALLOC`, which an LPM trie requires.
pub const F_NO_PREALLOC: u32 = 1;
/// `BPF_MAP_TYPE_CPUMAP`: redirect targets that are CPUs (a kernel thread per entry runs the
/// stack for the frames redirected to it).
pub const MAP_CPUMAP: u32 = 16;
/// `BPF_MAP_TYPE_XSKMAP`: redirect targets that are AF_XDP sockets.
pub const MAP_XSKMAP: u32 = 17;
/// `BPF_PROG_TYPE_SOCKET_FILTER`.
pub const PROG_SOCKET_FILTER: u32 = 1;
/// `BPF_PROG_TYPE_XDP`.
pub const PROG_XDP: u32 = 6;
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
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `bpf(cmd, attr, sizeof attr)` for commands that return a new file descriptor.
fn bpf_fd<T>(cmd: libc::c_long, attr: &mut T, call: &'static str) -> Result<OwnedFd, SysError> {
    // SAFETY: every caller passes an attribute whose pointers (if any) reference buffers it
    // owns and keeps alive across this call: instructions, license, log, map name.
    let fd = unsafe { bpf_call(cmd, attr, call) }?;
    // SAFETY: on success `bpf` returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `bpf(cmd, attr, sizeof attr)`: the one place the system call is made.
///
/// # Safety
/// `attr` must be a `repr(C)` prefix of `union bpf_attr` for `cmd`, and every pointer in it
/// must reference memory valid for what the kernel does with it for that command (reads of
/// the sizes given, or writes into buffers the caller owns), for the duration of the call.
unsafe fn bpf_call<T>(
    cmd: libc::c_long,
    attr: &mut T,
    call: &'static str,
) -> Result<i32, SysError> {
    // SAFETY: `attr` is live and its exact size is passed; the rest is the caller's promise.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    check(call, ret as libc::c_int)
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
        Self::create(name, 8, entries)
    }

    /// A new `BPF_MAP_TYPE_ARRAY` of one entry holding `words` u64 values (all zero), mapped
    /// read-only; `get(i)` reads word `i`. A program addresses such a map's words directly
    /// (`Asm::load_map_value`, what libbpf does for global variables; Linux 5.2+), without a
    /// lookup per use — the kernel offers that only for arrays of one entry.
    pub fn words(name: &str, words: u32) -> Result<MappedArray, SysError> {
        Self::create(name, words.max(1).saturating_mul(8), 1)
    }

    /// `entries` values of `value_size` bytes (a multiple of 8), read as u64 words.
    fn create(name: &str, value_size: u32, entries: u32) -> Result<MappedArray, SysError> {
        let fd = create_map(MAP_ARRAY, 4, value_size, entries.max(1), F_MMAPABLE, name)?;
        let entries = (value_size / 8).max(1) * entries.max(1);
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

    /// How many values.
    pub fn entries(&self) -> usize {
        self.entries
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

/// An array map whose values this process writes through a shared mapping
/// (`BPF_F_MMAPABLE`): a table of millions of entries filled by one copy, not one system call
/// each.
#[derive(Debug)]
pub struct WritableArray {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is owned by this value and unmapped once, in Drop; writes go through
// `&mut self`.
unsafe impl Send for WritableArray {}

impl WritableArray {
    /// A new `BPF_MAP_TYPE_ARRAY` of `entries` values of `value_size` bytes (a multiple of 8,
    /// or 4), zero, mapped read-write.
    pub fn new(name: &str, value_size: u32, entries: u32) -> Result<WritableArray, SysError> {
        let fd = create_map(MAP_ARRAY, 4, value_size, entries.max(1), F_MMAPABLE, name)?;
        // SAFETY: sysconf has no memory effects.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        // Values are laid out at their size rounded up to 8 bytes.
        let bytes = entries.max(1) as usize * (value_size as usize).next_multiple_of(8);
        let len = bytes.div_ceil(page) * page;
        // SAFETY: mapping a BPF_F_MMAPABLE array fd read-write and shared, at offset 0, for
        // the page-rounded size of its values; checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(SysError {
                call: "mmap(bpf array, rw)",
                source: io::Error::last_os_error(),
            });
        }
        Ok(WritableArray {
            fd,
            ptr: ptr as *mut u8,
            len,
            bytes,
        })
    }

    /// The map's file descriptor (to reference it from a program).
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The values' bytes (each value at its size rounded up to 8). A program may read them
    /// while they are written: write what it may see half-done only where that is harmless.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `bytes` ≤ `len`, the mapping made in `new`, alive as long as `self`, and
        // borrowed mutably only through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for WritableArray {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`, unmapped only here.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
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
    prog_load_for(prog_type, 0, name, insns)
}

/// [`prog_load`] with an expected attach type (e.g. [`ATTACH_XDP_CPUMAP`]), for the program
/// kinds the kernel checks it for.
pub fn prog_load_for(
    prog_type: u32,
    expected_attach_type: u32,
    name: &str,
    insns: &[Insn],
) -> Result<OwnedFd, LoadError> {
    load(prog_type, expected_attach_type, 0, name, insns)
}

/// `BPF_F_XDP_HAS_FRAGS`: an XDP program that takes multi-buffer frames (what a device of
/// an MTU above a page asks of the programs attached to it, veth's peer included).
pub const XDP_HAS_FRAGS: u32 = 1 << 5;

/// [`prog_load`] with `prog_flags` (e.g. [`XDP_HAS_FRAGS`]).
pub fn prog_load_flags(
    prog_type: u32,
    flags: u32,
    name: &str,
    insns: &[Insn],
) -> Result<OwnedFd, LoadError> {
    load(prog_type, 0, flags, name, insns)
}

/// `BPF_F_XDP_DEV_BOUND_ONLY`: an XDP program bound to one device, which may call that
/// driver's metadata kfuncs (`bpf_xdp_metadata_rx_hash`, …) and attaches to it alone.
pub const XDP_DEV_BOUND_ONLY: u32 = 1 << 6;

/// Loads an XDP program bound to interface `ifindex` ([`XDP_DEV_BOUND_ONLY`]).
pub fn prog_load_dev_bound(ifindex: u32, name: &str, insns: &[Insn]) -> Result<OwnedFd, LoadError> {
    load_on(PROG_XDP, 0, XDP_DEV_BOUND_ONLY, ifindex, name, insns)
}

fn load(
    prog_type: u32,
    expected_attach_type: u32,
    prog_flags: u32,
    name: &str,
    insns: &[Insn],
) -> Result<OwnedFd, LoadError> {
    load_on(prog_type, expected_attach_type, prog_flags, 0, name, insns)
}

fn load_on(
    prog_type: u32,
    expected_attach_type: u32,
    prog_flags: u32,
    prog_ifindex: u32,
    name: &str,
    insns: &[Insn],
) -> Result<OwnedFd, LoadError> {
    const LICENSE: &CStr = c"Dual MIT/GPL";
    let mut log = vec![0u8; 1 << 16];
    let mut attempt = |with_log: bool| {
        let mut attr = ProgLoadAttr {
            prog_type,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: LICENSE.as_ptr() as u64,
            prog_name: name16(name),
            expected_attach_type,
            prog_flags,
            prog_ifindex,
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

/// Loads the XDP program that returns `verdict` (`ebpf::xdp::DROP`, `PASS`, `TX`) for every
/// frame: a peer that drops all, a veth end that must run NAPI, a probe. Multi-buffer aware,
/// so it attaches at any MTU (veth refuses a program that is not, at a peer MTU above a page);
/// plain where the kernel predates that. The one copy of it (seven were assembled apart).
pub fn verdict_program(verdict: i32, name: &str) -> Result<OwnedFd, LoadError> {
    let insns = crate::ebpf::Asm::new()
        .mov_imm(crate::ebpf::R0, verdict)
        .exit()
        .finish()
        .map_err(|e| LoadError {
            error: SysError {
                call: "assemble",
                source: io::Error::new(io::ErrorKind::InvalidInput, format!("{e:?}")),
            },
            log: String::new(),
        })?;
    prog_load_flags(PROG_XDP, XDP_HAS_FRAGS, name, &insns)
        .or_else(|_| prog_load(PROG_XDP, name, &insns))
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

/// The part of `union bpf_attr` used by `BPF_PROG_TEST_RUN`.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// `struct xdp_md`, the XDP program's context as `BPF_PROG_TEST_RUN` takes it.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// Runs XDP program `prog` `repeat` times on copies of `frame` in live-frames mode
/// (`BPF_F_TEST_XDP_LIVE_FRAMES`, Linux 5.18+): each run's verdict is carried out as if the
/// frame had arrived on queue `queue` of interface `ifindex` — `XDP_TX` sends it back out of
/// that interface, `XDP_REDIRECT` wherever the program said. Frames go in batches of `batch`
/// (at most 256) between flushes; the call returns when all `repeat` have been run.
pub fn xdp_test_run_live(
    prog: &OwnedFd,
    frame: &[u8],
    ifindex: u32,
    queue: u32,
    repeat: u32,
    batch: u32,
) -> Result<(), SysError> {
    let ctx = XdpMd {
        data_end: frame.len() as u32,
        ingress_ifindex: ifindex,
        rx_queue_index: queue,
        ..Default::default()
    };
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat,
        ctx_size_in: size_of::<XdpMd>() as u32,
        ctx_in: &ctx as *const XdpMd as u64,
        flags: F_TEST_XDP_LIVE_FRAMES,
        batch_size: batch.min(256),
        ..Default::default()
    };
    // SAFETY: the pointers reference `frame` and `ctx`, which outlive the call and hold the
    // sizes given; in live-frames mode the kernel writes back only `retval` and `duration`,
    // inside `attr`.
    unsafe {
        bpf_call(
            BPF_PROG_TEST_RUN,
            &mut attr,
            "bpf(BPF_PROG_TEST_RUN, live frames)",
        )
    }
    .map(drop)
}

/// Runs XDP program `prog` once on a copy of `frame` (`BPF_PROG_TEST_RUN`, no live frames):
/// its verdict and the frame as the program left it. Nothing is sent.
pub fn xdp_test_run(prog: &OwnedFd, frame: &[u8]) -> Result<(u32, Vec<u8>), SysError> {
    // Room for a program that grows the frame (up to a page, as the kernel allows).
    let mut out = vec![0u8; frame.len() + 4096];
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        data_size_out: out.len() as u32,
        data_out: out.as_mut_ptr() as u64,
        repeat: 1,
        ..Default::default()
    };
    // SAFETY: `data_in` points at `frame` (its length given) and `data_out` at `out` (its
    // length given), both live across the call; the kernel writes at most data_size_out
    // bytes there and the results into `attr`.
    unsafe { bpf_call(BPF_PROG_TEST_RUN, &mut attr, "bpf(BPF_PROG_TEST_RUN)") }?;
    out.truncate((attr.data_size_out as usize).min(out.len()));
    Ok((attr.retval, out))
}

/// The part of `union bpf_attr` used by `BPF_LINK_CREATE`.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// Attaches XDP program `prog` to interface `ifindex` through a BPF link: the program stays
/// attached exactly as long as the returned descriptor is open (also when the process dies),
/// so nothing is left behind. `flags`: 0 (the driver's mode where it has one, else generic),
/// or `XDP_FLAGS_SKB_MODE` (2) / `XDP_FLAGS_DRV_MODE` (4).
pub fn attach_xdp(prog: &OwnedFd, ifindex: u32, flags: u32) -> Result<OwnedFd, SysError> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: ATTACH_XDP,
        flags,
    };
    bpf_fd(BPF_LINK_CREATE, &mut attr, "bpf(BPF_LINK_CREATE, XDP)")
}

/// The part of `union bpf_attr` used by `BPF_LINK_UPDATE`.
#[repr(C)]
#[derive(Default)]
struct LinkUpdateAttr {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// Replaces the program of BPF link `link` with `prog` in one step (`BPF_LINK_UPDATE`): every
/// frame meets the old program or the new one, none meets neither.
pub fn link_update(link: &OwnedFd, prog: &OwnedFd) -> Result<(), SysError> {
    let mut attr = LinkUpdateAttr {
        link_fd: link.as_raw_fd() as u32,
        new_prog_fd: prog.as_raw_fd() as u32,
        ..Default::default()
    };
    // SAFETY: the attribute holds two descriptors and no pointer.
    unsafe { bpf_call(BPF_LINK_UPDATE, &mut attr, "bpf(BPF_LINK_UPDATE)") }?;
    Ok(())
}

/// Creates a map (`BPF_MAP_CREATE`) with 4-byte keys.
pub fn create_map(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    entries: u32,
    flags: u32,
    name: &str,
) -> Result<OwnedFd, SysError> {
    let mut attr = MapCreateAttr {
        map_type,
        key_size,
        value_size,
        max_entries: entries,
        map_flags: flags,
        map_name: name16(name),
        ..Default::default()
    };
    bpf_fd(BPF_MAP_CREATE, &mut attr, "bpf(BPF_MAP_CREATE)")
}

/// The part of `union bpf_attr` used by `BPF_MAP_UPDATE_ELEM`.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Sets `map[key] = value` (`key` and `value` of the map's sizes: the kernel reads exactly
/// those many bytes, so shorter slices are refused here).
pub fn map_update(
    map: &OwnedFd,
    key: &[u8],
    value: &[u8],
    key_size: usize,
    value_size: usize,
) -> Result<(), SysError> {
    if key.len() != key_size || value.len() != value_size {
        return Err(SysError {
            call: "bpf(BPF_MAP_UPDATE_ELEM)",
            source: io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        value: value.as_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: the pointers reference `key` and `value`, which hold the map's key and value
    // sizes (checked above) and outlive the call; the kernel only reads through them.
    unsafe { bpf_call(BPF_MAP_UPDATE_ELEM, &mut attr, "bpf(BPF_MAP_UPDATE_ELEM)") }.map(drop)
}

/// `map[key]` (`None`: no such key), its value `value_size` bytes.
pub fn map_lookup(
    map: &OwnedFd,
    key: &[u8],
    value_size: usize,
) -> Result<Option<Vec<u8>>, SysError> {
    let mut value = vec![0u8; value_size];
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        value: value.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `key` holds the map's key (the caller's map, made with that key size) and
    // `value` `value_size` bytes, the map's value size; both outlive the call.
    match unsafe { bpf_call(BPF_MAP_LOOKUP_ELEM, &mut attr, "bpf(BPF_MAP_LOOKUP_ELEM)") } {
        Ok(_) => Ok(Some(value)),
        Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Removes `map[key]`; whether it was there.
pub fn map_delete(map: &OwnedFd, key: &[u8]) -> Result<bool, SysError> {
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `key` holds the map's key and outlives the call; the kernel only reads it.
    match unsafe { bpf_call(BPF_MAP_DELETE_ELEM, &mut attr, "bpf(BPF_MAP_DELETE_ELEM)") } {
        Ok(_) => Ok(true),
        Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Every key of a hash map (`key_size` bytes each), as `BPF_MAP_GET_NEXT_KEY` walks them
/// (at most `limit`).
pub fn map_keys(map: &OwnedFd, key_size: usize, limit: usize) -> Result<Vec<Vec<u8>>, SysError> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    while keys.len() < limit {
        let mut next = vec![0u8; key_size];
        let mut attr = MapElemAttr {
            map_fd: map.as_raw_fd() as u32,
            // No key: the first one.
            key: keys.last().map_or(0, |k| k.as_ptr() as u64),
            value: next.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: the previous key (if any) and `next` hold `key_size` bytes, the map's key
        // size, and outlive the call.
        match unsafe { bpf_call(BPF_MAP_GET_NEXT_KEY, &mut attr, "bpf(BPF_MAP_GET_NEXT_KEY)") } {
            Ok(_) => keys.push(next),
            Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(keys)
}

/// The part of `union bpf_attr` used by `BPF_OBJ_PIN`.
#[repr(C)]
#[derive(Default)]
struct ObjPinAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// Pins a program or map at `path` on a mounted bpf file system (so another process, e.g.
/// `ip link set … xdp pinned PATH`, can take it); removing the file unpins it.
pub fn pin(obj: &OwnedFd, path: &std::path::Path) -> Result<(), SysError> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError {
        call: "bpf(BPF_OBJ_PIN)",
        source: io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    let mut attr = ObjPinAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: obj.as_raw_fd() as u32,
        file_flags: 0,
    };
    // SAFETY: `pathname` points at a NUL-terminated string that outlives the call; the kernel
    // only reads it.
    unsafe { bpf_call(BPF_OBJ_PIN, &mut attr, "bpf(BPF_OBJ_PIN)") }.map(drop)
}

/// The part of `union bpf_attr` used by `BPF_*_GET_NEXT_ID` and `BPF_*_GET_FD_BY_ID`.
#[repr(C)]
#[derive(Default)]
struct IdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// The descriptor of the program or map with id `id` (`cmd`: `BPF_PROG_GET_FD_BY_ID` or
/// `BPF_MAP_GET_FD_BY_ID`; needs CAP_SYS_ADMIN).
fn fd_by_id(cmd: libc::c_long, id: u32, call: &'static str) -> Result<OwnedFd, SysError> {
    bpf_fd(
        cmd,
        &mut IdAttr {
            id,
            ..Default::default()
        },
        call,
    )
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info` (the kernel fills what fits and zeroes the rest of
/// what it knows; fields beyond `info` are left out). Pointer fields the caller set in `info`
/// must reference buffers of the sizes given next to them.
fn obj_info(fd: &OwnedFd, info: &mut [u8]) -> Result<(), SysError> {
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut ia = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: `info` points at `info_len` writable bytes that outlive the call; any pointer
    // inside it is the caller's promise (see above).
    unsafe {
        bpf_call(
            BPF_OBJ_GET_INFO_BY_FD,
            &mut ia,
            "bpf(BPF_OBJ_GET_INFO_BY_FD)",
        )
    }
    .map(drop)
}

/// A NUL-padded 16-byte object name as text.
fn name_of(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A map found by [`map_of_program`], with its sizes as the kernel reports them.
#[derive(Debug)]
pub struct FoundMap {
    fd: OwnedFd,
    id: u32,
    key_size: u32,
    value_size: u32,
    per_cpu: bool,
}

/// The map named `name` among those program `prog_id` uses (as `bpftool prog show` lists
/// them), or `None` if it uses none of that name. Needs CAP_SYS_ADMIN. This is how a process
/// other than the one that loaded a program reads its counters.
pub fn map_of_program(prog_id: u32, name: &str) -> Result<Option<FoundMap>, SysError> {
    let prog = fd_by_id(BPF_PROG_GET_FD_BY_ID, prog_id, "bpf(BPF_PROG_GET_FD_BY_ID)")?;
    // bpf_prog_info up to `map_ids` (offset 56): nr_map_ids at 52 in, the count out.
    let mut ids = [0u32; 64];
    let mut info = [0u8; 64];
    info[52..56].copy_from_slice(&(ids.len() as u32).to_ne_bytes());
    info[56..64].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
    // `map_ids` points at `ids`, 64 u32 slots as `nr_map_ids` says, alive across the call.
    obj_info(&prog, &mut info)?;
    let n = u32::from_ne_bytes([info[52], info[53], info[54], info[55]]) as usize;
    for &id in &ids[..n.min(ids.len())] {
        // A map may go away between the calls: skip it.
        let Ok(fd) = fd_by_id(BPF_MAP_GET_FD_BY_ID, id, "bpf(BPF_MAP_GET_FD_BY_ID)") else {
            continue;
        };
        // bpf_map_info up to and including `name[16]` at offset 24; no pointers.
        let mut mi = [0u8; 40];
        obj_info(&fd, &mut mi)?;
        if name_of(&mi[24..40]) == name16_str(name) {
            let word = |o: usize| u32::from_ne_bytes([mi[o], mi[o + 1], mi[o + 2], mi[o + 3]]);
            // PERCPU_HASH 5, PERCPU_ARRAY 6, LRU_PERCPU_HASH 10, PERCPU_CGROUP_STORAGE 21.
            let per_cpu = matches!(word(0), 5 | 6 | 10 | 21);
            return Ok(Some(FoundMap {
                fd,
                id,
                key_size: word(8),
                value_size: word(12),
                per_cpu,
            }));
        }
    }
    Ok(None)
}

/// `name` as the kernel stores it (see `name16`).
fn name16_str(name: &str) -> String {
    name_of(&name16(name))
}

impl FoundMap {
    /// The map's id (as tracepoints such as `xdp:xdp_cpumap_enqueue` report it).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The value of `self[key]` (4-byte keys, as every map made here has; a map with other
    /// keys is refused with EINVAL, not read).
    pub fn lookup(&self, key: u32) -> Result<Vec<u8>, SysError> {
        if self.key_size != 4 || self.per_cpu {
            return Err(SysError {
                call: "bpf(BPF_MAP_LOOKUP_ELEM)",
                source: io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        let key = key.to_ne_bytes();
        let mut value = vec![0u8; self.value_size as usize];
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: key.as_ptr() as u64,
            value: value.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: `key` holds the map's 4-byte key and `value` its value size as the kernel
        // reported it for this descriptor (not a per-CPU map, whose values are larger); both
        // outlive the call, and the kernel reads the one and fills the other.
        unsafe { bpf_call(BPF_MAP_LOOKUP_ELEM, &mut attr, "bpf(BPF_MAP_LOOKUP_ELEM)") }?;
        Ok(value)
    }
}

/// The names of every BPF program loaded on this host (needs CAP_SYS_ADMIN): to check that
/// nothing was left behind.
pub fn loaded_program_names() -> Result<Vec<String>, SysError> {
    let mut names = Vec::new();
    let mut id = 0u32;
    loop {
        let mut a = IdAttr {
            id,
            ..Default::default()
        };
        // SAFETY: this attribute holds no pointers; the kernel writes `next_id` into it.
        match unsafe { bpf_call(BPF_PROG_GET_NEXT_ID, &mut a, "bpf(BPF_PROG_GET_NEXT_ID)") } {
            Ok(_) => id = a.next_id,
            Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => break,
            Err(e) => return Err(e),
        }
        // A program may go away between the two calls: skip it.
        let Ok(fd) = fd_by_id(BPF_PROG_GET_FD_BY_ID, id, "bpf(BPF_PROG_GET_FD_BY_ID)") else {
            continue;
        };
        // bpf_prog_info up to and including `name[16]` at offset 64; no pointers set.
        let mut info = [0u8; 80];
        if obj_info(&fd, &mut info).is_ok() {
            names.push(name_of(&info[64..80]));
        }
    }
    Ok(names)
}
