//! `flowlane forward --mode route` in a line lab (generator — DUT — sink, veth pairs with one
//! queue), against references measured in the same run, with the same table loaded in the
//! kernel and in ours (FLOWLANE_BENCH_ROUTES IPv4 routes shaped like the public table, via the
//! sink; default 950 000). The generator is `blast --mode xdp-live` on CPU 0 (60-byte frames
//! to the sink's address); the sink's end drops with XDP, and frames are counted at its
//! interface. Rows:
//!   drop ceiling    an XDP_DROP program on the DUT's receiving end: what any DUT is offered;
//!   kernel          the DUT kernel's own IPv4 forwarding (its FIB with the same routes);
//!   redirect ceil   a one-line XDP program redirecting every frame to the sink's port;
//!   xdp             flowlane's native XDP router (DIR-24-8 in array maps);
//!   af-xdp          flowlane's router over AF_XDP (one UMEM across both ports), one worker
//!                   pinned to CPU 1;
//!   af-packet       the same over AF_PACKET rings;
//!   xdp-forward     xdp-tools' native XDP forwarder (the kernel's FIB through
//!                   `bpf_fib_lookup`), where installed (bench/xdp_tools.sh);
//!   testpmd …       DPDK's testpmd (dpdk-dev) forwarding with MAC rewrite (`mac`) over its
//!                   AF_XDP and AF_PACKET PMDs, forwarding core on CPU 1;
//!   l3fwd af-xdp    DPDK's l3fwd example (LPM, its own 16 routes; built from dpdk-doc's
//!                   sources, RX checksum offload not asked for) over AF_XDP, on CPU 1.
//! Then IPv6 (FLOWLANE_BENCH_ROUTES6 routes, default 220 000): the kernel's IPv6 forwarding,
//! the native router (its LPM trie) and xdp-forward, three rotated rounds, medians.
//!
//! Then the bridge, in a switched line lab (one subnet across the DUT): the drop ceiling, the
//! kernel's bridge, a one-line XDP program redirecting every frame to the other port (the
//! redirect ceiling), `flowlane forward --mode bridge` (native XDP; AF_XDP and AF_PACKET on
//! CPU 1) and testpmd's `io` forwarding (AF_XDP, AF_PACKET). Before each row the sink sends three
//! datagrams to the generator, so learning bridges know where it is.
//!
//! On veth the DUT's receive path (NAPI, so the kernel's forwarding) runs on the sender's CPU
//! (0), the user-space worker on CPU 1.
//!
//! Then the user-space routers over AF_XDP alternated: ours, l3fwd and testpmd `io` (the
//! copy-mode path with no work per frame), rotated rounds, medians of per-round ratios.
//!
//! Run (root): `cargo bench -p flowlane --bench route_veth` (FLOWLANE_BENCH_SECS, default 3;
//! FLOWLANE_BENCH_ONLY=af-xdp: the ceiling, the kernel and the alternated AF_XDP rounds only).

mod common;

use common::{blast_live, verdict, with_forwarder, BIN};
use flowlane_lab::setup;
use flowlane_lab::Netns;

