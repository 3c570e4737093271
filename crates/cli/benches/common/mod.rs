//! What the forwarding benches share: one-verdict XDP programs, a live-frames generator run,
//! and a forwarder started and stopped around a measurement.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

use flowlane_io::{bpf, netdev::ifindex};
use flowlane_lab::Netns;

pub const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// What every namespace bench checks first: nothing to do for `cargo test --benches`'
/// `--list`, and a skip (said) without root. The seconds per row when it may run.
pub fn start(name: &str) -> Option<f64> {
    if std::env::args().any(|a| a == "--list") {
        return None;
    }
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("{name}: needs root for network namespaces; skipped");
        return None;
    }
    Some(secs())
}

/// Seconds per row (FLOWLANE_BENCH_SECS, default 3).
pub fn secs() -> f64 {
    std::env::var("FLOWLANE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0)
}

/// Attaches a one-verdict XDP program to `dev` in `ns` while the returned link lives.
pub fn verdict(ns: &Netns, dev: &str, verdict: i32) -> OwnedFd {
    let dev = dev.to_string();
    ns.run(move || {
        let prog = bpf::verdict_program(verdict, "fl_b_verdict").expect("load");
        bpf::attach_xdp(&prog, ifindex(&dev).expect("ifindex"), 0).expect("attach")
    })
    .expect("in the namespace")
}

/// An interface's received-frames counter.
pub fn rx(ns: &Netns, dev: &str) -> u64 {
    ns.dev().expect("counters").ifaces[dev].rx_packets
}

/// `blast --mode xdp-live` from `gen`/`gen_if` to `to` on CPU 0 for `secs`: frames/s offered
/// (blast's own count) and frames/s `ns`/`dev` received over the same window.
pub fn blast_live(
    gen: &Netns,
    gen_if: &str,
    to: &str,
    secs: f64,
    ns: &Netns,
    dev: &str,
) -> (f64, f64) {
    let before = rx(ns, dev);
    let d = secs.to_string();
    let out = gen
        .command(BIN)
        .args(["blast", "--mode", "xdp-live", "--dev", gen_if, "--to", to])
        .args(["--cpus", "0", "--duration", &d, "--json", "--quiet"])
        .output()
        .expect("blast runs");
    let b: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("blast JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    let got = rx(ns, dev) - before;
    let window = b["duration_s"].as_f64().unwrap_or(secs).max(1e-9);
    (b["tx_pps"].as_f64().unwrap_or(0.0), got as f64 / window)
}

/// A `flowlane forward` started from `cmd` (banner seen) while `measure` runs, then stopped:
/// what `measure` returned and the forwarder's JSON summary.
pub fn with_forwarder<T>(mut cmd: Command, measure: impl FnOnce() -> T) -> (T, serde_json::Value) {
    let mut child = cmd
        .args(["--duration", "600", "--json", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("forward runs");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut banner = String::new();
    err.read_line(&mut banner).expect("banner");
    assert!(banner.starts_with("flowlane forward:"), "{banner}");
    let t = measure();
    flowlane_io::os::signal_process(child.id(), flowlane_io::os::Signal::Interrupt)
        .expect("SIGINT");
    let out = child.wait_with_output().expect("forward ends");
    let f: serde_json::Value = serde_json::from_slice(&out.stdout).expect("forward JSON");
    (t, f)
}

/// xdp-tools' `xdp-forward` (fib mode: the kernel's FIB looked up from XDP with
/// `bpf_fib_lookup`, native XDP) loaded on `ports` in `ns` while `measure` runs, IPv4 and
/// IPv6 forwarding enabled there for the helper (it refuses to forward a family whose
/// forwarding is off); `None` (and a note) where it is not installed.
pub fn with_xdp_forward<T>(ns: &Netns, ports: &[&str], measure: impl FnOnce() -> T) -> Option<T> {
    if !flowlane_lab::have_program("xdp-forward") {
        eprintln!(
            "(no xdp-forward row: xdp-tools >= 1.5.6 is not installed; bench/xdp_tools.sh \
             builds it from a checkout)"
        );
        return None;
    }
    let load = ns
        .command("xdp-forward")
        .arg("load")
        .args(ports)
        .output()
        .expect("xdp-forward runs");
    if !load.status.success() {
        eprintln!(
            "(no xdp-forward row: load failed: {})",
            String::from_utf8_lossy(&load.stderr).trim()
        );
        return None;
    }
    let forwarding = [
        "/proc/sys/net/ipv4/ip_forward",
        "/proc/sys/net/ipv6/conf/all/forwarding",
    ];
    for f in forwarding {
        ns.write_file(f, "1").expect("sysctl");
    }
    let out = measure();
    for f in forwarding {
        ns.write_file(f, "0").expect("sysctl");
    }
    let _ = ns.command("xdp-forward").arg("unload").args(ports).output();
    Some(out)
}

/// DPDK's testpmd forwarding between `ports` of `ns` on CPU 1 (its main lcore on CPU 0) in
/// `mode` (`io`, `mac` with the peers' MACs, …) over `pmd` (`af_xdp` or `af_packet`), while
/// `measure` runs; `None` (and a hint) where testpmd is not installed.
pub fn with_testpmd<T>(
    ns: &Netns,
    ports: &[&str],
    pmd: &str,
    mode: &str,
    peers: &[&str],
    measure: impl FnOnce() -> T,
) -> Option<T> {
    if !flowlane_lab::have_program("dpdk-testpmd") {
        eprintln!(
            "(no testpmd row: {})",
            flowlane_lab::missing_hint("dpdk-testpmd")
                .replace("install dpdk-testpmd", "install dpdk-dev")
        );
        return None;
    }
    let mut cmd = ns.command("dpdk-testpmd");
    cmd.args([
        "-l",
        "0,1",
        "--no-pci",
        "--no-huge",
        "-m",
        "1024",
        "--file-prefix",
    ])
    .arg(format!("flb{}", std::process::id()));
    for (i, p) in ports.iter().enumerate() {
        let vdev = match pmd {
            "af_packet" => format!(
                "net_af_packet{i},iface={p},blocksz=4096,framesz=2048,framecnt=4096,qpairs=1"
            ),
            _ => format!("net_af_xdp{i},iface={p}"),
        };
        cmd.args(["--vdev", &vdev]);
    }
    cmd.args([
        "--",
        "--auto-start",
        "--nb-cores",
        "1",
        "--stats-period",
        "1",
    ])
    .arg(format!("--forward-mode={mode}"));
    for (i, m) in peers.iter().enumerate() {
        cmd.arg(format!("--eth-peer={i},{m}"));
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("testpmd runs");
    let out = child.stdout.take().expect("stdout");
    Some(while_running(
        child,
        out,
        "packets/burst",
        "testpmd",
        measure,
    ))
}

/// Once `child` has written `marker` to `out` (its log), runs `measure` while `child` runs,
/// keeping its log drained, then stops it with SIGINT.
fn while_running<T>(
    mut child: std::process::Child,
    out: impl std::io::Read + Send + 'static,
    marker: &str,
    what: &str,
    measure: impl FnOnce() -> T,
) -> T {
    let mut out = BufReader::new(out);
    let mut line = String::new();
    let mut ready = false;
    for _ in 0..500 {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if line.contains(marker) {
            ready = true;
            break;
        }
    }
    if !ready {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} did not start forwarding");
    }
    // Keep its output flowing while it runs.
    let drain = std::thread::spawn(move || {
        let mut sink = String::new();
        while out.read_line(&mut sink).unwrap_or(0) > 0 {
            sink.clear();
        }
    });
    let t = measure();
    flowlane_io::os::signal_process(child.id(), flowlane_io::os::Signal::Interrupt)
        .expect("SIGINT");
    let _ = child.wait();
    let _ = drain.join();
    t
}

/// DPDK's l3fwd example built from dpdk-doc's sources against the installed DPDK (dpdk-dev,
/// pkg-config) into the bench's temporary directory, with one change: it asks for no receive
/// checksum offload, which veth refuses. `None` (and a hint) where it cannot be built.
pub fn l3fwd() -> Option<std::path::PathBuf> {
    let src = std::path::Path::new("/usr/share/dpdk/examples");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dpdk-examples");
    let bin = dir.join("l3fwd/build/l3fwd");
    if bin.exists() {
        return Some(bin);
    }
    let hint = "(no l3fwd row: build it from dpdk-doc's examples — apt-get install dpdk-doc \
                dpdk-dev pkg-config)";
    if !src.join("l3fwd/main.c").exists() || !flowlane_lab::have_program("pkg-config") {
        eprintln!("{hint}");
        return None;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let copied = Command::new("cp")
        .args(["-r"])
        .arg(src)
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    let main = dir.join("l3fwd/main.c");
    let patched = std::fs::read_to_string(&main).ok().map(|t| {
        t.replace(
            ".offloads = RTE_ETH_RX_OFFLOAD_CHECKSUM,",
            ".offloads = 0, /* flowlane bench: veth refuses RX checksum offload */",
        )
    });
    let built = copied
        && patched.is_some_and(|t| std::fs::write(&main, t).is_ok())
        && Command::new("make")
            .current_dir(dir.join("l3fwd"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if built && bin.exists() {
        Some(bin)
    } else {
        eprintln!("{hint} (the build failed)");
        None
    }
}

/// l3fwd (LPM, its own 198.18.N.0/24 → port N routes) between `ports` of `ns` on CPU 1 over
/// AF_XDP, with `peers` the next hops' MACs and `extra` more of its options (e.g. ring sizes),
/// while `measure` runs.
pub fn with_l3fwd<T>(
    ns: &Netns,
    ports: &[&str],
    peers: &[&str],
    extra: &[&str],
    measure: impl FnOnce() -> T,
) -> Option<T> {
    let bin = l3fwd()?;
    let mut cmd = ns.command(&bin.to_string_lossy());
    cmd.args([
        "-l",
        "1",
        "--no-pci",
        "--no-huge",
        "-m",
        "1024",
        "--file-prefix",
    ])
    .arg(format!("fll3{}", std::process::id()));
    for (i, p) in ports.iter().enumerate() {
        cmd.args(["--vdev", &format!("net_af_xdp{i},iface={p}")]);
    }
    let config: Vec<String> = (0..ports.len()).map(|i| format!("({i},0,1)")).collect();
    cmd.args([
        "--",
        "-p",
        &format!("{:#x}", (1u32 << ports.len()) - 1),
        "--parse-ptype",
        "-P",
    ])
    .arg(format!("--config={}", config.join(",")));
    for (i, m) in peers.iter().enumerate() {
        cmd.arg(format!("--eth-dest={i},{m}"));
    }
    cmd.args(extra);
    // Its log (RTE_LOG) goes to standard error, unbuffered: the start line comes from there.
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("l3fwd runs");
    let err = child.stderr.take().expect("stderr");
    Some(while_running(
        child,
        err,
        "entering main loop",
        "l3fwd",
        || {
            // Its ports' links come up after the main loop starts.
            std::thread::sleep(std::time::Duration::from_secs(1));
            measure()
        },
    ))
}

/// `ip <family> -batch -` in `ns`, fed `batch`.
pub fn ip_batch(ns: &Netns, family: &str, batch: &str) {
    let mut child = ns
        .command("ip")
        .args([family, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("ip -batch");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), batch.as_bytes())
        .expect("routes");
    assert!(
        child.wait().expect("ip").success(),
        "ip {family} -batch failed"
    );
}

/// `routes` IPv4 routes shaped like the public table (`flowlane_lpm::gen`), all via the line
/// lab's sink (198.18.1.2), into the kernel of `dut` — the DUT's routers read them from there.
/// None over the lab's own 198.18.0.0/15, loopback, multicast or reserved space, none shorter
/// than /8. How many went in.
pub fn load_ipv4_table(dut: &Netns, routes: usize) -> usize {
    let mut batch = String::with_capacity(routes * 40);
    for (p, _) in flowlane_lpm::gen::ipv4(routes, 1, 1) {
        let first = p.addr() >> 24;
        let lab = p.contains(0xc612_0000) || p.addr() & 0xfffe_0000 == 0xc612_0000;
        if first == 0 || first == 127 || first >= 224 || lab || p.len() < 8 {
            continue;
        }
        batch += &format!("route add {p} via 198.18.1.2\n");
    }
    ip_batch(dut, "-4", &batch);
    batch.lines().count()
}

/// Three setups named `names`, each measured by `measure(i)` once a round for `rounds`
/// rounds, the order rotated each round (single rows move by ±25 % on this host); each round
/// printed after `label`. Then the medians over rounds of the ratios 0/1, 0/2 and 1/2.
pub fn rotated_rounds(
    label: &str,
    names: [&str; 3],
    rounds: usize,
    measure: &dyn Fn(usize) -> f64,
) -> [f64; 3] {
    let mut got: Vec<[f64; 3]> = Vec::new();
    for round in 0..rounds {
        let mut r = [0.0; 3];
        for k in 0..3 {
            let which = (round + k) % 3;
            r[which] = measure(which);
        }
        println!(
            "{label} round {round}: {}",
            names
                .iter()
                .zip(r)
                .map(|(n, v)| format!("{n} {v:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        got.push(r);
    }
    let median_of = |a: usize, b: usize| {
        let mut v: Vec<f64> = got.iter().map(|r| r[a] / r[b].max(1.0)).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    [median_of(0, 1), median_of(0, 2), median_of(1, 2)]
}

/// A line lab for a bench, taken down when dropped.
pub struct BenchLab {
    pub cfg: flowlane_lab::setup::LabConfig,
}

impl Drop for BenchLab {
    fn drop(&mut self) {
        let _ = flowlane_lab::setup::down(&self.cfg.name);
    }
}

impl BenchLab {
    /// A line lab named `prefix` + this process's id, one queue a veth end, no steering, and
    /// `segment`'s addressing (routed or switched); the DUT's kernel forwards nothing until
    /// a row turns it on.
    pub fn line(prefix: &str, segment: flowlane_lab::setup::Segment) -> BenchLab {
        use flowlane_lab::setup::{self, KernelDut, LabConfig, Steer, Topology};
        let name = format!("{prefix}{}", std::process::id() % 100_000);
        let mut cfg = LabConfig::new(&name, 1, Steer::None, &flowlane_rss::Key::MICROSOFT, 2);
        cfg.topology = Topology::Line;
        cfg.segment = segment;
        cfg.kernel = KernelDut::Off;
        setup::up(&cfg).expect("line lab");
        BenchLab { cfg }
    }

    pub fn gen(&self) -> Netns {
        Netns::existing(&self.cfg.gen_ns())
    }

    pub fn dut(&self) -> Netns {
        Netns::existing(&self.cfg.dut_ns())
    }

    pub fn sink(&self) -> Netns {
        Netns::existing(&self.cfg.sink_ns())
    }
}
