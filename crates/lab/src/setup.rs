//! The persistent two-host lab behind `flowlane lab up|down|status` and `flowlane bench`:
//! namespaces `NAME-gen` and `NAME-dut` joined by a multi-queue veth pair, with addresses from
//! the benchmarking ranges, NAPI/GRO on, XPS (thread on CPU i sends on queue i), and the DUT's
//! receive steering: software RSS (an XDP program computing the Toeplitz hash with the rss
//! crate's tables and redirecting through a cpumap), the kernel's RPS, or nothing.
//!
//! Everything the lab makes hangs off its two namespaces: deleting them removes the links, the
//! XDP program and its maps (nothing stays pinned). Its settings are kept in
//! `/run/flowlane/lab-NAME.json`, so `bench` picks flows with the same key and table.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use flowlane_io::ebpf;
use flowlane_io::{bpf, netdev};
use flowlane_rss::{Key, Reta, Symmetric, Toeplitz};
use serde::{Deserialize, Serialize};

use crate::{add_veth, ip, LabError, Netns, Offload};

/// The generator end's interface (in `NAME-gen`).
pub const GEN_IF: &str = "flgen";
/// The DUT end's interface (in `NAME-dut`).
pub const DUT_IF: &str = "fldut";
/// Addresses: generator, DUT (IPv4 /24 and IPv6 /64, from 198.18.0.0/15 and 2001:2::/48).
pub const LAB_GEN_V4: &str = "198.18.0.1";
/// The DUT's IPv4 address.
pub const LAB_DUT_V4: &str = "198.18.0.2";
/// The generator's IPv6 address.
pub const LAB_GEN_V6: &str = "2001:2::1";
/// The DUT's IPv6 address.
pub const LAB_DUT_V6: &str = "2001:2::2";
/// The generator end's MAC (fixed, so neighbour entries need no resolving).
pub const GEN_MAC: &str = "02:f1:0e:00:01:01";
const DUT_MAC: &str = "02:f1:0e:00:01:02";
/// Line topology: the DUT's second interface (towards the sink, in `NAME-dut`).
pub const DUT_OUT_IF: &str = "fldut1";
/// Line topology: the sink's interface (in `NAME-sink`).
pub const SINK_IF: &str = "flsink";
/// Line topology: the DUT's address towards the sink (198.18.1.0/24, 2001:2:0:1::/64).
pub const LAB_DUT_OUT_V4: &str = "198.18.1.1";
/// The sink's IPv4 address.
pub const LAB_SINK_V4: &str = "198.18.1.2";
/// The DUT's IPv6 address towards the sink.
pub const LAB_DUT_OUT_V6: &str = "2001:2:0:1::1";
/// The sink's IPv6 address.
pub const LAB_SINK_V6: &str = "2001:2:0:1::2";
/// Switched line: the sink's addresses on the generator's segment.
pub const LAB_SINK_L2_V4: &str = "198.18.0.3";
/// Switched line: the sink's IPv6 address.
pub const LAB_SINK_L2_V6: &str = "2001:2::3";
const DUT_OUT_MAC: &str = "02:f1:0e:00:02:01";
const SINK_MAC: &str = "02:f1:0e:00:02:02";

/// How the lab's hosts are joined.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Generator — DUT: one veth pair.
    #[default]
    Pair,
    /// Generator — DUT — sink: two veth pairs, so the DUT forwards between two interfaces
    /// (198.18.0.0/24 on the generator's side, 198.18.1.0/24 on the sink's; each end routes
    /// 198.18.0.0/15 and 2001:2::/48 through the DUT).
    Line,
}

/// How a line lab's two links are joined at the DUT.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Segment {
    /// Two subnets, the DUT routes between them (198.18.0.0/24 and 198.18.1.0/24).
    #[default]
    Routed,
    /// One subnet across the DUT, which bridges: the generator 198.18.0.1, the sink
    /// 198.18.0.3 (2001:2::1, 2001:2::3); the DUT's ports have no addresses and no IPv6.
    Switched,
}

/// What forwards in the DUT of a line lab, besides whatever the user starts there.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum KernelDut {
    /// Nothing: the kernel's forwarding is off (for `flowlane forward`, or any forwarder).
    #[default]
    Off,
    /// The kernel's IPv4 and IPv6 forwarding (the reference router; routed segment).
    Route,
    /// The kernel's bridge, `flbr0`, over the DUT's ports (the reference bridge; switched
    /// segment).
    Bridge,
}

/// How the DUT spreads received frames over CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Steer {
    /// Software RSS: Toeplitz + RETA in XDP, then a cpumap.
    Rss,
    /// The kernel's Receive Packet Steering over all CPUs (its own flow hash, not Toeplitz).
    Rps,
    /// Nothing: frames are processed where they arrive (on veth: the sender's CPU).
    None,
}

impl Steer {
    /// Name for output.
    pub fn name(self) -> &'static str {
        match self {
            Steer::Rss => "rss",
            Steer::Rps => "rps",
            Steer::None => "none",
        }
    }
}

