//! `flowlane serve` with real sockets on loopback.

mod common;

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flowlane_io::os::Signal;
use flowlane_lab::Netns;
use serde_json::Value;

/// A running server: started, banner seen, stopped with SIGINT on `finish`.
struct Server {
    child: Child,
    port: u16,
}

fn free_port() -> u16 {
    let s = UdpSocket::bind("127.0.0.1:0").expect("ephemeral port");
    s.local_addr().expect("addr").port()
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Server::start_on("127.0.0.1", extra)
    }

    /// A server on `host` (an IPv4 address, or an IPv6 one in brackets), on a free port. A
    /// port found free can be taken by a parallel test before serve binds it: then serve
    /// exits, and another port is tried (three in all).
    fn start_on(host: &str, extra: &[&str]) -> Server {
        let mut why = String::new();
        for _ in 0..3 {
            match Server::try_start_in(None, host, free_port(), extra) {
                Ok(s) => return s,
                Err(e) => why = e,
            }
        }
        panic!("serve did not start on three free ports: {why}")
    }

    /// A server on `host:port`, inside `ns` if given.
    fn start_in(ns: Option<&Netns>, host: &str, port: u16, extra: &[&str]) -> Server {
        Server::try_start_in(ns, host, port, extra).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Server::start_in`], or what serve said when it exited before it was ready.
    fn try_start_in(
        ns: Option<&Netns>,
        host: &str,
        port: u16,
        extra: &[&str],
    ) -> Result<Server, String> {
        let bind = format!("{host}:{port}");
        let mut args = vec![
            "serve",
            "--bind",
            &bind,
            "--json",
            "--quiet",
            "--duration",
            "30",
        ];
        args.extend_from_slice(extra);
        let bin = env!("CARGO_BIN_EXE_flowlane");
        let mut cmd = match ns {
            Some(ns) => ns.command(bin),
            None => Command::new(bin),
        };
        let mut child = cmd
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve starts");
        // The banner on stderr means every worker is bound and polling.
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut said = Vec::new();
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(l) if l.starts_with("flowlane serve:") => break,
                Ok(l) => said.push(l),
                Err(_) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("serve did not start in 10 s: {said:?}"));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    // stderr closed: serve exited (its last words are in `said`).
                    let status = child.wait().map_err(|e| e.to_string())?;
                    return Err(format!(
                        "serve exited ({status}) before it was ready: {said:?}"
                    ));
                }
                Err(_) => {}
            }
        }
        Ok(Server { child, port })
    }

    /// SIGINT, then the JSON summary; asserts exit 0.
    fn finish(self) -> Value {
        flowlane_io::os::signal_process(self.child.id(), Signal::Interrupt).expect("SIGINT");
        let out = self.child.wait_with_output().expect("serve ends");
        assert_eq!(out.status.code(), Some(0), "serve exit status");
        let j = serde_json::from_slice(&out.stdout).expect("summary is JSON");
        common::schema_valid("serve", &j);
        j
    }
}

fn client() -> UdpSocket {
    let c = UdpSocket::bind("127.0.0.1:0").expect("client socket");
    c.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    c
}

#[test]
fn echo_returns_every_size_byte_identical_and_counts_exactly() {
    let srv = Server::start(&["--mode", "echo"]);
    let c = client();
    let sizes = [0usize, 1, 18, 100, 510, 1472, 1500, 9000, 32768, 65507];
    let mut buf = vec![0u8; 70000];
    let mut bytes = 0u64;
    for (n, &size) in sizes.iter().enumerate() {
        let payload: Vec<u8> = (0..size).map(|i| (i * 31 + n) as u8).collect();
        c.send_to(&payload, ("127.0.0.1", srv.port)).expect("send");
        let (len, from) = c.recv_from(&mut buf).expect("echo comes back");
        assert_eq!(from.port(), srv.port);
        assert_eq!(&buf[..len], &payload[..], "size {size}");
        bytes += size as u64;
    }
    let j = srv.finish();
    let t = &j["total"];
    assert_eq!(t["rx_packets"], sizes.len() as u64);
    assert_eq!(t["tx_packets"], sizes.len() as u64);
    assert_eq!(t["rx_bytes"], bytes);
    assert_eq!(t["tx_bytes"], bytes);
    assert_eq!(t["truncated"], 0);
    assert_eq!(j["steering"], "cpu-bpf");
    let per_worker: u64 = j["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| w["rx_packets"].as_u64().expect("count"))
        .sum();
    assert_eq!(per_worker, sizes.len() as u64);
    // What each datagram cost: the workers' thread CPU clocks, summed into the total, and a
    // per-datagram figure wherever a worker received any.
    let workers = j["workers"].as_array().expect("workers");
    let cpu: u64 = workers
        .iter()
        .map(|w| w["cpu_ns"].as_u64().expect("cpu_ns"))
        .sum();
    assert!(cpu > 0, "{j}");
    assert_eq!(t["cpu_ns"].as_u64(), Some(cpu), "{j}");
    common::pmu_said(&j);
    for w in workers {
        let got = w["rx_packets"].as_u64().expect("count");
        let per = w["cpu_ns_per_packet"].as_f64();
        assert_eq!(per.is_some(), got > 0, "{w}");
        if let Some(per) = per {
            // The report rounds to a tenth of a ns; the same rounding here, exactly (a
            // tolerance of 0.05 failed on 87 018.25 → 87 018.3 by a float's last bit).
            let expect = w["cpu_ns"].as_u64().expect("cpu_ns") as f64 / got as f64;
            assert_eq!(per, (expect * 10.0).round() / 10.0, "{w}");
        }
    }
}

/// Senders pinned to each CPU; on loopback the receive path runs on the sender's CPU, so with
/// CPU steering worker i must get exactly what CPU i sent.
fn steering_run(steer: bool) -> Value {
    let ncpu = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4);
    let cpus: Vec<String> = (0..ncpu).map(|c| c.to_string()).collect();
    let list = cpus.join(",");
    let mut extra = vec!["--mode", "sink", "--cpus", &list];
    if !steer {
        extra.push("--no-steer");
    }
    let srv = Server::start(&extra);
    let port = srv.port;
    let per_cpu = 2000u64;
    let senders: Vec<_> = (0..ncpu)
        .map(|cpu| {
            std::thread::spawn(move || {
                flowlane_io::os::pin_current_thread(cpu).expect("pin sender");
                // Several source ports, so reuseport hashing (steering off) spreads them.
                let socks: Vec<UdpSocket> = (0..8).map(|_| client()).collect();
                for i in 0..per_cpu {
                    let s = &socks[i as usize % socks.len()];
                    s.send_to(&[cpu as u8; 18], ("127.0.0.1", port))
                        .expect("send");
                    if i % 256 == 255 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            })
        })
        .collect();
    for s in senders {
        s.join().expect("sender");
    }
    std::thread::sleep(Duration::from_millis(300));
    let j = srv.finish();
    assert_eq!(j["total"]["rx_packets"], per_cpu * ncpu as u64);
    assert_eq!(j["total"]["socket_drops"], 0);
    j
}

#[test]
fn cpu_steering_delivers_each_cpus_packets_to_its_worker() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("SKIP: needs 2 CPUs");
        return;
    }
    let j = steering_run(true);
    assert_eq!(j["steering"], "cpu-bpf");
    assert_eq!(j["missteer_detector"], "ebpf");
    // Every CPU sent 2000 datagrams from 8 source ports; each worker got exactly its CPU's.
    for w in j["workers"].as_array().expect("workers") {
        assert_eq!(w["rx_packets"], 2000, "worker {}", w["cpu"]);
        assert_eq!(w["missteered"], 0, "worker {}", w["cpu"]);
        assert_eq!(w["missteered_received_max"], 0, "worker {}", w["cpu"]);
    }
    // Steering off still delivers everything, spread by the kernel's 4-tuple hash, so a source
    // port's datagrams land on some worker whatever CPU sent them; the detector sees that.
    let j = steering_run(false);
    assert_eq!(j["steering"], "reuseport-hash");
    assert_eq!(j["steering_reason"], "CPU steering turned off");
    let mut missteered = 0;
    for w in j["workers"].as_array().expect("workers") {
        let (rx, m) = (
            w["rx_packets"].as_u64().expect("rx"),
            w["missteered"].as_u64().expect("detector on"),
        );
        // Each source port carried 250 datagrams, all hashed to one worker: whole multiples.
        assert_eq!(rx % 250, 0, "worker {}", w["cpu"]);
        assert_eq!(m % 250, 0, "worker {}", w["cpu"]);
        assert!(m <= rx, "worker {}", w["cpu"]);
        // Counted at the socket; what the worker got of them lies between the bounds.
        let drops = w["socket_drops"].as_u64().expect("drops");
        assert_eq!(w["missteered_received_min"], m.saturating_sub(drops), "{w}");
        assert_eq!(w["missteered_received_max"], m.min(rx), "{w}");
        missteered += m;
    }
    // 8 ports per CPU hashed over the workers: all 16+ landing at home has odds below 2^-16.
    assert!(missteered > 0, "the detector must see mis-steering: {j}");
}

/// The OpenMetrics text, counters as integers.
fn scrape(addr: &str) -> std::collections::HashMap<String, u64> {
    common::scrape(addr)
        .expect("the metrics endpoint answers")
        .into_iter()
        .filter(|(_, v)| v.fract() == 0.0 && *v >= 0.0)
        .map(|(k, v)| (k, v as u64))
        .collect()
}

#[test]
fn metrics_scraped_during_a_run_equal_the_final_report() {
    let maddr = common::free_local_addr();
    let srv = Server::start(&["--metrics", &maddr, "--mode", "sink"]);
    let to = format!("127.0.0.1:{}", srv.port);
    // Fed by blast: 20 000 datagrams from 8 flows, paced so loopback keeps them all.
    let out = Command::new(env!("CARGO_BIN_EXE_flowlane"))
        .args([
            "blast", "--to", &to, "--count", "20000", "--rate", "40k", "--flows", "8",
        ])
        .args(["--json", "--quiet"])
        .output()
        .expect("blast runs");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The workers count what reached their sockets; scrape until the count stops moving.
    let key = |w: usize, cpu: &Value, name: &str| {
        format!("flowlane_serve_{name}_total{{worker=\"{w}\",cpu=\"{cpu}\"}}")
    };
    let mut m = scrape(&maddr);
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let again = scrape(&maddr);
        let rx = |m: &std::collections::HashMap<String, u64>| {
            m.iter()
                .filter(|(k, _)| k.starts_with("flowlane_serve_rx_packets_total"))
                .map(|(_, v)| *v)
                .sum::<u64>()
        };
        let settled = rx(&again) == rx(&m) && rx(&m) > 0;
        m = again;
        if settled {
            break;
        }
    }
    assert_eq!(m.get("flowlane_up"), Some(&1), "{m:?}");
    let j = srv.finish();
    for (w, worker) in j["workers"].as_array().expect("workers").iter().enumerate() {
        let cpu = &worker["cpu"];
        for name in [
            "rx_packets",
            "rx_bytes",
            "socket_drops",
            "truncated",
            "missteered",
        ] {
            let scraped = m.get(&key(w, cpu, name)).copied();
            assert_eq!(
                scraped,
                worker[name].as_u64(),
                "{name} of worker {w}: {m:?}\n{j}"
            );
        }
        let rounds = m
            .get(&format!(
                "flowlane_loop_rounds_total{{worker=\"{w}\",cpu=\"{cpu}\"}}"
            ))
            .copied()
            .expect("loop counters");
        assert!(rounds <= worker["rounds"].as_u64().expect("rounds"), "{j}");
    }
    let total: u64 = j["total"]["rx_packets"].as_u64().expect("total");
    assert_eq!(
        total + j["total"]["socket_drops"].as_u64().expect("drops"),
        20_000,
        "{j}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let holder = UdpSocket::bind("127.0.0.1:0").expect("hold a port");
    let busy = holder.local_addr().expect("addr").to_string();
    let any = "127.0.0.1:0";
    let cases: Vec<Vec<&str>> = vec![
        vec!["--bind", &busy],
        vec!["--bind", any, "--cpus", "4000"],
        vec!["--bind", "198.18.77.77:9"],
        vec!["--bind", "nonsense"],
        vec!["--bind", any, "--duration", "-1"],
        vec!["--bind", any, "--duration", "1e300"],
        vec!["--bind", any, "--interval", "1e300"],
        vec!["--bind", any, "--interval", "NaN"],
    ];
    for args in cases {
        let o = Command::new(env!("CARGO_BIN_EXE_flowlane"))
            .arg("serve")
            .args(&args)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A client that sends `segments` datagrams of `seg` bytes with one UDP_SEGMENT (GSO) send:
/// on loopback they arrive as one GSO packet, which a UDP_GRO socket receives whole.
fn gso_round(server_args: &[&str], rounds: usize) -> Value {
    let srv = Server::start(server_args);
    let c = client();
    let (seg, segments) = (100usize, 10usize);
    flowlane_io::socket::set_int(
        &c,
        libc::SOL_UDP,
        libc::UDP_SEGMENT,
        seg as i32,
        "setsockopt(UDP_SEGMENT)",
    )
    .expect("kernel has UDP GSO");
    let mut buf = vec![0u8; 70000];
    for r in 0..rounds {
        let payload: Vec<u8> = (0..seg * segments).map(|i| (i / seg + r) as u8).collect();
        c.send_to(&payload, ("127.0.0.1", srv.port)).expect("send");
        // The echo comes back as the same ten datagrams, in order, byte-identical.
        for k in 0..segments {
            let (len, _) = c.recv_from(&mut buf).expect("echo");
            assert_eq!(
                &buf[..len],
                &payload[k * seg..(k + 1) * seg],
                "round {r} seg {k}"
            );
        }
    }
    let j = srv.finish();
    let t = &j["total"];
    assert_eq!(t["rx_packets"], (rounds * segments) as u64);
    assert_eq!(t["tx_packets"], (rounds * segments) as u64);
    assert_eq!(t["rx_bytes"], (rounds * segments * seg) as u64);
    assert_eq!(t["tx_failed"], 0);
    j
}

#[test]
fn gro_and_gso_keep_datagram_boundaries_and_count_each_datagram() {
    // Plain server: the kernel splits the GSO packet before the socket.
    let j = gso_round(&["--cpus", "0"], 20);
    assert_eq!(j["total"]["gro_receives"], 0);
    assert_eq!(j["total"]["gso_sends"], 0);
    // --gro: each send arrives as one coalesced receive and goes back as one GSO send.
    let j = gso_round(&["--cpus", "0", "--gro"], 20);
    assert_eq!(j["gro"], true, "{j}");
    assert_eq!(j["total"]["gro_receives"], 20);
    assert_eq!(j["total"]["gso_sends"], 20);
    // --gso alone: single datagrams in a batch, coalesced into GSO sends on the way back.
    let j = gso_round(&["--cpus", "0", "--gso"], 20);
    assert_eq!(j["gso"], true);
    assert_eq!(j["total"]["gro_receives"], 0);
    let sends = j["total"]["gso_sends"].as_u64().expect("count");
    assert!((1..=200).contains(&sends), "{j}");
}

/// A private namespace for tests whose kernel counters must be exact, or None (with a notice)
/// where this user cannot make one.
fn private_ns() -> Option<Netns> {
    if !flowlane_lab::can_create_namespaces() {
        eprintln!("SKIP: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) for a network namespace");
        return None;
    }
    Some(Netns::create("fl-serve").expect("create a namespace"))
}

fn signal(srv: &Server, sig: Signal) {
    flowlane_io::os::signal_process(srv.child.id(), sig).expect("kill(2)");
}

#[test]
fn counts_match_the_kernels_udp_counters_when_the_buffer_overflows() {
    let Some(ns) = private_ns() else { return };
    let port = 9000;
    // A small buffer (64 KiB asked, 128 KiB granted) and a stopped server: the burst overflows.
    let srv = Server::start_in(
        Some(&ns),
        "127.0.0.1",
        port,
        &["--mode", "sink", "--cpus", "0", "--rcvbuf", "65536"],
    );
    let before = ns.snmp().expect("snmp");
    signal(&srv, Signal::Stop);
    let burst = 5000u64;
    ns.run(|| {
        let c = UdpSocket::bind("127.0.0.1:0").expect("client in the namespace");
        let payload = [7u8; 1000];
        for _ in 0..burst {
            c.send_to(&payload, ("127.0.0.1", port)).expect("send");
        }
    })
    .expect("sender in the namespace");
    signal(&srv, Signal::Continue);
    std::thread::sleep(Duration::from_millis(300));
    let j = srv.finish();
    let after = ns.snmp().expect("snmp");
    let t = &j["total"];
    let (rx, drops) = (
        t["rx_packets"].as_u64().expect("rx"),
        t["socket_drops"].as_u64().expect("drops"),
    );
    assert!(drops > 0, "the burst must overflow the buffer: {j}");
    assert_eq!(rx + drops, burst, "{j}");
    assert_eq!(rx as i64, after.delta(&before, "Udp", "InDatagrams"));
    assert_eq!(drops as i64, after.delta(&before, "Udp", "RcvbufErrors"));
    assert_eq!(after.delta(&before, "Udp", "NoPorts"), 0);
}

#[test]
fn dual_stack_and_v6only_in_a_namespace() {
    let Some(ns) = private_ns() else { return };
    let port = 9001;
    // Echo two datagrams from `from` (in the namespace); true when both come back.
    let echoes = |from: &'static str, to: &'static str| {
        ns.run(move || {
            let c = UdpSocket::bind(from).expect("client");
            c.set_read_timeout(Some(Duration::from_millis(300)))
                .expect("timeout");
            let mut buf = [0u8; 64];
            (0..2).all(|i| {
                c.send_to(&[i; 18], (to, port)).expect("send");
                matches!(c.recv_from(&mut buf), Ok((18, _))) && buf[0] == i
            })
        })
        .expect("client in the namespace")
    };
    let srv = Server::start_in(Some(&ns), "[::]", port, &["--cpus", "0,1"]);
    assert!(echoes("[::1]:0", "::1"), "IPv6 client");
    assert!(echoes("127.0.0.1:0", "127.0.0.1"), "IPv4 client, v4-mapped");
    let j = srv.finish();
    assert_eq!(j["total"]["rx_packets"], 4);
    assert_eq!(j["total"]["tx_packets"], 4);

    let srv = Server::start_in(Some(&ns), "[::]", port, &["--cpus", "0", "--v6only"]);
    assert!(echoes("[::1]:0", "::1"), "IPv6 client");
    assert!(!echoes("127.0.0.1:0", "127.0.0.1"), "v6only refuses IPv4");
    let j = srv.finish();
    assert_eq!(j["total"]["rx_packets"], 2);
}

#[test]
fn refused_echoes_are_counted_and_the_worker_keeps_serving() {
    let Some(ns) = private_ns() else { return };
    let port = 9002;
    // Every reply is dropped on output by a firewall rule: sendmmsg says EPERM.
    let nft = |rules: &str| {
        ns.command("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().expect("stdin").write_all(rules.as_bytes())?;
                c.wait()
            })
    };
    let rules = format!(
        "table inet fl {{\n chain out {{\n  type filter hook output priority 0;\n  udp sport {port} drop\n }}\n}}\n"
    );
    if !common::need_program("nft") {
        return;
    }
    let st = nft(&rules).expect("nft runs");
    assert!(st.success(), "nft refused the rules:\n{rules}");
    let srv = Server::start_in(Some(&ns), "127.0.0.1", port, &["--cpus", "0"]);
    let sent = 100u64;
    ns.run(|| {
        let c = UdpSocket::bind("127.0.0.1:0").expect("client");
        for _ in 0..sent {
            c.send_to(&[1u8; 18], ("127.0.0.1", port)).expect("send");
        }
    })
    .expect("client in the namespace");
    std::thread::sleep(Duration::from_millis(300));
    let j = srv.finish();
    let t = &j["total"];
    assert_eq!(t["rx_packets"], sent);
    assert_eq!(t["tx_packets"], 0);
    assert_eq!(t["tx_failed"], sent, "{j}");
    assert_eq!(j["errors"].as_array().map(Vec::len), Some(0), "{j}");
}

#[test]
fn busy_poll_mode_echoes_and_reports_itself() {
    let srv = Server::start(&["--cpus", "0", "--busy-poll", "50"]);
    let c = client();
    let mut buf = [0u8; 64];
    for i in 0..50u8 {
        c.send_to(&[i; 18], ("127.0.0.1", srv.port)).expect("send");
        let (n, _) = c.recv_from(&mut buf).expect("echo");
        assert_eq!((n, buf[0]), (18, i));
    }
    let j = srv.finish();
    assert_eq!(j["busy_poll_us"], 50);
    assert_eq!(j["total"]["tx_packets"], 50);
    // Root may raise SO_BUSY_POLL; this kernel has SO_PREFER_BUSY_POLL: no notices expected.
    if flowlane_lab::can_create_namespaces() {
        assert_eq!(j["notices"], serde_json::json!([]), "{j}");
    }
}

#[test]
fn by_source_counts_each_clients_datagrams_in_the_worker_that_got_them() {
    let srv = Server::start(&["--mode", "sink", "--by-source"]);
    let (a, b) = (client(), client());
    for _ in 0..30 {
        a.send_to(b"a", ("127.0.0.1", srv.port)).expect("send");
    }
    for _ in 0..12 {
        b.send_to(b"bb", ("127.0.0.1", srv.port)).expect("send");
    }
    std::thread::sleep(Duration::from_millis(200));
    let j = srv.finish();
    let mut per_src = std::collections::BTreeMap::new();
    for w in j["workers"].as_array().expect("workers") {
        let sources = w["sources"].as_array().expect("sources with --by-source");
        let sum: u64 = sources
            .iter()
            .map(|s| s["packets"].as_u64().expect("n"))
            .sum();
        assert_eq!(sum, w["rx_packets"].as_u64().expect("rx"), "{w}");
        for s in sources {
            *per_src
                .entry(s["src"].as_str().expect("src").to_string())
                .or_insert(0u64) += s["packets"].as_u64().expect("n");
        }
    }
    let addr = |c: &UdpSocket| c.local_addr().expect("addr").to_string();
    assert_eq!(per_src.get(&addr(&a)), Some(&30), "{per_src:?}");
    assert_eq!(per_src.get(&addr(&b)), Some(&12), "{per_src:?}");
    assert_eq!(per_src.len(), 2);
    // Without the flag there is no per-source list (and no cost).
    let plain = Server::start(&["--mode", "sink"]).finish();
    assert!(plain["workers"][0].get("sources").is_none());
}

/// `taskset -c 1 flowlane serve --cpus 1`: the one CPU this process may use is accepted, and a
/// CPU it may not use is refused with the reason (online, but not allowed) — not "CPU 1 does
/// not exist" as when the allowed count was taken for the online list.
#[test]
fn cpus_are_checked_against_online_and_allowed_apart() {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online");
    if online.trim() == "0" {
        eprintln!("SKIP: one CPU; the test restricts the server to CPU 1");
        return;
    }
    let port = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("port")
        .port();
    // A child inherits the affinity of the thread that spawns it, as under taskset.
    let run = |cpus: &str| {
        let cpus = cpus.to_string();
        std::thread::spawn(move || {
            flowlane_io::os::pin_current_thread(1).expect("pin to CPU 1");
            Command::new(env!("CARGO_BIN_EXE_flowlane"))
                .args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--cpus"])
                .args([&cpus, "--duration", "0.3", "--quiet", "--json"])
                .output()
                .expect("runs")
        })
        .join()
        .expect("thread")
    };
    let ok = run("1");
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let refused = run("0");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("CPU 0 is online but this process may not run there"),
        "{err}"
    );
    let offline = run("4095");
    let err = String::from_utf8_lossy(&offline.stderr);
    assert_eq!(offline.status.code(), Some(2), "{err}");
    assert!(err.contains("CPU 4095 is not online"), "{err}");
}

/// `--steer-hash` (issue 54 item 3): in a namespace whose loopback carries 1 500-byte
/// frames, 16 clients send 3 000-byte datagrams (the kernel fragments and reassembles each),
/// and every datagram of a client reaches the worker its Toeplitz bucket names — with a
/// round-robin table over two queues, worker `hash & 1` — wherever the kernel finished it.
/// Each client also sends 10 whole datagrams: each worker counts exactly its clients'
/// fragmented ones as `fragmented` (IP_RECVFRAGSIZE), and the whole ones not.
#[test]
fn hash_steering_sends_reassembled_datagrams_to_their_buckets_worker() {
    let Some(ns) = private_ns() else { return };
    ns.ip(&["link", "set", "lo", "mtu", "1500"])
        .expect("lo mtu");
    let port = 9002;
    let srv = Server::start_in(
        Some(&ns),
        "127.0.0.1",
        port,
        &[
            "--cpus",
            "0,1",
            "--mode",
            "sink",
            "--by-source",
            "--steer-hash",
            "--key",
            "microsoft",
            "--queues",
            "2",
        ],
    );
    let h = flowlane_rss::Toeplitz::new(&flowlane_rss::Key::MICROSOFT);
    let before = ns.snmp().expect("snmp").get("Ip", "ReasmOKs").unwrap_or(0);
    let want: std::collections::BTreeMap<String, u64> = ns
        .run(move || {
            (0..16)
                .map(|_| {
                    let c = UdpSocket::bind("127.0.0.1:0").expect("client");
                    for _ in 0..20 {
                        c.send_to(&[7u8; 3000], ("127.0.0.1", port)).expect("send");
                    }
                    for _ in 0..10 {
                        c.send_to(&[7u8; 500], ("127.0.0.1", port)).expect("send");
                    }
                    let src = c.local_addr().expect("addr");
                    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                    let t = flowlane_rss::Tuple::from_socket_addrs(src, to).expect("tuple");
                    (src.to_string(), u64::from(h.hash(&t) & 1))
                })
                .collect()
        })
        .expect("clients in the namespace");
    std::thread::sleep(Duration::from_millis(300));
    let made_whole = ns.snmp().expect("snmp").get("Ip", "ReasmOKs").unwrap_or(0) - before;
    let j = srv.finish();
    assert_eq!(j["steering"], "hash-bpf", "{j}");
    assert_eq!(made_whole, 320, "every datagram came in fragments");
    let mut got = std::collections::BTreeMap::new();
    for (w, worker) in j["workers"].as_array().expect("workers").iter().enumerate() {
        let sources = worker["sources"].as_array().expect("sources");
        for s in sources {
            assert_eq!(s["packets"].as_u64(), Some(30), "{s}");
            let prev = got.insert(s["src"].as_str().expect("src").to_string(), w as u64);
            assert!(prev.is_none(), "a client on two workers: {s}");
        }
        assert_eq!(
            worker["fragmented"].as_u64(),
            Some(20 * sources.len() as u64),
            "worker {w}: its clients' fragmented datagrams, not their whole ones"
        );
    }
    assert_eq!(got, want, "each client on its bucket's worker");
    assert_eq!(j["total"]["fragmented"], 320, "{j}");
}
