//! `flowlane forward --mode reflect` between two namespaces: blast's echoes come back through
//! the reflector, and every count adds up against the interfaces' own counters — frames the
//! DUT's interface received = frames the reflector looked at = forwarded + dropped by reason,
//! and the generator's interface got every forwarded frame back. Namespace tests need root.

mod common;

use common::Forwarder;
use flowlane_lab::{Offload, Pair, DUT_ADDR};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// The pair, the generator's end with transmit checksum offload as `tx_csum_offload` says.
fn pair(tx_csum_offload: bool) -> Option<(std::sync::MutexGuard<'static, ()>, Pair)> {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) for network namespaces");
        return None;
    }
    let guard = common::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let p = Pair::create("fl-fwd", 2).expect("namespaces and veth");
    p.gen
        .set_offload(&p.gen_if, Offload::TxChecksum, tx_csum_offload)
        .expect("SIOCETHTOOL");
    Some((guard, p))
}

/// An XDP program that passes every frame, on the generator's end while the returned link
/// lives: veth then takes frames redirected or sent back by XDP on the DUT's end.
fn xdp_pass_on_generator(p: &Pair) -> std::os::fd::OwnedFd {
    common::xdp_pass(&p.gen, &p.gen_if)
}

/// The reflector on the DUT's end, with `args`.
fn reflector(p: &Pair, args: &[&str]) -> Forwarder {
    let mut cmd = p.dut.command(BIN);
    cmd.args(["forward", "--mode", "reflect", "--dev", &p.dut_if])
        .args(args);
    Forwarder::start(cmd)
}

fn iface(p: &Pair, gen: bool) -> flowlane_lab::counters::IfCounters {
    let (ns, ifname) = if gen {
        (&p.gen, &p.gen_if)
    } else {
        (&p.dut, &p.dut_if)
    };
    ns.dev().expect("counters").ifaces[ifname]
}

/// 20 000 echoed datagrams in 4 flows through the reflector; the summaries of both sides.
fn reflect_run(p: &Pair, fwd_args: &[&str]) -> (Value, Value) {
    let fwd = reflector(p, fwd_args);
    let (g0, d0) = (iface(p, true), iface(p, false));
    let to = format!("{DUT_ADDR}:9000");
    let out = p
        .gen
        .command(BIN)
        .args([
            "blast", "--to", &to, "--echo", "--count", "20000", "--rate", "20k", "--burst", "512",
            "--flows", "4", "--json", "--quiet",
        ])
        .output()
        .expect("blast runs");
    let b: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "blast's JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let (code, f) = fwd.finish();
    common::schema_valid("forward", &f);
    let (g1, d1) = (iface(p, true), iface(p, false));
    assert_eq!(code, Some(0), "forward exits 0: {f}");
    // Exact accounting against the kernel's interface counters.
    let t = &f["total"];
    assert_eq!(
        d1.rx_packets - d0.rx_packets,
        20_000,
        "the DUT's interface got every frame"
    );
    assert_eq!(f["dev_rx_packets"], 20_000, "{f}");
    // Every frame the interface got was looked at, or is in the ring's own drop count (an
    // AF_PACKET worker kept off its CPU on a busy machine); native XDP never misses one.
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("a count: {f}"));
    let ring_drops = n(&t["ring_drops"]);
    assert_eq!(n(&t["rx_packets"]) + ring_drops, 20_000, "{f}");
    let d = &t["dropped"];
    for why in ["not_ip", "malformed", "truncated"] {
        assert_eq!(d[why], 0, "{why}: {f}");
    }
    let forwarded = n(&t["forwarded"]);
    assert_eq!(forwarded + n(&d["tx_full"]), n(&t["rx_packets"]), "{f}");
    assert_eq!(f["device_refused"], 0, "{f}");
    assert_eq!(
        g1.rx_packets - g0.rx_packets,
        forwarded,
        "every forwarded frame reached the generator's interface"
    );
    let per_cpu: u64 = f["cpus"]
        .as_array()
        .expect("cpus")
        .iter()
        .map(|c| n(&c["rx_packets"]))
        .sum();
    assert_eq!(per_cpu, n(&t["rx_packets"]), "per-CPU counts add up: {f}");
    // The cost of each frame, per worker that looked at any (its thread's CPU clock).
    for c in f["cpus"].as_array().expect("cpus") {
        if n(&c["rx_packets"]) > 0 && f["backend"]["backend"] != "xdp-native" {
            assert!(
                c["cpu_ns_per_packet"].as_f64().is_some_and(|x| x > 0.0),
                "{c}"
            );
        }
    }
    if f["backend"]["backend"] != "xdp-native" {
        common::pmu_said(&f);
    }
    assert_eq!(f["problems"], serde_json::json!([]), "{f}");
    // Per-flow truth at the generator: every echo back, or its loss explained — by the
    // reflector's counts, or by the generator's own socket (a busy machine can overflow it).
    assert_eq!(b["tx_packets"], 20_000, "{b}");
    assert_eq!(b["icmp_errors"], 0, "the DUT's kernel did not answer: {b}");
    assert_eq!(b["foreign"], 0, "{b}");
    assert_eq!(
        n(&b["lost"]),
        n(&b["lost_at_own_socket"]) + (20_000 - forwarded),
        "every loss explained: {b} {f}"
    );
    assert_eq!(b["duplicates"], 0, "{b}");
    for fl in b["flows"].as_array().expect("flows") {
        assert_eq!(fl["tx_packets"], 5_000, "{fl}");
    }
    assert!(
        b["latency_ns"]["p50"].as_u64().is_some_and(|n| n > 0),
        "{b}"
    );
    (b, f)
}

