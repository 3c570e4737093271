//! `rfc2544`: the four tests of RFC 2544 §26 per frame size — throughput (NDR, with the PDR
//! beside it), latency at that rate, the frame loss rate from 100 % down, and back-to-back
//! bursts (RFC 9004) — run with the library's blast (the live-frames generator, paced by its
//! own program) and sink, in-process, each in its namespace.
//!
//! Honest limits: the generator's ceiling is measured first for every size, against a veth
//! peer that drops every frame; without a `--line-rate` that ceiling is the maximum rate, and
//! a trial run within 80 % of it, or that did not deliver its rate, is marked tester-limited
//! (the answer is then a lower bound, never the DUT's figure). Frames the DUT's receive queue
//! refused (the generator's interface counts them) are the DUT's loss.
//!
//! The search is [`search`], pure code.

pub mod config;
mod flood;
pub mod report;
pub mod search;
mod trial;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use config::{
    Endpoint, FloodSpec, LabRun, Rfc2544Config, SizeSpec, Tests, DEFAULT_SIZES, DEFAULT_SIZES_V6,
};
pub use report::{
    line_bps, BackToBack, FloodPoint, LatencyResult, LossPoint, MaxRate, Placed, PlacedFlow,
    Rfc2544Report, SizeReport, TestName, Throughput, TrialRecord,
};
use search::{Search, SearchConfig, Step, Trial, TrialKind};
use trial::{Rig, Shot};

use crate::blast::Frames;
use crate::ToolError;

/// Status from a running test.
#[derive(Debug, Clone, PartialEq)]
pub enum Rfc2544Event {
    /// A size begins: its maximum rate is known.
    Size {
        /// Frame bytes with FCS.
        frame_bytes: f64,
        /// The maximum rate.
        max: MaxRate,
    },
    /// A trial was counted.
    Trial(TrialRecord),
    /// A flood rate of the probe-under-flood test was measured.
    Flood(FloodPoint),
}

/// An IMIX: (size with FCS, weight).
type Imix = Vec<(usize, u32)>;

/// The trials of the frame loss test stop after this many in a row lose nothing.
const LOSS_CLEAN_RUN: usize = 2;

