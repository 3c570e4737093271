//! `flowlane rfc2544` against DUTs whose capacity is known: the kernel routing behind a token
//! bucket (tc tbf) of a set packet rate, and a DUT faster than the generator (native XDP
//! routing, which runs in the generator's own softirq). Counts are checked against the
//! interfaces' counters.

mod common;

use std::process::Command;

use common::{need_program, quiet, Forwarder, Line};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// 60-byte frames (64 with FCS) at 50 000 per second through the token bucket: 24 Mbit/s.
const CAPACITY_PPS: f64 = 50_000.0;

fn rfc2544(lab: &Line, extra: &[&str]) -> (Option<i32>, Value, String) {
    let out = Command::new(BIN)
        .args(["rfc2544", "--lab", &lab.name, "--json"])
        .args(if extra.contains(&"--sizes") || extra.contains(&"--imix") {
            &[][..]
        } else {
            &["--sizes", "64"][..]
        })
        .args(["--pause", "0.3", "--learning-frames", "100"])
        .args(extra)
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let j = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), j, err)
}

/// Asserts a report is valid against the documented schema, docs/rfc2544.schema.json.
fn valid(j: &Value) {
    let schema_path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/rfc2544.schema.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("schema"))
            .expect("schema JSON");
    let v = jsonschema::validator_for(&schema).expect("a valid schema");
    let errors: Vec<String> = v.iter_errors(j).map(|e| e.to_string()).collect();
    assert!(
        errors.is_empty(),
        "the report against the schema: {errors:?}"
    );
    // The run carries its host's conditions: both interfaces were read where they are.
    let devs = &j["host"]["devs"];
    assert_eq!(
        devs.as_array().map(Vec::len),
        Some(2),
        "host: {}",
        j["host"]
    );
    assert!(
        !j["host"]["findings"]
            .as_array()
            .expect("host findings")
            .is_empty(),
        "{}",
        j["host"]
    );
}

fn dev_counts(ns: &flowlane_lab::Netns, dev: &str) -> (u64, u64) {
    let c = ns.dev().expect("/proc/net/dev");
    let i = &c.ifaces[dev];
    (i.rx_packets, i.tx_packets)
}

fn trials(j: &Value) -> Vec<Value> {
    j["trials"].as_array().expect("trials").clone()
}

/// How deep a token-bucket lab's software-RSS CPU queue is. Every such lab steers with
/// software RSS and rfc2544 places its flow on a DUT queue whose CPU is not the generator's:
/// without steering, veth runs the DUT's whole receive path (IP forwarding, the bucket's
/// watchdog re-armed per waiting frame, its drops) in the softirq of the generator's own sends,
/// and an overloaded DUT held the generator to 36-73k of the 100-149k frames/s asked (five
/// runs in a row, every trial above the bucket tester-limited) — or to the bucket's own
/// 50 000, so that a frame-loss test at 100 % of the line rate lost nothing (CI, 2026-11-26).
enum Steer {
    /// 512 frames, for the searches and the loss test: with the default 16 384 the DUT
    /// buffers a third of a second of the bucket's rate and passed 2 s trials 8 % above it
    /// (what it carries for 2 s, not for good: the tests' model is the bucket alone).
    Rss,
    /// 2 048 frames, for back-to-back bursts: the forwarding CPU's kernel thread, asleep
    /// between bursts, takes a few ms to wake, and a 512-frame queue overflowed at the start
    /// of every burst (733-856 frames where the bucket alone holds 1050); 2 048 frames are
    /// 14 ms at the line rate. The queue is then part of the DUT's buffer.
    RssDeep,
}

/// One-second trials and confirmations at a line rate of 100 Mbit/s (148 810 64-byte frames
/// a second, three times the bucket's rate).
const SHORT_AT_100M: [&str; 6] = [
    "--line-rate",
    "100M",
    "--trial-secs",
    "1",
    "--confirm-secs",
    "1",
];

/// The CPU queue of a [`Steer::RssDeep`] lab, frames.
const DEEP_QUEUE: f64 = 2048.0;

/// A line lab whose DUT (the kernel, routing) forwards through a token bucket of 50 000
/// 60-byte frames per second with a queue of 1000 frames (the generator's catch-up bursts
/// fit; a 2 s trial 2 % too fast overflows it) and a bucket of 50, steered as `steer` says.
fn tbf_lab(tag: &str, steer: Steer) -> Option<Line> {
    let lab_args: &[&str] = match steer {
        Steer::Rss => &["--steer", "rss", "--cpu-queue", "512"],
        Steer::RssDeep => &["--steer", "rss", "--cpu-queue", "2048"],
    };
    tbf_lab_with(tag, lab_args, "24mbit", 3_000, 60_000)
}

/// A line lab made with `lab_args` whose kernel routes through a token bucket of `rate` (tc's
/// spelling), a bucket of `burst` bytes (3000: 50 60-byte frames) and a queue of `limit`
/// bytes.
fn tbf_lab_with(tag: &str, lab_args: &[&str], rate: &str, burst: u32, limit: u32) -> Option<Line> {
    if !need_program("tc") {
        return None;
    }
    let args: Vec<&str> = ["--kernel", "route"]
        .iter()
        .chain(lab_args)
        .copied()
        .collect();
    let lab = Line::up(tag, &args)?;
    quiet(&lab);
    let st = lab
        .dut
        .command("tc")
        .args(["qdisc", "add", "dev", "fldut1", "root", "tbf", "rate", rate])
        .args(["burst", &burst.to_string(), "limit", &limit.to_string()])
        .status()
        .expect("tc");
    assert!(st.success());
    Some(lab)
}

