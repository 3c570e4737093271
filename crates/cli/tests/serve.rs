//! `flowlane serve` with real sockets on loopback.

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

    /// A server on `host` (an IPv4 address, or an IPv6 one in brackets).
    fn start_on(host: &str, extra: &[&str]) -> Server {
        let port = free_port();
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
        let mut child = Command::new(env!("CARGO_BIN_EXE_flowlane"))
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
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(l) if l.starts_with("flowlane serve:") => break,
                Ok(_) => {}
                Err(_) if Instant::now() > deadline => panic!("serve did not start"),
                Err(_) => {}
            }
        }
        Server { child, port }
    }

    /// SIGINT, then the JSON summary; asserts exit 0.
    fn finish(self) -> Value {
        let pid = self.child.id().to_string();
        let st = Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .expect("kill runs");
        assert!(st.success());
        let out = self.child.wait_with_output().expect("serve ends");
        assert_eq!(out.status.code(), Some(0), "serve exit status");
        serde_json::from_slice(&out.stdout).expect("summary is JSON")
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
                flowlane_io::sys::pin_current_thread(cpu).expect("pin sender");
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
        missteered += m;
    }
    // 8 ports per CPU hashed over the workers: all 16+ landing at home has odds below 2^-16.
    assert!(missteered > 0, "the detector must see mis-steering: {j}");
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
    flowlane_io::sys::set_int(
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
