//! What several test files share (each uses part of it).

#![allow(dead_code)]

use std::process::{Command, Output, Stdio};

use flowlane_lab::Netns;
use serde_json::Value;

/// Whether `program` (needed by the calling test only, not by flowlane) can run. Where it
/// cannot, says so with the package to install; with `CI` set that is a failure, not a skip,
/// so CI keeps proving what the test checks.
/// Runs `attempt` (given its number, 1..=`n`) until one passes every assertion in it, at most
/// `n` times: a bounded retry of a fully checked attempt, for the tests whose DUT needs CPU
/// time that a machine busier than one hog may not give it in every run (the suite-repeat
/// script with a hog and other work beside it saw each of them fail once in four). Every
/// failed attempt's panic is printed as it happens; the last one's is raised.
pub fn up_to<T>(n: usize, mut attempt: impl FnMut(usize) -> T) -> T {
    let mut k = 1;
    loop {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| attempt(k))) {
            Ok(v) => return v,
            Err(e) if k >= n => std::panic::resume_unwind(e),
            Err(_) => eprintln!("attempt {k} of {n} failed (its panic is above): again"),
        }
        k += 1;
    }
}

pub fn need_program(program: &str) -> bool {
    if flowlane_lab::have_program(program) {
        return true;
    }
    let hint = flowlane_lab::missing_hint(program);
    assert!(
        std::env::var_os("CI").is_none(),
        "{hint}: CI installs it, and this test must run there"
    );
    eprintln!("SKIP: {hint}; this test needs it");
    false
}

/// The rows of an `.hgrm` file (value, percentile, total count[, 1/(1-percentile)]), read and
/// removed.
pub fn hgrm_rows(path: &std::path::Path) -> Vec<Vec<f64>> {
    let text = std::fs::read_to_string(path).expect("the .hgrm file");
    let _ = std::fs::remove_file(path);
    text.lines()
        .skip(2)
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .map(|x| x.parse().expect("number"))
                .collect()
        })
        .collect()
}

/// A report's hardware-counter cost: cycles per packet where the machine has a PMU, or in
/// words why not — never a silent zero.
pub fn pmu_said(j: &Value) {
    let p = &j["pmu"];
    match p["unavailable"].as_str() {
        Some(why) => {
            assert!(why.contains("perf_event"), "{p}");
            assert!(p["cycles_per_packet"].is_null(), "{p}");
        }
        None => assert!(
            p["cycles_per_packet"].as_f64().is_some_and(|c| c > 0.0),
            "{p}"
        ),
    }
}

/// A blast summary checked against its exit code: 0 with no problem, or 1 whose only problems
/// are a requested rate not reached — a busy 2-core machine can hold a sender back, and blast
/// says so. One step's problems, or every step's of a sweep. Returns the summary.
pub fn blast_judged_ok(code: Option<i32>, j: Value) -> Value {
    let problems: Vec<Value> = match j["sweep"].as_array() {
        Some(steps) => steps
            .iter()
            .flat_map(|s| s["problems"].as_array().expect("problems").clone())
            .collect(),
        None => j["problems"].as_array().expect("problems").clone(),
    };
    match code {
        Some(0) => assert!(problems.is_empty(), "{j}"),
        Some(1) => assert!(
            !problems.is_empty()
                && problems
                    .iter()
                    .all(|p| p.as_str().is_some_and(|p| p.starts_with("requested"))),
            "blast failed: {j}"
        ),
        other => panic!("blast exit {other:?}: {j}"),
    }
    j
}

/// A running flowlane command, its banner seen; stopped with SIGINT by [`Running::finish`]
/// (killed if the test fails first). Its JSON summary is read from stdout.
pub struct Running {
    child: std::process::Child,
    rest: Option<std::thread::JoinHandle<String>>,
    /// `--json-stream` records read while it ran ([`Running::until_record`]), and the lines
    /// of its standard output, read by a thread as they come (so a full pipe never stalls it).
    read: Vec<String>,
    lines: Option<std::sync::mpsc::Receiver<String>>,
}

/// A running `flowlane forward`.
pub type Forwarder = Running;

