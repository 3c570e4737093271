//! `flowlane forward --mode route` in a line lab (generator — DUT — sink), against the kernel:
//! its decisions on a 200 000-route table equal `ip route get`'s, and a run's counts add up
//! against the interfaces' and the kernel's own counters — every frame the DUT's interfaces
//! received was forwarded, left to the host or dropped for a named reason, every forwarded
//! frame left by an interface, and the sink got every routed datagram once, in order. Namespace
//! tests need root.

mod common;

use std::collections::HashMap;

use std::process::Command;

use common::{ok, quiet, sink_check, sink_start, with_stdin, Forwarder, Line};
use flowlane_lab::Netns;
use flowlane_lpm::gen::{self, Traffic};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowlane");

/// `via GW dev IF` or `dev IF` from one answer of `ip route get`.
fn kernel_hop(answer: &str) -> String {
    let w: Vec<&str> = answer.split_whitespace().collect();
    let after = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1));
    match (after("via"), after("dev")) {
        (Some(gw), Some(dev)) => format!("via {gw} dev {dev}"),
        (None, Some(dev)) => format!("dev {dev}"),
        _ => format!("? {answer}"),
    }
}

/// Whether an address is one a generated route may not cover here (the lab's own ranges,
/// loopback, multicast, reserved, link-local).
fn special(a: std::net::IpAddr) -> bool {
    match a {
        std::net::IpAddr::V4(v) => {
            let o = v.octets();
            o[0] == 0 || o[0] == 127 || o[0] >= 224 || (o[0] == 198 && (o[1] & 0xfe) == 18)
        }
        std::net::IpAddr::V6(v) => {
            let s = v.segments();
            (s[0] == 0x2001 && s[1] == 2 && s[2] == 0)
                || s[0] & 0xffc0 == 0xfe80
                || s[0] >> 8 == 0xff
        }
    }
}

#[test]
fn route_decisions_equal_the_kernels_on_a_200k_route_table() {
    let Some(lab) = Line::up("d", &[]) else {
        return;
    };
    // 200 000 IPv4 and 20 000 IPv6 routes shaped like the public tables, through four next
    // hops on both ports: two gateways, a connected link and a gateway with no neighbour
    // entry; and default routes, so every address has an answer.
    let v4 = gen::ipv4(200_000, 7, 4);
    let v6 = gen::ipv6(20_000, 7, 4);
    let hops4 = [
        "via 198.18.1.2",
        "via 198.18.0.1",
        "dev fldut1",
        "via 198.18.1.3",
    ];
    let hops6 = [
        "via 2001:2:0:1::2",
        "via 2001:2::1",
        "dev fldut1",
        "via 2001:2:0:1::3",
    ];
    let mut batch =
        String::from("route add default via 198.18.0.1\nroute add default via 2001:2::1\n");
    let covers_special4 = |p: &flowlane_lpm::Prefix<u32>| {
        let first = std::net::Ipv4Addr::from(p.addr());
        let last = std::net::Ipv4Addr::from(
            p.addr() | (u32::MAX.checked_shr(u32::from(p.len())).unwrap_or(0)),
        );
        special(first.into()) || special(last.into()) || p.len() < 8
    };
    let covers_special6 = |p: &flowlane_lpm::Prefix<u128>| {
        let first = std::net::Ipv6Addr::from(p.addr());
        let last = std::net::Ipv6Addr::from(
            p.addr() | (u128::MAX.checked_shr(u32::from(p.len())).unwrap_or(0)),
        );
        special(first.into()) || special(last.into()) || p.len() < 16
    };
    let mut kept4 = Vec::new();
    for (p, h) in &v4 {
        if !covers_special4(p) {
            batch += &format!("route add {p} {}\n", hops4[*h as usize % 4]);
            kept4.push((*p, *h));
        }
    }
    let mut kept6 = Vec::new();
    for (p, h) in &v6 {
        if !covers_special6(p) {
            batch += &format!("route add {p} {}\n", hops6[*h as usize % 4]);
            kept6.push((*p, *h));
        }
    }
    assert!(
        kept4.len() > 190_000 && kept6.len() > 18_000,
        "{} {}",
        kept4.len(),
        kept6.len()
    );
    let mut add = lab.dut.command("ip");
    add.args(["-batch", "-"]);
    ok(&with_stdin(add, &batch));
    // 4000 IPv4 and 1000 IPv6 addresses: inside routed prefixes and uniform.
    let mut addrs: Vec<std::net::IpAddr> = Vec::new();
    for a in gen::traffic_v4(Traffic::Inside, &kept4, 3000, 11)
        .into_iter()
        .chain(gen::traffic_v4(Traffic::Uniform, &kept4, 1000, 12))
    {
        addrs.push(std::net::Ipv4Addr::from(a).into());
    }
    for a in gen::traffic_v6(Traffic::Inside, &kept6, 700, 13)
        .into_iter()
        .chain(gen::traffic_v6(Traffic::Uniform, &kept6, 300, 14))
    {
        addrs.push(std::net::Ipv6Addr::from(a).into());
    }
    addrs.retain(|a| !special(*a));
    assert!(addrs.len() > 4500, "{}", addrs.len());
    let list: String = addrs.iter().map(|a| format!("{a}\n")).collect();
    // Ours: the FIB loaded from the kernel by rtnetlink, as `forward --mode route` loads it.
    let mut cmd = lab.dut.command(BIN);
    cmd.args(["route", "lookup", "--table", "kernel", "--json", "-"]);
    let ours: Value = serde_json::from_str(&ok(&with_stdin(cmd, &list))).expect("JSON");
    let ours: HashMap<String, String> = ours["lookups"]
        .as_array()
        .expect("lookups")
        .iter()
        .map(|l| {
            (
                l["address"].as_str().expect("address").to_string(),
                l["next_hop_name"]
                    .as_str()
                    .unwrap_or("no route")
                    .to_string(),
            )
        })
        .collect();
    // The kernel's: `ip route get` for each, in one batch.
    let gets: String = addrs.iter().map(|a| format!("route get {a}\n")).collect();
    let mut cmd = lab.dut.command("ip");
    cmd.args(["-batch", "-"]);
    let text = ok(&with_stdin(cmd, &gets));
    let answers: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace) && !l.is_empty())
        .collect();
    assert_eq!(answers.len(), addrs.len(), "one answer per address");
    let mut differ = Vec::new();
    let mut seen = HashMap::new();
    for (a, answer) in addrs.iter().zip(&answers) {
        let key = a.to_string();
        assert!(answer.starts_with(&key), "{answer} answers {key}");
        let kernel = kernel_hop(answer);
        *seen.entry(kernel.clone()).or_insert(0) += 1;
        if ours.get(&key) != Some(&kernel) {
            differ.push(format!("{key}: ours {:?}, kernel {kernel}", ours.get(&key)));
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} differ: {:?}",
        differ.len(),
        addrs.len(),
        &differ[..differ.len().min(10)]
    );
    // Every kind of next hop was asked about (the check is not about one route).
    assert!(seen.len() >= 7, "{seen:?}");
}

