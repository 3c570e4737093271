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
