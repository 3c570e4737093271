//! `flowlane blast` against real sockets: exact counts on the peer's interface, rate accuracy,
//! loss from a firewall rule, RSS placement, and foreign echoes. Namespace tests need root.

use std::net::UdpSocket;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use flowlane_lab::{Pair, DUT_ADDR};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// Namespace tests measure rates and exact counters on a 2-core machine: one at a time, so
/// they do not take each other's CPU time (the lock is held for the test's whole life).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pair() -> Option<(std::sync::MutexGuard<'static, ()>, Pair)> {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) for network namespaces");
        return None;
    }
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    Some((
        guard,
        Pair::create("fl-blast", 1).expect("namespaces and veth"),
    ))
}

fn json_of(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "blast failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON summary")
}

/// Runs blast in the generator namespace with `args` (+ --json --quiet).
fn blast(p: &Pair, args: &[&str]) -> Value {
    let out = p
        .gen
        .command(BIN)
        .arg("blast")
        .args(args)
        .args(["--json", "--quiet"])
        .output()
        .expect("blast runs");
    json_of(&out)
}

/// Packets the DUT's interface received while `f` ran.
fn dut_rx(p: &Pair, f: impl FnOnce()) -> u64 {
    let before = p.dut.dev().expect("counters").ifaces[&p.dut_if];
    f();
    let after = p.dut.dev().expect("counters").ifaces[&p.dut_if];
    after.rx_packets - before.rx_packets
}

#[test]
fn count_is_exact_on_the_peer_interface() {
    let Some((_one, p)) = pair() else { return };
    let to = format!("{DUT_ADDR}:9000");
    let mut j = Value::Null;
    let n = dut_rx(&p, || {
        j = blast(&p, &["--to", &to, "--count", "100000", "--flows", "4"]);
    });
    assert_eq!(j["tx_packets"], 100_000);
    assert_eq!(n, 100_000, "frames counted on the peer interface");
    assert_eq!(j["frame_bytes"], 60);
    let flows: u64 = j["flows"]
        .as_array()
        .expect("flows")
        .iter()
        .map(|f| f["tx_packets"].as_u64().expect("count"))
        .sum();
    assert_eq!(flows, 100_000);
    assert!(j["pktgen"].as_str().expect("line").starts_with("OK: "));
}

#[test]
fn paced_rate_lands_within_two_percent_at_the_peer() {
    let Some((_one, p)) = pair() else { return };
    let to = format!("{DUT_ADDR}:9000");
    let mut j = Value::Null;
    let n = dut_rx(&p, || {
        j = blast(&p, &["--to", &to, "--rate", "50000", "--duration", "2"]);
    });
    // 2 s at 50 000 pps, counted where the frames arrive.
    assert!((98_000..=102_000).contains(&n), "peer counted {n}: {j}");
    assert_eq!(j["tx_packets"], n);
    assert_eq!(j["generator_limited"], false, "{j}");
    assert_eq!(j["requested_pps"], 50_000.0);
}

