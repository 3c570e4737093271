//! Routers under a random-destination flood (issue 53 items 4 and 5; Olsson's "How rDoS work
//! on sparse routing table?"). A line lab (generator — DUT — sink, one queue per veth end)
//! whose DUT holds FLOWLANE_BENCH_ROUTES IPv4 routes shaped like the public table (default
//! 950 000, via the sink, in the kernel's FIB; ours reads them from there). Each row runs
//! `rfc2544 --tests probe-under-flood`: a probe flow to the sink at 1 000 frames/s alone, then
//! beside an unpaced flood whose every frame goes to a random address of 1.0.0.0–
//! 223.255.255.255 and a random port of 16 (AF_XDP, one thread on CPU 0 with the probe) —
//! most of them matched by some route, the rest by none (the sparse table's misses). Rows:
//!   kernel          the DUT kernel's IPv4 forwarding (its FIB; misses answered with
//!                   rate-limited ICMP);
//!   af-xdp          `forward --mode route` over AF_XDP, one worker on CPU 1;
//!   af-xdp + cache  the same with `--flow-cache 1048576` (the TRASH idea: a hit skips the
//!                   route lookup) — under a random flood nearly every frame is a new flow, so
//!                   this row shows what a cache costs when it cannot help, and its GC work;
//!   xdp             the native XDP router (DIR-24-8; no cache there).
//! Per row: the flood's sent and forwarded rates, the probe's loss and one-way latency
//! (p50/p99/max) with and without the flood, and for ours the cache's hit rate, inserts,
//! evictions and GC work. On veth the DUT's receive path runs on the sender's CPU (0); the
//! sink reads on CPU 1 beside the user-space worker.
//!
//! Run (root): `cargo bench -p flowlane --bench flood_lab` (FLOWLANE_BENCH_SECS, default 3).

mod common;

use common::{with_forwarder, BIN};
use flowlane_lab::setup;
use serde_json::Value;

/// The probe-under-flood test through the lab's DUT, its report.
fn flood(cfg: &setup::LabConfig, secs: f64) -> Value {
    let out = std::process::Command::new(BIN)
        .args([
            "rfc2544",
            "--tx-dev",
            setup::GEN_IF,
            "--tx-netns",
            &cfg.gen_ns(),
        ])
        .args(["--rx-dev", setup::SINK_IF, "--rx-netns", &cfg.sink_ns()])
        .args(["--to", &format!("{}:9000", setup::LAB_SINK_V4)])
        .args(["--tests", "probe-under-flood", "--sizes", "64", "--json"])
        .args(["--flood-to", "1.0.0.0-223.255.255.255:9000-9015"])
        .args([
            "--flood-rates",
            "0,max",
            "--confirm-secs",
            &secs.to_string(),
        ])
        .args(["--pause", "0.5"])
        .output()
        .expect("rfc2544 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("rfc2544 JSON")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// One row: the probe alone and under the flood, and the router's cache where it has one.
fn row(name: &str, r: &Value, fwd: Option<&Value>, kernel_fwd: Option<f64>) -> f64 {
    let p = &r["sizes"][0]["probe_under_flood"];
    let (alone, flooded) = (&p[0], &p[1]);
    let lat = |x: &Value, k: &str| f(&x["probe_latency_ns"][k]) / 1e3;
    let fwd_pps = f(&flooded["flood_forwarded_pps"]);
    println!(
        "{name:<16} {:>11.0} {:>11.0} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8}",
        f(&flooded["flood_offered_pps"]),
        fwd_pps,
        kernel_fwd.map_or("-".into(), |k| format!("{:.2}", fwd_pps / k.max(1.0))),
        lat(alone, "p50"),
        lat(alone, "p99"),
        lat(flooded, "p50"),
        lat(flooded, "p99"),
        lat(flooded, "max"),
        format!(
            "{}/{}",
            flooded["probe_lost"].as_u64().unwrap_or(0),
            flooded["probe_sent"].as_u64().unwrap_or(0)
        )
    );
    if !flooded["tester_limited"].as_str().unwrap_or("").is_empty() {
        println!("    tester-limited: {}", flooded["tester_limited"]);
    }
    if let Some(c) = fwd
        .map(|j| &j["total"]["flow_cache"])
        .filter(|c| !c.is_null())
    {
        let n = |k: &str| c[k].as_u64().unwrap_or(0);
        println!(
            "    cache: {} lookups, {:.1} % hits, {} inserts, {} evicted, {} expired, GC \
             visited {} records",
            n("lookups"),
            100.0 * n("hits") as f64 / n("lookups").max(1) as f64,
            n("inserts"),
            n("evicted"),
            n("expired"),
            n("gc_visited")
        );
    }
    if let Some(j) = fwd {
        println!(
            "    router: {} forwarded, {} dropped for no route",
            j["total"]["forwarded"], j["total"]["dropped"]["no_route"]
        );
    }
    fwd_pps
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("flood_lab: needs root for network namespaces; skipped");
        return;
    }
    let secs = common::secs();
    let routes: usize = std::env::var("FLOWLANE_BENCH_ROUTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(950_000);
    let lab = common::BenchLab::line("flbf", setup::Segment::Routed);
    let (cfg, dut) = (&lab.cfg, lab.dut());
    let t0 = std::time::Instant::now();
    let loaded = common::load_ipv4_table(&dut, routes);
    println!(
        "routers under a random-destination flood: {loaded} IPv4 routes (loaded in {:.1} s), \
         64-byte frames, {secs} s per trial; probe 1 000 pps; latency µs (one-way)",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "{:<16} {:>11} {:>11} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "row",
        "flood sent",
        "forwarded",
        "/kernel",
        "alone p50",
        "alone p99",
        "flood p50",
        "flood p99",
        "flood max",
        "lost"
    );
    dut.write_file("/proc/sys/net/ipv4/ip_forward", "1")
        .expect("sysctl");
    let kernel = row("kernel", &flood(cfg, secs), None, None);
    dut.write_file("/proc/sys/net/ipv4/ip_forward", "0")
        .expect("sysctl");
    for (label, backend, cache) in [
        ("af-xdp", "af-xdp", None),
        ("af-xdp + cache", "af-xdp", Some("1048576")),
        ("xdp", "xdp", None),
    ] {
        let mut fwd = dut.command(BIN);
        fwd.args(["forward", "--mode", "route", "--dev", setup::DUT_IF])
            .args(["--dev", setup::DUT_OUT_IF, "--backend", backend]);
        if backend != "xdp" {
            fwd.args(["--cpus", "1"]);
        }
        if let Some(n) = cache {
            fwd.args(["--flow-cache", n]);
        }
        let (r, j) = with_forwarder(fwd, || flood(cfg, secs));
        row(label, &r, Some(&j), Some(kernel));
    }
}
