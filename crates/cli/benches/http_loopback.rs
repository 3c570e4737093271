//! `flowlane http load` and `http serve` against the peers people use, on loopback in a private
//! namespace, one client core (CPU 0) and one server core (CPU 1), keep-alive.
//!
//! 1. Clients: `http load`, wrk, oha and h2load (HTTP/1.1) against nginx with one worker, for
//!    64 B, 1 KiB and 64 KiB responses at 10, 100 and 1 000 connections, alternated in the same
//!    run (three rounds, each starting with the next tool; the median is shown). Per client: requests/s,
//!    requests per second of client CPU time, and peak memory (from `wait4`). `http load` runs
//!    twice: as shipped (it sleeps when idle, drops large bodies whole) and with the settings
//!    that trade client CPU for the server's throughput (`flowlane-tp`: FLOWLANE_BENCH_TUNED,
//!    default `--busy-poll 50us --read-size 4k`), and a third time with batch waits, which
//!    trade latency for answers per client CPU second (`flowlane-bw`: FLOWLANE_BENCH_BATCH,
//!    default `--batch-wait 1ms`), each compared with the best peer.
//! 2. Servers: `http serve` against nginx under the same client — wrk, and `http load` with the
//!    throughput settings — same grid.
//! 3. Constant rate: `http load -R 5000` against nginx, the rate held and p50.
//!
//! Run: `cargo bench -p flowlane --bench http_loopback` (root; FLOWLANE_BENCH_SECS sets each
//! measurement's length, default 3; FLOWLANE_BENCH_QUICK=1 runs one row per part;
//! FLOWLANE_BENCH_GRID=64:100,64k:1000 runs only those rows; FLOWLANE_BENCH_ROUNDS=5 runs each
//! tool five times a row). A peer that
//! is not installed is left out with a note (wrk, nginx-light, nghttp2-client for h2load;
//! `cargo install oha`).
//!
//! FLOWLANE_BENCH_TWO_HOSTS=1 runs the same parts as if client and server were two hosts: the
//! clients in a namespace of their own, joined to the servers' by a veth pair (MTU 65 535, as
//! loopback's, so the segments are the same), and each end's receive processing steered to
//! its own side's CPU (Receive Packet Steering). On loopback the sending CPU runs the
//! receiver's TCP stack, so a client's and a server's kernel work mix on both cores; here
//! each host's CPU receives its own packets, as across a network (BENCHMARKS.md). There a
//! client's packets are received on its CPU even while it sleeps, charged to no process, so
//! requests per client CPU second count that CPU's busy time (`/proc/stat`), not `wait4`'s.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{secs, BIN};
use flowlane_io::os;
use flowlane_lab::Netns;

