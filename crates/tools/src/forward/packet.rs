//! The AF_PACKET reflector: one pinned worker per CPU, each with a receive ring in one fanout
//! group (by CPU) and a transmit ring, in the runtime's budgeted poll loop.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use flowlane_io::{frame, netdev, SysError};
use flowlane_runtime::forward::{ForwardSnapshot, ReflectWorker};
use flowlane_runtime::{Config, Runtime, StartError, StopRule};

use super::report::{CpuCounts, Drops, ForwardCounts, ForwardReport, ForwardTick};
use super::{dev_counters, ForwardEvent, ForwardStart, Job};
use crate::ToolError;

fn counts(s: &ForwardSnapshot) -> ForwardCounts {
    ForwardCounts {
        rx_packets: s.rx_packets,
        forwarded: s.forwarded,
        dropped: Drops {
            not_ip: s.not_ip,
            malformed: s.malformed,
            truncated: s.truncated,
            tx_full: s.tx_full,
        },
        ring_drops: s.ring_drops,
    }
}

pub(super) fn run(
    job: &Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let (dev, swap, cfg) = (job.dev, job.swap, job.cfg);
    let set = flowlane_runtime::cpus::CpuSet::current();
    let cpus = cfg.cpus.clone().unwrap_or_else(|| set.usable());
    if cpus.is_empty() {
        return Err(ToolError::usage("no CPU for a forwarding worker"));
    }
    set.check(&cpus)
        .map_err(|e| ToolError::usage(e.to_string()))?;
    let ifindex = netdev::ifindex(dev).map_err(|e| ToolError::usage(format!("{dev}: {e}")))?;
    // Room for a VLAN tag put back besides the Ethernet header.
    let max_frame = netdev::mtu(dev).unwrap_or(1500) + 18;
    // One fanout group per run: ids are per network namespace; the process id keeps two
    // forwarders on one host apart.
    let group = (std::process::id() & 0xffff) as u16;
    let before = dev_counters(dev);
    let mut rt = Runtime::start(
        &Config {
            cpus: cpus.clone(),
            budget: 256,
            wait_ms: 50,
        },
        stop.clone(),
        move |_, _| {
            let rx = frame::RxRing::open_fanout(ifindex, 4096, max_frame, group)?;
            let tx = frame::TxRing::open(ifindex, 4096, max_frame + 32, true)?;
            Ok::<_, SysError>(ReflectWorker::new(rx, tx, swap))
        },
    )
    .map_err(|e| match e {
        StartError::Open(ref err) if err.source.kind() == std::io::ErrorKind::PermissionDenied => {
            ToolError::privilege(format!(
                "{e}: the forwarder needs CAP_NET_RAW (run as root or grant the capability)"
            ))
        }
        StartError::Pin { .. } => ToolError::usage(e.to_string()),
        _ => ToolError::runtime(e.to_string()),
    })?;
    on_event(ForwardEvent::Started(ForwardStart {
        backend: job.backend.clone(),
    }));
    let rule = StopRule {
        external: stop.clone(),
        deadline: job.duration,
    };
    let end = rt.session(Some(job.interval), &rule, &mut |t| {
        on_event(ForwardEvent::Tick(ForwardTick {
            elapsed_s: t.elapsed.as_secs_f64(),
            interval_s: t.interval.as_secs_f64(),
            delta: counts(&t.delta().role),
        }))
    });
    let cpus = cpus
        .iter()
        .zip(&end.finals)
        .map(|(&cpu, s)| CpuCounts {
            cpu,
            counts: counts(&s.role),
        })
        .collect();
    Ok(super::report::assemble(
        job,
        end.elapsed.as_secs_f64(),
        cpus,
        before,
        end.errors.into_iter().map(|e| e.1).collect(),
    ))
}
