//! `flowlane latency` against cyclictest in the same run (issue 55 item 6): the same CPU, the
//! same 1 000 µs interval, SCHED_FIFO 99, memory locked, PM QoS 0 (cyclictest's defaults),
//! interleaved rounds so drift hits both; then flowlane alone without and with its own load
//! (cpu+vm+io on the measured CPU). Prints each tool's mean of round medians, their ratio
//! (target ≤ 1.0) with a 95 % interval from the rounds as pairs (each flowlane round and the
//! cyclictest round after it: drift that moves both cancels in their difference), and the
//! maxima side by side.
//!
//! Run (root, rt-tests installed): `cargo bench -p flowlane --bench latency_cyclictest`
//! (FLOWLANE_BENCH_ROUNDS, default 10; FLOWLANE_BENCH_LOOPS per round, default 2000).

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// (p50 µs, p99 µs, max µs) of one flowlane round, floored to whole µs as cyclictest's
/// histogram and maximum count them (it divides nanoseconds by 1 000).
fn ours(cpu: usize, loops: u64) -> (f64, f64, f64) {
    let out = Command::new(BIN)
        .args(["latency", "--cpus", &cpu.to_string(), "--interval", "1000"])
        .args(["--loops", &loops.to_string(), "--json", "--quiet"])
        .output()
        .expect("flowlane runs");
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let c = &r["phases"][0]["cpus"][0];
    let us = |k: &str| (c[k].as_u64().unwrap_or(0) / 1000) as f64;
    (us("p50_ns"), us("p99_ns"), us("max_ns"))
}

/// (p50 µs, p99 µs, max µs) of one cyclictest round, from its histogram.
fn theirs(cpu: usize, loops: u64) -> Option<(f64, f64, f64)> {
    let json = std::env::temp_dir().join(format!("fl-bench-ct-{}.json", std::process::id()));
    let out = Command::new("cyclictest")
        .args(["-t1", "-a", &cpu.to_string(), "-p99", "-i1000", "-m", "-q"])
        .args(["-l", &loops.to_string(), "-h", "20000"])
        .arg(format!("--json={}", json.display()))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()?;
    let _ = std::fs::remove_file(&json);
    let t = &j["thread"]["0"];
    let mut h: Vec<(u64, u64)> = t["histogram"]
        .as_object()?
        .iter()
        .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64()?)))
        .collect();
    h.sort_unstable();
    let total: u64 = h.iter().map(|x| x.1).sum();
    let at = |q: f64| {
        let mut c = 0;
        h.iter()
            .find(|&&(_, k)| {
                c += k;
                c as f64 >= q * total as f64
            })
            .map_or(0.0, |x| x.0 as f64)
    };
    Some((at(0.5), at(0.99), t["max"].as_u64().unwrap_or(0) as f64))
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::have_program("cyclictest") {
        eprintln!(
            "latency_cyclictest: {}; skipped",
            flowlane_lab::missing_hint("cyclictest")
        );
        return;
    }
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (rounds, loops) = (
        env("FLOWLANE_BENCH_ROUNDS", 10),
        env("FLOWLANE_BENCH_LOOPS", 2000),
    );
    let cpu = *flowlane_runtime::cpus::CpuSet::current()
        .usable()
        .last()
        .expect("a CPU");
    println!(
        "wake-up latency on CPU {cpu}, 1000 µs, SCHED_FIFO 99: {rounds} interleaved rounds of \
         {loops}"
    );
    let (mut f, mut c) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        f.push(ours(cpu, loops));
        match theirs(cpu, loops) {
            Some(x) => c.push(x),
            None => {
                eprintln!("cyclictest failed (root? SCHED_FIFO allowed?); skipped");
                return;
            }
        }
    }
    let col = |v: &[(f64, f64, f64)], i: usize| -> Vec<f64> {
        v.iter()
            .map(|x| match i {
                0 => x.0,
                1 => x.1,
                _ => x.2,
            })
            .collect()
    };
    let max = |v: Vec<f64>| v.into_iter().fold(0.0, f64::max);
    println!(
        "{:<12} {:>16} {:>16} {:>12}",
        "tool", "mean p50 µs", "mean p99 µs", "max µs"
    );
    for (name, v) in [("flowlane", &f), ("cyclictest", &c)] {
        println!(
            "{name:<12} {:>16.1} {:>16.1} {:>12.1}",
            mean(&col(v, 0)),
            mean(&col(v, 1)),
            max(col(v, 2))
        );
    }
    let (mf, mc) = (mean(&col(&f, 0)), mean(&col(&c, 0)).max(1e-9));
    let diffs: Vec<f64> = f.iter().zip(&c).map(|(a, b)| a.0 - b.0).collect();
    let md = mean(&diffs);
    let sd = (diffs.iter().map(|d| (d - md).powi(2)).sum::<f64>()
        / (diffs.len().max(2) - 1) as f64)
        .sqrt();
    // Student's t at 95 % for the pairs' degrees of freedom (normal beyond 30).
    let t = match diffs.len() {
        0..=2 => 12.71,
        3..=5 => 2.78,
        6..=10 => 2.26,
        11..=20 => 2.09,
        21..=30 => 2.05,
        _ => 1.96,
    };
    let half = t * sd / (diffs.len() as f64).sqrt();
    println!(
        "ratio of medians flowlane / cyclictest: {:.3} (target <= 1.0); paired difference {md:+.2} µs, 95 % interval {:+.2} to {:+.2} µs, ratio {:.3} to {:.3}",
        mf / mc,
        md - half,
        md + half,
        (mc + md - half) / mc,
        (mc + md + half) / mc
    );
    // The same, robust to a round the host disturbed: medians of the rounds' medians, and the
    // pairs' median difference.
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let (rf, rc) = (med(col(&f, 0)), med(col(&c, 0)).max(1e-9));
    println!(
        "median of round medians: flowlane {rf:.1} µs, cyclictest {rc:.1} µs, ratio {:.3}; \
         pairs' median difference {:+.1} µs",
        rf / rc,
        med(diffs.clone())
    );
    // flowlane alone: without, then with its own load on the same CPU.
    let out = Command::new(BIN)
        .args(["latency", "--cpus", &cpu.to_string(), "--duration", "10"])
        .args(["--load", "cpu,vm,io", "--json", "--quiet"])
        .output()
        .expect("flowlane runs");
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for p in r["phases"].as_array().into_iter().flatten() {
        let c = &p["cpus"][0];
        let us = |k: &str| c[k].as_u64().unwrap_or(0) as f64 / 1e3;
        println!(
            "{:<22} avg {:>8.1}  p50 {:>8.1}  p99 {:>9.1}  p99.9 {:>9.1}  max {:>10.1} µs  over \
             100 µs {}",
            p["name"].as_str().unwrap_or("?"),
            us("avg_ns"),
            us("p50_ns"),
            us("p99_ns"),
            us("p999_ns"),
            us("max_ns"),
            c["over_threshold"]
        );
    }
}
