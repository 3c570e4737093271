//! `flowlane latency` (issue 55) against cyclictest, the reference every real-time Linux user
//! knows, on the same CPU with the same interval, and with a known disturbance: a thread of
//! higher priority that holds the measured CPU for a fixed time.
//!
//! Why the numbers hold on a slow or busy 2-core machine: the comparison interleaves short
//! rounds of the two tools (drift and a neighbour's load hit both alike) and compares the
//! median of each tool's round medians (a round the host disturbed — a VM's neighbour — moves
//! a mean of ten rounds, not a median). The rounds are pairs (flowlane's, then cyclictest's,
//! moments apart), so what decides whether this machine can resolve 2 µs is the error of the
//! pairs' median difference — drift that moves both rounds of a pair cancels in it, where
//! the two tools' own errors would count it twice. Where even that error is above 1 µs, a
//! 2 µs check cannot be decided, and the test says so with the measured error and skips that
//! one check rather than loosen it. The p99 margin is the spread of the two
//! tools' own round p99s. The disturbance is 3 ms every 100 ms: each one delays a wake-up
//! due at 1 ms intervals by at least 2 ms, far above any wake-up this VM gives on its own
//! more than a few times a second.

mod common;

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

/// The CPU measured: the last this process may use (CPU 0 takes more of the host's work).
fn cpu() -> usize {
    *flowlane_runtime::cpus::CpuSet::current()
        .usable()
        .last()
        .expect("a usable CPU")
}

/// Runs `flowlane latency ARGS --json --quiet`: its report, checked against the schema.
fn latency_json(args: &[&str]) -> Value {
    let out = Command::new(BIN)
        .arg("latency")
        .args(args)
        .args(["--json", "--quiet"])
        .output()
        .expect("flowlane runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    common::schema_valid("latency", &r);
    r
}

/// One test at a time: each measures, or loads, the same CPU.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    common::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn realtime_allowed() -> bool {
    let ok = std::thread::spawn(|| {
        let ok = flowlane_io::os::set_fifo_priority(1).is_ok();
        let _ = flowlane_io::os::set_fifo_priority(0);
        ok
    })
    .join()
    .unwrap_or(false);
    if !ok {
        eprintln!("SKIP: SCHED_FIFO refused here (no CAP_SYS_NICE): nothing real-time to compare");
    }
    ok
}

/// One flowlane round: (p50, p99) in whole µs, floored as cyclictest counts.
fn ours(cpu: usize, loops: u64) -> (u64, u64) {
    let (c, l) = (cpu.to_string(), loops.to_string());
    let r = latency_json(&["--cpus", &c, "--interval", "1000", "--loops", &l]);
    assert_eq!(r["realtime_priority"], 99, "{r}");
    assert_eq!(r["dma_latency_us"], 0, "cyclictest's PM QoS default: {r}");
    let c = &r["phases"][0]["cpus"][0];
    assert_eq!(n(&c["wakeups"]), loops, "{c}");
    (n(&c["p50_ns"]) / 1000, n(&c["p99_ns"]) / 1000)
}

