//! What a newcomer meets in the first minutes: units as the field writes them, defaults that
//! fit the target, exit codes a script can trust, and arguments checked before anything is
//! built. Loopback only: no root needed.

mod common;

use std::net::UdpSocket;
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn flowlane(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn summary(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// A paced run's summary (see [`common::blast_judged_ok`]).
fn paced_summary(o: &Output) -> Value {
    let j: Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("JSON ({e}): {}", stderr(o)));
    common::blast_judged_ok(o.status.code(), j)
}

#[test]
fn an_ipv6_target_works_with_the_default_size() {
    let Ok(sink) = UdpSocket::bind("[::1]:0") else {
        eprintln!("SKIP: no IPv6 loopback here");
        return;
    };
    let to = sink.local_addr().expect("addr").to_string();
    let j = summary(&flowlane(&["blast", "--to", &to, "--count", "10", "-J"]));
    // 14 + 40 + 8 bytes of headers and the 16-byte flowlane header: the smallest frame that
    // still carries flow, sequence number and timestamp.
    assert_eq!(j["frame_bytes"], 78, "{j}");
    assert_eq!(j["tx_packets"], 10);
    let mut buf = [0u8; 64];
    let n = sink.recv(&mut buf).expect("a datagram arrived");
    assert_eq!(n, 16, "payload = 78 - 62");
}

#[test]
fn iperf_style_short_options_and_units() {
    let sink = UdpSocket::bind("127.0.0.1:0").expect("sink");
    let to = sink.local_addr().expect("addr").to_string();
    let o = flowlane(&[
        "blast", "--to", &to, "-t", "300ms", "-b", "2k", "-l", "100", "-P", "2", "-i", "1s", "-J",
        "--quiet",
    ]);
    let j = paced_summary(&o);
    assert_eq!(j["frame_bytes"], 100, "{j}");
    assert_eq!(j["flows"].as_array().expect("flows").len(), 2);
    assert_eq!(j["requested_pps"], 2000.0);
    // Stopped by the 300 ms deadline (300 s would not have ended here).
    let secs = j["duration_s"].as_f64().expect("duration");
    assert!(secs > 0.0 && secs <= 0.35, "-t 300ms: {j}");
    // The pacer never sends faster than asked (a loaded CPU may make it slower).
    let sent = j["tx_packets"].as_u64().expect("sent");
    // 2 000 pps for 0.3 s is 600, plus at most the bucket of 32 that may leave at once.
    assert!(sent > 0 && sent <= 640, "-b 2k for 0.3 s: {j}");
    // The ports the kernel chose are reported, so a flow can be fed back into `flowlane hash`.
    for f in j["flows"].as_array().expect("flows") {
        let src: std::net::SocketAddr = f["src"].as_str().expect("src").parse().expect("addr");
        assert_ne!(src.port(), 0, "{f}");
    }
}

#[test]
fn a_bare_rate_that_could_be_bits_is_refused_with_both_ways_to_say_it() {
    let o = flowlane(&["blast", "--to", "127.0.0.1:9", "--rate", "20000000"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("20M") && e.contains("20Mbit"), "{e}");
    for bad in [["--duration", "ten"], ["--rate", "0"]] {
        let mut args = vec!["blast", "--to", "127.0.0.1:9"];
        args.extend(bad);
        assert_eq!(flowlane(&args).status.code(), Some(2), "{bad:?}");
    }
}

#[test]
fn bench_takes_the_same_rates_and_checks_its_arguments_first() {
    // A report directory that cannot be written is refused before any lab is built.
    let o = flowlane(&[
        "bench",
        "--out",
        "/proc/flowlane-cannot-be-here",
        "--name",
        "fltarg",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--out"), "{}", stderr(&o));
    assert!(!std::path::Path::new("/run/netns/fltarg-gen").exists());
    for bad in [
        ["--rate", "0"],
        ["--rate", "30000000"],
        ["--step-secs", "soon"],
    ] {
        let mut args = vec!["bench", "--loopback"];
        args.extend(bad);
        assert_eq!(flowlane(&args).status.code(), Some(2), "{bad:?}");
    }
    // `--rate 50k` (refused before) and a duration with its unit.
    let dir = std::env::temp_dir().join(format!("flowlane-fc-{}", std::process::id()));
    let o = Command::new(BIN)
        .args([
            "bench",
            "--loopback",
            "--buckets",
            "1",
            "--step-secs",
            "500ms",
        ])
        .args(["--rate", "50k", "--mode", "sink", "-J", "--out"])
        .arg(&dir)
        .output()
        .expect("runs");
    let r = summary(&o);
    assert_eq!(r["step_secs"], 0.5, "500ms");
    let s = &r["steps"][0];
    let seen = s["five"]["server_seen"].as_u64().expect("seen");
    // Every datagram sent was seen (loopback), and never faster than 50k pps: half a second
    // holds at most ~25 000 (a loaded CPU may send fewer; the rate is a ceiling).
    assert_eq!(Some(seen), s["client_program_sent"].as_u64(), "{s}");
    assert!(seen > 0 && seen <= 26_000, "{seen}: {r}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_refuses_port_zero_and_its_live_rows_carry_the_time() {
    let o = flowlane(&["serve", "--bind", "127.0.0.1:0", "--duration", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("port 0"), "{}", stderr(&o));
    let port = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("port")
        .port();
    let o = flowlane(&[
        "serve",
        "--bind",
        &format!("127.0.0.1:{port}"),
        "--cpus",
        "0",
        "-t",
        "1.6s",
        "-i",
        "500ms",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let live: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()) && l.contains('s'))
        .collect();
    // Rows at about 0.5, 1.0 and 1.5 s, each starting with its time, and one for the rest when
    // the run ends (about 1.6 s).
    assert!(live.len() >= 3, "{text}");
    for l in &live {
        let t = l.split_whitespace().next().expect("time");
        let secs: f64 = t.trim_end_matches('s').parse().expect("seconds");
        assert!(secs > 0.3 && secs < 2.5, "{l}");
    }
}

#[test]
fn both_declared_licenses_are_shipped() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    assert!(manifest.contains(r#"license = "MIT OR Apache-2.0""#));
    let mit = std::fs::read_to_string(root.join("LICENSE-MIT")).expect("LICENSE-MIT");
    assert!(mit.contains("Permission is hereby granted, free of charge"));
    let apache = std::fs::read_to_string(root.join("LICENSE-APACHE")).expect("LICENSE-APACHE");
    assert!(apache.contains("Apache License") && apache.contains("Version 2.0, January 2004"));
}
