//! How long a change takes to reach `flowlane forward --mode route`'s forwarding path, with
//! FLOWLANE_BENCH_ROUTES IPv4 routes (default 950 000, shaped like the public table) in the
//! DUT's kernel of a line lab, as the router's own records say it (`tables.last_update_ms`:
//! from reading the changes until the path uses them; `tables.whole`: whether the whole table
//! was written). FLOWLANE_BENCH_CHANGES changes per row (default 10, half adds, half
//! removals), medians. Rows, per backend:
//!   route     a /24 via the sink (a next hop in use, no neighbour's address inside) added or
//!             removed — the native XDP router rewrites only the entries it covers;
//!   address   a /32 address added to or removed from the DUT's port — frames to it go to the
//!             kernel: a host route, made in place;
//!   neighbour a host on the sink's link learnt or forgotten (`ip neigh`, a MAC of its own):
//!             a host route to its MAC, made in place;
//!   gateway   the MAC of the gateway every route goes through changed — every route's next
//!             hop, so the native router writes its whole table into the other half (what
//!             every change cost it before changes were made in place).
//! The references, same run: the native router's whole write, and the AF_XDP router's FIB
//! (the snapshot writer every user-space backend shares).
//!
//! Run (root): `cargo bench -p flowlane --bench route_updates`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::BIN;
use flowlane_lab::setup;
use flowlane_lab::Netns;
use serde_json::Value;

/// A router streaming its records, one per interval.
struct Router {
    child: Child,
    records: Receiver<Value>,
}

impl Router {
    fn start(dut: &Netns, backend: &str) -> Router {
        let mut child = dut
            .command(BIN)
            .args(["forward", "--mode", "route", "--dev", setup::DUT_IF])
            .args(["--dev", setup::DUT_OUT_IF, "--backend", backend])
            .args(["--interval", "0.1", "--duration", "900", "--json-stream"])
            .args(["--quiet"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("forward runs");
        let out = child.stdout.take().expect("stdout");
        let (tx, records) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if !v["interval"].is_null() && tx.send(v["interval"].clone()).is_err() {
                        break;
                    }
                }
            }
        });
        Router { child, records }
    }

    /// The next record (the router may take a while to load its table first).
    fn next(&self) -> Value {
        self.records
            .recv_timeout(Duration::from_secs(120))
            .expect("a record from the router")
    }

    /// Makes a change with `cmd` and waits (bounded) for the record that shows its update:
    /// its duration, ms, and whether the table was written whole.
    fn change(&self, cmd: &mut Command) -> (f64, bool) {
        let n = |r: &Value, k: &str| r["tables"][k].as_u64().unwrap_or(0);
        // Records already waiting are stale.
        let mut last = self.next();
        while let Ok(r) = self.records.try_recv() {
            last = r;
        }
        let out = cmd.output().expect("ip");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for _ in 0..600 {
            let r = self.next();
            if n(&r, "updates") > n(&last, "updates") {
                let ms = r["tables"]["last_update_ms"].as_f64().unwrap_or(f64::NAN);
                return (ms, n(&r, "whole") > n(&last, "whole"));
            }
        }
        panic!("no update within 600 records");
    }

    fn stop(mut self) {
        let _ =
            flowlane_io::os::signal_process(self.child.id(), flowlane_io::os::Signal::Interrupt);
        let _ = self.child.wait();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    if common::start("route_updates").is_none() {
        return;
    }
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let routes = env("FLOWLANE_BENCH_ROUTES", 950_000);
    let changes = env("FLOWLANE_BENCH_CHANGES", 10).max(2);
    let lab = common::BenchLab::line("flbu", setup::Segment::Routed);
    let dut = lab.dut();
    let loaded = common::load_ipv4_table(&dut, routes);
    println!(
        "route updates: {loaded} IPv4 routes in the DUT's kernel and in the router, {changes} \
         changes per row (half adds, half removals), medians of the router's own records"
    );
    println!(
        "{:<8} {:<9} {:>12} {:>12} {:>8}",
        "backend", "change", "median ms", "max ms", "whole"
    );
    let mut medians = std::collections::HashMap::new();
    for backend in ["xdp", "af-xdp"] {
        let r = Router::start(&dut, backend);
        for kind in ["route", "address", "neighbour", "gateway"] {
            let mut took = Vec::new();
            let mut whole = 0;
            for k in 0..changes {
                let (verb, i) = if k % 2 == 0 {
                    ("add", k)
                } else {
                    ("del", k - 1)
                };
                let mut cmd = dut.command("ip");
                match kind {
                    "route" => {
                        let p = format!("198.19.{}.0/24", 100 + i);
                        cmd.args(["route", verb, &p, "via", setup::LAB_SINK_V4]);
                    }
                    "address" => {
                        let a = format!("198.19.250.{}/32", 1 + i);
                        cmd.args(["addr", verb, &a, "dev", setup::DUT_IF]);
                    }
                    "neighbour" => {
                        let a = format!("198.18.1.{}", 100 + i);
                        let mac = format!("02:00:00:00:11:{:02x}", i);
                        cmd.args(["neigh", verb, &a, "lladdr", &mac, "dev", setup::DUT_OUT_IF]);
                        cmd.args(["nud", "permanent"]);
                    }
                    _ => {
                        let mac = format!("02:00:00:00:22:{:02x}", k);
                        cmd.args(["neigh", "replace", setup::LAB_SINK_V4, "lladdr", &mac]);
                        cmd.args(["dev", setup::DUT_OUT_IF, "nud", "permanent"]);
                    }
                }
                let (ms, w) = r.change(&mut cmd);
                took.push(ms);
                whole += usize::from(w);
            }
            let max = took.iter().copied().fold(0.0, f64::max);
            let m = median(took);
            println!("{backend:<8} {kind:<9} {m:>12.2} {max:>12.2} {whole:>5}/{changes}");
            medians.insert((backend, kind), m);
        }
        r.stop();
    }
    let get = |b, k| medians.get(&(b, k)).copied().unwrap_or(f64::NAN);
    println!(
        "native XDP: a route change in place takes {:.4} of a whole write ({:.1}× faster); \
         {:.2}× the AF_XDP router's FIB update",
        get("xdp", "route") / get("xdp", "gateway"),
        get("xdp", "gateway") / get("xdp", "route"),
        get("xdp", "route") / get("af-xdp", "route"),
    );
    for kind in ["address", "neighbour"] {
        println!(
            "native XDP: {kind} changes take {:.4} of a whole write, {:.2}× the AF_XDP router's",
            get("xdp", kind) / get("xdp", "gateway"),
            get("xdp", kind) / get("af-xdp", kind),
        );
    }
}
