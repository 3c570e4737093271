//! Beyond one host (issue 56), without a cluster: network namespaces act as a Kubernetes
//! Indexed Job's pods — each given `JOB_COMPLETION_INDEX` as Kubernetes would, all starting at
//! one `--start-at` — against one DUT namespace, and `flowlane merge` joins their reports.
//! The merged counts are checked against the DUT's interface and UDP counters exactly, the
//! per-flow results against one unsharded run's, and the merged latency histogram against the
//! sum of the shards' own. Receivers are sharded too: sinks on one interface each take their
//! share of its queues, and their merge equals one sink's view of the same frames.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use flowlane_lab::Netns;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
}

/// A scratch directory for reports, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("flowlane-dist-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch directory");
        Dir(d)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One DUT namespace with a veth to each of `pods` generator namespaces, pod i on
/// 198.18.(10+i).0/24 (the pod .1, the DUT .2). Quiet, so counters are exact: IPv6 off in
/// every namespace before its links exist, permanent neighbours (no ARP). `queues` receive and
/// transmit queues on each end.
struct Star {
    dut: Netns,
    pods: Vec<Pod>,
    _guard: std::sync::MutexGuard<'static, ()>,
}

struct Pod {
    ns: Netns,
    dut_if: String,
    gen_if: String,
    dut_addr: String,
}

fn star(pods: usize, queues: u32) -> Option<Star> {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) for network namespaces");
        return None;
    }
    let guard = common::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let quiet = |ns: &Netns| {
        for k in ["all", "default"] {
            ns.write_file(&format!("/proc/sys/net/ipv6/conf/{k}/disable_ipv6"), "1")
                .expect("IPv6 off");
        }
    };
    let dut = Netns::create("fldist-dut").expect("namespace");
    quiet(&dut);
    let tag = std::process::id() % 10_000;
    let mut out = Vec::new();
    for i in 0..pods {
        let ns = Netns::create("fldist-pod").expect("namespace");
        quiet(&ns);
        let (gen_if, dut_if) = (format!("fdg{tag}x{i}"), format!("fdd{tag}x{i}"));
        let (gen_mac, dut_mac) = (
            format!("02:f1:0d:00:{i:02x}:01"),
            format!("02:f1:0d:00:{i:02x}:02"),
        );
        let q = queues.to_string();
        #[rustfmt::skip]
        let args = [
            "link", "add", &gen_if, "address", &gen_mac, "numtxqueues", &q, "numrxqueues", &q,
            "netns", ns.name(), "type", "veth", "peer", "name", &dut_if, "address", &dut_mac,
            "numtxqueues", &q, "numrxqueues", &q, "netns", dut.name(),
        ];
        flowlane_lab::ip(&args).expect("veth");
        let (ga, da) = (
            format!("198.18.{}.1", 10 + i),
            format!("198.18.{}.2", 10 + i),
        );
        for (s, ifname, addr, peer, peer_mac) in [
            (&ns, &gen_if, &ga, &da, &dut_mac),
            (&dut, &dut_if, &da, &ga, &gen_mac),
        ] {
            s.ip(&["addr", "add", &format!("{addr}/24"), "dev", ifname])
                .expect("address");
            s.permanent_neighbour(ifname, peer, peer_mac)
                .expect("neighbour");
            s.ip(&["link", "set", ifname, "up"]).expect("up");
        }
        out.push(Pod {
            ns,
            dut_if,
            gen_if,
            dut_addr: da,
        });
    }
    Some(Star {
        dut,
        pods: out,
        _guard: guard,
    })
}

/// Whether this machine has the two CPUs a test pins to (`why`); says so where it has not.
fn two_cpus(why: &str) -> bool {
    let ok = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    if !ok {
        eprintln!("SKIP: needs 2 CPUs ({why})");
    }
    ok
}

/// blast from `pod` to its DUT address with `extra`: 4 flows, 1 000 datagrams each, on two
/// threads pinned to CPUs 0 and 1 (thread i sends flows 2i and 2i+1), judged.
fn two_threads(pod: &Pod, extra: &[&str]) {
    let out = pod
        .ns
        .command(BIN)
        .args(["blast", "--to", &format!("{}:9000", pod.dut_addr)])
        .args(extra)
        .args([
            "--flows", "4", "--cpus", "0,1", "--count", "4000", "--rate", "4000",
        ])
        .args(["--json", "--quiet"])
        .output()
        .expect("blast runs");
    common::blast_judged_ok(
        out.status.code(),
        serde_json::from_slice(&out.stdout).expect("JSON"),
    );
}