impl Running {
    /// Starts `cmd` (a `flowlane forward …` command) with `--json --duration 120` added and
    /// waits for its banner.
    pub fn start(mut cmd: std::process::Command) -> Running {
        cmd.args(["--json", "--duration", "120"]);
        Running::start_with(cmd, "flowlane forward:")
    }

    /// Starts `cmd` as it is (it prints its banner, starting with `banner`, on stderr and its
    /// JSON summary on stdout) and waits for the banner.
    pub fn start_with(mut cmd: std::process::Command, banner: &str) -> Running {
        use std::io::{BufRead, BufReader};
        use std::process::Stdio;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("command starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        if !first.starts_with(banner) {
            let _ = child.kill();
            let rest: Vec<String> = lines.map_while(Result::ok).collect();
            panic!("expected `{banner}…`, got: {first}\n{}", rest.join("\n"));
        }
        let rest =
            std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"));
        Running {
            child,
            rest: Some(rest),
            read: Vec::new(),
            lines: None,
        }
    }

    /// Starts `cmd` (a `flowlane forward …` command) with `--json-stream --duration 120`
    /// added and waits for its banner; read its records with [`Running::until_record`], end it
    /// with [`Running::finish_stream`].
    pub fn start_stream(mut cmd: std::process::Command) -> Running {
        cmd.args(["--json-stream", "--duration", "120"]);
        Running::start_with(cmd, "flowlane forward:")
    }

    /// Reads `--json-stream` interval records as they come until `done` holds for one (its
    /// `interval` object is passed), at most `max` records and 30 s for each (one comes every
    /// interval, later while a native router rebuilds its table — about 0.5 s in a debug
    /// build on an idle host). Panics if the stream ends or the bound passes first.
    pub fn until_record(&mut self, max: usize, done: impl Fn(&Value) -> bool) -> Value {
        if self.lines.is_none() {
            let out = self.child.stdout.take().expect("stdout");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            self.lines = Some(rx);
        }
        let lines = self.lines.as_ref().expect("lines");
        for _ in 0..max {
            let line = lines
                .recv_timeout(std::time::Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("no record ({e}); read: {}", self.read.join("\n")));
            let r: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("a record ({e}): {line}"));
            self.read.push(line);
            if done(&r["interval"]) {
                return r["interval"].clone();
            }
        }
        panic!(
            "{max} records and no such one; the last: {:?}",
            self.read.last()
        );
    }

    /// SIGINT, then the exit code and the last `--json-stream` record's report, every
    /// record checked to parse and the last to be `{"final": …}`.
    pub fn finish_stream(mut self) -> (Option<i32>, Value) {
        let (code, text) = self.finish_text();
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a record ({e}): {l}")))
            .collect();
        let last = records.last().expect("records");
        assert!(last["final"].is_object(), "the last record: {last}");
        (code, last["final"].clone())
    }

    /// SIGINT, then the exit code and stdout.
    fn finish_text(&mut self) -> (Option<i32>, String) {
        use flowlane_io::os::Signal;
        flowlane_io::os::signal_process(self.child.id(), Signal::Interrupt).expect("SIGINT");
        let mut out: String = self.read.iter().map(|l| format!("{l}\n")).collect();
        if let Some(lines) = self.lines.take() {
            // The reader ends at the end of the output (bounded: the command is stopping).
            while let Ok(l) = lines.recv_timeout(std::time::Duration::from_secs(30)) {
                out.push_str(&l);
                out.push('\n');
            }
        } else if let Some(mut so) = self.child.stdout.take() {
            std::io::Read::read_to_string(&mut so, &mut out).expect("stdout");
        }
        (self.child.wait().expect("exits").code(), out)
    }

    /// SIGINT, then the exit code and the JSON summary.
    pub fn finish(mut self) -> (Option<i32>, Value) {
        let (code, out) = self.finish_text();
        let err = self.rest.take().map(|h| h.join().unwrap_or_default());
        let j = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("the JSON summary ({e}): {err:?}"));
        (code, j)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One namespace test at a time: they count frames exactly and share two CPUs.
pub static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// A line lab for one test, taken down however the test ends.
pub struct Line {
    pub name: String,
    pub gen: Netns,
    pub dut: Netns,
    pub sink: Netns,
    _guard: std::sync::MutexGuard<'static, ()>,
}

