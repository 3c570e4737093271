//! `flowlane rfc2544 --tests throughput` on the line lab, against DUTs of known behaviour, and
//! each NDR set against the DUT's forwarding rates measured by other means (blast alone, no
//! search: frames per second counted on flsink, an AF_XDP sink receiving as in the trials) —
//! RFC 2285's forwarding rate at the maximum offered load (blast unpaced; "FR max") and its
//! maximum forwarding rate (the highest rate forwarded over paced loads of 0.8 … 1.5× the NDR
//! and the unpaced one; "MFR"). A DUT that forwards less when overloaded than it carries
//! without loss (the kernel with 64-byte frames) has an FR max below its NDR; MFR is the
//! figure a zero-loss rate is bounded by.
//!
//! First the kernel routing (software RSS on the DUT, the one flow placed on queue 1, so CPU 1
//! forwards and CPU 0 generates), rows:
//!   aimed 1..3   our search three times: NDR per size, trials per size, seconds per run —
//!                the spread of the three NDRs is the repeatability;
//!   halving      the plain binary search once (`--halving-only`, what TRex's NDR bench and
//!                most testers run): its trials and seconds;
//!   af-packet rx our search with the AF_PACKET sink instead of the default AF_XDP one (on
//!                veth the receiver's work runs on the DUT's CPU);
//!   FR max, MFR  per size, and mean NDR over each.
//! Then other DUTs in a lab without steering, one queue per end (the AF_XDP ones bind the
//! DUT's ports themselves), the forwarding core on CPU 1: `flowlane forward --mode route`
//! over AF_XDP, AF_PACKET and native XDP, DPDK testpmd `mac` over its AF_XDP PMD, and DPDK
//! l3fwd over AF_XDP with its default 1 024-descriptor rings and with 2 048 (the AF_XDP PMD's
//! default, what testpmd gets) — one search each, then FR max and MFR per size.
//! An NDR marked TL was tester-limited (shown: what the generator delivered, a lower bound);
//! one marked max is the most the test may offer (no DUT limit found either).
//! FLOWLANE_RFC2544_DUTS picks sections (`kernel,forward,testpmd,l3fwd`; all by default).
//! Sizes 64, 512, 1518 (with FCS); trials 1 s, confirmation 2 s, pause 0.3 s; FR rows
//! FLOWLANE_BENCH_SECS each.
//!
//! Run (root): `cargo bench -p flowlane --bench rfc2544_lab`.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{rx, BIN};
use flowlane_lab::Netns;

const SIZES: [usize; 3] = [64, 512, 1518];
/// Paced loads of the maximum-forwarding-rate sweep, as multiples of the NDR found.
const LOADS: [f64; 6] = [0.8, 0.9, 1.0, 1.1, 1.25, 1.5];
/// The kernel DUT's one flow, placed by the picker on its RSS queue 1 (the lab's software RSS
/// hands it to CPU 1): the generator keeps CPU 0 to itself. (rfc2544 does so by default in
/// such a lab; said here so that blast's FR rows, which take the same words, place the same
/// flow — the lab's key and table are the defaults of both.) Where the flow's hash lands on
/// CPU 0 the kernel forwards beside the generator, which then falls short of its rate.
const ON_CPU1: [&str; 4] = ["--per-queue", "1", "--pick-queues", "1"];
/// The line lab's generator and sink MACs (the next hops a DPDK DUT writes in).
const PEERS: [&str; 2] = ["02:f1:0e:00:01:01", "02:f1:0e:00:02:02"];

/// One size's answer: the NDR (what the generator delivered where the trial was
/// tester-limited, a lower bound), the PDR likewise (at most the default 0.5 % lost), the
/// throughput trials it took, whether the NDR was tester-limited, and whether it is the
/// maximum rate itself (the DUT lost nothing at the most the test may offer: not a DUT limit
/// either).
#[derive(Clone, Copy, Default)]
struct Ndr {
    pps: f64,
    pdr: f64,
    trials: u64,
    limited: bool,
    at_max: bool,
}