/// One cyclictest round (one thread on `cpu`, SCHED_FIFO 99, memory locked, 1 000 µs):
/// (p50, p99) in µs from its histogram.
fn theirs(cpu: usize, loops: u64, tag: usize) -> (u64, u64) {
    let json = std::env::temp_dir().join(format!("fl-ct-{}-{tag}.json", std::process::id()));
    let out = Command::new("cyclictest")
        .args(["-t1", "-a", &cpu.to_string(), "-p99", "-i1000", "-m", "-q"])
        .args(["-l", &loops.to_string(), "-h", "20000"])
        .arg(format!("--json={}", json.display()))
        .output()
        .expect("cyclictest runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&json).expect("cyclictest's JSON");
    let _ = std::fs::remove_file(&json);
    let j: Value = serde_json::from_str(&text).expect("JSON");
    let hist = j["thread"]["0"]["histogram"]
        .as_object()
        .expect("histogram");
    let mut h: Vec<(u64, u64)> = hist
        .iter()
        .map(|(k, v)| (k.parse().expect("µs"), n(v)))
        .collect();
    h.sort_unstable();
    let total: u64 = h.iter().map(|x| x.1).sum();
    let at = |q: f64| {
        let mut c = 0;
        for &(us, k) in &h {
            c += k;
            if c as f64 >= q * total as f64 {
                return us;
            }
        }
        h.last().map_or(0, |x| x.0)
    };
    (at(0.5), at(0.99))
}

fn median_f(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn median(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

/// Mean and standard error of the mean.
fn mean_se(v: &[f64]) -> (f64, f64) {
    let k = v.len() as f64;
    let m = v.iter().sum::<f64>() / k;
    let var = v.iter().map(|&x| (x - m).powi(2)).sum::<f64>() / (k - 1.0);
    (m, (var / k).sqrt())
}

/// Ten interleaved rounds of 1 000 wake-ups each: the medians agree within 2 µs (the median of
/// each tool's round medians: a round the host disturbed moves a mean of ten by a tenth of
/// its shift, a median not at all), the p99s within the spread of the tools' own round p99s.
fn compare_attempt(_: usize) {
    let cpu = cpu();
    let (mut f, mut c) = (Vec::new(), Vec::new());
    for round in 0..10 {
        f.push(ours(cpu, 1000));
        c.push(theirs(cpu, 1000, round));
    }
    let p50 = |v: &[(u64, u64)]| v.iter().map(|x| x.0).collect::<Vec<_>>();
    let p99 = |v: &[(u64, u64)]| v.iter().map(|x| x.1).collect::<Vec<_>>();
    eprintln!("rounds (p50, p99) µs: flowlane {f:?}, cyclictest {c:?}");
    let (mf, mc) = (median(&p50(&f)) as f64, median(&p50(&c)) as f64);
    // How well this machine resolves the difference: the standard error of the median of the
    // pairs' differences, from their own spread (1.4826 × their median absolute deviation
    // estimates the spread of a normal; × 1.2533 / √k is a median's error). Two of it above
    // 2 µs, and a 2 µs check is a coin toss.
    let diffs: Vec<f64> = f
        .iter()
        .zip(&c)
        .map(|(a, b)| a.0 as f64 - b.0 as f64)
        .collect();
    let mid = median_f(&diffs);
    let mad = median_f(&diffs.iter().map(|d| (d - mid).abs()).collect::<Vec<_>>());
    // Both tools report whole µs: no error is taken as below that rounding's (1/√12 µs).
    let se = (1.2533 * 1.4826 * mad / (diffs.len() as f64).sqrt()).max(12f64.sqrt().recip());
    let (mean_f, _) = mean_se(&p50(&f).iter().map(|&x| x as f64).collect::<Vec<_>>());
    let (mean_c, _) = mean_se(&p50(&c).iter().map(|&x| x as f64).collect::<Vec<_>>());
    eprintln!(
        "medians of round medians: flowlane {mf} µs, cyclictest {mc} µs (means {mean_f:.1} and \
         {mean_c:.1}); standard error of the pairs' median difference {se:.2} µs"
    );
    if 2.0 * se <= 2.0 {
        assert!(
            (mf - mc).abs() <= 2.0,
            "medians: flowlane {mf:.1} µs, cyclictest {mc:.1} µs (standard error {se:.2} µs)"
        );
    } else {
        eprintln!(
            "SKIP (median check only): the rounds' medians vary so much here that the pairs' \
             median difference carries a standard error of {se:.1} µs (flowlane {mf:.1}, \
             cyclictest {mc:.1}); this machine cannot resolve the 2 µs asked"
        );
    }
    let spread = |v: &[u64]| v.iter().max().unwrap_or(&0) - v.iter().min().unwrap_or(&0);
    let margin = spread(&p99(&f)).max(spread(&p99(&c)));
    let (qf, qc) = (median(&p99(&f)), median(&p99(&c)));
    assert!(
        qf.abs_diff(qc) <= margin,
        "p99: flowlane {qf} µs, cyclictest {qc} µs, beyond the tools' own spread of {margin} µs"
    );
}

#[test]
fn wakeups_agree_with_cyclictest_on_the_same_cpu_and_interval() {
    if !common::need_program("cyclictest") || !realtime_allowed() {
        return;
    }
    let _one = one_at_a_time();
    common::up_to(3, compare_attempt);
}

/// A thread at SCHED_FIFO 99 on the measured CPU holds it 3 ms, 20 times 100 ms apart, from
/// 0.5 s to 2.4 s after it starts, while flowlane measures at priority 50 every 1 000 µs for
/// 3 s: every hold falls inside the measurement (flowlane has 0.5 s to start, the hold the
/// 0.6 s after its last to end), each shows as a wake-up over the 1 000 µs threshold (a hold
/// covers two due times, so one wake-up comes at least 2 ms late), and the maximum is at least
/// 2 ms.
fn disturbed_attempt(_: usize) {
    let cpu = cpu();
    let hog = std::thread::spawn(move || {
        flowlane_io::os::pin_current_thread(cpu).expect("pin");
        flowlane_io::os::set_fifo_priority(99).expect("SCHED_FIFO 99");
        let mut next = flowlane_io::os::monotonic_ns() + 500_000_000;
        for _ in 0..20 {
            flowlane_io::os::sleep_until_ns(next);
            let until = flowlane_io::os::monotonic_ns() + 3_000_000;
            while flowlane_io::os::monotonic_ns() < until {
                std::hint::spin_loop();
            }
            next += 100_000_000;
        }
        let _ = flowlane_io::os::set_fifo_priority(0);
    });
    let c = cpu.to_string();
    let r = latency_json(&[
        "--cpus",
        &c,
        "--interval",
        "1000",
        "--priority",
        "50",
        "--threshold",
        "1000",
        "--duration",
        "3",
    ]);
    hog.join().expect("hog");
    let c = &r["phases"][0]["cpus"][0];
    assert_eq!(r["realtime_priority"], 50, "{r}");
    assert!(n(&c["max_ns"]) >= 2_000_000, "{c}");
    assert!(
        n(&c["over_threshold"]) >= 20,
        "{} wake-ups over 1 ms for 20 holds of 3 ms: {c}",
        n(&c["over_threshold"])
    );
}

#[test]
fn a_higher_priority_hold_shows_in_the_maximum_and_over_the_threshold() {
    if !realtime_allowed() {
        return;
    }
    let _one = one_at_a_time();
    common::up_to(3, disturbed_attempt);
}

/// Without real-time scheduling asked for, the report says so and marks the run; bad values
/// are usage errors (exit 2) that name the fix.
#[test]
fn normal_priority_is_marked_and_bad_values_are_refused() {
    let _one = one_at_a_time();
    let c = cpu().to_string();
    let r = latency_json(&["--cpus", &c, "--priority", "0", "--loops", "200"]);
    assert!(r["realtime_priority"].is_null(), "{r}");
    assert!(
        r["not_realtime"].as_str().is_some_and(|s| !s.is_empty()),
        "{r}"
    );
    assert_eq!(n(&r["phases"][0]["cpus"][0]["wakeups"]), 200);
    let text = Command::new(BIN)
        .args(["latency", "--cpus", &cpu().to_string(), "--priority", "0"])
        .args(["--loops", "100", "--interval", "500"])
        .output()
        .expect("runs");
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("NOT REAL-TIME"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    for (args, says) in [
        (&["--priority", "100"][..], "--priority"),
        (&["--interval", "0"][..], "--interval"),
        (&["--loops", "0"][..], "--loops"),
        (&["--load", "cpu"][..], "--duration or --loops"),
        (
            &[
                "--load",
                "vm",
                "--duration",
                "1",
                "--vm-bytes",
                "100000000000000",
            ][..],
            "--vm-bytes",
        ),
    ] {
        let out = Command::new(BIN)
            .arg("latency")
            .args(args)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `--load`: a phase without the load, then one with flowlane's hogs beside it, each named
/// and measured alike; the load's work is counted and its files are gone afterwards.
#[test]
fn a_load_runs_beside_a_second_phase_and_is_reported() {
    let _one = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("fl-lat-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (c, d) = (cpu().to_string(), dir.to_string_lossy().into_owned());
    let r = latency_json(&[
        "--cpus",
        &c,
        "--priority",
        "0",
        "--duration",
        "1",
        "--load",
        "cpu,vm,io",
        "--vm-bytes",
        "16777216",
        "--io-dir",
        &d,
    ]);
    let p = r["phases"].as_array().expect("phases");
    assert_eq!(p.len(), 2, "{r}");
    assert_eq!(p[0]["name"], "no load");
    assert!(p[0]["load"].is_null());
    assert_eq!(p[1]["name"], "load: cpu+vm+io");
    let l = &p[1]["load"];
    assert!(n(&l["cpu_loops"]) > 0, "{l}");
    assert!(n(&l["vm_bytes_written"]) >= 16 << 20, "{l}");
    assert!(n(&l["io_bytes_written"]) >= 1 << 20, "{l}");
    for ph in p {
        // 1 s at 1 000 µs: the deadline's wake-ups, give or take the first and last.
        let w = n(&ph["cpus"][0]["wakeups"]) + n(&ph["cpus"][0]["overruns"]);
        assert!((999..=1002).contains(&w), "{ph}");
    }
    let left: Vec<_> = std::fs::read_dir(&dir).expect("dir").collect();
    assert!(left.is_empty(), "the io hogs' files are removed: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each measured CPU's isolation is reported, and another process's task kept runnable on
/// it (a spinning thread of this test, named so) is seen there and named.
#[test]
fn isolation_and_other_runnable_tasks_are_reported_per_cpu() {
    let _one = one_at_a_time();
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cpu = cpu();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let busy = std::thread::Builder::new()
        .name("fl-busy-hog".into())
        .spawn(move || {
            flowlane_io::os::pin_current_thread(cpu).expect("pin");
            while !s2.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
        .expect("thread");
    let c = cpu.to_string();
    let r = latency_json(&["--cpus", &c, "--duration", "2.5"]);
    stop.store(true, Ordering::Relaxed);
    busy.join().expect("join");
    let iso = &r["isolation"][0];
    assert_eq!(n(&iso["cpu"]), cpu as u64, "{r}");
    assert!(
        iso["irqs"].is_array() && iso["isolcpus"].is_boolean(),
        "{iso}"
    );
    let o = &r["phases"][0]["runnable_others"][0];
    // A status line each second and one at the end: three samples, each finding the hog
    // runnable there (running, or preempted by the measuring thread).
    assert!(n(&o["samples"]) >= 2, "{o}");
    assert!(n(&o["samples_with_others"]) >= 1, "{o}");
    assert!(
        o["tasks"]
            .as_array()
            .expect("tasks")
            .iter()
            .any(|t| t.as_str().is_some_and(|t| t.starts_with("fl-busy-hog("))),
        "{o}"
    );
}

/// `--load net`: flowlane's own traffic through a lab of its own beside the second phase,
/// its counts in the report, and the lab gone afterwards.
#[test]
fn a_net_load_carries_traffic_through_a_lab_it_takes_down() {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: --load net needs root for network namespaces");
        return;
    }
    let _one = one_at_a_time();
    let c = cpu().to_string();
    let r = latency_json(&[
        "--cpus",
        &c,
        "--duration",
        "1.5",
        "--load",
        "net",
        "--net-rate",
        "20k",
    ]);
    let l = &r["phases"][1]["load"];
    assert!(l["net_error"].is_null(), "{l}");
    // 20 000 a second for about the phase's 1.5 s; what the server got, at most what was
    // sent (the last ones may still be on their way when it stops).
    let (sent, got) = (n(&l["net_sent"]), n(&l["net_received"]));
    assert!(sent >= 15_000 && got > 0 && got <= sent, "{l}");
    let left = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains("fllat"),
        "the load's lab is taken down"
    );
}