/// What a lab is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LabConfig {
    /// Lab name (namespaces `NAME-gen`, `NAME-dut`).
    pub name: String,
    /// RX and TX queues per veth end.
    pub queues: u32,
    /// Receive steering on the DUT.
    pub steer: Steer,
    /// RSS key (hex) the steering program hashes with.
    pub key: String,
    /// The indirection table: RETA index → queue (bucket).
    pub reta: Vec<u16>,
    /// Queue (bucket) → CPU.
    pub queue_cpus: Vec<u32>,
    /// Hash UDP/TCP ports (4-tuple) or only addresses (2-tuple).
    pub ports: bool,
    /// Frames each CPU's software-RSS queue (cpumap entry) holds, 1..=16384 (saved labs
    /// from before this setting: the largest).
    #[serde(default = "default_cpu_queue")]
    pub cpu_queue: u32,
    /// How the hosts are joined.
    #[serde(default)]
    pub topology: Topology,
    /// Line topology: whether the DUT's kernel forwards.
    #[serde(default)]
    pub kernel: KernelDut,
    /// Line topology: routed or switched.
    #[serde(default)]
    pub segment: Segment,
    /// Symmetric hashing, as a NIC's `ethtool -X … xfrm symmetric-xor` makes it: off or xor
    /// (sort is not linear, so the steering program's byte tables cannot model it).
    #[serde(default)]
    pub symmetric: Symmetric,
}

/// The largest cpumap queue the kernel takes (16385 fails with EOVERFLOW).
pub const MAX_CPU_QUEUE: u32 = 16384;

fn default_cpu_queue() -> u32 {
    MAX_CPU_QUEUE
}

impl LabConfig {
    /// A lab with `queues` buckets, a round-robin RETA of 128 entries, bucket q on CPU
    /// q mod `ncpus`, and `key`.
    pub fn new(name: &str, queues: u32, steer: Steer, key: &Key, ncpus: u32) -> LabConfig {
        let q = queues.max(1);
        let reta = Reta::round_robin(128, q as usize)
            .map(|r| r.entries().to_vec())
            .unwrap_or_else(|_| vec![0; 128]);
        LabConfig {
            name: name.to_string(),
            queues: q,
            steer,
            key: key.to_hex(),
            reta,
            queue_cpus: (0..q).map(|b| b % ncpus.max(1)).collect(),
            ports: true,
            cpu_queue: MAX_CPU_QUEUE,
            topology: Topology::Pair,
            kernel: KernelDut::Off,
            segment: Segment::Routed,
            symmetric: Symmetric::Off,
        }
    }

    /// The sink's namespace (line topology).
    pub fn sink_ns(&self) -> String {
        format!("{}-sink", self.name)
    }

    /// Every namespace the lab is made of.
    pub fn namespaces(&self) -> Vec<String> {
        let mut v = vec![self.gen_ns(), self.dut_ns()];
        if self.topology == Topology::Line {
            v.push(self.sink_ns());
        }
        v
    }

    /// The generator's namespace.
    pub fn gen_ns(&self) -> String {
        format!("{}-gen", self.name)
    }

    /// The DUT's namespace.
    pub fn dut_ns(&self) -> String {
        format!("{}-dut", self.name)
    }

    /// The key.
    pub fn rss_key(&self) -> Result<Key, LabError> {
        Key::parse(&self.key).map_err(|e| LabError {
            what: format!("lab {} key", self.name),
            detail: e.to_string(),
        })
    }
}

fn state_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/flowlane/lab-{name}.json"))
}

/// A lab name usable in namespace and file names.
pub fn check_name(name: &str) -> Result<(), LabError> {
    let ok = !name.is_empty()
        && name.len() <= 24
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(LabError {
            what: format!("lab name `{name}`"),
            detail: "use 1-24 letters, digits, - or _".into(),
        })
    }
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// The file that marks namespace `ns` as made by `lab up` (written as soon as it is made):
/// only such namespaces are ever deleted. `lab up --name X` once deleted a namespace `X-dut`
/// the user had made, and `lab down` a plain `X-gen`.
fn marker(ns: &str) -> PathBuf {
    PathBuf::from(format!("/run/flowlane/ns-{ns}"))
}

/// Namespace `ns` of lab `name` was made by flowlane: marked, or listed by the lab's saved
/// settings (a lab made before the markers).
fn ours(name: &str, ns: &str) -> bool {
    marker(ns).exists() || saved(name).is_some_and(|c| c.namespaces().iter().any(|n| n == ns))
}

/// The namespaces lab `cfg` would make that exist and are not flowlane's (someone else's):
/// `lab up` refuses them by name.
pub fn foreign_namespaces(cfg: &LabConfig) -> Vec<String> {
    cfg.namespaces()
        .into_iter()
        .filter(|ns| netns_exists(ns) && !ours(&cfg.name, ns))
        .collect()
}

