//! `flowlane doctor` on this machine: what it reports is what sysfs, procfs and the kernel
//! command line say, its JSON fits its schema, and its exit code follows its verdicts.

use std::process::Command;

use serde_json::Value;

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn doctor(args: &[&str]) -> (Option<i32>, Value, String) {
    let o = Command::new(BIN)
        .arg("doctor")
        .args(args)
        .arg("--json")
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code(), v, err)
}

fn finding<'a>(r: &'a Value, id: &str) -> &'a Value {
    r["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no {id}: {r}"))
}

#[test]
fn the_live_host_reads_as_its_own_files_say() {
    let (code, r, err) = doctor(&["--dev", "lo"]);
    common::schema_valid("doctor", &r);
    let fails = r["counts"]["fail"].as_u64().expect("fails");
    assert_eq!(code, Some(if fails > 0 { 1 } else { 0 }), "{err}");
    // The clock source is sysfs's.
    let cs =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .map(|s| s.trim().to_string());
    let f = finding(&r, "host.clocksource");
    match cs {
        Ok(c) => assert_eq!(f["seen"], c.as_str(), "{f}"),
        Err(_) => assert_eq!(f["verdict"], "SKIP", "{f}"),
    }
    // Isolation follows the kernel command line.
    let cmdline = std::fs::read_to_string("/proc/cmdline").expect("cmdline");
    let iso = finding(&r, "cpu.isolation");
    if !cmdline.contains("isolcpus=") {
        assert_eq!(iso["verdict"], "WARN", "{iso}");
    }
    // The hypervisor flag is /proc/cpuinfo's.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("cpuinfo");
    let hyper = cpuinfo
        .lines()
        .any(|l| l.starts_with("flags") && l.split_whitespace().any(|w| w == "hypervisor"));
    assert_eq!(
        finding(&r, "host.vm")["verdict"],
        if hyper { "WARN" } else { "PASS" }
    );
    // netdev_max_backlog is procfs's.
    let backlog = std::fs::read_to_string("/proc/sys/net/core/netdev_max_backlog")
        .expect("backlog")
        .trim()
        .to_string();
    assert!(
        finding(&r, "net.backlog")["seen"]
            .as_str()
            .expect("seen")
            .contains(&format!("= {backlog} ")),
        "{r}"
    );
    // With --dev, the interface's rules are there; loopback has no device of its own.
    assert_eq!(finding(&r, "nic.numa")["verdict"], "SKIP");
    assert_eq!(r["devs"][0], "lo");
    // Fast: the whole doctor in well under the 0.3 s (a debug build, a busy machine).
    assert!(r["took_ms"].as_f64().expect("ms") < 300.0, "{r}");
}

