//! `bench`: the RSS scaling experiment. For k = 1, 2, … active RSS buckets, a server with one
//! pinned worker per CPU (the [`serve`](crate::serve) role, in the lab's DUT namespace) and a
//! client whose flows the picker placed on buckets 0..k-1 (the [`blast`](crate::blast) role,
//! in the generator namespace) run side by side, in this process; each step joins their typed
//! reports with interface, software-RSS queue and /proc/stat counters into the five numbers
//! and checks that everything adds up. [`run`] returns the [`BenchReport`].

mod config;
mod report;
pub use config::{BenchConfig, BenchFragments, BenchMode, BenchTarget, ServeSteering};
mod step;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use flowlane_lab::setup::{self, LabConfig, LAB_DUT_V4};
use flowlane_lab::Netns;

pub use report::{
    BenchReport, BenchStep, BenchWorker, Five, Host, KernelCpu, LabInfo, Pps, StepFragments, SCHEMA,
};

use crate::doctor::RunDev;
use crate::{Cause, ToolError};

/// What a run tells while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum BenchEvent {
    /// The lab was brought up for this run (`false`: one already up is used as it is).
    Lab {
        /// Its settings.
        config: Box<LabConfig>,
        /// Made now.
        created: bool,
    },
    /// The steps begin.
    Started {
        /// Steps lo..=hi.
        buckets: (u32, u32),
        /// Server workers.
        workers: usize,
        /// The host's conditions for the run (`doctor`'s rules), as the report carries them.
        checks: Box<crate::doctor::DoctorReport>,
    },
    /// The server's port was taken before it could bind it: the step runs on another.
    PortMoved {
        /// The port that was taken.
        from: String,
        /// The one used now.
        to: String,
    },
    /// A step is done.
    Step(Box<BenchStep>),
}