fn rx_of(ns: &Netns, ifname: &str) -> u64 {
    ns.dev().expect("counters").ifaces[ifname].rx_packets
}

/// Wall-clock seconds since the epoch, `s` from now, as `--start-at` takes them.
fn start_in(s: f64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    format!("@{:.3}", now + s)
}

/// The blast flags every shard and the single run share: 6 flows, 3 000 datagrams at 1 500
/// per second with echoes — far below what a debug build on a busy 2-core machine carries
/// (tens of thousands a second), so no datagram is lost for want of CPU.
const RUN: [&str; 9] = [
    "--flows", "6", "--count", "3000", "--rate", "1500", "--echo", "--json", "--quiet",
];

fn serve_in(dut: &Netns) -> common::Running {
    let mut cmd = dut.command(BIN);
    cmd.args([
        "serve",
        "--bind",
        "0.0.0.0:9000",
        "--cpus",
        "0",
        "--json",
        "--duration",
        "120",
    ]);
    common::Running::start_with(cmd, "flowlane serve:")
}

fn merge(files: &[PathBuf], extra: &[&str]) -> (Option<i32>, Value, String) {
    let out = Command::new(BIN)
        .arg("merge")
        .args(files)
        .args(["--json"])
        .args(extra)
        .output()
        .expect("merge runs");
    let j = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code(),
        j,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn flows(j: &Value) -> Vec<(u64, u64, u64, u64)> {
    j["flows"]
        .as_array()
        .expect("flows")
        .iter()
        .map(|f| {
            (
                n(&f["id"]),
                n(&f["tx_packets"]),
                n(&f["rx_packets"]),
                n(&f["lost"]),
            )
        })
        .collect()
}

/// A report's latency histogram, decoded; resizing as it takes others' values.
fn histogram(j: &Value) -> hdrhistogram::Histogram<u64> {
    let mut h = flowlane_tools::report::decode_histogram(
        j["latency_histogram"].as_str().expect("histogram"),
    )
    .expect("decodes");
    h.auto(true);
    h
}

/// Three pods send one run's flows as three shards into one DUT; the merge equals the
/// DUT's counters and a single run.
#[test]
fn pods_of_an_indexed_job_merge_to_the_dut_counters_and_one_run() {
    let Some(s) = star(3, 1) else { return };
    let dir = Dir::new("pods");
    common::up_to(3, |attempt| {
        let server = serve_in(&s.dut);
        let dut_rx = || -> u64 { s.pods.iter().map(|p| rx_of(&s.dut, &p.dut_if)).sum() };
        let pod_rx = || -> u64 { s.pods.iter().map(|p| rx_of(&p.ns, &p.gen_if)).sum() };
        let udp_in = || {
            s.dut
                .snmp()
                .expect("snmp")
                .get("Udp", "InDatagrams")
                .unwrap_or(0)
        };
        let (dut0, pod0, udp0) = (dut_rx(), pod_rx(), udp_in());
        let at = start_in(2.5);
        let children: Vec<_> = s
            .pods
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let file = std::fs::File::create(dir.file(&format!("a{attempt}-pod{i}.json")))
                    .expect("report file");
                p.ns.command(BIN)
                    .args(["blast", "--to", &format!("{}:9000", p.dut_addr)])
                    .args(RUN)
                    // Every CPU the pod may use (two threads of one flow each here), where the
                    // single run below has one: each flow's count is its share of the whole
                    // run's either way.
                    .args(["--cpus", "all", "--shards", "3", "--start-at", &at])
                    .env("JOB_COMPLETION_INDEX", i.to_string())
                    .stdout(file)
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("blast starts")
            })
            .collect();
        let codes: Vec<_> = children
            .into_iter()
            .map(|c| c.wait_with_output().expect("blast ends"))
            .collect();
        let (_, serve) = server.finish();
        let files: Vec<PathBuf> = (0..3)
            .map(|i| dir.file(&format!("a{attempt}-pod{i}.json")))
            .collect();
        let shards: Vec<Value> = files
            .iter()
            .zip(&codes)
            .map(|(f, out)| {
                let text = std::fs::read_to_string(f).expect("report");
                let j: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
                common::blast_judged_ok(out.status.code(), j)
            })
            .collect();
        // Each pod knew its index from the environment and started at the agreed time.
        for (i, j) in shards.iter().enumerate() {
            let sh = &j["shard"];
            assert_eq!(
                (n(&sh["shard"]["index"]), n(&sh["shard"]["count"])),
                (i as u64, 3),
                "{sh}"
            );
            let late = sh["late_us"].as_f64().expect("lateness");
            assert!(
                (0.0..500_000.0).contains(&late),
                "started {late} µs late: {sh}"
            );
            assert_eq!(sh["clock"]["source"], "CLOCK_REALTIME");
            assert_eq!(n(&j["tx_packets"]), 1000, "a third of the count each");
        }
        let hgrm = dir.file(&format!("a{attempt}-merged.hgrm"));
        let (code, m, err) = merge(&files, &["--histogram", hgrm.to_str().expect("path")]);
        assert_eq!(code, Some(0), "{err}\n{m}");
        common::schema_valid("blast", &m);
        // Counts against the DUT's kernel: every datagram the shards sent crossed a DUT
        // interface and reached the server's socket; every echo crossed back.
        let sent = n(&m["tx_packets"]);
        assert_eq!(sent, 3000);
        assert_eq!(dut_rx() - dut0, sent, "the DUT interfaces' rx_packets");
        assert_eq!(udp_in() - udp0, sent as i64, "the DUT's Udp InDatagrams");
        assert_eq!(n(&serve["total"]["rx_packets"]), sent, "{serve}");
        assert_eq!(
            pod_rx() - pod0,
            n(&m["rx_packets"]),
            "the pods' interfaces, echoes back"
        );
        assert_eq!(n(&m["lost"]), 0, "{m}");
        // The latency: the merged histogram is the shards' histograms added, every echo in it.
        let mut all = histogram(&shards[0]);
        for j in &shards[1..] {
            all.add(histogram(j)).expect("adds");
        }
        let merged = histogram(&m);
        assert_eq!(merged, all);
        assert_eq!(merged.len(), n(&m["rx_packets"]));
        let rows = common::hgrm_rows(&hgrm);
        let last = rows.last().expect("rows");
        assert_eq!(last[2] as u64, merged.len(), "the .hgrm's total count");
        assert_eq!(m["shards"].as_array().map(Vec::len), Some(3));
        // `--histogram FILE.hlog`: HdrHistogram's log, the same distribution losslessly.
        let hlog = dir.file(&format!("a{attempt}-merged.hlog"));
        let (code, _, err) = merge(&files, &["--histogram", hlog.to_str().expect("path")]);
        assert_eq!(code, Some(0), "{err}");
        let text = std::fs::read_to_string(&hlog).expect("the log");
        let line = text.lines().last().expect("an interval");
        let encoded = line.rsplit(',').next().expect("its histogram");
        assert_eq!(
            flowlane_tools::report::decode_histogram(encoded).expect("decodes"),
            merged
        );
        // As `kubectl logs` gives them: each pod's status lines (standard error) and report in
        // one stream, read from standard input; the same merge.
        let logs: String = codes
            .iter()
            .zip(&files)
            .map(|(out, f)| {
                String::from_utf8_lossy(&out.stderr).into_owned()
                    + &std::fs::read_to_string(f).expect("report")
            })
            .collect();
        let mut cmd = Command::new(BIN);
        cmd.args(["merge", "-", "--json"]);
        let piped = common::with_stdin(cmd, &logs);
        let again: Value = serde_json::from_slice(&piped.stdout).expect("merged JSON");
        assert_eq!(again["flows"], m["flows"]);
        assert_eq!(again["latency_histogram"], m["latency_histogram"]);
        // One run with the same flags, unsharded, from one pod: the same flows, the same counts.
        let server = serve_in(&s.dut);
        let out = s.pods[0]
            .ns
            .command(BIN)
            .args(["blast", "--to", &format!("{}:9000", s.pods[0].dut_addr)])
            .args(RUN)
            .args(["--cpus", "1"])
            .output()
            .expect("blast runs");
        drop(server);
        let one = common::blast_judged_ok(
            out.status.code(),
            serde_json::from_slice(&out.stdout).expect("JSON"),
        );
        assert_eq!(flows(&m), flows(&one), "per flow, merged against one run");
        assert_eq!(n(&one["tx_packets"]), sent);
    });
}

