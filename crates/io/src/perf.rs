//! Performance counters of the calling thread (`perf_event_open`, through the kept
//! `perf-event2` crate): cycles, instructions and last-level cache misses per worker, so a
//! report can say what each packet cost in the CPU's own terms. Where the machine has no PMU
//! (most VMs) or the kernel forbids it, opening fails and the reason is given in words; the
//! same code opens software events (task clock, context switches), which is how it is tested
//! on such a machine.

use std::io;

use perf_event::events::{Hardware, Software};
use perf_event::{Builder, Counter, Group};

/// An event a [`ThreadCounters`] can count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmuEvent {
    /// CPU cycles (hardware).
    Cycles,
    /// Instructions retired (hardware).
    Instructions,
    /// Last-level cache misses (hardware, `PERF_COUNT_HW_CACHE_MISSES`).
    LlcMisses,
    /// The thread's CPU time, nanoseconds (software).
    TaskClockNs,
    /// Times the thread was switched out (software).
    ContextSwitches,
}

/// The hardware set a worker counts: cycles, instructions, LLC misses.
pub const HARDWARE: [PmuEvent; 3] = [
    PmuEvent::Cycles,
    PmuEvent::Instructions,
    PmuEvent::LlcMisses,
];

fn builder(e: PmuEvent) -> Builder<'static> {
    match e {
        PmuEvent::Cycles => Builder::new(Hardware::CPU_CYCLES),
        PmuEvent::Instructions => Builder::new(Hardware::INSTRUCTIONS),
        PmuEvent::LlcMisses => Builder::new(Hardware::CACHE_MISSES),
        PmuEvent::TaskClockNs => Builder::new(Software::TASK_CLOCK),
        PmuEvent::ContextSwitches => Builder::new(Software::CONTEXT_SWITCHES),
    }
}

/// Why a counter could not be opened, in words a user can act on.
fn reason(e: &io::Error) -> String {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) => format!(
            "this machine exposes no hardware performance counters (no PMU; usual in a VM): \
             perf_event_open: {e}"
        ),
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "perf_event_open refused ({e}): kernel.perf_event_paranoid is {paranoid}; run as root \
             or with CAP_PERFMON, or lower it"
        ),
        Some(libc::ENOSYS) => "this kernel has no perf_event_open".into(),
        _ => format!("perf_event_open: {e}"),
    }
}

/// Counters on the calling thread, all in one group (read together, over the same time).
pub struct ThreadCounters {
    group: Group,
    counters: Vec<Counter>,
}

impl std::fmt::Debug for ThreadCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ThreadCounters({} events)", self.counters.len())
    }
}

impl ThreadCounters {
    /// Opens `events` on the calling thread (any CPU it runs on) and starts them; the reason
    /// in words when the kernel or the machine refuses.
    pub fn open(events: &[PmuEvent]) -> Result<ThreadCounters, String> {
        let mut group = Group::new().map_err(|e| reason(&e))?;
        let mut counters = Vec::with_capacity(events.len());
        for &e in events {
            counters.push(group.add(&builder(e)).map_err(|err| reason(&err))?);
        }
        group.enable().map_err(|e| reason(&e))?;
        Ok(ThreadCounters { group, counters })
    }

    /// The counts since `open`, in the order the events were given (`None` if the read
    /// failed).
    pub fn read(&mut self) -> Option<Vec<u64>> {
        let data = self.group.read().ok()?;
        self.counters
            .iter()
            .map(|c| data.get(c).map(|v| v.value()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The software events go through the same code as the hardware ones; on a machine with a
    /// PMU the hardware set opens too, and on one without, it says why.
    #[test]
    fn software_events_count_the_thread_and_hardware_ones_open_or_say_why() {
        let mut c = match ThreadCounters::open(&[PmuEvent::TaskClockNs, PmuEvent::ContextSwitches])
        {
            Ok(c) => c,
            Err(why) => {
                // A kernel that forbids even software events to this user.
                assert!(why.contains("perf_event"), "{why}");
                eprintln!("SKIP: {why}");
                return;
            }
        };
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let v = c.read().expect("read");
        // Busy for 50 ms of wall time: the task clock saw most of it (a loaded machine may
        // take some away), and never more than the wall time.
        assert!(
            v[0] > 5_000_000 && v[0] <= t0.elapsed().as_nanos() as u64 + 1_000_000,
            "{v:?}"
        );
        match ThreadCounters::open(&HARDWARE) {
            Ok(mut h) => {
                let v = h.read().expect("read");
                assert!(v[1] > 0, "instructions counted: {v:?}");
            }
            Err(why) => {
                eprintln!("hardware counters: {why}");
                assert!(why.contains("perf_event"), "{why}");
            }
        }
    }
}