/// A rate limiter, not a queue: the DUT's kernel routes through an nftables policer of
/// 30 000 frames a second (`limit rate over 30000/second burst 1000 packets drop`), which
/// forwards its rate however hard it is pushed, behind a generator whose ceiling (the maximum
/// here: no line rate) is hundreds of times higher. The search once aimed its second trial at
/// half of what the first overload trial delivered, passed there, and stopped at half the
/// policer's rate.
///
/// The policer's burst is 1000 frames (33 ms of its rate), as a real one's is tens of ms: with
/// a burst of 50 (1.7 ms) the generator's own bunching (bursts of up to 32 frames, two of them
/// back to back after a late wake-up) lost a few frames at every rate — 0.1-0.2 % at 7-15 k
/// frames/s here, and on the CI host more than the 0.5 % tolerance at 15 k, so the search
/// walked down to a quarter of the rate. With 1000 a 2 s trial may carry 500 frames/s more
/// than the rate (the burst spread over it), which the 10 s confirmation and the long trials
/// take back: the PDR must end within 3 % below the policer's rate, the NDR within 5 %.
#[test]
fn a_rate_limiter_is_found_at_its_rate() {
    if !need_program("nft") {
        return;
    }
    let Some(lab) = Line::up(
        "p",
        &["--kernel", "route", "--steer", "rss", "--cpu-queue", "512"],
    ) else {
        return;
    };
    quiet(&lab);
    for rule in [
        &["add", "table", "inet", "fl_policer"][..],
        &[
            "add",
            "chain",
            "inet",
            "fl_policer",
            "c",
            "{ type filter hook forward priority 0; }",
        ],
        &[
            "add",
            "rule",
            "inet",
            "fl_policer",
            "c",
            "limit",
            "rate",
            "over",
            "30000/second",
            "burst",
            "1000",
            "packets",
            "drop",
        ],
    ] {
        let st = lab.dut.command("nft").args(rule).status().expect("nft");
        assert!(st.success(), "nft {rule:?}");
    }
    // The generator needs its CPU for the 30 000/s it offers: on a machine busier than the
    // suite's hog it may fall short (tester-limited, said so): a bounded retry of a fully
    // checked attempt.
    common::up_to(3, |_| {
        let (code, j, err) = rfc2544(&lab, &["--tests", "throughput", "--trial-secs", "2"]);
        assert_eq!(code, Some(0), "{err}");
        let t = &j["sizes"][0]["throughput"];
        let pdr = t["pdr"]["pps"].as_f64().expect("pdr");
        assert_eq!(t["pdr"]["confirmed"], true, "{t}");
        assert!(
            (29_100.0..=30_300.0).contains(&pdr),
            "PDR {pdr} against a 30 000/s policer: {t}; trials {}",
            j["trials"]
        );
        let ndr = t["ndr"]["pps"].as_f64().expect("ndr");
        assert!(
            (28_500.0..=30_300.0).contains(&ndr),
            "{t}; trials {}",
            j["trials"]
        );
        // The first failure's delivered rate was used: no trial between a third and 97 % of the
        // policer's rate was needed to find it (halving from it tried 15 000).
        let trials = trials(&j);
        let second = &trials[2];
        assert!(
            second["rate_pps"].as_f64().expect("rate") > 29_000.0,
            "{second}"
        );
        valid(&j);
    });
}