/// Sinks on one interface each take their share of its receive queues: with two sender
/// threads on CPUs 0 and 1 and XPS mapping CPU i to queue i, shard i gets exactly thread i's
/// flows; their merge equals one sink reading the same frames beside them, and the
/// interface's own count.
#[test]
fn sink_shards_take_their_queues_and_merge_to_one_sink() {
    if !two_cpus("one sender thread on each, XPS by CPU") {
        return;
    }
    let Some(s) = star(1, 2) else { return };
    let dir = Dir::new("sinks");
    let pod = &s.pods[0];
    for (q, mask) in [(0, "1"), (1, "2")] {
        pod.ns
            .write_sys(
                &format!("/sys/class/net/{}/queues/tx-{q}/xps_cpus", pod.gen_if),
                mask,
            )
            .expect("XPS");
    }
    // A sink of 6 s, started once its banner says its ring is open.
    let sink = |extra: &[&str]| {
        let mut args = vec!["--duration", "6"];
        args.extend_from_slice(extra);
        common::sink_spawn_in(&s.dut, &pod.dut_if, &args)
    };
    let before = rx_of(&s.dut, &pod.dut_if);
    let sinks = [
        sink(&["--shard", "0/2"]),
        sink(&["--shard", "1/2"]),
        sink(&[]),
    ];
    two_threads(pod, &["--mode", "raw", "--dev", &pod.gen_if]);
    for (c, f) in sinks.into_iter().zip(["s0.json", "s1.json", "all.json"]) {
        let out = c.wait_with_output().expect("sink ends");
        assert_eq!(out.status.code(), Some(0));
        std::fs::write(dir.file(f), &out.stdout).expect("report file");
    }
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.file(f)).expect("report")).expect("JSON")
    };
    let (s0, s1, all) = (read("s0.json"), read("s1.json"), read("all.json"));
    let ids = |j: &Value| -> Vec<u64> {
        j["flows"]
            .as_array()
            .expect("flows")
            .iter()
            .map(|f| n(&f["id"]))
            .collect()
    };
    // Thread 0 sends flows 0 and 1 (on queue 0), thread 1 flows 2 and 3 (queue 1).
    assert_eq!(ids(&s0), [0, 1], "{s0}");
    assert_eq!(ids(&s1), [2, 3], "{s1}");
    let (code, m, err) = merge(&[dir.file("s0.json"), dir.file("s1.json")], &[]);
    assert_eq!(code, Some(0), "{err}\n{m}");
    common::schema_valid("sink", &m);
    let received = rx_of(&s.dut, &pod.dut_if) - before;
    assert_eq!(n(&m["rx_packets"]), received, "the interface's rx_packets");
    assert_eq!(n(&all["rx_packets"]), received);
    assert_eq!(
        m["flows"], all["flows"],
        "per flow, the shards' merge against one sink"
    );
    for k in [
        "flowlane_packets",
        "lost",
        "reordered",
        "duplicates",
        "rx_bytes",
    ] {
        assert_eq!(m[k], all[k], "{k}");
    }
    assert_eq!(
        histogram(&m).len(),
        histogram(&all).len(),
        "every frame's latency, once"
    );
}

