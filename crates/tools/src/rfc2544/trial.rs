//! One trial: a sink on the receiving interface, blast on the generator's, both in-process
//! (each on a thread in its namespace), then the counts. And the generator's ceiling, against
//! a veth peer that drops every frame.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use flowlane_lab::Netns;

use super::config::{Endpoint, Rfc2544Config};
use super::report::{TestName, TrialRecord};
use super::search::TrialKind;
use crate::blast::{self, BlastConfig, FrameSettings, Frames, Mode, Rate};
use crate::sink::{self, SinkConfig, SinkEvent, SinkReport};
use crate::ToolError;

/// A trial falls short of the rate asked by more than this and it is tester-limited.
const SHORTFALL: f64 = 0.02;

/// The DUT has drained once nothing has reached the sink for this long after the generator
/// stopped (or `drain_s` has passed).
const QUIET: Duration = Duration::from_millis(100);

/// How often the sink says what it received, seconds: the drain's clock.
const TICK_S: f64 = 0.01;

/// The namespaces and settings every trial of a run shares.
pub(super) struct Rig<'a> {
    pub cfg: &'a Rfc2544Config,
    pub tx_ns: Option<Netns>,
    pub rx_ns: Option<Netns>,
    pub stop: &'a Arc<AtomicBool>,
    /// The placed flows, as the first trial's generator sent them.
    pub flows: std::sync::OnceLock<Vec<super::report::PlacedFlow>>,
}

/// What one trial sends.
#[derive(Debug, Clone)]
pub(super) struct Shot {
    pub test: TestName,
    pub kind: TrialKind,
    /// Frame sizes without FCS: one, or an IMIX cycle.
    pub frames: Frames,
    /// Frame bytes with FCS (the mix's mean).
    pub frame_bytes: f64,
    /// Paced at this rate (`None`: as fast as the generator goes).
    pub rate_pps: Option<f64>,
    /// Seconds of sending, or a count.
    pub secs: Option<f64>,
    pub count: Option<u64>,
    /// Trials at or above this rate ran near the generator's ceiling.
    pub near_ceiling_pps: Option<f64>,
}

pub(super) fn inside<T: Send>(
    ns: Option<&Netns>,
    f: impl FnOnce() -> T + Send,
) -> Result<T, ToolError> {
    match ns {
        Some(ns) => ns
            .run_with_sys(f)
            .map_err(|e| ToolError::runtime(e.to_string())),
        None => Ok(f()),
    }
}

/// The namespace of an endpoint, if it names one (it must exist).
pub(super) fn netns_of(e: &Endpoint) -> Result<Option<Netns>, ToolError> {
    match &e.netns {
        None => Ok(None),
        Some(n) => {
            if !std::path::Path::new(&format!("/run/netns/{n}")).exists() {
                return Err(ToolError::usage(format!(
                    "no network namespace `{n}` (see `ip netns list`; `flowlane lab up \
                     --topology line` makes one)"
                )));
            }
            Ok(Some(Netns::existing(n)))
        }
    }
}

