//! The native-XDP reflector: a generated program attached through a BPF link (detached when
//! the run ends, also when the process dies), its per-CPU counters read from a mapped array.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::forward::worker::route::PortInfo;
use flowlane_io::bpf::{self, BridgeMaps, LpmTrie6, PerCpuCounters, WritableArray};
use flowlane_io::ebpf::{
    bridge_program, bridge_stats, reflect_program, reflect_stats, route_hop, route_program,
    route_stats, Reflect, XdpBridge, XdpRoute,
};
use flowlane_io::netdev;

use super::report::{CpuCounts, Drops, ForwardCounts, ForwardReport, ForwardTick};
use super::xdp_tables::XdpTables;
use super::{dev_counters, ForwardEvent, ForwardStart, Job, NotIp};
use crate::ToolError;

/// Says the program runs, then reports its counters (`total()`) each interval until the
/// deadline or `stop`, running `upkeep` before each tick goes out (it may add to the tick);
/// when it started.
fn tick_loop(
    job: &Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
    total: &dyn Fn() -> ForwardCounts,
    upkeep: &mut dyn FnMut(&mut ForwardTick),
) -> Instant {
    on_event(ForwardEvent::Started(ForwardStart {
        backend: job.backend.clone(),
        routes: job.routes.clone(),
        rings: None,
    }));
    let start = Instant::now();
    let deadline = job.duration.and_then(|d| start.checked_add(d));
    let (mut prev, mut prev_t, mut next) = (ForwardCounts::default(), start, start + job.interval);
    // The interfaces' transmit counters, to tell frames the device refused as they happen.
    let dev_tx = || {
        job.ports.iter().try_fold(0u64, |acc, (dev, _)| {
            super::dev_counters(dev).1.map(|t| acc + t)
        })
    };
    let mut prev_tx = dev_tx();
    while !stop.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(10));
        let now = Instant::now();
        if now >= next {
            let cur = total();
            let delta = cur.since(&prev);
            let tx = dev_tx();
            let sent = tx.zip(prev_tx).map(|(a, b)| a.saturating_sub(b));
            prev_tx = tx;
            let mut tick = ForwardTick {
                elapsed_s: now.duration_since(start).as_secs_f64(),
                interval_s: now.duration_since(prev_t).as_secs_f64(),
                device_refused: sent
                    .map(|s| (delta.forwarded + delta.flood_copies).saturating_sub(s)),
                delta,
                tables: None,
            };
            upkeep(&mut tick);
            on_event(ForwardEvent::Tick(tick));
            (prev, prev_t, next) = (cur, now, next + job.interval);
        }
    }
    start
}

/// `count` per-CPU counters, as `of(counter)` for each CPU in turn.
fn per_cpu<T>(
    stats: &PerCpuCounters,
    count: usize,
    of: impl Fn(&dyn Fn(usize) -> u64) -> T,
) -> Vec<T> {
    let all: Vec<Vec<u64>> = (0..count as u32).map(|i| stats.per_cpu(i)).collect();
    (0..all.first().map_or(0, Vec::len))
        .map(|c| of(&|i: usize| all[i][c]))
        .collect()
}

fn read(stats: &PerCpuCounters) -> Vec<ForwardCounts> {
    per_cpu(stats, reflect_stats::COUNT, |at| {
        let dropped = Drops {
            not_ip: at(reflect_stats::NOT_IP),
            malformed: at(reflect_stats::MALFORMED),
            checksum_unfinished: at(reflect_stats::UNFINISHED),
            ..Drops::default()
        };
        let forwarded = at(reflect_stats::REFLECTED);
        ForwardCounts {
            rx_packets: forwarded + dropped.total(),
            forwarded,
            dropped,
            checksum_completed: at(reflect_stats::COMPLETED),
            ..ForwardCounts::default()
        }
    })
}

/// Refuses a run whose frames a veth peer would refuse, before the first frame: XDP_TX and
/// redirects into a veth reach its peer only while the peer runs an XDP program. Where the
/// peer is in this namespace it can be seen; in another it cannot, and the status lines say
/// it as the refusals happen ([`ForwardTick::device_refused`]).
fn peers_take_xdp(ports: &[(String, u32)]) -> Result<(), ToolError> {
    for (dev, ifindex) in ports {
        let Ok(Some(me)) = netdev::link_facts(*ifindex) else {
            continue;
        };
        let (Some("veth"), Some(peer), None) = (me.kind.as_deref(), me.link, me.link_netnsid)
        else {
            continue;
        };
        let Ok(Some(p)) = netdev::link_facts(peer) else {
            continue;
        };
        if p.xdp_attached == 0 {
            let name = netdev::ifname(peer).unwrap_or_else(|_| format!("index {peer}"));
            return Err(ToolError::runtime(format!(
                "{dev}'s veth peer {name} runs no XDP program, so it would refuse every frame \
                 XDP sends into {dev}: {}",
                super::report::REFUSED_FIX
            )));
        }
    }
    Ok(())
}

fn sum(v: &[ForwardCounts]) -> ForwardCounts {
    v.iter().fold(ForwardCounts::default(), |t, c| t.plus(c))
}