/// The bucket holds 500 frames (10 ms of its rate) and the queue 1000: with the other tests'
/// 50-frame bucket, a CPU shared with a busy process (one spinning beside the suite, found
/// after the run) ran the bucket's timer late enough to lose its tokens, and the DUT carried
/// 38-42 k of its 50 k in all three attempts. A 2 s trial may then carry what the queue and
/// the bucket hold besides its rate, 1500 frames: 750 a second more, which the window allows.
#[test]
fn a_dut_of_known_capacity_is_found_within_the_resolution() {
    let Some(lab) = tbf_lab_with(
        "c",
        &["--steer", "rss", "--cpu-queue", "512"],
        "24mbit",
        30_000,
        60_000,
    ) else {
        return;
    };
    let mut limited = Vec::new();
    for _ in 0..3 {
        let (g0, s0) = (
            dev_counts(&lab.gen, "flgen"),
            dev_counts(&lab.sink, "flsink"),
        );
        // 100 Mbit/s of line is 148 810 pps of 64-byte frames: resolution 1 % = 1 488 pps.
        let (code, j, err) = rfc2544(
            &lab,
            &[
                "--tests",
                "throughput",
                "--line-rate",
                "100M",
                "--trial-secs",
                "2",
                "--confirm-secs",
                "2",
            ],
        );
        let (g1, s1) = (
            dev_counts(&lab.gen, "flgen"),
            dev_counts(&lab.sink, "flsink"),
        );
        assert_eq!(code, Some(0), "{err}");
        let size = &j["sizes"][0];
        assert_eq!(size["max"]["source"], "line rate", "{j}");
        let max = size["max"]["pps"].as_f64().expect("max");
        assert!((max - 1e8 / 672.0).abs() < 1.0, "{max}");
        // Every frame is accounted: what left flgen is what the trials sent (the ceiling ran
        // on its own veth) plus the learning frames, and what reached flsink is what the
        // trials received (or their receiver dropped) plus the learning frames.
        let ts = trials(&j);
        let counted: Vec<&Value> = ts.iter().filter(|t| t["test"] != "ceiling").collect();
        let sum = |k: &str| -> u64 { counted.iter().map(|t| t[k].as_u64().expect("n")).sum() };
        assert_eq!(
            g1.1 - g0.1,
            sum("sent") + 100 - sum("refused"),
            "flgen's tx counter: {err}"
        );
        // Frames the sink's ring had no room for (a starved receiver on a busy machine; such
        // a trial is tester-limited) reached flsink too: counted, not lost from the books.
        assert_eq!(
            s1.0 - s0.0,
            sum("received") + sum("receiver_dropped") + 100,
            "flsink's rx counter: {err}"
        );
        let t = &size["throughput"];
        let ndr = t["ndr"]["pps"].as_f64().expect("ndr");
        if t["ndr"]["tester_limited"] == true {
            limited.push(err);
            continue;
        }
        assert_eq!(t["ndr"]["confirmed"], true, "{t}");
        // Converged within its bound (16 trials); how many it takes is a benchmark figure
        // (BENCHMARKS.md: 4-5 on a quiet machine), not a test's: a loaded CI machine failed
        // a confirmation and needed 12.
        assert_eq!(t["exhausted"], false, "{t}");
        assert!(t["trials"].as_u64().expect("n") <= 16, "{t}");
        // Trials above the limit lost frames, and said so.
        assert!(counted
            .iter()
            .any(|t| t["verdict"] == "fail" && t["rate_pps"].as_f64().expect("r") > CAPACITY_PPS));
        // The limit within the resolution (and tbf's own rounding, < 0.5 %), never above what
        // a 2 s trial can carry (the rate and the 1500 frames held). Below it, a busy machine
        // can be the cause: a generator whose sends bunch up fills the bucket at 98 % of its
        // rate (seen in CI with a 50-frame bucket: 17 of 97 465 frames lost at 48 992 pps, so
        // the search went one step lower, to 48 248); that attempt is fully checked above and
        // another is made (at most three).
        let window =
            CAPACITY_PPS - 1_488.0 - CAPACITY_PPS * 0.005..=CAPACITY_PPS * 1.005 + 1_500.0 / 2.0;
        assert!(
            ndr <= *window.end(),
            "NDR {ndr} above a DUT of {CAPACITY_PPS}: {err}"
        );
        if !window.contains(&ndr) {
            limited.push(format!("NDR {ndr} below the window {window:?}: {err}"));
            continue;
        }
        assert_eq!(j["receiver"], "af-xdp", "the default receiver");
        // IPv6 through the same bucket: 124-byte frames (128 with FCS), 24 194 per second;
        // received by the AF_PACKET sink, the other receiver.
        let (code, j, err) = rfc2544(
            &lab,
            &[
                "--rx-backend",
                "af-packet",
                "--ipv6",
                "--tests",
                "throughput",
                "--line-rate",
                "100M",
                "--sizes",
                "128",
                "--trial-secs",
                "2",
                "--confirm-secs",
                "2",
            ],
        );
        assert_eq!(code, Some(0), "{err}");
        assert!(
            j["to"].as_str().expect("to").starts_with("[2001:2:0:1::2]"),
            "{j}"
        );
        assert_eq!(j["receiver"], "af-packet");
        let t = &j["sizes"][0]["throughput"];
        let v6 = t["ndr"]["pps"].as_f64().expect("ndr");
        let (cap6, step6) = (24e6 / (124.0 * 8.0), 1e8 / (148.0 * 8.0) * 0.01);
        // What the queue and the bucket hold, over the 2 s trial: 90 000 bytes of 124-byte
        // frames.
        let held6 = 90_000.0 / 124.0 / 2.0;
        if t["ndr"]["tester_limited"] != true {
            assert!(
                (cap6 - step6 - cap6 * 0.005..=cap6 * 1.005 + held6).contains(&v6),
                "IPv6 NDR {v6} for a DUT of {cap6}: {err}"
            );
        }
        return;
    }
    panic!(
        "no attempt of three found the DUT's capacity (tester-limited, or below it): {limited:?}"
    );
}

/// A DUT that still holds frames when the generator stops gives them all up to the tester,
/// which counts until nothing has come for 0.1 s (not a fixed pause) and says how long that
/// took. The DUT: a token bucket of 20 000 60-byte frames per second with a queue of 50 000;
/// offered 30 000 a second for 2 s, it forwards 20 000 a second and queues the rest, 20 000
/// frames that leave in the second after the last is sent. A fixed 0.2 s pause (before)
/// counted four fifths of them as lost.
///
/// The rates stay well below what the kernel's path through a token bucket takes here: on
/// this VM each frame that waits costs the bucket a timer reprogramming, and above ~52 000
/// frames a second the forwarding CPU's queue overflowed before the bucket's did. The bucket
/// holds 500 frames (25 ms of its rate) and the queue twice what the model fills: with 50 and
/// 25 000, a CPU shared with a busy process ran the bucket's timer late, it forwarded less
/// than its rate, and the queue overflowed (361 of 59 781 lost beside a CPU hog; with a
/// 500-frame bucket alone still 185 in one of four runs, none in five with both).
#[test]
fn frames_a_dut_still_holds_are_counted_not_lost() {
    // Software RSS puts the DUT's forwarding on the other CPU (without it the generator pays
    // for the DUT's work in its own sends), its CPU queue as deep as the lab makes it.
    let Some(lab) = tbf_lab_with("d", &["--steer", "rss"], "9600kbit", 30_000, 3_000_000) else {
        return;
    };
    // Each attempt checked in full, at most three (see `common::up_to`).
    common::up_to(3, |_| frames_held_attempt(&lab));
}

