//! Userland receive on one core (issue 29): `flowlane sink --backend af-xdp` against the
//! socket receivers, in the same run. The generator is `blast --mode xdp-live` on CPU 0 (the
//! fastest sender) into a veth pair; every receiver is pinned to CPU 1:
//!
//! * `serve --mode sink` — flowlane's socket receiver (`recvmmsg`), with RPS sending the
//!   kernel's IP/UDP receive work to CPU 1 as well ("the stack on that core");
//! * `sink --backend af-packet` — an AF_PACKET ring (a copy; the kernel path still runs and an
//!   nftables rule drops the frames in prerouting);
//! * `sink --backend af-xdp` — an XDP program redirects the frames into an AF_XDP socket; no
//!   skb is made.
//!
//! veth runs its receive NAPI (and so the XDP program or GRO) on the sending CPU, CPU 0, for
//! every receiver alike. Offered rates step up (250k … 1M paced, then unpaced), each step run
//! for every receiver in turn: a socket receiver overloaded past its knee collapses (the
//! softirq on its core starves the reading thread), so each receiver's figure is the most it
//! delivered at any offered rate — its capacity, not its collapse. Per step: frames the
//! interface received, frames the receiver accounted, its drops, CPU 1's busy share
//! (/proc/stat) and frames per busy second of CPU 1 (the per-core figure). The ratio is
//! AF_XDP's capacity against the best socket receiver's, from the same run.
//!
//! Run (root): `cargo bench -p flowlane --bench receive_veth` (FLOWLANE_BENCH_SECS, default 3).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use flowlane_lab::{Offload, Pair, DUT_ADDR};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// CPU 1's (busy, total) jiffies.
fn cpu1() -> (u64, u64) {
    let c = flowlane_lab::counters::cpu_times().expect("/proc/stat");
    let one = c.iter().find(|c| c.cpu == 1).expect("a cpu1 line");
    (one.busy, one.total)
}

/// Waits for a child's first stderr line (its banner); the rest is dropped.
fn banner(child: &mut Child, prefix: &str) {
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("banner");
    assert!(line.starts_with(prefix), "{line}");
    std::thread::spawn(move || {
        let mut rest = String::new();
        while err.read_line(&mut rest).is_ok_and(|n| n > 0) {
            rest.clear();
        }
    });
}

const SOCKET: &str = "serve (socket, recvmmsg)";
const PACKET: &str = "sink af-packet";
const XDP: &str = "sink af-xdp";

struct Row {
    name: &'static str,
    rate: &'static str,
    iface: u64,
    got: u64,
    drops: u64,
    busy: f64,
}