impl Ndr {
    fn cell(&self) -> String {
        let mark = match (self.limited, self.at_max) {
            (true, _) => " TL",
            (false, true) => " max",
            _ => "",
        };
        format!("{:.0} ({}){mark}", self.pps, self.trials)
    }
}

/// One rfc2544 run: per size its answer, and the run's seconds.
fn run(lab: &str, extra: &[&str]) -> (Vec<Ndr>, f64) {
    let out = Command::new(BIN)
        .args(["rfc2544", "--lab", lab, "--json", "--quiet"])
        .args(["--tests", "throughput", "--sizes", "64,512,1518"])
        .args(["--trial-secs", "1", "--confirm-secs", "2", "--pause", "0.3"])
        .args(extra)
        .output()
        .expect("rfc2544 runs");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "rfc2544 JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let sizes = j["sizes"]
        .as_array()
        .expect("sizes")
        .iter()
        .map(|s| {
            let t = &s["throughput"];
            // A tester-limited answer is what the generator delivered (a lower bound).
            let found = |f: &serde_json::Value| {
                let pps = f["pps"].as_f64().unwrap_or(0.0);
                match f["tester_limited"] == true {
                    true => f["delivered_pps"].as_f64().unwrap_or(0.0).min(pps),
                    false => pps,
                }
            };
            let pps = t["ndr"]["pps"].as_f64().unwrap_or(0.0);
            let limited = t["ndr"]["tester_limited"] == true;
            let max = s["max"]["pps"].as_f64().unwrap_or(f64::INFINITY);
            Ndr {
                pps: found(&t["ndr"]),
                pdr: found(&t["pdr"]),
                trials: t["trials"].as_u64().unwrap_or(0),
                limited,
                at_max: pps >= 0.999 * max,
            }
        })
        .collect();
    (sizes, j["duration_s"].as_f64().unwrap_or(0.0))
}

/// RFC 2285's forwarding rates at one frame size: at the maximum offered load, and the
/// maximum over the sweep.
#[derive(Clone, Copy, Default)]
struct Fr {
    at_max: f64,
    mfr: f64,
}

/// The DUT's forwarding rates for `size`-byte frames (with FCS), measured without the search:
/// blast xdp-live for `secs` at each of [`LOADS`] × `ndr` (paced) and unpaced, frames counted
/// on flsink, an AF_XDP sink receiving on CPU 1 as in the trials (on veth its work is the DUT's
/// CPU's, so leaving it out would measure a different DUT).
fn forwarding(gen: &Netns, sink: &Netns, size: usize, ndr: f64, secs: f64, flows: &[&str]) -> Fr {
    let mut receiver = sink
        .command(BIN)
        .args([
            "sink",
            "--dev",
            "flsink",
            "--backend",
            "af-xdp",
            "--cpu",
            "1",
        ])
        .args(["--duration", "600", "--quiet"])
        .stdout(Stdio::null())
        .spawn()
        .expect("sink starts");
    std::thread::sleep(Duration::from_secs(1));
    let mut loads: Vec<Option<f64>> = if ndr > 0.0 {
        LOADS.iter().map(|f| Some(f * ndr)).collect()
    } else {
        Vec::new()
    };
    loads.push(None);
    let mut fr = Fr::default();
    for rate in loads {
        let before = rx(sink, "flsink");
        let mut cmd = gen.command(BIN);
        cmd.args(["blast", "--mode", "xdp-live", "--dev", "flgen"])
            .args(["--to", "198.18.1.2:9", "--cpus", "0", "--json", "--quiet"])
            .args(["--duration", &secs.to_string()])
            .args(["--size", &(size - 4).to_string()])
            .args(flows);
        if let Some(r) = rate {
            cmd.args(["--rate", &format!("{r:.0}")]);
        }
        let out = cmd.output().expect("blast runs");
        // Frames still in the DUT when the generator stops were sent in the window.
        std::thread::sleep(Duration::from_millis(100));
        let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let window = b["duration_s"].as_f64().unwrap_or(secs).max(1e-9);
        let got = (rx(sink, "flsink") - before) as f64 / window;
        if rate.is_none() {
            fr.at_max = got;
        }
        fr.mfr = fr.mfr.max(got);
        std::thread::sleep(Duration::from_millis(300));
    }
    flowlane_io::os::signal_process(receiver.id(), flowlane_io::os::Signal::Interrupt)
        .expect("SIGINT");
    let _ = receiver.wait();
    fr
}

