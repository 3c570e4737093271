//! The host's conditions around a run: `doctor`'s rules for the run's CPUs and interfaces,
//! read before it starts (one line after the run's banner names any WARN or FAIL) and
//! carried in its report's `host`. Read here, by the caller, not inside the roles: a library
//! caller of a role decides whether to spend the few milliseconds. Nothing is changed.

use flowlane_tools::doctor::{self, DoctorReport, RunDev};

use crate::live::Log;

/// Reads the conditions for a run on `cpus` over `devs`.
pub fn before_run(cpus: &[usize], devs: &[RunDev]) -> DoctorReport {
    doctor::for_run(cpus, devs)
}

/// The line naming any WARN or FAIL, where the run's other lines go (after its banner).
pub fn say(log: &mut Log, host: &DoctorReport) {
    if let Some(line) = host.line() {
        log.line(&line);
    }
}
