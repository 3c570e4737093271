//! pktgen's ranges in `blast` (issue 53 item 3): destinations from an address range and a
//! port range, counted up or drawn at random per packet, kept `--flowlen` frames by each flow;
//! MAC counts; several interfaces in one run. Checked through a lab's kernel router (a route
//! to 198.18.4.0/24 via the sink) against `sink`'s flow table and per-flow accounting, tshark's
//! reading of a capture, and the interfaces' own counters.

mod common;

use common::{quiet, Line};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

/// A lab whose DUT routes 198.18.4.0/24 to the sink (whose kernel drops what is not its own,
/// after the sink's ring has seen it).
fn lab(tag: &str) -> Option<Line> {
    let lab = Line::up(tag, &["--kernel", "route"])?;
    lab.dut
        .ip(&["route", "add", "198.18.4.0/24", "via", "198.18.1.2"])
        .expect("a route through the sink");
    quiet(&lab);
    Some(lab)
}

/// `blast` in the generator with `args` (raw frames on flgen, JSON), judged ok.
fn blast(lab: &Line, args: &[&str]) -> Value {
    let out = lab
        .gen
        .command(BIN)
        .args(["blast", "--dev", "flgen", "--json", "--quiet"])
        .args(args)
        .output()
        .expect("blast runs");
    common::blast_judged_ok(
        out.status.code(),
        serde_json::from_slice(&out.stdout).expect("blast JSON"),
    )
}

fn sink_done(s: std::process::Child) -> Value {
    let out = s.wait_with_output().expect("sink ends");
    let v: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    common::schema_valid("sink", &v);
    v
}

/// Counting up: 256 addresses × 4 ports, 4 frames each, over 8 flows — the sink sees exactly
/// the 1 024 destinations as tuples of 4 frames, and every flow's 512 frames without a gap
/// although each moved through 128 destinations.
#[test]
fn counted_ranges_reach_every_destination_flowlen_frames_each() {
    let Some(lab) = lab("r") else { return };
    let s = common::sink_spawn(&lab, &["--count", "4096", "--tuple-capacity", "4096"]);
    let j = blast(
        &lab,
        &[
            "--mode",
            "raw",
            "--to",
            "198.18.4.0/24:9000-9003",
            "--flowlen",
            "4",
            "--flows",
            "8",
            "--count",
            "4096",
            "--rate",
            "40k",
        ],
    );
    assert_eq!(
        (n(&j["flows_started"]), n(&j["destinations"])),
        (1024, 1024),
        "{j}"
    );
    let line = j["pktgen"].as_str().expect("line");
    assert!(line.ends_with("flows: 1024"), "{line}");
    let s = sink_done(s);
    assert_eq!(n(&s["flowlane_packets"]), 4096, "{s}");
    let t = &s["tuples"];
    assert_eq!(
        (n(&t["seen"]), n(&t["live"]), n(&t["frames_live"])),
        (1024, 1024, 4096),
        "one tuple per destination: {t}"
    );
    assert_eq!(n(&t["hits"]), 4096 - 1024, "{t}");
    let flows = s["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 8, "{s}");
    for f in flows {
        assert_eq!(n(&f["rx_packets"]), 512, "{f}");
        for k in ["lost", "reordered", "duplicates"] {
            assert_eq!(n(&f[k]), 0, "{k}: {f}");
        }
    }
}

/// Random draws (AF_XDP, two threads), read by tshark from the sink's capture: every frame's
/// IPv4 and UDP checksums are good (the UDP one is the generator's, carried through the
/// router), every destination lies in the ranges and all 1 024 were drawn (missing one in
/// 20 000 draws has odds of about 3 in a million).
#[test]
fn random_ranges_stay_inside_with_valid_frames() {
    let Some(lab) = lab("x") else { return };
    if !common::need_program("tshark") {
        return;
    }
    let cap = std::env::temp_dir().join(format!("fl-ranges-{}.pcap", std::process::id()));
    let cap_s = cap.to_string_lossy().into_owned();
    let s = common::sink_spawn(&lab, &["--count", "20000", "--write", &cap_s]);
    let j = blast(
        &lab,
        &[
            "--mode",
            "xdp",
            "--cpus",
            "0,1",
            "--to",
            "198.18.4.0/24:9000-9003",
            "--dst-random",
            "--flows",
            "4",
            "--count",
            "20000",
            "--rate",
            "40k",
        ],
    );
    assert_eq!(n(&j["flows_started"]), 20_000, "flowlen 1: {j}");
    let s = sink_done(s);
    assert_eq!(n(&s["flowlane_packets"]), 20_000, "{s}");
    assert_eq!(n(&s["malformed"]), 0, "{s}");
    let out = std::process::Command::new("tshark")
        .args(["-r", &cap_s, "-o", "udp.check_checksum:TRUE"])
        .args(["-o", "ip.check_checksum:TRUE", "-T", "fields"])
        .args(["-e", "ip.dst", "-e", "udp.dstport"])
        .args(["-e", "ip.checksum.status", "-e", "udp.checksum.status"])
        .output()
        .expect("tshark runs");
    let _ = std::fs::remove_file(&cap);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 20_000, "tshark reads every frame");
    let mut dests = std::collections::HashSet::new();
    for r in &rows {
        assert_eq!(&r[2..4], &["1", "1"], "checksums good: {r:?}");
        assert!(r[0].starts_with("198.18.4."), "{r:?}");
        let port: u16 = r[1].parse().expect("port");
        assert!((9000..=9003).contains(&port), "{r:?}");
        dests.insert((r[0].to_string(), port));
    }
    assert_eq!(dests.len(), 1024, "every destination drawn");
}