/// Two pods load one HTTP server as two shards of one run: each takes half the
/// connections, half the rate and its own half of the source addresses; the merge counts
/// every answer the server gave, and its latency is the shards' histograms added.
#[test]
fn http_load_shards_merge_to_the_servers_count() {
    let Some(s) = star(1, 1) else { return };
    let dir = Dir::new("http");
    let pod = &s.pods[0];
    pod.ns
        .ip(&["route", "add", "local", "198.18.128.0/28", "dev", "lo"])
        .expect("local sources");
    s.dut
        .ip(&["route", "add", "198.18.128.0/28", "via", "198.18.10.1"])
        .expect("a route back");
    let url = format!("http://{}:8080/bytes/64", pod.dut_addr);
    let mut cmd = s.dut.command(BIN);
    cmd.args(["http", "serve", "--bind", &format!("{}:8080", pod.dut_addr)])
        .args(["--cpus", "0", "--json", "--duration", "120"]);
    let server = common::Running::start_with(cmd, "flowlane http serve:");
    let at = start_in(2.5);
    let children: Vec<_> = (0..2)
        .map(|i| {
            pod.ns
                .command(BIN)
                .args(["http", "load", &url, "-c", "8", "--rate", "400", "-d", "2"])
                .args([
                    "--cpus",
                    "1",
                    "--source",
                    "198.18.128.0/28",
                    "--source-count",
                    "8",
                ])
                .args(["--shards", "2", "--start-at", &at, "--json", "--quiet"])
                .env("JOB_COMPLETION_INDEX", i.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("load starts")
        })
        .collect();
    let mut files = Vec::new();
    let mut shards = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().expect("load ends");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let f = dir.file(&format!("load{i}.json"));
        std::fs::write(&f, &out.stdout).expect("report");
        files.push(f);
        let j: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(n(&j["pools"][0]["connections"]), 4, "half the connections");
        assert_eq!(j["pools"][0]["rate"].as_f64(), Some(200.0), "half the rate");
        assert_eq!(n(&j["shard"]["shard"]["index"]), i as u64);
        shards.push(j);
    }
    let (_, srv) = server.finish();
    let (code, m, err) = merge(&files, &[]);
    assert_eq!(code, Some(0), "{err}\n{m}");
    common::schema_valid("http-load", &m);
    assert_eq!(n(&m["pools"][0]["connections"]), 8);
    assert_eq!(m["pools"][0]["rate"].as_f64(), Some(400.0));
    assert_eq!(n(&m["unanswered"]), 0, "{m}");
    let answers = n(&m["total"]["responses"]);
    assert_eq!(
        answers,
        n(&srv["total"]["requests"]),
        "the server's count: {srv}"
    );
    assert_eq!(
        answers,
        shards
            .iter()
            .map(|j| n(&j["total"]["responses"]))
            .sum::<u64>()
    );
    let mut all = histogram(&shards[0]);
    all.add(histogram(&shards[1])).expect("adds");
    assert_eq!(histogram(&m), all, "the merged latency is every answer's");
    assert_eq!(n(&m["latency"]["count"]), all.len());
    // By status class too: every answer a 2xx, from both shards' class histograms.
    let class = &m["pools"][0]["by_class"];
    assert_eq!(class[0][0], "2xx", "{class}");
    assert_eq!(n(&class[0][1]["count"]), answers, "{class}");
}

