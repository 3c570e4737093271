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
