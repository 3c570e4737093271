//! The RSS subcommands run as a user runs them: the real binary, real arguments, real pipes.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use flowlane_rss::{vectors, Key, QueueModel, Reta, Toeplitz, Tuple};
use serde_json::Value;

fn flowlane(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flowlane"))
        .args(args)
        .output()
        .expect("flowlane runs")
}

fn flowlane_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flowlane"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("flowlane runs");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().expect("flowlane finishes");
    writer.join().expect("writer thread");
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", stdout(o)))
}

fn endpoint(addr: std::net::IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(addr, port).to_string()
}

#[test]
fn hash_reproduces_all_sixteen_published_values() {
    for v in vectors::all() {
        let t = v.tuple;
        let (sp, dp) = t.ports().expect("vectors are 4-tuples");
        let o = flowlane(&[
            "hash",
            "--src",
            &endpoint(t.src(), sp),
            "--dst",
            &endpoint(t.dst(), dp),
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let j = json(&o);
        assert_eq!(j["hash"], format!("{:08x}", v.hash_4tuple), "{t}");
        assert_eq!(j["fragment_hash"], format!("{:08x}", v.hash_2tuple), "{t}");
        let o = flowlane(&[
            "hash",
            "--src",
            &t.src().to_string(),
            "--dst",
            &t.dst().to_string(),
        ]);
        assert!(stdout(&o).contains(&format!("hash      {:08x}", v.hash_2tuple)));
    }
}

#[test]
fn hash_reports_queue_of_the_reta() {
    let o = flowlane(&[
        "hash",
        "--src",
        "66.9.149.187:2794",
        "--dst",
        "161.142.100.80:1766",
        "--queues",
        "3",
        "--json",
    ]);
    let j = json(&o);
    // 0x51ccc178 & 127 = 120; 120 % 3 = 0.
    assert_eq!(j["index"], 120);
    assert_eq!(j["queue"], 0);
    assert_eq!(j["kind"], "ipv4-4tuple");
}

#[test]
fn hash_symmetric_modes_agree_both_ways() {
    for mode in ["xor", "sort"] {
        let a = json(&flowlane(&[
            "hash",
            "--src",
            "198.18.0.1:1000",
            "--dst",
            "198.19.0.2:8080",
            "--symmetric",
            mode,
            "--json",
        ]));
        let b = json(&flowlane(&[
            "hash",
            "--src",
            "198.19.0.2:8080",
            "--dst",
            "198.18.0.1:1000",
            "--symmetric",
            mode,
            "--json",
        ]));
        assert_eq!(a["hash"], b["hash"], "{mode}");
    }
}

#[test]
fn hash_bad_usage_exits_2_with_a_message() {
    let cases: &[&[&str]] = &[
        &["hash", "--src", "1.2.3.4", "--dst", "5.6.7.8:80"],
        &["hash", "--src", "1.2.3.4", "--dst", "2001:2::1"],
        &["hash", "--src", "1.2.3", "--dst", "5.6.7.8"],
        &[
            "hash", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--key", "6d5a",
        ],
        &[
            "hash", "--src", "1.2.3.4", "--dst", "5.6.7.8", "--queues", "0",
        ],
        &[
            "hash",
            "--src",
            "1.2.3.4",
            "--dst",
            "5.6.7.8",
            "--reta",
            "/nonexistent/reta",
        ],
        &[
            "hash",
            "--src",
            "1.2.3.4",
            "--dst",
            "5.6.7.8",
            "--reta-size",
            "100",
            "--queues",
            "2",
        ],
        &[
            "hash",
            "--src",
            "1.2.3.4",
            "--dst",
            "5.6.7.8",
            "--weights",
            "1,x",
        ],
        &["hash"],
    ];
    for args in cases {
        let o = flowlane(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty(), "{args:?} printed no message");
        assert!(!stderr(&o).contains("panicked"), "{args:?}");
    }
}

#[test]
fn hash_reta_file_in_ethtool_form() {
    let dir = std::env::temp_dir().join(format!("flowlane-reta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("reta.txt");
    let mut text = String::from("RX flow hash indirection table for veth0 with 4 RX ring(s):\n");
    for row in 0..16 {
        text.push_str(&format!("{:5}:", row * 8));
        for i in 0..8 {
            text.push_str(&format!("{:6}", 3 - (row * 8 + i) % 4));
        }
        text.push('\n');
    }
    text.push_str("RSS hash key:\n6d:5a\n");
    std::fs::write(&path, text).expect("write reta");
    let o = flowlane(&[
        "hash",
        "--src",
        "66.9.149.187:2794",
        "--dst",
        "161.142.100.80:1766",
        "--reta",
        path.to_str().expect("utf-8 path"),
        "--json",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    let j = json(&o);
    // index 120 -> 3 - 120 % 4 = 3
    assert_eq!(j["queue"], 3);
}

#[test]
fn stdin_mode_hashes_lines_and_reports_bad_ones() {
    let mut input = String::new();
    let mut want = Vec::new();
    for v in vectors::all() {
        let t = v.tuple;
        let (sp, dp) = t.ports().expect("4-tuple");
        input.push_str(&format!("{} {} {} {}\n", t.src(), t.dst(), sp, dp));
        want.push(format!("{:08x}", v.hash_4tuple));
        input.push_str(&format!("{}\t{}\n", t.src(), t.dst()));
        want.push(format!("{:08x}", v.hash_2tuple));
    }
    let o = flowlane_stdin(&["hash", "--stdin"], input.as_bytes());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().collect::<Vec<_>>(), want);

    let bad = b"1.2.3.4 5.6.7.8\nnot an address 5.6.7.8\n1.2.3.4 5.6.7.8 1\n\xff\xfe\n1.2.3.4 5.6.7.8 1 2\n";
    let o = flowlane_stdin(&["hash", "--stdin"], bad);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stdout(&o).lines().count(), 2);
    let err = stderr(&o);
    assert!(err.contains("line 2:"), "{err}");
    assert!(err.contains("line 3:"), "{err}");
    assert!(err.contains("line 4:"), "{err}");
    assert!(
        err.contains("3 malformed line(s) skipped, 2 hashed"),
        "{err}"
    );
}

#[test]
fn stdin_mode_handles_many_lines() {
    let n = 200_000u32;
    let mut input = String::with_capacity(n as usize * 40);
    for i in 0..n {
        input.push_str(&format!(
            "198.18.{}.{} 198.19.0.1 {} 8080\n",
            (i >> 8) & 255,
            i & 255,
            1024 + (i % 60000)
        ));
    }
    let start = std::time::Instant::now();
    let o = flowlane_stdin(&["hash", "--stdin", "--json"], input.as_bytes());
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<&str> = std::str::from_utf8(&o.stdout)
        .expect("utf-8")
        .lines()
        .collect();
    assert_eq!(lines.len(), n as usize);
    let last: Value = serde_json::from_str(lines[lines.len() - 1]).expect("JSON line");
    assert_eq!(last["line"], n);
    eprintln!("{n} lines in {:?}", start.elapsed());
}

#[test]
fn pick_returns_flows_that_land_where_they_say() {
    let o = flowlane(&[
        "pick",
        "--dst",
        "198.19.0.1:8080",
        "--src-ip",
        "198.18.0.1",
        "--queues",
        "4",
        "--per-queue",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let h = Toeplitz::new(&Key::MICROSOFT);
    let model = QueueModel::Reta(Reta::round_robin(128, 4).expect("valid"));
    let lines: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 12);
    for line in &lines {
        // queue=Q src=IP:PORT dst=IP:PORT hash=XXXXXXXX
        let f: Vec<&str> = line
            .split(' ')
            .map(|x| x.split_once('=').expect("k=v").1)
            .collect();
        let q: u32 = f[0].parse().expect("queue");
        let src: std::net::SocketAddr = f[1].parse().expect("src");
        let dst: std::net::SocketAddr = f[2].parse().expect("dst");
        let t = Tuple::from_socket_addrs(src, dst).expect("same family");
        let hash = h.hash(&t);
        assert_eq!(format!("{hash:08x}"), f[3], "{line}");
        assert_eq!(model.queue(hash), q, "{line}");
    }
}

#[test]
fn pick_json_ipv6_and_all() {
    let o = flowlane(&[
        "pick",
        "--dst",
        "[2001:2::2]:53",
        "--src-ip",
        "2001:2::1",
        "--src-ports",
        "40000-40999",
        "--queues",
        "8",
        "--all",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["method"], "gf2");
    let total: u64 = j["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .map(|q| q["tuples"].as_array().expect("tuples").len() as u64)
        .sum();
    assert_eq!(total, 1000);
}

#[test]
fn pick_reports_unreachable_queues() {
    let o = flowlane(&[
        "pick",
        "--dst",
        "198.19.0.1:8080",
        "--src-ip",
        "198.18.0.1",
        "--src-ports",
        "7777",
        "--queues",
        "4",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let j = json(&o);
    let incomplete = j["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .filter(|q| q["complete"] == false && q["available"] == 0)
        .count();
    assert_eq!(incomplete, 3);
    assert!(stderr(&o).contains("widen --src-ports"));
    for args in [
        &["pick", "--dst", "198.19.0.1", "--src-ip", "198.18.0.1"][..],
        &["pick", "--dst", "198.19.0.1:1", "--src-ip", "2001:2::1"][..],
        &[
            "pick",
            "--dst",
            "198.19.0.1:1",
            "--src-ip",
            "198.18.0.1",
            "--src-ports",
            "9-1",
        ][..],
        &[
            "pick",
            "--dst",
            "198.19.0.1:1",
            "--src-ip",
            "198.18.0.1",
            "--queues",
            "2",
            "--only",
            "5",
        ][..],
    ] {
        let o = flowlane(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn rss_show_explains_keys() {
    let o = flowlane(&[
        "rss", "show", "--queues", "4", "--cpus", "4", "--sample", "4096", "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["hash_bits_ipv4_4tuple"], 32);
    assert_eq!(j["period_bits"], Value::Null);
    assert_eq!(j["freebsd"]["buckets"], 8);
    assert_eq!(j["reta"].as_array().expect("reta").len(), 128);
    assert_eq!(j["spread"]["flows"], 4096);
    let sym = json(&flowlane(&[
        "rss",
        "show",
        "--key",
        "symmetric",
        "--queues",
        "4",
        "--sample",
        "64",
        "--json",
    ]));
    assert_eq!(sym["period_bits"], 16);
    assert_eq!(sym["hash_bits_ipv4_4tuple"], 16);
    let text = stdout(&flowlane(&["rss", "show", "--queues", "2"]));
    assert!(text.contains("ethtool    6d:5a:56:da"), "{text}");
    assert!(text.contains("RETA (128 entries"), "{text}");
}

#[test]
fn keygen_makes_valid_keys() {
    for len in ["40", "52"] {
        let o = flowlane(&["rss", "keygen", "--len", len]);
        assert!(o.status.success());
        let k = Key::parse(stdout(&o).trim()).expect("valid key");
        assert_eq!(k.len().to_string(), len);
        assert_eq!(k.entropy_bits(36), 32);
    }
    assert_eq!(
        flowlane(&["rss", "keygen", "--len", "39"]).status.code(),
        Some(2)
    );
}
