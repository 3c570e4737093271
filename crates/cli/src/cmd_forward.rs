//! `flowlane forward`: flowlane as the device under test — a reflector and a router on our FIB.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use flowlane_tools::backend::Backend;
use flowlane_tools::forward::{
    self, ForwardConfig, ForwardEvent, ForwardMode, ForwardReport, Mode, NotIp, RouteSource,
};

use crate::args::{backend_line, parse_cpu_list, parse_duration, print_json, CpuList};
use crate::live::{stop_on_signals, LiveArgs};
use crate::{CmdResult, Failure};
use flowlane_tools::doctor::RunDev;

/// Forward frames as a device under test: reflect, bridge two ports, or route IPv4/IPv6 on our FIB.
///
/// `--mode reflect` turns each frame around on the interface it came in on: MACs swapped and,
/// with `--swap ip,ports`, addresses and UDP/TCP ports too, so a `flowlane blast --echo` (or
/// any UDP client) on the other side gets its datagrams back and counts loss, reordering and
/// round-trip latency through the reflector. Checksums stay valid without being touched:
/// swapping two fields of one checksum's coverage leaves its sum as it was.
///
/// Backends (chosen once; the summary says which carried the run):
///   xdp        a generated XDP program in the driver swaps and returns XDP_TX: no user
///              space at all; the CPU that received a frame sends it back. Needs native XDP
///              (veth has it; its peer must run an XDP program to take the frames back —
///              GRO alone is not enough on Linux 6.18 — else they show as refused).
///   af-xdp     one pinned worker per receive queue, each with that queue's AF_XDP socket
///              (zero-copy where the driver offers it, else copy mode; an XDP program
///              redirects the queue's frames to it): frames are
///              turned around where they lie in the socket's memory, and the kernel's stack
///              never sees them.
///   af-packet  one pinned worker per CPU (--cpus), each with an AF_PACKET receive ring (the
///              frames the kernel received on its CPU) and a transmit ring. The kernel still
///              sees every frame: give the interface no address, or the host answers too.
///
/// `--mode route` routes between its interfaces (--dev, given once per port): each frame's
/// destination is looked up in our FIB (longest-prefix match; loaded from the kernel's main
/// table, or from a file that `flowlane route gen` or `ip route show` wrote), the next hop's
/// MAC comes from the kernel's neighbour table (read again each second; a gateway missing
/// from it is asked of the kernel, which sends ARP or a neighbour solicitation — at once, then
/// backing off to once a minute while it stays unresolved) or a next-hops file, the TTL / hop limit is decremented with an incremental checksum update, and the frame
/// leaves by the route's interface. Frames for this host (multicast, broadcast, its own
/// addresses) are left to the kernel. Route and bridge run on AF_XDP (one worker per receive
/// queue, with a socket on every port over one UMEM: a frame received on one port leaves by
/// another from where it lies, never copied; for the router, an XDP program hands only
/// unicast IP to the sockets and passes the rest — ARP, neighbour discovery, IPv6 to
/// link-local addresses, frames to this host's own addresses — to the kernel, counted) or on AF_PACKET (one worker per CPU, a receive and a transmit ring on every port;
/// the kernel gets a copy of every frame: turn its own forwarding off, sysctl
/// net.ipv4.ip_forward=0, or every frame is forwarded twice). With --backend xdp (the
/// default) no user space is on the path: a generated program on every port looks the
/// destination up in BPF maps (IPv4 in a DIR-24-8 table, IPv6 in the kernel's LPM trie) and
/// redirects the frame; the rest (ARP, neighbour discovery, link-local) goes to the kernel.
/// Route, neighbour and address changes are applied each --interval on every backend. With
/// xdp a route, neighbour or address change rewrites only the table entries it covers (under
/// 1 ms with 950 000 routes, as the user-space backends' FIB); a gateway's new MAC (every
/// route through it) writes the whole table beside the one in use and switches to it
/// (~110–160 ms), and a table that outgrew its maps gets new ones; no frame meets a half-written table. The status line says
/// when the tables changed, how many route changes that was, how long it took to reach the
/// forwarding path and whether the table was written whole; `--json-stream` records carry the
/// route counts the path uses (`tables`), something to wait on after changing routes.
///
/// `--mode bridge` is a learning bridge between its interfaces (--dev, twice or more): the
/// source MAC of every frame is learnt into one table all workers share (entries unseen for
/// --ageing seconds are forgotten); a frame to a known MAC leaves by that port, one to the
/// port it came in by is filtered, and broadcast, multicast and unknown unicast are flooded
/// out of every other port (with AF_XDP, the copies go into free frames of the shared UMEM).
/// With --backend xdp no user space is on the path: a generated program on every port learns
/// into a BPF hash map and redirects through a device map (flooding with the kernel's
/// broadcast redirect); the table is aged from user space. On veth, the far ends must run an
/// XDP program to take redirected frames.
/// With AF_PACKET, ports are put in promiscuous mode while it runs; give them no addresses
/// (the kernel receives a copy of every frame).
///
/// A UDP/TCP checksum that a sender on this host left to the device (checksum offload: only
/// the pseudo header's sum is in the frame) is completed on every backend before the frame
/// leaves — AF_PACKET is told which frames these are, AF_XDP and XDP tell them by the field
/// — and counted (checksum completed); native XDP sums segments of up to 1504 bytes and
/// drops a longer one, counted (checksum unfinished). With native XDP on veth, the far end
/// must run an XDP program to take XDP_TX or redirected frames: where it is in this
/// namespace a run without one is refused before the first frame, else the first status
/// line with refused frames says so with the fix, and the run exits 1.
///
/// Every frame the forwarder looked at is counted as forwarded, left to the host, or dropped
/// by reason (not IP, malformed, truncated, transmit ring full; route: no route, no
/// neighbour, TTL exceeded, too big; bridge: filtered); the summary sets them beside the
/// interfaces' own counters. Ctrl-C stops and prints the summary.
///
/// Examples:
///   flowlane forward --mode reflect --dev veth1 --swap ip,ports
///   flowlane forward --mode reflect --dev veth1 --backend af-packet --cpus 0-1 --duration 10 --json
///   flowlane forward --mode route --dev fldut --dev fldut1 --backend af-xdp   # a line lab's DUT
///   flowlane forward --mode bridge --dev fldut --dev fldut1 --backend xdp     # a switched lab's DUT
///   flowlane forward --mode route --dev eth1 --dev eth2 --backend af-packet \
///       --routes table.txt --next-hops hops.txt
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ForwardArgs {
    /// What to do with frames.
    #[arg(long, value_enum, default_value_t = ModeArg::Reflect)]
    mode: ModeArg,

    /// Interface to forward on (route: once per port, e.g. --dev eth1 --dev eth2).
    #[arg(long, required = true)]
    dev: Vec<String>,

    /// Route: where routes come from — `kernel` (this namespace's main table, the default)
    /// or a table file: `PREFIX/LEN NEXTHOP` lines as `flowlane route gen` writes (then give
    /// --next-hops) or `ip route show` output.
    #[arg(long, value_name = "kernel|FILE")]
    routes: Option<String>,

    /// Bridge: seconds a MAC not seen is kept in the table (default 300, as the Linux bridge).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..))]
    ageing: Option<u32>,

    /// Route: what the numbered next hops of a table file are, one per line: `HOP DEV MAC`,
    /// `HOP DEV GATEWAY-IP` (MAC from the kernel's neighbour table) or `HOP drop`; `*` for
    /// every hop not listed.
    #[arg(long, value_name = "FILE")]
    next_hops: Option<std::path::PathBuf>,

    /// Route: a flow cache in front of the routing table (TRASH's idea), this many flows per
    /// worker (~80 bytes each, allocated at the start): a flow's later frames skip the route
    /// and neighbour lookups. Any route or neighbour change makes every cached decision stale
    /// (decided again, counted). The user-space backends only (af-packet, af-xdp).
    #[arg(long, value_name = "FLOWS", value_parser = clap::value_parser!(u64).range(1..=(1 << 26)))]
    flow_cache: Option<u64>,

    /// How frames reach the forwarder.
    #[arg(long, value_enum, default_value_t = BackendArg::Xdp)]
    backend: BackendArg,

    /// Swap more than the MACs: `ip`, `ports`, or `ip,ports`.
    #[arg(long, value_delimiter = ',', value_enum)]
    swap: Vec<SwapArg>,

    /// Frames that are not IP, when addresses or ports are swapped: `pass` them to the
    /// kernel (ARP keeps working) or `drop` them. Default: pass; with AF_XDP, drop (its
    /// program takes every frame; with `pass` it hands the sockets only IP and counts what it
    /// passed). AF_PACKET cannot drop (it receives a copy).
    #[arg(long, value_enum)]
    not_ip: Option<NotIpArg>,

    /// Workers' CPUs, e.g. 0-3 or 1,3 (default: every usable CPU). AF_PACKET: one worker
    /// each; AF_XDP: one worker per receive queue, on these in turn. Native XDP runs where RSS
    /// puts each frame: refused there.
    #[arg(long, value_parser = parse_cpu_list)]
    cpus: Option<CpuList>,

    /// Stop after this long (default: at Ctrl-C).
    #[arg(long, short = 't', value_parser = parse_duration)]
    duration: Option<f64>,

    #[command(flatten)]
    rings: crate::args::RingMemoryArg,

    #[command(flatten)]
    live: LiveArgs,
}