/// A namespace for the lab, marked as flowlane's before it is made (a `lab up` killed at any
/// point leaves a marked namespace, or a marker alone, for the next `down` to remove).
fn lab_netns(name: &str) -> Result<Netns, LabError> {
    let path = marker(name);
    path.parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, b""))
        .map_err(|e| LabError {
            what: format!("mark namespace {name} as the lab's ({})", path.display()),
            detail: e.to_string(),
        })?;
    Netns::persistent(name).inspect_err(|_| {
        if !netns_exists(name) {
            let _ = std::fs::remove_file(&path);
        }
    })
}

/// The saved settings of lab `name`, if it is up.
pub fn saved(name: &str) -> Option<LabConfig> {
    let text = std::fs::read_to_string(state_path(name)).ok()?;
    serde_json::from_str(&text).ok()
}

/// What `up` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Up {
    /// Made it now.
    Created,
    /// It was already up with these settings.
    AlreadyUp,
}

/// Brings the lab up. Idempotent: a lab already up with the same settings is left alone; one
/// with other settings is refused (take it down first); leftovers of a half-made lab are
/// removed first. A failure half-way removes what was made.
pub fn up(cfg: &LabConfig) -> Result<Up, LabError> {
    check_name(&cfg.name)?;
    if let Some(old) = saved(&cfg.name) {
        if old.namespaces().iter().all(|n| netns_exists(n)) {
            if old == *cfg {
                return Ok(Up::AlreadyUp);
            }
            return Err(LabError {
                what: format!("lab up {}", cfg.name),
                detail: format!(
                    "lab {} is up with other settings ({} queues, steer {}, topology {:?}, \
                     kernel {:?}): run `flowlane lab down --name {}` first",
                    cfg.name,
                    old.queues,
                    old.steer.name(),
                    old.topology,
                    old.kernel,
                    cfg.name
                ),
            });
        }
    }
    let foreign = foreign_namespaces(cfg);
    if !foreign.is_empty() {
        return Err(LabError {
            what: format!("lab up {}", cfg.name),
            detail: format!(
                "namespace {} exists and was not made by flowlane: choose another --name (it \
                 is left as it is)",
                foreign.join(", ")
            ),
        });
    }
    down(&cfg.name)?;
    match build(cfg) {
        Ok(()) => Ok(Up::Created),
        Err(e) => {
            let _ = down(&cfg.name);
            Err(e)
        }
    }
}

fn build(cfg: &LabConfig) -> Result<(), LabError> {
    let gen = lab_netns(&cfg.gen_ns())?;
    let dut = lab_netns(&cfg.dut_ns())?;
    add_veth(
        (&gen, GEN_IF, Some(GEN_MAC)),
        (&dut, DUT_IF, Some(DUT_MAC)),
        cfg.queues,
    )?;
    let sink = match cfg.topology {
        Topology::Pair => None,
        Topology::Line => {
            let sink = lab_netns(&cfg.sink_ns())?;
            add_veth(
                (&dut, DUT_OUT_IF, Some(DUT_OUT_MAC)),
                (&sink, SINK_IF, Some(SINK_MAC)),
                cfg.queues,
            )?;
            Some(sink)
        }
    };
    match (&sink, cfg.segment) {
        (Some(sink), Segment::Switched) => build_switched(cfg, &gen, &dut, sink)?,
        _ => build_routed(cfg, &gen, &dut, sink.as_ref())?,
    }
    match cfg.steer {
        Steer::Rss => attach_rss(cfg, &dut)?,
        Steer::Rps => {
            let ncpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let all = format!("{:x}", (1u128 << ncpus.min(64)) - 1);
            for rx in 0..cfg.queues {
                dut.write_sys(
                    &format!("/sys/class/net/{DUT_IF}/queues/rx-{rx}/rps_cpus"),
                    &all,
                )?;
            }
        }
        Steer::None => {}
    }
    let path = state_path(&cfg.name);
    let text = serde_json::to_string_pretty(cfg).map_err(|e| LabError {
        what: "lab settings".into(),
        detail: e.to_string(),
    })?;
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, text)
    };
    write().map_err(|e| LabError {
        what: format!("write {}", path.display()),
        detail: e.to_string(),
    })?;
    // The namespaces stay: they are the lab.
    gen.keep();
    dut.keep();
    if let Some(sink) = sink {
        sink.keep();
    }
    Ok(())
}