const ADDR: &str = "198.18.0.1";
const CLIENT_CPU: usize = 0;
const SERVER_CPU: usize = 1;
/// Runs per tool and row (FLOWLANE_BENCH_ROUNDS, default 3); the median is shown.
fn rounds() -> usize {
    std::env::var("FLOWLANE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(3)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One client run: requests/s, CPU seconds, peak RSS (KiB).
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    rps: f64,
    cpu_s: f64,
    /// The user part of `cpu_s`.
    user_s: f64,
    /// How long the client's CPU was busy meanwhile (`/proc/stat`): the process's time and
    /// the interrupt and softirq work done there while it slept — where its packets are
    /// received in the two-hosts mode.
    core_s: f64,
    rss_kib: u64,
}

/// Spawns `cmd` from a thread in `ns` pinned to `cpu` (the child inherits both).
fn spawn_on(ns: &Netns, cpu: usize, mut cmd: Command) -> std::process::Child {
    ns.run(move || {
        os::pin_current_thread(cpu).expect("pin");
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    })
    .expect("in the namespace")
}

/// Runs a client to its end; its stdout and what it used (reaped by `wait4`, which std's
/// `wait` cannot report).
#[allow(clippy::zombie_processes)]
fn run_client(ns: &Netns, cmd: Command) -> (String, os::ChildUsage) {
    let mut child = spawn_on(ns, CLIENT_CPU, cmd);
    let mut out = String::new();
    if let Some(mut so) = child.stdout.take() {
        std::io::Read::read_to_string(&mut so, &mut out).expect("stdout");
    }
    let usage = os::wait_child(child.id()).expect("wait4");
    (out, usage)
}

fn number_after(text: &str, key: &str) -> Option<f64> {
    let i = text.find(key)? + key.len();
    text[i..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
}

fn client(ns: &Netns, tool: &str, url: &str, conns: usize, secs: f64) -> Option<Run> {
    let c = conns.to_string();
    let d = format!("{}", secs.round() as u64);
    let mut cmd;
    match tool {
        "flowlane" | "flowlane-tp" | "flowlane-bw" => {
            cmd = Command::new(BIN);
            cmd.args(["http", "load", url, "-c", &c, "-d", &d, "--cpus", "0"])
                .args([
                    "--connect-window",
                    "1000",
                    "--drain",
                    "0",
                    "--json",
                    "--quiet",
                ]);
            if tool == "flowlane-tp" {
                cmd.args(tuned().split_whitespace());
            }
            if tool == "flowlane-bw" {
                cmd.args(batched().split_whitespace());
            }
        }
        "wrk" => {
            cmd = Command::new("wrk");
            cmd.args(["-t1", "-c", &c, "-d", &format!("{d}s"), url]);
        }
        "oha" => {
            cmd = Command::new("oha");
            cmd.args(["-z", &format!("{d}s"), "-c", &c, "--no-tui", url]);
        }
        "h2load" => {
            cmd = Command::new("h2load");
            cmd.args(["--h1", "-t1", "-c", &c, "-D", &d, url]);
        }
        _ => return None,
    }
    let busy = || flowlane_lab::counters::busy_jiffies(&[CLIENT_CPU]).unwrap_or(0);
    let b0 = busy();
    let (out, u) = run_client(ns, cmd);
    let core_s = busy().saturating_sub(b0) as f64 / os::clock_ticks_per_s() as f64;
    let rps = match tool {
        "flowlane" | "flowlane-tp" | "flowlane-bw" => {
            serde_json::from_str::<serde_json::Value>(&out)
                .ok()
                .and_then(|j| {
                    (j["errors"].as_u64() == Some(0)).then(|| j["requests_per_s"].as_f64())?
                })
        }
        "wrk" => number_after(&out, "Requests/sec:"),
        "oha" => number_after(&out, "Requests/sec:"),
        "h2load" => number_after(&out, " in ").and_then(|_| {
            let i = out.find(" req/s")?;
            out[..i].rsplit(' ').next()?.parse().ok()
        }),
        _ => None,
    };
    let Some(rps) = rps else {
        eprintln!("{tool}: no figure in its output:\n{out}");
        return None;
    };
    Some(Run {
        rps,
        cpu_s: u.cpu_ns as f64 / 1e9,
        user_s: u.user_ns as f64 / 1e9,
        core_s,
        rss_kib: u.max_rss_kib,
    })
}

fn nginx_conf(dir: &std::path::Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "daemon off; master_process off; worker_processes 1; user root; pid {d}/nginx.pid;
error_log {d}/error.log;
worker_rlimit_nofile 20000;
events {{ worker_connections 19000; }}
http {{
  access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000000;
  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};
  server {{ listen {ADDR}:{port} reuseport backlog=4096; root {d}/www; }}
}}
"
    )
}

struct Child(std::process::Child);

