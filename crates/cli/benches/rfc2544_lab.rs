//! `flowlane rfc2544 --tests throughput` on the line lab with the kernel routing (software
//! RSS on the DUT), against a plain halving search (what TRex's NDR bench and most testers
//! run: `--halving-only`) on the same DUT in the same run, and against the DUT's forwarding
//! rate measured by other means: blast xdp-live unpaced into it for FLOWLANE_BENCH_SECS,
//! frames per second counted on flsink (the rate it forwards when overloaded). Rows:
//!   aimed 1..3   our search three times: NDR per size, trials per size, seconds per run —
//!                the spread of the three NDRs is the repeatability;
//!   halving      the plain binary search once: its trials and seconds;
//!   af-packet rx our search with the AF_PACKET sink instead of the default AF_XDP one (on
//!                veth the receiver's work runs on the DUT's CPU);
//!   forwarding   the overload rate per size (an AF_XDP sink receiving, as in the trials),
//!                and NDR / that rate (both sinks).
//! Sizes 64, 512, 1518 (with FCS); trials 1 s, confirmation 2 s, pause 0.3 s.
//!
//! Run (root): `cargo bench -p flowlane --bench rfc2544_lab`.

mod common;

use std::process::Command;

use common::{rx, BIN};
use flowlane_lab::Netns;

const SIZES: [usize; 3] = [64, 512, 1518];

/// One rfc2544 run: per size (NDR pps, trials), and the run's seconds.
fn run(lab: &str, extra: &[&str]) -> (Vec<(f64, u64, bool)>, f64) {
    let out = Command::new(BIN)
        .args([
            "rfc2544",
            "--lab",
            lab,
            "--json",
            "--quiet",
            "--tests",
            "throughput",
        ])
        .args([
            "--sizes",
            "64,512,1518",
            "--trial-secs",
            "1",
            "--confirm-secs",
            "2",
        ])
        .args(["--pause", "0.3"])
        .args(extra)
        .output()
        .expect("rfc2544 runs");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "rfc2544 JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let sizes = j["sizes"]
        .as_array()
        .expect("sizes")
        .iter()
        .map(|s| {
            let t = &s["throughput"];
            (
                t["ndr"]["pps"].as_f64().unwrap_or(0.0),
                t["trials"].as_u64().unwrap_or(0),
                t["ndr"]["tester_limited"] == true,
            )
        })
        .collect();
    (sizes, j["duration_s"].as_f64().unwrap_or(0.0))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("rfc2544_lab: needs root for network namespaces; skipped");
        return;
    }
    let secs = common::secs();
    let lab = "flb-rfc";
    let up = Command::new(BIN)
        .args([
            "lab",
            "up",
            "--name",
            lab,
            "--topology",
            "line",
            "--kernel",
            "route",
        ])
        .output()
        .expect("lab up");
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let (gen, sink) = (
        Netns::existing(&format!("{lab}-gen")),
        Netns::existing(&format!("{lab}-sink")),
    );
    println!(
        "rfc2544 throughput on the line lab, kernel routing DUT; sizes {SIZES:?}; trials 1 s, \
         confirmation 2 s"
    );
    println!(
        "{:<12} {:>26} {:>26} {:>26} {:>8}",
        "row", "64 B NDR (trials)", "512 B NDR (trials)", "1518 B NDR (trials)", "secs"
    );
    let show = |name: &str, r: &(Vec<(f64, u64, bool)>, f64)| {
        let cells: Vec<String> =
            r.0.iter()
                .map(|(n, t, l)| format!("{n:.0} ({t}){}", if *l { " TL" } else { "" }))
                .collect();
        println!(
            "{name:<12} {:>26} {:>26} {:>26} {:>8.0}",
            cells.first().cloned().unwrap_or_default(),
            cells.get(1).cloned().unwrap_or_default(),
            cells.get(2).cloned().unwrap_or_default(),
            r.1
        );
    };
    let mut aimed = Vec::new();
    for k in 1..=3 {
        let r = run(lab, &[]);
        show(&format!("aimed {k}"), &r);
        aimed.push(r);
    }
    let halving = run(lab, &["--halving-only"]);
    show("halving", &halving);
    // The receiver's cost is the DUT's on veth: the AF_PACKET sink (a copy of every frame and
    // the kernel's own path) against the default AF_XDP one.
    let packet = run(lab, &["--rx-backend", "af-packet"]);
    show("af-packet rx", &packet);
    // Repeatability: spread of the three NDRs per size, percent of their mean.
    let spread: Vec<String> = (0..SIZES.len())
        .map(|i| {
            let v: Vec<f64> = aimed
                .iter()
                .filter_map(|r| r.0.get(i).map(|x| x.0))
                .collect();
            let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, 0.0f64), |a, &x| (a.0.min(x), a.1.max(x)));
            format!("±{:.1} %", 50.0 * (hi - lo) / mean.max(1e-9))
        })
        .collect();
    println!(
        "{:<12} {:>26} {:>26} {:>26}",
        "spread", spread[0], spread[1], spread[2]
    );
    // The forwarding rate under overload, by blast and the sink's interface counter, with the
    // same receiver as the trials (an AF_XDP sink on flsink: on veth its work is the DUT's
    // CPU's, so leaving it out would measure a different DUT).
    let mut fwd = Vec::new();
    for size in SIZES {
        let receiver = sink
            .command(BIN)
            .args([
                "sink",
                "--dev",
                "flsink",
                "--backend",
                "af-xdp",
                "--cpu",
                "1",
            ])
            .args(["--duration", &(secs + 3.0).to_string(), "--quiet"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("sink starts");
        std::thread::sleep(std::time::Duration::from_secs(1));
        let before = rx(&sink, "flsink");
        let out = gen
            .command(BIN)
            .args([
                "blast",
                "--mode",
                "xdp-live",
                "--dev",
                "flgen",
                "--to",
                "198.18.1.2:9",
            ])
            .args([
                "--cpus",
                "0",
                "--duration",
                &secs.to_string(),
                "--json",
                "--quiet",
            ])
            .args(["--size", &(size - 4).to_string()])
            .output()
            .expect("blast runs");
        let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let window = b["duration_s"].as_f64().unwrap_or(secs).max(1e-9);
        fwd.push((rx(&sink, "flsink") - before) as f64 / window);
        let mut receiver = receiver;
        let _ = receiver.wait();
    }
    let ratio = |i: usize| {
        let ndr = aimed.iter().map(|r| r.0[i].0).sum::<f64>() / aimed.len() as f64;
        format!(
            "{:.0} ({:.2}; {:.2})",
            fwd[i],
            ndr / fwd[i].max(1e-9),
            packet.0[i].0 / fwd[i].max(1e-9)
        )
    };
    println!(
        "{:<12} {:>26} {:>26} {:>26}",
        "forwarding",
        ratio(0),
        ratio(1),
        ratio(2)
    );
    println!(
        "(forwarding: frames/s the DUT delivered when overloaded; in brackets mean NDR / it, \
         then the af-packet row's NDR / it)"
    );
    let _ = Command::new(BIN)
        .args(["lab", "down", "--name", lab])
        .output();
}
