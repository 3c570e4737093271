//! Stream sockets' system calls: an epoll set with nanosecond timeouts, `sendfile` from a
//! memfd, the open-file limit.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use super::{check, SysError};

/// What a member of a [`Poller`] is watched for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interest {
    /// Input (or a peer's shutdown) is reported.
    pub read: bool,
    /// Room in the send buffer is reported.
    pub write: bool,
}

impl Interest {
    /// Input only.
    pub const READ: Interest = Interest {
        read: true,
        write: false,
    };
    /// Room to write only (a peer's shutdown and errors are still reported).
    pub const WRITE: Interest = Interest {
        read: false,
        write: true,
    };
    /// Input and room to write.
    pub const BOTH: Interest = Interest {
        read: true,
        write: true,
    };

    fn bits(self) -> u32 {
        let mut b = libc::EPOLLRDHUP as u32;
        if self.read {
            b |= libc::EPOLLIN as u32;
        }
        if self.write {
            b |= libc::EPOLLOUT as u32;
        }
        b
    }
}

/// One readiness report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// The member's token.
    pub token: u64,
    /// Input, a peer's shutdown, or an error is waiting (read to find out which).
    pub readable: bool,
    /// Room to write (or an error: the write says which).
    pub writable: bool,
    /// The peer hung up or the socket failed.
    pub closed: bool,
}

/// An epoll set, level-triggered, whose waits take nanosecond timeouts (`epoll_pwait2`, Linux
/// 5.11+; on older kernels `epoll_wait` with the timeout rounded up to a millisecond). A
/// constant-rate sender needs the finer timer: with millisecond waits a request due in 0.3 ms
/// would leave up to 0.7 ms late, and its latency, measured from when it was due, would show it.
#[derive(Debug)]
pub struct Poller {
    fd: OwnedFd,
    events: Vec<libc::epoll_event>,
    ready: usize,
    pwait2: bool,
}

impl Poller {
    /// An empty set reporting up to `batch` members per wait.
    pub fn new(batch: usize) -> Result<Poller, SysError> {
        // SAFETY: plain epoll_create1 call; the result is checked.
        let raw = check("epoll_create1", unsafe {
            libc::epoll_create1(libc::EPOLL_CLOEXEC)
        })?;
        Ok(Poller {
            // SAFETY: `raw` is a new descriptor owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; batch.max(1)],
            ready: 0,
            pwait2: true,
        })
    }

    /// The most members one wait reports.
    pub fn capacity(&self) -> usize {
        self.events.len()
    }

    fn ctl(
        &self,
        op: libc::c_int,
        fd: RawFd,
        ev: Option<libc::epoll_event>,
        call: &'static str,
    ) -> Result<(), SysError> {
        let mut ev = ev.unwrap_or(libc::epoll_event { events: 0, u64: 0 });
        // SAFETY: valid descriptors and a valid event struct that outlives the call.
        let ret = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) };
        check(call, ret).map(drop)
    }

    /// Watches `fd`, reporting it as `token`.
    pub fn add(&self, fd: &impl AsRawFd, token: u64, interest: Interest) -> Result<(), SysError> {
        let ev = libc::epoll_event {
            events: interest.bits(),
            u64: token,
        };
        self.ctl(
            libc::EPOLL_CTL_ADD,
            fd.as_raw_fd(),
            Some(ev),
            "epoll_ctl(ADD)",
        )
    }

    /// Changes what `fd` is watched for.
    pub fn modify(
        &self,
        fd: &impl AsRawFd,
        token: u64,
        interest: Interest,
    ) -> Result<(), SysError> {
        let ev = libc::epoll_event {
            events: interest.bits(),
            u64: token,
        };
        self.ctl(
            libc::EPOLL_CTL_MOD,
            fd.as_raw_fd(),
            Some(ev),
            "epoll_ctl(MOD)",
        )
    }

    /// Stops watching `fd` (closing it does this too).
    pub fn delete(&self, fd: &impl AsRawFd) -> Result<(), SysError> {
        self.ctl(libc::EPOLL_CTL_DEL, fd.as_raw_fd(), None, "epoll_ctl(DEL)")
    }

    /// Waits up to `timeout` (zero: do not wait) for members to be ready; returns how many
    /// are, read them with [`Poller::get`]. A signal ends the wait early with none ready.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, SysError> {
        let max = self.events.len() as libc::c_int;
        let ret = if self.pwait2 {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: `events` has room for `max` entries; `ts` outlives the call; no signal
            // mask is passed (null).
            let r = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    self.fd.as_raw_fd(),
                    self.events.as_mut_ptr(),
                    max,
                    &ts as *const libc::timespec,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                self.pwait2 = false;
                return self.wait(timeout);
            }
            r as libc::c_int
        } else {
            let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `events` has room for `max` entries.
            unsafe { libc::epoll_wait(self.fd.as_raw_fd(), self.events.as_mut_ptr(), max, ms) }
        };
        if ret < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                self.ready = 0;
                return Ok(0);
            }
            return Err(SysError {
                call: "epoll_pwait2",
                source: e,
            });
        }
        self.ready = ret as usize;
        Ok(self.ready)
    }

    /// `waited` when a wait already found members ready, else a look without waiting: what a
    /// poll round handles.
    pub fn ready_now(&mut self, waited: usize) -> Result<usize, SysError> {
        if waited > 0 {
            Ok(waited)
        } else {
            self.wait(Duration::ZERO)
        }
    }

    /// The `i`th report of the last wait (`i` < what it returned).
    pub fn get(&self, i: usize) -> Option<Readiness> {
        if i >= self.ready {
            return None;
        }
        let e = self.events[i];
        let bits = e.events;
        let err = bits & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        Some(Readiness {
            token: e.u64,
            readable: bits & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0 || err,
            writable: bits & libc::EPOLLOUT as u32 != 0 || err,
            closed: err || bits & libc::EPOLLRDHUP as u32 != 0,
        })
    }
}