#[test]
fn every_hundredth_dropped_by_the_peer_is_exactly_one_percent_loss() {
    let Some((_one, p)) = pair() else { return };
    if Command::new("nft").arg("--version").output().is_err() {
        eprintln!("SKIP: nft is needed (apt-get install nftables)");
        return;
    }
    // The DUT's firewall drops every 100th datagram to the server before it is echoed.
    let rules = "table inet fl {\n chain in {\n  type filter hook input priority 0;\n  \
                 udp dport 9000 numgen inc mod 100 == 0 drop\n }\n}\n";
    let mut nft = p
        .dut
        .command("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft");
    {
        use std::io::Write;
        nft.stdin
            .take()
            .expect("stdin")
            .write_all(rules.as_bytes())
            .expect("rules");
    }
    assert!(nft.wait().expect("nft").success(), "nft rules");
    let bind = format!("{DUT_ADDR}:9000");
    let mut srv = p
        .dut
        .command(BIN)
        .args(["serve", "--bind", &bind, "--cpus", "1", "--quiet", "--json"])
        .args(["--duration", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    {
        use std::io::{BufRead, BufReader};
        // With --json the banner goes to stderr once every worker is bound and polling.
        let mut lines = BufReader::new(srv.stderr.take().expect("stderr")).lines();
        let banner = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(banner.starts_with("flowlane serve:"), "{banner}");
        std::thread::spawn(move || lines.for_each(drop));
    }
    let j = blast(
        &p,
        &[
            "--to", &bind, "--count", "20000", "--rate", "100k", "--echo", "--flows", "2",
        ],
    );
    let _ = srv.kill();
    let _ = srv.wait();
    assert_eq!(j["tx_packets"], 20_000);
    assert_eq!(j["lost"], 200, "{j}");
    assert_eq!(j["rx_packets"], 19_800);
    assert_eq!(j["reordered"], 0);
    assert_eq!(j["duplicates"], 0);
    assert_eq!(j["lost_at_own_socket"], 0);
    let l = &j["latency_ns"];
    let (p50, max) = (
        l["p50"].as_u64().expect("p50"),
        l["max"].as_u64().expect("max"),
    );
    assert!(p50 > 0 && p50 <= max, "{j}");
}

#[test]
fn rss_placed_flows_hash_to_their_queue() {
    // Loopback: the placement is a property of the tuples, checked with the rss crate.
    let sink = UdpSocket::bind("127.0.0.1:0").expect("sink");
    let to = sink.local_addr().expect("addr").to_string();
    let out = Command::new(BIN)
        .args(["blast", "--to", &to, "--from", "127.0.0.1", "--queues", "4"])
        .args(["--per-queue", "2", "--count", "80", "--json", "--quiet"])
        .output()
        .expect("runs");
    let j = json_of(&out);
    let flows = j["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 8);
    let key = flowlane_rss::Key::MICROSOFT;
    let hasher = flowlane_rss::Toeplitz::new(&key);
    let reta = flowlane_rss::Reta::round_robin(128, 4).expect("reta");
    let mut per_queue = [0; 4];
    for f in flows {
        let src: std::net::SocketAddr = f["src"].as_str().expect("src").parse().expect("addr");
        let dst: std::net::SocketAddr = f["dst"].as_str().expect("dst").parse().expect("addr");
        let t = flowlane_rss::Tuple::from_socket_addrs(src, dst).expect("tuple");
        let q = reta.queue(hasher.hash(&t));
        assert_eq!(f["queue"], q, "{f}");
        per_queue[q as usize] += 1;
        assert_eq!(f["tx_packets"], 10);
    }
    assert_eq!(per_queue, [2, 2, 2, 2]);
}

#[test]
fn foreign_and_short_echoes_are_counted_never_fatal() {
    let fake = UdpSocket::bind("127.0.0.1:0").expect("fake echo server");
    fake.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let to = fake.local_addr().expect("addr").to_string();
    let replier = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for i in 0..100 {
            let Ok((n, from)) = fake.recv_from(&mut buf) else {
                return i;
            };
            // Half answer with a short datagram, half with a foreign payload of full size.
            let reply: &[u8] = if i % 2 == 0 {
                b"hi"
            } else {
                &[0x55; 64][..n.min(64)]
            };
            fake.send_to(reply, from).expect("reply");
        }
        100
    });
    let out = Command::new(BIN)
        .args([
            "blast", "--to", &to, "--count", "100", "--rate", "10k", "--echo",
        ])
        .args(["--linger", "0.5", "--json", "--quiet"])
        .output()
        .expect("runs");
    assert_eq!(replier.join().expect("replier"), 100);
    let j = json_of(&out);
    assert_eq!(j["tx_packets"], 100);
    assert_eq!(j["foreign"], 100);
    assert_eq!(j["lost"], 100, "nothing valid came back");
}

#[test]
fn impossible_requests_are_usage_errors() {
    for args in [
        vec!["--to", "127.0.0.1:9", "--size", "41"],
        vec!["--to", "127.0.0.1:9", "--payload", "70000"],
        vec!["--to", "127.0.0.1:9", "--size", "50", "--echo"],
        vec!["--to", "127.0.0.1:9", "--rate", "fast"],
        vec![
            "--to",
            "127.0.0.1:9",
            "--from",
            "198.18.99.99",
            "--count",
            "1",
        ],
        vec!["--to", "127.0.0.1:9", "--cpus", "4000"],
        vec!["--to", "127.0.0.1"],
        vec!["--to", "127.0.0.1:9", "--count", "0"],
    ] {
        let out = Command::new(BIN)
            .arg("blast")
            .args(&args)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn raw_mode_count_is_exact_on_the_peer_interface() {
    frame_mode_count_is_exact("raw");
}

#[test]
fn xdp_mode_count_is_exact_on_the_peer_interface() {
    frame_mode_count_is_exact("xdp");
}

fn frame_mode_count_is_exact(mode: &str) {
    let Some((_one, p)) = pair() else { return };
    let to = format!("{DUT_ADDR}:9000");
    let mut j = Value::Null;
    let n = dut_rx(&p, || {
        j = blast(
            &p,
            &[
                "--mode", mode, "--dev", &p.gen_if, "--to", &to, "--count", "100000", "--flows",
                "3",
            ],
        );
    });
    assert_eq!(j["tx_packets"], 100_000);
    assert_eq!(n, 100_000, "frames counted on the peer interface");
    let per_flow: Vec<u64> = j["flows"]
        .as_array()
        .expect("flows")
        .iter()
        .map(|f| f["tx_packets"].as_u64().expect("count"))
        .collect();
    assert_eq!(per_flow.iter().sum::<u64>(), 100_000);
    // Raw frames carry real source ports, one per flow.
    assert_eq!(j["flows"][2]["src"], "198.18.0.1:10002");
    // A raw run without --dev, or with an interface that is not there: usage errors.
    for args in [
        vec!["blast", "--mode", mode, "--to", &to, "--count", "1"],
        vec![
            "blast", "--mode", mode, "--dev", "nosuch0", "--to", &to, "--count", "1",
        ],
        vec![
            "blast", "--mode", mode, "--dev", &p.gen_if, "--to", &to, "--size", "1600",
        ],
        vec![
            "blast", "--mode", mode, "--dev", &p.gen_if, "--to", &to, "--echo",
        ],
        // veth reports 10 Gb/s: 14.88 Mpps of 60-byte frames at most.
        vec![
            "blast", "--mode", mode, "--dev", &p.gen_if, "--to", &to, "--rate", "20M",
        ],
    ] {
        let out = p.gen.command(BIN).args(&args).output().expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        if args.contains(&"20M") {
            assert!(err.contains("can carry"), "line-rate refusal: {err}");
        }
    }
}

#[test]
fn echo_to_a_closed_port_counts_icmp_errors_and_finishes() {
    let Some((_one, p)) = pair() else { return };
    let to = format!("{DUT_ADDR}:9009"); // nothing listens there
    let before = p.gen.snmp().expect("snmp");
    let j = blast(
        &p,
        &[
            "--to", &to, "--count", "2000", "--rate", "20k", "--echo", "--linger", "0.3",
        ],
    );
    let after = p.gen.snmp().expect("snmp");
    assert_eq!(
        j["tx_packets"], 2000,
        "an ICMP error never stops the sender: {j}"
    );
    assert_eq!(j["lost"], 2000);
    // Each error reported on the socket stands for at least one port unreachable that the
    // generator's namespace received.
    let icmp = j["icmp_errors"].as_i64().expect("count");
    let unreach = after.delta(&before, "Icmp", "InDestUnreachs");
    assert!(unreach > 0, "the DUT answered with port unreachable");
    assert!(
        (1..=unreach).contains(&icmp),
        "{icmp} errors for {unreach} ICMP: {j}"
    );
}