/// Addresses on every end; a line's far ends route the benchmarking ranges through the DUT,
/// whose kernel forwards or not as configured.
fn build_routed(
    cfg: &LabConfig,
    gen: &Netns,
    dut: &Netns,
    sink: Option<&Netns>,
) -> Result<(), LabError> {
    let mut ends = vec![
        End {
            ns: gen,
            ifname: GEN_IF,
            v4: LAB_GEN_V4,
            v6: LAB_GEN_V6,
            peer4: LAB_DUT_V4,
            peer6: LAB_DUT_V6,
            peer_mac: DUT_MAC,
        },
        End {
            ns: dut,
            ifname: DUT_IF,
            v4: LAB_DUT_V4,
            v6: LAB_DUT_V6,
            peer4: LAB_GEN_V4,
            peer6: LAB_GEN_V6,
            peer_mac: GEN_MAC,
        },
    ];
    if let Some(sink) = sink {
        ends.push(End {
            ns: dut,
            ifname: DUT_OUT_IF,
            v4: LAB_DUT_OUT_V4,
            v6: LAB_DUT_OUT_V6,
            peer4: LAB_SINK_V4,
            peer6: LAB_SINK_V6,
            peer_mac: SINK_MAC,
        });
        ends.push(End {
            ns: sink,
            ifname: SINK_IF,
            v4: LAB_SINK_V4,
            v6: LAB_SINK_V6,
            peer4: LAB_DUT_OUT_V4,
            peer6: LAB_DUT_OUT_V6,
            peer_mac: DUT_OUT_MAC,
        });
    }
    for e in &ends {
        set_up_end(e, cfg.queues)?;
    }
    if let Some(sink) = sink {
        // The far ends reach the whole benchmarking range through the DUT.
        for (ns, gw4, gw6) in [
            (gen, LAB_DUT_V4, LAB_DUT_V6),
            (sink, LAB_DUT_OUT_V4, LAB_DUT_OUT_V6),
        ] {
            ns.ip(&["route", "add", "198.18.0.0/15", "via", gw4])?;
            ns.ip(&["-6", "route", "add", "2001:2::/48", "via", gw6])?;
        }
        let on = if cfg.kernel == KernelDut::Route {
            "1"
        } else {
            "0"
        };
        dut.write_file("/proc/sys/net/ipv4/ip_forward", on)?;
        dut.write_file("/proc/sys/net/ipv6/conf/all/forwarding", on)?;
    }
    Ok(())
}

/// The kernel bridge's name in a switched line's DUT.
pub const KERNEL_BRIDGE: &str = "flbr0";

/// One subnet across the DUT: the far ends address each other directly; the DUT's ports carry
/// no address and no IPv6 (an L2 device), joined by the kernel's bridge where asked.
fn build_switched(cfg: &LabConfig, gen: &Netns, dut: &Netns, sink: &Netns) -> Result<(), LabError> {
    for e in [
        End {
            ns: gen,
            ifname: GEN_IF,
            v4: LAB_GEN_V4,
            v6: LAB_GEN_V6,
            peer4: LAB_SINK_L2_V4,
            peer6: LAB_SINK_L2_V6,
            peer_mac: SINK_MAC,
        },
        End {
            ns: sink,
            ifname: SINK_IF,
            v4: LAB_SINK_L2_V4,
            v6: LAB_SINK_L2_V6,
            peer4: LAB_GEN_V4,
            peer6: LAB_GEN_V6,
            peer_mac: GEN_MAC,
        },
    ] {
        set_up_end(&e, cfg.queues)?;
    }
    for port in [DUT_IF, DUT_OUT_IF] {
        dut.write_file(&format!("/proc/sys/net/ipv6/conf/{port}/disable_ipv6"), "1")?;
        set_up_link(dut, port, cfg.queues)?;
    }
    dut.write_file("/proc/sys/net/ipv4/ip_forward", "0")?;
    if cfg.kernel == KernelDut::Bridge {
        dut.ip(&["link", "add", KERNEL_BRIDGE, "type", "bridge"])?;
        dut.write_file(
            &format!("/proc/sys/net/ipv6/conf/{KERNEL_BRIDGE}/disable_ipv6"),
            "1",
        )?;
        for port in [DUT_IF, DUT_OUT_IF] {
            dut.ip(&["link", "set", port, "master", KERNEL_BRIDGE])?;
        }
        dut.ip(&["link", "set", KERNEL_BRIDGE, "up"])?;
    }
    Ok(())
}

/// One end of a veth pair: its namespace, interface, addresses and its peer's.
struct End<'a> {
    ns: &'a Netns,
    ifname: &'a str,
    v4: &'a str,
    v6: &'a str,
    peer4: &'a str,
    peer6: &'a str,
    peer_mac: &'a str,
}

fn set_up_end(e: &End<'_>, queues: u32) -> Result<(), LabError> {
    let (ns, ifname) = (e.ns, e.ifname);
    // No router solicitations or address autoconfiguration chatter on the link.
    for (k, v) in [("accept_ra", "0"), ("router_solicitations", "0")] {
        ns.write_file(&format!("/proc/sys/net/ipv6/conf/{ifname}/{k}"), v)?;
    }
    ns.ip(&["addr", "add", &format!("{}/24", e.v4), "dev", ifname])?;
    ns.ip(&[
        "addr",
        "add",
        &format!("{}/64", e.v6),
        "dev",
        ifname,
        "nodad",
    ])?;
    for peer in [e.peer4, e.peer6] {
        ns.permanent_neighbour(ifname, peer, e.peer_mac)?;
    }
    set_up_link(ns, ifname, queues)
}