/// `sendfile(2)`: up to `count` bytes of `file` from `*offset` into the socket `out`,
/// advancing `*offset`; returns the bytes sent (`WouldBlock` when the socket is full).
pub fn sendfile(
    out: &impl AsRawFd,
    file: &impl AsRawFd,
    offset: &mut i64,
    count: usize,
) -> io::Result<usize> {
    let mut off: libc::off_t = *offset as libc::off_t;
    // SAFETY: both descriptors are open; `off` is a valid, writable offset the kernel updates.
    let ret = unsafe { libc::sendfile(out.as_raw_fd(), file.as_raw_fd(), &mut off, count) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    *offset = off as i64;
    Ok(ret as usize)
}

/// An anonymous in-memory file (`memfd_create`), close-on-exec.
pub fn memfd(name: &std::ffi::CStr) -> Result<File, SysError> {
    // SAFETY: `name` is a NUL-terminated string that outlives the call.
    let fd = check("memfd_create", unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC)
    })?;
    // SAFETY: `fd` is a new descriptor owned by nothing else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The open-file limit: (soft, hard).
pub fn nofile_limit() -> Result<(u64, u64), SysError> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit.
    check("getrlimit(RLIMIT_NOFILE)", unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r)
    })?;
    Ok((r.rlim_cur, r.rlim_max))
}

/// Raises the soft open-file limit to the hard one; returns the limits now in force.
pub fn raise_nofile_limit() -> Result<(u64, u64), SysError> {
    let (soft, hard) = nofile_limit()?;
    if soft < hard {
        let r = libc::rlimit {
            rlim_cur: hard,
            rlim_max: hard,
        };
        // SAFETY: `r` is a valid rlimit read by the kernel.
        check("setrlimit(RLIMIT_NOFILE)", unsafe {
            libc::setrlimit(libc::RLIMIT_NOFILE, &r)
        })?;
    }
    nofile_limit()
}

/// Gives the calling thread a file table of its own (`unshare(CLONE_FILES)`): a copy of the
/// process's, after which the descriptors the thread opens are its alone, and close when it
/// ends. The open-file limit bounds each table, not the process, so threads with their own
/// tables may hold more descriptors together than one table can (how `http load` keeps more
/// connections than `RLIMIT_NOFILE`).
pub fn unshare_files() -> Result<(), SysError> {
    // SAFETY: no pointers; affects only the calling thread's descriptor table.
    check("unshare(CLONE_FILES)", unsafe {
        libc::unshare(libc::CLONE_FILES)
    })
    .map(drop)
}

/// This machine's `AUDIT_ARCH_*` (linux/audit.h: the ELF machine, 64-bit, little-endian).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// Makes `unshare` fail with EPERM on the calling thread and every thread it starts from now
/// on, as a container's default seccomp profile does (a seccomp filter: the kernel's own
/// mechanism). For tests of what a role does where file tables of its own are refused. Sets
/// `no_new_privs` on the thread.
pub fn refuse_unshare_here() -> Result<(), SysError> {
    // seccomp_data: `nr` at offset 0, `arch` at offset 4. BPF_LD|BPF_W|BPF_ABS = 0x20,
    // BPF_JMP|BPF_JEQ|BPF_K = 0x15, BPF_RET|BPF_K = 0x06.
    let ins = |code: u16, jt: u8, jf: u8, k: u32| libc::sock_filter { code, jt, jf, k };
    let prog = [
        ins(0x20, 0, 0, 4),
        ins(0x15, 0, 3, AUDIT_ARCH),
        ins(0x20, 0, 0, 0),
        ins(0x15, 0, 1, libc::SYS_unshare as u32),
        ins(0x06, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        ins(0x06, 0, 0, libc::SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: plain integer arguments; affects only this thread's later exec.
    check("prctl(PR_SET_NO_NEW_PRIVS)", unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    })?;
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies it.
    check("prctl(PR_SET_SECCOMP)", unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
        )
    })
    .map(drop)
}

