//! `flowlane route gen|lookup|bench` as a user runs them: real binary, real files.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

mod common;

fn flowlane(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowlane"))
        .args(args)
        .output()
        .expect("flowlane runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A file in a directory of its own, removed when the test ends.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, contents: &[u8]) -> TempFile {
        let dir =
            std::env::temp_dir().join(format!("flowlane-route-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("test input is valid");
        let p = dir.join(name);
        std::fs::write(&p, contents).expect("test input is valid");
        TempFile(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().expect("test input is valid")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(d) = self.0.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[test]
fn gen_is_deterministic_and_loadable() {
    let a = flowlane(&[
        "route", "gen", "--v4", "5000", "--v6", "1000", "--seed", "3",
    ]);
    assert!(a.status.success(), "{}", text(&a.stderr));
    let b = flowlane(&[
        "route", "gen", "--v4", "5000", "--v6", "1000", "--seed", "3",
    ]);
    assert_eq!(a.stdout, b.stdout, "same seed, same table");
    let c = flowlane(&[
        "route", "gen", "--v4", "5000", "--v6", "1000", "--seed", "4",
    ]);
    assert_ne!(a.stdout, c.stdout);
    let t = flowlane_lpm::load::parse(&text(&a.stdout), flowlane_lpm::load::Format::Plain)
        .expect("test input is valid");
    assert_eq!((t.v4.len(), t.v6.len()), (5000, 1000));
    let none = flowlane(&["route", "gen"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(
        text(&none.stderr).contains("--v4"),
        "{}",
        text(&none.stderr)
    );
}

#[test]
fn lookup_plain_and_ip_route_tables() {
    let plain = TempFile::new(
        "plain.txt",
        b"0.0.0.0/0 9\n198.18.0.0/15 1\n198.18.4.0/24 2\n2001:2::/48 3\n",
    );
    let o = flowlane(&[
        "route",
        "lookup",
        "--table",
        plain.path(),
        "198.18.4.7",
        "198.19.0.1",
        "203.0.113.5",
        "2001:2::1",
        "2001:3::1",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].contains("198.18.4.0/24") && lines[0].ends_with("next hop 2"),
        "{out}"
    );
    assert!(
        lines[1].contains("198.18.0.0/15") && lines[1].ends_with("next hop 1"),
        "{out}"
    );
    assert!(
        lines[2].contains("0.0.0.0/0") && lines[2].ends_with("next hop 9"),
        "default route: {out}"
    );
    assert!(
        lines[3].contains("2001:2::/48") && lines[3].ends_with("next hop 3"),
        "{out}"
    );
    assert!(lines[4].ends_with("no route"), "{out}");

    let ipr = TempFile::new(
        "ipr.txt",
        b"default via 198.18.0.1 dev fl0 proto static metric 100\n198.18.0.0/24 dev fl0 proto kernel scope link src 198.18.0.2\nblackhole 198.18.9.0/24\n",
    );
    let o = flowlane(&[
        "route",
        "lookup",
        "--table",
        ipr.path(),
        "--json",
        "198.18.0.77",
        "198.18.9.1",
        "198.51.100.1",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("test input is valid");
    common::schema_valid("route-lookup", &v);
    let l = &v["lookups"];
    assert_eq!(l[0]["prefix"], "198.18.0.0/24");
    assert_eq!(l[0]["next_hop_name"], "dev fl0");
    assert_eq!(l[1]["next_hop_name"], "blackhole");
    assert_eq!(l[2]["prefix"], "0.0.0.0/0");
    assert_eq!(l[2]["next_hop_name"], "via 198.18.0.1 dev fl0");
    assert_eq!(
        v["legend"].as_array().expect("test input is valid").len(),
        3
    );
}

#[test]
fn bad_input_is_a_usage_error_with_the_line() {
    let bad = TempFile::new("bad.txt", b"198.18.0.0/15 1\n198.18.0.0/40 2\n");
    let o = flowlane(&["route", "lookup", "--table", bad.path(), "198.18.0.1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("line 2: bad prefix length"),
        "{}",
        text(&o.stderr)
    );
    let good = TempFile::new("good.txt", b"198.18.0.0/15 1\n");
    let o = flowlane(&["route", "lookup", "--table", good.path(), "198.18.0.999"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("not an IPv4 or IPv6 address"));
    let o = flowlane(&[
        "route",
        "lookup",
        "--table",
        "/nonexistent/flowlane-table",
        "198.18.0.1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--table /nonexistent/flowlane-table: cannot read it"),
        "{}",
        text(&o.stderr)
    );
}

/// `route bench --json` on `table` (seconds per measurement, addresses per mode): it must
/// succeed and print JSON.
fn bench_json(table: &TempFile, seconds: &str, addresses: &str) -> Value {
    let o = flowlane(&[
        "route",
        "bench",
        "--table",
        table.path(),
        "--json",
        "--seconds",
        seconds,
        "--addresses",
        addresses,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let j = serde_json::from_slice(&o.stdout).expect("bench prints JSON");
    common::schema_valid("route-bench", &j);
    j
}

#[test]
fn bench_reports_every_mode_and_checks_every_lookup() {
    let g = flowlane(&[
        "route", "gen", "--v4", "20000", "--v6", "4000", "--seed", "5",
    ]);
    let table = TempFile::new("bench.txt", &g.stdout);
    let v = bench_json(&table, "0.02", "4096");
    for (fam, n) in [("ipv4", 20000), ("ipv6", 4000)] {
        let f = &v[fam];
        assert_eq!(f["prefixes"], n);
        assert_eq!(f["mismatches"], 0);
        assert_eq!(f["update_mismatches"], 0);
        assert_eq!(f["update_checked"], 65536);
        assert_eq!(f["checked"], 4 * 4096);
        assert!(
            f["fib_bytes"].as_u64().expect("test input is valid") >= 1 << 20,
            "at least the direct array"
        );
        assert!(f["inserts_per_s"].as_f64().expect("test input is valid") > 0.0);
        assert!(
            f["burst_deletes_per_s"]
                .as_f64()
                .expect("test input is valid")
                > 0.0
        );
        for mode in ["uniform", "inside", "working_set"] {
            assert!(
                f["lookups"][mode]["batch_lps"]
                    .as_f64()
                    .expect("test input is valid")
                    > 0.0,
                "{fam} {mode}"
            );
            assert!(
                f["lookups"][mode]["reference_batch_lps"]
                    .as_f64()
                    .expect("test input is valid")
                    > 0.0
            );
        }
        assert!(
            f["lookups"]["dependent"]["single_lps"]
                .as_f64()
                .expect("test input is valid")
                > 0.0
        );
    }
    assert_eq!(v["ipv4"]["reference"], "DIR-24-8");
    // The binary says whether it was built with the POPCNT baseline, as this test was (same
    // flags): a plain `cargo install` away from the repository would say false.
    assert_eq!(
        v["ipv4"]["build_popcnt"],
        cfg!(target_feature = "popcnt"),
        "{}",
        v["ipv4"]
    );
    // The THP settings printed beside the huge-page figure are the kernel's: each is the
    // bracketed choice in its sysfs file.
    let sysfs =
        |f: &str| std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{f}"));
    for (key, file) in [("thp_enabled", "enabled"), ("thp_defrag", "defrag")] {
        match (sysfs(file), v["ipv4"][key].as_str()) {
            (Ok(text), Some(choice)) => {
                assert!(
                    text.contains(&format!("[{choice}]")),
                    "{key} {choice}: {text}"
                )
            }
            (Err(_), got) => assert_eq!(got, None, "{key} printed without sysfs"),
            (Ok(text), None) => panic!("{key} missing; sysfs says {text}"),
        }
    }
    // The binary's allocator advises large blocks onto huge pages: DIR-24-8's 64 MiB table
    // is one, so wherever the kernel honours that advice (the condition the allocator's
    // own test uses), some of the process is on them, as smaps_rollup counts it.
    let huge = v["ipv4"]["process_huge_page_bytes"].as_u64();
    let honoured = flowlane_io::huge::Thp::read().is_some_and(|t| t.advice_is_honoured());
    assert_eq!(v["ipv4"]["thp_advice_honoured"], honoured, "{}", v["ipv4"]);
    if honoured {
        assert!(
            huge.expect("smaps_rollup is readable") >= 2 << 20,
            "{huge:?}"
        );
    }
}

/// The structure sizes `route bench --json` prints, against a table small enough to work the
/// structure out by hand (the same shapes the crate's stats test checks).
#[test]
fn bench_prints_the_structure_it_built() {
    let table = TempFile::new(
        "tiny.txt",
        b"198.18.1.0/24 5\n2001:2::/48 1\n2001:2:0:1::/64 2\n2001:4000::/48 1\n2001:4000:1::/48 2\n2001:4000:2::/48 1\n",
    );
    let v = bench_json(&table, "0.01", "1024");
    let field = |fam: &str, k: &str| v[fam][k].as_u64().expect("a number");
    // IPv4: the /24 alone in its /18 is a flat block (leaf vector + one word of 3 codes, after
    // the arena's unused word 0); no nodes, no leaves.
    for (k, want) in [
        ("fib_flat_nodes", 1),
        ("fib_flat_bytes", 8 + 16),
        ("fib_nodes", 0),
        ("fib_prefix_nodes", 0),
        ("fib_leaves", 0),
    ] {
        assert_eq!(field("ipv4", k), want, "ipv4 {k}");
    }
    // IPv6: the /48 and the /64 in it are one prefix node below the slot's root node, whose
    // one run of "no route" is in the leaf array. In another slot, three /48s: its root, a
    // node at /24 (one leaf run each) and the /24 node's one child at /30 as a range line.
    // Both roots are expanded (64 entries each, for lookups; the nodes stay for updates).
    for (k, want) in [
        ("fib_flat_nodes", 0),
        ("fib_expanded_roots", 2),
        ("fib_nodes", 4),
        ("fib_prefix_nodes", 1),
        ("fib_inline_nodes", 0),
        ("fib_leaves", 3),
        ("fib_lines", 1),
        ("fib_escapes", 0),
    ] {
        assert_eq!(field("ipv6", k), want, "ipv6 {k}");
    }
    // Bytes: the 1 MiB direct array, 24 per node, 2 per leaf code, the flat arena, 64 per
    // line, 4 per distinct next hop in the code table (IPv4: none and 5; IPv6: none, 1 and
    // 2), and 64 entries and a root index of 4 bytes per expanded root.
    assert_eq!(field("ipv4", "fib_bytes"), (1 << 20) + 24 + 2 * 4);
    assert_eq!(
        field("ipv6", "fib_bytes"),
        (1 << 20) + 4 * 24 + 3 * 2 + 8 + 64 + 3 * 4 + 2 * (64 + 1) * 4
    );
    for fam in ["ipv4", "ipv6"] {
        assert_eq!(v[fam]["mismatches"], 0, "{fam}");
    }
}
