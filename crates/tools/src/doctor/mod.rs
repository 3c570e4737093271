//! `flowlane doctor`: read-only rules about the host that would distort a packet-rate or
//! latency figure, each with a stable id, a verdict, the value seen, why it matters and the
//! command that fixes it. The host is read through a root path (`/` live; a recorded tree of
//! `/sys` and `/proc` in tests); interfaces through `tools::nic` (live only). Nothing is
//! changed.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::nic::NicReport;

mod cpu;
mod isolation;
mod net;
mod nic;

pub use isolation::{cpu_isolation, runnable_others, CpuIsolation};

use cpu::{boost, cstates, dma_latency, governor, irqbalance, isolation, preemption, smt};
use net::{busy_poll, clocksource, conntrack, sysctl, thp, vm};

/// A rule's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// Nothing to fix.
    Pass,
    /// It may distort a figure: read the why.
    Warn,
    /// It distorts figures: fix it before measuring.
    Fail,
    /// Could not be checked here (the value is not exposed), said why.
    Skip,
}

/// One rule's finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Finding {
    /// Stable id (`cpu.governor`, `nic.rings`, …).
    pub id: String,
    /// What it was checked for (a CPU list, an interface), if not the whole host.
    pub subject: Option<String>,
    /// The verdict.
    pub verdict: Verdict,
    /// The value seen.
    pub seen: String,
    /// Why it matters to a measurement, in one sentence.
    pub why: String,
    /// The command that fixes it (for WARN and FAIL).
    pub fix: Option<String>,
}

/// How many findings of each verdict.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Counts {
    pub pass: usize,
    pub warn: usize,
    pub fail: usize,
    pub skip: usize,
}

/// What `doctor` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DoctorReport {
    /// The root the host was read through.
    pub root: String,
    /// The measurement CPUs the rules were checked for.
    pub cpus: Vec<usize>,
    /// The interfaces checked.
    pub devs: Vec<String>,
    /// Every rule's finding, in a stable order.
    pub findings: Vec<Finding>,
    /// The tally.
    pub counts: Counts,
    /// How long the checks took, milliseconds.
    pub took_ms: f64,
}

impl DoctorReport {
    /// Whether any rule failed (exit 1).
    pub fn failed(&self) -> bool {
        self.counts.fail > 0
    }
}

/// The host's files under a root.
struct Host {
    root: PathBuf,
}

impl Host {
    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel.trim_start_matches('/')))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn bytes(&self, rel: &str) -> Option<Vec<u8>> {
        use std::io::Read;
        // A device file (cpu_dma_latency) is read once, a few bytes, never to its end.
        let mut f = std::fs::File::open(self.root.join(rel.trim_start_matches('/'))).ok()?;
        let mut b = [0u8; 8];
        let n = f.read(&mut b).ok()?;
        Some(b[..n].to_vec())
    }

    fn cpu(&self, cpu: usize, rel: &str) -> Option<String> {
        self.read(&format!("sys/devices/system/cpu/cpu{cpu}/{rel}"))
    }
}

fn finding(
    id: &str,
    subject: Option<String>,
    verdict: Verdict,
    seen: String,
    why: &str,
    fix: Option<String>,
) -> Finding {
    Finding {
        id: id.into(),
        subject,
        verdict,
        seen,
        why: why.into(),
        fix: if matches!(verdict, Verdict::Warn | Verdict::Fail) {
            fix
        } else {
            None
        },
    }
}

fn list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// A CPU list as the kernel writes it (`0-3,8`).
fn parse_list(s: &str) -> Vec<usize> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            if a <= b && b < 8192 {
                v.extend(a..=b);
            }
        }
    }
    v
}

/// An interface a run uses, and the network namespace it is in (`ip netns` name; none:
/// the caller's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDev {
    /// The interface.
    pub dev: String,
    /// Its namespace.
    pub netns: Option<String>,
}

impl RunDev {
    /// An interface in the caller's namespace.
    pub fn here(dev: &str) -> RunDev {
        RunDev {
            dev: dev.into(),
            netns: None,
        }
    }

    /// An interface in namespace `netns`.
    pub fn in_ns(dev: &str, netns: &str) -> RunDev {
        RunDev {
            dev: dev.into(),
            netns: Some(netns.into()),
        }
    }
}