#[test]
fn native_xdp_reflector_returns_every_datagram_and_counts_add_up() {
    // The generator's checksum offload on, as a socket sender's is by default: every datagram
    // reaches the program with only the pseudo header's sum in its checksum, and XDP is not
    // told so — the program completes it (before, all 20 000 echoes were dropped as corrupt).
    let Some((_one, p)) = pair(true) else { return };
    let _pass = xdp_pass_on_generator(&p);
    let (b, f) = reflect_run(&p, &["--swap", "ip,ports"]);
    assert_eq!(f["backend"]["backend"], "xdp-native", "{f}");
    assert_eq!(f["total"]["checksum_completed"], 20_000, "{f}");
    assert_eq!(b["rx_packets"], 20_000, "every echo came back: {b}");
    // As the pair was made: two queues per end.
    assert_eq!(
        (&f["backend"]["rx_queues"], &f["backend"]["tx_queues"]),
        (&2.into(), &2.into()),
        "{f}"
    );
    assert_eq!(f["total"]["ring_drops"], 0, "no ring on this path: {f}");
    assert_eq!(
        f["total"]["forwarded"], 20_000,
        "native XDP never misses one: {f}"
    );
    assert_eq!(f["swapped"], serde_json::json!(["ip", "ports"]));
}

#[test]
fn af_packet_reflector_returns_every_datagram_and_counts_add_up() {
    // With the generator's checksum offload on, the reflector sees frames whose checksum is
    // not filled in yet (TP_STATUS_CSUMNOTREADY) and must finish it, or the echoes fail
    // their checksum at the generator.
    let Some((_one, p)) = pair(true) else { return };
    // AF_PACKET receives a copy: with no address the DUT's kernel drops the original quietly
    // instead of answering "port unreachable".
    p.dut
        .ip(&["addr", "flush", "dev", &p.dut_if])
        .expect("flush");
    let (_, f) = reflect_run(&p, &["--swap", "ip,ports", "--backend", "af-packet"]);
    assert_eq!(f["backend"]["backend"], "af-packet", "{f}");
    assert_eq!(f["total"]["dropped"]["tx_full"], 0, "{f}");
    // Every datagram came with its checksum left to offload, and left completed.
    assert_eq!(
        f["total"]["checksum_completed"], f["total"]["forwarded"],
        "{f}"
    );
}

#[test]
fn af_xdp_reflector_returns_every_datagram_and_counts_add_up() {
    // Frames an AF_XDP socket sends back on veth reach the generator only if it runs an XDP
    // program, as for native XDP. The generator's checksum offload is on, as a socket sender's
    // is by default: every datagram reaches the reflector with only the pseudo header's sum
    // in its checksum, and AF_XDP does not say so — the reflector must see it and complete
    // it (before, all 20 000 echoes came back with a wrong checksum and were dropped).
    let Some((_one, p)) = pair(true) else { return };
    let _pass = xdp_pass_on_generator(&p);
    let (b, f) = reflect_run(&p, &["--swap", "ip,ports", "--backend", "af-xdp"]);
    assert_eq!(f["backend"]["backend"], "af-xdp", "{f}");
    assert_eq!(
        f["total"]["checksum_completed"], f["total"]["forwarded"],
        "{f}"
    );
    assert_eq!(
        b["rx_packets"], f["total"]["forwarded"],
        "every echo came back: {b}"
    );
    assert_eq!(f["backend"]["af_xdp_bind"], "copy", "{f}");
    // One worker per receive queue of the pair's two.
    assert_eq!(f["cpus"].as_array().map(Vec::len), Some(2), "{f}");
    // With --not-ip pass the program hands what is not IP to the kernel (counted) and the
    // rest to the sockets: the same run adds up, passed frames included.
    let (_, f) = reflect_run(
        &p,
        &[
            "--swap",
            "ip,ports",
            "--backend",
            "af-xdp",
            "--not-ip",
            "pass",
        ],
    );
    assert_eq!(f["backend"]["backend"], "af-xdp", "{f}");
}

