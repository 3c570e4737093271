//! The probe-under-flood test (not RFC 2544's; Olsson's "a router must still answer a ping
//! through an 890 kpps flood"): a flood of random destinations the DUT routes (a new one
//! every frame, from `FloodSpec`'s ranges) and, beside it on the same interface, one probe
//! flow to the test's destination at a low rate. The sink accounts both; only the probe is
//! timed. Per flood rate: the flood's sent and forwarded counts, the probe's loss and one-way
//! latency.
//!
//! Why inside `rfc2544` and not a command of its own: it is a trial with a second stream —
//! the same generator and sink in their namespaces, the same learning frames, drain and
//! tester-limited marking, the same report per frame size and the same `--lab`/`--tx-dev`
//! way of naming any DUT. A command of its own would repeat all of that.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::config::FloodSpec;
use super::report::FloodPoint;
use super::trial::{inside, wait_quiet, Rig};
use crate::blast::{self, BlastConfig, FrameSettings, Frames, Mode, Rate, Spray};
use crate::sink::{self, SinkEvent, SinkReport};
use crate::ToolError;

/// A probe short of its rate by more than this is the tester's limit.
const SHORTFALL: f64 = 0.02;

impl Rig<'_> {
    /// One flood rate (`None`: unpaced; `Some(0.0)`: the probe alone) with the probe beside
    /// it, for `secs`.
    pub(super) fn flood_trial(
        &self,
        frames: &Frames,
        flood: &FloodSpec,
        rate: Option<f64>,
        secs: f64,
    ) -> Result<FloodPoint, ToolError> {
        let c = self.cfg;
        let probe_id = u16::try_from(flood.flows)
            .map_err(|_| ToolError::usage("at most 65 535 flood flows"))?;
        // The flood's frames go where the probe's go: to the next hop's MAC, from the
        // address the route to the probe's destination uses.
        let (dev, to) = (c.tx.dev.clone(), c.to);
        let (dst_mac, src) = inside(self.tx_ns.as_ref(), move || {
            let mac = match c.dst_mac {
                Some(m) => Ok(m),
                None => blast::neighbour_mac(to, &dev),
            };
            (mac, blast::route_source(to))
        })?;
        let (dst_mac, src) = (dst_mac?, src?);
        let frame_settings = FrameSettings {
            dst_mac: Some(dst_mac),
            ..FrameSettings::on(&c.tx.dev)
        };
        let mut probe = BlastConfig::new(c.to, flood.probe_cpu.unwrap_or(c.tx_cpu));
        probe.mode = Mode::Raw(frame_settings.clone());
        probe.frames = frames.clone();
        probe.rate = Some(Rate::Pps(flood.probe_pps));
        probe.duration_s = Some(secs);
        probe.first_id = probe_id;
        probe.sport = Some((9, 9));
        probe.interval_s = 3600.0;
        let first = std::net::SocketAddr::new(flood.dst.0, flood.dport.0);
        let mut fl = BlastConfig::new(first, c.tx_cpu);
        fl.mode = Mode::Xdp(frame_settings);
        fl.frames = frames.clone();
        fl.flows = flood.flows;
        fl.from = Some((src, src));
        fl.sport = Some((10_000, 10_000u16.saturating_add(probe_id)));
        fl.rate = rate.map(Rate::Pps);
        fl.duration_s = Some(secs);
        fl.interval_s = 3600.0;
        fl.spray = Some(Spray {
            dst: flood.dst,
            dport: flood.dport,
            random: true,
            flowlen: 1,
            src_macs: 1,
            dst_macs: 1,
        });
        let flooding = rate != Some(0.0);
        let mut scfg = self.sink_config();
        scfg.port = None;
        scfg.timed_flows = Some((probe_id, probe_id));
        scfg.tuples.capacity = 65_536;
        let sink_stop = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = mpsc::channel();
        let t0 = Instant::now();
        let last_rx = AtomicU64::new(0);
        let (s, probe_r, flood_r) = std::thread::scope(|sc| -> Result<_, ToolError> {
            let (scfg, sink_stop, last_rx) = (&scfg, &sink_stop, &last_rx);
            let sink = sc.spawn(move || {
                inside(self.rx_ns.as_ref(), move || {
                    sink::run(scfg, sink_stop, &mut |e| match e {
                        SinkEvent::Started(_) => {
                            let _ = started_tx.send(());
                        }
                        SinkEvent::Tick(t) if t.rx_packets > 0 => {
                            last_rx.store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        }
                        SinkEvent::Tick(_) => {}
                    })
                })
            });
            let started = started_rx.recv_timeout(Duration::from_secs(20)).is_ok();
            let sent = started.then(|| {
                let tx_ns = self.tx_ns.as_ref();
                let fl = &fl;
                let flood_thread = flooding.then(move || {
                    sc.spawn(move || inside(tx_ns, || blast::run(fl, self.stop, &mut |_| {})))
                });
                let p = inside(tx_ns, || blast::run(&probe, self.stop, &mut |_| {}));
                let f = flood_thread.map(|t| {
                    t.join()
                        .map_err(|_| ToolError::runtime("the flood's thread panicked"))
                });
                wait_quiet(last_rx, t0, Duration::from_secs_f64(c.drain_s.max(0.0)));
                (p, f)
            });
            sink_stop.store(true, Ordering::Relaxed);
            let s = sink
                .join()
                .map_err(|_| ToolError::runtime("the sink thread panicked"))???;
            let (p, f) =
                sent.ok_or_else(|| ToolError::runtime("the sink did not start in 20 s"))?;
            Ok((s, p??, f.transpose()?.transpose()?.transpose()?))
        })?;
        let step = |r: blast::BlastReport, what: &str| {
            r.steps
                .into_iter()
                .next()
                .ok_or_else(|| ToolError::runtime(format!("the {what} ran no step")))
        };
        let probe_s = step(probe_r, "probe")?;
        let flood_s = flood_r.map(|r| step(r, "flood")).transpose()?;
        Ok(point(
            rate,
            flood,
            probe_id,
            &probe_s,
            flood_s.as_ref(),
            &s,
            secs,
        ))
    }
}

