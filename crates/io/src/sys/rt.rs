//! Real-time scheduling for measurement threads: SCHED_FIFO, locked memory, and sleeping until
//! an absolute CLOCK_MONOTONIC time (what cyclictest does with `-p`, `-m` and its default
//! absolute timer mode).

use super::{check, SysError};

/// Runs the calling thread under SCHED_FIFO at `priority` (1–99), or back under SCHED_OTHER
/// with 0. Needs CAP_SYS_NICE (or an RLIMIT_RTPRIO that allows it) for a real-time priority.
pub fn set_fifo_priority(priority: i32) -> Result<(), SysError> {
    let (policy, prio) = if priority > 0 {
        (libc::SCHED_FIFO, priority)
    } else {
        (libc::SCHED_OTHER, 0)
    };
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param read by the call.
    check("sched_setscheduler", unsafe {
        libc::sched_setscheduler(0, policy, &param)
    })
    .map(drop)
}

/// The calling thread's scheduling policy and priority (`SCHED_FIFO`, 99), as the kernel
/// has them now.
pub fn fifo_priority() -> Result<Option<i32>, SysError> {
    // SAFETY: pid 0 is the calling thread; no pointer is passed.
    let policy = unsafe { libc::sched_getscheduler(0) };
    check("sched_getscheduler", policy)?;
    if policy != libc::SCHED_FIFO {
        return Ok(None);
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param to write.
    check("sched_getparam", unsafe {
        libc::sched_getparam(0, &mut param)
    })?;
    Ok(Some(param.sched_priority))
}

/// The calling thread's id (`gettid`), as cgroup `tasks` files take it.
pub fn thread_id() -> u32 {
    // SAFETY: gettid takes nothing and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Locks the process's memory, now and from now on (`mlockall(MCL_CURRENT | MCL_FUTURE)`), so
/// no page fault lands in a measured wake-up.
pub fn lock_memory() -> Result<(), SysError> {
    // SAFETY: mlockall takes flags only.
    check("mlockall", unsafe {
        libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE)
    })
    .map(drop)
}

/// A PM QoS request on `/dev/cpu_dma_latency`: while it is held, no CPU enters an idle state
/// whose exit takes longer than its value (0: none deeper than polling). cyclictest makes
/// one of 0 µs by default; dropping the guard withdraws it.
#[derive(Debug)]
pub struct DmaLatency {
    _file: std::fs::File,
    /// The value asked for, microseconds.
    pub us: i32,
}

/// Asks for idle states of at most `us` µs exit latency until the guard is dropped (needs
/// root: the device is writable by root only).
pub fn hold_cpu_dma_latency(us: i32) -> std::io::Result<DmaLatency> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")?;
    // The kernel takes a binary s32 (or its hex text); binary is what cyclictest writes.
    f.write_all(&us.to_ne_bytes())?;
    Ok(DmaLatency { _file: f, us })
}

/// Sleeps until CLOCK_MONOTONIC reads `deadline_ns` (clock_nanosleep with TIMER_ABSTIME; a
/// signal does not cut it short: the sleep resumes to the same deadline).
pub fn sleep_until_ns(deadline_ns: u64) {
    clock_sleep_until(libc::CLOCK_MONOTONIC, deadline_ns);
}

/// `clock_nanosleep` on `clock` until it reads `deadline_ns` (TIMER_ABSTIME), resumed after a
/// signal.
fn clock_sleep_until(clock: libc::clockid_t, deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be null with
        // TIMER_ABSTIME.
        let r =
            unsafe { libc::clock_nanosleep(clock, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        if r != libc::EINTR {
            return;
        }
    }
}

/// What the kernel says of the wall clock (`adjtimex` read-only): whether NTP (or PTP through
/// chrony/ptp4l) keeps it synchronized, and its own bounds on the error, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallClock {
    /// `STA_UNSYNC` is clear: a time daemon disciplines the clock.
    pub synchronized: bool,
    /// The kernel's maximum error, microseconds (grows while unsynchronized).
    pub max_error_us: i64,
    /// The estimated error, microseconds.
    pub est_error_us: i64,
}

/// The wall clock's synchronization state (`adjtimex` with no mode bits: it only reads).
pub fn wall_clock() -> Result<WallClock, SysError> {
    // SAFETY: an all-zero timex is a valid value of the C struct (integers only).
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `tx` is a valid, writable timex; modes 0 asks for nothing to be set.
    let state = check("adjtimex", unsafe { libc::adjtimex(&mut tx) })?;
    Ok(WallClock {
        synchronized: state != libc::TIME_ERROR && tx.status & libc::STA_UNSYNC == 0,
        max_error_us: tx.maxerror as i64,
        est_error_us: tx.esterror as i64,
    })
}

/// CLOCK_REALTIME now, nanoseconds since the Unix epoch.
pub fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Sleeps until CLOCK_REALTIME reads `deadline_ns` or `max_ns` passed, whichever is first
/// (clock_nanosleep with TIMER_ABSTIME on the wall clock: a clock step moves the wake with
/// it, as a start agreed in wall-clock time should). Returns whether the deadline was reached.
pub fn sleep_until_realtime_ns(deadline_ns: u64, max_ns: u64) -> bool {
    let now = realtime_ns();
    if now >= deadline_ns {
        return true;
    }
    if deadline_ns - now > max_ns {
        let mono = super::monotonic_ns().saturating_add(max_ns);
        sleep_until_ns(mono);
        return realtime_ns() >= deadline_ns;
    }
    clock_sleep_until(libc::CLOCK_REALTIME, deadline_ns);
    realtime_ns() >= deadline_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wall_clock_can_be_read_and_slept_on() {
        let c = wall_clock().expect("adjtimex reads");
        assert!(c.max_error_us >= 0 && c.est_error_us >= 0, "{c:?}");
        let t = realtime_ns() + 3_000_000;
        assert!(sleep_until_realtime_ns(t, 1_000_000_000));
        assert!(realtime_ns() >= t);
        // A deadline beyond the most one call may sleep returns not reached.
        assert!(!sleep_until_realtime_ns(
            realtime_ns() + 60_000_000_000,
            1_000_000
        ));
    }

    #[test]
    fn an_absolute_sleep_ends_at_its_deadline_not_before() {
        let start = super::super::monotonic_ns();
        let deadline = start + 2_000_000;
        sleep_until_ns(deadline);
        assert!(super::super::monotonic_ns() >= deadline);
        // A deadline already past returns at once.
        sleep_until_ns(start);
    }

    #[test]
    fn a_thread_goes_real_time_and_back_where_it_may() {
        let t = std::thread::spawn(|| match set_fifo_priority(10) {
            Ok(()) => {
                assert_eq!(fifo_priority().expect("policy"), Some(10));
                set_fifo_priority(0).expect("back to SCHED_OTHER");
                assert_eq!(fifo_priority().expect("policy"), None);
            }
            // Without CAP_SYS_NICE the kernel refuses, and says so.
            Err(e) => assert_eq!(e.source.raw_os_error(), Some(libc::EPERM), "{e}"),
        });
        t.join().expect("thread");
    }
}
