//! IP fragments end to end (issue 54): `blast` in UDP mode with datagrams larger than the
//! path MTU (the kernel fragments them) and in the frame modes cutting them itself
//! (`--fragment-size`, every order, a share of each flow), through a lab's kernel router,
//! into `sink`, which reassembles them per receive queue and accounts the datagrams as whole
//! ones. Counts are checked against the generator kernel's own (/proc/net/snmp `Ip:
//! FragCreates`, snmp6 `Ip6FragCreates`) and blast's, and tshark — an independent
//! dissector — reads every fragment blast built and reassembles the datagrams it meant.

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
    let b: Value = serde_json::from_slice(&out.stdout).expect("blast JSON");
    common::blast_judged_ok(out.status.code(), b.clone());
    let made = created(lab, v6) - before;
    let out = sink.wait_with_output().expect("sink ends");
    let s: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    common::schema_valid("sink", &s);
    assert_eq!(n(&s["flowlane_packets"]), 1000, "{s}");
    let f = &s["fragments"];
    assert_eq!(made, 3000, "three fragments a datagram: {f}");
    assert_eq!(
        (n(&b["fragmented_datagrams"]), n(&b["fragments"])),
        (1000, made),
        "blast counts what the path MTU makes its kernel cut: {b}"
    );
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

/// 1 000 datagrams over two flows from UDP sockets, a quarter of each flow's of 3 000
/// payload bytes (`--fragment-datagram`: three fragments each, cut by the kernel) and the rest
/// whole 200-byte frames: blast's counts are the kernel's, and the sink makes the long ones
/// whole and tells per flow how many came fragmented.
fn mixed(lab: &Line, to: &str, v6: bool) {
    let before = created(lab, v6);
    let sink = common::sink_start(lab, 1000);
    let out = lab
        .gen
        .command(BIN)
        .args(["blast", "--to", to, "--size", "200", "--count", "1000"])
        .args(["--fragment-datagram", "3000", "--fragment-share", "25"])
        .args(["--rate", "5k", "--flows", "2", "--json", "--quiet"])
        .output()
        .expect("blast runs");
    let b: Value = serde_json::from_slice(&out.stdout).expect("blast JSON");
    common::blast_judged_ok(out.status.code(), b.clone());
    let made = created(lab, v6) - before;
    let out = sink.wait_with_output().expect("sink ends");
    let s: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    assert_eq!(made, 750, "three fragments for each of 250 datagrams");
    assert_eq!(
        (n(&b["fragmented_datagrams"]), n(&b["fragments"])),
        (250, made),
        "{b}"
    );
    let f = &s["fragments"];
    assert_eq!((n(&f["fragments"]), n(&f["datagrams"])), (750, 250), "{f}");
    let flows = s["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 2, "{s}");
    for fl in flows {
        assert_eq!(n(&fl["rx_packets"]), 500, "{fl}");
        assert_eq!(n(&fl["fragmented"]), 125, "a quarter of each flow: {fl}");
        assert_eq!(n(&fl["lost"]), 0, "{fl}");
    }
}

/// 400 datagrams of 1 000-byte frames over two flows, half of each flow's cut in pieces of
/// 256 bytes (four fragments) sent in `order`, from a frame mode; the sink writes what it
/// reads to a capture for tshark.
fn cut(lab: &Line, mode: &str, to: &str, order: &str) {
    let cap = std::env::temp_dir().join(format!("fl-frag-{}-{order}.pcap", std::process::id()));
    let cap_s = cap.to_string_lossy().into_owned();
    let sink = common::sink_start_with(lab, 400, &["--write", &cap_s]);
    let out = lab
        .gen
        .command(BIN)
        .args(["blast", "--mode", mode, "--dev", "flgen", "--to", to])
        .args([
            "--size",
            "1000",
            "--fragment-size",
            "256",
            "--fragment-share",
            "50",
        ])
        .args(["--fragment-order", order, "--count", "400", "--rate", "5k"])
        .args(["--flows", "2", "--json", "--quiet"])
        .output()
        .expect("blast runs");
    let b = common::blast_judged_ok(
        out.status.code(),
        serde_json::from_slice(&out.stdout).expect("blast JSON"),
    );
    assert_eq!(
        (n(&b["fragmented_datagrams"]), n(&b["fragments"])),
        (200, 800),
        "half cut, four pieces each: {b}"
    );
    let line = b["pktgen"].as_str().expect("line");
    assert!(line.contains("(1000byte,4frags)"), "{line}");
    let out = sink.wait_with_output().expect("sink ends");
    let s: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    common::schema_valid("sink", &s);
    // On the wire: 200 whole frames and 800 fragments; every one read.
    assert_eq!(n(&s["rx_packets"]), 1000, "{s}");
    assert_eq!(n(&s["flowlane_packets"]), 400, "{s}");
    let f = &s["fragments"];
    assert_eq!(
        (
            n(&f["fragments"]),
            n(&f["datagrams"]),
            n(&f["held_fragments"])
        ),
        (800, 200, 0),
        "{order}: {f}"
    );
    for fl in s["flows"].as_array().expect("flows") {
        assert_eq!(n(&fl["rx_packets"]), 200, "{fl}");
        assert_eq!(n(&fl["fragmented"]), 100, "{fl}");
        // Each datagram's fragments leave back to back: none overtakes another.
        assert_eq!((n(&fl["lost"]), n(&fl["reordered"])), (0, 0), "{fl}");
        assert_eq!(n(&fl["reordered_across"]), 0, "{fl}");
    }
    // tshark: every fragment valid, and its reassembly gives the 400 datagrams, their UDP
    // checksums good.
    let out = std::process::Command::new("tshark")
        .args(["-r", &cap_s, "-o", "udp.check_checksum:TRUE"])
        .args(["-o", "ip.check_checksum:TRUE", "-Y", "udp", "-T", "fields"])
        .args(["-e", "udp.checksum.status", "-e", "udp.length"])
        .output()
        .expect("tshark runs");
    let _ = std::fs::remove_file(&cap);
    let text = String::from_utf8_lossy(&out.stdout);
    let v6 = to.starts_with('[');
    let ulen = if v6 { "946" } else { "966" };
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len(), 400, "{order}: datagrams tshark reassembled");
    for r in rows {
        assert_eq!(r, format!("1\t{ulen}"), "{order}");
    }
}

