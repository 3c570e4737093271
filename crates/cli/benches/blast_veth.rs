//! `flowlane blast` over a veth pair, one sender thread pinned to CPU 0, 60-byte frames (64 on
//! the wire with FCS), counted on the *receiving* interface: raw (AF_PACKET TX ring, qdisc
//! bypass), xdp (AF_XDP copy mode) and xdp-live (live XDP frames) against the udp-mode
//! baseline measured in the same run, with the same receiver for every mode. Three receivers:
//! 1. plain veth, frames dropped in an nftables prerouting hook (after the interface counted
//!    them), so the receive stack costs as little as possible (xdp-live cannot run here: veth
//!    takes XDP frames only into a peer that runs NAPI);
//! 2. the same with GRO on the receiving veth (NAPI, as `flowlane lab up` sets it);
//! 3. an XDP program on the receiving veth that drops every frame after veth counted it: the
//!    least receive work there is, so the closest to the generator's own ceiling.
//!
//! On veth the receive work runs on the sender's CPU in every case.
//!
//! A last pass, into XDP_DROP, prices pktgen's ranges (issue 53 item 3): raw and xdp with a new
//! random destination every frame (a /18 × 16 ports, written into the frame with incremental
//! checksums) against the same mode to one destination, same run.
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
    p.dut
        .nft_drop_prerouting()
        .expect("nft drop chain (apt-get install nftables)");
    let to = format!("{DUT_ADDR}:9000");
    let d = secs.to_string();
    // The DUT's MAC, as the lab gives it: a destination range has no neighbour entry.
    let dut_mac = p
        .dut
        .run_with_sys(|| flowlane_io::netdev::mac(&p.dut_if))
        .expect("in the DUT namespace")
        .expect("a MAC")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let run = |mode: &str| {
        let before = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
        let mut cmd = p.gen.command(env!("CARGO_BIN_EXE_flowlane"));
        // `raw+ranges`: the mode with a random destination per frame.
        let (mode, ranges) = match mode.strip_suffix("+ranges") {
            Some(m) => (m, true),
            None => (mode, false),
        };
        if ranges {
            cmd.args(["blast", "--mode", mode, "--to", "198.18.64.0/18:9000-9015"])
                .args(["--dst-random", "--dst-mac", &dut_mac, "--cpus", "0"])
                .args(["--from", flowlane_lab::GEN_ADDR]);
        } else {
            cmd.args(["blast", "--mode", mode, "--to", &to, "--cpus", "0"]);
        }
        cmd.args(["--duration", &d, "--json", "--quiet"]);
        // Frames leave by the interface named; UDP sockets by the route (--dev is refused).
        if mode != "udp" {
            cmd.args(["--dev", &p.gen_if]);
        }
        let out = cmd.output().expect("blast runs");
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
    let modes = [
        ("udp", "udp (sendmmsg, baseline)"),
        ("raw", "raw (AF_PACKET TX ring, bypass)"),
        ("xdp", "xdp (AF_XDP, copy mode)"),
        ("xdp-live", "xdp-live (live XDP frames, XDP_TX)"),
    ];
    let pass = |receiver: &str, modes: &[(&str, &str)]| {
        println!("\nreceiver: {receiver}");
        println!(
            "{:<36} {:>16} {:>12} {:>12} {:>8}",
            "mode", "peer-counted pps", "sent", "counted", "ratio"
        );
        // The udp mode runs first: it is the baseline every ratio is taken against.
        let mut base = None;
        for &(mode, label) in modes {
            let (pps, sent, counted) = run(mode);
            let b: f64 = *base.get_or_insert(pps);
            println!(
                "{label:<36} {pps:>16.0} {sent:>12} {counted:>12} {:>8.2}",
                pps / b.max(1.0)
            );
        }
    };
    pass("plain veth, nftables prerouting drop", &modes[..3]);
    let gro = |on: bool| {
        p.dut
            .set_offload(&p.dut_if, flowlane_lab::Offload::Gro, on)
            .expect("GRO on or off (SIOCETHTOOL)");
    };
    gro(true);
    pass("GRO on (NAPI), nftables prerouting drop", &modes);
    gro(false);
    let drop_all = {
        use flowlane_io::ebpf::xdp;
        use flowlane_io::{bpf, netdev::ifindex};
        let prog = bpf::verdict_program(xdp::DROP, "fl_bench_drop").expect("load");
        let dut_if = p.dut_if.clone();
        p.dut
            .run(|| bpf::attach_xdp(&prog, ifindex(&dut_if).expect("ifindex"), 0))
            .expect("in the DUT namespace")
            .expect("attach")
    };
    pass("XDP_DROP on the receiving veth", &modes);
    // Ratios here are against the first row: the same mode to one destination.
    for mode in ["raw", "xdp"] {
        let ranged = format!("{mode}+ranges");
        pass(
            &format!("XDP_DROP, {mode} mode: one destination vs a random one per frame"),
            &[
                (mode, "one destination (reference)"),
                (&ranged, "random /18 x 16 ports per frame"),
            ],
        );
    }
    drop(drop_all);
}
