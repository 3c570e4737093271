//! Every system call flowlane makes goes through this module: each `unsafe` block is here, with
//! a `// SAFETY:` comment, and every failure names the call (`SysError { call, source }`).

use std::fmt;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub mod bpf;
pub mod btf;
pub mod ethtool;
pub mod huge;
mod mmsg;
pub mod netdev;
pub mod netlink;
pub mod nft;
pub mod packet;
pub mod qstats;
pub mod rt;
pub mod stream;
pub mod xsk;
pub mod xsk_group;

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

/// `setsockopt` with a plain value (an integer, or a `repr(C)` struct the option expects).
pub(crate) fn set_opt<T>(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
    call: &'static str,
) -> Result<(), SysError> {
    // SAFETY: `value` lives across the call and its exact size is passed; the kernel copies it.
    let ret = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            value as *const T as *const libc::c_void,
            size_of::<T>() as libc::socklen_t,
        )
    };
    check(call, ret).map(drop)
}

/// `setsockopt` with an integer value.
pub fn set_int(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
    call: &'static str,
) -> Result<(), SysError> {
    set_opt(fd, level, name, &value, call)
}

/// `getsockopt` of an integer value.
pub fn get_int(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    call: &'static str,
) -> Result<libc::c_int, SysError> {
    let mut value: libc::c_int = 0;
    get_opt(fd, level, name, &mut value, call).map(|()| value)
}

/// `getsockopt` into a plain-data value (`T` must be valid for any bit pattern the kernel
/// writes: integers and structs of integers).
pub(crate) fn get_opt<T>(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &mut T,
    call: &'static str,
) -> Result<(), SysError> {
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of the sizes given.
    let ret = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            value as *mut T as *mut libc::c_void,
            &mut len,
        )
    };
    check(call, ret).map(drop)
}

/// Moves the calling *thread* into the network namespace open at `ns` (e.g. a file under
/// Whether this kernel (and this process's privileges) let a socket of `domain`/`ty` be
/// opened: it is opened and closed at once (e.g. `AF_XDP`, `AF_PACKET`).
pub fn socket_available(
    domain: libc::c_int,
    ty: libc::c_int,
    call: &'static str,
) -> Result<(), SysError> {
    // SAFETY: socket() takes integers; a non-negative return is a new descriptor we own.
    let fd = check(call, unsafe {
        libc::socket(domain, ty | libc::SOCK_CLOEXEC, 0)
    })?;
    // SAFETY: `fd` was just returned by socket() and is owned by nobody else; dropping it
    // closes it.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    Ok(())
}

