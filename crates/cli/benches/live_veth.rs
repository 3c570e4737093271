//! Live-frame generation against its mechanism's ceiling (issue 29): `blast --mode xdp-live`
//! — every frame stamped with its flow, sequence number and time, checksum kept valid —
//! against a static-frame reference run in the same lab and the same run: a program that only
//! returns XDP_TX, run by `BPF_PROG_TEST_RUN` in live-frames mode on copies of one frame (what
//! xdp-trafficgen does: the most the mechanism sends from one core) — and a second reference,
//! the least a stamping generator must do (the static frame's headers left alone, only the
//! sequence number, time and checksum written: the bound for `xdp-live`, which must also
//! write the headers back, a receiver may change them). All on CPU 0 into a one-queue veth
//! pair whose receiving end drops every frame in XDP after veth counted it; frames are
//! counted there, each generator's rate over the middle of its run (a kernel run costs ~20 ms
//! of set-up, a process its start: both kept out, for every generator alike, and every
//! generator runs as one long kernel run). Rounds alternate the order; each ratio is to the
//! reference of the same round, the figure the median of those.
//!
//! Run (root): `cargo bench -p flowlane --bench live_veth` (FLOWLANE_BENCH_SECS, default 3).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flowlane_io::ebpf::{xdp, Asm, R0};
use flowlane_io::{bpf, netdev::ifindex};
use flowlane_lab::{Pair, DUT_ADDR};

/// How long a generator runs before the window in which its rate is taken (and at least as
/// long after it): a live-frames run's set-up (~20 ms) and a process's start stay out of it.
const SETTLE: Duration = Duration::from_millis(400);