/// A lab up (or the bench stops with why), and the generator's and sink's namespaces.
fn lab_up(name: &str, extra: &[&str]) -> (Netns, Netns) {
    let up = Command::new(BIN)
        .args(["lab", "up", "--name", name, "--topology", "line"])
        .args(extra)
        .output()
        .expect("lab up");
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    (
        Netns::existing(&format!("{name}-gen")),
        Netns::existing(&format!("{name}-sink")),
    )
}

fn lab_down(name: &str) {
    let _ = Command::new(BIN)
        .args(["lab", "down", "--name", name])
        .output();
}

/// One search against the DUT running now, then its forwarding rates per size: a line per size.
fn dut_rows(dut: &str, lab: &str, gen: &Netns, sink: &Netns, secs: f64) {
    let (r, took) = run(lab, &[]);
    for (i, size) in SIZES.iter().enumerate() {
        let ndr = r.get(i).copied().unwrap_or_default();
        let fr = forwarding(gen, sink, *size, ndr.pps, secs, &[]);
        println!(
            "{dut:<22} {size:>5} {:>16} {:>10.0} {:>10.0} {:>10.0} {:>8.2} {:>8.2} {:>8.2}",
            ndr.cell(),
            ndr.pdr,
            fr.at_max,
            fr.mfr,
            ndr.pps / fr.mfr.max(1e-9),
            ndr.pdr / fr.mfr.max(1e-9),
            ndr.pps / fr.at_max.max(1e-9)
        );
    }
    println!("{dut:<22} search took {took:.0} s");
}

fn wanted(section: &str) -> bool {
    std::env::var("FLOWLANE_RFC2544_DUTS")
        .map_or(true, |v| v.split(',').any(|s| s.trim() == section))
}

fn main() {
    let Some(secs) = common::start("rfc2544_lab") else {
        return;
    };
    if wanted("kernel") {
        kernel(secs);
    }
    others(secs);
}

