//! `sink` counts 5-tuples in a bounded flow table (issue 53 item 2): 4 096 flows through a
//! lab's kernel router into tables too small for them, large enough, and with a short idle
//! time. Every frame stays accounted — in a tuple still held, expired or evicted — and the
//! counts follow what the table can hold.

mod common;

use common::{quiet, Line};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// A sink in the lab's sink namespace stopping after `count` frames, with `extra` options.
fn sink(lab: &Line, count: u64, extra: &[&str]) -> std::process::Child {
    common::sink_start_with(lab, count, extra)
}

/// 4 096 flows (one source address, ports 1024-5119), `per_flow` frames each, from the
/// generator.
fn blast(lab: &Line, per_flow: u64) {
    let count = (4096 * per_flow).to_string();
    let out = lab
        .gen
        .command(BIN)
        .args(["blast", "--to", "198.18.1.2:9000", "--flows", "4096"])
        .args(["--sport", "1024-5119", "--count", &count, "--rate", "40k"])
        .args(["--json", "--quiet"])
        .output()
        .expect("blast runs");
    common::blast_judged_ok(
        out.status.code(),
        serde_json::from_slice(&out.stdout).expect("blast JSON"),
    );
}

fn done(sink: std::process::Child) -> Value {
    let out = sink.wait_with_output().expect("sink ends");
    let s: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    common::schema_valid("sink", &s);
    s
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

/// Every frame is in a held, expired or evicted tuple.
fn conserved(s: &Value) -> &Value {
    let t = &s["tuples"];
    assert_eq!(
        n(&t["frames_live"]) + n(&t["frames_expired"]) + n(&t["frames_evicted"]),
        n(&s["flowlane_packets"]),
        "{s}"
    );
    assert_eq!(
        n(&t["seen"]),
        n(&t["live"]) + n(&t["expired"]) + n(&t["evicted"]),
        "{t}"
    );
    t
}

#[test]
fn tuples_are_counted_in_bounded_memory_and_every_frame_stays_accounted() {
    let Some(lab) = Line::up("u", &["--kernel", "route"]) else {
        return;
    };
    quiet(&lab);
    // Room for all: 4 096 tuples seen once each, two frames in each.
    let s = sink(&lab, 8192, &["--tuple-capacity", "8192"]);
    blast(&lab, 2);
    let r = done(s);
    let t = conserved(&r);
    assert_eq!(
        (n(&t["seen"]), n(&t["live"]), n(&t["evicted"])),
        (4096, 4096, 0),
        "{t}"
    );
    assert_eq!(n(&t["frames_live"]), 8192, "{t}");

    // A table of 1 000 records: at most 1 000 held, the rest evicted (and a flow seen again
    // after its eviction counted anew), memory as allocated at the start whatever came.
    let s = sink(&lab, 8192, &["--tuple-capacity", "1000"]);
    blast(&lab, 2);
    let small = done(s);
    let t = conserved(&small);
    assert!(n(&t["live"]) <= 1000, "{t}");
    assert!(n(&t["seen"]) >= 4096, "{t}");
    assert!(n(&t["evicted"]) >= 4096 - 1000, "{t}");
    assert_eq!(n(&t["capacity"]), 1000);
    let big_mem = n(&r["tuples"]["memory_bytes"]);
    let small_mem = n(&t["memory_bytes"]);
    assert!(
        small_mem * 6 < big_mem,
        "{small_mem} B for 1 000 records, {big_mem} for 8 192"
    );
    assert!(small_mem < 1000 * 128, "{small_mem} B for 1 000 records");

    // A short idle time: two rounds of the same flows a second apart — every tuple of the
    // first round expired before the second came, so each is seen twice.
    let s = sink(
        &lab,
        8192,
        &["--tuple-capacity", "8192", "--tuple-idle", "0.3"],
    );
    blast(&lab, 1);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    blast(&lab, 1);
    let r = done(s);
    let t = conserved(&r);
    assert_eq!(n(&t["seen"]), 8192, "{t}");
    assert!(n(&t["expired"]) >= 4096, "{t}");
    assert_eq!(n(&t["evicted"]), 0, "{t}");

    // Bad values are usage errors.
    for bad in [["--tuple-capacity", "0"], ["--tuple-idle", "0"]] {
        let out = std::process::Command::new(BIN)
            .args(["sink", "--dev", "lo", "--duration", "1"])
            .args(bad)
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}