/// Checks a configuration as [`run`] does first, so that a caller can refuse a bad one before
/// it says anything about the run.
pub fn check(cfg: &Rfc2544Config) -> Result<(), ToolError> {
    let secs = |what: &str, v: f64| crate::seconds(what, v).map(drop);
    secs("trial time", cfg.trial_s)?;
    secs("confirming trial time", cfg.confirm_s)?;
    if cfg.to.port() == 0 {
        return Err(ToolError::usage(
            "the destination needs a port other than 0",
        ));
    }
    if !(cfg.resolution > 0.0 && cfg.resolution < 0.5) {
        return Err(ToolError::usage(
            "the resolution is a share of the rate that fails, above 0 and below 50 % (--resolution 1 for 1 %)",
        ));
    }
    if !(0.0..100.0).contains(&cfg.loss_tolerance_pct) {
        return Err(ToolError::usage(
            "--loss-tolerance is a percentage below 100",
        ));
    }
    if let Some(l) = cfg.line_rate_bps {
        if !(l.is_finite() && l > 0.0) {
            return Err(ToolError::usage(
                "--line-rate must be a positive bit rate, e.g. 10G",
            ));
        }
    }
    if let SizeSpec::List(v) = &cfg.sizes {
        let floor = if cfg.to.is_ipv6() { 82 } else { 64 };
        if let Some(bad) = v.iter().find(|&&s| s < floor || s > 9018) {
            return Err(ToolError::usage(format!(
                "frame size {bad} (with FCS): flowlane's frames carry a 16-byte header, so \
                 sizes run from {floor} to 9018"
            )));
        }
        if v.is_empty() {
            return Err(ToolError::usage("no frame sizes"));
        }
    }
    if cfg.tests.probe_under_flood {
        let f = cfg.flood.as_ref().ok_or_else(|| {
            ToolError::usage(
                "the probe-under-flood test needs a flood: --flood-to PREFIX:PORTS, destinations \
                 the DUT routes out towards the receiving interface",
            )
        })?;
        if f.dst.0.is_ipv4() != cfg.to.is_ipv4() || f.dst.1.is_ipv4() != cfg.to.is_ipv4() {
            return Err(ToolError::usage(
                "the flood's destinations and the probe's are different address families",
            ));
        }
        if f.rates.is_empty() || !(f.probe_pps > 0.0 && f.probe_pps.is_finite()) {
            return Err(ToolError::usage(
                "the flood needs at least one rate, and the probe a positive rate",
            ));
        }
        if f.flows == 0 || f.flows >= 65_535 {
            return Err(ToolError::usage("1 to 65 534 flood flows"));
        }
    }
    if let Some(p) = &cfg.placement {
        let queues = p.model.build()?.queues();
        if let Some(q) = p.queues.iter().find(|&&q| q >= queues) {
            return Err(ToolError::usage(format!(
                "queue {q} does not exist: the DUT's RSS model has {queues} queues (0 to {})",
                queues.saturating_sub(1)
            )));
        }
        if p.per_queue == 0 {
            return Err(ToolError::usage("--per-queue is at least 1"));
        }
    }
    // Last, the interfaces, before anything is measured (a missing one was found after the
    // generator's ceiling had been measured).
    for (flag, e) in [("--tx-dev", &cfg.tx), ("--rx-dev", &cfg.rx)] {
        let look = || flowlane_io::netdev::ifindex(&e.dev).is_ok();
        let found = match &e.netns {
            Some(ns) => flowlane_lab::Netns::existing(ns).run(look).unwrap_or(false),
            None => look(),
        };
        if !found {
            return Err(ToolError::usage(format!(
                "{flag} {}: no such interface{} (see `ip link`)",
                e.dev,
                e.netns
                    .as_ref()
                    .map_or(String::new(), |n| format!(" in namespace {n}"))
            )));
        }
    }
    // The sizes each interface carries, and what the receiver reads.
    let mtu_of = |e: &Endpoint| {
        let look = || {
            let i = flowlane_io::netdev::ifindex(&e.dev).ok()?;
            flowlane_io::netdev::link_facts(i).ok().flatten()?.mtu
        };
        match &e.netns {
            Some(ns) => flowlane_lab::Netns::existing(ns).run(look).ok().flatten(),
            None => look(),
        }
    };
    let largest = match &cfg.sizes {
        SizeSpec::List(v) => v.iter().copied().max().unwrap_or(0),
        SizeSpec::Imix(v) => v.iter().map(|s| s.0).max().unwrap_or(0),
    };
    for (flag, e) in [("--tx-dev", &cfg.tx), ("--rx-dev", &cfg.rx)] {
        if let Some(mtu) = mtu_of(e) {
            // A frame of `size` with FCS carries size − 18 bytes of IP.
            if largest.saturating_sub(18) > mtu as usize {
                return Err(ToolError::usage(format!(
                    "frame size {largest} (with FCS) is above what {flag} {} carries (MTU \
                     {mtu}: frames to {}); raise its MTU (ip link set dev {} mtu {}) or give \
                     smaller --sizes",
                    e.dev,
                    mtu + 18,
                    e.dev,
                    largest - 18
                )));
            }
        }
    }
    if cfg.rx_backend == crate::sink::SinkBackend::AfXdp {
        if let Some(mtu) = mtu_of(&cfg.rx).filter(|&m| m as usize + 18 + 256 > 4096) {
            return Err(ToolError::usage(format!(
                "--rx-dev {} has an MTU of {mtu}, more than an AF_XDP frame holds (4096 with 256 \
                 of headroom): give --rx-backend af-packet",
                cfg.rx.dev
            )));
        }
    }
    Ok(())
}

