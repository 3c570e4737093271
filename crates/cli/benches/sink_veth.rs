//! `flowlane sink` throughput over a veth pair: `flowlane blast --mode raw` (one sender thread
//! on CPU 0, 60-byte frames; last `--mode xdp-live`, the fastest sender, with GRO on) into the DUT namespace, where nftables drops every frame in
//! prerouting (after the interface and the sink's AF_PACKET tap saw it) and the sink runs
//! pinned to CPU 1. For each offered rate, the reference is the receiving interface's own
//! counter in the same run: the ratio is frames the sink accounted / frames the interface
//! received (1.00 = the sink kept up; the shortfall shows as `ring drops`, the kernel's count
//! of frames the full ring could not take).
//!
//! Run (root): `cargo bench -p flowlane --bench sink_veth` (FLOWLANE_BENCH_SECS, default 3).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use flowlane_lab::{Pair, DUT_ADDR};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("sink_veth: needs root for network namespaces; skipped");
        return;
    }
    let secs: f64 = std::env::var("FLOWLANE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let p = Pair::create("flb-sink", 1).expect("namespaces");
    p.dut
        .nft_drop_prerouting()
        .expect("nft drop chain (apt-get install nftables)");
    let to = format!("{DUT_ADDR}:9000");
    let d = secs.to_string();
    let step = |mode: &str, rate: Option<&str>| {
        let before = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
        let mut sink = p
            .dut
            .command(env!("CARGO_BIN_EXE_flowlane"))
            .args(["sink", "--dev", &p.dut_if, "--port", "9000", "--cpu", "1"])
            .args(["--idle", "1", "--duration", "120", "--json", "--quiet"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sink runs");
        // With --json the sink's banner goes to stderr once its ring is open.
        let mut err = BufReader::new(sink.stderr.take().expect("stderr"));
        let mut banner = String::new();
        err.read_line(&mut banner).expect("sink banner");
        assert!(banner.starts_with("flowlane sink:"), "{banner}");
        let mut blast = p.gen.command(env!("CARGO_BIN_EXE_flowlane"));
        blast
            .args(["blast", "--mode", mode, "--dev", &p.gen_if, "--to", &to])
            .args(["--cpus", "0", "--duration", &d, "--json", "--quiet"]);
        if let Some(r) = rate {
            blast.args(["--rate", r]);
        }
        let out = blast.output().expect("blast runs");
        // Exit 1 with a rate the generator could not reach still measures the sink: the
        // offered rate is what the interface counted.
        assert!(
            out.status.code().is_some_and(|c| c <= 1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = sink.wait_with_output().expect("sink ends");
        assert!(out.status.success(), "sink failed");
        let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
        let iface = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets - before;
        let seen = s["flowlane_packets"].as_u64().unwrap_or(0);
        (iface, seen, s["ring_drops"].as_u64().unwrap_or(0))
    };
    println!(
        "sink over veth: blast raw on CPU 0 -> sink on CPU 1, 60-byte frames, {secs} s per step"
    );
    println!(
        "{:<10} {:>14} {:>14} {:>12} {:>12} {:>8}",
        "offered", "iface pps", "sink pps", "iface", "ring drops", "ratio"
    );
    let row = |label: &str, (iface, seen, drops): (u64, u64, u64)| {
        println!(
            "{:<10} {:>14.0} {:>14.0} {:>12} {:>12} {:>8.3}",
            label,
            iface as f64 / secs,
            seen as f64 / secs,
            iface,
            drops,
            seen as f64 / (iface as f64).max(1.0)
        );
    };
    for rate in ["200k", "500k", "1M"] {
        row(rate, step("raw", Some(rate)));
    }
    row("max raw", step("raw", None));
    // Faster than raw: live XDP frames, which veth takes only into a peer running NAPI.
    p.dut
        .set_offload(&p.dut_if, flowlane_lab::Offload::Gro, true)
        .expect("GRO on (SIOCETHTOOL)");
    row("max live", step("xdp-live", None));
}