pub(super) fn run(
    job: &Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let (dev, swap, cfg) = (job.dev, job.swap, job.cfg);
    let ifindex = job.ifindex;
    let bpf_err = |what: &str, e: String, denied: bool| {
        let msg = format!("{what}: {e}");
        if denied {
            ToolError::privilege(format!(
                "{msg} (needs CAP_BPF and CAP_NET_ADMIN: run as root)"
            ))
        } else {
            ToolError::runtime(msg)
        }
    };
    let denied =
        |e: &flowlane_io::SysError| e.source.kind() == std::io::ErrorKind::PermissionDenied;
    let stats = PerCpuCounters::create("fl_reflect", reflect_stats::COUNT as u32)
        .map_err(|e| bpf_err("cannot make the counters map", e.to_string(), denied(&e)))?;
    let insns = reflect_program(&Reflect {
        stats_fd: stats.raw_fd(),
        swap_ip: swap.ip,
        swap_ports: swap.ports,
        pass_not_ip: cfg.mode.not_ip() != Some(NotIp::Drop),
        complete_checksums: true,
    })
    .map_err(|e| ToolError::runtime(format!("the reflector does not assemble: {e:?}")))?;
    let prog = bpf::prog_load(bpf::PROG_XDP, "fl_reflect", &insns).map_err(|e| {
        bpf_err(
            "the kernel refused the reflector",
            e.to_string(),
            denied(&e.error),
        )
    })?;
    peers_take_xdp(&job.ports)?;
    let before = dev_counters(dev);
    let link = crate::backend::attach_native(&prog, ifindex, dev, "reflector")?;
    let start = tick_loop(job, stop, on_event, &|| sum(&read(&stats)), &mut |_| {});
    drop(link);
    Ok(report(job, start, read(&stats), &[before]))
}

/// The bridge's counters per CPU.
fn read_bridge(stats: &PerCpuCounters, ports: usize) -> Vec<ForwardCounts> {
    per_cpu(stats, bridge_stats::COUNT, |at| {
        let dropped = Drops {
            filtered: at(bridge_stats::FILTERED),
            malformed: at(bridge_stats::MALFORMED),
            checksum_unfinished: at(bridge_stats::UNFINISHED),
            ..Drops::default()
        };
        let flooded = at(bridge_stats::FLOODED);
        let forwarded = at(bridge_stats::FORWARDED) + flooded;
        ForwardCounts {
            rx_packets: forwarded + dropped.total(),
            forwarded,
            flooded,
            // The kernel sends a flooded frame to every port but the ingress one.
            flood_copies: flooded * (ports.saturating_sub(2) as u64),
            dropped,
            checksum_completed: at(bridge_stats::COMPLETED),
            ..ForwardCounts::default()
        }
    })
}

/// The report of a native-XDP run: per-CPU counts (CPUs that saw a frame), the interfaces'
/// counters since `before`.
fn report(
    job: &Job<'_>,
    start: Instant,
    per_cpu: Vec<ForwardCounts>,
    before: &[(Option<u64>, Option<u64>)],
) -> ForwardReport {
    let cpus = per_cpu
        .into_iter()
        .enumerate()
        .filter(|(_, c)| c.rx_packets > 0)
        .map(|(cpu, counts)| CpuCounts {
            cpu,
            counts,
            cpu_ns_per_packet: None,
        })
        .collect();
    super::report::assemble(job, start.elapsed().as_secs_f64(), cpus, before, Vec::new())
}

/// A failed BPF call as the user can act on it: a missing privilege, or the kernel's refusal.
fn bpf_err(what: &str, e: &flowlane_io::SysError) -> ToolError {
    let msg = format!("{what}: {e}");
    if e.source.kind() == std::io::ErrorKind::PermissionDenied {
        ToolError::privilege(format!(
            "{msg} (needs CAP_BPF and CAP_NET_ADMIN: run as root)"
        ))
    } else {
        ToolError::runtime(msg)
    }
}

/// Loads a generated XDP program.
fn load_program(
    what: &str,
    insns: Result<Vec<flowlane_io::ebpf::Insn>, flowlane_io::ebpf::AsmError>,
) -> Result<std::os::fd::OwnedFd, ToolError> {
    let insns =
        insns.map_err(|e| ToolError::runtime(format!("the {what} does not assemble: {e:?}")))?;
    bpf::prog_load(bpf::PROG_XDP, &format!("fl_{what}"), &insns)
        .map_err(|e| bpf_err(&format!("the kernel refused the {what}"), &e.error))
}

/// Loads one program per port (`program(i)` for port `i`) and attaches each to its port in
/// native mode; the links detach when dropped.
fn attach_per_port(
    job: &Job<'_>,
    what: &str,
    program: &dyn Fn(usize) -> Result<Vec<flowlane_io::ebpf::Insn>, flowlane_io::ebpf::AsmError>,
) -> Result<Vec<std::os::fd::OwnedFd>, ToolError> {
    let progs = (0..job.ports.len())
        .map(|i| load_program(what, program(i)))
        .collect::<Result<Vec<_>, _>>()?;
    peers_take_xdp(&job.ports)?;
    let mut links = Vec::new();
    for ((dev, ifindex), prog) in job.ports.iter().zip(&progs) {
        links.push(crate::backend::attach_native(prog, *ifindex, dev, what)?);
    }
    Ok(links)
}

