//! Reassembly end to end on one core (issue 54 item 6): the same fragmented traffic, made
//! whole by `flowlane sink` and, as the reference in the same run, by the kernel into a UDP
//! socket. `flowlane blast --mode xdp` on CPU 0 sends 1 514-byte frames cut into three IP
//! fragments (`--fragment-size 512`) over a veth pair; RPS moves the receiving interface's
//! processing to CPU 1, so everything on the receive side runs there:
//!
//! * kernel: the receive path, `ip_defrag`, UDP delivery, and `flowlane serve --mode sink
//!   --cpus 1` reading the datagrams (recvmmsg);
//! * sink: the receive path and the AF_PACKET tap, `flowlane sink --cpu 1` reassembling from
//!   its ring, nftables dropping the fragments in prerouting (no kernel reassembly).
//!
//! Under overload the kernel keeps each incomplete datagram 30 s (`ipfrag_time`) within
//! 4 MiB (`ipfrag_high_thresh`) and then refuses new fragments, so a saturated run measures
//! that, not the CPU: each receiver's capacity is therefore found by bisection, the highest
//! paced rate of datagrams it makes whole with at most 0.1 % short, each trial in fresh
//! namespaces (no contexts left from the last). The ratio is the sink's capacity over the
//! kernel's; the generator's ceiling bounds both and is printed first.
//!
//! Run (root): `cargo bench -p flowlane --bench reasm_veth` (FLOWLANE_BENCH_SECS per trial,
//! default 2).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use flowlane_lab::{Pair, DUT_ADDR};

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// Waits for a receiver's banner (its first stderr line, once it is ready).
fn ready(child: &mut Child, what: &str) {
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut banner = String::new();
    err.read_line(&mut banner).expect("banner");
    assert!(banner.starts_with(what), "{banner}");
}

/// The receiver a trial runs.
#[derive(Clone, Copy)]
enum Who {
    /// The kernel reassembles; `flowlane serve` reads the datagrams.
    Kernel,
    /// `flowlane sink` reassembles from its ring; nftables drops the fragments.
    Sink,
}

/// A pair with the receive side on CPU 1 (RPS hands each frame to its backlog there).
fn pair(who: Who) -> Pair {
    let p = Pair::create("flb-rsm", 1).expect("namespaces");
    if let Who::Sink = who {
        p.dut
            .nft_drop_prerouting()
            .expect("nft drop chain (apt-get install nftables)");
    }
    p.dut
        .write_sys(
            &format!("/sys/class/net/{}/queues/rx-0/rps_cpus", p.dut_if),
            "2",
        )
        .expect("rps_cpus");
    p
}

/// One trial at `rate` datagrams/s (`None`: unpaced): (datagrams blast sent, fragments the
/// interface received, datagrams made whole, the sender's window in seconds).
fn trial(who: Who, rate: Option<u64>, secs: f64) -> (u64, u64, u64, f64) {
    let p = pair(who);
    let until = (secs + 5.0).to_string();
    let mut cmd = p.dut.command(BIN);
    match who {
        Who::Kernel => cmd
            .args([
                "serve",
                "--bind",
                &format!("{DUT_ADDR}:9000"),
                "--cpus",
                "1",
            ])
            .args(["--mode", "sink"]),
        Who::Sink => cmd
            .args(["sink", "--dev", &p.dut_if, "--port", "9000", "--cpu", "1"])
            .args(["--idle", "1"]),
    };
    let mut receiver = cmd
        .args(["--duration", &until, "--json", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("receiver runs");
    ready(
        &mut receiver,
        match who {
            Who::Kernel => "flowlane serve:",
            Who::Sink => "flowlane sink:",
        },
    );
    let before = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets;
    let to = format!("{DUT_ADDR}:9000");
    let mut blast = p.gen.command(BIN);
    blast
        .args(["blast", "--mode", "xdp", "--dev", &p.gen_if, "--to", &to])
        .args(["--size", "1514", "--fragment-size", "512", "--cpus", "0"])
        .args(["--duration", &secs.to_string(), "--json", "--quiet"]);
    if let Some(r) = rate {
        blast.args(["--rate", &r.to_string()]);
    }
    let out = blast.output().expect("blast runs");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b: serde_json::Value = serde_json::from_slice(&out.stdout).expect("blast JSON");
    let sent = b["tx_packets"].as_u64().unwrap_or(0);
    let window = b["duration_s"].as_f64().unwrap_or(secs).max(1e-3);
    // The receiver ends at its --duration, after the last fragment.
    let out = receiver.wait_with_output().expect("receiver ends");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("receiver JSON");
    let iface = p.dut.dev().expect("counters").ifaces[&p.dut_if].rx_packets - before;
    let whole = match who {
        Who::Kernel => r["total"]["rx_packets"].as_u64(),
        Who::Sink => r["fragments"]["datagrams"].as_u64(),
    }
    .unwrap_or(0);
    (sent, iface, whole, window)
}

/// The highest rate (datagrams/s, within 2 %) below `ceiling` that `who` makes whole with
/// at most 0.1 % short.
fn capacity(who: Who, ceiling: u64, secs: f64, name: &str) -> u64 {
    let (mut lo, mut hi) = (0u64, ceiling);
    while hi - lo > ceiling / 50 {
        let mid = (lo + hi) / 2;
        let (sent, iface, whole, _) = trial(who, Some(mid), secs);
        let ok = sent > 0 && whole * 1000 >= sent * 999;
        println!(
            "{name:<7} {mid:>10} {sent:>10} {iface:>10} {whole:>10} {:>6}",
            if ok { "ok" } else { "short" }
        );
        if ok {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("reasm_veth: needs root for network namespaces; skipped");
        return;
    }
    let env = |k: &str, d: f64| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let secs = env("FLOWLANE_BENCH_SECS", 2.0);
    println!(
        "reassembly on CPU 1 over veth: blast xdp on CPU 0, 1514-byte frames in 3 fragments, \
         {secs} s per trial"
    );
    // The generator's ceiling: unpaced into the sink's pair (nothing refuses frames there).
    let (sent, iface, _, w) = trial(Who::Sink, None, secs);
    let ceiling = (sent as f64 / w) as u64;
    println!(
        "generator ceiling: {ceiling} datagrams/s ({:.0} fragments/s at the interface)",
        iface as f64 / w
    );
    println!(
        "{:<7} {:>10} {:>10} {:>10} {:>10} {:>6}",
        "who", "rate", "sent", "fragments", "whole", ""
    );
    let k = capacity(Who::Kernel, ceiling, secs, "kernel");
    let s = capacity(Who::Sink, ceiling, secs, "sink");
    println!(
        "capacity, datagrams made whole per second with <= 0.1 % short: sink {s}, kernel {k}: \
         ratio {:.2} (target >= 1.0){}",
        s as f64 / k.max(1) as f64,
        if s + ceiling / 50 >= ceiling {
            "; the sink reached the generator's ceiling (its capacity is at least this)"
        } else {
            ""
        }
    );
}
