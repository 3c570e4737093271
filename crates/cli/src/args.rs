//! Argument types shared by subcommands: keys, endpoints, ranges, queue models.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use flowlane_rss::pick::addr_to_u128;
use flowlane_rss::queue::{FreeBsdBuckets, QueueModel, Reta};
use flowlane_rss::{Key, Symmetric};

use crate::Failure;

/// Parses `--key`: hex, ethtool colon form, or the names `microsoft` / `symmetric`.
/// A percentage, 0 to 100.
pub fn parse_pct(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a percentage from 0 to 100")),
    }
}

pub fn parse_key(s: &str) -> Result<Key, String> {
    match s {
        "microsoft" | "default" => Ok(Key::MICROSOFT),
        "symmetric" => Ok(Key::symmetric()),
        _ => Key::parse(s).map_err(|e| e.to_string()),
    }
}

/// `IP` or `IP:PORT` (`[V6]:PORT` for IPv6 with a port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: IpAddr,
    pub port: Option<u16>,
}

pub fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    if let Ok(addr) = s.parse::<IpAddr>() {
        return Ok(Endpoint { addr, port: None });
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Ok(Endpoint {
            addr: sa.ip(),
            port: Some(sa.port()),
        });
    }
    Err(format!(
        "`{s}` is not IP or IP:PORT (write IPv6 with a port as [2001:2::1]:8080)"
    ))
}

/// `IP:PORT` (port required).
pub fn parse_endpoint_with_port(s: &str) -> Result<Endpoint, String> {
    let e = parse_endpoint(s)?;
    if e.port.is_none() {
        return Err(format!("`{s}` needs a port: IP:PORT or [V6]:PORT"));
    }
    Ok(e)
}

/// `A-B` or `A` (inclusive), ports.
pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("`{s}` is not a port or a port range A-B (0-65535)");
    let (a, b) = match s.split_once('-') {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (s.trim(), s.trim()),
    };
    let a: u16 = a.parse().map_err(|_| bad())?;
    let b: u16 = b.parse().map_err(|_| bad())?;
    if a > b {
        return Err(format!("port range `{s}` runs backwards"));
    }
    Ok((a, b))
}

/// `IP`, `IP/LEN` or `IP-IP` (inclusive), an address range of one family.
pub fn parse_addr_range(s: &str) -> Result<(IpAddr, IpAddr), String> {
    let bad = || format!("`{s}` is not an address, a prefix IP/LEN, or a range IP-IP");
    if let Some((a, len)) = s.split_once('/') {
        let a: IpAddr = a.parse().map_err(|_| bad())?;
        let len: u32 = len.parse().map_err(|_| bad())?;
        return match a {
            IpAddr::V4(v) if len <= 32 => {
                let host = if len == 32 { 0 } else { u32::MAX >> len };
                let lo = u32::from(v) & !host;
                Ok((IpAddr::V4(lo.into()), IpAddr::V4((lo | host).into())))
            }
            IpAddr::V6(v) if len <= 128 => {
                let host = if len == 128 { 0 } else { u128::MAX >> len };
                let lo = u128::from(v) & !host;
                Ok((IpAddr::V6(lo.into()), IpAddr::V6((lo | host).into())))
            }
            _ => Err(format!(
                "prefix length in `{s}` is too long for the address family"
            )),
        };
    }
    // A range `a-b`: IPv6 addresses contain no '-', so the split is unambiguous.
    if let Some((a, b)) = s.split_once('-') {
        let a: IpAddr = a.trim().parse().map_err(|_| bad())?;
        let b: IpAddr = b.trim().parse().map_err(|_| bad())?;
        if a.is_ipv4() != b.is_ipv4() {
            return Err(format!("`{s}` mixes IPv4 and IPv6"));
        }
        if addr_to_u128(a) > addr_to_u128(b) {
            return Err(format!("address range `{s}` runs backwards"));
        }
        return Ok((a, b));
    }
    let a: IpAddr = s.parse().map_err(|_| bad())?;
    Ok((a, a))
}

/// Destinations as `blast --to` takes them: `IP:PORT`, an address range or prefix in place of
/// the IP (`198.18.0.0/16:9000`, `198.18.0.1-198.18.0.9:9000`, `[2001:2::/64]:9000`) and a
/// port range in place of the port (`198.18.0.2:9000-9099`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestRanges {
    pub addrs: (IpAddr, IpAddr),
    pub ports: (u16, u16),
}

