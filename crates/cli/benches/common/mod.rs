//! What the forwarding benches share: one-verdict XDP programs, a live-frames generator run,
//! and a forwarder started and stopped around a measurement.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

use flowlane_io::ebpf::{Asm, R0};
use flowlane_io::{bpf, netdev::ifindex};
use flowlane_lab::Netns;

pub const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// Seconds per row (FLOWLANE_BENCH_SECS, default 3).
pub fn secs() -> f64 {
    std::env::var("FLOWLANE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0)
}

/// Attaches a one-verdict XDP program to `dev` in `ns` while the returned link lives.
pub fn verdict(ns: &Netns, dev: &str, verdict: i32) -> OwnedFd {
    let dev = dev.to_string();
    ns.run(move || {
        let mut a = Asm::new();
        a.mov_imm(R0, verdict).exit();
        let prog =
            bpf::prog_load(bpf::PROG_XDP, "fl_b_verdict", &a.finish().expect("asm")).expect("load");
        bpf::attach_xdp(&prog, ifindex(&dev).expect("ifindex"), 0).expect("attach")
    })
    .expect("in the namespace")
}

/// An interface's received-frames counter.
pub fn rx(ns: &Netns, dev: &str) -> u64 {
    ns.dev().expect("counters").ifaces[dev].rx_packets
}

/// `blast --mode xdp-live` from `gen`/`gen_if` to `to` on CPU 0 for `secs`: frames/s offered
/// (blast's own count) and frames/s `ns`/`dev` received over the same window.
pub fn blast_live(
    gen: &Netns,
    gen_if: &str,
    to: &str,
    secs: f64,
    ns: &Netns,
    dev: &str,
) -> (f64, f64) {
    let before = rx(ns, dev);
    let d = secs.to_string();
    let out = gen
        .command(BIN)
        .args(["blast", "--mode", "xdp-live", "--dev", gen_if, "--to", to])
        .args(["--cpus", "0", "--duration", &d, "--json", "--quiet"])
        .output()
        .expect("blast runs");
    let b: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("blast JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    let got = rx(ns, dev) - before;
    let window = b["duration_s"].as_f64().unwrap_or(secs).max(1e-9);
    (b["tx_pps"].as_f64().unwrap_or(0.0), got as f64 / window)
}

/// A `flowlane forward` started from `cmd` (banner seen) while `measure` runs, then stopped:
/// what `measure` returned and the forwarder's JSON summary.
pub fn with_forwarder<T>(mut cmd: Command, measure: impl FnOnce() -> T) -> (T, serde_json::Value) {
    let mut child = cmd
        .args(["--duration", "600", "--json", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("forward runs");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut banner = String::new();
    err.read_line(&mut banner).expect("banner");
    assert!(banner.starts_with("flowlane forward:"), "{banner}");
    let t = measure();
    flowlane_io::os::signal_process(child.id(), flowlane_io::os::Signal::Interrupt)
        .expect("SIGINT");
    let out = child.wait_with_output().expect("forward ends");
    let f: serde_json::Value = serde_json::from_slice(&out.stdout).expect("forward JSON");
    (t, f)
}