/// The native-XDP bridge: one program on every port (BPF links, native mode), the table
/// aged from here each interval.
pub(super) fn run_bridge(
    job: &Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let maps = BridgeMaps::create().map_err(|e| bpf_err("cannot make the bridge's maps", &e))?;
    for (i, (dev, ifindex)) in job.ports.iter().enumerate() {
        maps.set_port(i as u32, *ifindex)
            .map_err(|e| bpf_err(&format!("cannot make {dev} a port"), &e))?;
    }
    let stats = PerCpuCounters::create("fl_bridge", bridge_stats::COUNT as u32)
        .map_err(|e| bpf_err("cannot make the counters map", &e))?;
    let (fdb_fd, ports_fd) = maps.fds();
    let before: Vec<_> = job.ports.iter().map(|p| dev_counters(&p.0)).collect();
    // One program per port, generated for its index; attached once all are loaded.
    let links = attach_per_port(job, "bridge", &|i| {
        bridge_program(&XdpBridge {
            fdb_fd,
            ports_fd,
            stats_fd: stats.raw_fd(),
            port: i as u8,
        })
    })?;
    let ageing_s = match job.cfg.mode {
        super::Mode::Bridge { ageing_s } => ageing_s,
        _ => 300,
    };
    let ports = job.ports.len();
    let mut aged = 0u64;
    let mut age_error = None;
    let mut last_sweep = Instant::now();
    let start = tick_loop(
        job,
        stop,
        on_event,
        &|| sum(&read_bridge(&stats, ports)),
        &mut |_| {
            if last_sweep.elapsed() >= Duration::from_secs(u64::from(ageing_s)) {
                last_sweep = Instant::now();
                match maps.sweep() {
                    Ok(n) => aged += n as u64,
                    Err(e) => {
                        age_error.get_or_insert(e.to_string());
                    }
                }
            }
        },
    );
    drop(links);
    let mut r = report(job, start, read_bridge(&stats, ports), &before);
    let name = |i: u32| {
        job.ports
            .get(i as usize)
            .map_or_else(|| i.to_string(), |p| p.0.clone())
    };
    let mut macs: Vec<(String, String)> = maps
        .entries()
        .unwrap_or_default()
        .into_iter()
        .map(|(mac, port)| (flowlane_wire::Mac(mac).to_string(), name(port)))
        .collect();
    macs.sort();
    r.bridge = Some(super::report::BridgeSummary {
        ageing_s,
        macs,
        aged_out: aged,
    });
    if let Some(e) = age_error {
        r.problems.push(format!("the table could not be aged: {e}"));
    }
    Ok(r)
}

/// The native router's table in BPF maps the program reads — DIR-24-8 for IPv4 (`tbl24`,
/// `tbl8` groups), an LPM trie for IPv6, and the next hops both lead to — kept up to date
/// while it runs. Changed routes, and the host routes of neighbours and own addresses that
/// come, go or change, are applied in place ([`RouteMaps::patch`]: only the entries they
/// cover, milliseconds). Otherwise (a next hop in use changed — a gateway's MAC, so every
/// route through it —, a wide change) the whole table is written anew: the groups, the next hops and the trie
/// are held twice over, in two halves; a new table is written whole into the half not in
/// use, then each `tbl24` entry is switched to it with one 4-byte store, and IPv6 lookups
/// with one store of the half in use. A program run that read an old entry finds the old
/// half intact (it is overwritten only by the next change, an interval later; a run lasts
/// microseconds), so no frame meets a half-written table — as with the FIB's snapshots on
/// the other backends.
struct RouteMaps {
    tbl24: WritableArray,
    tbl8: WritableArray,
    hops: WritableArray,
    tries: [LpmTrie6; 2],
    /// What each trie holds (kept exact: a trie is brought to a new table by the difference).
    in_trie: [HashMap<(u8, u128), u32>; 2],
    /// One u32: the trie IPv6 lookups use.
    which: WritableArray,
    /// `tbl8` groups, next hops and IPv6 routes per half.
    groups_half: usize,
    hops_half: usize,
    routes6_half: usize,
    /// The half the program reads.
    half: usize,
    /// Groups of the half in use that nothing names (for changes made in place).
    free_groups: Vec<u32>,
    /// Groups the last change in place stopped naming: free from the next one on (a
    /// program run that read the old name may still be reading them until then).
    quarantined: Vec<u32>,
    /// Next-hop entries written in the half in use (those after are named by nothing).
    hops_written: usize,
}

/// A change in place covering more `tbl24` entries than this writes the whole table instead
/// (a /4 or wider: the whole write costs about as much).
const PATCH_MAX_ENTRIES: u32 = 1 << 20;