impl DestRanges {
    /// The first destination.
    pub fn first(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.addrs.0, self.ports.0)
    }

    /// More than one destination.
    pub fn is_range(&self) -> bool {
        self.addrs.0 != self.addrs.1 || self.ports.0 != self.ports.1
    }
}

pub fn parse_dest_ranges(s: &str) -> Result<DestRanges, String> {
    let (addrs, ports) = match s.strip_prefix('[') {
        Some(rest) => rest
            .split_once("]:")
            .ok_or_else(|| format!("`{s}` needs a port: [V6]:PORT"))?,
        None => match s.rsplit_once(':') {
            Some((a, _)) if a.contains(':') => {
                return Err(format!(
                    "`{s}`: write IPv6 with a port in brackets, [2001:2::1]:9000"
                ))
            }
            Some(split) => split,
            None => return Err(format!("`{s}` needs a port: IP:PORT")),
        },
    };
    let addrs = parse_addr_range(addrs)?;
    let ports = parse_port_range(ports)?;
    if ports.0 == 0 {
        return Err(format!("`{s}`: destination port 0 is not sent to"));
    }
    Ok(DestRanges { addrs, ports })
}

/// A source range for placement: its bounds, and the addresses inside it never to offer (an
/// IPv4 prefix's network and broadcast addresses; RFC 3021's /31 and a /32 have none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRange {
    pub lo: IpAddr,
    pub hi: IpAddr,
    pub exclude: Vec<IpAddr>,
}

pub fn parse_source_range(s: &str) -> Result<SourceRange, String> {
    let (lo, hi) = parse_addr_range(s)?;
    let prefix_len = s.split_once('/').and_then(|(_, l)| l.parse::<u32>().ok());
    let exclude = match (lo, prefix_len) {
        (IpAddr::V4(_), Some(len)) if len <= 30 => vec![lo, hi],
        _ => Vec::new(),
    };
    Ok(SourceRange { lo, hi, exclude })
}

/// A comma-separated list of u32, e.g. weights `1,1,2` or queues `0,3`. (A newtype: clap
/// would treat a bare `Vec` as a multi-value argument.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct U32List(pub Vec<u32>);