/// Servers on hosts of their own: two pods each serve on all their CPUs (no --shard: the
/// network splits the traffic), a generator sends to each; the merged report's totals are
/// both servers' and both pods' interfaces' counts, its workers both servers' rows.
#[test]
fn serve_shards_on_their_own_hosts_merge_to_their_interfaces() {
    let Some(s) = star(2, 1) else { return };
    let dir = Dir::new("serve");
    // Both start together: the first's banner comes at the start, the second is spawned then.
    let at = start_in(2.0);
    let servers: Vec<_> = s
        .pods
        .iter()
        .map(|p| {
            let mut cmd = p.ns.command(BIN);
            cmd.args([
                "serve",
                "--bind",
                "0.0.0.0:9000",
                "--cpus",
                "0",
                "--mode",
                "sink",
            ])
            .args(["--start-at", &at, "--json", "--duration", "120"]);
            common::Running::start_with(cmd, "flowlane serve:")
        })
        .collect();
    let before: Vec<u64> = s.pods.iter().map(|p| rx_of(&p.ns, &p.gen_if)).collect();
    for i in 0..s.pods.len() {
        let to = format!("198.18.{}.1:9000", 10 + i);
        let out = s
            .dut
            .command(BIN)
            .args([
                "blast",
                "--to",
                &to,
                "--count",
                &(1000 * (i + 1)).to_string(),
            ])
            .args(["--rate", "5000", "--json", "--quiet"])
            .output()
            .expect("blast runs");
        common::blast_judged_ok(
            out.status.code(),
            serde_json::from_slice(&out.stdout).expect("JSON"),
        );
    }
    let mut files = Vec::new();
    for (i, srv) in servers.into_iter().enumerate() {
        let (code, j) = srv.finish();
        assert_eq!(code, Some(0), "{j}");
        assert_eq!(
            n(&j["shard"]["shard"]["count"]),
            1,
            "the whole of its host: {j}"
        );
        let f = dir.file(&format!("serve{i}.json"));
        std::fs::write(&f, j.to_string()).expect("report");
        files.push(f);
    }
    let (code, m, err) = merge(&files, &[]);
    assert_eq!(code, Some(0), "{err}\n{m}");
    common::schema_valid("serve", &m);
    let got: u64 = s
        .pods
        .iter()
        .zip(&before)
        .map(|(p, b)| rx_of(&p.ns, &p.gen_if) - b)
        .sum();
    assert_eq!(n(&m["total"]["rx_packets"]), 3000);
    assert_eq!(got, 3000, "the pods' interfaces");
    assert_eq!(m["workers"].as_array().map(Vec::len), Some(2));
}