/// `flowlane blast --mode raw` from the generator with `args`; its summary.
fn blast(lab: &Line, args: &[&str]) -> Value {
    blast_mode(lab, "raw", args)
}

/// `flowlane blast --mode MODE` from the generator with `args`; its summary.
fn blast_mode(lab: &Line, mode: &str, args: &[&str]) -> Value {
    let out = lab
        .gen
        .command(BIN)
        .args([
            "blast", "--mode", mode, "--dev", "flgen", "--json", "--quiet",
        ])
        .args(args)
        .output()
        .expect("blast runs");
    let j: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("blast JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    common::blast_judged_ok(out.status.code(), j)
}

/// Locally sent IP packets (IPv4 OutRequests + IPv6 Ip6OutRequests) in a namespace.
fn sent_by_host(ns: &Netns) -> u64 {
    let v4 = ns
        .snmp()
        .expect("snmp")
        .get("Ip", "OutRequests")
        .unwrap_or(0);
    let v6 = ns
        .snmp6()
        .expect("snmp6")
        .get("Ip6OutRequests")
        .unwrap_or(0);
    (v4 + v6) as u64
}

/// UDP datagrams `ns`'s kernel took in for a port with no socket (`Udp: NoPorts`).
fn udp_no_ports(ns: &Netns) -> i64 {
    ns.snmp().expect("snmp").get("Udp", "NoPorts").unwrap_or(0)
}

#[test]
fn routed_frames_add_up_and_every_drop_has_its_reason() {
    let Some(lab) = Line::up("a", &[]) else {
        return;
    };
    // A route whose gateway has no neighbour entry; a smaller MTU towards the sink (1280, the
    // least IPv6 keeps its addresses with).
    ok(&lab
        .dut
        .command("ip")
        .args(["route", "add", "198.19.7.0/24", "via", "198.18.1.3"])
        .output()
        .expect("ip"));
    // The router asks the kernel to resolve that gateway each interval; no host answers, and
    // the kernel is told to send no ARP probe for it, so every frame the DUT sends is one
    // this test counts (forwarded, or the kernel's own IP).
    lab.dut
        .write_file("/proc/sys/net/ipv4/neigh/fldut1/mcast_solicit", "0")
        .expect("sysctl");
    ok(&lab
        .dut
        .command("ip")
        .args(["link", "set", "fldut1", "mtu", "1280"])
        .output()
        .expect("ip"));
    pin_neighbours(&lab);
    for backend in ["af-packet", "af-xdp", "xdp"] {
        routed_run(&lab, backend);
    }
}

/// Permanent neighbour entries between the lab's hosts, both families: no kernel sends ARP
/// or neighbour discovery during a run (a probe of a stale entry, an ARP frame no IP counter
/// counts, once made the DUT's port receive one frame more than the sink's kernel sent).
fn pin_neighbours(lab: &Line) {
    use flowlane_lab::setup::*;
    let mac = |ns: &Netns, dev: &str| -> String {
        let out = ns
            .command("ip")
            .args(["-br", "link", "show", dev])
            .output()
            .expect("ip");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.split_whitespace()
            .nth(2)
            .unwrap_or_else(|| panic!("no MAC for {dev}: {text}"))
            .to_string()
    };
    let pairs = [
        (
            &lab.gen,
            "flgen",
            [LAB_DUT_V4, LAB_DUT_V6],
            &lab.dut,
            "fldut",
        ),
        (
            &lab.dut,
            "fldut",
            [LAB_GEN_V4, LAB_GEN_V6],
            &lab.gen,
            "flgen",
        ),
        (
            &lab.dut,
            "fldut1",
            [LAB_SINK_V4, LAB_SINK_V6],
            &lab.sink,
            "flsink",
        ),
        (
            &lab.sink,
            "flsink",
            [LAB_DUT_OUT_V4, LAB_DUT_OUT_V6],
            &lab.dut,
            "fldut1",
        ),
    ];
    for (ns, dev, addrs, peer_ns, peer_dev) in pairs {
        let lladdr = mac(peer_ns, peer_dev);
        for a in addrs {
            ok(&ns
                .command("ip")
                .args(["neigh", "replace", a, "lladdr", &lladdr, "dev", dev])
                .args(["nud", "permanent"])
                .output()
                .expect("ip neigh"));
        }
    }
}

/// One router run with `backend`: traffic routed, and dropped for every reason.
fn routed_run(lab: &Line, backend: &str) {
    // The native XDP router redirects into veth, whose far ends then run XDP.
    let _pass = (backend == "xdp").then(|| {
        (
            common::xdp_pass(&lab.gen, "flgen"),
            common::xdp_pass(&lab.sink, "flsink"),
        )
    });
    quiet(lab);
    let mut cmd = lab.dut.command(BIN);
    cmd.args([
        "forward", "--mode", "route", "--dev", "fldut", "--dev", "fldut1",
    ])
    .args(["--backend", backend]);
    let fwd = Forwarder::start(cmd);
    let (host0, sink0) = (sent_by_host(&lab.dut), sent_by_host(&lab.sink));
    let hdr_errors0 = lab.sink.snmp().expect("snmp").get("Ip", "InHdrErrors");
    let no_ports = || udp_no_ports(&lab.dut);
    let no_ports0 = no_ports();
    let sent = |j: &Value| j["tx_packets"].as_u64().expect("tx_packets");
    let send = |to: &str, count: u64, extra: &[&str]| {
        let c = count.to_string();
        let mut args = vec!["--to", to, "--count", &c];
        args.extend_from_slice(extra);
        let n = sent(&blast(lab, &args));
        assert_eq!(n, count);
        n
    };
    let (v4, v6) = ("198.18.1.2:9000", "[2001:2:0:1::2]:9000");
    let flows = ["--rate", "20k", "--flows", "4", "--sport", "1000-1003"];
    // Routed: IPv4 and IPv6, four flows each, each run into its own sink (flow ids are per
    // run).
    let mut good = 0;
    let mut passed = 0;
    for (to, count) in [(v4, 20_000), (v6, 10_000)] {
        let sink = sink_start(lab, count);
        good += send(to, count, &flows);
        sink_check(sink, count);
    }
    // Dropped, each for its reason (IPv6 ones passed where IPv6 is not routed).
    let no_route = send("198.19.9.9:9000", 1000, &[]);
    let no_neigh = send("198.19.7.7:9000", 500, &[]);
    // To the router's own address: the kernel's (it answers with port unreachables), never
    // a neighbour without a MAC.
    passed += send("198.18.0.2:9000", 200, &[]);
    let too_big = send(v4, 300, &["--size", "1400"]) + send(v6, 100, &["--size", "1400"]);
    let ttl = send(v4, 200, &["--ttl", "1"]) + send(v6, 100, &["--ttl", "1"]);
    // The last ICMP errors the sink's kernel answers with have come back through.
    quiet(lab);
    let (code, r) = fwd.finish();
    let host = sent_by_host(&lab.dut) - host0;
    // The datagrams to the router's own address reached its kernel (no socket on that port:
    // each counted there as NoPorts), on every backend.
    assert_eq!(
        no_ports() - no_ports0,
        200,
        "{backend}: datagrams to the router's address that its kernel got"
    );
    let from_sink = sent_by_host(&lab.sink) - sink0;
    assert_eq!(code, Some(0), "{r}");
    let t = &r["total"];
    let d = &t["dropped"];
    let n = |v: &Value| v.as_u64().expect("a count");
    assert_eq!(n(&d["no_route"]), no_route, "{r}");
    assert_eq!(n(&d["no_neighbour"]), no_neigh, "{r}");
    assert_eq!(n(&d["too_big"]), too_big, "{r}");
    assert_eq!(n(&d["ttl_exceeded"]), ttl, "{r}");
    assert!(n(&t["to_host"]) >= passed, "{r}");
    for k in ["not_ip", "malformed", "truncated", "tx_full"] {
        assert_eq!(n(&d[k]), 0, "{k}: {r}");
    }
    assert_eq!(n(&t["ring_drops"]), 0, "{r}");
    // Looked at = forwarded + left to the host + dropped; = what the ports received.
    let dropped: u64 = d.as_object().expect("drops").values().map(n).sum();
    assert_eq!(
        n(&t["rx_packets"]),
        n(&t["forwarded"]) + n(&t["to_host"]) + dropped,
        "{r}"
    );
    let ports = r["ports"].as_array().expect("ports");
    let port_sum = |k: &str| ports.iter().map(|p| n(&p[k])).sum::<u64>();
    assert_eq!(n(&t["rx_packets"]), port_sum("rx_packets"), "{r}");
    // What left = forwarded + what the DUT's own kernel sent (ICMP errors it answers with,
    // e.g. IPv6 unreachables for the unrouted ones; its forwarding is off).
    assert_eq!(port_sum("tx_packets"), n(&t["forwarded"]) + host, "{r}");
    // What came in from the sink's side is what the sink's kernel sent (its ICMP port
    // unreachables, rate-limited), all routed back: forwarded = routed datagrams + those.
    assert_eq!(n(&ports[1]["rx_packets"]), from_sink, "{r}");
    assert_eq!(n(&t["forwarded"]), good + from_sink, "{r}");
    // The sink's own kernel, an independent parser, found every routed IPv4 header sound:
    // the TTL decrement kept the header checksum right.
    let hdr_errors = lab.sink.snmp().expect("snmp").get("Ip", "InHdrErrors");
    assert_eq!(
        hdr_errors, hdr_errors0,
        "IPv4 header errors at the sink ({backend})"
    );
}

/// A socket sender on the generator with checksum offload on (veth's default) hands the
/// router datagrams whose UDP checksum holds only the pseudo header's sum; every backend
/// completes them (see [`common::offloaded_checksums_leave_complete`]).
#[test]
fn checksums_left_to_offload_leave_the_router_complete() {
    let Some(lab) = Line::up("k", &[]) else {
        return;
    };
    common::offloaded_checksums_leave_complete(&lab, "route", "198.18.1.2:9000");
}

/// Flooded faster than it routes, the AF_XDP router counts every frame once: what its ports
/// received (the interfaces' counters) = what its workers looked at + what the sockets' own
/// drop counts (XDP_STATISTICS) say the kernel dropped for them. Summing the fill-ring-empty
/// count with `rx_dropped` counted each such drop twice (measured: exactly twice).
#[test]
fn an_overloaded_af_xdp_router_counts_every_frame_once() {
    let Some(lab) = Line::up("o", &[]) else {
        return;
    };
    quiet(&lab);
    let mut cmd = lab.dut.command(BIN);
    cmd.args([
        "forward", "--mode", "route", "--dev", "fldut", "--dev", "fldut1",
    ])
    .args(["--backend", "af-xdp", "--cpus", "1"]);
    let fwd = Forwarder::start(cmd);
    let rx0 = lab.dut.dev().expect("counters").ifaces["fldut"].rx_packets;
    // Unpaced AF_XDP frames from one core against one routing core: on a 2-core machine the
    // generator sends about twice what the router takes off its sockets.
    let b = blast_mode(
        &lab,
        "xdp",
        &[
            "--to",
            "198.18.1.2:9000",
            "--count",
            "400000",
            "--cpus",
            "0",
        ],
    );
    assert_eq!(b["tx_packets"], 400_000, "{b}");
    quiet(&lab);
    let (code, r) = fwd.finish();
    assert_eq!(code, Some(0), "{r}");
    let rx = lab.dut.dev().expect("counters").ifaces["fldut"].rx_packets - rx0;
    assert!(
        rx >= 400_000,
        "the router's interface got every frame: {rx}"
    );
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("a count: {r}"));
    let ports = r["ports"].as_array().expect("ports");
    let port_rx: u64 = ports.iter().map(|p| n(&p["rx_packets"])).sum();
    let t = &r["total"];
    assert_eq!(n(&t["rx_packets"]) + n(&t["ring_drops"]), port_rx, "{r}");
    if n(&t["ring_drops"]) == 0 {
        eprintln!("note: the router kept up this time; the drop count was not exercised");
    }
}

