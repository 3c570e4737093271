//! Help that helps: every subcommand's `--help` starts with its own one-line summary — the
//! same line its parent lists it with, different from its siblings' — and no help text
//! speaks in the project's internal words.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

fn help(path: &[&str]) -> String {
    let o = Command::new(BIN)
        .args(path)
        .arg("--help")
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(0), "{path:?} --help");
    String::from_utf8(o.stdout).expect("UTF-8")
}

/// The `Commands:` list of a help text: (name, summary with wrapped lines joined).
fn commands(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line == "Commands:" {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        if line.trim().is_empty() {
            break;
        }
        let body = &line[2..];
        if body.starts_with(' ') {
            let last = out.last_mut().expect("a continuation follows an entry");
            last.1.push(' ');
            last.1.push_str(body.trim());
        } else {
            let (name, summary) = body.split_once(' ').unwrap_or((body, ""));
            out.push((name.to_string(), summary.trim().to_string()));
        }
    }
    out.retain(|(n, _)| n != "help");
    out
}

fn check_tree(path: Vec<&str>, texts: &mut Vec<(String, String)>) {
    let text = help(&path);
    texts.push((path.join(" "), text.clone()));
    let subs = commands(&text);
    let mut seen = std::collections::HashSet::new();
    for (name, summary) in &subs {
        assert!(
            !summary.is_empty(),
            "`{name}` has no summary under {path:?}"
        );
        assert!(
            seen.insert(summary.clone()),
            "`{name}` shares its summary with a sibling: {summary}"
        );
        let mut sub = path.clone();
        sub.push(name);
        let own = help(&sub);
        let first = own.lines().next().unwrap_or_default();
        assert_eq!(
            first.trim(),
            summary,
            "`flowlane {}` --help must start with its own summary",
            sub.join(" ")
        );
        check_tree(sub, texts);
    }
}

#[test]
fn every_subcommand_help_starts_with_its_own_summary() {
    let mut texts = Vec::new();
    check_tree(Vec::new(), &mut texts);
    let top: Vec<String> = commands(&texts[0].1).into_iter().map(|c| c.0).collect();
    for c in [
        "hash", "pick", "rss", "serve", "blast", "sink", "bench", "lab", "route",
    ] {
        assert!(top.iter().any(|t| t == c), "{c} is listed: {top:?}");
    }
    // Each summary says what the command is about (blast's once showed the queue model's).
    for (cmd, word) in [
        ("blast", "Send"),
        ("sink", "Receive"),
        ("serve", "Serve"),
        ("lab", "lab"),
        ("route", "prefix"),
        ("rss", "RSS"),
    ] {
        let text = help(&[cmd]);
        let first = text.lines().next().unwrap_or_default();
        assert!(first.contains(word), "{cmd}: {first}");
    }
    for (path, text) in &texts {
        for internal in ["the seed", "seed's"] {
            assert!(
                !text.contains(internal),
                "`{path} --help` says `{internal}`"
            );
        }
        for (name, meaning) in [("flgen", "generator"), ("fldut", "DUT")] {
            for line in text.lines().filter(|l| l.contains(name)) {
                assert!(
                    line.contains(meaning),
                    "`{path} --help` names {name} without saying what it is: {line}"
                );
            }
        }
    }
}

#[test]
fn completions_and_the_man_page_come_from_the_same_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let o = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .expect("runs");
        assert_eq!(o.status.code(), Some(0), "{shell}");
        let text = String::from_utf8_lossy(&o.stdout);
        for word in ["blast", "bench", "max-loss", "step-secs"] {
            assert!(text.contains(word), "{shell} completions know {word}");
        }
    }
    // The bash script is valid bash.
    let script = std::env::temp_dir().join(format!("flowlane-compl-{}.bash", std::process::id()));
    let o = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .expect("runs");
    std::fs::write(&script, &o.stdout).expect("write");
    let st = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .expect("bash runs");
    let _ = std::fs::remove_file(&script);
    assert!(st.success(), "bash -n accepts the completion script");
    let o = Command::new(BIN).arg("man").output().expect("runs");
    assert_eq!(o.status.code(), Some(0));
    let man = String::from_utf8_lossy(&o.stdout);
    assert!(man.contains(".TH flowlane 1"), "{man}");
    for sub in ["flowlane-blast", "flowlane-bench", "flowlane-lab"] {
        assert!(man.contains(&format!(".TH {sub} 1")), "a page for {sub}");
    }
    assert!(man.contains("max\\-loss"), "options are in the page");
}

/// `flowlane … | head` ends quietly when the pipe closes, as C tools do (no panic).
#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    for args in [&["rss", "show", "--json"][..], &["completions", "bash"][..]] {
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("runs");
        // The reader is gone before the first write.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("ends");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// One vocabulary: the top-level help names all three forward modes; every command that
/// prints JSON takes `-J` (`lab status` did not); `http load` says that its `-t` and `-d` are
/// wrk's (threads and duration: `-t` is a duration everywhere else); `bench --size` says what
/// the FreeBSD experiment sent (510-byte datagrams), not that 60 bytes was its frame.
#[test]
fn one_vocabulary_across_commands() {
    let mut texts = Vec::new();
    check_tree(Vec::new(), &mut texts);
    let top = &texts[0].1;
    for mode in ["reflect", "bridge", "route"] {
        let line = top
            .lines()
            .find(|l| l.trim_start().starts_with("forward"))
            .expect("forward listed");
        assert!(line.contains(mode), "top help's forward line: {line}");
    }
    for (path, text) in &texts {
        if text.contains("--json ") || text.contains("--json\n") {
            assert!(
                text.contains("-J, --json"),
                "`{path}` takes --json without -J"
            );
        }
    }
    let load = help(&["http", "load"]);
    for flag in ["-t, --threads", "-d, --duration"] {
        let at = load.find(flag).expect(flag);
        assert!(
            load[at..].lines().take(3).any(|l| l.contains("wrk")),
            "{flag}: {load}"
        );
    }
    let bench = help(&["bench"]);
    assert!(bench.contains("510-byte datagrams"), "{bench}");
    assert!(!bench.contains("smallest frame of the FreeBSD experiment"));
}
