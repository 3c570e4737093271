//! `flowlane forward --mode reflect` over a veth pair, against the drop ceiling measured in the
//! same run. The generator is `blast --mode xdp-live` on CPU 0 (60-byte frames, the fastest
//! sender); the generator's end runs an XDP program that drops what comes back, so veth takes
//! the reflected frames and counts them. Rows:
//!   drop ceiling  an XDP_DROP program on the DUT's end: frames the DUT's interface received
//!                 per second — the most any DUT can be offered here;
//!   xdp / af-xdp / af-packet  the reflector with that backend: frames back at the
//!                 generator's interface per second, and the ratio to the ceiling.
//! On veth the DUT's receive path (NAPI, so native XDP) runs on the sender's CPU (0); the
//! AF_XDP and AF_PACKET workers are pinned to CPU 1.
//!
//! Run (root): `cargo bench -p flowlane --bench forward_veth` (FLOWLANE_BENCH_SECS, default 3).

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::process::Stdio;

use flowlane_io::ebpf::{Asm, R0};
use flowlane_io::{bpf, netdev::ifindex};
use flowlane_lab::{Netns, Pair, DUT_ADDR};

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// Attaches a one-verdict XDP program to `dev` in `ns` while the returned link lives.
fn verdict(ns: &Netns, dev: &str, verdict: i32) -> OwnedFd {
    let dev = dev.to_string();
    ns.run(move || {
        let mut a = Asm::new();
        a.mov_imm(R0, verdict).exit();
        let prog =
            bpf::prog_load(bpf::PROG_XDP, "fl_b_verdict", &a.finish().expect("asm")).expect("load");
        bpf::attach_xdp(&prog, ifindex(&dev).expect("ifindex"), 0).expect("attach")
    })
    .expect("in the namespace")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("forward_veth: needs root for network namespaces; skipped");
        return;
    }
    let secs: f64 = std::env::var("FLOWLANE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let p = Pair::create("flb-fwd", 1).expect("namespaces");
    let _gen_drop = verdict(&p.gen, &p.gen_if, 1);
    let to = format!("{DUT_ADDR}:9000");
    let d = secs.to_string();
    let rx = |ns: &Netns, dev: &str| ns.dev().expect("counters").ifaces[dev].rx_packets;
    // Frames/s the generator offered (blast's own count) and that `ns`/`dev` received.
    let blast = |ns: &Netns, dev: &str| {
        let before = rx(ns, dev);
        let out = p
            .gen
            .command(BIN)
            .args([
                "blast", "--mode", "xdp-live", "--dev", &p.gen_if, "--to", &to,
            ])
            .args(["--cpus", "0", "--duration", &d, "--json", "--quiet"])
            .output()
            .expect("blast runs");
        let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("blast JSON ({e}): {}", String::from_utf8_lossy(&out.stderr))
        });
        let got = rx(ns, dev) - before;
        let window = b["duration_s"].as_f64().unwrap_or(secs).max(1e-9);
        (b["tx_pps"].as_f64().unwrap_or(0.0), got as f64 / window)
    };
    println!(
        "forward --mode reflect over veth: blast xdp-live on CPU 0, 60-byte frames, {secs} s per row"
    );
    println!(
        "{:<14} {:>14} {:>14} {:>10}",
        "row", "offered pps", "received pps", "ratio"
    );
    let ceiling = {
        let _drop = verdict(&p.dut, &p.dut_if, 1);
        let (offered, got) = blast(&p.dut, &p.dut_if);
        println!(
            "{:<14} {:>14.0} {:>14.0} {:>10}",
            "drop ceiling", offered, got, "1.000"
        );
        got
    };
    for backend in ["xdp", "af-xdp", "af-packet"] {
        if backend == "af-packet" {
            // AF_PACKET takes a copy: the DUT's stack must not answer, and veth needs NAPI on
            // the DUT's end for live frames (GRO toggled on while up).
            p.dut
                .ip(&["addr", "flush", "dev", &p.dut_if])
                .expect("flush");
            for on in [false, true] {
                p.dut
                    .set_offload(&p.dut_if, flowlane_lab::Offload::Gro, on)
                    .expect("GRO");
            }
        }
        let mut fwd = p.dut.command(BIN);
        fwd.args(["forward", "--mode", "reflect", "--dev", &p.dut_if])
            .args([
                "--backend",
                backend,
                "--swap",
                "ip,ports",
                "--duration",
                "120",
            ])
            .args(["--json", "--quiet"]);
        if backend != "xdp" {
            fwd.args(["--cpus", "1"]);
        }
        let mut child = fwd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("forward runs");
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let mut banner = String::new();
        err.read_line(&mut banner).expect("banner");
        assert!(banner.starts_with("flowlane forward:"), "{banner}");
        let (offered, got) = blast(&p.gen, &p.gen_if);
        flowlane_io::os::signal_process(child.id(), flowlane_io::os::Signal::Interrupt)
            .expect("SIGINT");
        let out = child.wait_with_output().expect("forward ends");
        let f: serde_json::Value = serde_json::from_slice(&out.stdout).expect("forward JSON");
        println!(
            "{:<14} {:>14.0} {:>14.0} {:>10.3}   (forwarded {}, ring drops {}, refused {})",
            backend,
            offered,
            got,
            got / ceiling.max(1.0),
            f["total"]["forwarded"],
            f["total"]["ring_drops"],
            f["device_refused"]
        );
    }
}