/// CPU seconds (user + system) process `pid` has used so far (`/proc/PID/stat`, in clock
/// ticks: USER_HZ).
fn proc_cpu_s(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| {
            // The fields after the command name: state is the first, utime the 12th.
            let rest = t.rsplit_once(") ")?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .map_or(0.0, |ticks| ticks / os::clock_ticks_per_s() as f64)
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_listening(ns: &Netns, port: u16) {
    ns.run(|| {
        for _ in 0..200 {
            if std::net::TcpStream::connect((ADDR, port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("nothing listens on {ADDR}:{port}");
    })
    .expect("in the namespace");
}

fn have(p: &str) -> bool {
    let ok = flowlane_lab::have_program(p);
    if !ok {
        eprintln!("note: {} — left out", flowlane_lab::missing_hint(p));
    }
    ok
}

/// The flags of the second `http load` column (the throughput settings).
fn tuned() -> String {
    std::env::var("FLOWLANE_BENCH_TUNED")
        .unwrap_or_else(|_| "--busy-poll 50us --read-size 4k".into())
}

/// The flags of the third `http load` column (batch waits).
fn batched() -> String {
    std::env::var("FLOWLANE_BENCH_BATCH").unwrap_or_else(|_| "--batch-wait 1ms".into())
}

/// Whether the person running the bench asked for this row (FLOWLANE_BENCH_GRID).
fn wanted(size: &str, conns: usize) -> bool {
    match std::env::var("FLOWLANE_BENCH_GRID") {
        Ok(g) => g.split(',').any(|r| r.trim() == format!("{size}:{conns}")),
        Err(_) => true,
    }
}

/// FLOWLANE_BENCH_TWO_HOSTS: a client namespace joined to `servers` by a veth pair with the
/// servers' address (`ADDR`) at their end; each end hands its received packets to its own
/// side's CPU (RPS), so neither side's CPU runs the other's receive path. Returns the
/// clients' namespace.
fn two_hosts_setup(servers: &Netns) -> Netns {
    let clients = Netns::create("flhc").expect("namespace");
    let tag = std::process::id() % 100_000;
    let (s_if, c_if) = (format!("flhs{tag}"), format!("flhc{tag}"));
    flowlane_lab::veth_pair(
        servers,
        &s_if,
        &format!("{ADDR}/24"),
        &clients,
        &c_if,
        "198.18.0.2/24",
        1,
    )
    .expect("veth pair");
    for (n, ifname, cpu) in [(servers, &s_if, SERVER_CPU), (&clients, &c_if, CLIENT_CPU)] {
        n.ip(&["link", "set", ifname, "mtu", "65535"]).expect("mtu");
        n.write_sys(
            &format!("/sys/class/net/{ifname}/queues/rx-0/rps_cpus"),
            &format!("{:x}", 1u64 << cpu),
        )
        .expect("rps_cpus");
    }
    clients
}

fn main() {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("http_loopback: needs root (namespaces); skipped");
        return;
    }
    if !have("nginx") {
        return;
    }
    let secs = secs();
    let quick = std::env::var_os("FLOWLANE_BENCH_QUICK").is_some();
    let ns = Netns::create("flhb").expect("namespace");
    let two_hosts = std::env::var_os("FLOWLANE_BENCH_TWO_HOSTS").is_some();
    let client_host = if two_hosts {
        Some(two_hosts_setup(&ns))
    } else {
        ns.ip(&["addr", "add", &format!("{ADDR}/32"), "dev", "lo"])
            .expect("address");
        None
    };
    // Where the clients run (the servers run in `ns`).
    let cns = client_host.as_ref().unwrap_or(&ns);
    let dir = std::env::temp_dir().join(format!("flhb-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("www")).expect("dir");
    let sizes: [(&str, usize); 3] = [("64", 64), ("1k", 1024), ("64k", 65536)];
    for (name, n) in sizes {
        std::fs::write(dir.join("www").join(name), flowlane_wire::http::body(n)).expect("file");
    }
    std::fs::write(dir.join("nginx.conf"), nginx_conf(&dir, 8081)).expect("conf");
    let mut nginx_cmd = Command::new("nginx");
    nginx_cmd.args([
        "-p",
        &dir.display().to_string(),
        "-c",
        &format!("{}/nginx.conf", dir.display()),
    ]);
    let nginx = Child(spawn_on(&ns, SERVER_CPU, nginx_cmd));
    wait_listening(cns, 8081);

    let ours_t = |t: &str| t.starts_with("flowlane");
    let tools: Vec<&str> = [
        "flowlane",
        "flowlane-tp",
        "flowlane-bw",
        "wrk",
        "oha",
        "h2load",
    ]
    .into_iter()
    .filter(|t| ours_t(t) || have(t))
    .collect();
    let grid: Vec<(&str, usize)> = if quick {
        vec![("64", 100)]
    } else {
        sizes
            .iter()
            .flat_map(|(s, _)| [10usize, 100, 1000].map(move |c| (*s, c)))
            .filter(|(s, c)| wanted(s, *c))
            .collect()
    };
    println!(
        "flowlane-tp: http load {} (spends client CPU to raise the server's throughput)",
        tuned()
    );
    println!(
        "flowlane-bw: http load {} (sleeps on purpose so each wake finds a batch of answers)",
        batched()
    );
    if two_hosts {
        println!("two hosts: clients in a namespace of their own, a veth pair (MTU 65535) to the servers', each end's receive processing on its own side's CPU (RPS)");
    }
    println!("part 1: clients against nginx (1 worker, CPU {SERVER_CPU}); client on CPU {CLIENT_CPU}; {secs} s per run, {} rounds, median", rounds());
    println!(
        "{:>5} {:>6} | {}| {:>9} {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9}",
        "size",
        "conns",
        tools
            .iter()
            .map(|t| format!("{t:>11} req/s "))
            .collect::<String>(),
        "vs best",
        "cpu-eff×",
        "mem vs wrk",
        "tp best",
        "tp eff×",
        "bw best",
        "bw eff×"
    );
    for (size, conns) in &grid {
        let url = format!("http://{ADDR}:8081/{size}");
        let mut runs: BTreeMap<&str, Vec<Run>> = BTreeMap::new();
        // Each round starts with the next tool (this VM's speed drifts within seconds, so no
        // tool always runs first or last).
        for round in 0..rounds() {
            let mut order = tools.clone();
            order.rotate_left(round % tools.len().max(1));
            for t in order {
                if let Some(r) = client(cns, t, &url, *conns, secs) {
                    runs.entry(t).or_default().push(r);
                }
            }
        }
        // The median run by requests/s (this VM stalls a run now and then), peak memory of all.
        let mean = |t: &str| -> Option<Run> {
            let mut v = runs.get(t)?.clone();
            v.sort_by(|a, b| a.rps.total_cmp(&b.rps));
            let mid = *v.get(v.len() / 2)?;
            Some(Run {
                rss_kib: v.iter().map(|r| r.rss_kib).max().unwrap_or(0),
                ..mid
            })
        };
        let ours = mean("flowlane").unwrap_or_default();
        let ours_bp = mean("flowlane-tp").unwrap_or_default();
        let ours_bw = mean("flowlane-bw").unwrap_or_default();
        let peers: Vec<(&str, Run)> = tools
            .iter()
            .filter(|t| !ours_t(t))
            .filter_map(|t| mean(t).map(|r| (*t, r)))
            .collect();
        let best = peers.iter().map(|(_, r)| r.rps).fold(0.0, f64::max);
        // Requests per CPU second: requests/s × seconds / CPU seconds. On loopback the
        // client's process time (its receive work runs in the sender's system calls); with two
        // hosts the client CPU's busy time, which also holds its packets' receive work done
        // while it slept (charged to no process: a client that sleeps more would look cheaper).
        let charged = |r: &Run| if two_hosts { r.core_s } else { r.cpu_s };
        let eff = |r: &Run| {
            if charged(r) > 0.0 {
                r.rps * secs / charged(r)
            } else {
                0.0
            }
        };
        let best_eff = peers.iter().map(|(_, r)| eff(r)).fold(0.0, f64::max);
        let wrk_mem = mean("wrk").map(|r| r.rss_kib).unwrap_or(0);
        let vs_best = |r: &Run| if best > 0.0 { r.rps / best } else { 0.0 };
        let vs_eff = |r: &Run| {
            if best_eff > 0.0 {
                eff(r) / best_eff
            } else {
                0.0
            }
        };
        println!(
            "{:>5} {:>6} | {}| {:>8.2}× {:>8.2}× {:>9} | {:>8.2}× {:>8.2}× | {:>8.2}× {:>8.2}×",
            size,
            conns,
            tools
                .iter()
                .map(|t| format!(
                    "{:>11.0} {:>5} ",
                    mean(t).map_or(0.0, |r| r.rps),
                    mean(t).map_or(0, |r| r.rss_kib / 1024)
                ))
                .collect::<String>(),
            vs_best(&ours),
            vs_eff(&ours),
            if wrk_mem > 0 {
                format!("{:.2}×", ours.rss_kib as f64 / wrk_mem as f64)
            } else {
                "-".into()
            },
            vs_best(&ours_bp),
            vs_eff(&ours_bp),
            vs_best(&ours_bw),
            vs_eff(&ours_bw),
        );
        // Per request, the client's own work (user) and the kernel's on its behalf (system:
        // its syscalls, and on loopback the receive path of every request it sends). The
        // kernel part is what no client can shed, so the best `cpu-eff` a client with no user
        // time at all could reach is this row's bound.
        let per_req = |r: &Run, s: f64| s * 1e6 / (r.rps * secs).max(1.0);
        for t in &tools {
            if let Some(r) = mean(t) {
                eprintln!(
                    "  {t}: {:.0} req/s, {:.2} CPU s ({:.2} µs user + {:.2} µs system a request; its CPU busy {:.2} s), {:.0} req per CPU s, peak {} KiB",
                    r.rps,
                    r.cpu_s,
                    per_req(&r, r.user_s),
                    per_req(&r, r.cpu_s - r.user_s),
                    r.core_s,
                    eff(&r),
                    r.rss_kib
                );
            }
        }
        let sys = charged(&ours) - ours.user_s;
        if sys > 0.0 && best_eff > 0.0 {
            eprintln!(
                "  cpu-eff with no user time at all (our kernel time only): {:.2}× the best",
                ours.rps * secs / sys / best_eff
            );
        }
    }

    if have("wrk") {
        println!("\npart 2: servers under the same client (wrk -t1, then http load {}, on CPU {CLIENT_CPU}); server on CPU {SERVER_CPU}", tuned());
        println!(
            "{:>5} {:>6} | {:>12} {:>12} {:>8} {:>8} | {:>12} {:>12} {:>8} {:>8}",
            "size",
            "conns",
            "nginx",
            "http serve",
            "ratio",
            "cpu/req",
            "nginx (tp)",
            "serve (tp)",
            "ratio",
            "cpu/req"
        );
        println!(
            "  (cpu/req: http serve's CPU time per request over nginx's, from /proc/PID/stat)"
        );
        let mut serve_cmd = Command::new(BIN);
        serve_cmd.args([
            "http",
            "serve",
            "--bind",
            &format!("{ADDR}:8082"),
            "--cpus",
            "1",
            "--quiet",
        ]);
        let mut ours = Child(spawn_on(&ns, SERVER_CPU, serve_cmd));
        wait_listening(cns, 8082);
        'rows: for (size, conns) in &grid {
            let n = sizes
                .iter()
                .find(|(s, _)| s == size)
                .map_or(64, |(_, n)| *n);
            // Under wrk, and under `http load` with the throughput settings (a client that
            // takes the most of the server's work on itself: the server's core is then the
            // limit more often than under wrk, which copies every body).
            let mut ratios = Vec::new();
            for tool in ["wrk", "flowlane-tp"] {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                // Server CPU seconds and requests, summed over the rounds.
                let mut cost = [(0.0f64, 0.0f64); 2];
                for round in 0..rounds() {
                    for which in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                        let (url, pid) = if which == 0 {
                            (format!("http://{ADDR}:8081/{size}"), nginx.0.id())
                        } else {
                            (format!("http://{ADDR}:8082/bytes/{n}"), ours.0.id())
                        };
                        let c0 = proc_cpu_s(pid);
                        let r = client(cns, tool, &url, *conns, secs).map_or(0.0, |r| r.rps);
                        cost[which].0 += proc_cpu_s(pid) - c0;
                        cost[which].1 += r * secs;
                        if which == 0 {
                            a.push(r)
                        } else {
                            b.push(r)
                        }
                        // A server that ended makes every later figure void: say so, stop.
                        if let Ok(Some(status)) = ours.0.try_wait() {
                            println!("  http serve ended ({status}); part 2 stops here");
                            break 'rows;
                        }
                    }
                }
                let per = |(cpu, n): (f64, f64)| if n > 0.0 { cpu / n } else { 0.0 };
                let (pa, pb) = (per(cost[0]), per(cost[1]));
                ratios.push((median(a), median(b), if pa > 0.0 { pb / pa } else { 0.0 }));
            }
            let cell = |(a, b, c): (f64, f64, f64)| {
                format!(
                    "{:>12.0} {:>12.0} {:>7.2}× {:>7.2}×",
                    a,
                    b,
                    if a > 0.0 { b / a } else { 0.0 },
                    c
                )
            };
            println!(
                "{:>5} {:>6} | {} | {}",
                size,
                conns,
                cell(ratios[0]),
                cell(ratios[1])
            );
        }
        drop(ours);
    }

    println!("\npart 3: constant rate, http load -R 5000 -c 10 against nginx (64 B)");
    let d = format!("{}", (secs * 3.0).round() as u64);
    let mut cmd = Command::new(BIN);
    cmd.args([
        "http",
        "load",
        &format!("http://{ADDR}:8081/64"),
        "-c",
        "10",
        "-R",
        "5000",
        "-d",
        &d,
    ])
    .args(["--cpus", "0", "--json", "--quiet"]);
    let (out, _) = run_client(cns, cmd);
    match serde_json::from_str::<serde_json::Value>(&out) {
        Ok(j) => {
            let rate = j["requests_per_s"].as_f64().unwrap_or(0.0);
            let p = &j["pools"][0];
            println!(
                "  held {:.1} requests/s ({:+.3} % of 5000); p50 {:.1} µs from intended, {:.1} µs from actual send; p99 {:.1} µs; send lag p99 {:.1} µs",
                rate,
                (rate / 5000.0 - 1.0) * 100.0,
                p["latency"]["p50"].as_f64().unwrap_or(0.0),
                p["latency_actual"]["p50"].as_f64().unwrap_or(0.0),
                p["latency"]["p99"].as_f64().unwrap_or(0.0),
                p["send_lag"]["p99"].as_f64().unwrap_or(0.0),
            );
        }
        Err(e) => println!("  no JSON ({e}): {out}"),
    }
    drop(nginx);
    let _ = std::fs::remove_dir_all(&dir);
}