#[test]
fn routes_change_while_forwarding_and_no_frame_is_lost() {
    let Some(lab) = Line::up("c", &[]) else {
        return;
    };
    route_changes_run(&lab, "af-packet");
}

/// The same with the native XDP router, whose table lives in BPF maps the program reads:
/// rebuilt into the maps' other half and switched to, entry by entry, while frames flow.
#[test]
fn routes_change_under_the_native_xdp_router_and_no_frame_is_lost() {
    let Some(lab) = Line::up("g", &[]) else {
        return;
    };
    route_changes_run(&lab, "xdp");
}

/// 60 000 datagrams through the router while 70 000 route changes land, then a change that
/// turns the destination into a blackhole, each seen applied.
fn route_changes_run(lab: &Line, backend: &str) {
    // The native router redirects into veth, whose far ends then run XDP.
    let _pass = (backend == "xdp").then(|| {
        (
            common::xdp_pass(&lab.gen, "flgen"),
            common::xdp_pass(&lab.sink, "flsink"),
        )
    });
    quiet(lab);
    let mut cmd = lab.dut.command(BIN);
    cmd.args([
        "forward", "--mode", "route", "--dev", "fldut", "--dev", "fldut1",
    ])
    .args(["--backend", backend, "--interval", "0.2"]);
    let mut fwd = Forwarder::start_stream(cmd);
    // 60 000 datagrams at 20 000/s through the router while 50 000 routes are added, the
    // destination's own route is overridden by a more specific one (a gateway where it was a
    // connected link), and 20 000 routes are removed.
    let sink = sink_start(lab, 60_000);
    let gen_ns = Netns::existing(lab.gen.name());
    let sender = std::thread::spawn(move || {
        gen_ns
            .command(BIN)
            .args([
                "blast",
                "--mode",
                "raw",
                "--dev",
                "flgen",
                "--to",
                "198.18.1.2:9000",
            ])
            .args([
                "--count",
                "60000",
                "--rate",
                "20k",
                "--flows",
                "4",
                "--sport",
                "1000-1003",
            ])
            .args(["--json", "--quiet"])
            .output()
            .expect("blast runs")
    });
    let routes: Vec<_> = gen::ipv4(80_000, 21, 1)
        .into_iter()
        .filter(|(p, _)| p.len() >= 8 && !special(std::net::Ipv4Addr::from(p.addr()).into()))
        .take(50_000)
        .collect();
    assert_eq!(routes.len(), 50_000);
    let add: String = routes
        .iter()
        .map(|(p, _)| format!("route add {p} via 198.18.1.2\n"))
        .collect();
    let del: String = routes[..20_000]
        .iter()
        .map(|(p, _)| format!("route del {p}\n"))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    for batch in [add, "route add 198.18.1.0/25 via 198.18.1.2\n".into(), del] {
        let mut cmd = lab.dut.command("ip");
        cmd.args(["-batch", "-"]);
        ok(&with_stdin(cmd, &batch));
    }
    let out = sender.join().expect("sender");
    let b = common::blast_judged_ok(
        out.status.code(),
        serde_json::from_slice(&out.stdout).expect("JSON"),
    );
    assert_eq!(b["tx_packets"].as_u64(), Some(60_000));
    sink_check(sink, 60_000);
    // The router says, each interval, what its forwarding path holds: wait (bounded) until
    // it holds every change so far — two connected routes + 50 000 − 20 000 + the /25.
    let tables = |i: &serde_json::Value, k: &str| i["tables"][k].as_u64().unwrap_or(0);
    let settled = fwd.until_record(600, |i| tables(i, "routes_v4") == 30_003);
    let v6 = tables(&settled, "routes_v6");
    // An address the router gains while it runs: frames to it are the kernel's from then on
    // (not a neighbour without a MAC). Then a change that matters: the upper half of the
    // sink's link becomes a blackhole, and once the router has applied it frames there are
    // dropped; IPv6 too, the upper half of the sink's /64.
    ok(&lab
        .dut
        .command("ip")
        .args(["addr", "add", "198.18.0.77/24", "dev", "fldut"])
        .output()
        .expect("ip"));
    for blackhole in ["198.18.1.128/25", "2001:2:0:1:8000::/65"] {
        ok(&lab
            .dut
            .command("ip")
            .args(["route", "add", "blackhole", blackhole])
            .output()
            .expect("ip"));
    }
    let mac_of = |ns: &Netns, dev: &str| {
        let link = ns
            .command("ip")
            .args(["-br", "link", "show", dev])
            .output()
            .expect("ip");
        String::from_utf8_lossy(&link.stdout)
            .split_whitespace()
            .nth(2)
            .unwrap_or_else(|| panic!("{dev}'s MAC"))
            .to_string()
    };
    let dut_mac = mac_of(&lab.dut, "fldut");
    // Applied once a record shows both blackholes (the address came first in the kernel's
    // change stream, which the router reads in order): the native router's record goes out
    // after its maps are rewritten, the others' after the workers' tables are replaced.
    let applied = fwd.until_record(600, |i| {
        tables(i, "routes_v4") == 30_004 && tables(i, "routes_v6") == v6 + 1
    });
    assert!(
        applied["tables"]["last_update_ms"].as_f64().is_some(),
        "{applied}"
    );
    // The record's count of changes is the changes issued: 50 000 + 1 + 20 000 + the two
    // blackholes (or fewer counted one by one, where the stream overran and was re-read).
    assert!(
        tables(&applied, "changes_applied") >= 70_003 || tables(&applied, "reloads") > 0,
        "{applied}"
    );
    // 100 frames from the generator to `to`, addressed to the router.
    let send_100 = |to: &str| {
        let out = lab
            .gen
            .command(BIN)
            .args(["blast", "--mode", "raw", "--dev", "flgen", "--to", to])
            .args(["--dst-mac", &dut_mac])
            .args(["--count", "100", "--json", "--quiet"])
            .output()
            .expect("blast runs");
        common::blast_judged_ok(
            out.status.code(),
            serde_json::from_slice(&out.stdout).expect("JSON"),
        );
    };
    for to in [
        "198.18.1.200:9000",
        "[2001:2:0:1:8000::5]:9000",
        "198.18.0.77:9000",
    ] {
        send_100(to);
    }
    // A route changed in place: the IPv4 blackhole becomes a route through the sink (a next
    // hop already in use, no neighbour's or own address inside), and frames there reach the
    // sink. The native router rewrites only the entries the route covers, not the whole
    // table (its records count whole writes). First the lab falls quiet and the router's
    // records stop counting updates (neighbours the blasts above taught the DUT), so the
    // update waited for is the route's alone.
    // A record after which nothing changed for an interval.
    let calm = |fwd: &mut Forwarder| {
        quiet(lab);
        let last = std::cell::Cell::new(u64::MAX);
        fwd.until_record(600, |i| {
            let u = tables(i, "updates");
            last.replace(u) == u
        })
    };
    let calm_1 = calm(&mut fwd);
    ok(&lab
        .dut
        .command("ip")
        .args(["route", "replace", "198.18.1.128/25", "via", "198.18.1.2"])
        .output()
        .expect("ip"));
    let replaced = fwd.until_record(600, |i| {
        tables(i, "changes_applied") > tables(&calm_1, "changes_applied")
    });
    assert_eq!(
        tables(&replaced, "whole"),
        tables(&calm_1, "whole"),
        "{backend}: a route through a next hop in use took a whole write: {replaced}"
    );
    // 100 frames through the router to `to`, every one at the sink.
    let reach_sink = |to: &str| {
        let sink = sink_start(lab, 100);
        send_100(to);
        sink_check(sink, 100);
    };
    reach_sink("198.18.1.200:9000");
    // A neighbour the router learns while it runs — a second address of the sink's host,
    // then the same address at another MAC: each a host route changed in place (the
    // native router writes a new next-hop entry and the one route), not a whole write;
    // frames to it reach the sink each time.
    let sink_mac = mac_of(&lab.sink, "flsink");
    for mac in [sink_mac.as_str(), "02:00:00:00:99:99"] {
        let before = calm(&mut fwd);
        ok(&lab
            .dut
            .command("ip")
            .args(["neigh", "replace", "198.18.1.99", "lladdr", mac])
            .args(["dev", "fldut1", "nud", "permanent"])
            .output()
            .expect("ip"));
        let learnt = fwd.until_record(600, |i| tables(i, "updates") > tables(&before, "updates"));
        assert_eq!(
            tables(&learnt, "whole"),
            tables(&before, "whole"),
            "{backend}: a neighbour at {mac} took a whole write: {learnt}"
        );
        reach_sink("198.18.1.99:9000");
    }
    // The IPv6 table grows past the room the native router made at start (twice the table
    // and 4 096 routes more): it makes new maps and replaces each port's program in one
    // step, forwarding throughout; frames to a new route reach the sink.
    let grown: String = (0..5_000)
        .map(|k| format!("route add 2001:2:0:2:{k:x}::/80 via 2001:2:0:1::2\n"))
        .collect();
    let mut cmd = lab.dut.command("ip");
    cmd.args(["-6", "-batch", "-"]);
    ok(&with_stdin(cmd, &grown));
    let v6_before = tables(&replaced, "routes_v6");
    fwd.until_record(600, |i| tables(i, "routes_v6") == v6_before + 5_000);
    reach_sink("[2001:2:0:2:1234::9]:9000");
    quiet(lab);
    let (code, r) = fwd.finish_stream();
    assert_eq!(code, Some(0), "{r}");
    let t = &r["total"];
    assert_eq!(t["dropped"]["no_route"].as_u64(), Some(200), "{r}");
    assert_eq!(t["dropped"]["no_neighbour"].as_u64(), Some(0), "{r}");
    assert!(t["to_host"].as_u64().expect("to_host") >= 100, "{r}");
    let rt = &r["routes"];
    // Two connected routes + 50 000 − 20 000 + the /25 + the blackhole, each change applied
    // — one by one, or, where the kernel's change messages overran the monitor's socket
    // (a native-router rebuild of a debug build takes long enough), by reading the whole
    // table again and applying what differs.
    assert_eq!(rt["routes_v4"].as_u64(), Some(30_004), "{rt}");
    assert!(
        rt["changes_applied"].as_u64().expect("changes") >= 70_004
            || rt["reloads"].as_u64().expect("reloads") > 0,
        "{rt}"
    );
    assert_eq!(rt["discard"].as_u64(), Some(2), "{rt}");
}