/// The kernel routing as the DUT: repeatability, the halving search, the AF_PACKET receiver,
/// and the forwarding rates.
fn kernel(secs: f64) {
    let lab = "flb-rfc";
    let (gen, sink) = lab_up(lab, &["--kernel", "route"]);
    println!(
        "rfc2544 throughput on the line lab, kernel routing DUT; sizes {SIZES:?}; trials 1 s, \
         confirmation 2 s"
    );
    println!(
        "{:<12} {:>26} {:>26} {:>26} {:>8}",
        "row", "64 B NDR (trials)", "512 B NDR (trials)", "1518 B NDR (trials)", "secs"
    );
    let show = |name: &str, r: &(Vec<Ndr>, f64)| {
        let cells: Vec<String> = r.0.iter().map(Ndr::cell).collect();
        println!(
            "{name:<12} {:>26} {:>26} {:>26} {:>8.0}",
            cells.first().cloned().unwrap_or_default(),
            cells.get(1).cloned().unwrap_or_default(),
            cells.get(2).cloned().unwrap_or_default(),
            r.1
        );
    };
    let mut aimed = Vec::new();
    for k in 1..=3 {
        let r = run(lab, &ON_CPU1);
        show(&format!("aimed {k}"), &r);
        aimed.push(r);
    }
    let halving = run(lab, &[&ON_CPU1[..], &["--halving-only"]].concat());
    show("halving", &halving);
    // The receiver's cost is the DUT's on veth: the AF_PACKET sink (a copy of every frame and
    // the kernel's own path) against the default AF_XDP one.
    let packet = run(
        lab,
        &[&ON_CPU1[..], &["--rx-backend", "af-packet"]].concat(),
    );
    show("af-packet rx", &packet);
    // Repeatability: spread of the three NDRs per size, percent of their mean.
    let spread: Vec<String> = (0..SIZES.len())
        .map(|i| {
            let v: Vec<f64> = aimed
                .iter()
                .filter_map(|r| r.0.get(i).map(|x| x.pps))
                .collect();
            let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, 0.0f64), |a, &x| (a.0.min(x), a.1.max(x)));
            format!("±{:.1} %", 50.0 * (hi - lo) / mean.max(1e-9))
        })
        .collect();
    println!(
        "{:<12} {:>26} {:>26} {:>26}",
        "spread", spread[0], spread[1], spread[2]
    );
    let mean = |i: usize, of: fn(&Ndr) -> f64| {
        aimed.iter().map(|r| of(&r.0[i])).sum::<f64>() / aimed.len() as f64
    };
    let fr: Vec<Fr> = SIZES
        .iter()
        .enumerate()
        .map(|(i, &size)| forwarding(&gen, &sink, size, mean(i, |n| n.pps), secs, &ON_CPU1))
        .collect();
    let cell = |i: usize, f: fn(&Fr) -> f64| {
        let x = f(&fr[i]).max(1e-9);
        format!(
            "{:.0} ({:.2}; {:.2}; {:.2})",
            f(&fr[i]),
            mean(i, |n| n.pps) / x,
            mean(i, |n| n.pdr) / x,
            packet.0[i].pps / x
        )
    };
    for (name, f) in [
        ("FR max", (|f: &Fr| f.at_max) as fn(&Fr) -> f64),
        ("MFR", |f: &Fr| f.mfr),
    ] {
        println!(
            "{name:<12} {:>26} {:>26} {:>26}",
            cell(0, f),
            cell(1, f),
            cell(2, f)
        );
    }
    println!(
        "(FR max: frames/s the DUT delivered when overloaded; MFR: the most it delivered over \
         paced loads of 0.8-1.5x the mean NDR and unpaced; in brackets mean NDR / it, mean PDR \
         (0.5 % loss tolerated) / it, then the af-packet row's NDR / it)"
    );
    lab_down(lab);
}

/// Other DUTs in a lab whose DUT's kernel does not forward: ours, testpmd, l3fwd.
fn others(secs: f64) {
    if !["forward", "testpmd", "l3fwd"].into_iter().any(wanted) {
        return;
    }
    let lab = "flb-rfd";
    let (gen, sink) = lab_up(lab, &["--steer", "none", "--queues", "1"]);
    let dut = Netns::existing(&format!("{lab}-dut"));
    let ports = ["fldut", "fldut1"];
    println!(
        "\nother DUTs (lab {lab}: no steering, one queue per end, the DUT's worker on CPU 1); \
         sizes with FCS; FR rows {secs} s each"
    );
    println!(
        "{:<22} {:>5} {:>16} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "DUT", "size", "NDR (trials)", "PDR", "FR max", "MFR", "NDR/MFR", "PDR/MFR", "NDR/FRmax"
    );
    if wanted("forward") {
        for backend in ["af-xdp", "af-packet", "xdp"] {
            let mut cmd = dut.command(BIN);
            cmd.args([
                "forward", "--mode", "route", "--dev", ports[0], "--dev", ports[1],
            ])
            .args(["--backend", backend]);
            if backend != "xdp" {
                cmd.args(["--cpus", "1"]);
            }
            common::with_forwarder(cmd, || {
                dut_rows(&format!("forward {backend}"), lab, &gen, &sink, secs)
            });
        }
    }
    if wanted("testpmd") {
        common::with_testpmd(&dut, &ports, "af_xdp", "mac", &PEERS, || {
            dut_rows("testpmd mac af-xdp", lab, &gen, &sink, secs)
        });
    }
    if wanted("l3fwd") {
        for (name, extra) in [
            ("l3fwd af-xdp", &[][..]),
            (
                "l3fwd af-xdp 2048",
                &["--rx-queue-size", "2048", "--tx-queue-size", "2048"][..],
            ),
        ] {
            common::with_l3fwd(&dut, &ports, &PEERS, extra, || {
                dut_rows(name, lab, &gen, &sink, secs)
            });
        }
    }
    lab_down(lab);
}
