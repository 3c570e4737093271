//! Live-frame generation against its mechanism's ceiling (issue 29): `blast --mode xdp-live`
//! — every frame stamped with its flow, sequence number and time, checksum kept valid —
//! against a static-frame reference run in the same lab and the same run: a program that only
//! returns XDP_TX, run by `BPF_PROG_TEST_RUN` in live-frames mode on copies of one frame (what
//! xdp-trafficgen does: the most the mechanism sends from one core). Both on CPU 0 into a
//! one-queue veth pair whose receiving end drops every frame in XDP after veth counted it;
//! frames are counted there. Rounds alternate the two; the ratio is of medians.
//!
//! Run (root): `cargo bench -p flowlane --bench live_veth` (FLOWLANE_BENCH_SECS, default 3).

mod common;

use std::time::Instant;

use flowlane_io::ebpf::{xdp, Asm, R0};
use flowlane_io::{bpf, netdev::ifindex};
use flowlane_lab::{Pair, DUT_ADDR};

/// Frames per kernel call of the reference (each call costs ~20 ms of set-up: long calls).
const REF_CALL: u32 = 1 << 22;

fn main() {
    let Some(secs) = common::start("live_veth") else {
        return;
    };
    let p = Pair::create("flb-live", 1).expect("namespaces");
    let xdp_prog = |ret: i32, name: &str| {
        let mut a = Asm::new();
        a.mov_imm(R0, ret).exit();
        bpf::prog_load(bpf::PROG_XDP, name, &a.finish().expect("asm")).expect("load")
    };
    let _drop_all = common::verdict(&p.dut, &p.dut_if, xdp::DROP);
    let counted = || p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
    let to = format!("{DUT_ADDR}:9000");
    let d = secs.to_string();
    // The frame the reference sends: what blast would build for one flow, taken from a
    // one-frame raw blast's template (60 bytes, valid headers; never changed).
    let frame = {
        let t = flowlane_wire::Template::build(&flowlane_wire::TemplateSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan: None,
            src: "198.18.0.1:10000".parse().expect("addr"),
            dst: to.parse().expect("addr"),
            frame_len: 60,
        })
        .expect("template");
        t.bytes
    };
    let tx_prog = xdp_prog(xdp::TX, "fl_bench_tx");
    let reference = || {
        let gen_if = p.gen_if.clone();
        let before = counted();
        let t0 = Instant::now();
        p.gen
            .run(|| {
                flowlane_io::os::pin_current_thread(0).expect("pin to CPU 0");
                let ifx = ifindex(&gen_if).expect("ifindex");
                while t0.elapsed().as_secs_f64() < secs {
                    bpf::xdp_test_run_live(&tx_prog, &frame, ifx, 0, REF_CALL / 4, 64)
                        .expect("live run");
                }
            })
            .expect("in the generator's namespace");
        (counted() - before) as f64 / t0.elapsed().as_secs_f64()
    };
    let live = |flows: &str, batch: &str| {
        let before = counted();
        let out = p
            .gen
            .command(env!("CARGO_BIN_EXE_flowlane"))
            .args([
                "blast", "--mode", "xdp-live", "--dev", &p.gen_if, "--to", &to,
            ])
            .args(["--cpus", "0", "--flows", flows, "--batch", batch])
            .args(["--duration", &d, "--json", "--quiet"])
            .output()
            .expect("blast runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let n = counted() - before;
        assert_eq!(
            Some(n),
            j["tx_packets"].as_u64(),
            "the peer counts what blast sent"
        );
        n as f64 / j["duration_s"].as_f64().unwrap_or(secs).max(1e-9)
    };
    // xdp-tools' xdp-trafficgen (static UDP frames, the same mechanism; IPv6 only), where
    // installed:
    // started from a thread pinned to CPU 0 (it inherits that), stopped by SIGINT.
    let trafficgen = flowlane_lab::have_program("xdp-trafficgen");
    if !trafficgen {
        eprintln!(
            "(no xdp-trafficgen column: xdp-tools >= 1.5.6 is not installed; bench/xdp_tools.sh \
             builds it from a checkout)"
        );
    }
    let dut_mac = {
        let dev = p.dut_if.clone();
        p.dut
            .run_with_sys(move || flowlane_io::netdev::mac(&dev))
            .expect("in the DUT's namespace")
            .expect("the DUT's MAC")
            .map(|b| format!("{b:02x}"))
            .join(":")
    };
    let peer = || {
        let gen_if = p.gen_if.clone();
        let before = counted();
        let t0 = Instant::now();
        let mut child = p
            .gen
            .run(|| {
                flowlane_io::os::pin_current_thread(0).expect("pin to CPU 0");
                std::process::Command::new("xdp-trafficgen")
                    // Its UDP mode sends IPv6 only: the smallest frame, 62 bytes (66 with FCS,
                    // its `-s`), to an address nobody needs to own (the peer drops all in XDP).
                    .args([
                        "udp",
                        &gen_if,
                        "-m",
                        &dut_mac,
                        "-a",
                        "2001:2::2",
                        "-A",
                        "2001:2::1",
                    ])
                    .args(["-p", "9000", "-t", "1", "-s", "66"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .expect("xdp-trafficgen starts")
            })
            .expect("in the generator's namespace");
        std::thread::sleep(std::time::Duration::from_secs_f64(secs));
        let _ = flowlane_io::os::signal_process(child.id(), flowlane_io::os::Signal::Interrupt);
        let _ = child.wait();
        (counted() - before) as f64 / t0.elapsed().as_secs_f64()
    };
    println!(
        "live frames over veth, 60-byte frames, CPU 0, counted at the peer's XDP_DROP, {secs} s \
         per step"
    );
    // Per round: each generator's rate over the reference's of the same round (they run
    // back to back, the order alternating); the figure is the median of those ratios.
    let mut names = vec![
        "xdp-live, 1 flow, batch 64",
        "xdp-live, 64 flows, batch 64",
        "xdp-live, 1 flow, batch 128",
        "xdp-live, 64 flows, batch 128",
    ];
    if trafficgen {
        names.push("xdp-trafficgen (static, IPv6 62 B)");
    }
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut refs = Vec::new();
    let rounds: usize = std::env::var("FLOWLANE_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..=names.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut got = vec![0.0; names.len() + 1];
        for i in order {
            got[i] = match i {
                0 => reference(),
                1 => live("1", "64"),
                2 => live("64", "64"),
                3 => live("1", "128"),
                4 => live("64", "128"),
                _ => peer(),
            };
        }
        println!(
            "  round {round}: reference {:.0} pps; {}",
            got[0],
            names
                .iter()
                .enumerate()
                .map(|(k, n)| format!("{n} {:.0} ({:.2}x)", got[k + 1], got[k + 1] / got[0]))
                .collect::<Vec<_>>()
                .join("; ")
        );
        refs.push(got[0]);
        for (k, v) in ratios.iter_mut().enumerate() {
            v.push(got[k + 1] / got[0]);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "median of per-round ratios to the static XDP_TX reference ({:.0} pps median):",
        median(&mut refs)
    );
    // Ours against the peer, round by round (both over the same round's reference).
    if trafficgen {
        let tg = ratios[names.len() - 1].clone();
        let mut vs: Vec<f64> = ratios[0]
            .iter()
            .zip(&tg)
            .map(|(a, b)| a / b.max(1e-9))
            .collect();
        println!(
            "  xdp-live (1 flow, batch 64) / xdp-trafficgen, per round: median {:.2}x",
            median(&mut vs)
        );
    }
    for (n, v) in names.iter().zip(ratios.iter_mut()) {
        let target = if n.starts_with("xdp-live") {
            " (target >= 1.0x)"
        } else {
            ""
        };
        println!("  {n:<32} {:.2}x{target}", median(v));
    }
}