/// MAC counts as they leave: a sink on the DUT's own interface sees the generator's frames
/// with 3 source and 2 destination MACs in turn (frames to the second destination MAC are the
/// DUT's to drop, but its ring sees them first).
#[test]
fn mac_counts_cycle_per_frame() {
    let Some(lab) = lab("m") else { return };
    if !common::need_program("tshark") {
        return;
    }
    let cap = std::env::temp_dir().join(format!("fl-macs-{}.pcap", std::process::id()));
    let cap_s = cap.to_string_lossy().into_owned();
    let sink = lab
        .dut
        .command(BIN)
        .args([
            "sink",
            "--dev",
            "fldut",
            "--count",
            "600",
            "--duration",
            "30",
        ])
        .args(["--json", "--write", &cap_s])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("sink starts");
    std::thread::sleep(std::time::Duration::from_millis(500));
    blast(
        &lab,
        &[
            "--mode",
            "raw",
            "--to",
            "198.18.1.2:9000",
            "--count",
            "600",
            "--rate",
            "20k",
            "--src-mac-count",
            "3",
            "--dst-mac-count",
            "2",
        ],
    );
    let s = sink_done(sink);
    assert_eq!(n(&s["flowlane_packets"]), 600, "{s}");
    let out = std::process::Command::new("tshark")
        .args([
            "-r", &cap_s, "-T", "fields", "-e", "eth.src", "-e", "eth.dst",
        ])
        .output()
        .expect("tshark runs");
    let _ = std::fs::remove_file(&cap);
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows.len(), 600);
    let mut pairs: std::collections::HashMap<&str, usize> = Default::default();
    for r in &rows {
        *pairs.entry(*r).or_default() += 1;
    }
    // 3 × 2 counted per frame in step: 6 (source, destination) pairs, 100 frames each.
    assert_eq!(pairs.len(), 6, "{pairs:?}");
    assert!(pairs.values().all(|&c| c == 100), "{pairs:?}");
}

/// Two interfaces in one run: a second veth pair between the generator and the DUT, two
/// threads, one per interface — each interface's own transmit counter and its peer's receive
/// counter carry exactly half of the frames. An odd thread count is refused.
#[test]
fn several_interfaces_share_a_run_by_threads() {
    let Some(lab) = lab("d") else { return };
    common::ok(
        &std::process::Command::new("ip")
            .args([
                "-n",
                lab.gen.name(),
                "link",
                "add",
                "flgen2",
                "type",
                "veth",
            ])
            .args(["peer", "name", "fldut2", "netns", lab.dut.name()])
            .output()
            .expect("ip runs"),
    );
    // No IPv6 on the new pair: it would announce itself and move the counters.
    for (ns, dev) in [(&lab.gen, "flgen2"), (&lab.dut, "fldut2")] {
        ns.run(|| std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1"))
            .expect("in the namespace")
            .expect("IPv6 off");
    }
    lab.gen.ip(&["link", "set", "flgen2", "up"]).expect("up");
    lab.dut.ip(&["link", "set", "fldut2", "up"]).expect("up");
    quiet(&lab);
    let dut_mac = lab
        .dut
        .run_with_sys(|| flowlane_io::netdev::mac("fldut"))
        .expect("in the DUT")
        .expect("a MAC");
    let mac = dut_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let counts = || {
        let g = lab.gen.dev().expect("counters");
        let d = lab.dut.dev().expect("counters");
        [
            g.ifaces["flgen"].tx_packets,
            g.ifaces["flgen2"].tx_packets,
            d.ifaces["fldut"].rx_packets,
            d.ifaces["fldut2"].rx_packets,
        ]
    };
    let before = counts();
    let j = blast(
        &lab,
        &[
            "--mode",
            "raw",
            "--dev",
            "flgen2",
            "--dst-mac",
            &mac,
            "--to",
            "198.18.1.2:9000",
            "--flows",
            "4",
            "--cpus",
            "0,1",
            "--count",
            "10000",
            "--rate",
            "20k",
        ],
    );
    assert_eq!(n(&j["tx_packets"]), 10_000, "{j}");
    assert_eq!(j["devs"], serde_json::json!(["flgen", "flgen2"]), "{j}");
    let after = counts();
    let grew: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    assert_eq!(grew, [5000, 5000, 5000, 5000], "tx, tx, rx, rx");

    let out = lab
        .gen
        .command(BIN)
        .args([
            "blast",
            "--mode",
            "raw",
            "--dev",
            "flgen,flgen2",
            "--dst-mac",
            &mac,
        ])
        .args(["--to", "198.18.1.2:9000", "--flows", "4", "--cpus", "0"])
        .args(["--count", "10"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "one thread for two interfaces");
}

/// What ranges cannot do is refused before anything is sent.
#[test]
fn ranges_outside_the_frame_modes_are_usage_errors() {
    for args in [
        // UDP sockets are connected to one destination.
        &["--to", "198.18.4.0/24:9000"][..],
        &["--to", "127.0.0.1:9000", "--dst-random"],
        &["--to", "127.0.0.1:9000", "--flowlen", "0"],
        &[
            "--mode",
            "xdp-live",
            "--dev",
            "lo",
            "--to",
            "127.0.0.1:9000-9001",
        ],
        &["--to", "2001:2::1:9000"],
        // Fragments are cut from built frames; UDP sockets leave that to the kernel.
        &["--to", "127.0.0.1:9000", "--fragment-size", "256"],
        &[
            "--mode",
            "raw",
            "--dev",
            "lo",
            "--to",
            "127.0.0.1:9000",
            "--fragment-size",
            "100",
        ],
    ] {
        let out = std::process::Command::new(BIN)
            .arg("blast")
            .args(args)
            .args(["--count", "1"])
            .output()
            .expect("runs");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