/// Flooded faster than it can turn frames around, the AF_XDP reflector's count still adds up
/// exactly: every frame the interface received was looked at or is in the sockets' own drop
/// counts (XDP_STATISTICS) — once, not twice.
#[test]
fn an_overloaded_af_xdp_reflector_counts_every_frame_once() {
    let Some((_one, p)) = pair(false) else { return };
    let _pass = xdp_pass_on_generator(&p);
    let fwd = reflector(&p, &["--backend", "af-xdp", "--cpus", "1"]);
    let d0 = iface(&p, false);
    let to = format!("{DUT_ADDR}:9000");
    // Unpaced AF_XDP frames from one core against one reflecting core: on this 2-core
    // machine the generator sends about twice what the reflector turns around.
    let out = p
        .gen
        .command(BIN)
        .args(["blast", "--mode", "xdp", "--dev", &p.gen_if, "--to", &to])
        .args(["--count", "400000", "--cpus", "0", "--json", "--quiet"])
        .output()
        .expect("blast runs");
    let b: Value = serde_json::from_slice(&out.stdout).expect("blast's JSON");
    assert_eq!(b["tx_packets"], 400_000, "{b}");
    let (code, f) = fwd.finish();
    assert_eq!(code, Some(0), "{f}");
    let got = iface(&p, false).rx_packets - d0.rx_packets;
    assert_eq!(got, 400_000, "the DUT's interface got every frame");
    let t = &f["total"];
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("a count: {f}"));
    assert_eq!(n(&t["rx_packets"]) + n(&t["ring_drops"]), got, "{f}");
    assert_eq!(
        n(&t["forwarded"]) + n(&t["dropped"]["tx_full"]),
        n(&t["rx_packets"]),
        "{f}"
    );
    if n(&t["ring_drops"]) == 0 {
        eprintln!("note: the reflector kept up this time; the drop count was not exercised");
    }
}

