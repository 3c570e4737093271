//! `flowlane serve` over a veth pair between two namespaces: datagrams per second into one
//! pinned server worker (sink and echo, with and without GRO/GSO), against a plain one-thread
//! `recv_from` loop measured in the same run. Needs root (namespaces).
//!
//! Run: `cargo bench -p flowlane --bench serve_veth` (FLOWLANE_BENCH_SECS sets each step's
//! length, default 3). Layout: generator namespace, one sender thread pinned to CPU 0 sending
//! 18-byte datagrams from 8 source ports with sendmmsg; DUT namespace, server pinned to CPU 1.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use flowlane_io::os;
use flowlane_io::socket::{self, SendBatch};
use flowlane_lab::{veth_pair, Netns};

const PAYLOAD: usize = 18;
const SEGS: usize = 64;
const GEN: &str = "198.18.0.1";
const DUT: &str = "198.18.0.2";
const PORT: u16 = 9000;
const GEN_CPU: usize = 0;
const DUT_CPU: usize = 1;

/// Sends for `secs` from the generator namespace; returns datagrams the kernel accepted.
fn blast(gen: &Netns, secs: f64) -> u64 {
    gen.run(|| {
        os::pin_current_thread(GEN_CPU).expect("pin sender");
        let to: SocketAddr = format!("{DUT}:{PORT}").parse().expect("addr");
        let socks: Vec<UdpSocket> = (0..8)
            .map(|_| {
                let s = UdpSocket::bind((GEN, 0)).expect("sender socket");
                // Each send carries SEGS datagrams of PAYLOAD bytes, split by the kernel
                // (UDP GSO): one socket send can then feed more than one receiving core.
                socket::set_int(
                    &s,
                    libc::SOL_UDP,
                    libc::UDP_SEGMENT,
                    PAYLOAD as i32,
                    "UDP_SEGMENT",
                )
                .expect("UDP GSO");
                s
            })
            .collect();
        let mut batch = SendBatch::new(8, PAYLOAD * SEGS, to);
        for i in 0..batch.slots() {
            batch.slot_mut(i, PAYLOAD * SEGS).fill(i as u8);
        }
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut sent = 0u64;
        let mut k = 0;
        while Instant::now() < end {
            for _ in 0..16 {
                sent += (SEGS * batch.send(&socks[k % socks.len()], 8).expect("sendmmsg")) as u64;
                k += 1;
            }
        }
        sent
    })
    .expect("sender in the generator namespace")
}

/// The baseline: one thread, pinned, a blocking `recv_from` per datagram.
fn baseline(gen: &Netns, dut: &Netns, secs: f64) -> (u64, u64) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let rx = s.spawn(|| {
            dut.run(|| {
                os::pin_current_thread(DUT_CPU).expect("pin receiver");
                let sock = UdpSocket::bind((DUT, PORT)).expect("bind");
                sock.set_read_timeout(Some(Duration::from_millis(50)))
                    .expect("timeout");
                let mut buf = [0u8; 2048];
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if sock.recv_from(&mut buf).is_ok() {
                        n += 1;
                    }
                }
                n
            })
            .expect("receiver in the DUT namespace")
        });
        std::thread::sleep(Duration::from_millis(200));
        let sent = blast(gen, secs);
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        (sent, rx.join().expect("receiver"))
    })
}

/// `flowlane serve` in the DUT namespace; returns (sent, received, echoed, socket drops).
fn serve(gen: &Netns, dut: &Netns, secs: f64, args: &[&str]) -> (u64, u64, u64, u64) {
    let bind = format!("{DUT}:{PORT}");
    let mut child = dut
        .command(env!("CARGO_BIN_EXE_flowlane"))
        .args(["serve", "--bind", &bind, "--cpus", &DUT_CPU.to_string()])
        .args(["--json", "--quiet", "--duration", "600"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("flowlane serve:") => break,
            Some(Ok(l)) => eprintln!("  serve: {l}"),
            _ => panic!("serve did not start"),
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let sent = blast(gen, secs);
    std::thread::sleep(Duration::from_millis(100));
    flowlane_io::os::signal_process(child.id(), flowlane_io::os::Signal::Interrupt)
        .expect("SIGINT");
    let out = child.wait_with_output().expect("serve ends");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    let t = &j["total"];
    let get = |k: &str| t[k].as_u64().unwrap_or(0);
    (
        sent,
        get("rx_packets"),
        get("tx_packets"),
        get("socket_drops"),
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` lists; nothing to list here
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("serve_veth: needs root for network namespaces; skipped");
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        eprintln!("serve_veth: needs 2 CPUs; skipped");
        return;
    }
    let secs: f64 = std::env::var("FLOWLANE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let gen = Netns::create("flb-gen").expect("namespace");
    let dut = Netns::create("flb-dut").expect("namespace");
    let tag = std::process::id() % 100_000;
    let (gi, di) = (format!("flg{tag}"), format!("fld{tag}"));
    veth_pair(
        &gen,
        &gi,
        &format!("{GEN}/24"),
        &dut,
        &di,
        &format!("{DUT}/24"),
        1,
    )
    .expect("veth pair");
    let set_gro = |on: bool| {
        for (ns, ifname) in [(&gen, &gi), (&dut, &di)] {
            ns.set_offload(ifname, flowlane_lab::Offload::Gro, on)
                .expect("GRO on or off (SIOCETHTOOL)");
        }
    };

    println!("serve over veth, {PAYLOAD}-byte payload, sender on CPU {GEN_CPU}, server on CPU {DUT_CPU}, {secs} s per step");
    println!(
        "{:<28} {:>12} {:>12} {:>12} {:>10} {:>8}",
        "step", "sent pps", "rx pps", "echoed pps", "drops", "ratio"
    );
    set_gro(false);
    let (s0, r0) = baseline(&gen, &dut, secs);
    let base = r0 as f64 / secs;
    println!(
        "{:<28} {:>12.0} {:>12.0} {:>12} {:>10} {:>8.2}  {}",
        "baseline recv_from",
        s0 as f64 / secs,
        base,
        "-",
        s0.saturating_sub(r0),
        1.0,
        if s0 > r0 {
            "server-limited"
        } else {
            "generator-limited (capacity >= rx)"
        }
    );
    let steps: [(&str, bool, &[&str]); 6] = [
        ("serve sink", false, &["--mode", "sink"]),
        (
            "serve sink --no-detect",
            false,
            &["--mode", "sink", "--no-detect"],
        ),
        (
            "serve sink --gro (veth gro)",
            true,
            &["--mode", "sink", "--gro"],
        ),
        ("serve echo", false, &["--mode", "echo"]),
        ("serve echo --gso", false, &["--mode", "echo", "--gso"]),
        (
            "serve echo --gro --gso",
            true,
            &["--mode", "echo", "--gro", "--gso"],
        ),
    ];
    for (name, gro, args) in steps {
        set_gro(gro);
        let (s, r, e, d) = serve(&gen, &dut, secs, args);
        let rx = r as f64 / secs;
        println!(
            "{:<28} {:>12.0} {:>12.0} {:>12.0} {:>10} {:>8.2}  {}",
            name,
            s as f64 / secs,
            rx,
            e as f64 / secs,
            d,
            rx / base.max(1.0),
            // Drops mean the offered load exceeded what the server took: rx pps is its
            // capacity. No drops: the generator was the limit and capacity is at least rx pps.
            if d > 0 {
                "server-limited"
            } else {
                "generator-limited (capacity >= rx)"
            }
        );
    }
}