pub fn parse_u32_list(s: &str) -> Result<U32List, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{x}` in `{s}` is not a whole number"))
        })
        .collect::<Result<Vec<u32>, String>>()
        .map(U32List)
}

/// A CPU list such as `0,2-3`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

pub fn parse_cpu_list(s: &str) -> Result<CpuList, String> {
    use flowlane_runtime::cpus::CpuListError;
    // `all`: every CPU this process may use — in a pod, the cpuset the kubelet gave it, whose
    // numbers a manifest cannot know.
    if s.trim() == "all" {
        let v = flowlane_runtime::cpus::CpuSet::current().usable();
        return match v.is_empty() {
            true => Err("no CPU is usable here (online and allowed to this process)".into()),
            false => Ok(CpuList(v)),
        };
    }
    flowlane_runtime::cpus::parse_cpu_list(s)
        .map(CpuList)
        .map_err(|e| match e {
            CpuListError::Malformed(_) => format!("{e}, or `all`"),
            CpuListError::Twice { .. } => e.to_string(),
        })
}

/// The CPUs a role runs on: `requested`, or every usable one (online and allowed to this
/// process) — checked, with a message saying whether a CPU is offline or not allowed.
pub fn usable_cpus(requested: Option<&CpuList>) -> Result<Vec<usize>, Failure> {
    let set = flowlane_runtime::cpus::CpuSet::current();
    let cpus = requested.map_or_else(|| set.usable(), |c| c.0.clone());
    set.check(&cpus)
        .map_err(|e| Failure::usage(anyhow::anyhow!(e)))?;
    Ok(cpus)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SymmetricArg {
    /// Plain Toeplitz.
    Off,
    /// ethtool `symmetric-xor`: hash (src^dst, src^dst, sport^dport, sport^dport).
    Xor,
    /// Sort the endpoints before hashing.
    Sort,
}

impl From<SymmetricArg> for Symmetric {
    fn from(s: SymmetricArg) -> Symmetric {
        match s {
            SymmetricArg::Off => Symmetric::Off,
            SymmetricArg::Xor => Symmetric::Xor,
            SymmetricArg::Sort => Symmetric::Sort,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelArg {
    /// NIC indirection table: queue = reta[hash & (size-1)].
    Reta,
    /// queue = hash % queues.
    Modulo,
    /// Linux RPS: queue = (hash * queues) >> 32.
    Rps,
    /// FreeBSD RSS buckets: bucket = hash & (2^bits - 1); --queues is the CPU count.
    Freebsd,
}

/// `--ring-memory`: what a run's AF_PACKET rings may map (shared by `forward` and `sink`).
#[derive(Debug, Clone, Args)]
pub struct RingMemoryArg {
    /// AF_PACKET: MiB all the run's rings may map, split evenly over them; each ring gets the
    /// most slots that fit (a slot holds one frame of the MTU: lo's 64 KiB MTU costs 40 times
    /// Ethernet's), and the start line says what was mapped. A budget that cannot give each
    /// ring 64 slots is refused with what it would take.
    #[arg(long = "ring-memory", value_name = "MIB", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub ring_memory: u64,
}

impl RingMemoryArg {
    /// The budget in bytes.
    pub fn bytes(&self) -> u64 {
        self.ring_memory << 20
    }
}

/// How a hash becomes a queue (shared by `hash`, `pick`, `rss show`, `blast --per-queue`).
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// RSS key: hex (6d5a56da…), ethtool's colon form (6d:5a:…), or `microsoft` / `symmetric`.
    /// Default: the key in the --reta file when it holds one (`ethtool -x` output), else
    /// Microsoft's. A key that differs from the file's is refused.
    #[arg(long, value_parser = parse_key)]
    pub key: Option<Key>,

    /// Model a NIC's symmetric hashing (both directions of a flow hash the same): `xor` is
    /// ethtool's `symmetric-xor`, `sort` DPDK's sorted Toeplitz. Default: what the --reta file
    /// says (`RSS input transformation`), else off.
    #[arg(long, value_enum)]
    pub symmetric: Option<SymmetricArg>,

    /// Receive queues (for `--model freebsd`: CPUs). Default: this machine's CPU count.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub queues: Option<u32>,

    /// Indirection table from a file: queue numbers separated by white space, or the output
    /// of `ethtool -x DEV` — whose key, hash function and input transformation are used too.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["queues", "weights"])]
    pub reta: Option<PathBuf>,

    /// Indirection table size (power of two). Intel 82599: 128; ice, mlx5: 512 or more.
    #[arg(long, default_value_t = 128)]
    pub reta_size: usize,

    /// Fill the table by weights as `ethtool -X DEV weight W0 W1 …` does, e.g. `1,1,2`.
    #[arg(long, value_parser = parse_u32_list, conflicts_with = "queues")]
    pub weights: Option<U32List>,

    /// Hash → queue model.
    #[arg(long, value_enum, default_value_t = ModelArg::Reta)]
    pub model: ModelArg,

    /// With `--model freebsd`: bits of the hash that pick the bucket (the tunable
    /// `net.inet.rss.bits`; the FreeBSD RSS experiment set 3 for 8 buckets). Default: FreeBSD's, at least two
    /// buckets per CPU.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=7))]
    pub bits: Option<u32>,
}

/// The interface's RSS and queues for `--dev` (`None` without it); an interface that is not
/// there is a usage error.
pub fn read_nic(dev: Option<&str>) -> Result<Option<flowlane_tools::nic::NicReport>, Failure> {
    dev.map(flowlane_tools::nic::read)
        .transpose()
        .map_err(Failure::from_tool)
}

/// Where a command's `--per-queue` places flows: the receiver's RSS read from an interface or
/// described by the model flags (shared by `blast`, `http load` and `rfc2544`; each command
/// keeps its own `--per-queue`, which these flags require).
#[derive(Debug, Clone, Args)]
pub struct PlaceArgs {
    /// With --per-queue: place by the RSS of this interface, the receiver's (read here as
    /// `rss show --dev` reads it: key, function, input transform, table, and — where it hashes
    /// the flows on the addresses only — by source address). For a receiver on another host,
    /// give its table with --reta <(ssh HOST ethtool -x IF).
    #[arg(long, value_name = "IF", requires = "per_queue")]
    pub rss_dev: Option<String>,

    /// With --per-queue: the receiver hashes addresses only (the 2-tuple, as FreeBSD hashes
    /// UDP and NICs hash fragments), so each flow gets a source address of its own, which the
    /// sender must own (blast: from --from; http load: from --source); the ports do not matter.
    #[arg(long, requires = "per_queue")]
    pub two_tuple: bool,

    /// With --per-queue: place only on these queues (e.g. `0-1`), not on all of them.
    #[arg(long, value_parser = parse_cpu_list, requires = "per_queue")]
    pub pick_queues: Option<CpuList>,

    #[command(flatten)]
    pub model: ModelArgs,
}

impl PlaceArgs {
    /// The placement `--per-queue K` asks for (`None` without it, where model flags are
    /// refused rather than ignored), for flows of `flow_type`.
    pub fn placement(
        &self,
        per_queue: Option<u64>,
        flow_type: &str,
    ) -> Result<Option<flowlane_tools::blast::Placement>, Failure> {
        self.model.only_with(per_queue.is_some(), "--per-queue")?;
        per_queue
            .map(|k| {
                placement(
                    k,
                    self.rss_dev.as_deref(),
                    self.two_tuple,
                    self.pick_queues.as_ref(),
                    &self.model,
                    flow_type,
                )
            })
            .transpose()
    }

    /// The first of these flags given (for a command path that places by its own model).
    pub fn given(&self) -> Option<&'static str> {
        if self.rss_dev.is_some() {
            Some("--rss-dev")
        } else if self.two_tuple {
            Some("--two-tuple")
        } else {
            self.model.given()
        }
    }
}

/// RSS placement from the command line: the model from `--dev`'s interface or the model
/// flags; hashed on the addresses only where `--two-tuple` says so or the interface says it
/// hashes `flow_type` (ethtool's `udp4`, `tcp4`, …) that way.
fn placement(
    per_queue: u64,
    dev: Option<&str>,
    two_tuple: bool,
    pick_queues: Option<&CpuList>,
    model: &ModelArgs,
    flow_type: &str,
) -> Result<flowlane_tools::blast::Placement, Failure> {
    let nic = read_nic(dev)?;
    let m = model.build_for(nic.as_ref())?;
    let nic_two_tuple = nic.as_ref().and_then(|n| n.two_tuple(flow_type)) == Some(true);
    Ok(flowlane_tools::blast::Placement {
        per_queue,
        queues: pick_queues
            .map(|q| q.0.iter().map(|&x| x as u32).collect())
            .unwrap_or_default(),
        key: m.key.to_hex(),
        symmetric: m.symmetric,
        model: flowlane_tools::blast::ModelSpec::of(&m.queue),
        hash_ports: !(two_tuple || nic_two_tuple),
    })
}

/// CPUs this process may use (online and allowed), for defaults such as the queue count.
pub fn cpu_count() -> u32 {
    flowlane_runtime::cpus::CpuSet::current()
        .usable()
        .len()
        .max(1) as u32
}

/// Where a model's key came from: said by every command that takes `--reta`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// Microsoft's key, for want of another.
    Default,
    /// `--key`.
    Flag,
    /// The `ethtool -x` text given with `--reta`.
    RetaFile(PathBuf),
    /// Read from the interface (`--dev`), by netlink or ioctl.
    Nic { dev: String, via: String },
}

impl KeySource {
    /// Words for the output: `the key in FILE (ethtool -x)`.
    pub fn describe(&self) -> String {
        match self {
            KeySource::Default => "Microsoft's default key".into(),
            KeySource::Flag => "--key".into(),
            KeySource::RetaFile(p) => format!("the key in {} (ethtool -x)", p.display()),
            KeySource::Nic { dev, via } => format!("{dev}'s own key (read by {via})"),
        }
    }
}

/// A queue model with the key and the symmetric transformation it hashes with.
#[derive(Debug, Clone)]
pub struct Model {
    pub queue: QueueModel,
    pub key: Key,
    pub key_source: KeySource,
    pub symmetric: Symmetric,
}

impl ModelArgs {
    /// The first model flag given (for commands that use the model only with placement).
    pub fn given(&self) -> Option<&'static str> {
        [
            (self.key.is_some(), "--key"),
            (self.symmetric.is_some(), "--symmetric"),
            (self.queues.is_some(), "--queues"),
            (self.reta.is_some(), "--reta"),
            (self.reta_size != 128, "--reta-size"),
            (self.weights.is_some(), "--weights"),
            (self.model != ModelArg::Reta, "--model"),
            (self.bits.is_some(), "--bits"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// Refuses model flags where nothing is placed: they would be silently ignored.
    pub fn only_with(&self, placing: bool, what: &str) -> Result<(), Failure> {
        match self.given() {
            Some(flag) if !placing => Err(Failure::usage(anyhow::anyhow!(
                "{flag} describes the receiver's RSS for placement: use it with {what}"
            ))),
            _ => Ok(()),
        }
    }

    pub fn queue_count(&self) -> u32 {
        self.queues.unwrap_or_else(cpu_count)
    }

    /// Builds the model; errors are usage errors (exit 2).
    pub fn build(&self) -> Result<Model, Failure> {
        self.build_for(None)
    }

    /// Builds the model, from interface `nic`'s own RSS when one is given (`--dev`): its key,
    /// hash function, input transform and table, as an `ethtool -x` text of it would give.
    /// An interface without RSS flowlane can model is a usage error that says why.
    pub fn build_for(
        &self,
        nic: Option<&flowlane_tools::nic::NicReport>,
    ) -> Result<Model, Failure> {
        let reta_only = self.reta.is_some() || self.weights.is_some();
        if nic.is_some() && (reta_only || self.queues.is_some() || self.model != ModelArg::Reta) {
            return Err(Failure::usage(anyhow::anyhow!(
                "--dev reads the interface's own indirection table: leave out --reta, \
                 --weights, --queues and --model"
            )));
        }
        if reta_only && self.model != ModelArg::Reta {
            return Err(Failure::usage(anyhow::anyhow!(
                "--reta and --weights describe an indirection table; use them with --model reta"
            )));
        }
        if self.bits.is_some() && self.model != ModelArg::Freebsd {
            return Err(Failure::usage(anyhow::anyhow!(
                "--bits sets FreeBSD's bucket count; use it with --model freebsd"
            )));
        }
        let n = self.queue_count();
        let mut key = (self.key, KeySource::Flag);
        let mut symmetric = self.symmetric.map(Symmetric::from);
        let queue = match self.model {
            ModelArg::Reta => {
                let read = match (nic, &self.reta) {
                    (Some(r), _) => {
                        let dump = r.model().map_err(|e| Failure::usage(anyhow::anyhow!(e)))?;
                        let via = r.rss.via.clone().unwrap_or_default();
                        Some((
                            dump,
                            r.dev.clone(),
                            KeySource::Nic {
                                dev: r.dev.clone(),
                                via,
                            },
                        ))
                    }
                    (None, Some(path)) => {
                        let text = flowlane_tools::input::read_text(
                            "--reta",
                            path,
                            flowlane_tools::input::RETA,
                            None,
                        )
                        .map_err(Failure::from_tool)?;
                        let dump = flowlane_rss::ethtool::EthtoolRss::parse(&text)
                            .with_context(|| format!("in RETA file {}", path.display()))
                            .map_err(Failure::usage)?;
                        let name = format!("RETA file {}", path.display());
                        Some((dump, name, KeySource::RetaFile(path.clone())))
                    }
                    (None, None) => None,
                };
                let reta = if let Some((dump, name, source)) = read {
                    if let Some(why) = dump.unmodelled() {
                        return Err(Failure::usage(anyhow::anyhow!("{name}: {why}")));
                    }
                    if let Some(k) = dump.key {
                        match &key.0 {
                            Some(given) if *given != k => {
                                return Err(Failure::usage(anyhow::anyhow!(
                                    "--key {} differs from the key of {name} ({}); the \
                                     NIC hashes with its own: leave --key out",
                                    given.to_colon_hex(),
                                    k.to_colon_hex()
                                )))
                            }
                            Some(_) => {}
                            None => key = (Some(k), source),
                        }
                    }
                    if let Some(file_sym) = dump.symmetric {
                        match symmetric {
                            Some(given) if given != file_sym => {
                                return Err(Failure::usage(anyhow::anyhow!(
                                    "--symmetric {} differs from {name}, whose input \
                                     transformation is {}: leave --symmetric out",
                                    given.name(),
                                    file_sym.name()
                                )))
                            }
                            _ => symmetric = Some(file_sym),
                        }
                    }
                    dump.reta
                } else if let Some(w) = &self.weights {
                    Reta::weighted(self.reta_size, &w.0).map_err(Failure::usage)?
                } else {
                    Reta::round_robin(self.reta_size, n as usize).map_err(Failure::usage)?
                };
                QueueModel::Reta(reta)
            }
            ModelArg::Modulo => QueueModel::Modulo(n),
            ModelArg::Rps => QueueModel::Rps(n),
            ModelArg::Freebsd => QueueModel::FreeBsd(match self.bits {
                Some(b) => FreeBsdBuckets::with_bits(b, n).ok_or_else(|| {
                    Failure::usage(anyhow::anyhow!("--bits {b}: FreeBSD takes 0 to 7"))
                })?,
                None => FreeBsdBuckets::new(n),
            }),
        };
        let (key, key_source) = match key {
            (Some(k), src) => (k, src),
            (None, _) => (Key::MICROSOFT, KeySource::Default),
        };
        Ok(Model {
            queue,
            key,
            key_source,
            symmetric: symmetric.unwrap_or(Symmetric::Off),
        })
    }
}

/// Lower-case 8-digit hex of a hash.
pub fn hex32(h: u32) -> String {
    format!("{h:08x}")
}

/// Writes JSON to stdout followed by a newline.
/// One line saying which frame backend carried a run and what else the interface offers.
pub fn backend_line(b: &flowlane_tools::backend::BackendReport) -> String {
    use flowlane_tools::backend::Backend;
    let name = match b.backend {
        Backend::AfPacket => "AF_PACKET ring".to_string(),
        Backend::AfXdp => format!("AF_XDP ({})", b.af_xdp_bind.as_deref().unwrap_or("copy")),
        Backend::LiveFrames => "live XDP frames (BPF_PROG_TEST_RUN)".to_string(),
        Backend::XdpNative => "native XDP (a generated program, no user space)".to_string(),
    };
    let queues = match (b.rx_queues, b.tx_queues) {
        (Some(r), Some(t)) => format!("{r} rx / {t} tx queues"),
        _ => "queues unknown".into(),
    };
    let xdp = match &b.xdp_features {
        Some(f) if f.is_empty() => "no native XDP".to_string(),
        Some(f) => format!("XDP {}", f.join(",")),
        None => "XDP features not reported by this kernel".into(),
    };
    let mut line = format!("backend: {name} on {}; {queues}; {xdp}", b.dev);
    if !b.unavailable.is_empty() {
        line.push_str(&format!("; not available: {}", b.unavailable.join("; ")));
    }
    line
}

pub fn print_json(v: &impl serde::Serialize) -> Result<(), Failure> {
    let s = serde_json::to_string_pretty(v).map_err(Failure::runtime)?;
    outln!("{s}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("198.18.0.1:80"),
            Ok(Endpoint {
                addr: "198.18.0.1".parse().expect("ip"),
                port: Some(80)
            })
        );
        assert_eq!(parse_endpoint("2001:2::1").map(|e| e.port), Ok(None));
        assert_eq!(
            parse_endpoint("[2001:2::1]:53").map(|e| e.port),
            Ok(Some(53))
        );
        assert!(parse_endpoint("198.18.0.1:99999").is_err());
        assert!(parse_endpoint_with_port("198.18.0.1").is_err());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0,2-3"), Ok(CpuList(vec![0, 2, 3])));
        assert_eq!(parse_cpu_list("1"), Ok(CpuList(vec![1])));
        // A list that is no list is told `all` exists too; a CPU twice is told just that.
        assert_eq!(
            parse_cpu_list("3-1"),
            Err("`3-1` is not a CPU list like `0,2-3`, or `all`".into())
        );
        assert_eq!(
            parse_cpu_list("0,0"),
            Err("CPU 0 appears twice in `0,0`".into())
        );
        assert!(parse_cpu_list("x").is_err());
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_port_range("1024-2047"), Ok((1024, 2047)));
        assert_eq!(parse_port_range("80"), Ok((80, 80)));
        assert!(parse_port_range("2-1").is_err());
        assert!(parse_port_range("1-70000").is_err());
        let d = parse_dest_ranges("198.18.0.77/24:9000-9003").expect("ranges");
        assert_eq!(d.first().to_string(), "198.18.0.0:9000");
        assert_eq!(d.addrs.1.to_string(), "198.18.0.255");
        assert_eq!(d.ports, (9000, 9003));
        let d = parse_dest_ranges("[2001:2::1-2001:2::9]:53").expect("v6");
        assert_eq!(
            (d.addrs.1.to_string(), d.ports),
            ("2001:2::9".into(), (53, 53))
        );
        assert!(!parse_dest_ranges("198.18.0.2:9000")
            .expect("one")
            .is_range());
        for bad in [
            "198.18.0.2",
            "2001:2::1:9000",
            "[2001:2::1]",
            "198.18.0.2:0",
            "a:1",
        ] {
            assert!(parse_dest_ranges(bad).is_err(), "{bad}");
        }
        let (a, b) = parse_addr_range("198.18.0.77/24").expect("prefix");
        assert_eq!(
            (a.to_string(), b.to_string()),
            ("198.18.0.0".into(), "198.18.0.255".into())
        );
        let (a, b) = parse_addr_range("2001:2::/120").expect("prefix");
        assert_eq!(
            (a.to_string(), b.to_string()),
            ("2001:2::".into(), "2001:2::ff".into())
        );
        assert!(parse_addr_range("198.18.0.0/33").is_err());
        assert!(parse_addr_range("198.18.0.9-198.18.0.1").is_err());
        assert!(parse_addr_range("198.18.0.1-2001:2::1").is_err());
        let (a, b) = parse_addr_range("0.0.0.0/0").expect("all");
        assert_eq!(b.to_string(), "255.255.255.255");
        assert_eq!(a.to_string(), "0.0.0.0");
    }
}

pub use flowlane_tools::blast::Rate;

/// Frame sizes from the command line: one, or a comma list to sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeList(pub Vec<usize>);

/// `60` or `64,128,256,512,1024,1514`.
pub fn parse_size_list(s: &str) -> Result<SizeList, String> {
    let v: Result<Vec<usize>, _> = s.split(',').map(|x| x.trim().parse::<usize>()).collect();
    match v {
        Ok(v) if !v.is_empty() && v.len() <= 64 => Ok(SizeList(v)),
        _ => Err(format!(
            "`{s}` is not a frame size or a comma list of them (at most 64), e.g. 60 or 64,512,1514"
        )),
    }
}

/// An IMIX: frame sizes (FCS included, as IMIX definitions give them) with weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imix(pub Vec<(usize, u32)>);

/// `64:7,594:4,1518:1` (size:weight, weights 1-1000, at most 1024 frames per cycle).
pub fn parse_imix(s: &str) -> Result<Imix, String> {
    let bad = || {
        format!(
            "`{s}` is not an IMIX: SIZE:WEIGHT pairs, e.g. 64:7,594:4,1518:1 (sizes with FCS, \
             weights 1-1000)"
        )
    };
    let mut v = Vec::new();
    for part in s.split(',') {
        let (size, w) = part.trim().split_once(':').ok_or_else(bad)?;
        let size: usize = size.parse().map_err(|_| bad())?;
        let w: u32 = w.parse().map_err(|_| bad())?;
        if !(1..=1000).contains(&w) || size < 5 {
            return Err(bad());
        }
        v.push((size, w));
    }
    let cycle: u32 = v.iter().map(|p| p.1).sum();
    if v.is_empty() || cycle > 1024 {
        return Err(bad());
    }
    Ok(Imix(v))
}

/// Largest bare number (no unit) taken as a packet rate: above it, `20000000` could as well
/// be meant as 20 Mbit/s, so the unit must be written.
const BARE_RATE_MAX: f64 = 10e6;

/// `50000`, `50k`, `1.5M`, `2Mpps` (packets per second) or `100Mbit`, `10Gbps`, `2.5gbit`
/// (line rate). A bare number above 10 M is refused with both ways to say it.
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let bad = || {
        format!(
            "`{s}` is not a rate: packets per second (50000, 50k, 1.5M, 2Mpps) or a line rate \
             (100Mbit, 10Gbit, 10Gbps)"
        )
    };
    let t = s.trim().to_ascii_lowercase();
    let (num, bits, unit) = if let Some(n) = t.strip_suffix("bit").or_else(|| t.strip_suffix("bps"))
    {
        (n, true, true)
    } else if let Some(n) = t.strip_suffix("pps") {
        (n, false, true)
    } else {
        (t.as_str(), false, false)
    };
    let (num, mult, prefixed) = match num.chars().last() {
        Some('k') => (&num[..num.len() - 1], 1e3, true),
        Some('m') => (&num[..num.len() - 1], 1e6, true),
        Some('g') => (&num[..num.len() - 1], 1e9, true),
        _ => (num, 1.0, false),
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let v = v * mult;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("rate `{s}` must be positive"));
    }
    if !unit && !prefixed && v > BARE_RATE_MAX {
        let m = v / 1e6;
        return Err(format!(
            "`{s}` could be packets or bits per second: write {m}M (or {m}Mpps) for packets, \
             {m}Mbit for bits"
        ));
    }
    Ok(if bits { Rate::Bps(v) } else { Rate::Pps(v) })
}

/// A duration in seconds: `10` or `10s`, `500ms`, `250us`, `1m`, `1h` (decimals allowed).
pub fn parse_duration(s: &str) -> Result<f64, String> {
    let bad = || format!("`{s}` is not a duration: 10 (seconds), 10s, 500ms, 1m, 1.5h");
    let t = s.trim().to_ascii_lowercase();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (t.as_str(), 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    Ok(v * scale)
}

/// A byte count: `4096`, `4k` / `4KiB` (×1024), `1m` / `1MiB` (×1 048 576).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let bad = || format!("`{s}` is not a byte count: 4096, 4k, 4KiB, 1m");
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("ib").unwrap_or(&t);
    let t = t.strip_suffix('b').unwrap_or(t);
    let (num, scale) = if let Some(n) = t.strip_suffix('k') {
        (n, 1usize << 10)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 1 << 20)
    } else {
        (t, 1)
    };
    let v: usize = num.trim().parse().map_err(|_| bad())?;
    v.checked_mul(scale).ok_or_else(bad)
}

#[cfg(test)]
mod rate_tests {
    use super::*;

    #[test]
    fn rates_parse_and_convert_with_line_rate_math() {
        assert_eq!(parse_rate("50000"), Ok(Rate::Pps(50_000.0)));
        assert_eq!(parse_rate("1.5M"), Ok(Rate::Pps(1_500_000.0)));
        assert_eq!(parse_rate("10Gbit"), Ok(Rate::Bps(1e10)));
        // 10G at 64-byte frames (60 + FCS) is 14.88 Mpps; at 1518 (1514 + FCS) 0.8127 Mpps.
        let r = parse_rate("10gbit").expect("rate");
        assert!((r.pps(60.0) - 14_880_952.4).abs() < 1.0);
        assert!((r.pps(1514.0) - 812_743.8).abs() < 1.0);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-5").is_err());
        assert!(parse_rate("0").is_err());
    }

    #[test]
    fn the_units_the_field_writes() {
        for (text, rate) in [
            ("50k", Rate::Pps(50e3)),
            ("50kpps", Rate::Pps(50e3)),
            ("2Mpps", Rate::Pps(2e6)),
            ("10000000", Rate::Pps(10e6)),
            ("100Mbit", Rate::Bps(100e6)),
            ("10Gbps", Rate::Bps(10e9)),
            ("1.5gbit", Rate::Bps(1.5e9)),
        ] {
            assert_eq!(parse_rate(text), Ok(rate), "{text}");
            // What bench hands blast reads back as the same rate.
            assert_eq!(parse_rate(&rate.to_string()), Ok(rate), "{rate}");
        }
        let e = parse_rate("20000000").expect_err("ambiguous");
        assert!(e.contains("20M") && e.contains("20Mbit"), "{e}");
        assert_eq!(parse_rate("20M"), Ok(Rate::Pps(20e6)));
        assert_eq!(parse_rate("20000000pps"), Ok(Rate::Pps(20e6)));
    }

    #[test]
    fn durations() {
        for (text, secs) in [
            ("10", 10.0),
            ("10s", 10.0),
            ("500ms", 0.5),
            ("1m", 60.0),
            ("1.5h", 5400.0),
            ("250us", 0.00025),
            ("0.5", 0.5),
        ] {
            assert_eq!(parse_duration(text), Ok(secs), "{text}");
        }
        for bad in ["", "ten", "-1", "5x", "1e400"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn byte_counts() {
        for (text, n) in [
            ("4096", 4096),
            ("4k", 4096),
            ("4KiB", 4096),
            ("16kb", 16384),
            ("1m", 1 << 20),
            ("0", 0),
        ] {
            assert_eq!(parse_bytes(text), Ok(n), "{text}");
        }
        for bad in ["", "k", "-4k", "4.5k", "4x", "99999999999999999999m"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_and_imix() {
        assert_eq!(parse_size_list("60"), Ok(SizeList(vec![60])));
        assert_eq!(
            parse_size_list("64, 512,1514"),
            Ok(SizeList(vec![64, 512, 1514]))
        );
        assert!(parse_size_list("").is_err() && parse_size_list("6x").is_err());
        let m = parse_imix("64:7,594:4,1518:1").expect("imix");
        let seq = flowlane_tools::blast::imix_sequence(&m.0);
        assert_eq!(seq.len(), 12);
        for (size, n) in [(60, 7), (590, 4), (1514, 1)] {
            assert_eq!(seq.iter().filter(|&&s| s == size).count(), n, "{seq:?}");
        }
        // Interleaved: never more than two small frames in a row.
        assert!(
            seq.windows(3).all(|w| w.iter().any(|&s| s != 60)),
            "{seq:?}"
        );
        for bad in ["64", "64:0", "64:7,x:1", "64:2000", "2:1"] {
            assert!(parse_imix(bad).is_err(), "{bad}");
        }
    }
}