fn frames_held_attempt(lab: &Line) {
    const RATE: f64 = 20_000.0;
    let s0 = dev_counts(&lab.sink, "flsink");
    // The frame loss test from 100 % of a line rate of 30 000 frames/s (84 bytes each on the
    // wire) down, until two trials in a row lose nothing: 100 % and 90 %.
    let (code, j, err) = rfc2544(
        lab,
        &[
            "--tests",
            "loss",
            "--line-rate",
            "20.16Mbit",
            "--confirm-secs",
            "2",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let s1 = dev_counts(&lab.sink, "flsink");
    let ts = trials(&j);
    let loss: Vec<&Value> = ts.iter().filter(|t| t["test"] == "frame-loss").collect();
    assert_eq!(loss.len(), 2, "{err}");
    let first = loss[0];
    let n = |k: &str| first[k].as_u64().expect("n");
    // Every frame sent came out and was counted: none lost, none dropped by the receiver.
    assert_eq!(n("received"), n("sent"), "{err}");
    assert_eq!(n("receiver_dropped"), 0, "{err}");
    // What it took: at least the 1 s the queue needs at the bucket's rate (less what a
    // generator short of its rate left unqueued), within the 2 s bound.
    let offered = first["offered_pps"].as_f64().expect("offered");
    let queued = (offered - RATE) * first["secs"].as_f64().expect("secs");
    let drained = first["drained_s"].as_f64().expect("drained");
    assert!(
        drained >= 0.8 * queued / RATE && drained < 2.0,
        "drained {drained} s with {queued} frames queued: {err}"
    );
    assert!(
        queued > 10_000.0,
        "the generator queued too little to tell: {err}"
    );
    // flsink got what the trials received and the learning frames: nothing the sink missed.
    let got: u64 = ts
        .iter()
        .filter(|t| t["test"] != "ceiling")
        .map(|t| t["received"].as_u64().expect("n"))
        .sum();
    assert_eq!(s1.0 - s0.0, got + 100, "flsink's rx counter: {err}");
}

/// The bucket here holds 500 frames (10 ms of its rate), not the other tests' 50: at three
/// times its rate the DUT's CPU forwards 150 000 frames a second into it, and the bucket's
/// timer, run late on that busy CPU, found a 50-frame bucket full and lost its tokens — so it
/// carried 42-50 k of its 50 k a second (three runs here; 73.6 % loss where 64.0 % was the
/// model on the CI host). With 500 it carried 51.0-51.1 k in three runs (its rate and what the
/// queue and the bucket held), which is the model: on a slower CPU the timer may run later by
/// ten times what it did here before the model fails.
#[test]
fn latency_and_loss_follow_the_known_dut() {
    let Some(lab) = tbf_lab_with(
        "l",
        &["--steer", "rss", "--cpu-queue", "512"],
        "24mbit",
        30_000,
        60_000,
    ) else {
        return;
    };
    // Each attempt checked in full, at most three (see `common::up_to`).
    common::up_to(3, |_| latency_and_loss_attempt(&lab));
}

fn latency_and_loss_attempt(lab: &Line) {
    let dir = std::env::temp_dir().join(format!("fl-rfc2544-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (csv, html) = (dir.join("r.csv"), dir.join("r.html"));
    let (code, j, err) = rfc2544(
        lab,
        &[
            &SHORT_AT_100M[..],
            &[
                "--tests",
                "throughput,latency,loss",
                "--latency-trials",
                "2",
            ],
            &["--csv", csv.to_str().expect("path")],
            &["--html", html.to_str().expect("path")],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    let size = &j["sizes"][0];
    let ndr = size["throughput"]["ndr"]["pps"].as_f64().expect("ndr");
    // Latency: one result per trial, at the NDR, percentiles in order.
    let lat = &size["latency"];
    assert_eq!(lat["rate_pps"].as_f64(), Some(ndr));
    let lt = lat["trials"].as_array().expect("trials");
    assert_eq!(lt.len(), 2, "{lat}");
    for l in lt {
        let p = |k: &str| l[k].as_u64().expect("ns");
        assert!(p("p50") > 0 && p("p50") <= p("p99") && p("p99") <= p("p999"));
        assert!(p("p999") <= p("max"), "{l}");
    }
    // Frame loss: from 100 % down in 10 % steps until two in a row lose nothing; what is lost
    // is the excess over the bucket's rate (less the queue's 1050 frames).
    let pts = size["frame_loss"].as_array().expect("points");
    let pcts: Vec<u64> = pts
        .iter()
        .map(|p| p["pct_of_max"].as_u64().expect("pct"))
        .collect();
    assert_eq!(&pcts[..3], &[100, 90, 80], "{pcts:?}");
    let n = pts.len();
    assert!(n >= 2 && pts[n - 1]["loss_pct"] == 0.0 && pts[n - 2]["loss_pct"] == 0.0);
    assert!(
        n < 3 || pts[n - 3]["loss_pct"].as_f64().expect("loss") > 0.0,
        "{pcts:?}"
    );
    // The model takes the rate the generator delivered (on a loaded machine it may fall short
    // of the maximum; the trial then says so) less the 1500 frames the queue and the bucket
    // held (the CPU queue's 512 more are 0.3 % of a second at the maximum: inside the margin).
    let full = pts[0]["loss_pct"].as_f64().expect("loss");
    let offered = pts[0]["offered_pps"].as_f64().expect("offered");
    let model = 100.0 * (1.0 - CAPACITY_PPS / offered - 1500.0 / offered);
    assert!(
        (full - model).abs() < 3.0,
        "loss {full} % at the maximum, {model} % expected: {}",
        pts[0]
    );
    // Rates the bucket carries lose nothing.
    for p in pts {
        if p["rate_pps"].as_f64().expect("rate") < 0.9 * CAPACITY_PPS {
            assert_eq!(p["loss_pct"], 0.0, "{p}");
        }
    }
    // The JSON contract: valid against the documented schema.
    valid(&j);
    // The files: one CSV row per trial, a page with its charts.
    let rows = std::fs::read_to_string(&csv).expect("csv");
    assert_eq!(
        rows.lines().count(),
        j["trials"].as_array().expect("t").len() + 1
    );
    let page = std::fs::read_to_string(&html).expect("html");
    assert!(page.contains("<svg") && page.contains("Frame loss against offered load"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Back-to-back at the line rate: the DUT holds its CPU queue, the bucket's queue and the
/// bucket (2 048 + 1 050 frames) while it forwards at its rate, so a clean burst at the line
/// rate R can be 3 098 / (1 − 50k/R) = 4 666 frames long. The paced generator is not exact
/// within a burst: it catches up after a stall faster than R (so a burst of at least the
/// 1 050 frames the bucket holds, not 4 666, may be all that passes), and starts a run
/// slower than R (so bursts may come out longer): bounds that hold whatever it did — and
/// every search found a burst that lost frames, below the longest the test may send.
#[test]
fn back_to_back_follows_the_known_dut() {
    let Some(lab) = tbf_lab("b", Steer::RssDeep) else {
        return;
    };
    let (code, j, err) = rfc2544(
        &lab,
        &[
            &SHORT_AT_100M[..],
            &[
                "--tests",
                "throughput,b2b",
                "--b2b-trials",
                "2",
                "--b2b-max-secs",
                "0.1",
            ],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{err}");
    let size = &j["sizes"][0];
    let max = size["max"]["pps"].as_f64().expect("max");
    let ndr = size["throughput"]["ndr"]["pps"].as_f64().expect("ndr");
    let b = &size["back_to_back"];
    if let Some(why) = b["tester_limited"].as_str() {
        // A busy machine's generator could not send the burst at the line rate: the run
        // measured the tester, and says so (what this test cannot check here).
        eprintln!("SKIP (bursts): {why}");
        return;
    }
    let bursts = b["bursts"].as_array().expect("bursts");
    assert_eq!(bursts.len(), 2, "{b}");
    for n in bursts {
        let n = n.as_u64().expect("n") as f64;
        assert!(n >= 1_000.0, "{b}");
        assert!(n < 0.1 * max, "no burst lost a frame: {b}");
    }
    let held = b["buffer_frames"].as_f64().expect("buffer");
    assert!((650.0..2.0 * (DEEP_QUEUE + 1050.0)).contains(&held), "{b}");
    // RFC 9004's corrected time: implied × (1 − throughput / maximum).
    let corrected = b["corrected_buffer_s"].as_f64().expect("corrected");
    let implied = b["implied_buffer_s"].as_f64().expect("implied");
    assert!(
        (corrected - implied * (1.0 - ndr / max)).abs() < 1e-9,
        "{b}"
    );
    valid(&j);
}

#[test]
fn a_dut_faster_than_the_generator_is_reported_as_tester_limited() {
    let Some(lab) = Line::up("u", &[]) else {
        return;
    };
    quiet(&lab);
    // Native XDP routing forwards in the softirq of the generator's own sends: it can never
    // fall behind the generator, so no DUT figure may come out of this run.
    let mut cmd = lab.dut.command(BIN);
    cmd.args(["forward", "--mode", "route", "--backend", "xdp"])
        .args(["--dev", "fldut", "--dev", "fldut1", "--quiet"]);
    let fwd = Forwarder::start(cmd);
    let (code, j, err) = rfc2544(
        &lab,
        &[
            "--tests",
            "throughput",
            "--trial-secs",
            "1",
            "--confirm-secs",
            "1",
        ],
    );
    let (fcode, _) = fwd.finish();
    assert_eq!(fcode, Some(0));
    assert_eq!(code, Some(0), "{err}");
    let size = &j["sizes"][0];
    assert_eq!(size["max"]["source"], "generator", "{j}");
    let ceiling = size["max"]["ceiling_pps"].as_f64().expect("ceiling");
    let ndr = &size["throughput"]["ndr"];
    assert_eq!(ndr["tester_limited"], true, "{ndr}: {err}");
    // The figure shown is what was delivered, never more than the rate asked (the pacer
    // may deliver a hair over it: then the rate asked).
    let delivered = ndr["delivered_pps"].as_f64().expect("delivered");
    let asked = ndr["pps"].as_f64().expect("pps");
    let line = size["throughput"]["ndr_line_bps"].as_f64().expect("bps");
    assert!(
        (line - delivered.min(asked) * 84.0 * 8.0).abs() < 1.0,
        "{line} {delivered} {asked}"
    );
    // Every trial at 80 % of the ceiling or more is marked.
    for t in trials(&j) {
        if t["test"] == "throughput" && t["rate_pps"].as_f64().expect("r") >= 0.8 * ceiling {
            assert!(
                !t["tester_limited"].as_array().expect("list").is_empty(),
                "{t}"
            );
        }
    }
    assert!(err.contains("TESTER-LIMITED"), "{err}");
}

#[test]
fn bad_requests_are_usage_errors() {
    let devs = ["--tx-dev", "a", "--rx-dev", "b", "--to", "198.18.1.2"];
    let cases: [&[&str]; 10] = [
        &[],
        &["--tx-dev", "a"],
        &["--lab", "fl-no-such-lab"],
        &["--line-rate", "5Mpps"],
        &["--sizes", "40"],
        &["--tests", "speed"],
        &["--resolution", "80"],
        &["--tx-netns", "fl-none"],
        // Side files that cannot be written are refused before the first trial (they were
        // found after the last, and the JSON asked for never appeared).
        &["--csv", "/proc/fl-no-such-dir/x.csv"],
        &["--html", "/tmp"],
    ];
    for (k, extra) in cases.iter().enumerate() {
        let mut cmd = Command::new(BIN);
        cmd.arg("rfc2544");
        // The first three say nothing (or not enough) about where; the rest are cabled.
        if k >= 3 {
            cmd.args(devs);
        }
        let out = cmd.args(*extra).output().expect("runs");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn an_imix_through_the_known_dut_finds_its_bit_rate() {
    let Some(lab) = tbf_lab("i", Steer::Rss) else {
        return;
    };
    // 7×64, 4×594, 1×1518 with FCS: 357.8 bytes per frame on the wire without FCS, so the
    // 24 Mbit/s bucket carries 8 384 frames per second of the mix; the mix goes through
    // AF_XDP (the live-frames generator sends one size per run).
    let cap = 24e6 / ((4294.0 / 12.0) * 8.0);
    // Each attempt checked in full (a tester-limited one says nothing, and fails), at most
    // three (see `common::up_to`).
    common::up_to(3, |_| {
        let (code, j, err) = rfc2544(
            &lab,
            &[
                "--tests",
                "throughput",
                "--imix",
                "64:7,594:4,1518:1",
                "--line-rate",
                "100M",
                "--trial-secs",
                "2",
                "--confirm-secs",
                "2",
            ],
        );
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(j["generator"], "AF_XDP (paced in user space)");
        let size = &j["sizes"][0];
        let mean = size["frame_bytes"].as_f64().expect("bytes");
        assert!((mean - 4342.0 / 12.0).abs() < 1e-9, "{size}");
        let max = size["max"]["pps"].as_f64().expect("max");
        let t = &size["throughput"];
        assert_ne!(
            t["ndr"]["tester_limited"], true,
            "the tester was the limit: {t}"
        );
        let ndr = t["ndr"]["pps"].as_f64().expect("ndr");
        // Within the resolution, and the bucket's queue (168 frames of the mix) over a 2 s
        // trial.
        let slack = 0.01 * max + 0.02 * cap;
        assert!((ndr - cap).abs() <= slack, "NDR {ndr} for {cap}: {err}");
    });
}

/// The default receiver needs the receiving interface's queues for its AF_XDP sockets: when
/// another program holds them, the run stops with a usage error that names the way out.
#[test]
fn a_taken_receiver_queue_is_a_usage_error_naming_the_way_out() {
    let Some(lab) = Line::up("x", &["--kernel", "route"]) else {
        return;
    };
    quiet(&lab);
    // Another program holds flsink's hook: an AF_XDP sink of our own, for the whole test (its
    // banner comes once its program is attached).
    let mut sink_cmd = lab.sink.command(BIN);
    sink_cmd.args([
        "sink",
        "--dev",
        "flsink",
        "--backend",
        "af-xdp",
        "--duration",
        "120",
        "--json",
    ]);
    let holder = common::Running::start_with(sink_cmd, "flowlane sink:");
    let args = [
        "--tests",
        "throughput",
        "--line-rate",
        "100M",
        "--trial-secs",
        "0.5",
        "--max-trials",
        "2",
    ];
    let (code, _, err) = rfc2544(&lab, &args);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("already has an AF_XDP socket") && err.contains("--rx-backend af-packet"),
        "{err}"
    );
    // The holder was left alone: it still runs and ends with its summary. (The AF_PACKET
    // receiver itself is run in the known-capacity test.)
    let (code, j) = holder.finish();
    assert_eq!(code, Some(0), "{j}");
}

/// The software-RSS program's per-CPU counts on the DUT (`lab status`): frames it saw per
/// CPU it steered to.
fn steered(lab: &Line) -> Vec<u64> {
    let out = Command::new(BIN)
        .args(["lab", "status", "--name", &lab.name, "--json"])
        .output()
        .expect("lab status");
    let j: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    j["status"]["steer_counts"]
        .as_array()
        .expect("steer_counts (the lab steers with --steer rss)")
        .iter()
        .map(|c| c["arrived"].as_u64().expect("arrived"))
        .collect()
}

/// `--per-queue K` places K flows on each of the DUT's RSS queues with the picker: the DUT's
/// own steering program, which hashes every frame itself, counts the same share on each CPU.
#[test]
fn per_queue_flows_land_evenly_on_the_duts_queues() {
    let Some(lab) = Line::up("q", &["--kernel", "route", "--steer", "rss"]) else {
        return;
    };
    quiet(&lab);
    // A throughput search at 512 B with `placement`: frames each CPU's steering saw, frames
    // the trials delivered to the DUT, the standard error.
    let run = |placement: &[&str]| {
        let before = steered(&lab);
        assert_eq!(before.len(), 2, "{before:?}");
        let mut args = vec![
            "--tests",
            "throughput",
            "--sizes",
            "512",
            "--line-rate",
            "100M",
            "--trial-secs",
            "0.5",
            "--confirm-secs",
            "1",
        ];
        args.extend_from_slice(placement);
        let (code, j, err) = rfc2544(&lab, &args);
        assert_eq!(code, Some(0), "{err}");
        let got: Vec<u64> = steered(&lab)
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect();
        let sent: u64 = trials(&j)
            .iter()
            .filter(|t| t["test"] != "ceiling")
            .map(|t| t["sent"].as_u64().expect("n") - t["refused"].as_u64().expect("n"))
            .sum();
        (got, sent, err, j)
    };
    // The report names the flows it placed and their queues.
    let placed = |j: &Value| -> Vec<u64> {
        j["placement"]["flows"]
            .as_array()
            .unwrap_or_else(|| panic!("placement.flows: {}", j["placement"]))
            .iter()
            .map(|f| f["queue"].as_u64().expect("queue"))
            .collect()
    };
    let (got, sent, err, j) = run(&["--per-queue", "2"]);
    let mut queues = placed(&j);
    queues.sort_unstable();
    assert_eq!(queues, [0, 0, 1, 1], "{}", j["placement"]);
    assert_eq!(j["placement"]["by_default"], false);
    valid(&j);
    // Every frame the trials delivered to the DUT went through its program (plus learning
    // frames and the odd neighbour frame).
    let total: u64 = got.iter().sum();
    assert!(
        (sent + 100..=sent + 120).contains(&total),
        "{got:?} for {sent} sent + 100 learning"
    );
    // Four flows, two on each queue, sent in turn: each CPU half of them, within a few
    // frames (a trial's count need not divide by four; neighbour frames).
    for g in &got {
        let share = *g as f64 / total as f64;
        assert!((0.49..=0.51).contains(&share), "{got:?}: {err}");
    }
    // --pick-queues 1: one flow, on queue 1 only — CPU 0 sees no more than neighbour frames.
    // And by default: one flow, placed off the generator's CPU (0), so on queue 1 too.
    for placement in [&["--per-queue", "1", "--pick-queues", "1"][..], &[]] {
        let (got, sent, err, j) = run(placement);
        assert_eq!(placed(&j), [1], "{}", j["placement"]);
        assert_eq!(j["placement"]["by_default"], placement.is_empty());
        assert!(
            got[0] <= 20,
            "{got:?}: CPU 0 got more than neighbour frames: {err}"
        );
        assert!(
            (sent + 100..=sent + 120).contains(&got[1]),
            "{got:?} for {sent} sent + 100 learning"
        );
        assert!(
            err.contains("flows placed on the DUT's RSS queue 1, 1 each"),
            "{err}"
        );
    }
    // A queue the DUT does not have: a usage error, before any line about the run.
    let (code, _, err) = rfc2544(&lab, &["--per-queue", "1", "--pick-queues", "7"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("queue 7 does not exist"), "{err}");
    assert!(!err.contains("flowlane rfc2544:"), "{err}");

    // The same DUT cabled by hand (--tx-dev/--rx-dev, as between hosts), its RSS given as a
    // user gives another host's: the key, and the table as a file. Placed by it, flows reach
    // only queue 1, as the DUT's own program counts.
    let cfg = flowlane_lab::setup::saved(&lab.name).expect("the lab's saved configuration");
    let table = std::env::temp_dir().join(format!("fl-reta-{}", std::process::id()));
    let words: Vec<String> = cfg.reta.iter().map(u16::to_string).collect();
    std::fs::write(&table, words.join(" ")).expect("table file");
    let (gen_ns, sink_ns) = (format!("{}-gen", lab.name), format!("{}-sink", lab.name));
    let table_arg = table.display().to_string();
    let by_hand = |extra: &[&str]| {
        let before = steered(&lab);
        let out = Command::new(BIN)
            .args([
                "rfc2544",
                "--json",
                "--tx-dev",
                "flgen",
                "--tx-netns",
                &gen_ns,
            ])
            .args(["--rx-dev", "flsink", "--rx-netns", &sink_ns, "--to"])
            .args([flowlane_lab::setup::LAB_SINK_V4, "--sizes", "512"])
            .args(["--pause", "0.3", "--learning-frames", "100"])
            .args(["--tests", "throughput", "--line-rate", "100M"])
            .args(["--trial-secs", "0.5", "--confirm-secs", "1"])
            .args(extra)
            .output()
            .expect("runs");
        let got: Vec<u64> = steered(&lab)
            .iter()
            .zip(&before)
            .map(|(a, b)| a - b)
            .collect();
        let j: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (
            out.status.code(),
            j,
            got,
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, j, got, err) = by_hand(&[
        "--per-queue",
        "2",
        "--pick-queues",
        "1",
        "--key",
        &cfg.key,
        "--reta",
        &table_arg,
    ]);
    let _ = std::fs::remove_file(&table);
    assert_eq!(code, Some(0), "{err}");
    valid(&j);
    assert_eq!(placed(&j), [1, 1], "{}", j["placement"]);
    assert!(
        got[0] <= 20,
        "{got:?}: queue 0's CPU got more than neighbour frames: {err}"
    );
    assert!(got[1] > 1000, "{got:?}: {err}");
    // The lab's own placement refuses a model given by hand, and a model without placement
    // is refused rather than ignored.
    let (code, _, err) = rfc2544(&lab, &["--per-queue", "1", "--queues", "2"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--queues: --lab places flows by the lab's own key"),
        "{err}"
    );
    let (code, _, _, err) = by_hand(&["--key", "microsoft"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("use it with --per-queue"), "{err}");
}

/// Interrupted while it measures the generator's ceiling (its first step), with the two
/// SIGINTs `timeout -s INT` delivers at once: the run prints what it has, marked interrupted,
/// as valid JSON, and exits 130. (It exited 0 after one signal there, and 1 with an empty
/// standard output after two.)
#[test]
fn an_interrupted_run_prints_its_report_and_exits_130() {
    let Some(lab) = Line::up("n", &["--kernel", "route"]) else {
        return;
    };
    let (out, rest) = interrupted(&lab, &["--sizes", "64,512"], std::process::Stdio::piped());
    assert_eq!(out.status.code(), Some(130), "{rest}");
    let j: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("a JSON report ({e}): {rest}"));
    assert_eq!(j["interrupted"], true, "{j}");
    valid(&j);
    // The same with standard output on a full device (issue 49 item 1): the report cannot be
    // written, which is said, exit 1, never a panic.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let (out, rest) = interrupted(&lab, &["--sizes", "64"], full.into());
    assert_eq!(out.status.code(), Some(1), "{rest}");
    assert!(
        rest.contains("flowlane: error: writing") && !rest.contains("panicked"),
        "{rest}"
    );
}

/// An rfc2544 throughput run with `--json`, its stdout on `stdout`, given two SIGINTs (as
/// `timeout -s INT` sends) 300 ms after its banner: its output and the rest of its stderr.
fn interrupted(
    lab: &Line,
    sizes: &[&str],
    stdout: std::process::Stdio,
) -> (std::process::Output, String) {
    use flowlane_io::os::{signal_process, Signal};
    let mut child = Command::new(BIN)
        .args([
            "rfc2544",
            "--lab",
            &lab.name,
            "--json",
            "--tests",
            "throughput",
        ])
        .args(sizes)
        .stdout(stdout)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rfc2544");
    // The banner is the first line on stderr (--json): the run has begun.
    let mut err = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut banner = String::new();
    std::io::BufRead::read_line(&mut err, &mut banner).expect("banner");
    assert!(banner.starts_with("flowlane rfc2544:"), "{banner}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    for _ in 0..2 {
        signal_process(child.id(), Signal::Interrupt).expect("SIGINT");
    }
    let out = child.wait_with_output().expect("ends");
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    (out, rest)
}

/// Issue 49 item 8: jumbo frames. `--sizes 9000` was refused naming the tester's own
/// calibration pair (`flc…a`, MTU 1500) even where the devices carried 9 000; the pair now
/// takes the tx interface's MTU (its dropping end with a multi-buffer XDP program), frames
/// above a page go out through an AF_PACKET ring, and what the interfaces or the AF_XDP
/// receiver cannot carry is refused before anything is measured, naming the interface.
#[test]
fn jumbo_frames_are_measured_where_the_devices_carry_them() {
    let Some(lab) = Line::up("j", &["--kernel", "route"]) else {
        return;
    };
    quiet(&lab);
    // At a 1 500-byte MTU: refused, naming the generator's interface.
    let (code, _, err) = rfc2544(&lab, &["--sizes", "9018", "--tests", "throughput"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--tx-dev flgen carries (MTU 1500"), "{err}");
    for (ns, dev) in [
        (&lab.gen, "flgen"),
        (&lab.dut, "fldut"),
        (&lab.dut, "fldut1"),
        (&lab.sink, "flsink"),
    ] {
        ns.ip(&["link", "set", dev, "mtu", "9000"])
            .expect("mtu 9000");
    }
    // The AF_XDP receiver cannot hold 9 000 bytes: said before the run.
    let (code, _, err) = rfc2544(&lab, &["--sizes", "9000", "--tests", "throughput"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--rx-backend af-packet"), "{err}");
    let before = dev_counts(&lab.sink, "flsink");
    let (code, j, err) = rfc2544(
        &lab,
        &[
            "--sizes",
            "9000",
            "--tests",
            "throughput",
            "--rx-backend",
            "af-packet",
            "--trial-secs",
            "1",
            "--max-trials",
            "4",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let after = dev_counts(&lab.sink, "flsink");
    let size = &j["sizes"][0];
    assert_eq!(size["frame_bytes"].as_f64(), Some(9000.0), "{size}");
    let trials = trials(&j);
    let ceiling = &trials[0];
    assert_eq!(ceiling["verdict"], "ceiling", "{ceiling}");
    assert!(ceiling["sent"].as_u64() > Some(0), "{ceiling}");
    // Every trial's frames reached the sink's interface whole: what the sink counted is what
    // the interface received (its learning frames aside).
    let received: u64 = trials.iter().filter_map(|t| t["received"].as_u64()).sum();
    assert!(received > 0, "{j}");
    let got = after.0 - before.0;
    assert!(
        got >= received && got <= received + 1000,
        "flsink received {got}, the trials counted {received}"
    );
    valid(&j);
}