/// The counts of one flood rate, from the two generators' steps and the sink's report.
fn point(
    rate: Option<f64>,
    flood: &FloodSpec,
    probe_id: u16,
    probe: &blast::StepReport,
    fl: Option<&blast::StepReport>,
    s: &SinkReport,
    secs: f64,
) -> FloodPoint {
    let of_probe = s.flows.iter().find(|f| f.id == probe_id);
    let probe_received = of_probe.map_or(0, |f| f.rx_packets.saturating_sub(f.duplicates));
    let flood_forwarded: u64 = s
        .flows
        .iter()
        .filter(|f| f.id < probe_id)
        .map(|f| f.rx_packets.saturating_sub(f.duplicates))
        .sum();
    let mut limited = Vec::new();
    if probe.tx_pps < flood.probe_pps * (1.0 - SHORTFALL) {
        limited.push(format!(
            "the probe left at {:.0} pps of {:.0} (its sender was held back)",
            probe.tx_pps, flood.probe_pps
        ));
    }
    if let (Some(r), Some(f)) = (rate.filter(|&r| r > 0.0), fl) {
        if f.tx_pps < r * (1.0 - SHORTFALL) {
            limited.push(format!(
                "the flood left at {:.0} pps of {r:.0} asked",
                f.tx_pps
            ));
        }
    }
    if s.ring_drops > 0 {
        limited.push(format!(
            "the sink's ring overflowed ({} frames not seen)",
            s.ring_drops
        ));
    }
    FloodPoint {
        flood_rate_pps: rate,
        flood_sent: fl.map_or(0, |f| f.tx_packets),
        flood_offered_pps: fl.map_or(0.0, |f| f.tx_pps),
        flood_destinations: fl.and_then(|f| f.flows_started).unwrap_or(0),
        flood_forwarded,
        flood_lost: fl.map_or(0, |f| f.tx_packets.saturating_sub(flood_forwarded)),
        // Over the sink's own window (first to last frame it read), not the time asked.
        flood_forwarded_pps: (flood_forwarded as f64
            / if s.duration_s > 0.0 {
                s.duration_s
            } else {
                secs
            })
        .round(),
        probe_pps: flood.probe_pps,
        probe_sent: probe.tx_packets,
        probe_received,
        probe_lost: probe.tx_packets.saturating_sub(probe_received),
        // The sink timed the probe's flow alone.
        probe_latency_ns: s.latency_ns.clone(),
        sink_ring_drops: s.ring_drops,
        secs,
        tester_limited: limited.join("; "),
    }
}