/// Brings a lab interface up with its offloads and XPS.
fn set_up_link(ns: &Netns, ifname: &str, queues: u32) -> Result<(), LabError> {
    let ncpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    ns.ip(&["link", "set", ifname, "up"])?;
    // NAPI with GRO on both ends: per-queue receive processing. Checksums computed by the
    // sender, not left to "offload": a frame that XDP redirects (software RSS) loses the
    // skb's note that its checksum is still partial, and the receiver would drop it.
    ns.set_offload(ifname, Offload::Gro, true)?;
    ns.set_offload(ifname, Offload::TxChecksum, false)?;
    // XPS: a thread on CPU i sends on TX queue i (a single-queue device has no XPS).
    for tx in 0..queues as usize * usize::from(queues > 1) {
        let mask = if tx < ncpus {
            format!("{:x}", 1u64 << (tx % 64))
        } else {
            "0".into()
        };
        ns.write_sys(
            &format!("/sys/class/net/{ifname}/queues/tx-{tx}/xps_cpus"),
            &mask,
        )?;
    }
    Ok(())
}

/// The rows a family's 4-tuple of `addr` bytes per address hashes with: the plain Toeplitz
/// rows, or for `symmetric-xor` each field's row XORed with its partner's (source address
/// byte i with destination byte i, source port byte with destination port byte) — Toeplitz is
/// linear in its input, so hashing (s, d, p, q) with those rows is hashing (s^d, s^d, p^q,
/// p^q) with the plain ones.
fn family_rows(t: &Toeplitz, addr: usize, symmetric: Symmetric) -> Vec<[u32; 256]> {
    let mut rows = t.byte_rows(2 * addr + 4).to_vec();
    if symmetric == Symmetric::Xor {
        let pairs = (0..addr).map(|i| (i, i + addr));
        let ports = (0..2).map(|i| (2 * addr + i, 2 * addr + 2 + i));
        for (a, b) in pairs.chain(ports) {
            let mut both = [0u32; 256];
            for (x, (ra, rb)) in both.iter_mut().zip(rows[a].iter().zip(rows[b].iter())) {
                *x = ra ^ rb;
            }
            rows[a] = both;
            rows[b] = both;
        }
    }
    rows
}

/// The value of the steering table: Toeplitz byte rows (IPv6's, then IPv4's), then RETA
/// index → CPU.
pub fn rss_table(cfg: &LabConfig) -> Result<Vec<u8>, LabError> {
    let key = cfg.rss_key()?;
    if cfg.symmetric == Symmetric::Sort {
        return Err(LabError {
            what: "software RSS".into(),
            detail: "symmetric hashing by sorting the endpoints is not linear in the input, so \
                     the steering program's byte tables cannot model it: use xor (ethtool's \
                     symmetric-xor)"
                .into(),
        });
    }
    let t = Toeplitz::new(&key);
    let mut v = Vec::with_capacity(ebpf::rss_table::value_size(cfg.reta.len()));
    let v6 = family_rows(&t, 16, cfg.symmetric);
    let v4 = family_rows(&t, 4, cfg.symmetric);
    for row in v6.iter().chain(&v4) {
        for x in row {
            v.extend_from_slice(&x.to_ne_bytes());
        }
    }
    v.resize(ebpf::rss_table::CPU_TABLE, 0);
    for &q in &cfg.reta {
        let cpu = cfg.queue_cpus.get(q as usize).copied().unwrap_or(0);
        v.extend_from_slice(&cpu.to_ne_bytes());
    }
    Ok(v)
}

fn bpf_err(what: &str) -> impl FnOnce(flowlane_io::SysError) -> LabError + '_ {
    move |e| LabError {
        what: what.to_string(),
        detail: e.to_string(),
    }
}