#[test]
fn a_recorded_root_is_read_and_bad_requests_are_refused() {
    let root = std::env::temp_dir().join(format!("fl-doctor-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let tsc = root.join("sys/devices/system/clocksource/clocksource0");
    std::fs::create_dir_all(&tsc).expect("dirs");
    std::fs::write(tsc.join("current_clocksource"), "hpet\n").expect("write");
    let r_arg = root.to_string_lossy().into_owned();
    let (code, r, err) = doctor(&["--root", &r_arg, "--cpus", "0"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(finding(&r, "host.clocksource")["seen"], "hpet");
    assert_eq!(finding(&r, "host.clocksource")["verdict"], "WARN");
    assert_eq!(finding(&r, "cpu.governor")["verdict"], "SKIP");
    for args in [
        vec!["--root", &r_arg, "--dev", "lo"],
        vec!["--root", "/nonexistent-flowlane-root"],
    ] {
        let (code, _, err) = doctor(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Issue 52 item 3: a run carries its host's conditions. blast (in its single-step and
/// sweep forms) puts `doctor`'s findings for its CPU in its JSON as `host`, the same verdicts
/// `doctor` gives for that CPU, and one line after its banner names every WARN and FAIL.
#[test]
fn a_run_carries_its_hosts_conditions_and_names_its_warnings() {
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").expect("sink");
    let to = sink.local_addr().expect("addr").to_string();
    for sweep in [false, true] {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "blast", "--to", &to, "--count", "20", "--cpus", "0", "--json",
        ]);
        if sweep {
            cmd.args(["--size", "64,128"]);
        }
        let o = cmd.output().expect("blast runs");
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let j: Value = serde_json::from_slice(&o.stdout).expect("JSON");
        common::schema_valid("blast", &j);
        let host = &j["host"];
        assert_eq!(host["cpus"], serde_json::json!([0]), "{j}");
        let findings = host["findings"].as_array().expect("host.findings");
        // The verdicts are doctor's own for CPU 0 (host-wide rules and CPU 0's).
        let (_, d, _) = doctor(&["--cpus", "0"]);
        for id in ["cpu.governor", "cpu.smt", "net.backlog", "host.clocksource"] {
            let mine = findings
                .iter()
                .find(|f| f["id"] == id)
                .unwrap_or_else(|| panic!("no {id} in {host}"));
            assert_eq!(mine["verdict"], finding(&d, id)["verdict"], "{id}");
        }
        let stderr = String::from_utf8_lossy(&o.stderr);
        let line = stderr.lines().find(|l| l.starts_with("host: "));
        let bad: Vec<&Value> = findings
            .iter()
            .filter(|f| f["verdict"] == "WARN" || f["verdict"] == "FAIL")
            .collect();
        match line {
            None => assert!(bad.is_empty(), "no host line for {bad:?}: {stderr}"),
            Some(l) => {
                for f in &bad {
                    let id = f["id"].as_str().expect("id");
                    assert!(l.contains(id), "{id} not named in {l}");
                }
                // After the banner, never before it.
                let first = stderr.lines().next().unwrap_or_default();
                assert!(first.starts_with("flowlane blast"), "{stderr}");
            }
        }
    }
}

/// The rules read from the kernel in a namespace of their own, against independent answers:
/// a veth's offloads against `ethtool -k` (after turning its receive checksums off), its XPS
/// against the sysfs files the test wrote, an nftables forward chain the test made against
/// `nft`'s own listing, and the preemption model against /proc/version.
#[test]
fn a_namespaces_interface_and_firewall_read_as_ethtool_and_nft_say() {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: needs root for a network namespace");
        return;
    }
    let ns = flowlane_lab::Netns::create("fldoc").expect("namespace");
    ns.ip(&[
        "link",
        "add",
        "fld0",
        "numtxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "fld1",
    ])
    .expect("veth");
    let in_ns = |prog: &str, args: &[&str]| ns.command(prog).args(args).output().expect("runs");
    let doctor_in_ns = || {
        let o = in_ns(BIN, &["doctor", "--dev", "fld0", "--cpus", "0", "--json"]);
        let r: Value = serde_json::from_slice(&o.stdout).expect("doctor JSON");
        common::schema_valid("doctor", &r);
        r
    };
    // Receive checksums off: a WARN, and ethtool says the same.
    in_ns("ip", &["link", "set", "fld0", "up"]);
    let before = doctor_in_ns();
    if common::need_program("ethtool") {
        let o = in_ns("ethtool", &["-K", "fld0", "rx", "off"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let k = String::from_utf8_lossy(&in_ns("ethtool", &["-k", "fld0"]).stdout).to_string();
        let said = |name: &str| {
            k.lines()
                .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
                .map(|v| if v.starts_with("on") { "on" } else { "off" })
                .unwrap_or_else(|| panic!("{name} in {k}"))
        };
        let r = doctor_in_ns();
        let o = finding(&r, "nic.offloads");
        assert_eq!(
            o["seen"],
            format!(
                "gro {}, lro {}, rx-checksum {}, tx-checksum {}",
                said("generic-receive-offload"),
                said("large-receive-offload"),
                said("rx-checksumming"),
                said("tx-checksumming")
            ),
            "{o}"
        );
        assert_eq!(o["verdict"], "WARN", "{o}");
        assert_eq!(finding(&before, "nic.offloads")["verdict"], "PASS");
    }
    // veth has no coalescing to report: said, not guessed.
    assert_eq!(finding(&before, "nic.coalesce")["verdict"], "SKIP");
    // XPS: unset on both queues, then set through sysfs (in the namespace's own sysfs view).
    assert_eq!(
        finding(&before, "nic.xps")["seen"],
        "XPS unset on 2 of 2 tx queues"
    );
    for (q, mask) in [(0, "1"), (1, "2")] {
        ns.run_with_sys(|| {
            std::fs::write(format!("/sys/class/net/fld0/queues/tx-{q}/xps_cpus"), mask)
        })
        .expect("in the namespace")
        .expect("xps_cpus written");
    }
    let r = doctor_in_ns();
    assert_eq!(
        finding(&r, "nic.xps")["seen"],
        "XPS set on all 2 tx queues",
        "{r}"
    );
    // The firewall: an nftables table with a forward chain, as nft lists it.
    let firewall_seen = |r: &Value| finding(r, "net.firewall")["seen"].clone();
    assert_eq!(
        firewall_seen(&before),
        "no nftables base chain on the forwarding hooks, no iptables tables"
    );
    if common::need_program("nft") {
        let o = in_ns(
            "nft",
            &["add table inet fltest; add chain inet fltest fl_fwd { type filter hook forward priority 0; }"],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let listed = String::from_utf8_lossy(&in_ns("nft", &["list", "chains"]).stdout).to_string();
        assert!(
            listed.contains("chain fl_fwd") && listed.contains("hook forward"),
            "{listed}"
        );
        let r = doctor_in_ns();
        assert_eq!(firewall_seen(&r), "nft inet fltest fl_fwd (hook forward)");
        assert_eq!(finding(&r, "net.firewall")["verdict"], "WARN");
    }
    // The preemption model is /proc/version's.
    let version = std::fs::read_to_string("/proc/version").expect("version");
    let p = finding(&before, "kernel.preempt");
    if version.contains("PREEMPT_RT") {
        assert_eq!(p["verdict"], "PASS", "{p}");
    } else if version.contains("PREEMPT_DYNAMIC") {
        assert!(
            p["seen"].as_str().is_some_and(|s| s.contains("dynamic")) || p["verdict"] == "SKIP",
            "{p}"
        );
    }
    // The wake-up limit is what the device answers (nobody holds one during tests).
    let d = finding(&before, "cpu.dma_latency");
    assert!(
        d["verdict"] == "SKIP"
            || d["seen"]
                .as_str()
                .is_some_and(|s| s.starts_with("no limit held") || s.starts_with("limit ")),
        "{d}"
    );
}

/// This machine recorded: the files the host rules read, copied under a root (as a user
/// records a host to send along with a report), read back with `--root`, give the live
/// verdicts and values rule by rule — except the firewall, whose nftables chains are asked
/// of a live kernel only (the recorded root says so).
#[test]
fn this_machine_recorded_reads_as_it_does_live() {
    let root = std::env::temp_dir().join(format!("fl-doctor-rec-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let copy = |rel: &str| {
        let from = std::path::Path::new("/").join(rel);
        // Device files and procfs are read for what they hold now, a few KiB at most.
        let Ok(bytes) = std::fs::read(&from).or_else(|e| {
            // /dev/cpu_dma_latency answers one 4-byte read and no more.
            use std::io::Read;
            let mut b = [0u8; 4];
            std::fs::File::open(&from)
                .and_then(|mut f| f.read_exact(&mut b))
                .map(|()| b.to_vec())
                .map_err(|_| e)
        }) else {
            return;
        };
        let to = root.join(rel);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("dirs");
        std::fs::write(to, bytes).expect("copy");
    };
    for f in [
        "proc/cmdline",
        "proc/cpuinfo",
        "proc/version",
        "proc/sys/net/netfilter/nf_conntrack_count",
        "proc/net/ip_tables_names",
        "proc/net/ip6_tables_names",
        "sys/devices/system/cpu/cpufreq/boost",
        "sys/devices/system/cpu/intel_pstate/no_turbo",
        "sys/kernel/mm/transparent_hugepage/enabled",
        "sys/kernel/realtime",
        "sys/kernel/debug/sched/preempt",
        "sys/devices/system/clocksource/clocksource0/current_clocksource",
        "dev/cpu_dma_latency",
    ] {
        copy(f);
    }
    for k in [
        "netdev_max_backlog",
        "netdev_budget",
        "rmem_max",
        "wmem_max",
        "busy_poll",
        "busy_read",
    ] {
        copy(&format!("proc/sys/net/core/{k}"));
    }
    for c in 0..2 {
        let cpu = format!("sys/devices/system/cpu/cpu{c}");
        copy(&format!("{cpu}/cpufreq/scaling_governor"));
        copy(&format!("{cpu}/topology/thread_siblings_list"));
        for s in 0..16 {
            for f in ["name", "latency", "disable"] {
                copy(&format!("{cpu}/cpuidle/state{s}/{f}"));
            }
        }
        for e in std::fs::read_dir(format!("/{cpu}"))
            .expect("cpu dir")
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("node") {
                std::fs::create_dir_all(root.join(&cpu).join(&name)).expect("node");
            }
        }
    }
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if pid.bytes().all(|b| b.is_ascii_digit()) {
            copy(&format!("proc/{pid}/comm"));
        }
    }
    let r_arg = root.to_string_lossy().into_owned();
    let (_, live, err) = doctor(&["--cpus", "0,1"]);
    let (_, rec, err2) = doctor(&["--root", &r_arg, "--cpus", "0,1"]);
    let _ = std::fs::remove_dir_all(&root);
    let rows = |r: &Value| -> Vec<(String, String, String)> {
        r["findings"]
            .as_array()
            .unwrap_or_else(|| panic!("findings: {r}"))
            .iter()
            .map(|f| {
                let id = f["id"].as_str().unwrap_or_default().to_string();
                // The conntrack count moves between the two reads; its verdict does not.
                let seen = if id == "net.conntrack" {
                    String::new()
                } else {
                    f["seen"].as_str().unwrap_or_default().to_string()
                };
                (
                    id,
                    f["verdict"].as_str().unwrap_or_default().to_string(),
                    seen,
                )
            })
            .filter(|(id, _, _)| id != "net.firewall")
            .collect()
    };
    assert_eq!(rows(&rec), rows(&live), "{err}{err2}");
    assert!(
        finding(&rec, "net.firewall")["seen"]
            .as_str()
            .is_some_and(|s| s.contains("asked of a live kernel only")),
        "{rec}"
    );
}