/// Alternated rounds of ours against xdp-forward.
const ROUNDS: usize = 5;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("route_veth: needs root for network namespaces; skipped");
        return;
    }
    let secs = common::secs();
    let routes: usize = std::env::var("FLOWLANE_BENCH_ROUTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(950_000);
    let lab = common::BenchLab::line("flbr", setup::Segment::Routed);
    let (gen, dut, sink) = (lab.gen(), lab.dut(), lab.sink());
    // The table, in the kernel (our router reads it from there).
    let t0 = std::time::Instant::now();
    let loaded = common::load_ipv4_table(&dut, routes);
    let _sink_drop = verdict(&sink, setup::SINK_IF, 1);
    let to = format!("{}:9000", setup::LAB_SINK_V4);
    let blast = |ns: &Netns, dev: &str| blast_live(&gen, setup::GEN_IF, &to, secs, ns, dev);
    println!(
        "forward --mode route over veth: {loaded} IPv4 routes in the kernel's FIB and ours \
         (loaded in {:.1} s), blast xdp-live on CPU 0, 60-byte frames, {secs} s per row",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "{:<14} {:>14} {:>14} {:>10} {:>10}",
        "row", "offered pps", "received pps", "/ceiling", "/kernel"
    );
    let ceiling = {
        let _drop = verdict(&dut, setup::DUT_IF, 1);
        reference_row("drop ceiling", blast(&dut, setup::DUT_IF), None, None)
    };
    let kernel = {
        dut.write_file("/proc/sys/net/ipv4/ip_forward", "1")
            .expect("sysctl");
        let (offered, got) = blast(&sink, setup::SINK_IF);
        dut.write_file("/proc/sys/net/ipv4/ip_forward", "0")
            .expect("sysctl");
        reference_row("kernel", (offered, got), Some(ceiling), None)
    };
    let peers = ["02:f1:0e:00:01:01", "02:f1:0e:00:02:02"];
    if std::env::var("FLOWLANE_BENCH_ONLY").is_ok_and(|v| v == "af-xdp") {
        afxdp_rounds(&dut, &peers, &|| blast(&sink, setup::SINK_IF));
        return;
    }
    forwarder_rows(&dut, "route", ceiling, kernel, &|| {
        blast(&sink, setup::SINK_IF)
    });
    // Before testpmd's AF_PACKET rows: that PMD takes the ports down and up when it stops,
    // which empties the DUT's neighbour table (the lab's permanent entries too).
    afxdp_rounds(&dut, &peers, &|| blast(&sink, setup::SINK_IF));
    // xdp-tools' xdp-forward: native XDP too, the kernel's FIB (the same routes) looked up
    // from the program.
    let ports = [setup::DUT_IF, setup::DUT_OUT_IF];
    if let Some(r) = common::with_xdp_forward(&dut, &ports, || blast(&sink, setup::SINK_IF)) {
        peer_row(
            "xdp-forward",
            "kernel FIB through bpf_fib_lookup",
            r,
            ceiling,
            kernel,
        );
    }
    // Ours against xdp-forward again, alternated: single rows move by ±20 % on this host.
    if flowlane_lab::have_program("xdp-forward") {
        let mut ratios = Vec::new();
        for round in 0..ROUNDS {
            let (mut ours, mut peer) = (0.0, 0.0);
            for which in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                if which == 0 {
                    ours = forwarder_run(&dut, "route", "xdp", &|| blast(&sink, setup::SINK_IF))
                        .0
                         .1;
                } else {
                    peer = common::with_xdp_forward(&dut, &ports, || blast(&sink, setup::SINK_IF))
                        .map_or(0.0, |r| r.1);
                }
            }
            ratios.push(ours / peer.max(1.0));
        }
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "xdp / xdp-forward, {ROUNDS} alternated rounds: {} — median {:.3}",
            ratios
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            sorted[sorted.len() / 2]
        );
    }
    ipv6(&gen, &dut, &sink, secs, ceiling);
    // testpmd's MAC forwarding (the peers' MACs written in, no lookup, no TTL).
    testpmd_rows(&dut, "mac", &peers, ceiling, kernel, &|| {
        blast(&sink, setup::SINK_IF)
    });
    // DPDK's l3fwd (LPM, its own sixteen 198.18.N.0/24 routes) over AF_XDP.
    if let Some(r) = common::with_l3fwd(&dut, &ports, &peers, &[], || blast(&sink, setup::SINK_IF))
    {
        peer_row("l3fwd af-xdp", "l3fwd LPM over af_xdp", r, ceiling, kernel);
    }
    drop(lab);
    bridge(secs);
}