impl Rig<'_> {
    fn mode(frames: &Frames) -> fn(FrameSettings) -> Mode {
        // An XDP frame is one page: 4 096 bytes less the headroom and the room the kernel keeps
        // for shared info. Jumbo frames go through an AF_PACKET ring.
        const XDP_FRAME_MAX: usize = 3500;
        let largest = match frames {
            Frames::Sizes(v) => v.iter().copied().max().unwrap_or(0),
            // IMIX sizes count the FCS.
            Frames::Imix(v) => v.iter().map(|s| s.0.saturating_sub(4)).max().unwrap_or(0),
            Frames::Payload(p) => p + 42,
            Frames::Auto => 0,
        };
        // The live-frames generator sends one size per run; a mix goes through AF_XDP.
        match frames {
            _ if largest > XDP_FRAME_MAX => Mode::Raw,
            Frames::Imix(_) => Mode::Xdp,
            _ => Mode::XdpLive,
        }
    }

    fn blast_config(&self, shot: &Shot, dev: &str, dst_mac: Option<[u8; 6]>) -> BlastConfig {
        let c = self.cfg;
        let mut b = BlastConfig::new(c.to, c.tx_cpu);
        b.mode = Self::mode(&shot.frames)(FrameSettings {
            dst_mac,
            ..FrameSettings::on(dev)
        });
        b.flows = c.flows.max(1);
        b.placement = c.placement.clone();
        if b.placement.is_some() {
            b.sport = Some((1024, 65535));
        }
        b.frames = shot.frames.clone();
        b.rate = shot.rate_pps.map(Rate::Pps);
        b.duration_s = shot.secs;
        b.count = shot.count;
        b.burst = c.burst;
        b.interval_s = 3600.0;
        b
    }

    /// The sink every trial runs (one port, all flows timed).
    pub(super) fn sink_config(&self) -> SinkConfig {
        let c = self.cfg;
        SinkConfig {
            sharding: Default::default(),
            timed_flows: None,
            reasm: Default::default(),
            metrics: None,
            dev: c.rx.dev.clone(),
            port: Some(c.to.port()),
            count: None,
            duration_s: None,
            idle_s: None,
            cpu: c.rx_cpu,
            // An AF_XDP ring's slots are UMEM frames of 2 KiB each, per queue.
            ring: match c.rx_backend {
                crate::sink::SinkBackend::AfXdp => c.ring.min(32_768),
                crate::sink::SinkBackend::AfPacket => c.ring,
            },
            interval_s: TICK_S,
            write: None,
            backend: c.rx_backend,
            cpus: Vec::new(),
            ring_memory: c.ring_memory,
            // A trial sends at most 4096 flows.
            tuples: crate::sink::TupleSpec {
                capacity: 4096,
                idle_s: 30.0,
            },
        }
    }

    /// Runs one trial and counts it.
    pub fn trial(&self, shot: &Shot) -> Result<TrialRecord, ToolError> {
        let c = self.cfg;
        let scfg = self.sink_config();
        let bcfg = self.blast_config(shot, &c.tx.dev, c.dst_mac);
        let sink_stop = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = mpsc::channel();
        // When the sink last said frames had come, nanoseconds after `t0`.
        let t0 = Instant::now();
        let last_rx = AtomicU64::new(0);
        let mut drained = Duration::ZERO;
        let (s, b) = std::thread::scope(|sc| -> Result<_, ToolError> {
            let (scfg, sink_stop, last_rx) = (&scfg, &sink_stop, &last_rx);
            let rx_ns = self.rx_ns.as_ref();
            let sink = sc.spawn(move || {
                inside(rx_ns, move || {
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
            let b = if started_rx.recv_timeout(Duration::from_secs(20)).is_ok() {
                let b = inside(self.tx_ns.as_ref(), || {
                    blast::run(&bcfg, self.stop, &mut |_| {})
                });
                drained = wait_quiet(last_rx, t0, Duration::from_secs_f64(c.drain_s.max(0.0)));
                Some(b)
            } else {
                None
            };
            sink_stop.store(true, Ordering::Relaxed);
            let s = sink
                .join()
                .map_err(|_| ToolError::runtime("the sink thread panicked"))??
                .map_err(|mut e| {
                    // The sink names its own flag; here the choice is rfc2544's.
                    if c.rx_backend == crate::sink::SinkBackend::AfXdp
                        && e.kind != crate::ErrorKind::Privilege
                    {
                        e.message.push_str(
                            " (the receiver is AF_XDP by default: --rx-backend af-packet \
                             reads with a copy instead, without an XDP program)",
                        );
                    }
                    e
                })?;
            Ok((s, b))
        })?;
        let b = b.ok_or_else(|| ToolError::runtime("the sink did not start within 20 s"))???;
        let step = b
            .steps
            .into_iter()
            .next()
            .ok_or_else(|| ToolError::runtime("the generator ran no step"))?;
        if c.placement.is_some() {
            self.flows.get_or_init(|| {
                step.flows
                    .iter()
                    .filter_map(|f| {
                        Some(super::report::PlacedFlow {
                            src: f.src.clone(),
                            dst: f.dst.clone(),
                            queue: f.queue?,
                        })
                    })
                    .collect()
            });
        }
        let mut r = record(shot, &step, &s);
        r.drained_s = drained.as_secs_f64();
        Ok(r)
    }

    /// The tx interface's reported speed, bits per second (veth reports 10 Gbit/s, and blast
    /// holds paced rates to it).
    pub fn tx_speed_bps(&self) -> Result<Option<f64>, ToolError> {
        let dev = self.cfg.tx.dev.clone();
        inside(self.tx_ns.as_ref(), move || {
            flowlane_io::netdev::speed_mbps(&dev).map(|m| m * 1e6)
        })
    }

    /// Learning frames (RFC 2544 §23): a few frames at a low rate, so the DUT and the hosts
    /// have resolved addresses and filled caches before the first counted trial.
    pub fn learn(&self, frames: &Frames) -> Result<(), ToolError> {
        if self.cfg.learning_frames == 0 {
            return Ok(());
        }
        let shot = Shot {
            test: TestName::Throughput,
            kind: TrialKind::Search,
            frames: frames.clone(),
            frame_bytes: 0.0,
            rate_pps: Some(1000.0),
            secs: None,
            count: Some(self.cfg.learning_frames),
            near_ceiling_pps: None,
        };
        let bcfg = self.blast_config(&shot, &self.cfg.tx.dev, self.cfg.dst_mac);
        inside(self.tx_ns.as_ref(), || {
            blast::run(&bcfg, self.stop, &mut |_| {})
        })??;
        Ok(())
    }

    /// The generator's own maximum for these frames: unpaced for `secs` into a veth pair made
    /// for the purpose beside the tx interface, whose far end drops every frame in XDP.
    pub fn ceiling(
        &self,
        frames: &Frames,
        frame_bytes: f64,
        secs: f64,
    ) -> Result<TrialRecord, ToolError> {
        let ns = self.tx_ns.as_ref();
        let tag = std::process::id() % 100_000;
        let (a, z) = (format!("flc{tag}a"), format!("flc{tag}z"));
        let ip = |args: &[&str]| match ns {
            Some(n) => n.ip(args),
            None => flowlane_lab::ip(args),
        };
        let lab = |e: flowlane_lab::LabError| ToolError::runtime(e.to_string());
        // The far end's MAC is set, not read: sysfs in this thread is the host's, not the
        // namespace's.
        const PEER_MAC: [u8; 6] = [0x02, 0xf1, 0xce, 0x00, 0x00, 0x02];
        let peer_mac = flowlane_wire::Mac(PEER_MAC).to_string();
        // The pair carries what the tx interface carries (a 9 000-byte MTU: jumbo frames).
        let tx_dev = self.cfg.tx.dev.clone();
        let mtu = inside(ns, move || {
            flowlane_io::netdev::ifindex(&tx_dev)
                .ok()
                .and_then(|i| flowlane_io::netdev::link_facts(i).ok().flatten())
                .and_then(|f| f.mtu)
        })?
        .unwrap_or(1500)
        .to_string();
        ip(&[
            "link", "add", &a, "mtu", &mtu, "type", "veth", "peer", "name", &z, "mtu", &mtu,
            "address", &peer_mac,
        ])
        .map_err(lab)?;
        let out = (|| {
            ip(&["link", "set", &a, "up"]).map_err(lab)?;
            ip(&["link", "set", &z, "up"]).map_err(lab)?;
            let zc = z.clone();
            let mac = PEER_MAC;
            let link = inside(ns, move || -> Result<_, ToolError> {
                use flowlane_io::{bpf, ebpf::xdp, netdev};
                let bpf_err = |e: flowlane_io::SysError| ToolError::runtime(e.to_string());
                let prog = bpf::verdict_program(xdp::DROP, "fl_ceil_drop")
                    .map_err(|e| ToolError::runtime(format!("drop program: {e}")))?;
                let idx = netdev::ifindex(&zc).map_err(bpf_err)?;
                bpf::attach_xdp(&prog, idx, 0).map_err(bpf_err)
            })??;
            let shot = Shot {
                test: TestName::Ceiling,
                kind: TrialKind::Search,
                frames: frames.clone(),
                frame_bytes,
                rate_pps: None,
                secs: Some(secs),
                count: None,
                near_ceiling_pps: None,
            };
            let bcfg = self.blast_config(&shot, &a, Some(mac));
            let b = inside(ns, || blast::run(&bcfg, self.stop, &mut |_| {}))??;
            drop(link);
            let step = b
                .steps
                .into_iter()
                .next()
                .ok_or_else(|| ToolError::runtime("the generator ran no step"))?;
            let mut r = record(&shot, &step, &SinkReport::empty());
            // Nothing is received here by design: the peer drops.
            r.received = 0;
            r.loss = 0.0;
            r.verdict = "ceiling".into();
            Ok(r)
        })();
        let _ = ip(&["link", "del", &a]);
        out
    }
}

/// Waits after the generator stopped until nothing has reached the sink for [`QUIET`] (the
/// frames the DUT still held have come out), at most `max` (RFC 2544 §23: 2 s); how long.
/// `last_rx`: when the sink last said frames had come, nanoseconds after `t0`.
pub(super) fn wait_quiet(last_rx: &AtomicU64, t0: Instant, max: Duration) -> Duration {
    let start = t0.elapsed();
    loop {
        let now = t0.elapsed();
        let waited = now.saturating_sub(start);
        let last = Duration::from_nanos(last_rx.load(Ordering::Relaxed));
        if waited >= max || (waited >= QUIET && now.saturating_sub(last) >= QUIET) {
            return waited;
        }
        std::thread::sleep(Duration::from_millis(5).min(max - waited));
    }
}

/// The counts of a trial, from the generator's step and the sink's report.
fn record(shot: &Shot, step: &blast::StepReport, s: &SinkReport) -> TrialRecord {
    let sent = step.tx_packets;
    let refused = step
        .device_refused
        .unwrap_or_else(|| step.device_tx_packets.map_or(0, |d| sent.saturating_sub(d)));
    let received = s.flowlane_packets.saturating_sub(s.duplicates);
    let loss = if sent > 0 {
        sent.saturating_sub(received) as f64 / sent as f64
    } else {
        0.0
    };
    let mut limited = Vec::new();
    if let Some(r) = shot.rate_pps {
        if step.tx_pps < r * (1.0 - SHORTFALL) {
            limited.push(format!(
                "offered {:.0} pps of {r:.0} asked (the generator fell short)",
                step.tx_pps
            ));
        }
        if let Some(c) = shot.near_ceiling_pps {
            if r >= c {
                limited.push(format!(
                    "asked {r:.0} pps, within 80 % of the generator's ceiling"
                ));
            }
        }
    }
    if s.ring_drops > 0 {
        limited.push(format!(
            "the sink's ring overflowed ({} frames not seen: the receiver was the limit)",
            s.ring_drops
        ));
    }
    TrialRecord {
        test: shot.test,
        kind: shot.kind,
        frame_bytes: shot.frame_bytes,
        rate_pps: shot.rate_pps.unwrap_or(0.0),
        offered_pps: step.tx_pps,
        sent,
        refused,
        received,
        receiver_dropped: s.ring_drops,
        loss,
        duplicates: s.duplicates,
        reordered: s.reordered,
        latency_ns: s.latency_ns.clone(),
        secs: step.duration_s,
        drained_s: 0.0,
        tester_limited: limited,
        verdict: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing came after the generator stopped: the drain ends after [`QUIET`], not at the
    /// bound (lower bounds only: a busy machine may run the loop late, never early).
    #[test]
    fn a_quiet_dut_drains_after_the_quiet_time() {
        let t0 = Instant::now();
        let waited = wait_quiet(&AtomicU64::new(0), t0, Duration::from_secs(30));
        assert!(waited >= QUIET, "{waited:?}");
        assert!(waited < Duration::from_secs(30), "{waited:?}");
    }

    /// Frames keep coming (the last one always just now): the drain ends at its bound.
    #[test]
    fn a_dut_that_keeps_sending_is_cut_at_the_bound() {
        let t0 = Instant::now();
        let always = AtomicU64::new(u64::MAX / 2);
        let max = Duration::from_millis(300);
        let waited = wait_quiet(&always, t0, max);
        assert!(waited >= max, "{waited:?}");
    }
}