/// Gateways the kernel has no neighbour entry for (the router forwards past the kernel, so
/// nothing of the kernel's own would ever resolve them): the router asks the kernel to
/// resolve them — ARP for IPv4, a neighbour solicitation for IPv6, whose unicast
/// advertisement must reach the kernel past the AF_XDP and native programs — and then
/// routes through them; frames sent after that reach the sink, none dropped as no
/// neighbour. Then an address the router gains while it runs: datagrams to it reach its
/// kernel (past the AF_XDP program too, which learns the address).
#[test]
fn gateways_are_resolved_and_addresses_gained_reach_the_kernel() {
    let Some(lab) = Line::up("n", &[]) else {
        return;
    };
    let ip = |args: &[&str]| {
        ok(&lab.dut.command("ip").args(args).output().expect("ip"));
    };
    ip(&["route", "add", "198.19.8.0/24", "via", "198.18.1.2"]);
    ip(&[
        "-6",
        "route",
        "add",
        "2001:2:0:8::/64",
        "via",
        "2001:2:0:1::2",
    ]);
    for backend in ["af-packet", "af-xdp", "xdp"] {
        let _pass = (backend == "xdp").then(|| {
            (
                common::xdp_pass(&lab.gen, "flgen"),
                common::xdp_pass(&lab.sink, "flsink"),
            )
        });
        // The lab's entries (permanent, or learnt in the last run) gone.
        for gw in ["198.18.1.2", "2001:2:0:1::2"] {
            ip(&["neigh", "del", gw, "dev", "fldut1"]);
        }
        quiet(&lab);
        let mut cmd = lab.dut.command(BIN);
        cmd.args([
            "forward", "--mode", "route", "--dev", "fldut", "--dev", "fldut1",
        ])
        .args(["--backend", backend, "--interval", "0.2"]);
        let mut fwd = Forwarder::start_stream(cmd);
        // Resolved in the kernel (bounded), then two more records: the router's tables
        // took the MACs in.
        let resolved = || {
            let out = lab
                .dut
                .command("ip")
                .args(["neigh", "show", "dev", "fldut1"])
                .output();
            let text = String::from_utf8_lossy(&out.expect("ip").stdout).to_string();
            ["198.18.1.2 lladdr", "2001:2:0:1::2 lladdr"]
                .iter()
                .all(|e| text.contains(e))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while !resolved() {
            assert!(
                std::time::Instant::now() < deadline,
                "{backend}: the gateways were not resolved"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        for _ in 0..2 {
            fwd.until_record(1, |_| true);
        }
        for to in ["198.19.8.8:9000", "[2001:2:0:8::8]:9000"] {
            let sink = sink_start(&lab, 100);
            let b = blast(&lab, &["--to", to, "--count", "100"]);
            assert_eq!(b["tx_packets"].as_u64(), Some(100), "{b}");
            sink_check(sink, 100);
        }
        let updates = |i: &Value| i["tables"]["updates"].as_u64().unwrap_or(0);
        let before = fwd.until_record(1, |_| true);
        ip(&["addr", "add", "198.18.1.77/24", "dev", "fldut1"]);
        fwd.until_record(600, |i| updates(i) > updates(&before));
        let no_ports = || udp_no_ports(&lab.dut);
        let no_ports0 = no_ports();
        let b = blast(&lab, &["--to", "198.18.1.77:9000", "--count", "100"]);
        assert_eq!(b["tx_packets"].as_u64(), Some(100), "{b}");
        // Counted by the kernel as it takes each in (bounded wait).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while no_ports() - no_ports0 < 100 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(
            no_ports() - no_ports0,
            100,
            "{backend}: datagrams to an address gained that the kernel got"
        );
        ip(&["addr", "del", "198.18.1.77/24", "dev", "fldut1"]);
        let (code, r) = fwd.finish_stream();
        assert_eq!(code, Some(0), "{r}");
        assert_eq!(
            r["total"]["dropped"]["no_neighbour"].as_u64(),
            Some(0),
            "{r}"
        );
        let asked = r["routes"]["neighbour_requests"].as_u64().unwrap_or(0);
        assert!(asked >= 2, "{backend}: {r}");
        assert_eq!(
            r["routes"]["neighbour_requests_refused"].as_u64(),
            Some(0),
            "{backend}: {r}"
        );
    }
}

#[test]
fn a_generated_table_with_a_next_hops_file_routes_as_written() {
    let Some(lab) = Line::up("f", &[]) else {
        return;
    };
    quiet(&lab);
    // `route gen` writes 10 000 routes over next hops 0-3; the sink's link is hop 0, through
    // the sink as gateway; hop 1 goes to the sink by MAC; hop 3, the generator's link,
    // through the generator (for the sink's ICMP answers); everything else is dropped.
    let dir = std::env::temp_dir().join(format!("flr-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let table = dir.join("table.txt");
    let out = Command::new(BIN)
        .args([
            "route",
            "gen",
            "--v4",
            "10000",
            "--seed",
            "3",
            "--next-hops",
            "4",
        ])
        .output()
        .expect("route gen");
    let mut text = ok(&out);
    text += "198.18.1.0/25 0\n198.18.1.128/26 1\n198.18.1.192/26 2\n198.18.0.0/24 3\n";
    std::fs::write(&table, text).expect("write table");
    let hops = dir.join("hops.txt");
    std::fs::write(
        &hops,
        "0 fldut1 198.18.1.2\n1 fldut1 02:f1:0e:00:02:02\n3 fldut 198.18.0.1\n* drop\n",
    )
    .expect("write hops");
    let mut cmd = lab.dut.command(BIN);
    cmd.args([
        "forward", "--mode", "route", "--dev", "fldut", "--dev", "fldut1",
    ])
    .args(["--backend", "af-packet", "--routes"])
    .arg(&table)
    .arg("--next-hops")
    .arg(&hops);
    let fwd = Forwarder::start(cmd);
    let sink = sink_start(&lab, 3000);
    for to in ["198.18.1.2:9000", "198.18.1.130:9000", "198.18.1.200:9000"] {
        let out = lab
            .gen
            .command(BIN)
            .args(["blast", "--mode", "raw", "--dev", "flgen", "--to", to])
            .args(["--count", "1500", "--rate", "20k", "--json", "--quiet"])
            .output()
            .expect("blast runs");
        common::blast_judged_ok(
            out.status.code(),
            serde_json::from_slice(&out.stdout).expect("JSON"),
        );
    }
    let (code, r) = fwd.finish();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(0), "{r}");
    // Hop 0 and hop 1 reach the sink (1500 each: its sink stops at 3000); hop 2 is dropped.
    let out = sink.wait_with_output().expect("sink ends");
    let s: Value = serde_json::from_slice(&out.stdout).expect("sink JSON");
    assert_eq!(s["flowlane_packets"].as_u64(), Some(3000), "{s}");
    assert_eq!(
        r["total"]["dropped"]["no_route"].as_u64(),
        Some(1500),
        "{r}"
    );
    let rt = &r["routes"];
    assert_eq!(rt["routes_v4"].as_u64(), Some(10_004), "{rt}");
    assert_eq!(rt["next_hops"].as_u64(), Some(4), "{rt}");
    // Whatever came from the sink's side went back to the generator.
    let t = &r["total"];
    assert_eq!(
        t["forwarded"].as_u64(),
        r["ports"][1]["rx_packets"].as_u64().map(|n| n + 3000),
        "{r}"
    );
}

/// `--flow-cache` (issue 53 item 2): 100 flows through the router, ten frames each, are
/// decided 100 times and found the other 900; a blackhole route added in the DUT's kernel
/// makes every cached decision stale, so the same flows' next frames are dropped as having
/// no route — none follows the old decision. On both user-space backends.
#[test]
fn a_flow_cache_skips_lookups_and_never_outlives_a_route_change() {
    let Some(lab) = Line::up("c", &[]) else {
        return;
    };
    pin_neighbours(&lab);
    quiet(&lab);
    let blast = || {
        let out = lab
            .gen
            .command(BIN)
            .args(["blast", "--mode", "raw", "--dev", "flgen"])
            .args([
                "--to",
                "198.18.1.2:9000",
                "--flows",
                "100",
                "--sport",
                "1024-1123",
            ])
            .args(["--count", "1000", "--rate", "20k", "--json", "--quiet"])
            .output()
            .expect("blast runs");
        common::blast_judged_ok(
            out.status.code(),
            serde_json::from_slice(&out.stdout).expect("JSON"),
        );
    };
    for backend in ["af-packet", "af-xdp"] {
        let mut cmd = lab.dut.command(BIN);
        cmd.args([
            "forward", "--mode", "route", "--dev", "fldut", "--dev", "fldut1",
        ])
        .args(["--backend", backend, "--flow-cache", "4096"]);
        let mut fwd = Forwarder::start_stream(cmd);
        let sink = sink_start(&lab, 1000);
        blast();
        sink_check(sink, 1000);
        // The route changes under the cached flows.
        ok(&lab
            .dut
            .command("ip")
            .args(["route", "add", "blackhole", "198.18.1.2/32"])
            .output()
            .expect("ip"));
        // Applied once a status record counts the change (the workers' tables replaced).
        fwd.until_record(60, |i| {
            i["tables"]["changes_applied"].as_u64().unwrap_or(0) >= 1
        });
        blast();
        let (code, r) = fwd.finish_stream();
        ok(&lab
            .dut
            .command("ip")
            .args(["route", "del", "blackhole", "198.18.1.2/32"])
            .output()
            .expect("ip"));
        assert_eq!(code, Some(0), "{r}");
        let t = &r["total"];
        let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("a count: {v}"));
        assert_eq!(n(&t["dropped"]["no_route"]), 1000, "{backend}: {r}");
        assert!(n(&t["forwarded"]) >= 1000, "{backend}: {r}");
        let c = &t["flow_cache"];
        // Every lookup either found its flow or added it.
        assert_eq!(
            n(&c["lookups"]),
            n(&c["hits"]) + n(&c["inserts"]),
            "{backend}: {c}"
        );
        // 100 flows (and the sink's few ICMP errors back) added once each.
        assert!((100..=104).contains(&n(&c["inserts"])), "{backend}: {c}");
        assert!(n(&c["hits"]) >= 1890, "{backend}: {c}");
        // Each of the 100 flows met its decision stale once, after the change.
        assert!((100..=104).contains(&n(&c["stale"])), "{backend}: {c}");
        assert_eq!(n(&c["evicted"]), 0, "{backend}: {c}");
    }
}