/// The user-space routers over AF_XDP, alternated (single rows move by ±25 % on this host):
/// ours, DPDK l3fwd, and testpmd's `io` forwarding — no work per frame at all, so what the
/// copy-mode AF_XDP path itself carries on veth, the ceiling of any AF_XDP forwarder here.
/// [`ROUNDS`] rounds, the order rotated; medians of the per-round ratios.
fn afxdp_rounds(dut: &Netns, peers: &[&str], measure: &dyn Fn() -> (f64, f64)) {
    let ports = [setup::DUT_IF, setup::DUT_OUT_IF];
    if common::l3fwd().is_none() || !flowlane_lab::have_program("dpdk-testpmd") {
        eprintln!("(no alternated AF_XDP rounds: they need l3fwd and testpmd)");
        return;
    }
    let names = ["ours af-xdp", "l3fwd af-xdp", "testpmd io af-xdp"];
    let m = common::rotated_rounds("AF_XDP", names, ROUNDS, &|which| match which {
        0 => {
            let ((_, got), f) = forwarder_run(dut, "route", "af-xdp", measure);
            if got < 1000.0 {
                eprintln!("ours forwarded nothing: {f}");
            }
            got
        }
        1 => common::with_l3fwd(dut, &ports, peers, &[], measure).map_or(0.0, |m| m.1),
        _ => common::with_testpmd(dut, &ports, "af_xdp", "io", peers, measure).map_or(0.0, |m| m.1),
    });
    println!(
        "AF_XDP, medians of {ROUNDS} rotated rounds: ours / l3fwd {:.3}, ours / testpmd io {:.3}, \
         l3fwd / testpmd io {:.3}",
        m[0], m[1], m[2]
    );
}