impl Line {
    /// A line lab (`lab up --topology line`, two queues, no steering unless `extra` says
    /// `--steer`) with `extra` options.
    pub fn up(tag: &str, extra: &[&str]) -> Option<Line> {
        if !flowlane_lab::can_create_namespaces() {
            eprintln!("SKIP: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) for network namespaces");
            return None;
        }
        let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let name = format!("flr{}{tag}", std::process::id() % 100_000);
        let _ = flowlane_lab::setup::down(&name);
        let out = Command::new(BIN)
            .args([
                "lab",
                "up",
                "--name",
                &name,
                "--topology",
                "line",
                "--queues",
                "2",
            ])
            .args(if extra.contains(&"--steer") {
                &[][..]
            } else {
                &["--steer", "none"][..]
            })
            .args(extra)
            .output()
            .expect("runs");
        let line = Line {
            gen: Netns::existing(&format!("{name}-gen")),
            dut: Netns::existing(&format!("{name}-dut")),
            sink: Netns::existing(&format!("{name}-sink")),
            name,
            _guard: guard,
        };
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(line)
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let _ = flowlane_lab::setup::down(&self.name);
    }
}

pub fn ok(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `cmd` with `input` on its standard input.
pub fn with_stdin(mut cmd: Command, input: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let text = input.to_string();
    let writer = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut stdin, text.as_bytes());
    });
    let out = child.wait_with_output().expect("runs");
    let _ = writer.join();
    out
}

/// A sink on the sink's end that stops after `count` flowlane frames (or 60 s).
pub fn sink_start(lab: &Line, count: u64) -> std::process::Child {
    sink_start_with(lab, count, &[])
}

/// [`sink_start`] with `extra` options.
pub fn sink_start_with(lab: &Line, count: u64, extra: &[&str]) -> std::process::Child {
    let c = count.to_string();
    let mut args = vec!["--port", "9000", "--count", &c];
    args.extend_from_slice(extra);
    sink_spawn(lab, &args)
}

/// A sink on the sink's end with `args` (any port unless they say `--port`), JSON, at most
/// 60 s, started once its banner says the ring is open.
pub fn sink_spawn(lab: &Line, args: &[&str]) -> std::process::Child {
    let mut all = vec!["--duration", "60"];
    all.extend_from_slice(args);
    sink_spawn_in(&lab.sink, "flsink", &all)
}

/// A JSON sink on `dev` in `ns` with `args`, started once its banner says the ring is open
/// (the rest of its standard error is read and dropped, so it never stalls on a full pipe).
pub fn sink_spawn_in(ns: &Netns, dev: &str, args: &[&str]) -> std::process::Child {
    use std::io::{BufRead, BufReader};
    let mut child = ns
        .command(BIN)
        .args(["sink", "--dev", dev, "--json"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sink starts");
    // Its banner: the ring is open.
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let banner = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(banner.starts_with("flowlane sink"), "{banner}");
    std::thread::spawn(move || lines.map_while(Result::ok).count());
    child
}

/// Asserts that a report is valid against its generated schema, `docs/NAME.schema.json`
/// (`tools::schema`: made from the report types, so what `--json` printed must fit it).
pub fn schema_valid(name: &str, j: &Value) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../docs/{name}.schema.json"));
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .expect("schema JSON");
    let v = jsonschema::validator_for(&schema).expect("a valid schema");
    let errors: Vec<String> = v
        .iter_errors(j)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{name} report against its schema: {errors:?}\n{j}"
    );
}

/// The sink got `count` datagrams, every one once and in order per flow.
pub fn sink_check(sink: std::process::Child, count: u64) {
    let out = sink.wait_with_output().expect("sink ends");
    let s: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    schema_valid("sink", &s);
    assert_eq!(s["flowlane_packets"].as_u64(), Some(count), "{s}");
    assert!(
        s["cpu_ns_per_packet"].as_f64().is_some_and(|x| x > 0.0),
        "the sink's CPU time per frame: {s}"
    );
    pmu_said(&s);
    for k in [
        "lost",
        "duplicates",
        "reordered",
        "malformed",
        "bad_checksum",
        "ring_drops",
    ] {
        assert_eq!(s[k].as_u64(), Some(0), "{k}: {s}");
    }
}

