//! Which CPUs a role may use: the ones that are online *and* allowed to this process. One check
//! for every role, with a message that says which of the two a refused CPU failed.
//!
//! `std::thread::available_parallelism` counts the allowed CPUs, not their numbers: under
//! `taskset -c 1` it is 1, and treating that as "CPUs 0-0" refuses the one CPU that may run.

use std::fmt;

/// The CPUs of this machine as the kernel and this process see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSet {
    /// Online CPUs (`/sys/devices/system/cpu/online`).
    pub online: Vec<usize>,
    /// CPUs this process may run on (its affinity mask).
    pub allowed: Vec<usize>,
}

/// A CPU a role was asked to use but cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuError {
    /// The CPU is not online (or does not exist).
    NotOnline {
        /// The CPU asked for.
        cpu: usize,
        /// The online CPUs, as a list (`0-3`).
        online: String,
    },
    /// Online, but this process may not run there (taskset, a cgroup cpuset).
    NotAllowed {
        /// The CPU asked for.
        cpu: usize,
        /// The CPUs this process may use, as a list.
        allowed: String,
    },
    /// No CPU was asked for.
    Empty,
}

impl fmt::Display for CpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuError::NotOnline { cpu, online } => {
                write!(f, "CPU {cpu} is not online (online CPUs: {online})")
            }
            CpuError::NotAllowed { cpu, allowed } => write!(
                f,
                "CPU {cpu} is online but this process may not run there (allowed CPUs: \
                 {allowed}; see taskset or the cgroup's cpuset)"
            ),
            CpuError::Empty => write!(f, "no CPU given"),
        }
    }
}

impl std::error::Error for CpuError {}

impl CpuSet {
    /// Reads both sets from the system. Where `/sys` is not readable the online set is taken
    /// to be every allowed CPU.
    pub fn current() -> CpuSet {
        let allowed = flowlane_io::os::allowed_cpus().unwrap_or_default();
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|t| parse_cpu_list(t.trim()).ok())
            .unwrap_or_else(|| allowed.clone());
        let allowed = if allowed.is_empty() {
            online.clone()
        } else {
            allowed
        };
        CpuSet { online, allowed }
    }

    /// The CPUs a role may use: online and allowed, in increasing order.
    pub fn usable(&self) -> Vec<usize> {
        self.allowed
            .iter()
            .copied()
            .filter(|c| self.online.contains(c))
            .collect()
    }

    /// Checks every CPU of `cpus`: online first, then allowed.
    pub fn check(&self, cpus: &[usize]) -> Result<(), CpuError> {
        if cpus.is_empty() {
            return Err(CpuError::Empty);
        }
        for &cpu in cpus {
            if !self.online.contains(&cpu) {
                return Err(CpuError::NotOnline {
                    cpu,
                    online: format_cpu_list(&self.online),
                });
            }
            if !self.allowed.contains(&cpu) {
                return Err(CpuError::NotAllowed {
                    cpu,
                    allowed: format_cpu_list(&self.allowed),
                });
            }
        }
        Ok(())
    }
}

/// Why a CPU list was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuListError {
    /// Not in the kernel's form: a part that is no number or range, a backward range, or a
    /// CPU of 4096 and above. Holds the list as given.
    Malformed(String),
    /// A CPU given twice.
    Twice {
        /// The CPU.
        cpu: usize,
        /// The list as given.
        list: String,
    },
}

impl fmt::Display for CpuListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpuListError::Malformed(s) => write!(f, "`{s}` is not a CPU list like `0,2-3`"),
            CpuListError::Twice { cpu, list } => write!(f, "CPU {cpu} appears twice in `{list}`"),
        }
    }
}

impl std::error::Error for CpuListError {}

/// Parses a CPU list as the kernel and taskset write it: `0-3,8,10-11`. Refuses duplicates,
/// backward ranges and CPUs of 4096 and above.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, CpuListError> {
    let bad = || CpuListError::Malformed(s.to_string());
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let a: usize = a.trim().parse().map_err(|_| bad())?;
        let b: usize = b.trim().parse().map_err(|_| bad())?;
        if a > b || b >= 4096 {
            return Err(bad());
        }
        for c in a..=b {
            if out.contains(&c) {
                return Err(CpuListError::Twice {
                    cpu: c,
                    list: s.to_string(),
                });
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// Writes a CPU list compactly: `[0, 1, 2, 5]` → `0-2,5`.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut v = cpus.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(online: &[usize], allowed: &[usize]) -> CpuSet {
        CpuSet {
            online: online.to_vec(),
            allowed: allowed.to_vec(),
        }
    }

    #[test]
    fn the_one_allowed_cpu_of_a_taskset_is_accepted() {
        // `taskset -c 1` on a 2-CPU machine: CPU 1 may run, CPU 0 may not.
        let s = set(&[0, 1], &[1]);
        assert_eq!(s.check(&[1]), Ok(()));
        assert_eq!(s.usable(), vec![1]);
        let e = s.check(&[0]).expect_err("not allowed");
        assert_eq!(
            e,
            CpuError::NotAllowed {
                cpu: 0,
                allowed: "1".into()
            }
        );
        assert!(e.to_string().contains("online but"), "{e}");
    }

    #[test]
    fn a_cpu_that_is_not_online_says_so() {
        let s = set(&[0, 1], &[0, 1]);
        let e = s.check(&[0, 7]).expect_err("offline");
        assert_eq!(
            e,
            CpuError::NotOnline {
                cpu: 7,
                online: "0-1".into()
            }
        );
        assert_eq!(s.check(&[]), Err(CpuError::Empty));
    }

    #[test]
    fn lists_round_trip() {
        assert_eq!(parse_cpu_list("0-2,5"), Ok(vec![0, 1, 2, 5]));
        assert_eq!(format_cpu_list(&[5, 0, 1, 2]), "0-2,5");
        assert_eq!(format_cpu_list(&[]), "none");
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("0,0").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("4096").is_err());
    }

    #[test]
    fn this_process_can_use_the_cpu_it_runs_on() {
        let s = CpuSet::current();
        let here = flowlane_io::os::current_cpu().expect("sched_getcpu");
        assert!(s.usable().contains(&here), "{s:?} {here}");
        assert_eq!(s.check(&[here]), Ok(()));
    }
}