#[test]
fn a_peer_without_xdp_shows_as_refused_frames_and_exit_1() {
    // GRO on is not enough for veth to take XDP_TX frames (Linux 6.18): refused.
    let Some((_one, p)) = pair(false) else { return };
    p.gen
        .set_offload(&p.gen_if, Offload::Gro, true)
        .expect("GRO on");
    let mut cmd = p.dut.command(BIN);
    cmd.args(["forward", "--mode", "reflect", "--dev", &p.dut_if])
        .args(["--swap", "ip,ports", "--interval", "0.5"]);
    let mut fwd = Forwarder::start_stream(cmd);
    // 3 s of frames: the refusals show in a status record while it runs, not only at the end.
    let mut blast = p
        .gen
        .command(BIN)
        .args(["blast", "--to", &format!("{DUT_ADDR}:9000")])
        .args(["--count", "3000", "--rate", "1000", "--json", "--quiet"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("blast runs");
    let tick = fwd.until_record(12, |i| {
        i["device_refused"]
            .as_u64()
            .is_some_and(|n| n > 64 && i["delta"]["forwarded"].as_u64() >= Some(n))
    });
    assert!(tick["elapsed_s"].as_f64().expect("elapsed") < 4.0, "{tick}");
    assert!(blast.wait().expect("blast").success());
    let (code, f) = fwd.finish_stream();
    assert_eq!(code, Some(1), "{f}");
    assert_eq!(f["total"]["forwarded"], 3000, "{f}");
    assert_eq!(f["device_refused"], 3000, "{f}");
    let problem = f["problems"][0].as_str().expect("a problem");
    assert!(
        problem.contains("XDP program") && problem.contains("--backend af-xdp"),
        "the fix is said: {f}"
    );
}

#[test]
fn bad_requests_are_usage_errors() {
    for args in [
        vec!["forward", "--dev", "no-such-if0"],
        vec![
            "forward",
            "--dev",
            "lo",
            "--backend",
            "af-packet",
            "--cpus",
            "100000",
        ],
        vec!["forward", "--dev", "lo", "--swap", "macs"],
        vec!["forward", "--dev", "lo", "--duration", "0"],
        // Flags that would be ignored are refused.
        vec!["forward", "--dev", "lo", "--cpus", "0"],
        vec![
            "forward",
            "--dev",
            "lo",
            "--backend",
            "af-packet",
            "--not-ip",
            "drop",
        ],
    ] {
        let out = std::process::Command::new(BIN)
            .args(&args)
            .output()
            .expect("runs");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Each mode takes its own settings only: another mode's flag is refused, saying whose.
    for (args, whose) in [
        (vec!["--mode", "route", "--swap", "ip"], "--mode reflect"),
        (
            vec!["--mode", "bridge", "--not-ip", "pass"],
            "--mode reflect",
        ),
        (vec!["--mode", "reflect", "--ageing", "5"], "--mode bridge"),
        (
            vec!["--mode", "bridge", "--routes", "kernel"],
            "--mode route",
        ),
        (
            vec!["--mode", "reflect", "--next-hops", "x"],
            "--mode route",
        ),
    ] {
        let out = std::process::Command::new(BIN)
            .args(["forward", "--dev", "lo"])
            .args(&args)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(whose), "{args:?}: {err}");
    }
}

#[test]
fn af_xdp_sockets_receive_through_the_frame_vocabulary() {
    // The receive side of `io::frame` over AF_XDP: one socket per queue of the DUT's end, an
    // XSKMAP and the redirect program; 1000 raw frames from the generator all come through
    // `FrameRx` whole and parse, and the kernel's stack sees none of them.
    use flowlane_io::frame::{FrameRx, Xsk};
    use flowlane_io::{bpf, ebpf, netdev::ifindex};
    let Some((_one, p)) = pair(false) else { return };
    let dut_if = p.dut_if.clone();
    let (mut socks, _link, _map) = p
        .dut
        .run(move || {
            let idx = ifindex(&dut_if).expect("ifindex");
            let map = bpf::XskMap::create("fl_t_xsks", 2).expect("xskmap");
            let socks: Vec<Xsk> = (0..2)
                .map(|q| {
                    let x = Xsk::open(idx, q, 2048, 2048).expect("AF_XDP socket");
                    map.set(q, &x).expect("map entry");
                    x
                })
                .collect();
            let insns = ebpf::xsk_redirect_program(map.raw_fd()).expect("asm");
            let prog = bpf::prog_load(bpf::PROG_XDP, "fl_t_redir", &insns).expect("load");
            let link = bpf::attach_xdp(&prog, idx, 0).expect("attach");
            (socks, link, map)
        })
        .expect("in the DUT namespace");
    let snmp0 = p.dut.snmp().expect("snmp");
    let out = p
        .gen
        .command(BIN)
        .args([
            "blast",
            "--mode",
            "raw",
            "--dev",
            &p.gen_if,
            "--to",
            &format!("{DUT_ADDR}:9000"),
            "--count",
            "1000",
            "--json",
            "--quiet",
        ])
        .output()
        .expect("blast runs");
    assert_eq!(out.status.code(), Some(0));
    let mut got = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while got < 1000 && std::time::Instant::now() < deadline {
        for x in socks.iter_mut() {
            let _ = x.wait(10).expect("poll");
            while let Some(f) = FrameRx::next(x) {
                let u = flowlane_wire::UdpFrame::parse(f.data).expect("a whole UDP frame");
                assert_eq!(u.dst.port(), 9000);
                assert_eq!(f.data.len(), 60);
                got += 1;
                FrameRx::release(x);
            }
        }
    }
    assert_eq!(got, 1000, "every frame came through the sockets");
    let drops: u64 = socks
        .iter()
        .map(|x| FrameRx::take_drops(x).expect("stats"))
        .sum();
    assert_eq!(drops, 0);
    let snmp1 = p.dut.snmp().expect("snmp");
    assert_eq!(
        snmp1.delta(&snmp0, "Udp", "NoPorts"),
        0,
        "the stack saw none"
    );
    assert_eq!(
        snmp1.delta(&snmp0, "Ip", "InReceives"),
        0,
        "the stack saw none"
    );
}

/// Where the veth peer is in the forwarder's own namespace it can be seen: a native-XDP run
/// whose peer runs no XDP program is refused before the first frame, naming the peer and the
/// fix (exit 1); with a program on the peer it runs.
#[test]
fn a_peer_seen_without_xdp_is_refused_before_the_first_frame() {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) for network namespaces");
        return;
    }
    let _one = common::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let ns = flowlane_lab::Netns::create("fl-fwdp").expect("namespace");
    ns.ip(&[
        "link", "add", "flpa", "type", "veth", "peer", "name", "flpb",
    ])
    .expect("veth");
    for dev in ["flpa", "flpb"] {
        ns.ip(&["link", "set", dev, "up"]).expect("up");
    }
    let run = || {
        ns.command(BIN)
            .args(["forward", "--mode", "reflect", "--dev", "flpa"])
            .args(["--duration", "1", "--json", "--quiet"])
            .output()
            .expect("runs")
    };
    let out = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("flpb runs no XDP program") && err.contains("--backend af-xdp"),
        "{err}"
    );
    let _pass = common::xdp_pass(&ns, "flpb");
    let out = run();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