/// Waits until the lab's hosts stop talking on their own (IPv6 announces itself for a few
/// seconds after a link comes up or changes its MTU): every end's sent frames unchanged for
/// 1.5 s, within 15 s.
pub fn quiet(lab: &Line) {
    let sent = || {
        [&lab.gen, &lab.dut, &lab.sink]
            .iter()
            .map(|ns| {
                ns.dev()
                    .expect("counters")
                    .ifaces
                    .values()
                    .map(|c| c.tx_packets)
                    .sum::<u64>()
            })
            .sum::<u64>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let (mut last, mut since) = (sent(), std::time::Instant::now());
    while since.elapsed() < std::time::Duration::from_millis(1500) {
        assert!(
            std::time::Instant::now() < deadline,
            "the lab kept sending on its own"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = sent();
        if now != last {
            (last, since) = (now, std::time::Instant::now());
        }
    }
}

/// An XDP program that passes every frame, on `dev` in `ns` while the returned link lives:
/// veth then takes frames that XDP on its peer redirected or sent back (Linux 6.18 wants an
/// XDP program there; GRO alone is not enough).
pub fn xdp_pass(ns: &Netns, dev: &str) -> std::os::fd::OwnedFd {
    use flowlane_io::{bpf, ebpf::xdp, netdev::ifindex};
    let dev = dev.to_string();
    ns.run(move || {
        let prog = bpf::verdict_program(xdp::PASS, "fl_t_pass").expect("load");
        bpf::attach_xdp(&prog, ifindex(&dev).expect("ifindex"), 0).expect("attach")
    })
    .expect("in the namespace")
}

/// A free TCP port on loopback, as `127.0.0.1:PORT`, for `--metrics`.
pub fn free_local_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    format!("127.0.0.1:{port}")
}

/// The OpenMetrics text at `addr` read into (metric name with labels → value); `None` when
/// nothing answers there (e.g. the run has not started or has ended).
pub fn scrape(addr: &str) -> Option<std::collections::HashMap<String, f64>> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("ask");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(
        body.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF: {body}"
    );
    Some(
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

/// `forward --mode MODE` between the line lab's DUT ports, on every backend, while a socket
/// sender on the generator (checksum offload on, as veth's default is) sends 5 000 datagrams
/// to `to`: their UDP checksum holds only the pseudo header's sum, which the kernel would have
/// the device finish. A forwarder past the kernel must, or the sink's kernel drops every
/// datagram as corrupt — AF_PACKET is told which frames these are, AF_XDP and native XDP tell
/// them by the field. The sink (an independent parser) finds every checksum valid, and the
/// forwarder counts each completion.
pub fn offloaded_checksums_leave_complete(lab: &Line, mode: &str, to: &str) {
    lab.gen
        .set_offload("flgen", flowlane_lab::Offload::TxChecksum, true)
        .expect("SIOCETHTOOL");
    for backend in ["af-packet", "af-xdp", "xdp"] {
        // Native XDP redirects into veth, whose far ends then run XDP.
        let _pass = (backend == "xdp")
            .then(|| (xdp_pass(&lab.gen, "flgen"), xdp_pass(&lab.sink, "flsink")));
        quiet(lab);
        let mut cmd = lab.dut.command(BIN);
        cmd.args([
            "forward", "--mode", mode, "--dev", "fldut", "--dev", "fldut1",
        ])
        .args(["--backend", backend]);
        let fwd = Forwarder::start(cmd);
        let sink = sink_start(lab, 5_000);
        let out = lab
            .gen
            .command(BIN)
            .args(["blast", "--to", to, "--count", "5000", "--rate", "20k"])
            .args(["--flows", "2", "--json", "--quiet"])
            .output()
            .expect("blast runs");
        let b: Value = serde_json::from_slice(&out.stdout).expect("blast JSON");
        assert_eq!(b["tx_packets"], 5_000, "{b}");
        sink_check(sink, 5_000);
        quiet(lab);
        let (code, r) = fwd.finish();
        assert_eq!(code, Some(0), "{r}");
        assert_eq!(
            r["total"]["checksum_completed"], 5_000,
            "{mode} {backend}: {r}"
        );
    }
}