/// Loads the software-RSS program with its maps and attaches it to the DUT's interface
/// (native XDP on veth) through rtnetlink: no bpf file system, nothing pinned; the interface
/// holds it, and it goes with it.
fn attach_rss(cfg: &LabConfig, dut: &Netns) -> Result<(), LabError> {
    let reta_len = cfg.reta.len();
    if !reta_len.is_power_of_two() {
        return Err(LabError {
            what: "software RSS".into(),
            detail: format!("the RETA has {reta_len} entries; it needs a power of two"),
        });
    }
    if !(1..=MAX_CPU_QUEUE).contains(&cfg.cpu_queue) {
        return Err(LabError {
            what: "software RSS".into(),
            detail: format!(
                "a CPU queue of {} frames; the kernel takes 1 to {MAX_CPU_QUEUE}",
                cfg.cpu_queue
            ),
        });
    }
    let value = rss_table(cfg)?;
    let table = bpf::ArrayMap::create("fl_rss_table", value.len(), 1)
        .map_err(bpf_err("create the RSS table map"))?;
    table
        .set(0, &value)
        .map_err(bpf_err("fill the RSS table map"))?;
    let ncpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let stats = bpf::ArrayMap::create(STATS_MAP, ebpf::rss_stats::value_size(ncpus), 1)
        .map_err(bpf_err("create the RSS counters map"))?;
    let arrivals = ebpf::cpumap_arrivals_program(stats.raw_fd(), ncpus).map_err(|e| LabError {
        what: "assemble the cpumap program".into(),
        detail: e.to_string(),
    })?;
    let arrivals = bpf::prog_load_for(
        bpf::PROG_XDP,
        bpf::ATTACH_XDP_CPUMAP,
        "fl_rss_arrive",
        &arrivals,
    )
    .map_err(|e| LabError {
        what: "load the cpumap program".into(),
        detail: e.to_string(),
    })?;
    let cpumap = bpf::CpuMap::create(CPUMAP, ncpus).map_err(bpf_err("create the cpumap"))?;
    for cpu in 0..ncpus {
        // Queue size per CPU: frames waiting for that CPU's kernel thread. A frame that finds
        // the queue full is dropped with no interface or socket counter to show it, hence the
        // counters. The default is the kernel's largest: a 2048 queue overflowed at 40k pps on
        // a 2-CPU VM when the thread's CPU stalled ~50 ms (a CI run of the bench test); 16384
        // rides out ~400 ms at that rate.
        cpumap
            .set(cpu, cfg.cpu_queue, &arrivals)
            .map_err(bpf_err("add a CPU to the cpumap"))?;
    }
    let insns = ebpf::rss_steer_program(
        table.raw_fd(),
        cpumap.raw_fd(),
        stats.raw_fd(),
        ncpus,
        reta_len as u32,
        cfg.ports,
    )
    .map_err(|e| LabError {
        what: "assemble the RSS program".into(),
        detail: e.to_string(),
    })?;
    let prog = bpf::prog_load(bpf::PROG_XDP, "fl_rss", &insns).map_err(|e| LabError {
        what: "load the RSS program".into(),
        detail: e.to_string(),
    })?;
    // Attached through rtnetlink from inside the namespace: the interface holds the program
    // (it outlives this process) and it goes with the interface on `lab down`.
    dut.run(|| {
        let ifindex = flowlane_io::netdev::ifindex(DUT_IF)?;
        netdev::attach_xdp_to_link(&prog, ifindex, netdev::XDP_FLAGS_DRV_MODE)
    })?
    .map_err(bpf_err(
        "attach the RSS program to the DUT's interface (native XDP)",
    ))
}

/// Name of the software-RSS counters map (see [`ebpf::rss_stats`]).
const STATS_MAP: &str = "fl_rss_stats";
/// Name of the software-RSS cpumap.
const CPUMAP: &str = "fl_rss_cpus";

/// One CPU's software-RSS counts since the lab came up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SteerCount {
    /// The CPU.
    pub cpu: u32,
    /// Frames the steering program handed to its queue.
    pub redirected: u64,
    /// Frames its queue's kernel thread took off (and gave the stack).
    pub arrived: u64,
}

/// The id of the XDP program attached to the DUT's interface (`None`: none is).
fn xdp_program(dut: &Netns) -> Result<Option<u32>, LabError> {
    let text = dut.ip(&["-j", "link", "show", "dev", DUT_IF])?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| LabError {
        what: format!("`ip -j link show dev {DUT_IF}` output"),
        detail: e.to_string(),
    })?;
    let Some(id) = v[0]["xdp"]["prog"]["id"].as_u64() else {
        return Ok(None);
    };
    u32::try_from(id).map(Some).map_err(|_| LabError {
        what: "XDP program id".into(),
        detail: format!("{id} is out of range"),
    })
}

/// Map `name` of XDP program `prog` (`None`: no program, or no such map), found by the
/// program's id: another process than `lab up` can read it.
fn steer_map(prog: Option<u32>, name: &str) -> Result<Option<bpf::FoundMap>, LabError> {
    let Some(id) = prog else {
        return Ok(None);
    };
    bpf::map_of_program(id, name).map_err(bpf_err("find the steering program's maps"))
}

