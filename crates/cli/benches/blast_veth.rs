//! `flowlane blast` over a veth pair, one sender thread pinned to CPU 0, 60-byte frames (64 on
//! the wire with FCS), counted on the *receiving* interface: raw mode (AF_PACKET TX ring,
//! qdisc bypass) against the udp-mode baseline measured in the same run. The receiver drops
//! every frame in an nftables prerouting hook (after the interface counted it), so the receive
//! stack costs as little as possible; on veth that receive work still runs on the sender's CPU.
//!
//! Run (root): `cargo bench -p flowlane --bench blast_veth` (FLOWLANE_BENCH_SECS, default 3).

use flowlane_lab::{Pair, DUT_ADDR};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("blast_veth: needs root for network namespaces; skipped");
        return;
    }
    let secs: f64 = std::env::var("FLOWLANE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let p = Pair::create("flb-blast", 1).expect("namespaces");
    for args in [
        vec!["add", "table", "ip", "fl"],
        vec![
            "add",
            "chain",
            "ip",
            "fl",
            "pre",
            "{ type filter hook prerouting priority -300; policy drop; }",
        ],
    ] {
        let st = p
            .dut
            .command("nft")
            .args(&args)
            .status()
            .expect("nft runs (apt-get install nftables)");
        assert!(st.success(), "nft {args:?}");
    }
    let to = format!("{DUT_ADDR}:9000");
    let d = secs.to_string();
    let run = |mode: &str| {
        let before = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
        let out = p
            .gen
            .command(env!("CARGO_BIN_EXE_flowlane"))
            .args([
                "blast", "--mode", mode, "--dev", &p.gen_if, "--to", &to, "--cpus", "0",
            ])
            .args(["--duration", &d, "--json", "--quiet"])
            .output()
            .expect("blast runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let after = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
        let secs = j["duration_s"].as_f64().unwrap_or(secs).max(1e-9);
        (
            (after - before) as f64 / secs,
            j["tx_packets"].as_u64().unwrap_or(0),
            after - before,
        )
    };
    println!("blast over veth, 60-byte frames, one sender thread on CPU 0, {secs} s per step");
    println!(
        "{:<36} {:>14} {:>12} {:>12} {:>8}",
        "mode", "peer-counted pps", "sent", "counted", "ratio"
    );
    // The udp mode runs first: it is the baseline every ratio is taken against.
    let mut base = None;
    for (mode, label) in [
        ("udp", "udp (sendmmsg, baseline)"),
        ("raw", "raw (AF_PACKET TX ring, bypass)"),
        ("xdp", "xdp (AF_XDP, copy mode)"),
    ] {
        let (pps, sent, counted) = run(mode);
        let b: f64 = *base.get_or_insert(pps);
        println!(
            "{label:<36} {pps:>14.0} {sent:>12} {counted:>12} {:>8.2}",
            pps / b.max(1.0)
        );
    }
}