#[test]
fn fragments_the_kernel_and_blast_made_are_made_whole_and_accounted() {
    let Some(lab) = Line::up("g", &["--kernel", "route"]) else {
        return;
    };
    quiet(&lab);
    common::up_to(2, |_| run(&lab, "198.18.1.2:9000", false));
    common::up_to(2, |_| run(&lab, "[2001:2:0:1::2]:9000", true));
    common::up_to(2, |_| mixed(&lab, "198.18.1.2:9000", false));
    common::up_to(2, |_| mixed(&lab, "[2001:2:0:1::2]:9000", true));
    if !common::need_program("tshark") {
        return;
    }
    for order in ["in-order", "reverse", "odd-even", "random"] {
        common::up_to(2, |_| cut(&lab, "raw", "198.18.1.2:9000", order));
    }
    common::up_to(2, |_| cut(&lab, "xdp", "198.18.1.2:9000", "random"));
    common::up_to(2, |_| cut(&lab, "raw", "[2001:2:0:1::2]:9000", "odd-even"));
}

/// The sink namespace kernel's datagrams reassembled so far (it reassembles what reaches its
/// interface too: the AF_PACKET sink watches, the kernel's path still runs).
fn reasm_oks(lab: &Line) -> u64 {
    let v = lab
        .sink
        .snmp()
        .expect("snmp")
        .get("Ip", "ReasmOKs")
        .unwrap_or(0);
    u64::try_from(v).expect("a count")
}

/// 100 datagrams of four fragments each, cut as `attack` says: what the sink made whole and
/// dropped, by reason, exactly — and the kernel, as reference, made whole the same number.
/// Returns the sink's fragment counts.
fn attacked(lab: &Line, attack: &str) -> Value {
    let before = reasm_oks(lab);
    let sink = common::sink_spawn(lab, &["--idle", "1"]);
    let out = lab
        .gen
        .command(BIN)
        .args([
            "blast",
            "--mode",
            "raw",
            "--dev",
            "flgen",
            "--to",
            "198.18.1.2:9000",
        ])
        .args([
            "--size",
            "1000",
            "--fragment-size",
            "256",
            "--fragment-attack",
            attack,
        ])
        .args(["--count", "100", "--rate", "5k", "--json", "--quiet"])
        .output()
        .expect("blast runs");
    let b = common::blast_judged_ok(
        out.status.code(),
        serde_json::from_slice(&out.stdout).expect("blast JSON"),
    );
    let out = sink.wait_with_output().expect("sink ends");
    let s: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    common::schema_valid("sink", &s);
    let f = s["fragments"].clone();
    assert_eq!(n(&f["fragments"]), n(&b["fragments"]), "{attack}: {f}");
    assert_eq!(
        n(&f["datagrams"]),
        reasm_oks(lab) - before,
        "{attack}: the kernel made whole what the sink did: {f}"
    );
    assert_eq!(n(&s["flowlane_packets"]), n(&f["datagrams"]), "{attack}");
    f
}

/// The hostile cuts against the sink and the kernel beside it: an overlap either way and
/// Teardrop drop the datagram (its first two fragments; the last two wait in a context of
/// their own until it times out), a duplicate is ignored, a tiny first fragment is legal,
/// an incomplete datagram waits. Nothing panics, every fragment is counted where it ended.
#[test]
fn hostile_fragments_are_counted_by_reason_as_the_kernel_decides() {
    let Some(lab) = Line::up("h", &["--kernel", "route"]) else {
        return;
    };
    quiet(&lab);
    for attack in ["overlap-forward", "overlap-back", "teardrop"] {
        let f = common::up_to(2, |_| attacked(&lab, attack));
        assert_eq!(
            (
                n(&f["datagrams"]),
                n(&f["overlap"]),
                n(&f["held_fragments"])
            ),
            (0, 200, 200),
            "{attack}: {f}"
        );
    }
    let f = common::up_to(2, |_| attacked(&lab, "duplicate"));
    assert_eq!(
        (n(&f["fragments"]), n(&f["datagrams"]), n(&f["duplicate"])),
        (500, 100, 100),
        "{f}"
    );
    let f = common::up_to(2, |_| attacked(&lab, "tiny-first"));
    assert_eq!((n(&f["fragments"]), n(&f["datagrams"])), (500, 100), "{f}");
    let f = common::up_to(2, |_| attacked(&lab, "incomplete"));
    assert_eq!(
        (
            n(&f["datagrams"]),
            n(&f["held_fragments"]),
            n(&f["held_contexts"])
        ),
        (0, 300, 100),
        "{f}"
    );
    assert_eq!(n(&f["datagrams_dropped"]), 0, "{f}");
}