/// Runs the tests; a stop request ends the run after the trial in progress, and the report
/// holds what was done.
pub fn run(
    cfg: &Rfc2544Config,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(Rfc2544Event),
) -> Result<Rfc2544Report, ToolError> {
    check(cfg)?;
    let t0 = Instant::now();
    let rig = Rig {
        cfg,
        tx_ns: trial::netns_of(&cfg.tx)?,
        rx_ns: trial::netns_of(&cfg.rx)?,
        stop,
        flows: std::sync::OnceLock::new(),
    };
    let sizes: Vec<(Frames, f64, Option<Imix>)> = match &cfg.sizes {
        SizeSpec::List(v) => v
            .iter()
            .map(|&s| (Frames::Sizes(vec![s - 4]), s as f64, None))
            .collect(),
        SizeSpec::Imix(m) => {
            let w: f64 = m.iter().map(|p| f64::from(p.1)).sum();
            let mean = m.iter().map(|p| p.0 as f64 * f64::from(p.1)).sum::<f64>() / w.max(1.0);
            vec![(Frames::Imix(m.clone()), mean, Some(m.clone()))]
        }
    };
    let mut report = Rfc2544Report {
        host: None,
        tx_dev: cfg.tx.dev.clone(),
        rx_dev: cfg.rx.dev.clone(),
        to: cfg.to.to_string(),
        generator: match cfg.sizes {
            SizeSpec::List(_) => "xdp-live (paced in its XDP program)".into(),
            SizeSpec::Imix(_) => "AF_XDP (paced in user space)".into(),
        },
        receiver: cfg.rx_backend,
        placement: None,
        sizes: Vec::new(),
        trials: Vec::new(),
        duration_s: 0.0,
        interrupted: false,
    };
    let stopped = || stop.load(Ordering::Relaxed);
    for (frames, bytes, imix) in sizes {
        if stopped() {
            break;
        }
        let mut size = SizeRun {
            rig: &rig,
            frames,
            bytes,
            trials: &mut report.trials,
            on_event,
        };
        let r = size.run(imix)?;
        report.sizes.push(r);
    }
    report.placement = cfg.placement.as_ref().map(|p| Placed {
        per_queue: p.per_queue,
        queues: p.queues.clone(),
        by_default: cfg.placement_default,
        flows: rig.flows.get().cloned().unwrap_or_default(),
    });
    report.interrupted = stopped();
    report.duration_s = (t0.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    Ok(report)
}

struct SizeRun<'a, 'b> {
    rig: &'a Rig<'a>,
    frames: Frames,
    bytes: f64,
    trials: &'b mut Vec<TrialRecord>,
    on_event: &'b mut dyn FnMut(Rfc2544Event),
}

impl SizeRun<'_, '_> {
    fn cfg(&self) -> &Rfc2544Config {
        self.rig.cfg
    }

    fn stopped(&self) -> bool {
        self.rig.stop.load(Ordering::Relaxed)
    }

    fn pause(&self) {
        std::thread::sleep(std::time::Duration::from_secs_f64(
            self.cfg().pause_s.max(0.0),
        ));
    }

    fn shot(&self, test: TestName, kind: TrialKind, rate: Option<f64>, secs: f64) -> Shot {
        Shot {
            test,
            kind,
            frames: self.frames.clone(),
            frame_bytes: self.bytes,
            rate_pps: rate,
            secs: Some(secs),
            count: None,
            near_ceiling_pps: None,
        }
    }

    fn keep(&mut self, mut r: TrialRecord, verdict: &str) -> TrialRecord {
        if r.verdict.is_empty() {
            r.verdict = verdict.into();
        }
        (self.on_event)(Rfc2544Event::Trial(r.clone()));
        self.trials.push(r.clone());
        r
    }

    fn run(&mut self, imix: Option<Vec<(usize, u32)>>) -> Result<SizeReport, ToolError> {
        let cfg = self.cfg().clone();
        // The generator's ceiling for this size, then the maximum rate.
        let ceil = self
            .rig
            .ceiling(&self.frames, self.bytes, cfg.trial_s.min(2.0))?;
        let ceil = self.keep(ceil, "ceiling");
        let ceiling = ceil.offered_pps;
        if ceiling <= 0.0 {
            return Err(ToolError::runtime(
                "the generator sent nothing into a dropping peer: see `flowlane blast --mode \
                 xdp-live` on this interface",
            ));
        }
        let max = match cfg.line_rate_bps {
            Some(l) => MaxRate {
                pps: l / ((self.bytes + 20.0) * 8.0),
                source: "line rate".into(),
                ceiling_pps: Some(ceiling),
            },
            None => {
                // The interface's speed bounds what may be offered (blast refuses more).
                let speed = self
                    .rig
                    .tx_speed_bps()?
                    .map(|b| b / ((self.bytes + 20.0) * 8.0));
                match speed {
                    Some(s) if s < ceiling => MaxRate {
                        pps: s,
                        source: "interface speed".into(),
                        ceiling_pps: Some(ceiling),
                    },
                    _ => MaxRate {
                        pps: ceiling,
                        source: "generator".into(),
                        ceiling_pps: Some(ceiling),
                    },
                }
            }
        };
        (self.on_event)(Rfc2544Event::Size {
            frame_bytes: self.bytes,
            max: max.clone(),
        });
        self.rig.learn(&self.frames)?;
        self.pause();
        let near = 0.8 * ceiling;
        let mut out = SizeReport {
            frame_bytes: self.bytes,
            imix,
            max: max.clone(),
            throughput: None,
            latency: None,
            frame_loss: None,
            back_to_back: None,
            probe_under_flood: None,
        };
        let tol = cfg.loss_tolerance_pct / 100.0;
        if cfg.tests.throughput && !self.stopped() {
            out.throughput = Some(self.throughput(&max, near, tol)?);
        }
        let rate = out.throughput.as_ref().map_or(max.pps, |t| {
            if t.ndr.pps > 0.0 {
                t.ndr.pps
            } else {
                max.pps
            }
        });
        if cfg.tests.latency && !self.stopped() {
            out.latency = Some(self.latency(rate, near)?);
        }
        if cfg.tests.frame_loss && !self.stopped() {
            out.frame_loss = Some(self.frame_loss(&max, near)?);
        }
        if cfg.tests.back_to_back && !self.stopped() {
            let thr = out.throughput.as_ref().map(|t| t.ndr.pps);
            out.back_to_back = Some(self.back_to_back(&max, thr)?);
        }
        if let Some(f) = cfg.flood.as_ref().filter(|_| cfg.tests.probe_under_flood) {
            let mut points = Vec::new();
            for &rate in &f.rates {
                if self.stopped() {
                    break;
                }
                let p = self.rig.flood_trial(&self.frames, f, rate, cfg.confirm_s)?;
                (self.on_event)(Rfc2544Event::Flood(p.clone()));
                points.push(p);
                self.pause();
            }
            out.probe_under_flood = Some(points);
        }
        Ok(out)
    }

    fn throughput(&mut self, max: &MaxRate, near: f64, tol: f64) -> Result<Throughput, ToolError> {
        let cfg = self.cfg().clone();
        let mut s = Search::new(SearchConfig {
            max_pps: max.pps,
            resolution: cfg.resolution,
            loss_tolerance: tol,
            max_trials: cfg.max_trials,
            halving_only: cfg.halving_only,
        });
        while let Step::Trial { pps, kind } = s.next_step() {
            if self.stopped() {
                break;
            }
            let secs = if kind.is_long() {
                cfg.confirm_s
            } else {
                cfg.trial_s
            };
            let r = self.paced(TestName::Throughput, kind, pps, secs, near, tol)?;
            s.record(Trial {
                pps,
                sent: r.sent,
                received: r.received,
                secs: r.secs,
                offered_pps: r.offered_pps,
                tester_limited: !r.tester_limited.is_empty(),
            });
            self.pause();
        }
        let (ndr, pdr) = s.found();
        // `ndr.pps` is what was delivered where less than asked; a tester-limited answer is a
        // lower bound.
        Ok(Throughput {
            ndr,
            pdr,
            loss_tolerance_pct: cfg.loss_tolerance_pct,
            trials: s.trials().len(),
            exhausted: s.exhausted(),
            ndr_line_bps: line_bps(ndr.pps, self.bytes),
            ndr_pct_of_max: 100.0 * ndr.pps / max.pps,
        })
    }

    /// One paced trial of `test` at `rate` for `secs`, kept with its verdict: pass when it
    /// lost nothing, or lost at most `tolerance` (the PDR's), fail otherwise.
    fn paced(
        &mut self,
        test: TestName,
        kind: TrialKind,
        rate: f64,
        secs: f64,
        near: f64,
        tolerance: f64,
    ) -> Result<TrialRecord, ToolError> {
        let mut shot = self.shot(test, kind, Some(rate), secs);
        shot.near_ceiling_pps = Some(near);
        let r = self.rig.trial(&shot)?;
        let verdict = if r.loss == 0.0 {
            "pass"
        } else if r.loss <= tolerance {
            "pass (PDR)"
        } else {
            "fail"
        };
        Ok(self.keep(r, verdict))
    }

    fn latency(&mut self, rate: f64, near: f64) -> Result<LatencyResult, ToolError> {
        let cfg = self.cfg().clone();
        let mut trials = Vec::new();
        for _ in 0..cfg.latency_trials.max(1) {
            if self.stopped() {
                break;
            }
            let r = self.paced(
                TestName::Latency,
                TrialKind::Search,
                rate,
                cfg.confirm_s,
                near,
                0.0,
            )?;
            if let Some(l) = r.latency_ns {
                trials.push(l);
            }
            self.pause();
        }
        let mean = |f: fn(&crate::Latency) -> u64| {
            if trials.is_empty() {
                0.0
            } else {
                trials.iter().map(|l| f(l) as f64).sum::<f64>() / trials.len() as f64
            }
        };
        Ok(LatencyResult {
            rate_pps: rate,
            mean_p50_ns: mean(|l| l.p50),
            mean_p99_ns: mean(|l| l.p99),
            mean_p999_ns: mean(|l| l.p999),
            mean_max_ns: mean(|l| l.max),
            trials,
        })
    }

    fn frame_loss(&mut self, max: &MaxRate, near: f64) -> Result<Vec<LossPoint>, ToolError> {
        let cfg = self.cfg().clone();
        let mut points = Vec::new();
        let mut clean = 0;
        for pct in (1..=10).rev().map(|k| k * 10) {
            if self.stopped() || clean >= LOSS_CLEAN_RUN {
                break;
            }
            let rate = max.pps * f64::from(pct) / 100.0;
            let r = self.paced(
                TestName::FrameLoss,
                TrialKind::Search,
                rate,
                cfg.trial_s,
                near,
                0.0,
            )?;
            clean = if r.loss == 0.0 { clean + 1 } else { 0 };
            points.push(LossPoint {
                pct_of_max: pct,
                rate_pps: rate,
                offered_pps: r.offered_pps,
                loss_pct: 100.0 * r.loss,
            });
            self.pause();
        }
        Ok(points)
    }

    fn back_to_back(&mut self, max: &MaxRate, thr: Option<f64>) -> Result<BackToBack, ToolError> {
        let cfg = self.cfg().clone();
        // At the line rate the generator is paced to it; without one, bursts leave as fast as
        // the generator goes (its ceiling).
        let pace = (max.source == "line rate").then_some(max.pps);
        let top = ((max.pps * cfg.b2b_max_s) as u64).max(2);
        let mut out = BackToBack {
            rate_pps: max.pps,
            bursts: Vec::new(),
            mean_frames: 0.0,
            implied_buffer_s: 0.0,
            corrected_buffer_s: None,
            buffer_frames: None,
            note: None,
            tester_limited: None,
        };
        if thr.is_some_and(|t| t >= max.pps * (1.0 - cfg.resolution)) {
            out.note = Some(
                "the DUT forwarded the maximum rate without loss: no burst at that rate fills \
                 a buffer (RFC 9004 §5), so there is nothing to measure"
                    .into(),
            );
            return Ok(out);
        }
        for _ in 0..cfg.b2b_trials.max(1) {
            // The longest burst that passes: halving between the last pass and the first
            // failure, to 1 % of the length (at least one frame).
            let (mut lo, mut hi) = (0u64, top + 1);
            while hi - lo > (lo / 100).max(1) && !self.stopped() {
                let n = if lo == 0 && hi == top + 1 {
                    top
                } else {
                    lo + (hi - lo) / 2
                };
                let mut shot = self.shot(TestName::BackToBack, TrialKind::Search, pace, 0.0);
                shot.secs = None;
                shot.count = Some(n);
                let r = self.rig.trial(&shot)?;
                let pass = r.loss == 0.0;
                let offered = r.offered_pps;
                // The trial's own verdict on the tester, where the burst also left slower than
                // the maximum rate.
                let short = (!r.tester_limited.is_empty() && pace.is_some_and(|p| offered < p))
                    .then(|| r.tester_limited.join("; "));
                self.keep(r, if pass { "pass" } else { "fail" });
                if pass {
                    lo = n;
                    if n == top {
                        if let Some(why) = short {
                            out.tester_limited = Some(format!(
                                "the longest burst ({n} frames) passed but left at {offered:.0} \
                                 frames/s, not the maximum {:.0} ({why}): the DUT's buffer was \
                                 not tested at that rate",
                                max.pps
                            ));
                        }
                        break;
                    }
                } else {
                    hi = n;
                }
                self.pause();
            }
            out.bursts.push(lo);
            if lo == top {
                out.note = Some(format!(
                    "no loss up to the longest burst tried ({top} frames, {} s at the maximum \
                     rate): the buffer is at least that",
                    cfg.b2b_max_s
                ));
                break;
            }
        }
        out.mean_frames = out.bursts.iter().sum::<u64>() as f64 / out.bursts.len().max(1) as f64;
        out.implied_buffer_s = out.mean_frames / max.pps;
        let share = thr.map(|t| 1.0 - (t / max.pps).min(1.0));
        out.corrected_buffer_s = share.map(|k| out.implied_buffer_s * k);
        out.buffer_frames = share.map(|k| out.mean_frames * k);
        Ok(out)
    }
}