/// The DUT interface's counters and its queues' driver counts as of one moment. On veth the
/// interface's rx_packets is the sum of the queues' XDP counts, but they are read by separate
/// calls: a frame arriving between them (a late MLD report after `lab up`) is in one and not
/// the other (seen in CI: queues 159 701, interface 159 702). The interface is read again
/// after the queues, retrying (bounded at half a second) until it has not moved.
fn dut_view(
    ns: &Netns,
) -> (
    Option<crate::counters::IfCounters>,
    Vec<crate::counters::RxQueue>,
) {
    let read = || ns.dev().ok().and_then(|d| d.ifaces.get(DUT_IF).copied());
    let until = std::time::Instant::now() + std::time::Duration::from_millis(500);
    loop {
        let first = read();
        let queues = ns
            .run(|| flowlane_io::netdev::driver_stats(DUT_IF))
            .ok()
            .and_then(Result::ok)
            .map(|s| crate::counters::rx_queues(&s))
            .unwrap_or_default();
        let again = read();
        let same = first.map(|c| (c.rx_packets, c.rx_dropped))
            == again.map(|c| (c.rx_packets, c.rx_dropped));
        if same || std::time::Instant::now() >= until {
            return (again, queues);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The id of the software-RSS cpumap (as the `xdp:xdp_cpumap_enqueue` tracepoint reports
/// it), or `None` without software RSS.
pub fn cpumap_id(dut: &Netns) -> Result<Option<u32>, LabError> {
    Ok(steer_map(xdp_program(dut)?, CPUMAP)?.map(|m| m.id()))
}

/// The software-RSS counts per CPU of the XDP program attached to the DUT's interface, or
/// `None` when none is (steering `rps` or `none`). Redirected − arrived, once traffic has
/// stopped, is what the CPU queues dropped when full.
pub fn steer_counts(dut: &Netns) -> Result<Option<Vec<SteerCount>>, LabError> {
    steer_counts_of(xdp_program(dut)?)
}

/// [`steer_counts`] of XDP program `prog`.
fn steer_counts_of(prog: Option<u32>) -> Result<Option<Vec<SteerCount>>, LabError> {
    let Some(map) = steer_map(prog, STATS_MAP)? else {
        return Ok(None);
    };
    let value = map.lookup(0).map_err(bpf_err("read the RSS counters"))?;
    let slot = ebpf::rss_stats::SLOT;
    let u64_at = |o: usize| {
        value
            .get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_ne_bytes)
    };
    Ok(Some(
        (0..value.len() / slot)
            .map(|c| SteerCount {
                cpu: c as u32,
                redirected: u64_at(c * slot + ebpf::rss_stats::REDIRECTED),
                arrived: u64_at(c * slot + ebpf::rss_stats::ARRIVED),
            })
            .collect(),
    ))
}

/// Removes lab `name`: its namespaces (with them the links and the XDP program) and the
/// saved settings. True if anything was there. Harmless when nothing is. A namespace of the
/// lab's name that flowlane did not make (see [`foreign_namespaces`]) is left alone.
pub fn down(name: &str) -> Result<bool, LabError> {
    check_name(name)?;
    let mut any = false;
    for ns in [
        format!("{name}-gen"),
        format!("{name}-dut"),
        format!("{name}-sink"),
    ] {
        if netns_exists(&ns) && ours(name, &ns) {
            ip(&["netns", "del", &ns])?;
            any = true;
        }
        let _ = std::fs::remove_file(marker(&ns));
    }
    let path = state_path(name);
    if path.exists() {
        std::fs::remove_file(&path).map_err(|e| LabError {
            what: format!("remove {}", path.display()),
            detail: e.to_string(),
        })?;
        any = true;
    }
    Ok(any)
}

/// What `status` reports about a lab.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LabStatus {
    /// Saved settings (none: not made by `up`, or half-made).
    pub config: Option<LabConfig>,
    /// Which namespaces exist.
    pub namespaces: Vec<(String, bool)>,
    /// RX queues of the DUT interface.
    pub dut_rx_queues: Option<usize>,
    /// Steering found on the DUT interface: `rss` (an XDP program is attached), `rps`, `none`.
    pub steering: Option<String>,
    /// Addresses per end.
    pub addresses: Vec<(String, Vec<IpAddr>)>,
    /// Interface counters per end: (rx packets, rx bytes, tx packets, tx bytes, rx dropped).
    pub counters: Vec<(String, [u64; 5])>,
    /// Software-RSS counts per CPU (when the steering program is attached); redirected −
    /// arrived is what the CPU queues dropped (exact once traffic stops).
    pub steer_counts: Option<Vec<SteerCount>>,
    /// Why the software-RSS counts could not be read, if they could not.
    pub steer_counts_error: Option<String>,
    /// What the kernel's receive path did on each CPU (`/proc/net/softnet_stat`: one table for
    /// the whole host, every namespace shares it).
    #[serde(default)]
    pub softnet: Vec<crate::counters::Softnet>,
    /// The DUT interface's receive queues as its driver counts them (`ethtool -S`).
    #[serde(default)]
    pub dut_queues: Vec<crate::counters::RxQueue>,
}

/// `flowlane lab status --json`: whether the lab is whole, and its state.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LabStatusReport {
    /// Every namespace exists and the saved settings are there.
    pub up: bool,
    /// What the system shows.
    pub status: LabStatus,
}

/// The state of lab `name` as the system shows it.
pub fn status(name: &str) -> Result<LabStatus, LabError> {
    check_name(name)?;
    let config = saved(name);
    let (g, d, k) = (
        format!("{name}-gen"),
        format!("{name}-dut"),
        format!("{name}-sink"),
    );
    let line = config.as_ref().map(|c| c.topology) == Some(Topology::Line) || netns_exists(&k);
    let mut namespaces = vec![(g.clone(), netns_exists(&g)), (d.clone(), netns_exists(&d))];
    let mut ends = vec![(&g, GEN_IF), (&d, DUT_IF)];
    if line {
        namespaces.push((k.clone(), netns_exists(&k)));
        ends.extend([(&d, DUT_OUT_IF), (&k, SINK_IF)]);
    }
    let mut st = LabStatus {
        config,
        namespaces,
        dut_rx_queues: None,
        steering: None,
        addresses: Vec::new(),
        counters: Vec::new(),
        steer_counts: None,
        steer_counts_error: None,
        softnet: crate::counters::read_proc("softnet_stat")
            .and_then(|t| crate::counters::parse_softnet(&t))
            .unwrap_or_default(),
        dut_queues: Vec::new(),
    };
    for (ns_name, ifname) in ends {
        if !netns_exists(ns_name) {
            continue;
        }
        let ns = Netns::existing(ns_name);
        if let Ok(text) = ns.ip(&["-j", "addr", "show", "dev", ifname]) {
            let addrs = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| {
                    v.get(0)?.get("addr_info")?.as_array().map(|a| {
                        a.iter()
                            .filter_map(|x| x.get("local")?.as_str()?.parse().ok())
                            .collect::<Vec<IpAddr>>()
                    })
                })
                .unwrap_or_default();
            st.addresses.push((ifname.to_string(), addrs));
        }
        // The DUT's counters and its queues' counts as of one moment (see `dut_view`).
        let (counters, queues) = if ifname == DUT_IF {
            dut_view(&ns)
        } else {
            (
                ns.dev().ok().and_then(|d| d.ifaces.get(ifname).copied()),
                Vec::new(),
            )
        };
        if let Some(c) = counters {
            st.counters.push((
                ifname.to_string(),
                [
                    c.rx_packets,
                    c.rx_bytes,
                    c.tx_packets,
                    c.tx_bytes,
                    c.rx_dropped,
                ],
            ));
        }
        if ifname == DUT_IF {
            st.dut_queues = queues;
            st.dut_rx_queues = ns
                .list_sys(&format!("/sys/class/net/{DUT_IF}/queues"))
                .ok()
                .map(|qs| qs.iter().filter(|q| q.starts_with("rx-")).count());
            // One `ip link` query: whether a program is attached (software RSS), and which
            // one, for its counters.
            let prog = xdp_program(&ns);
            let rps = ns
                .read_sys(&format!("/sys/class/net/{DUT_IF}/queues/rx-0/rps_cpus"))
                .unwrap_or_default();
            let rps_on = !rps.trim().trim_matches(|c| c == '0' || c == ',').is_empty();
            let attached = matches!(prog, Ok(Some(_)));
            match prog.and_then(steer_counts_of) {
                Ok(c) => st.steer_counts = c,
                Err(e) => st.steer_counts_error = Some(e.to_string()),
            }
            st.steering = Some(
                if attached {
                    "rss"
                } else if rps_on {
                    "rps"
                } else {
                    "none"
                }
                .into(),
            );
        }
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowlane_rss::Tuple;

    /// The steering program's hash, as it XORs one row per input byte.
    fn by_rows(rows: &[[u32; 256]], input: &[u8]) -> u32 {
        input
            .iter()
            .zip(rows)
            .fold(0, |h, (&b, row)| h ^ row[b as usize])
    }

    /// The rows the lab's program hashes with give the library's hash of every tuple — plain,
    /// and with ethtool's symmetric-xor, where both directions of a flow then agree — for
    /// both families and both tuple lengths (the 2-tuple uses the first rows).
    #[test]
    fn the_steering_rows_hash_as_the_library_does() {
        let t = Toeplitz::new(&Key::MICROSOFT);
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed >> 16
        };
        for sym in [Symmetric::Off, Symmetric::Xor] {
            let v6 = family_rows(&t, 16, sym);
            let v4 = family_rows(&t, 4, sym);
            for _ in 0..200 {
                let (a, b) = (next(), next());
                let (p, q) = ((a >> 8) as u16, (b >> 8) as u16);
                let four = Tuple::v4((a as u32).into(), (b as u32).into(), p, q);
                let six = Tuple::v6(
                    u128::from(a).wrapping_mul(0x9e37_79b9).into(),
                    u128::from(b).wrapping_mul(0x7f4a_7c15).into(),
                    p,
                    q,
                );
                for (tu, rows) in [(four, &v4), (six, &v6)] {
                    let want = t.hash(&tu.symmetric(sym));
                    assert_eq!(by_rows(rows, tu.input()), want, "{sym:?} {tu:?}");
                    if sym == Symmetric::Xor {
                        assert_eq!(by_rows(rows, tu.reversed().input()), want);
                    }
                }
                let two = Tuple::v4_addrs((a as u32).into(), (b as u32).into());
                assert_eq!(by_rows(&v4, two.input()), t.hash(&two.symmetric(sym)));
            }
        }
    }
}