/// Opens `path` for reading without blocking: a FIFO opens at once (with no writer yet, its
/// reads end at once), and its reads say `WouldBlock` while a writer holds it open without
/// writing — so a reader can check for Ctrl-C instead of hanging in `open` or `read`.
pub fn open_read_nonblocking(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// Moves the calling thread into the network namespace `ns` (an open file such as one under
/// `/run/netns/`); sockets it opens afterwards belong to that namespace. Needs CAP_SYS_ADMIN.
pub fn enter_netns(ns: &impl AsRawFd) -> Result<(), SysError> {
    // SAFETY: setns takes a file descriptor and a flag; it changes only this thread's namespace.
    let ret = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    check("setns(CLONE_NEWNET)", ret).map(drop)
}

/// The socket's drop count (`sk_drops`: datagrams refused for a full receive buffer, among
/// others), read with `SO_MEMINFO`. (SO_RXQ_OVFL reports the same counter as a control message
/// on every datagram — a cost per datagram — and only as stamped on the next datagram queued, so
/// the tail of a burst's drops would stay unseen; one call now and then is cheaper and exact.)
pub fn socket_drops(fd: &impl AsRawFd) -> Result<u32, SysError> {
    // SK_MEMINFO_VARS is 9 today; room for growth. SK_MEMINFO_DROPS is index 8.
    let mut info = [0u32; 16];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` and `len` are valid for writes of the sizes given.
    let ret = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    check("getsockopt(SO_MEMINFO)", ret)?;
    if (len as usize) < 9 * size_of::<u32>() {
        return Err(SysError {
            call: "getsockopt(SO_MEMINFO)",
            source: io::Error::from_raw_os_error(libc::ENOPROTOOPT),
        });
    }
    Ok(info[8])
}

/// One classic BPF instruction (`struct sock_filter`).
pub type BpfInsn = libc::sock_filter;

/// Attaches a classic BPF program choosing the socket of a `SO_REUSEPORT` group
/// (`SO_ATTACH_REUSEPORT_CBPF`, Linux 4.5+). The program returns the index of the socket in
/// bind order.
pub fn attach_reuseport_cbpf(fd: &impl AsRawFd, prog: &[BpfInsn]) -> Result<(), SysError> {
    attach_cbpf(
        fd,
        prog,
        libc::SO_ATTACH_REUSEPORT_CBPF,
        "setsockopt(SO_ATTACH_REUSEPORT_CBPF)",
    )
}

/// Attaches a classic BPF socket filter (`SO_ATTACH_FILTER`): the program returns how many
/// bytes of a packet to keep, 0 to drop it before the socket sees it.
pub fn attach_socket_cbpf(fd: &impl AsRawFd, prog: &[BpfInsn]) -> Result<(), SysError> {
    attach_cbpf(
        fd,
        prog,
        libc::SO_ATTACH_FILTER,
        "setsockopt(SO_ATTACH_FILTER)",
    )
}

/// A classic BPF program handed to the kernel with socket option `opt`.
fn attach_cbpf(
    fd: &impl AsRawFd,
    prog: &[BpfInsn],
    opt: libc::c_int,
    call: &'static str,
) -> Result<(), SysError> {
    let fprog = libc::sock_fprog {
        len: prog.len() as libc::c_ushort,
        filter: prog.as_ptr() as *mut BpfInsn,
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies it.
    let ret = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    check(call, ret).map(drop)
}

/// CPUs the kernel may ever run (`/sys/devices/system/cpu/possible`, e.g. `0-3`): the number
/// of copies a per-CPU map keeps (1024 if the file cannot be read).
pub fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.trim().parse::<usize>().ok())
                .max()
        })
        .map_or(1024, |m| m + 1)
}

/// Waits up to `timeout_ms` until any of `fds` is readable; whether one is (an interrupted
/// wait is `false`).
pub fn poll_any_readable(fds: &[RawFd], timeout_ms: i32) -> Result<bool, SysError> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `p` holds `p.len()` valid pollfds for the call's duration.
    let ret = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
    match check("poll", ret) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.source.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
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

/// Waits up to `timeout` (nanosecond resolution, unlike `poll`'s milliseconds) for `fd` to
/// become readable; true if it is.
pub fn wait_readable(fd: RawFd, timeout: std::time::Duration) -> Result<bool, SysError> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    let ret = unsafe { libc::ppoll(&mut p, 1, &ts, std::ptr::null()) };
    match check("ppoll", ret) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.source.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// An epoll set watching sockets for input, each with a token. Its own descriptor is readable
/// when any member is, so [`wait_readable`] on it waits for all of them with ns resolution.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Epoll {
    /// An empty set.
    pub fn new() -> Result<Epoll, SysError> {
        // SAFETY: plain epoll_create1 call; the result is checked.
        let raw = check("epoll_create1", unsafe {
            libc::epoll_create1(libc::EPOLL_CLOEXEC)
        })?;
        Ok(Epoll {
            // SAFETY: `raw` is a new descriptor owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 256],
        })
    }

    /// Watches `fd` for input, reporting it as `token`.
    pub fn add(&mut self, fd: &impl AsRawFd, token: u64) -> Result<(), SysError> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: valid descriptors and a valid event struct.
        let ret = unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        };
        check("epoll_ctl(ADD)", ret).map(drop)
    }

    /// Waits up to `timeout` for any member to have input.
    pub fn wait(&self, timeout: std::time::Duration) -> Result<bool, SysError> {
        wait_readable(self.fd.as_raw_fd(), timeout)
    }

    /// The tokens of members with input now (up to 256), without waiting.
    pub fn ready(&mut self, out: &mut Vec<u64>) -> Result<(), SysError> {
        out.clear();
        // SAFETY: `events` has room for the count passed; timeout 0 never blocks.
        let ret = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as libc::c_int,
                0,
            )
        };
        match check("epoll_wait", ret) {
            Ok(n) => {
                out.extend(self.events[..n as usize].iter().map(|e| e.u64));
                Ok(())
            }
            Err(e) if e.source.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every thread and process on this host, so a
/// timestamp written by a sender can be compared by a receiver elsewhere on the machine.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A signal [`signal_process`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT: what Ctrl-C sends; flowlane's roles print their summary and exit.
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGKILL.
    Kill,
    /// SIGHUP.
    Hangup,
    /// SIGSTOP: the process stops (a test's way to make a receiver fall behind).
    Stop,
    /// SIGCONT.
    Continue,
}

/// Sends `sig` to process `pid` (`kill(2)`, not the `kill` program).
pub fn signal_process(pid: u32, sig: Signal) -> Result<(), SysError> {
    let signo = match sig {
        Signal::Interrupt => libc::SIGINT,
        Signal::Terminate => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
        Signal::Hangup => libc::SIGHUP,
        Signal::Stop => libc::SIGSTOP,
        Signal::Continue => libc::SIGCONT,
    };
    let pid = libc::pid_t::try_from(pid).map_err(|_| SysError {
        call: "kill",
        source: io::Error::from_raw_os_error(libc::ESRCH),
    })?;
    // 0 and negative pids name process groups: never what a caller with a child's id means.
    if pid <= 0 {
        return Err(SysError {
            call: "kill",
            source: io::Error::from_raw_os_error(libc::ESRCH),
        });
    }
    // SAFETY: kill takes integers; `pid` is positive, so it names exactly one process.
    check("kill", unsafe { libc::kill(pid, signo) }).map(drop)
}

/// A thread that another may interrupt inside a long system call (`BPF_PROG_TEST_RUN` in
/// live-frames mode runs until its repeat count is spent, minutes at most; a signal ends it
/// early with `EINTR`). The signal is SIGURG with a handler that does nothing and no
/// `SA_RESTART`: SIGURG is ignored by default, so a stray one harms no thread, and only the
/// thread named by [`ThreadHandle::interrupt`] (`tgkill`) is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadHandle {
    pid: libc::pid_t,
    tid: libc::pid_t,
}

extern "C" fn wake_only(_: libc::c_int) {}

impl ThreadHandle {
    /// The calling thread; installs the (process-wide, empty) handler the first time.
    pub fn current() -> Result<ThreadHandle, SysError> {
        static INSTALL: std::sync::OnceLock<Result<(), i32>> = std::sync::OnceLock::new();
        let installed = INSTALL.get_or_init(|| {
            // SAFETY: a zeroed sigaction with an empty mask is valid; the handler is an
            // `extern "C"` function that touches nothing, so it is async-signal-safe.
            unsafe {
                let mut sa: libc::sigaction = zeroed();
                sa.sa_sigaction = wake_only as *const () as usize;
                sa.sa_flags = 0;
                libc::sigemptyset(&mut sa.sa_mask);
                if libc::sigaction(libc::SIGURG, &sa, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
                }
            }
            Ok(())
        });
        if let Err(e) = installed {
            return Err(SysError {
                call: "sigaction(SIGURG)",
                source: io::Error::from_raw_os_error(*e),
            });
        }
        // SAFETY: getpid and gettid take nothing and cannot fail.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        Ok(ThreadHandle { pid, tid })
    }

    /// CPU time the thread has used so far, user and system, in nanoseconds (its per-thread
    /// CPU clock, as `pthread_getcpuclockid` names it: `(!tid << 3) | 6`); `None` once it has
    /// ended.
    pub fn cpu_ns(&self) -> Option<u64> {
        clock_ns((!self.tid) << 3 | 6)
    }

    /// Interrupts the thread's current (or next signal-checking) system call with `EINTR`.
    pub fn interrupt(&self) -> Result<(), SysError> {
        // SAFETY: tgkill takes integers; pid and tid name one live thread of this process
        // (or none, which the kernel reports as ESRCH).
        check("tgkill(SIGURG)", unsafe {
            libc::syscall(libc::SYS_tgkill, self.pid, self.tid, libc::SIGURG) as i32
        })
        .map(drop)
    }
}

/// Blocks SIGPIPE on the calling thread (and the threads it starts). A send on a connection the
/// peer has reset fails with EPIPE and raises SIGPIPE at the sending thread; `sendfile(2)` has no
/// `MSG_NOSIGNAL`, and where the default action is in force (a library caller's process) the
/// signal would end the whole process. Blocked, it stays pending on the thread, harmless, and the call's
/// error is handled like any other.
pub fn block_sigpipe_here() -> Result<(), SysError> {
    // SAFETY: a zeroed sigset_t is a valid set for sigemptyset/sigaddset; pthread_sigmask
    // reads it and writes no old mask (null).
    let ret = unsafe {
        let mut set: libc::sigset_t = zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if ret != 0 {
        return Err(SysError {
            call: "pthread_sigmask",
            source: io::Error::from_raw_os_error(ret),
        });
    }
    Ok(())
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

/// The CPUs the calling thread may run on (`sched_getaffinity`: what `taskset` or a cgroup's
/// cpuset allows), in increasing order.
pub fn allowed_cpus() -> Result<Vec<usize>, SysError> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set for the kernel to fill; its exact size
    // is passed.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: `set` is valid for writes of the size passed.
    let ret = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    check("sched_getaffinity", ret)?;
    // SAFETY: CPU_ISSET reads inside the set for cpu < CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// CPU time the calling thread has used, user and system, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`; a system call, not the vDSO: read it now and then, not per
/// packet).
pub fn thread_cpu_ns() -> Option<u64> {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// `clock_gettime(clock)` in nanoseconds (`None` for a clock that is no more, e.g. the CPU
/// clock of a thread that has ended).
fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; an unknown clock id is an error, no more.
    let ret = unsafe { libc::clock_gettime(clock, &mut ts) };
    (ret == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu has no arguments and no memory effects.
    let c = unsafe { libc::sched_getcpu() };
    (c >= 0).then_some(c as usize)
}

pub use mmsg::*;