/// IPv6 routing: FLOWLANE_BENCH_ROUTES6 routes (default 220 000, shaped like the public
/// table) in the kernel and so in ours, 60-byte frames to the sink's IPv6 address (the
/// drop ceiling is the IPv4 one: the generator's rate does not depend on the family). Ours
/// (the native router's LPM trie) against the kernel's IPv6 forwarding and xdp-forward,
/// alternated over rounds.
fn ipv6(gen: &Netns, dut: &Netns, sink: &Netns, secs: f64, ceiling: f64) {
    let routes: usize = std::env::var("FLOWLANE_BENCH_ROUTES6")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(220_000);
    let lab: u128 = 0x2001_0002 << 96;
    let mut batch = String::with_capacity(routes * 50);
    for (p, _) in flowlane_lpm::gen::ipv6(routes, 1, 1) {
        // Not over the lab's own 2001:2::/48, nor inside it.
        let (a, len) = (p.addr(), u32::from(p.len()));
        let covers = len <= 48 && (a ^ lab) >> (128 - len.max(1)) == 0;
        if covers || (a >> 80) == (lab >> 80) {
            continue;
        }
        batch += &format!("route add {p} via {}\n", setup::LAB_SINK_V6);
    }
    common::ip_batch(dut, "-6", &batch);
    println!(
        "IPv6: {} routes in the kernel's FIB and ours, frames to {}",
        batch.lines().count(),
        setup::LAB_SINK_V6
    );
    let to = format!("[{}]:9000", setup::LAB_SINK_V6);
    let blast = || blast_live(gen, setup::GEN_IF, &to, secs, sink, setup::SINK_IF);
    let kernel = || {
        dut.write_file("/proc/sys/net/ipv6/conf/all/forwarding", "1")
            .expect("sysctl");
        let r = blast();
        dut.write_file("/proc/sys/net/ipv6/conf/all/forwarding", "0")
            .expect("sysctl");
        r
    };
    let ports = [setup::DUT_IF, setup::DUT_OUT_IF];
    let peer = flowlane_lab::have_program("xdp-forward");
    let (mut k, mut ours, mut xf) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let mut order = vec![0, 1, 2];
        order.rotate_left(round);
        for which in order {
            match which {
                0 => k.push(kernel().1),
                1 => ours.push(forwarder_run(dut, "route", "xdp", &blast).0 .1),
                _ if peer => {
                    if let Some(r) = common::with_xdp_forward(dut, &ports, blast) {
                        xf.push(r.1);
                    }
                }
                _ => {}
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let (k, o, x) = (med(&mut k), med(&mut ours), med(&mut xf));
    println!(
        "{:<14} {:>14} {:>14} {:>10} {:>10}",
        "IPv6 row", "", "received pps", "/ceiling", "/kernel"
    );
    for (name, got) in [("kernel v6", k), ("xdp v6", o), ("xdp-forward v6", x)] {
        if got > 0.0 {
            println!(
                "{name:<14} {:>14} {got:>14.0} {:>10.3} {:>10.3}",
                "",
                got / ceiling.max(1.0),
                got / k.max(1.0)
            );
        }
    }
    if x > 0.0 {
        println!(
            "xdp v6 / xdp-forward v6 (medians of 3 rotated rounds): {:.3}",
            o / x
        );
    }
}

/// The bridge rows, in a switched line lab: the drop ceiling, the kernel's bridge, ours.
fn bridge(secs: f64) {
    let lab = common::BenchLab::line("flbb", setup::Segment::Switched);
    let (gen, dut, sink) = (lab.gen(), lab.dut(), lab.sink());
    let _sink_drop = verdict(&sink, setup::SINK_IF, 1);
    let to = format!("{}:9000", setup::LAB_SINK_L2_V4);
    // The sink says where it is first (three datagrams to the generator through the bridge),
    // so a learning bridge forwards to its port alone instead of flooding.
    let announce = || {
        let back = format!("{}:9", setup::LAB_GEN_V4);
        let out = sink
            .command(BIN)
            .args(["blast", "--to", &back, "--count", "3", "--quiet"])
            .output()
            .expect("blast runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let blast = |ns: &Netns, dev: &str| {
        announce();
        blast_live(&gen, setup::GEN_IF, &to, secs, ns, dev)
    };
    println!();
    println!("forward --mode bridge over veth: blast xdp-live on CPU 0, 60-byte frames, {secs} s per row");
    println!(
        "{:<14} {:>14} {:>14} {:>10} {:>10}",
        "row", "offered pps", "received pps", "/ceiling", "/kernel"
    );
    let ceiling = {
        let _drop = verdict(&dut, setup::DUT_IF, 1);
        reference_row("drop ceiling", blast(&dut, setup::DUT_IF), None, None)
    };
    let kernel = {
        let br = setup::KERNEL_BRIDGE;
        dut.ip(&["link", "add", br, "type", "bridge"])
            .expect("bridge");
        for port in [setup::DUT_IF, setup::DUT_OUT_IF] {
            dut.ip(&["link", "set", port, "master", br]).expect("port");
        }
        dut.ip(&["link", "set", br, "up"]).expect("up");
        let (offered, got) = blast(&sink, setup::SINK_IF);
        dut.ip(&["link", "del", br]).expect("bridge gone");
        reference_row("kernel bridge", (offered, got), Some(ceiling), None)
    };
    // The redirect ceiling: every frame redirected to the other port by a one-line program.
    forwarder_rows(&dut, "bridge", ceiling, kernel, &|| {
        blast(&sink, setup::SINK_IF)
    });
    testpmd_rows(&dut, "io", &[], ceiling, kernel, &|| {
        blast(&sink, setup::SINK_IF)
    });
}

/// Prints a reference row — `(offered, received)` pps against the drop ceiling and the
/// kernel where given (`None`: this row is that reference) — and returns its rate.
fn reference_row(
    name: &str,
    (offered, got): (f64, f64),
    ceiling: Option<f64>,
    kernel: Option<f64>,
) -> f64 {
    let ratio =
        |r: Option<f64>| r.map_or("1.000".to_string(), |r| format!("{:.3}", got / r.max(1.0)));
    let kernel = if ceiling.is_none() {
        String::new()
    } else {
        ratio(kernel)
    };
    println!(
        "{name:<14} {offered:>14.0} {got:>14.0} {:>10} {kernel:>10}",
        ratio(ceiling)
    );
    got
}

/// The redirect ceiling (a one-line program sending every frame to the other port), then
/// `flowlane forward --mode MODE` on each backend, the native XDP one also against that
/// ceiling.
fn forwarder_rows(
    dut: &Netns,
    mode: &str,
    ceiling: f64,
    kernel: f64,
    measure: &dyn Fn() -> (f64, f64),
) {
    let redirect = {
        let _r = redirect_all(dut, setup::DUT_IF, setup::DUT_OUT_IF);
        reference_row("redirect ceil", measure(), Some(ceiling), Some(kernel))
    };
    for backend in ["xdp", "af-xdp", "af-packet"] {
        let got = forwarder_row(dut, mode, backend, ceiling, kernel, measure);
        if backend == "xdp" {
            println!(
                "{:<14} {:>14} {:>14.3}",
                "",
                "/redirect ceil",
                got / redirect.max(1.0)
            );
        }
    }
}

/// testpmd in `mode` over AF_XDP, then AF_PACKET, between the DUT's two ports (forwarding
/// lcore on CPU 1, as ours).
fn testpmd_rows(
    dut: &Netns,
    mode: &str,
    peers: &[&str],
    ceiling: f64,
    kernel: f64,
    measure: &dyn Fn() -> (f64, f64),
) {
    for pmd in ["af_xdp", "af_packet"] {
        let ports = [setup::DUT_IF, setup::DUT_OUT_IF];
        if let Some(r) = common::with_testpmd(dut, &ports, pmd, mode, peers, measure) {
            peer_row(
                &format!("testpmd {}", pmd.replace('_', "-")),
                &format!("testpmd {mode} over {pmd}"),
                r,
                ceiling,
                kernel,
            );
        }
    }
}

/// A peer's row: `(offered, received)` pps against the drop ceiling and the kernel, and what
/// the peer is.
fn peer_row(name: &str, what: &str, (offered, got): (f64, f64), ceiling: f64, kernel: f64) {
    println!(
        "{:<14} {:>14.0} {:>14.0} {:>10.3} {:>10.3}   ({what})",
        name,
        offered,
        got,
        got / ceiling.max(1.0),
        got / kernel.max(1.0)
    );
}

/// A program on `from` redirecting every frame to `to` (a device map), attached while the
/// returned link lives: the most an XDP-native forwarder between the two can carry.
fn redirect_all(ns: &Netns, from: &str, to: &str) -> std::os::fd::OwnedFd {
    use flowlane_io::ebpf::{Asm, Helper, R1, R2, R3};
    let (from, to) = (from.to_string(), to.to_string());
    ns.run(move || {
        let to = flowlane_io::netdev::ifindex(&to).expect("ifindex");
        let maps = flowlane_io::bpf::BridgeMaps::create().expect("maps");
        maps.set_port(0, to).expect("port");
        let mut a = Asm::new();
        a.load_map_fd(R1, maps.fds().1)
            .mov_imm(R2, 0)
            .mov_imm(R3, 0)
            .call(Helper::RedirectMap)
            .exit();
        let prog = flowlane_io::bpf::prog_load(
            flowlane_io::bpf::PROG_XDP,
            "fl_b_redirect",
            &a.finish().expect("asm"),
        )
        .expect("load");
        let ifindex = flowlane_io::netdev::ifindex(&from).expect("ifindex");
        flowlane_io::bpf::attach_xdp(&prog, ifindex, flowlane_io::netdev::XDP_FLAGS_DRV_MODE)
            .expect("attach")
    })
    .expect("in the namespace")
}

/// One row: `flowlane forward --mode MODE` with `backend` on CPU 1 in `dut` while `measure`
/// runs; its rate against the ceiling and the kernel's.
fn forwarder_row(
    dut: &Netns,
    mode: &str,
    backend: &str,
    ceiling: f64,
    kernel: f64,
    measure: &dyn Fn() -> (f64, f64),
) -> f64 {
    let ((offered, got), f) = forwarder_run(dut, mode, backend, measure);
    println!(
        "{:<14} {:>14.0} {:>14.0} {:>10.3} {:>10.3}   (forwarded {}, flooded {}, ring drops {})",
        backend,
        offered,
        got,
        got / ceiling.max(1.0),
        got / kernel.max(1.0),
        f["total"]["forwarded"],
        f["total"]["flooded"],
        f["total"]["ring_drops"]
    );
    got
}

/// `flowlane forward --mode MODE` with `backend` (on CPU 1 unless native XDP) in `dut`
/// while `measure` runs: what `measure` returned, and the forwarder's summary.
fn forwarder_run(
    dut: &Netns,
    mode: &str,
    backend: &str,
    measure: &dyn Fn() -> (f64, f64),
) -> ((f64, f64), serde_json::Value) {
    let mut fwd = dut.command(BIN);
    fwd.args([
        "forward",
        "--mode",
        mode,
        "--dev",
        setup::DUT_IF,
        "--dev",
        setup::DUT_OUT_IF,
    ])
    .args(["--backend", backend]);
    if backend != "xdp" {
        fwd.args(["--cpus", "1"]);
    }
    with_forwarder(fwd, measure)
}