/// Runs every step. Errors before the first step are the configuration's (usage) or a lab
/// that could not be built (runtime); a step that cannot run ends the run with its error.
///
/// Long: the lab made or checked, the placement, then the steps in order with each one's
/// failure handled where it happens.
pub fn run(
    a: &BenchConfig,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(BenchEvent),
) -> Result<BenchReport, ToolError> {
    if !(a.step_secs > 0.0 && a.step_secs <= 3600.0) {
        return Err(ToolError::usage(
            "the step must last between 0 and 3600 seconds",
        ));
    }
    if !(60..=1514).contains(&a.frame_bytes) {
        return Err(ToolError::usage("frames of 60 to 1514 bytes"));
    }
    if a.cpus.is_empty() {
        return Err(ToolError::usage("no CPU for the server's workers"));
    }
    let ncpus = a.cpus.len() as u32;
    let mut guard = LabGuard { name: None };
    let mut target = match &a.target {
        BenchTarget::Loopback { key } => step::Target {
            lab: None,
            to: format!("127.0.0.1:{}", free_loopback_port()?),
            cpus: a.cpus.clone(),
            buckets: a.buckets.map_or(ncpus, |b| b.1),
            key: key.clone(),
            symmetric: flowlane_rss::Symmetric::Off,
        },
        BenchTarget::Lab { config, keep } => {
            setup::check_name(&config.name).map_err(|e| ToolError::usage(e.to_string()))?;
            if !flowlane_lab::can_create_namespaces() {
                return Err(ToolError::privilege(
                    "bench builds a lab in network namespaces and needs root (CAP_SYS_ADMIN and \
                     CAP_NET_ADMIN): run it with sudo — or the loopback variant on 127.0.0.1 \
                     (no interfaces or steering: not RSS-faithful)",
                ));
            }
            let up = setup::saved(&config.name).filter(|_| {
                setup::status(&config.name)
                    .map(|s| s.namespaces.iter().all(|n| n.1))
                    .unwrap_or(false)
            });
            let cfg = match up {
                Some(c) => {
                    on_event(BenchEvent::Lab {
                        config: Box::new(c.clone()),
                        created: false,
                    });
                    c
                }
                None => {
                    let c = config.clone();
                    setup::up(&c).map_err(lab_err)?;
                    if !keep {
                        guard.name = Some(c.name.clone());
                    }
                    on_event(BenchEvent::Lab {
                        config: Box::new(c.clone()),
                        created: true,
                    });
                    c
                }
            };
            if let Some((_, hi)) = a.buckets {
                if hi > cfg.queues {
                    return Err(ToolError::usage(format!(
                        "lab {} has {} buckets; {hi} are asked for (take it down, or ask for \
                         fewer)",
                        cfg.name, cfg.queues
                    )));
                }
            }
            // Software RSS hands each bucket to its CPU: a worker must be able to run there.
            if let Some(&c) = cfg
                .queue_cpus
                .iter()
                .find(|&&c| !a.cpus.contains(&(c as usize)))
            {
                return Err(ToolError::usage(format!(
                    "lab {} steers a bucket to CPU {c}, which this process may not use (usable \
                     CPUs: {}); run bench without a CPU restriction",
                    cfg.name,
                    flowlane_runtime::cpus::format_cpu_list(&a.cpus)
                )));
            }
            step::Target {
                to: format!("{LAB_DUT_V4}:9000"),
                cpus: a.cpus.clone(),
                buckets: cfg.queues,
                key: cfg.key.clone(),
                symmetric: cfg.symmetric,
                lab: Some((
                    Netns::existing(&cfg.gen_ns()),
                    Netns::existing(&cfg.dut_ns()),
                    cfg,
                )),
            }
        }
    };
    let (lo, hi) = a.buckets.unwrap_or((1, target.buckets));
    if lo == 0 || lo > hi {
        return Err(ToolError::usage(
            "buckets: a range lo..hi with 1 <= lo <= hi",
        ));
    }
    if let Some(f) = &a.fragments {
        if target.lab.is_none() {
            return Err(ToolError::usage(
                "--fragment-share needs a lab: loopback's MTU of 65 536 fragments nothing",
            ));
        }
        if !(0.0..=1.0).contains(&f.share) {
            return Err(ToolError::usage("--fragment-share is 0 to 100 %"));
        }
    }
    let steerings: &[bool] = match a.serve_steering {
        ServeSteering::Cpu => &[false],
        ServeSteering::Hash => &[true],
        ServeSteering::Both => &[false, true],
    };
    if a.serve_steering != ServeSteering::Cpu {
        if target.symmetric != flowlane_rss::Symmetric::Off {
            return Err(ToolError::usage(
                "the server's hash steering follows the plain Toeplitz hash: a lab with \
                 symmetric hashing places flows by another",
            ));
        }
        if let Some((_, _, c)) = &target.lab {
            if !c.ports || c.reta.len() > flowlane_io::udp::HASH_STEERING_MAX_BUCKETS {
                return Err(ToolError::usage(format!(
                    "the server's hash steering takes a lab hashing the 4-tuple with at most {} \
                     table entries (lab {}: {}, {} entries)",
                    flowlane_io::udp::HASH_STEERING_MAX_BUCKETS,
                    c.name,
                    if c.ports { "4-tuple" } else { "2-tuple" },
                    c.reta.len()
                )));
            }
        }
    }
    let modes: &[bool] = match a.mode {
        BenchMode::Echo => &[true],
        BenchMode::Sink => &[false],
        BenchMode::Both => &[false, true],
    };
    // The host's conditions, once the lab's interfaces exist; nothing is changed.
    let devs: Vec<RunDev> = match &target.lab {
        Some((_, _, c)) => vec![
            RunDev::in_ns(setup::GEN_IF, &c.gen_ns()),
            RunDev::in_ns(setup::DUT_IF, &c.dut_ns()),
        ],
        None => Vec::new(),
    };
    let checks = crate::doctor::for_run(&a.cpus, &devs);
    on_event(BenchEvent::Started {
        buckets: (lo, hi),
        workers: a.cpus.len(),
        checks: Box::new(checks.clone()),
    });
    let mut steps: Vec<BenchStep> = Vec::new();
    let runs: Vec<(bool, bool)> = modes
        .iter()
        .flat_map(|&echo| steerings.iter().map(move |&hash| (echo, hash)))
        .collect();
    'outer: for k in lo..=hi {
        for &(echo, hash) in &runs {
            if stop.load(Ordering::Relaxed) {
                break 'outer;
            }
            let s = if target.lab.is_none() {
                // The port was free when picked, but another program can take it before the
                // step's server binds it: then the step runs again on a new one.
                let mut to = target.to.clone();
                let r = with_free_port(
                    &mut to,
                    |to| {
                        let t = step::Target {
                            lab: None,
                            to: to.to_string(),
                            cpus: target.cpus.clone(),
                            buckets: target.buckets,
                            key: target.key.clone(),
                            symmetric: target.symmetric,
                        };
                        step::step(a, &t, k, (echo, hash), stop)
                    },
                    free_loopback_port,
                    &mut |from, to| {
                        on_event(BenchEvent::PortMoved {
                            from: from.to_string(),
                            to: to.to_string(),
                        })
                    },
                )?;
                target.to = to;
                r
            } else {
                step::step(a, &target, k, (echo, hash), stop)?
            };
            let mut s = s;
            s.scaling_efficiency = steps
                .iter()
                .find(|b| b.buckets == 1 && b.mode == s.mode && b.steering == s.steering)
                .or(Some(&s).filter(|s| s.buckets == 1))
                .filter(|one| one.pps.server_seen > 0)
                .map(|one| {
                    let e = s.pps.server_seen as f64
                        / (f64::from(s.buckets) * one.pps.server_seen as f64);
                    (e * 1000.0).round() / 1000.0
                });
            on_event(BenchEvent::Step(Box::new(s.clone())));
            steps.push(s);
        }
    }
    drop(guard);
    let problems = steps.iter().flat_map(|s| s.problems.clone()).collect();
    Ok(BenchReport {
        schema: SCHEMA.into(),
        flowlane_version: env!("CARGO_PKG_VERSION").into(),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        host: Host {
            cpus: ncpus,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            checks: Some(checks),
        },
        rss_faithful: target.lab.is_some(),
        lab: target.lab.as_ref().map(|(_, _, c)| LabInfo {
            name: c.name.clone(),
            queues: c.queues,
            steer: c.steer.name().into(),
            key: c.key.clone(),
            reta_size: c.reta.len(),
            hash: if c.ports { "4-tuple" } else { "2-tuple" }.into(),
            symmetric: c.symmetric.name().into(),
        }),
        frame_bytes: a.frame_bytes,
        step_secs: a.step_secs,
        per_bucket: a.per_bucket,
        steps,
        problems,
        interrupted: stop.load(Ordering::Relaxed),
    })
}

