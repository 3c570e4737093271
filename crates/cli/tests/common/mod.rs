//! What several test files share (each uses part of it).

#![allow(dead_code)]

use serde_json::Value;

/// Whether `program` (needed by the calling test only, not by flowlane) can run. Where it
/// cannot, says so with the package to install; with `CI` set that is a failure, not a skip,
/// so CI keeps proving what the test checks.
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

/// A running `flowlane forward`, banner seen; stopped with SIGINT by [`Forwarder::finish`]
/// (killed if the test fails first).
pub struct Forwarder {
    child: std::process::Child,
    rest: Option<std::thread::JoinHandle<String>>,
}

impl Forwarder {
    /// Starts `cmd` (a `flowlane forward …` command) with `--json --duration 120` added and
    /// waits for its banner.
    pub fn start(mut cmd: std::process::Command) -> Forwarder {
        use std::io::{BufRead, BufReader};
        use std::process::Stdio;
        let mut child = cmd
            .args(["--json", "--duration", "120"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("forward starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let banner = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(banner.starts_with("flowlane forward:"), "{banner}");
        let rest =
            std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"));
        Forwarder {
            child,
            rest: Some(rest),
        }
    }

    /// SIGINT, then the exit code and the JSON summary.
    pub fn finish(mut self) -> (Option<i32>, Value) {
        use flowlane_io::os::Signal;
        flowlane_io::os::signal_process(self.child.id(), Signal::Interrupt).expect("SIGINT");
        let mut out = String::new();
        if let Some(mut so) = self.child.stdout.take() {
            std::io::Read::read_to_string(&mut so, &mut out).expect("stdout");
        }
        let code = self.child.wait().expect("exits").code();
        let err = self.rest.take().map(|h| h.join().unwrap_or_default());
        let j = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("forward's JSON summary ({e}): {err:?}"));
        (code, j)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