/// A 4-byte value at its 8-byte stride in a mapped array's bytes.
fn get(bytes: &[u8], i: usize) -> u32 {
    bytes
        .get(i * 8..i * 8 + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// Stores a 4-byte value at its 8-byte stride: one aligned store.
fn put(bytes: &mut [u8], i: usize, v: u32) {
    if let Some(b) = bytes.get_mut(i * 8..i * 8 + 4) {
        b.copy_from_slice(&v.to_ne_bytes());
    }
}

/// Writes next-hop `entries` into the `hops` map from slot `first` on.
fn write_hops(hops: &mut WritableArray, first: usize, entries: &[[u8; route_hop::SIZE]]) {
    let stride = route_hop::SIZE.next_multiple_of(8);
    let hb = hops.bytes_mut();
    for (i, e) in entries.iter().enumerate() {
        let at = (first + i) * stride;
        if let Some(b) = hb.get_mut(at..at + e.len()) {
            b.copy_from_slice(e);
        }
    }
}

/// Room for a table to grow while the router runs: twice its size, and at least `floor` more.
fn room(n: usize, floor: usize) -> usize {
    (2 * n).max(n + floor)
}

impl RouteMaps {
    /// Maps for `t` with room for the table to grow (twice its size; beyond that the router
    /// makes new maps and replaces its programs), written into the first half.
    fn new(t: &XdpTables, dir: &flowlane_lpm::Dir24_8) -> Result<RouteMaps, ToolError> {
        let (t24, t8) = dir.tables();
        let groups_half = room(t8.len() / 256, 256);
        let hops_half = room(t.hops.len(), 256);
        let routes6_half = room(t.v6.len(), 4096);
        let n = |name: &str, n: usize| {
            u32::try_from(n).map_err(|_| ToolError::runtime(format!("{name}: too big")))
        };
        let make = |name: &str, size: usize, entries: usize| {
            WritableArray::new(name, size as u32, n(name, entries)?)
                .map_err(|e| bpf_err("cannot make the route table's maps", &e))
        };
        let trie = |name: &str| {
            LpmTrie6::create(name, n(name, routes6_half)?)
                .map_err(|e| bpf_err("cannot make the IPv6 route trie", &e))
        };
        let mut m = RouteMaps {
            tbl24: make("fl_rt_tbl24", 4, t24.len())?,
            tbl8: make("fl_rt_tbl8", 4, 2 * groups_half * 256)?,
            hops: make("fl_rt_hops", route_hop::SIZE, 2 * hops_half)?,
            tries: [trie("fl_rt_v6a")?, trie("fl_rt_v6b")?],
            in_trie: [HashMap::new(), HashMap::new()],
            which: make("fl_rt_which", 4, 1)?,
            groups_half,
            hops_half,
            routes6_half,
            half: 1,
            free_groups: Vec::new(),
            quarantined: Vec::new(),
            hops_written: 0,
        };
        m.write(t, dir).map_err(ToolError::runtime)?;
        Ok(m)
    }

    /// Writes `t` (IPv4 as `dir`) into the half not in use, then switches lookups to it.
    /// Refused, with the half in use untouched, when the table outgrew a half or the trie
    /// refused a change.
    /// Whether `t` (IPv4 as `dir`) fits in a half of these maps.
    fn fits(&self, t: &XdpTables, dir: &flowlane_lpm::Dir24_8) -> bool {
        dir.tables().1.len() / 256 <= self.groups_half
            && t.hops.len() <= self.hops_half
            && t.v6.len() <= self.routes6_half
    }

    fn write(&mut self, t: &XdpTables, dir: &flowlane_lpm::Dir24_8) -> Result<(), String> {
        use flowlane_lpm::Dir24_8;
        let (t24, t8) = dir.tables();
        let groups = t8.len() / 256;
        if !self.fits(t, dir) {
            return Err(format!(
                "the table outgrew the maps made at start ({groups} groups, {} next hops and {} \
                 IPv6 routes for room of {}, {} and {})",
                t.hops.len(),
                t.v6.len(),
                self.groups_half,
                self.hops_half,
                self.routes6_half
            ));
        }
        let h = 1 - self.half;
        let (gbase, hbase) = ((h * self.groups_half) as u32, (h * self.hops_half) as u32);
        write_hops(&mut self.hops, hbase as usize, &t.hops);
        self.hops_written = t.hops.len();
        let b8 = self.tbl8.bytes_mut();
        let base8 = gbase as usize * 256;
        for (i, &v) in t8.iter().enumerate() {
            put(
                b8,
                base8 + i,
                if v == flowlane_lpm::NO_ROUTE {
                    v
                } else {
                    v + hbase
                },
            );
        }
        // The trie of this half, brought to the new routes by their difference.
        let (trie, held) = (&self.tries[h], &mut self.in_trie[h]);
        let fail = |e: flowlane_io::SysError| format!("the IPv6 route trie refused a change: {e}");
        let gone: Vec<(u8, u128)> = held
            .keys()
            .filter(|k| !t.v6.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            trie.remove(k.0, k.1.to_be_bytes()).map_err(fail)?;
            held.remove(&k);
        }
        for (&k, &hop) in &t.v6 {
            let v = hop + hbase;
            if held.get(&k) != Some(&v) {
                trie.set(k.0, k.1.to_be_bytes(), v).map_err(fail)?;
                held.insert(k, v);
            }
        }
        // Everything the new entries lead to is in place before the first of them is.
        std::sync::atomic::fence(Ordering::SeqCst);
        let b24 = self.tbl24.bytes_mut();
        for (i, &v) in t24.iter().enumerate() {
            let v = if v == Dir24_8::NONE {
                v
            } else if v & Dir24_8::EXTENDED != 0 {
                Dir24_8::EXTENDED | ((v & !Dir24_8::EXTENDED) + gbase)
            } else {
                v + hbase
            };
            put(b24, i, v);
        }
        put(self.which.bytes_mut(), 0, h as u32);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.half = h;
        // The rest of this half's groups are free for changes made in place.
        self.free_groups = (gbase + groups as u32..gbase + self.groups_half as u32)
            .rev()
            .collect();
        self.quarantined.clear();
        Ok(())
    }

    /// Applies changed routes in place, in the half in use, after `t` took them in
    /// ([`XdpTables::follow`]: next-hop entries in use unchanged, new ones after them, written
    /// here into slots nothing names yet, before any entry names them). Every `tbl24` entry a changed IPv4 route covers is computed
    /// anew ([`flowlane_lpm::Dir24_8::block`]) and rewritten only where it differs: a next
    /// hop by one 4-byte store; a group written whole into a free group, then named by one
    /// store. A group no longer named is free from the next change on (a program run that
    /// read its old name finds it intact: a run lasts microseconds, changes come an interval
    /// apart), so every lookup sees its entry either before or after. IPv6 routes are set or
    /// removed in the trie in use (the kernel replaces an element whole). `Ok(false)`, with
    /// nothing written: the change is too wide or the free groups too few — write the whole
    /// table instead.
    fn patch(
        &mut self,
        t: &XdpTables,
        v4: &[flowlane_lpm::Prefix<u32>],
        v6: &[flowlane_lpm::Prefix<u128>],
    ) -> Result<bool, String> {
        use flowlane_lpm::{Block, Dir24_8, NO_ROUTE};
        if t.v6.len() > self.routes6_half || t.hops.len() > self.hops_half {
            return Ok(false);
        }
        // The /24s the changes cover, each once.
        let mut spans: Vec<std::ops::Range<u32>> = v4.iter().map(|&p| Dir24_8::span(p)).collect();
        spans.sort_unstable_by_key(|r| r.start);
        let mut entries: Vec<std::ops::Range<u32>> = Vec::new();
        for r in spans {
            match entries.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => entries.push(r),
            }
        }
        if entries.iter().map(|r| r.end - r.start).sum::<u32>() > PATCH_MAX_ENTRIES {
            return Ok(false);
        }
        let hbase = (self.half * self.hops_half) as u32;
        let at = |v: u32| if v == NO_ROUTE { v } else { v + hbase };
        let b24 = self.tbl24.bytes_mut();
        let mut stores: Vec<(usize, u32)> = Vec::new();
        let mut groups: Vec<(usize, Box<[u32; 256]>)> = Vec::new();
        let mut unnamed: Vec<u32> = Vec::new();
        let b8 = self.tbl8.bytes_mut();
        for i in entries.into_iter().flatten() {
            let cur = get(b24, i as usize);
            let old_group = (cur & Dir24_8::EXTENDED != 0).then_some(cur & !Dir24_8::EXTENDED);
            match Dir24_8::block(&t.v4, i) {
                Block::Direct(v) => {
                    let want = if v == Dir24_8::NONE { v } else { v + hbase };
                    if cur == want {
                        continue;
                    }
                    stores.push((i as usize, want));
                }
                Block::Group(mut g) => {
                    for v in g.iter_mut() {
                        *v = at(*v);
                    }
                    if let Some(o) = old_group {
                        let base = o as usize * 256;
                        if (0..256).all(|k| get(b8, base + k) == g[k]) {
                            continue;
                        }
                    }
                    groups.push((i as usize, g));
                }
            }
            unnamed.extend(old_group);
        }
        self.free_groups.append(&mut self.quarantined);
        if groups.len() > self.free_groups.len() {
            return Ok(false);
        }
        // New next hops and groups first, where nothing reads yet; then the entries that
        // name them.
        let written = self.hops_written.min(t.hops.len());
        write_hops(&mut self.hops, hbase as usize + written, &t.hops[written..]);
        self.hops_written = t.hops.len();
        for (i, g) in groups {
            let n = self.free_groups.pop().unwrap_or_default();
            for (k, &v) in g.iter().enumerate() {
                put(b8, n as usize * 256 + k, v);
            }
            stores.push((i, Dir24_8::EXTENDED | n));
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        for (i, v) in stores {
            put(b24, i, v);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        self.quarantined = unnamed;
        let (trie, held) = (&self.tries[self.half], &mut self.in_trie[self.half]);
        let fail = |e: flowlane_io::SysError| format!("the IPv6 route trie refused a change: {e}");
        for p in v6 {
            let k = (p.len(), p.addr());
            match t.v6.get(&k) {
                Some(&hop) => {
                    let v = hop + hbase;
                    if held.get(&k) != Some(&v) {
                        trie.set(k.0, k.1.to_be_bytes(), v).map_err(fail)?;
                        held.insert(k, v);
                    }
                }
                None => {
                    if held.remove(&k).is_some() {
                        trie.remove(k.0, k.1.to_be_bytes()).map_err(fail)?;
                    }
                }
            }
        }
        Ok(true)
    }
}

/// The native-XDP router: one program per port (BPF links, native mode) over the tables in
/// BPF maps ([`RouteMaps`]), changed in place when routes, neighbours or addresses change and
/// rebuilt and switched to when a gateway's MAC does (checked each interval); what is not unicast IP to a
/// port goes to the kernel.
pub(super) fn run_route(
    mut job: Job<'_>,
    stop: &Arc<AtomicBool>,
    on_event: &mut dyn FnMut(ForwardEvent),
) -> Result<ForwardReport, ToolError> {
    let (loaded, monitor) = super::packet::load_tables(&job, true, stop)?;
    job.routes = Some(loaded.summary.clone());
    let mut live = crate::route::tables::LiveTables::new(loaded, monitor);
    let infos: Vec<PortInfo> = super::packet::port_infos(&job)?
        .into_iter()
        .map(|p| p.1)
        .collect();
    let tables = |live: &crate::route::tables::LiveTables| {
        let t = XdpTables::build(live.v4(), live.v6(), live.next_hops(), &infos)?;
        let dir = flowlane_lpm::Dir24_8::build(&t.v4);
        Ok::<_, ToolError>((t, dir))
    };
    let (mut cur, dir) = tables(&live)?;
    let mut maps = RouteMaps::new(&cur, &dir)?;
    drop(dir);
    let devmap = BridgeMaps::create().map_err(|e| bpf_err("cannot make the device map", &e))?;
    for (i, (dev, ifindex)) in job.ports.iter().enumerate() {
        devmap
            .set_port(i as u32, *ifindex)
            .map_err(|e| bpf_err(&format!("cannot make {dev} a port"), &e))?;
    }
    let stats = PerCpuCounters::create("fl_route", route_stats::COUNT as u32)
        .map_err(|e| bpf_err("cannot make the counters map", &e))?;
    let before: Vec<_> = job.ports.iter().map(|p| dev_counters(&p.0)).collect();
    let program = |maps: &RouteMaps, i: usize| {
        route_program(&XdpRoute {
            tbl24_fd: maps.tbl24.fd(),
            tbl8_fd: maps.tbl8.fd(),
            hops_fd: maps.hops.fd(),
            trie6_fds: [maps.tries[0].raw_fd(), maps.tries[1].raw_fd()],
            half_fd: maps.which.fd(),
            ports_fd: devmap.fds().1,
            stats_fd: stats.raw_fd(),
            mac: infos[i].mac,
        })
    };
    let links = attach_per_port(&job, "router", &|i| program(&maps, i))?;
    let mut upkeep_error = None;
    let mut upkeep = |tick: &mut ForwardTick| {
        let began = Instant::now();
        // Whether the tables changed, and if so whether wholly.
        let rebuilt = live.upkeep().and_then(|up| {
            if !up.any() {
                return Ok(None);
            }
            let touched = cur.follow(&up, live.v4(), live.v6(), live.next_hops(), &infos)?;
            if let Some(t) = touched {
                if maps.patch(&cur, &t.v4, &t.v6).map_err(ToolError::runtime)? {
                    return Ok(Some(false));
                }
            }
            let dir;
            (cur, dir) = tables(&live)?;
            if maps.fits(&cur, &dir) {
                maps.write(&cur, &dir).map_err(ToolError::runtime)?;
            } else {
                // The table outgrew the maps: new ones sized for it, and each port's program
                // replaced by one reading them, in one step per port (a frame meets the old
                // program and maps or the new ones; the old maps live until their program
                // is gone).
                let fresh = RouteMaps::new(&cur, &dir)?;
                for (i, link) in links.iter().enumerate() {
                    let prog = load_program("router", program(&fresh, i))?;
                    bpf::link_update(link, &prog)
                        .map_err(|e| bpf_err("cannot replace the router's program", &e))?;
                }
                maps = fresh;
            }
            Ok(Some(true))
        });
        match rebuilt {
            Ok(Some(whole)) => live.updated(began.elapsed(), whole),
            Ok(None) => {}
            Err(e) => {
                upkeep_error.get_or_insert(e.to_string());
            }
        }
        tick.tables = Some(live.tick());
    };
    let start = tick_loop(
        &job,
        stop,
        on_event,
        &|| sum(&read_route(&stats)),
        &mut upkeep,
    );
    drop(links);
    job.routes = Some(live.summary());
    let mut r = report(&job, start, read_route(&stats), &before);
    if let Some(e) = upkeep_error {
        r.problems
            .push(format!("the tables could not be kept up to date: {e}"));
    }
    Ok(r)
}

/// The router's counters per CPU.
fn read_route(stats: &PerCpuCounters) -> Vec<ForwardCounts> {
    use route_stats::*;
    per_cpu(stats, COUNT, |at| {
        let dropped = Drops {
            no_route: at(NO_ROUTE),
            no_neighbour: at(NO_NEIGHBOUR),
            ttl_exceeded: at(TTL_EXCEEDED),
            too_big: at(TOO_BIG),
            malformed: at(MALFORMED),
            checksum_unfinished: at(UNFINISHED),
            ..Drops::default()
        };
        let (forwarded, to_host) = (at(FORWARDED), at(PASSED));
        ForwardCounts {
            rx_packets: forwarded + to_host + dropped.total(),
            forwarded,
            to_host,
            dropped,
            checksum_completed: at(COMPLETED),
            ..ForwardCounts::default()
        }
    })
}

#[cfg(test)]
mod tests {
    use flowlane_io::bpf::{self, PerCpuCounters};
    use flowlane_io::ebpf::{reflect_program, reflect_stats, Reflect};
    use flowlane_wire::forward::{complete_partial, reflect, Reason, Swap, L3};
    use flowlane_wire::{checksum, Template, TemplateSpec};

    /// `f` (a UDP frame) as a sender with checksum offload leaves it: the pseudo header's sum
    /// in the checksum field — or, `tcp`, made a TCP segment first (protocol 6, the IPv4
    /// header's checksum fixed, the field at 16).
    fn partial(f: &[u8], tcp: bool) -> Vec<u8> {
        let mut f = f.to_vec();
        let l3 = L3::parse(&f).expect("ip");
        let l4 = l3.l4.expect("l4");
        let (proto_at, off) = if l3.v6 {
            (l3.at + 6, 16)
        } else {
            (l3.at + 9, 16)
        };
        let off = if tcp { off } else { 6 };
        if tcp {
            f[proto_at] = 6;
            if !l3.v6 {
                f[l3.at + 10..l3.at + 12].copy_from_slice(&[0, 0]);
                let c = checksum::checksum(&f[l3.at..l3.at + 20]);
                f[l3.at + 10..l3.at + 12].copy_from_slice(&c.to_be_bytes());
            }
        }
        let (src, dst, len) = if l3.v6 {
            let plen = u16::from_be_bytes([f[l3.at + 4], f[l3.at + 5]]);
            (l3.at + 8..l3.at + 24, l3.at + 24..l3.at + 40, plen)
        } else {
            let total = u16::from_be_bytes([f[l3.at + 2], f[l3.at + 3]]);
            (l3.at + 12..l3.at + 16, l3.at + 16..l3.at + 20, total - 20)
        };
        let mut acc = checksum::sum(&f[src], 0);
        acc = checksum::sum(&f[dst], acc);
        acc += u64::from(if tcp { 6u16 } else { 17 }) + u64::from(len);
        let p = checksum::fold(acc);
        f[l4 + off..l4 + off + 2].copy_from_slice(&p.to_be_bytes());
        f
    }

    /// Routes changed in place ([`super::RouteMaps::patch`]) leave the maps answering as a
    /// table built whole from the same routes does: a generated table, then batches of
    /// additions, replacements and removals (nested /25–/32s, /12s, the default route),
    /// checked at every address of every changed /24 and at random ones; in both halves (a
    /// whole write between); and no group lost or named twice.
    /// (Long: one scenario, every step checked before the next.)
    #[test]
    fn changes_in_place_answer_as_a_whole_build() {
        use super::{get, RouteMaps, XdpTables};
        use flowlane_lpm::{gen, Dir24_8, Prefix, Rib, NO_ROUTE};
        use rand::{Rng, RngExt, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut table = gen::ipv4(50_000, 11, 16);
        // Routes longer than /24, so that the maps have room for the groups the rounds add
        // (room is made at start for the table to double).
        for k in 0..1_000 {
            let (p, _) = table[k * 37];
            let len = rng.random_range(p.len().max(25)..=32);
            let nested = Prefix::covering(p.addr() | (rng.next_u32() >> p.len().min(31)), len);
            table.push((nested, rng.random_range(0..16)));
        }
        let hops = crate::route::decide::NextHops {
            hops: vec![crate::route::decide::Hop::Nowhere; 16],
            ..Default::default()
        };
        let v4 = Rib::from_routes(table.iter().copied()).expect("valid");
        let mut t = XdpTables::build(&v4, &Rib::new(), &hops, &[]).expect("tables");
        let mut maps = match RouteMaps::new(&t, &Dir24_8::build(&t.v4)) {
            Ok(m) => m,
            Err(e) if e.kind == crate::ErrorKind::Privilege || e.message.contains("ermission") => {
                eprintln!("SKIP: BPF maps need CAP_BPF: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        // What the maps answer for `a`: a next hop of the table, or NO_ROUTE.
        let answer = |m: &mut RouteMaps, a: u32| {
            let hbase = (m.half * m.hops_half) as u32;
            let e = get(m.tbl24.bytes_mut(), (a >> 8) as usize);
            let v = if e & Dir24_8::EXTENDED != 0 {
                let g = (e & !Dir24_8::EXTENDED) as usize;
                let lo = m.half * m.groups_half;
                assert!(
                    (lo..lo + m.groups_half).contains(&g),
                    "group {g} of the other half"
                );
                get(m.tbl8.bytes_mut(), g * 256 + (a & 0xff) as usize)
            } else if e == Dir24_8::NONE {
                NO_ROUTE
            } else {
                e
            };
            if v == NO_ROUTE {
                v
            } else {
                v - hbase
            }
        };
        for round in 0..12 {
            if round == 6 {
                // A whole write switches halves; changes in place go on in the other one.
                maps.write(&t, &Dir24_8::build(&t.v4)).expect("whole write");
            }
            let mut changed: Vec<Prefix<u32>> = Vec::new();
            for k in 0..200 {
                let p = match k % 4 {
                    // An existing route: replaced or removed.
                    0 | 1 => table[rng.random_range(0..table.len())].0,
                    // Nested in one, longer than /24.
                    2 => {
                        let (p, _) = table[rng.random_range(0..table.len())];
                        let len = rng.random_range(p.len().max(25)..=32);
                        Prefix::covering(p.addr() | (rng.next_u32() >> p.len().min(31)), len)
                    }
                    _ => Prefix::covering(rng.next_u32(), rng.random_range(12..=32)),
                };
                if rng.random_bool(0.3) {
                    t.v4.remove(p);
                } else {
                    t.v4.insert(p, rng.random_range(0..16)).expect("valid");
                }
                changed.push(p);
            }
            if round == 3 {
                let all = Prefix::covering(0, 0);
                t.v4.insert(all, 3).expect("valid");
                changed.push(all);
            }
            let done = maps.patch(&t, &changed, &[]).expect("patch");
            if round == 3 {
                // The default route covers every entry: too wide to change in place.
                assert!(!done);
                maps.write(&t, &Dir24_8::build(&t.v4)).expect("whole write");
            } else {
                assert!(done, "round {round}");
            }
            let d = Dir24_8::build(&t.v4);
            let mut addrs: Vec<u32> = (0..20_000).map(|_| rng.next_u32()).collect();
            for p in changed.iter().filter(|p| p.len() >= 16) {
                let span = Dir24_8::span(*p);
                addrs.extend((span.start << 8..=((span.end - 1) << 8) | 0xff).step_by(7));
            }
            for a in addrs {
                assert_eq!(
                    answer(&mut maps, a),
                    d.lookup(a).unwrap_or(NO_ROUTE),
                    "round {round}, {}",
                    std::net::Ipv4Addr::from(a)
                );
            }
            // Every group of the half in use is named once, free, or waiting to be free.
            let lo = (maps.half * maps.groups_half) as u32;
            let mut seen = vec![0u8; maps.groups_half];
            let named = (0..1u32 << 24)
                .map(|i| get(maps.tbl24.bytes_mut(), i as usize))
                .filter(|e| e & Dir24_8::EXTENDED != 0)
                .map(|e| e & !Dir24_8::EXTENDED);
            for g in named
                .chain(maps.free_groups.iter().copied())
                .chain(maps.quarantined.iter().copied())
            {
                seen[(g - lo) as usize] += 1;
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "round {round}: a group lost or named twice"
            );
        }
    }

    /// The generated program and `wire::forward` agree byte for byte: run on copies of frames
    /// (IPv4, IPv6, tagged, not IP, cut short, and with checksums left to offload — UDP and
    /// TCP, segments of every length modulo 4, one longer than the program sums) with
    /// `BPF_PROG_TEST_RUN`, every variant gives the same frame and a verdict that matches the
    /// library's answer: `complete_partial`, then `reflect`.
    #[test]
    fn the_xdp_reflector_does_what_the_library_does() {
        let mut frames = Vec::new();
        let mut partials = 0;
        for (s, d) in [
            ("198.18.0.1:1234", "198.18.0.2:9000"),
            ("[2001:2::1]:1234", "[2001:2::2]:9000"),
        ] {
            for vlan in [None, Some(5)] {
                for frame_len in [125, 126, 127, 128] {
                    let t = Template::build(&TemplateSpec {
                        src_mac: [2, 0, 0, 0, 0, 1],
                        dst_mac: [2, 0, 0, 0, 0, 2],
                        vlan,
                        src: s.parse().expect("addr"),
                        dst: d.parse().expect("addr"),
                        frame_len,
                    })
                    .expect("template");
                    frames.push(partial(&t.bytes, false));
                    frames.push(partial(&t.bytes, true));
                    frames.push(t.bytes);
                    partials += 2;
                }
            }
        }
        // Longer than the program sums: dropped and counted, never sent on unfinished.
        let long = Template::build(&TemplateSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            vlan: None,
            src: "198.18.0.1:1234".parse().expect("addr"),
            dst: "198.18.0.2:9000".parse().expect("addr"),
            frame_len: 14 + 20 + 4 * flowlane_io::ebpf::MAX_CSUM_WORDS as usize + 4,
        })
        .expect("template");
        let long = partial(&long.bytes, false);
        frames.push(long.clone());
        let mut arp = frames[2].clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        frames.push(arp);
        frames.push(frames[2][..30].to_vec()); // an IPv4 header cut short
        let stats = PerCpuCounters::create("fl_t_refl", reflect_stats::COUNT as u32).expect("map");
        for bits in 0..16u8 {
            let p = Reflect {
                stats_fd: stats.raw_fd(),
                swap_ip: bits & 1 != 0,
                swap_ports: bits & 2 != 0,
                pass_not_ip: bits & 4 != 0,
                complete_checksums: bits & 8 != 0,
            };
            let prog = match bpf::prog_load(
                bpf::PROG_XDP,
                "fl_t_refl",
                &reflect_program(&p).expect("asm"),
            ) {
                Ok(p) => p,
                Err(e) if e.error.source.kind() == std::io::ErrorKind::PermissionDenied => {
                    eprintln!("SKIP: loading XDP programs needs CAP_BPF");
                    return;
                }
                Err(e) => panic!("{p:?}: {e}"),
            };
            for f in &frames {
                let (verdict, out) = bpf::xdp_test_run(&prog, f).expect("test run");
                let mut want = f.clone();
                if p.complete_checksums {
                    if *f == long {
                        assert_eq!(verdict, 1, "dropped: {p:?}");
                        continue;
                    }
                    if let Ok(l3) = L3::parse(&want) {
                        let _ = complete_partial(&mut want, &l3);
                    }
                }
                let lib = reflect(
                    &mut want,
                    Swap {
                        ip: p.swap_ip,
                        ports: p.swap_ports,
                    },
                );
                match lib {
                    Ok(()) => {
                        assert_eq!(verdict, 3, "XDP_TX for {p:?}");
                        assert_eq!(out, want, "{p:?}");
                    }
                    Err(Reason::NotIp) => {
                        assert_eq!(verdict, if p.pass_not_ip { 2 } else { 1 }, "{p:?}");
                        assert_eq!(&out, f, "left alone");
                    }
                    Err(_) => assert_eq!(verdict, 1, "dropped: {p:?}"),
                }
            }
        }
        // Every run was counted once (CPU slots: whichever CPU ran the test), and each
        // completion besides.
        let at = |i: usize| stats.per_cpu(i as u32).iter().sum::<u64>();
        let counted: u64 = [
            reflect_stats::REFLECTED,
            reflect_stats::NOT_IP,
            reflect_stats::MALFORMED,
            reflect_stats::UNFINISHED,
        ]
        .iter()
        .map(|&i| at(i))
        .sum();
        assert_eq!(counted, 16 * frames.len() as u64);
        assert_eq!(at(reflect_stats::COMPLETED), 8 * partials);
        assert_eq!(at(reflect_stats::UNFINISHED), 8);
    }
}