/// The host's conditions for a run on `cpus` over `devs`, read live: every host rule, the
/// CPUs' and each interface's (read inside its namespace). An interface that cannot be read
/// is one SKIP finding saying why; nothing is changed. What `bench`, `blast`, `serve`,
/// `sink`, `forward`, `rfc2544` and `http` carry as their report's `host`.
pub fn for_run(cpus: &[usize], devs: &[RunDev]) -> DoctorReport {
    let t0 = Instant::now();
    let mut nics = Vec::new();
    let mut unread = Vec::new();
    for d in devs {
        let read = match &d.netns {
            None => crate::nic::read(&d.dev),
            Some(n) => flowlane_lab::Netns::existing(n)
                .run_with_sys(|| crate::nic::read(&d.dev))
                .unwrap_or_else(|e| {
                    Err(crate::ToolError::runtime(format!(
                        "entering namespace {n}: {e}"
                    )))
                }),
        };
        match read {
            Ok(r) => nics.push(r),
            Err(e) => unread.push(finding(
                "nic.read",
                Some(d.dev.clone()),
                Verdict::Skip,
                e.to_string(),
                "an interface that cannot be read cannot be checked",
                None,
            )),
        }
    }
    let mut r = check(Path::new("/"), cpus, &nics);
    r.counts.skip += unread.len();
    r.findings.extend(unread);
    r.devs = devs.iter().map(|d| d.dev.clone()).collect();
    r.took_ms = t0.elapsed().as_secs_f64() * 1e3;
    r
}

impl DoctorReport {
    /// One line naming every WARN and FAIL (`None` when there is none), for before a run.
    pub fn line(&self) -> Option<String> {
        let bad: Vec<String> = self
            .findings
            .iter()
            .filter(|f| matches!(f.verdict, Verdict::Warn | Verdict::Fail))
            .map(|f| {
                format!(
                    "{} {}{}",
                    if f.verdict == Verdict::Fail {
                        "FAIL"
                    } else {
                        "WARN"
                    },
                    f.id,
                    f.subject
                        .as_deref()
                        .map_or(String::new(), |s| format!(" [{s}]"))
                )
            })
            .collect();
        (!bad.is_empty()).then(|| {
            format!(
                "host: {} (the report's `host` has the values; `flowlane doctor` says why and \
                 how to fix)",
                bad.join(", ")
            )
        })
    }
}

/// Runs every rule for the measurement `cpus` and interfaces `nics` on the host under `root`.
pub fn check(root: &Path, cpus: &[usize], nics: &[NicReport]) -> DoctorReport {
    let t0 = Instant::now();
    let h = Host {
        root: root.to_path_buf(),
    };
    let mut f = vec![
        governor(&h, cpus),
        boost(&h),
        cstates(&h, cpus),
        dma_latency(&h, cpus),
        smt(&h, cpus),
        isolation(&h, cpus),
        irqbalance(&h),
        sysctl(
            &h,
            "net.backlog",
            "net.core.netdev_max_backlog",
            10_000,
            "a backlog shorter than a burst drops packets at the CPU queue RPS and veth use, \
             before any socket sees them",
        ),
        sysctl(
            &h,
            "net.budget",
            "net.core.netdev_budget",
            300,
            "a smaller softirq budget ends receive polls early (time_squeeze), and the next \
             poll waits for another interrupt",
        ),
        sysctl(
            &h,
            "net.rmem_max",
            "net.core.rmem_max",
            8 << 20,
            "serve and blast ask 8 MiB a socket; without root they get at most this, and a \
             short burst then overflows the socket",
        ),
        sysctl(
            &h,
            "net.wmem_max",
            "net.core.wmem_max",
            8 << 20,
            "blast asks 8 MiB a socket; without root it gets at most this",
        ),
        busy_poll(&h),
        thp(&h),
        vm(&h),
        clocksource(&h),
        conntrack(&h),
        net::firewall(&h),
        preemption(&h),
    ];
    for n in nics {
        nic::nic_rules(&h, n, cpus, &mut f);
    }
    let mut counts = Counts::default();
    for x in &f {
        match x.verdict {
            Verdict::Pass => counts.pass += 1,
            Verdict::Warn => counts.warn += 1,
            Verdict::Fail => counts.fail += 1,
            Verdict::Skip => counts.skip += 1,
        }
    }
    DoctorReport {
        root: root.display().to_string(),
        cpus: cpus.to_vec(),
        devs: nics.iter().map(|n| n.dev.clone()).collect(),
        findings: f,
        counts,
        took_ms: t0.elapsed().as_secs_f64() * 1e3,
    }
}

#[cfg(test)]
mod tests;