fn main() {
    let Some(secs) = common::start("receive_veth") else {
        return;
    };
    let p = Pair::create("flb-recv", 1).expect("namespaces");
    // xdp-live frames reach a veth peer only if it runs NAPI: GRO on (the AF_XDP sink's
    // program does the same while it is attached).
    p.dut
        .set_offload(&p.dut_if, Offload::Gro, true)
        .expect("GRO on");
    // The socket receiver's stack on CPU 1, beside it.
    p.dut
        .write_sys(
            &format!("/sys/class/net/{}/queues/rx-0/rps_cpus", p.dut_if),
            "2",
        )
        .expect("RPS to CPU 1");
    let to = format!("{DUT_ADDR}:9000");
    let d = secs.to_string();
    let run = |name: &'static str,
               rate: &'static str,
               receiver: &[&str],
               banner_prefix: &str,
               count: &dyn Fn(&Value) -> (u64, u64)| {
        let before = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
        let mut r = p
            .dut
            .command(BIN)
            .args(receiver)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("receiver runs");
        banner(&mut r, banner_prefix);
        let c0 = cpu1();
        let mut blast = p.gen.command(BIN);
        blast
            .args([
                "blast", "--mode", "xdp-live", "--dev", &p.gen_if, "--to", &to,
            ])
            .args(["--cpus", "0", "--duration", &d, "--json", "--quiet"]);
        if rate != "max" {
            blast.args(["--rate", rate, "--burst", "256"]);
        }
        let out = blast.output().expect("blast runs");
        let c1 = cpu1();
        assert!(out.status.code().is_some_and(|c| c <= 1), "blast failed");
        let out = r.wait_with_output().expect("receiver ends");
        assert!(out.status.success(), "{name} failed");
        let j: Value = serde_json::from_slice(&out.stdout).expect("receiver JSON");
        let iface = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets - before;
        let (got, drops) = count(&j);
        let busy = (c1.0 - c0.0) as f64 / (c1.1 - c0.1).max(1) as f64;
        Row {
            name,
            rate,
            iface,
            got,
            drops,
            busy,
        }
    };
    let sink_count = |j: &Value| {
        (
            j["flowlane_packets"].as_u64().unwrap_or(0),
            j["ring_drops"].as_u64().unwrap_or(0),
        )
    };
    let serve_count = |j: &Value| {
        (
            j["total"]["rx_packets"].as_u64().unwrap_or(0),
            j["total"]["socket_drops"].as_u64().unwrap_or(0),
        )
    };
    let idle = ["--idle", "1", "--duration", "120", "--json", "--quiet"];
    let sink = |backend: &'static str| -> Vec<&'static str> {
        let mut v = vec!["sink", "--port", "9000", "--backend", backend];
        v.extend(if backend == "af-xdp" {
            ["--cpus", "1"]
        } else {
            ["--cpu", "1"]
        });
        v.extend(idle);
        v
    };
    let with_dev = |mut v: Vec<&'static str>| -> Vec<String> {
        let mut out: Vec<String> = v.drain(..1).map(String::from).collect();
        out.extend(["--dev".to_string(), p.dut_if.clone()]);
        out.extend(v.into_iter().map(String::from));
        out
    };
    let serve_dur = format!("{}", secs + 1.5);
    let mut rows = Vec::new();
    for (i, rate) in ["250k", "500k", "750k", "1M", "max"]
        .into_iter()
        .enumerate()
    {
        // Rotated so no receiver always runs first.
        for k in 0..3 {
            match (k + i) % 3 {
                0 => {
                    let bind = format!("{DUT_ADDR}:9000");
                    let args = [
                        "serve",
                        "--mode",
                        "sink",
                        "--bind",
                        &bind,
                        "--cpus",
                        "1",
                        "--duration",
                        &serve_dur,
                        "--json",
                        "--quiet",
                    ];
                    rows.push(run(SOCKET, rate, &args, "flowlane serve", &serve_count));
                }
                1 => {
                    p.dut.nft_drop_prerouting().expect("nft drop chain");
                    let a = with_dev(sink("af-packet"));
                    let a: Vec<&str> = a.iter().map(String::as_str).collect();
                    rows.push(run(PACKET, rate, &a, "flowlane sink", &sink_count));
                    p.dut
                        .command("nft")
                        .args(["flush", "ruleset"])
                        .status()
                        .expect("nft flush");
                }
                _ => {
                    let a = with_dev(sink("af-xdp"));
                    let a: Vec<&str> = a.iter().map(String::as_str).collect();
                    rows.push(run(XDP, rate, &a, "flowlane sink", &sink_count));
                }
            }
        }
    }
    println!(
        "userland receive over veth: blast xdp-live on CPU 0 -> one receiver on CPU 1, 60-byte \
         frames, {secs} s per step, offered rates stepped up, receivers rotated"
    );
    println!(
        "{:<26} {:>7} {:>12} {:>12} {:>10} {:>9} {:>16}",
        "receiver", "offered", "iface pps", "got pps", "drops", "CPU1 busy", "got per CPU1-s"
    );
    let per_core = |r: &Row| r.got as f64 / secs / r.busy.max(1e-6);
    for r in &rows {
        println!(
            "{:<26} {:>7} {:>12.0} {:>12.0} {:>10} {:>8.1}% {:>16.0}",
            r.name,
            r.rate,
            r.iface as f64 / secs,
            r.got as f64 / secs,
            r.drops,
            r.busy * 100.0,
            per_core(r)
        );
    }
    // Each receiver's capacity: the most it delivered at any offered rate, with that step's
    // per-core figure.
    let best = |name: &str| -> &Row {
        rows.iter()
            .filter(|r| r.name == name)
            .max_by_key(|r| r.got)
            .expect("a row per receiver")
    };
    let (x, sock, pkt) = (best(XDP), best(SOCKET), best(PACKET));
    let got = |r: &Row| r.got as f64 / secs;
    println!(
        "capacity (frames/s delivered, best step): af-xdp {:.0} ({}), socket {:.0} ({}), \
         af-packet {:.0} ({}); af-xdp / best socket receiver {:.2}x (target >= 1.5x); per busy \
         second of CPU 1 at those steps: {:.0} vs {:.0}: {:.2}x",
        got(x),
        x.rate,
        got(sock),
        sock.rate,
        got(pkt),
        pkt.rate,
        got(x) / got(sock).max(got(pkt)).max(1.0),
        per_core(x),
        per_core(sock),
        per_core(x) / per_core(sock).max(1.0)
    );
}
