//! `flowlane forward --mode reflect` over a veth pair, against the drop ceiling measured in the
//! same run. The generator is `blast --mode xdp-live` on CPU 0 (60-byte frames, the fastest
//! sender); the generator's end runs an XDP program that drops what comes back, so veth takes
//! the reflected frames and counts them. Rows:
//!   drop ceiling  an XDP_DROP program on the DUT's end: frames the DUT's interface received
//!                 per second — the most any DUT can be offered here;
//!   XDP_TX ceil   a one-line program sending every frame back untouched (XDP_TX): what the
//!                 mechanism itself carries when the generator's CPU also receives the
//!                 frames back (on veth it does, for every row below);
//!   xdp-bench tx  xdp-tools' XDP_TX reflector (`-p swap-macs`), where installed
//!                 (bench/xdp_tools.sh);
//!   xdp / af-xdp / af-packet  the reflector with that backend: frames back at the
//!                 generator's interface per second, and the ratio to the ceiling.
//!   testpmd …     DPDK's testpmd `macswap` over its AF_XDP and AF_PACKET PMDs on the DUT's
//!                 port, forwarding core on CPU 1 (where dpdk-dev is installed).
//! Then, where testpmd is installed, the AF_XDP reflectors alternated: ours, testpmd
//! `macswap` and testpmd `io` (frames sent back untouched: what the copy-mode AF_XDP path
//! itself carries), rotated rounds, medians of per-round ratios.
//! On veth the DUT's receive path (NAPI, so native XDP) runs on the sender's CPU (0); the
//! AF_XDP and AF_PACKET workers are pinned to CPU 1.
//!
//! Run (root): `cargo bench -p flowlane --bench forward_veth` (FLOWLANE_BENCH_SECS, default 3;
//! FLOWLANE_BENCH_ONLY=af-xdp: the ceiling and the alternated AF_XDP rounds only).

mod common;

use common::{blast_live, verdict, with_forwarder, BIN};
use flowlane_lab::{Pair, DUT_ADDR};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("forward_veth: needs root for network namespaces; skipped");
        return;
    }
    let secs = common::secs();
    let p = Pair::create("flb-fwd", 1).expect("namespaces");
    let _gen_drop = verdict(&p.gen, &p.gen_if, 1);
    let to = format!("{DUT_ADDR}:9000");
    let blast =
        |ns: &flowlane_lab::Netns, dev: &str| blast_live(&p.gen, &p.gen_if, &to, secs, ns, dev);
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
    let reflect = |backend: &str| {
        let mut fwd = p.dut.command(BIN);
        fwd.args(["forward", "--mode", "reflect", "--dev", &p.dut_if])
            .args(["--backend", backend, "--swap", "ip,ports"]);
        if backend != "xdp" {
            fwd.args(["--cpus", "1"]);
        }
        with_forwarder(fwd, || blast(&p.gen, &p.gen_if))
    };
    let testpmd = |mode: &str, pmd: &str| {
        common::with_testpmd(&p.dut, &[p.dut_if.as_str()], pmd, mode, &[], || {
            blast(&p.gen, &p.gen_if)
        })
    };
    if std::env::var("FLOWLANE_BENCH_ONLY").is_ok_and(|v| v == "af-xdp") {
        afxdp_rounds(&|| reflect("af-xdp").0 .1, &|m| testpmd(m, "af_xdp"));
        return;
    }
    // The mechanism's own ceiling: XDP_TX of every frame untouched (the reflected frames are
    // received by the generator's end, on the generator's CPU, as in the rows below).
    let tx_ceiling = {
        let _tx = verdict(&p.dut, &p.dut_if, 3);
        let (offered, got) = blast(&p.gen, &p.gen_if);
        println!(
            "{:<14} {:>14.0} {:>14.0} {:>10.3}",
            "XDP_TX ceil",
            offered,
            got,
            got / ceiling.max(1.0)
        );
        got
    };
    // xdp-tools' XDP_TX reflector, MACs swapped (ours swaps addresses and ports too).
    if flowlane_lab::have_program("xdp-bench") {
        let mut bench = p
            .dut
            .command("xdp-bench")
            .args(["tx", "-p", "swap-macs", &p.dut_if])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("xdp-bench runs");
        // Bounded wait until its program is on the interface.
        let on = (0..50).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            p.dut
                .command("ip")
                .args(["link", "show", &p.dut_if])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("xdp"))
        });
        if on {
            let (offered, got) = blast(&p.gen, &p.gen_if);
            println!(
                "{:<14} {:>14.0} {:>14.0} {:>10.3}   (xdp-bench tx -p swap-macs)",
                "xdp-bench tx",
                offered,
                got,
                got / ceiling.max(1.0)
            );
        }
        let _ = flowlane_io::os::signal_process(bench.id(), flowlane_io::os::Signal::Interrupt);
        let _ = bench.wait();
    } else {
        eprintln!(
            "(no xdp-bench row: xdp-tools >= 1.5.6 is not installed; bench/xdp_tools.sh builds \
             it from a checkout)"
        );
    }
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
        let ((offered, got), f) = reflect(backend);
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
        if backend == "xdp" {
            println!(
                "{:<14} {:>14} {:>14.3}",
                "",
                "/XDP_TX ceil",
                got / tx_ceiling.max(1.0)
            );
        }
    }
    // DPDK testpmd's macswap (MACs swapped, the frame sent back) over its AF_XDP and
    // AF_PACKET PMDs on the same port, forwarding core on CPU 1.
    for pmd in ["af_xdp", "af_packet"] {
        if let Some((offered, got)) = testpmd("macswap", pmd) {
            println!(
                "{:<14} {:>14.0} {:>14.0} {:>10.3}   (testpmd macswap over {pmd})",
                format!("testpmd {}", pmd.replace('_', "-")),
                offered,
                got,
                got / ceiling.max(1.0)
            );
        }
    }
    afxdp_rounds(&|| reflect("af-xdp").0 .1, &|m| testpmd(m, "af_xdp"));
}

/// The AF_XDP reflectors alternated (single rows move by ±25 % on this host): ours (`ours`:
/// frames/s back at the generator), testpmd `macswap` and testpmd `io` (`testpmd(mode)`),
/// five rounds with the order rotated; medians of the per-round ratios.
fn afxdp_rounds(ours: &dyn Fn() -> f64, testpmd: &dyn Fn(&str) -> Option<(f64, f64)>) {
    if !flowlane_lab::have_program("dpdk-testpmd") {
        return;
    }
    let names = ["ours af-xdp", "testpmd macswap", "testpmd io"];
    let m = common::rotated_rounds("AF_XDP", names, 5, &|which| match which {
        0 => ours(),
        1 => testpmd("macswap").map_or(0.0, |m| m.1),
        _ => testpmd("io").map_or(0.0, |m| m.1),
    });
    println!(
        "AF_XDP reflect, medians of 5 rotated rounds: ours / testpmd macswap {:.3}, ours / \
         testpmd io {:.3}, macswap / io {:.3}",
        m[0], m[1], m[2]
    );
}