/// CPU time this process has used, user and system, in nanoseconds (`getrusage`).
pub fn process_cpu_ns() -> Result<u64, SysError> {
    // SAFETY: an all-zero rusage is a valid value for the kernel to overwrite.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `r` is a valid, writable rusage.
    check("getrusage", unsafe {
        libc::getrusage(libc::RUSAGE_SELF, &mut r)
    })?;
    let t = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
    Ok(t(r.ru_utime) + t(r.ru_stime))
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, USER_HZ): the unit of `/proc/stat`'s
/// CPU times. 100 where the system will not say.
pub fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// What a child process used, read when it is reaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildUsage {
    /// Its exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    /// CPU time, user and system, nanoseconds.
    pub cpu_ns: u64,
    /// The user part of `cpu_ns` (the rest is the kernel's work on the child's behalf).
    pub user_ns: u64,
    /// Largest resident set, KiB.
    pub max_rss_kib: u64,
}

/// Waits for child `pid` to end and reaps it (`wait4`), with the CPU time and peak memory it
/// used: how a benchmark measures a peer program it ran.
pub fn wait_child(pid: u32) -> Result<ChildUsage, SysError> {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value for the kernel to overwrite.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `r` are valid and writable; `pid` names our child.
        let ret = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut r) };
        if ret >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(SysError {
                call: "wait4",
                source: e,
            });
        }
    }
    let t = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
    Ok(ChildUsage {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        cpu_ns: t(r.ru_utime) + t(r.ru_stime),
        user_ns: t(r.ru_utime),
        max_rss_kib: r.ru_maxrss as u64,
    })
}

/// `recv(MSG_TRUNC)` on a TCP socket: drops up to `buf.len()` bytes of what is waiting
/// without copying them (`buf` is not written; it only bounds the count). Returns the bytes
/// dropped (0: the peer closed); `WouldBlock` when nothing is waiting.
pub fn recv_discard(fd: &impl AsRawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of its length (TCP's MSG_TRUNC writes nothing to it).
    let ret = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_TRUNC | libc::MSG_DONTWAIT,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ret as usize)
}

/// Turns on software receive timestamps (`SO_TIMESTAMPNS`) on a TCP socket: each
/// [`recv_stamped`] then also says when the kernel received the last segment it took.
pub fn set_rx_timestamps(fd: &impl AsRawFd) -> Result<(), SysError> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a valid c_int that outlives the call; its size is passed.
    check("setsockopt(SO_TIMESTAMPNS)", unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Like a read (or, with `discard`, [`recv_discard`]) on a TCP socket with receive timestamps
/// on ([`set_rx_timestamps`]): the bytes taken, and when the kernel received the last segment
/// they came from (`CLOCK_REALTIME`, ns since the epoch) if it said.
pub fn recv_stamped(
    fd: &impl AsRawFd,
    buf: &mut [u8],
    discard: bool,
) -> io::Result<(usize, Option<u64>)> {
    // Room for one SCM_TIMESTAMPNS (a timespec) with its header, aligned as cmsghdr.
    let mut ctl = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid (null name, no iovecs, no control) before it is filled.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&ctl) as _;
    let flags = libc::MSG_DONTWAIT | if discard { libc::MSG_TRUNC } else { 0 };
    // SAFETY: `msg` points at `iov` (valid for writes of `buf.len()` bytes; TCP's MSG_TRUNC
    // writes nothing) and at `ctl` (valid for `msg_controllen` bytes); all outlive the call.
    let ret = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, flags) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stamp = None;
    // SAFETY: the kernel wrote `msg_controllen` bytes of well-formed control messages into
    // `ctl`; CMSG_FIRSTHDR/CMSG_NXTHDR stay within them, and a SCM_TIMESTAMPNS message's data
    // is a timespec (read unaligned).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((ret as usize, stamp))
}

/// Sets the calling thread's timer slack (`PR_SET_TIMERSLACK`): how late the kernel may end
/// its timed waits to batch wakeups. The default, 50 µs, would show in every constant-rate
/// request's send time.
pub fn set_timer_slack_ns(ns: u64) -> Result<(), SysError> {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument; the others are ignored.
    check("prctl(PR_SET_TIMERSLACK)", unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns.max(1) as libc::c_ulong, 0, 0, 0)
    })
    .map(drop)
}