/// Serve shards on one host split its receive CPUs: with --cpus 0,1, shard 0 serves CPU 0
/// and shard 1 CPU 1, their sockets in one SO_REUSEPORT group under one steering program.
/// Shard 1 is started first and waits until shard 0 has bound, so the group's order is the
/// whole list's; a datagram processed on CPU c (veth: the sender's CPU) reaches the worker on
/// c, whichever shard runs it — none mis-steered.
#[test]
fn serve_shards_on_one_host_split_its_cpus() {
    if !two_cpus("a shard on each") {
        return;
    }
    let Some(s) = star(1, 1) else { return };
    let dir = Dir::new("serve-cpus");
    let pod = &s.pods[0];
    let shard = |i: u32| {
        let mut cmd = s.dut.command(BIN);
        cmd.args([
            "serve",
            "--bind",
            "0.0.0.0:9000",
            "--cpus",
            "0,1",
            "--mode",
            "sink",
        ])
        .args(["--shard", &format!("{i}/2"), "--json", "--duration", "120"]);
        cmd
    };
    let bound = || -> usize {
        s.dut
            .run(|| {
                std::fs::read_to_string("/proc/thread-self/net/udp")
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains(":2328 "))
                    .count()
            })
            .expect("in the namespace")
    };
    let second = shard(1);
    let late = std::thread::spawn(move || common::Running::start_with(second, "flowlane serve:"));
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert_eq!(bound(), 0, "shard 1 waits for shard 0 to bind first");
    let first = common::Running::start_with(shard(0), "flowlane serve:");
    let second = late.join().expect("shard 1 starts");
    assert_eq!(bound(), 2);
    let before = rx_of(&s.dut, &pod.dut_if);
    two_threads(pod, &[]);
    let mut files = Vec::new();
    for (i, r) in [first, second].into_iter().enumerate() {
        let (code, j) = r.finish();
        assert_eq!(code, Some(0), "{j}");
        let w = &j["workers"];
        assert_eq!(w.as_array().map(Vec::len), Some(1), "{j}");
        assert_eq!(n(&w[0]["cpu"]), i as u64);
        // Thread i sent flows 2i and 2i+1, 1 000 each, processed on CPU i.
        assert_eq!(n(&j["total"]["rx_packets"]), 2000, "shard {i}: {j}");
        assert_eq!(n(&j["total"]["missteered"]), 0, "shard {i}: {j}");
        let f = dir.file(&format!("serve{i}.json"));
        std::fs::write(&f, j.to_string()).expect("report");
        files.push(f);
    }
    let (code, m, err) = merge(&files, &[]);
    assert_eq!(code, Some(0), "{err}\n{m}");
    assert_eq!(
        n(&m["total"]["rx_packets"]),
        rx_of(&s.dut, &pod.dut_if) - before
    );
}

/// What is not one run's shards is refused, with the reason (exit 2).
#[test]
fn merge_refuses_what_is_not_one_run() {
    let dir = Dir::new("refuse");
    let p = dir.file("bad.json");
    std::fs::write(&p, "{\"final\": 3}\nflowlane: a status line\n").expect("write");
    let (code, _, err) = merge(std::slice::from_ref(&p), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("bad.json") && err.contains("not a report"),
        "{err}"
    );
    // A report cut short.
    std::fs::write(&p, "{\"pktgen\": \"OK\", \"tx_pa").expect("write");
    let (code, _, err) = merge(std::slice::from_ref(&p), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a JSON report"), "{err}");
    let (code, _, err) = merge(&[Path::new("/nonexistent/r.json").into()], &[]);
    assert_eq!(code, Some(2), "{err}");
}