#[derive(PartialEq, Eq, Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    /// Send every frame back out of the interface it came in on.
    Reflect,
    /// Route between the interfaces on our FIB (IPv4 and IPv6).
    Route,
    /// Bridge the interfaces: learn MACs, flood the unknown.
    Bridge,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendArg {
    /// A generated XDP program in the driver (reflect: XDP_TX; bridge: redirects).
    Xdp,
    /// AF_XDP sockets, one worker per receive queue; frames turned around in the UMEM.
    AfXdp,
    /// AF_PACKET receive and transmit rings, one worker per CPU.
    AfPacket,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SwapArg {
    /// Source and destination IP addresses.
    Ip,
    /// Source and destination UDP/TCP ports.
    Ports,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum NotIpArg {
    /// To the kernel's stack.
    Pass,
    /// Nowhere.
    Drop,
}

/// The mode and its own settings from the flags; a flag of another mode is refused.
fn mode(a: &ForwardArgs) -> Result<Mode, Failure> {
    let refuse =
        |what: &str, mode: &str| Err(Failure::usage(anyhow::anyhow!("{what} for --mode {mode}")));
    if a.mode != ModeArg::Bridge && a.ageing.is_some() {
        return refuse("--ageing is", "bridge");
    }
    if a.mode != ModeArg::Route
        && (a.routes.is_some() || a.next_hops.is_some() || a.flow_cache.is_some())
    {
        return refuse("--routes, --next-hops and --flow-cache are", "route");
    }
    if a.mode != ModeArg::Reflect && (!a.swap.is_empty() || a.not_ip.is_some()) {
        return refuse("--swap and --not-ip are", "reflect");
    }
    Ok(match a.mode {
        ModeArg::Reflect => Mode::Reflect {
            swap_ip: a.swap.contains(&SwapArg::Ip),
            swap_ports: a.swap.contains(&SwapArg::Ports),
            not_ip: a.not_ip.map(|n| match n {
                NotIpArg::Pass => NotIp::Pass,
                NotIpArg::Drop => NotIp::Drop,
            }),
        },
        ModeArg::Route => Mode::Route {
            routes: match a.routes.as_deref() {
                None | Some("kernel") => RouteSource::Kernel,
                Some(f) => RouteSource::File(f.into()),
            },
            next_hops: a.next_hops.clone(),
            flow_cache: a.flow_cache.map(|n| n as usize),
        },
        ModeArg::Bridge => Mode::Bridge {
            ageing_s: a.ageing.unwrap_or(300),
        },
    })
}

/// Long: flags mapped to each mode's configuration (reflect, route, bridge) and the report
/// printed per mode; the work is `tools::forward::run`'s.
pub fn run(a: ForwardArgs) -> CmdResult {
    let cfg = ForwardConfig {
        metrics: a.live.metrics,
        mode: mode(&a)?,
        devs: a.dev.clone(),
        backend: match a.backend {
            BackendArg::Xdp => Backend::XdpNative,
            BackendArg::AfXdp => Backend::AfXdp,
            BackendArg::AfPacket => Backend::AfPacket,
        },
        cpus: a.cpus.map(|c| c.0),
        duration_s: a.duration,
        interval_s: a.live.interval,
        ring_memory: a.rings.bytes(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    stop_on_signals(&stop)?;
    let (mut log, stream) = (a.live.log(), a.live.stream());
    // The tables' upkeep as of the last status line.
    let mut seen = forward::TablesTick::default();
    let mut said_refused = false;
    let host = crate::host::before_run(
        &match &cfg.cpus {
            Some(c) => c.clone(),
            None => crate::args::usable_cpus(None)?,
        },
        &cfg.devs.iter().map(|d| RunDev::here(d)).collect::<Vec<_>>(),
    );
    let mut r = forward::run(&cfg, &stop, &mut |event| match event {
        ForwardEvent::Started(s) => {
            let what = match cfg.mode.kind() {
                ForwardMode::Reflect => "reflecting on",
                ForwardMode::Route => "routing between",
                ForwardMode::Bridge => "bridging",
            };
            log.line(&format!("flowlane forward: {what} {}", cfg.devs.join(", ")));
            crate::host::say(&mut log, &host);
            if let Some(r) = &s.routes {
                log.line(&format!(
                    "routes from {}: {} IPv4, {} IPv6, {} next hops{}",
                    r.source,
                    r.routes_v4,
                    r.routes_v6,
                    r.next_hops,
                    if r.unresolved.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " ({} without a MAC yet, asked of the kernel: {})",
                            r.unresolved.len(),
                            r.unresolved.join(", ")
                        )
                    }
                ));
            }
            log.line(&backend_line(&s.backend));
            if let Some(m) = &s.rings {
                log.line(&format!("rings: {}", m.line()));
            }
        }
        ForwardEvent::Tick(t) if !a.live.quiet || stream.on() => {
            stream.interval(&t);
            if a.live.quiet {
                return;
            }
            let secs = t.interval_s.max(1e-9);
            let d = &t.delta;
            // Route mode: the tables changed since the last line — how many route changes,
            // and how long the latest update took to reach the forwarding path.
            let tables = match t.tables {
                Some(tt) if tt.updates > seen.updates => {
                    let line = format!(
                        "  tables updated in {:.1} ms ({} route changes{}{})",
                        tt.last_update_ms.unwrap_or(0.0),
                        tt.changes_applied - seen.changes_applied,
                        if tt.reloads > seen.reloads {
                            ", the table re-read"
                        } else {
                            ""
                        },
                        if tt.whole > seen.whole {
                            ", written whole"
                        } else {
                            ""
                        }
                    );
                    seen = tt;
                    line
                }
                _ => String::new(),
            };
            let refused = t
                .refused_beyond_in_flight()
                .map_or(String::new(), |n| format!("  REFUSED by the device {n}"));
            log.line(&format!(
                "{:>7.1}s  rx {:>10.0} pps  forwarded {:>10.0} pps  dropped {} ({})  ring {}{tables}{refused}",
                t.elapsed_s,
                d.rx_packets as f64 / secs,
                d.forwarded as f64 / secs,
                d.dropped.total(),
                drop_words(&d.dropped),
                d.ring_drops
            ));
            if !refused.is_empty() && !said_refused {
                said_refused = true;
                errln!(
                    "flowlane forward: the device refuses the frames XDP forwards: {}",
                    flowlane_tools::forward::REFUSED_FIX
                );
            }
        }
        ForwardEvent::Tick(_) => {}
    })
    .map_err(Failure::from_tool)?;
    r.host = Some(host);
    if a.live.json {
        print_json(&r)?;
    } else if stream.on() {
        stream.last(&r)?;
    } else {
        print_summary(&r);
    }
    for e in &r.errors {
        errln!("flowlane: forwarder stopped: {e}");
    }
    for p in &r.problems {
        errln!("FAIL: {p}");
    }
    Ok(if r.errors.is_empty() && r.problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The drop reasons, nonzero ones only (`none` when there are none).
fn drop_words(d: &forward::Drops) -> String {
    let v: Vec<String> = [
        ("not IP", d.not_ip),
        ("malformed", d.malformed),
        ("truncated", d.truncated),
        ("tx ring full", d.tx_full),
        ("no route", d.no_route),
        ("no neighbour", d.no_neighbour),
        ("TTL exceeded", d.ttl_exceeded),
        ("too big", d.too_big),
        ("filtered", d.filtered),
        ("checksum unfinished", d.checksum_unfinished),
    ]
    .iter()
    .filter(|x| x.1 > 0)
    .map(|(n, c)| format!("{n} {c}"))
    .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn print_summary(r: &ForwardReport) {
    let t = &r.total;
    outln!();
    outln!(
        "looked at {} frames in {} s: forwarded {} ({} pps), dropped {}",
        t.rx_packets,
        r.duration_s,
        t.forwarded,
        r.forwarded_pps,
        t.dropped.total()
    );
    outln!("  dropped by reason: {}", drop_words(&t.dropped));
    if t.to_host > 0 {
        outln!(
            "  left to the host (multicast, broadcast, its own addresses): {}",
            t.to_host
        );
    }
    if t.ring_drops > 0 {
        outln!(
            "  never seen: {} frames the receive ring had no room for (the forwarder was the \
             limit)",
            t.ring_drops
        );
    }
    if t.flooded > 0 {
        outln!(
            "  flooded {} of the forwarded frames ({} copies beyond one each)",
            t.flooded,
            t.flood_copies
        );
    }
    if t.checksum_completed > 0 {
        outln!(
            "  checksum completed: {} frames a local sender had left to offload (only the \
             pseudo header's sum) left with their UDP/TCP checksum computed",
            t.checksum_completed
        );
    }
    if let Some(c) = &t.flow_cache {
        outln!(
            "  flow cache: {} lookups, {} hits ({:.1} %; {} stale, decided again after a route \
             or neighbour change), {} flows added, {} expired, {} evicted; GC visited {} \
             records",
            c.lookups,
            c.hits,
            if c.lookups > 0 {
                100.0 * c.hits as f64 / c.lookups as f64
            } else {
                0.0
            },
            c.stale,
            c.inserts,
            c.expired,
            c.evicted,
            c.gc_visited
        );
    }
    for p in &r.ports {
        if let (Some(rx), Some(tx)) = (p.rx_packets, p.tx_packets) {
            let own = match (p.looked_at, p.queued) {
                (Some(l), Some(q)) => format!(" (the bridge looked at {l}, queued {q})"),
                _ => String::new(),
            };
            outln!("  interface {}: received {rx}, sent {tx}{own}", p.dev);
        }
    }
    if let Some(b) = &r.bridge {
        outln!(
            "  MAC table: {} entries (ageing {} s, {} aged out)",
            b.macs.len(),
            b.ageing_s,
            b.aged_out
        );
        for (mac, port) in b.macs.iter().take(16) {
            outln!("    {mac}  {port}");
        }
    }
    if let Some(rt) = &r.routes {
        outln!(
            "  routes from {}: {} IPv4, {} IPv6, {} next hops; {} out of other interfaces, {} \
             discard, {} multipath (first path used)",
            rt.source,
            rt.routes_v4,
            rt.routes_v6,
            rt.next_hops,
            rt.elsewhere,
            rt.discard,
            rt.multipath
        );
    }
    for c in &r.cpus {
        outln!(
            "  CPU {:>3}: forwarded {} of {}{}",
            c.cpu,
            c.counts.forwarded,
            c.counts.rx_packets,
            c.cpu_ns_per_packet.map_or(String::new(), |n| format!(
                ", {n:.0} ns of worker CPU per frame"
            ))
        );
    }
    if r.cpus.iter().any(|c| c.cpu_ns_per_packet.is_some()) {
        outln!("{}", crate::live::pmu_line("frame", &r.pmu));
    }
    outln!("{}", backend_line(&r.backend));
}
