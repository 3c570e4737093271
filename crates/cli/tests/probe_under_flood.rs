//! `rfc2544 --tests probe-under-flood` (issue 53 item 4) through a lab's kernel router that
//! routes 198.18.4.0/24 to the sink: the probe alone, then beside a paced random-destination
//! flood. Every figure is checked against what the DUT's kernel says it forwarded
//! (/proc/net/snmp `Ip: ForwDatagrams`), and the flood's destinations against its frames.

mod common;

use std::process::Command;

use common::{quiet, Line};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

/// What the DUT's kernel forwarded, and the ICMP messages the sink's kernel sent (port
/// unreachable for the learning frames, which come before any sink runs; rate-limited, so a
/// handful), which the DUT forwarded back.
fn forwarded(lab: &Line) -> (u64, u64) {
    let get = |ns: &flowlane_lab::Netns, proto: &str, name: &str| {
        let s = ns.snmp().expect("/proc/net/snmp");
        let v = s.get(proto, name).expect("a counter");
        u64::try_from(v).expect("a count")
    };
    (
        get(&lab.dut, "Ip", "ForwDatagrams"),
        get(&lab.sink, "Icmp", "OutMsgs"),
    )
}

/// One run, checked whole: 100 learning frames, the probe alone for a second, then beside a
/// 20 000 pps flood for a second. Rates far below what the kernel forwards here (the rfc2544
/// tests find ~50 000 pps through a token bucket on the slowest machine seen), so a lost frame
/// is a defect, not a busy machine's noise; a run whose probe or flood could not keep its
/// rate says so (`tester_limited`) and is run again, at most three times.
fn attempt(lab: &Line) {
    let before = forwarded(lab);
    let out = Command::new(BIN)
        .args(["rfc2544", "--lab", &lab.name, "--json", "--sizes", "64"])
        .args([
            "--tests",
            "probe-under-flood",
            "--flood-to",
            "198.18.4.0/24:9000-9015",
        ])
        .args([
            "--flood-rates",
            "0,20k",
            "--flood-flows",
            "8",
            "--probe-rate",
            "1000",
        ])
        .args([
            "--confirm-secs",
            "1",
            "--pause",
            "0.3",
            "--learning-frames",
            "100",
        ])
        .output()
        .expect("runs");
    let after = forwarded(lab);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let j: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    common::schema_valid("rfc2544", &j);
    let points = j["sizes"][0]["probe_under_flood"]
        .as_array()
        .expect("the test's points")
        .clone();
    assert_eq!(points.len(), 2, "{j}");
    for p in &points {
        assert_eq!(p["tester_limited"], "", "{p}");
        assert_eq!(n(&p["sink_ring_drops"]), 0, "{p}");
        // About a second at 1 000 pps, every frame back, timed.
        assert!(n(&p["probe_sent"]) >= 900, "{p}");
        assert_eq!(n(&p["probe_received"]), n(&p["probe_sent"]), "{p}");
        assert_eq!(n(&p["probe_lost"]), 0, "{p}");
        assert!(p["probe_latency_ns"]["p50"].as_u64().is_some(), "{p}");
    }
    let (alone, flooded) = (&points[0], &points[1]);
    assert_eq!(alone["flood_rate_pps"].as_f64(), Some(0.0));
    assert_eq!(
        (n(&alone["flood_sent"]), n(&alone["flood_forwarded"])),
        (0, 0)
    );
    let sent = n(&flooded["flood_sent"]);
    assert!(sent >= 18_000, "{flooded}");
    assert_eq!(n(&flooded["flood_destinations"]), sent, "one per frame");
    assert_eq!(n(&flooded["flood_forwarded"]), sent, "{flooded}");
    assert_eq!(n(&flooded["flood_lost"]), 0, "{flooded}");
    // The kernel forwarded exactly the learning frames, what the sink counted, and the sink
    // host's few ICMP errors back.
    let counted: u64 = points
        .iter()
        .map(|p| n(&p["flood_forwarded"]) + n(&p["probe_received"]))
        .sum();
    assert_eq!(
        after.0 - before.0,
        100 + counted + (after.1 - before.1),
        "ForwDatagrams against the report and the sink's ICMP"
    );
}

#[test]
fn a_probe_through_a_flood_is_counted_as_the_kernel_forwarded_it() {
    let Some(lab) = Line::up("f", &["--kernel", "route"]) else {
        return;
    };
    lab.dut
        .ip(&["route", "add", "198.18.4.0/24", "via", "198.18.1.2"])
        .expect("a route through the sink");
    quiet(&lab);
    common::up_to(3, |_| attempt(&lab));

    // The test needs its flood, and a flood needs the test.
    for bad in [
        &["--tests", "probe-under-flood"][..],
        &["--flood-rates", "0,max"],
        &[
            "--tests",
            "probe-under-flood",
            "--flood-to",
            "[2001:2::/64]:9000",
        ],
    ] {
        let out = Command::new(BIN)
            .args(["rfc2544", "--lab", &lab.name, "--sizes", "64"])
            .args(bad)
            .output()
            .expect("runs");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{bad:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