fn lab_err(e: flowlane_lab::LabError) -> ToolError {
    ToolError::runtime(e.to_string())
}

/// Takes a lab this run made down again, however the run ends.
struct LabGuard {
    name: Option<String>,
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if let Some(n) = self.name.take() {
            if let Err(e) = setup::down(&n) {
                // Not `eprintln!`: a failed write to stderr must not panic in a drop.
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "flowlane: taking the lab down: {e}");
            }
        }
    }
}

/// A UDP port on 127.0.0.1 that is free now (the kernel's pick for port 0).
fn free_loopback_port() -> Result<u16, ToolError> {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|e| ToolError::runtime(format!("no free UDP port on 127.0.0.1: {e}")))
}

/// Runs `attempt` on the server address `to` (`127.0.0.1:PORT`); when its server could not
/// bind because another program took the port meanwhile, moves `to` to a port `pick` finds
/// free (telling `moved`) and tries again, at most three times in all.
fn with_free_port<T>(
    to: &mut String,
    mut attempt: impl FnMut(&str) -> Result<T, ToolError>,
    mut pick: impl FnMut() -> Result<u16, ToolError>,
    moved: &mut dyn FnMut(&str, &str),
) -> Result<T, ToolError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt(to) {
            Err(e) if tries < 3 && matches!(e.cause, Some(Cause::AddrInUse(_))) => {
                let next = format!("127.0.0.1:{}", pick()?);
                moved(to, &next);
                *to = next;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a step fails when its server finds the port taken: serve's own error for it.
    fn busy(to: &str) -> ToolError {
        let addr = to.parse().expect("test input is valid");
        ToolError::usage(flowlane_io::udp::GroupError::AddrInUse(addr).to_string())
            .because(Cause::AddrInUse(addr))
    }

    #[test]
    fn a_step_whose_port_was_taken_runs_again_on_a_new_one() {
        let mut to = "127.0.0.1:5000".to_string();
        let mut seen = Vec::new();
        let mut ports = [5001u16, 5002].into_iter();
        let mut moves = 0;
        let r = with_free_port(
            &mut to,
            |t| {
                seen.push(t.to_string());
                if seen.len() < 3 {
                    Err(busy(t))
                } else {
                    Ok(7)
                }
            },
            || Ok(ports.next().expect("two picks at most")),
            &mut |_, _| moves += 1,
        );
        assert_eq!(r.ok(), Some(7));
        assert_eq!(moves, 2);
        assert_eq!(seen, ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]);
        assert_eq!(
            to, "127.0.0.1:5002",
            "later steps keep the port that worked"
        );
    }

    #[test]
    fn three_taken_ports_or_another_failure_end_the_run() {
        let mut to = "127.0.0.1:5000".to_string();
        let mut n = 0;
        let mut next = 6000u16;
        let r: Result<(), ToolError> = with_free_port(
            &mut to,
            |t| {
                n += 1;
                Err(busy(t))
            },
            || {
                next += 1;
                Ok(next)
            },
            &mut |_, _| {},
        );
        assert_eq!(n, 3);
        assert_eq!(to, "127.0.0.1:6002");
        assert!(r.expect_err("fails").message.contains("already in use"));

        let mut calls = 0;
        let r: Result<(), ToolError> = with_free_port(
            &mut to,
            |_| {
                calls += 1;
                Err(ToolError::runtime("blast failed in step 1"))
            },
            || panic!("no new port for other failures"),
            &mut |_, _| {},
        );
        assert_eq!(calls, 1);
        assert!(r.is_err());
    }
}