/// The rate `counted` grows at over `secs`, from [`SETTLE`] on.
fn window(counted: &dyn Fn() -> u64, secs: f64) -> f64 {
    std::thread::sleep(SETTLE);
    let (c0, t0) = (counted(), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (c1, t1) = (counted(), Instant::now());
    (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
}

fn main() {
    let Some(secs) = common::start("live_veth") else {
        return;
    };
    let p = Pair::create("flb-live", 1).expect("namespaces");
    let xdp_prog = |ret: i32, name: &str| bpf::verdict_program(ret, name).expect("load");
    let _drop_all = common::verdict(&p.dut, &p.dut_if, xdp::DROP);
    let counted = || p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
    let to = format!("{DUT_ADDR}:9000");
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
    let stamp_words = bpf::MappedArray::words("fl_bench_stamp", 2).expect("map");
    let stamp_prog = bpf::prog_load(
        bpf::PROG_XDP,
        "fl_bench_stamp",
        &stamp_only(&frame, stamp_words.fd()),
    )
    .expect("load");
    // A static program in one kernel run on CPU 0 (ended by a signal), its rate over the window.
    let static_run = |prog: &std::os::fd::OwnedFd| {
        let done = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (gen, gen_if, frame, done) = (&p.gen, &p.gen_if, &frame, &done);
            let run = sc.spawn(move || {
                gen.run(move || {
                    flowlane_io::os::pin_current_thread(0).expect("pin to CPU 0");
                    let ifx = ifindex(gen_if).expect("ifindex");
                    tx.send(flowlane_io::os::ThreadHandle::current().expect("handle"))
                        .expect("the bench waits");
                    while !done.load(Ordering::Acquire) {
                        match bpf::xdp_test_run_live(prog, frame, ifx, 0, u32::MAX, 64) {
                            Ok(()) => {}
                            Err(e) if e.source.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => panic!("live run: {e}"),
                        }
                    }
                })
            });
            let thread = rx.recv().expect("the run thread starts");
            let rate = window(&counted, secs);
            done.store(true, Ordering::Release);
            let t0 = Instant::now();
            while !run.is_finished() {
                assert!(
                    t0.elapsed().as_secs() < 10,
                    "the run did not end on a signal"
                );
                let _ = thread.interrupt();
                std::thread::sleep(Duration::from_millis(1));
            }
            run.join()
                .expect("the run thread")
                .expect("in the generator's namespace");
            rate
        })
    };
    let reference = || static_run(&tx_prog);
    // blast, run past the window on both sides; every frame it says it sent reached the peer.
    let d = (secs + 3.0 * SETTLE.as_secs_f64()).to_string();
    let live = |flows: &str, batch: &str| {
        let before = counted();
        let child = p
            .gen
            .command(env!("CARGO_BIN_EXE_flowlane"))
            .args([
                "blast", "--mode", "xdp-live", "--dev", &p.gen_if, "--to", &to,
            ])
            .args(["--cpus", "0", "--flows", flows, "--batch", batch])
            .args(["--duration", &d, "--json", "--quiet"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("blast runs");
        let rate = window(&counted, secs);
        let out = child.wait_with_output().expect("blast ends");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(
            Some(counted() - before),
            j["tx_packets"].as_u64(),
            "the peer counts what blast sent"
        );
        rate
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
            .map(flowlane_wire::Mac)
            .expect("the DUT's MAC")
            .to_string()
    };
    let peer = || {
        let gen_if = p.gen_if.clone();
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
        let rate = window(&counted, secs);
        let _ = flowlane_io::os::signal_process(child.id(), flowlane_io::os::Signal::Interrupt);
        let _ = child.wait();
        rate
    };
    println!(
        "live frames over veth, 60-byte frames, CPU 0, counted at the peer's XDP_DROP over \
         {secs} s in the middle of each run"
    );
    // Per round: each generator's rate over the reference's of the same round (they run
    // back to back, the order alternating); the figure is the median of those ratios.
    let mut names = vec![
        "static frame + stamp only (bound)",
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
                1 => static_run(&stamp_prog),
                2 => live("1", "64"),
                3 => live("64", "64"),
                4 => live("1", "128"),
                5 => live("64", "128"),
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
    // Ours against the stamp-only bound and the peer, round by round (each over the same
    // round's reference).
    let per_round = |k: usize| -> f64 {
        let mut vs: Vec<f64> = ratios[1]
            .iter()
            .zip(&ratios[k])
            .map(|(a, b)| a / b.max(1e-9))
            .collect();
        median(&mut vs)
    };
    println!(
        "  xdp-live (1 flow, batch 64) / static frame + stamp only, per round: median {:.2}x",
        per_round(0)
    );
    if trafficgen {
        println!(
            "  xdp-live (1 flow, batch 64) / xdp-trafficgen, per round: median {:.2}x",
            per_round(names.len() - 1)
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

/// The least a generator that stamps every frame must do, as an XDP program for the live-frames
/// run (the bound `xdp-live` is held to): the static frame's headers left as they are (valid
/// only while the receiver changes nothing, as this bench's XDP_DROP peer), a frame counter
/// and a clock reading shared by eight frames in a one-entry map reached without a lookup,
/// the sequence number and time written into the flowlane header and the UDP checksum made
/// valid again from the template's (RFC 1624). `frame` is a 60-byte IPv4 template of
/// `flowlane_wire::Template`: UDP checksum at 40, flowlane sequence number at 46.
fn stamp_only(frame: &[u8], words_fd: i32) -> Vec<flowlane_io::ebpf::Insn> {
    use flowlane_io::ebpf::{
        live_stamp, xdp_md, Alu, Cond, Helper, Size, R1, R2, R3, R5, R6, R7, R8,
    };
    const CSUM: i16 = 40;
    const SEQ: i16 = 46;
    // The checksum of the template with sequence and time zero, as a native-endian sum.
    let seed = u32::from(!u16::from_ne_bytes([frame[40], frame[41]]));
    let mut a = Asm::new();
    let (drop, cached, timed) = (a.label(), a.label(), a.label());
    a.mov(R6, R1)
        .load_map_value(R2, words_fd, 0)
        .load(Size::Dw, R7, R2, 0)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 1)
        .store(Size::Dw, R2, 0, R1)
        .mov(R1, R7)
        .alu_imm(Alu::And, R1, 7)
        .jump_imm(Cond::Ne, R1, 0, cached)
        .call(Helper::KtimeGetNs)
        .mov(R8, R0)
        .load_map_value(R1, words_fd, 8)
        .store(Size::Dw, R1, 0, R8)
        .jump(timed)
        .bind(cached)
        .load_map_value(R1, words_fd, 8)
        .load(Size::Dw, R8, R1, 0)
        .bind(timed)
        .load(Size::W, R2, R6, xdp_md::DATA)
        .load(Size::W, R3, R6, xdp_md::DATA_END)
        .mov(R6, R2)
        .alu_imm(Alu::Add, R2, i32::from(SEQ) + 12)
        .jump_reg(Cond::Gt, R2, R3, drop)
        .mov_imm(R5, seed as i32);
    live_stamp(&mut a, SEQ, CSUM);
    a.mov_imm(R0, xdp::TX)
        .exit()
        .bind(drop)
        .mov_imm(R0, xdp::DROP)
        .exit();
    a.finish().expect("asm")
}
