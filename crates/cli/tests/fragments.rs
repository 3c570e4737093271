//! IP fragments end to end (issue 54): `blast` in UDP mode with datagrams larger than the
//! path MTU (the kernel fragments them), through a lab's kernel router, into `sink`, which
//! reassembles them per receive queue and accounts the datagrams as whole ones. Counts are
//! checked against the generator kernel's own (/proc/net/snmp `Ip: FragCreates`, snmp6
//! `Ip6FragCreates`), for IPv4 and IPv6.

mod common;

use common::{quiet, Line};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

/// Fragments the generator's kernel made so far, for the family.
fn created(lab: &Line, v6: bool) -> u64 {
    let v = if v6 {
        lab.gen
            .snmp6()
            .expect("snmp6")
            .get("Ip6FragCreates")
            .unwrap_or(0)
    } else {
        lab.gen
            .snmp()
            .expect("snmp")
            .get("Ip", "FragCreates")
            .unwrap_or(0)
    };
    u64::try_from(v).expect("a count")
}

/// 1 000 datagrams of 3 000-byte frames (three fragments each at MTU 1 500) over two flows.
fn run(lab: &Line, to: &str, v6: bool) {
    let before = created(lab, v6);
    let sink = common::sink_start(lab, 1000);
    let out = lab
        .gen
        .command(BIN)
        .args(["blast", "--to", to, "--size", "3000", "--count", "1000"])
        .args(["--rate", "5k", "--flows", "2", "--json", "--quiet"])
        .output()
        .expect("blast runs");
    common::blast_judged_ok(
        out.status.code(),
        serde_json::from_slice(&out.stdout).expect("blast JSON"),
    );
    let made = created(lab, v6) - before;
    let out = sink.wait_with_output().expect("sink ends");
    let s: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    common::schema_valid("sink", &s);
    assert_eq!(n(&s["flowlane_packets"]), 1000, "{s}");
    let f = &s["fragments"];
    assert_eq!(made, 3000, "three fragments a datagram: {f}");
    assert_eq!(
        (
            n(&f["fragments"]),
            n(&f["datagrams"]),
            n(&f["datagram_fragments"])
        ),
        (made, 1000, made),
        "every fragment the kernel made, made whole again: {f}"
    );
    for k in [
        "overlap",
        "duplicate",
        "timed_out",
        "evicted",
        "held_fragments",
    ] {
        assert_eq!(n(&f[k]), 0, "{k}: {f}");
    }
    let flows = s["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 2, "{s}");
    for fl in flows {
        assert_eq!(n(&fl["rx_packets"]), 500, "{fl}");
        assert_eq!(n(&fl["fragmented"]), 500, "{fl}");
        assert_eq!((n(&fl["lost"]), n(&fl["reordered"])), (0, 0), "{fl}");
        assert_eq!(
            n(&fl["frame_bytes"]),
            3000,
            "the frame it would have been: {fl}"
        );
    }
}

#[test]
fn fragments_the_kernel_made_are_made_whole_and_accounted() {
    let Some(lab) = Line::up("g", &["--kernel", "route"]) else {
        return;
    };
    quiet(&lab);
    common::up_to(2, |_| run(&lab, "198.18.1.2:9000", false));
    common::up_to(2, |_| run(&lab, "[2001:2:0:1::2]:9000", true));
}
