//! The packaging for Kubernetes (issue 56): the manifests under `deploy/` are valid against
//! Kubernetes' own schemas (offline, by `kubernetes-validate`, which carries them), every
//! flowlane flag they use is one the command has, and the image builds where a builder runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("deploy"))
        .expect("deploy/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    v.sort();
    assert!(v.len() >= 4, "the generator Job and the DUT side: {v:?}");
    v
}

/// `kubernetes-validate` (PyPI; not a Debian package), or why this test cannot run.
fn validator() -> bool {
    if flowlane_lab::have_program("kubernetes-validate") {
        return true;
    }
    let hint = "`kubernetes-validate` is not installed (pip install kubernetes-validate)";
    assert!(
        std::env::var_os("CI").is_none(),
        "{hint}: CI installs it, and this test must run there"
    );
    eprintln!("SKIP: {hint}; this test needs it");
    false
}

#[test]
fn the_manifests_are_valid_kubernetes() {
    if !validator() {
        return;
    }
    for m in manifests() {
        let out = Command::new("kubernetes-validate")
            .args(["--strict", "--quiet"])
            .arg(&m)
            .output()
            .expect("kubernetes-validate runs");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}{}",
            m.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The manifests as JSON (PyYAML, which kubernetes-validate brings along).
fn documents(path: &Path) -> Vec<Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(path)
        .output()
        .expect("python3 runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Every container runs a flowlane command whose flags exist; a generator is an Indexed Job
/// whose --shards is its completions; every pod has Guaranteed QoS and drops every
/// capability it does not add back.
#[test]
fn the_manifests_run_flowlane_as_it_is() {
    if !validator() {
        return;
    }
    for m in manifests() {
        for doc in documents(&m) {
            let spec = &doc["spec"]["template"]["spec"];
            assert_eq!(spec["hostNetwork"], true, "{}", m.display());
            for c in spec["containers"].as_array().expect("containers") {
                let args: Vec<&str> = c["args"]
                    .as_array()
                    .expect("args")
                    .iter()
                    .map(|a| a.as_str().expect("a string"))
                    .collect();
                // The subcommand: the words before the first flag or value (`http load URL`).
                let sub: Vec<&str> = args
                    .iter()
                    .take_while(|a| !a.starts_with('-') && !a.contains(':'))
                    .copied()
                    .collect();
                let help = Command::new(BIN)
                    .args(&sub)
                    .arg("--help")
                    .output()
                    .expect("flowlane runs");
                assert_eq!(help.status.code(), Some(0), "{sub:?}");
                let help = String::from_utf8_lossy(&help.stdout);
                for flag in args.iter().filter(|a| a.starts_with("--")) {
                    assert!(
                        help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
                        "{}: flowlane {} has no {flag}",
                        m.display(),
                        sub.join(" ")
                    );
                }
                let r = &c["resources"];
                assert_eq!(
                    r["requests"],
                    r["limits"],
                    "Guaranteed QoS: {}",
                    m.display()
                );
                assert_eq!(
                    c["securityContext"]["capabilities"]["drop"],
                    serde_json::json!(["ALL"]),
                    "{}",
                    m.display()
                );
                if doc["kind"] == "Job" {
                    assert_eq!(doc["spec"]["completionMode"], "Indexed");
                    let n = doc["spec"]["completions"].as_u64().expect("completions");
                    let at = args
                        .iter()
                        .position(|a| *a == "--shards")
                        .expect("--shards");
                    assert_eq!(args[at + 1], n.to_string(), "{}", m.display());
                    assert!(args.contains(&"--start-at"), "{}", m.display());
                }
            }
        }
    }
}

/// A container builder that answers: podman, buildah, or docker with its daemon.
fn builder() -> Result<&'static str, String> {
    for b in ["podman", "buildah", "docker"] {
        if !flowlane_lab::have_program(b) {
            continue;
        }
        let ok = Command::new(b)
            .arg("info")
            .output()
            .map(|o| o.status.success());
        match ok {
            Ok(true) => return Ok(b),
            _ => {
                return Err(format!(
                    "`{b} info` fails here (no daemon or no rights): no image can be built"
                ))
            }
        }
    }
    Err("no container builder (podman, buildah or docker) is installed".into())
}

/// The Containerfile names only what the repository has, and, where a builder runs, builds an
/// image whose flowlane answers.
#[test]
fn the_image_builds_where_a_builder_runs() {
    let file = std::fs::read_to_string(root().join("Containerfile")).expect("Containerfile");
    for line in file
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        for src in &words[1..words.len() - 1] {
            assert!(
                root().join(src).exists(),
                "{line}: {src} is not in the repository"
            );
        }
    }
    assert!(file.contains("ENTRYPOINT [\"/usr/local/bin/flowlane\"]"));
    let b = match builder() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("SKIP: {why}; the image's build is checked where one runs");
            return;
        }
    };
    let tag = format!("flowlane-test:{}", std::process::id());
    let build = |cmd: &mut Command| cmd.output().expect("builder runs");
    let out = if b == "buildah" {
        build(
            Command::new(b)
                .args(["bud", "-f", "Containerfile", "-t", &tag, "."])
                .current_dir(root()),
        )
    } else {
        build(
            Command::new(b)
                .args(["build", "-f", "Containerfile", "-t", &tag, "."])
                .current_dir(root()),
        )
    };
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runner = if b == "buildah" { "podman" } else { b };
    let run = Command::new(runner)
        .args(["run", "--rm", &tag, "--version"])
        .output()
        .expect("runs");
    let _ = Command::new(runner).args(["rmi", &tag]).output();
    assert!(String::from_utf8_lossy(&run.stdout).starts_with("flowlane "));
}
