//! `flowlane top` watches a veth pair's receive queues while a known count of frames crosses
//! it: the queues' counts add up to what was sent, and to no more than the interface counted.

use std::process::Command;

use flowlane_lab::{Offload, Pair, DUT_ADDR};
use serde_json::Value;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

#[test]
fn top_counts_every_frame_a_queue_took() {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: needs root for network namespaces");
        return;
    }
    let p = Pair::create("fltop", 2).expect("namespaces");
    // NAPI on the receiving end: veth counts per queue only what its NAPI path took, and
    // takes a frame there only from a sender without TSO (checksums off turns TSO off) — as
    // `lab up` sets its links.
    p.dut
        .set_offload(&p.dut_if, Offload::Gro, true)
        .expect("GRO on");
    p.gen
        .set_offload(&p.gen_if, Offload::TxChecksum, false)
        .expect("checksums off");
    let rx = || p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
    let before = rx();
    // top for 4 s; the frames are sent inside its window, from 1 s on.
    let top = p
        .dut
        .command(BIN)
        .args([
            "top",
            "--dev",
            &p.dut_if,
            "--duration",
            "4",
            "--json-stream",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("top runs");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let count = 20_000u64;
    let to = format!("{DUT_ADDR}:9");
    let blast = p
        .gen
        .command(BIN)
        .args(["blast", "--mode", "raw", "--dev", &p.gen_if, "--to", &to])
        .args([
            "--flows",
            "4",
            "--count",
            &count.to_string(),
            "--rate",
            "40k",
        ])
        .args(["--json", "--quiet"])
        .output()
        .expect("blast runs");
    // The frames are what top is checked against; a busy machine may hold the rate back.
    common::blast_judged_ok(
        blast.status.code(),
        serde_json::from_slice(&blast.stdout).unwrap_or_else(|e| {
            panic!(
                "blast's JSON ({e}): {}",
                String::from_utf8_lossy(&blast.stderr)
            )
        }),
    );
    let out = top.wait_with_output().expect("top ends");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let delta = rx() - before;
    let records: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let last = records.last().expect("records");
    let r = &last["final"];
    common::schema_valid("top", r);
    assert!(
        records.len() >= 4,
        "an interval record a second, then the final one: {records:?}"
    );
    let queues = r["queues"].as_array().expect("queues");
    assert_eq!(queues.len(), 2, "{r}");
    let total: u64 = queues
        .iter()
        .map(|q| q["rx_packets"].as_u64().expect("packets"))
        .sum();
    assert!(
        (count..=delta).contains(&total),
        "queues saw {total}: at least the {count} sent, at most the {delta} the interface got"
    );
    // The intervals add up to the whole watch.
    let by_interval: u64 = records
        .iter()
        .filter_map(|x| x["interval"]["queues"].as_array())
        .flatten()
        .map(|q| q["rx_packets"].as_u64().expect("packets"))
        .sum();
    assert_eq!(by_interval, total, "{records:?}");
    let shares: f64 = queues.iter().filter_map(|q| q["share"].as_f64()).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{r}");
    // veth has no indirection table: no prediction is made up.
    assert!(queues.iter().all(|q| q["reta_share"].is_null()), "{r}");
    assert!(r["devs"][0]["irqs"].as_array().expect("irqs").is_empty());
    // veth offers no kernel per-queue statistics (qstats): its driver's names are read, and
    // the report says so.
    assert_eq!(r["devs"][0]["source"], "driver statistics", "{r}");
    // Its own cost: one CPU's share, far under the 1 % bound at one line a second.
    assert!(r["cpu_share"].as_f64().expect("share") < 0.05, "{r}");
}

#[test]
fn top_refuses_what_it_cannot_watch() {
    for (args, says) in [
        (vec!["top"], "--dev"),
        (
            vec!["top", "--dev", "nosuch0", "--duration", "1"],
            "no interface",
        ),
    ] {
        let out = Command::new(BIN).args(&args).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
