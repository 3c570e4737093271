//! # flowlane-lab — namespaces, links and kernel counters
//!
//! Layer: orchestration. Namespaces and links are made with iproute2 (`ip`), the tool every
//! reader of a test already knows — and the only program the lab runs: offloads, sysfs files
//! and the XDP program are set from a thread inside the namespace through `flowlane_io`. A
//! thread enters a namespace through
//! [`flowlane_io::os::enter_netns`]. Kernel counters are read from `/proc/thread-self/net/…`,
//! which shows the *calling thread's* namespace (`/proc/net` would show the process's).
//!
//! Every [`Netns`] has a unique name and is deleted when dropped, also when a test fails.

#![forbid(unsafe_code)]

pub mod counters;
pub mod nic;
pub mod setup;

use std::fmt;
use std::fs::File;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub use counters::{DevCounters, Snmp};
pub use flowlane_io::netdev::Offload;

use flowlane_io::netdev;

/// A failed lab operation: what was tried and what the system said.
#[derive(Debug)]
pub struct LabError {
    /// What was being done, e.g. `ip netns add fl-1234-0`.
    pub what: String,
    /// The error output or reason.
    pub detail: String,
}

impl fmt::Display for LabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.what, self.detail.trim())
    }
}

impl std::error::Error for LabError {}

/// The Debian package that ships `program`, for a hint when it is missing.
pub fn package_of(program: &str) -> &str {
    match program.rsplit('/').next().unwrap_or(program) {
        "ip" | "tc" | "ss" | "bridge" => "iproute2",
        "nft" => "nftables",
        "chromium" => "chromium",
        "tshark" => "tshark",
        "ethtool" => "ethtool",
        "curl" => "curl",
        "nginx" => "nginx-light",
        "cyclictest" => "rt-tests",
        other => other,
    }
}

/// The one-line hint for a program that is not installed.
pub fn missing_hint(program: &str) -> String {
    format!(
        "`{program}` is not installed (Debian: apt-get install {})",
        package_of(program)
    )
}

/// Whether `program` can be run (found on `PATH`, or a path that exists).
pub fn have_program(program: &str) -> bool {
    if program.contains('/') {
        return std::path::Path::new(program).exists();
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

/// Runs a command; its stdout on success, else a [`LabError`] naming it (and, for a program
/// that is not installed, the package that ships it).
pub fn run(cmd: &mut Command) -> Result<String, LabError> {
    let what = format!("{cmd:?}").replace('"', "");
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out: Output = cmd.output().map_err(|e| LabError {
        what: what.clone(),
        detail: if e.kind() == std::io::ErrorKind::NotFound {
            missing_hint(&program)
        } else {
            e.to_string()
        },
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError {
            what,
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// `ip ARGS…`.
pub fn ip(args: &[&str]) -> Result<String, LabError> {
    run(Command::new("ip").args(args))
}

/// Whether this process may create namespaces (root, or CAP_SYS_ADMIN and CAP_NET_ADMIN).
pub fn can_create_namespaces() -> bool {
    // Effective capabilities from /proc: CAP_NET_ADMIN = 12, CAP_SYS_ADMIN = 21.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 12) != 0 && caps & (1 << 21) != 0)
}

/// A network namespace made for one run, deleted on drop (unless kept, or not made here).
#[derive(Debug)]
pub struct Netns {
    name: String,
    owned: bool,
}

static SERIAL: AtomicU32 = AtomicU32::new(0);

impl Netns {
    /// Creates `PREFIX-PID-N` (unique within and across processes) with loopback up.
    pub fn create(prefix: &str) -> Result<Netns, LabError> {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::Relaxed)
        );
        Netns::persistent(&name)
    }

    /// Creates namespace `name` exactly, with loopback up; deleted on drop unless
    /// [`Netns::keep`] is called.
    pub fn persistent(name: &str) -> Result<Netns, LabError> {
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
            owned: true,
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A handle on an existing namespace; dropping it deletes nothing.
    pub fn existing(name: &str) -> Netns {
        Netns {
            name: name.to_string(),
            owned: false,
        }
    }

    /// Leaves the namespace in place when this handle is dropped.
    pub fn keep(mut self) {
        self.owned = false;
    }

    /// `ip neigh replace PEER lladdr MAC dev IF nud permanent`: no ARP or ND on the link.
    pub fn permanent_neighbour(&self, ifname: &str, peer: &str, mac: &str) -> Result<(), LabError> {
        self.ip(&[
            "neigh",
            "replace",
            peer,
            "lladdr",
            mac,
            "dev",
            ifname,
            "nud",
            "permanent",
        ])
        .map(drop)
    }

    /// Writes `value` to a per-namespace `/proc/sys` file from inside the namespace.
    pub fn write_file(&self, path: &str, value: &str) -> Result<(), LabError> {
        self.run(|| std::fs::write(path, value))?
            .map_err(|e| LabError {
                what: format!("write {value} to {path} in {}", self.name),
                detail: e.to_string(),
            })
    }

    /// Writes `value` to a sysfs file as the namespace sees it: from a thread inside the
    /// namespace with its own sysfs mounted (what `ip netns exec` does for its programs; a
    /// thread that only entered the namespace still sees the process's /sys).
    pub fn write_sys(&self, path: &str, value: &str) -> Result<(), LabError> {
        self.run_with_sys(|| std::fs::write(path, value))?
            .map_err(|e| LabError {
                what: format!("write {value} to {path} in {}", self.name),
                detail: e.to_string(),
            })
    }

    /// Reads a sysfs file as the namespace sees it (see [`Netns::write_sys`]).
    pub fn read_sys(&self, path: &str) -> Result<String, LabError> {
        self.run_with_sys(|| std::fs::read_to_string(path))?
            .map_err(|e| LabError {
                what: format!("read {path} in {}", self.name),
                detail: e.to_string(),
            })
    }

    /// The names in a sysfs directory as the namespace sees it, sorted.
    pub fn list_sys(&self, dir: &str) -> Result<Vec<String>, LabError> {
        self.run_with_sys(|| -> std::io::Result<Vec<String>> {
            let mut v = std::fs::read_dir(dir)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect::<std::io::Result<Vec<_>>>()?;
            v.sort();
            Ok(v)
        })?
        .map_err(|e| LabError {
            what: format!("list {dir} in {}", self.name),
            detail: e.to_string(),
        })
    }

    /// Turns an offload on or off on an interface of the namespace (`ethtool -K`, done with
    /// the `SIOCETHTOOL` ioctl: no ethtool program needed).
    pub fn set_offload(&self, ifname: &str, offload: Offload, on: bool) -> Result<(), LabError> {
        self.run(|| netdev::set_offload(ifname, offload, on))?
            .map_err(|e| LabError {
                what: format!(
                    "turn {offload:?} {} on {ifname} in {}",
                    if on { "on" } else { "off" },
                    self.name
                ),
                detail: e.to_string(),
            })
    }

    /// Whether an offload is on on an interface of the namespace.
    pub fn offload(&self, ifname: &str, offload: Offload) -> Result<bool, LabError> {
        self.run(|| netdev::offload(ifname, offload))?
            .map_err(|e| LabError {
                what: format!("read {offload:?} of {ifname} in {}", self.name),
                detail: e.to_string(),
            })
    }

    /// Drops every IPv4 packet in an nftables prerouting hook (table `fl`), after the
    /// interface and any packet tap counted it: the cheapest receiver a benchmark can have
    /// that still runs the kernel's receive path. Needs `nft` (Debian: nftables).
    pub fn nft_drop_prerouting(&self) -> Result<(), LabError> {
        for args in [
            &["add", "table", "ip", "fl"][..],
            &[
                "add",
                "chain",
                "ip",
                "fl",
                "pre",
                "{ type filter hook prerouting priority -300; policy drop; }",
            ],
        ] {
            run(self.command("nft").args(args))?;
        }
        Ok(())
    }

    /// The namespace's name (as `ip netns` lists it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME ARGS…`.
    pub fn ip(&self, args: &[&str]) -> Result<String, LabError> {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// A command that runs `program` inside the namespace (`ip netns exec`).
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs `f` on a thread that has entered the namespace: sockets it opens and counters it
    /// reads are the namespace's.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, LabError> {
        self.run_inside(false, f)
    }

    /// [`Netns::run`] with the namespace's own sysfs on `/sys` for `f` (a private mount
    /// namespace of that thread alone, gone when it ends).
    pub fn run_with_sys<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, LabError> {
        self.run_inside(true, f)
    }

    fn run_inside<T: Send>(&self, sys: bool, f: impl FnOnce() -> T + Send) -> Result<T, LabError> {
        let path = format!("/run/netns/{}", self.name);
        let file = File::open(&path).map_err(|e| LabError {
            what: format!("open {path}"),
            detail: e.to_string(),
        })?;
        std::thread::scope(|s| {
            s.spawn(|| {
                flowlane_io::os::enter_netns(&file).map_err(|e| LabError {
                    what: format!("enter namespace {}", self.name),
                    detail: e.to_string(),
                })?;
                if sys {
                    flowlane_io::os::private_sysfs().map_err(|e| LabError {
                        what: format!("mount the sysfs of namespace {}", self.name),
                        detail: e.to_string(),
                    })?;
                }
                Ok(f())
            })
            .join()
            .unwrap_or_else(|_| {
                Err(LabError {
                    what: format!("thread in namespace {}", self.name),
                    detail: "panicked".into(),
                })
            })
        })
    }

    /// `/proc/net/snmp` of the namespace.
    pub fn snmp(&self) -> Result<Snmp, LabError> {
        self.run(|| counters::read_proc("snmp").and_then(|t| Snmp::parse(&t)))?
    }

    /// `/proc/net/snmp6` of the namespace.
    pub fn snmp6(&self) -> Result<counters::Snmp6, LabError> {
        self.run(|| counters::read_proc("snmp6").and_then(|t| counters::Snmp6::parse(&t)))?
    }

    /// `/proc/net/dev` of the namespace.
    pub fn dev(&self) -> Result<DevCounters, LabError> {
        self.run(|| counters::read_proc("dev").and_then(|t| DevCounters::parse(&t)))?
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // Deleting the name drops the namespace once nothing runs in it; its links go with it.
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            // Not `eprintln!`: a failed write to stderr must not panic in a drop.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "flowlane-lab: cleanup: {e}");
        }
    }
}

/// Two namespaces joined by a veth pair, quiet enough that interface counters are exact: IPv6
/// off on the link (no router solicitations, no duplicate-address probes) and permanent
/// neighbour entries (no ARP). The generator end is `198.18.0.1/24`, the DUT end `198.18.0.2/24`.
#[derive(Debug)]
pub struct Pair {
    /// The generator's namespace.
    pub gen: Netns,
    /// The device-under-test's namespace.
    pub dut: Netns,
    /// Interface name in `gen`.
    pub gen_if: String,
    /// Interface name in `dut`.
    pub dut_if: String,
}

/// The generator end's address.
pub const GEN_ADDR: &str = "198.18.0.1";
/// The DUT end's address.
pub const DUT_ADDR: &str = "198.18.0.2";
const GEN_MAC: &str = "02:f1:0e:00:00:01";
const DUT_MAC: &str = "02:f1:0e:00:00:02";

impl Pair {
    /// Creates the pair with `queues` RX/TX queues per end.
    pub fn create(prefix: &str, queues: u32) -> Result<Pair, LabError> {
        let gen = Netns::create(&format!("{prefix}-gen"))?;
        let dut = Netns::create(&format!("{prefix}-dut"))?;
        let tag = SERIAL.fetch_add(1, Ordering::Relaxed) % 1000;
        let pid = std::process::id() % 100_000;
        let (gen_if, dut_if) = (format!("flg{pid}x{tag}"), format!("fld{pid}x{tag}"));
        add_veth(
            (&gen, &gen_if, Some(GEN_MAC)),
            (&dut, &dut_if, Some(DUT_MAC)),
            queues,
        )?;
        for (ns, ifname, addr, peer, peer_mac) in [
            (&gen, &gen_if, GEN_ADDR, DUT_ADDR, DUT_MAC),
            (&dut, &dut_if, DUT_ADDR, GEN_ADDR, GEN_MAC),
        ] {
            ns.write_file(
                &format!("/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6"),
                "1",
            )?;
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", ifname])?;
            ns.permanent_neighbour(ifname, peer, peer_mac)?;
            ns.ip(&["link", "set", ifname, "up"])?;
        }
        Ok(Pair {
            gen,
            dut,
            gen_if,
            dut_if,
        })
    }
}

/// Creates a veth pair between two namespaces, `queues` RX and TX queues on each end, addresses
/// `a_addr`/`b_addr` (CIDR form, from the benchmarking ranges), both ends up.
pub fn veth_pair(
    a: &Netns,
    a_if: &str,
    a_addr: &str,
    b: &Netns,
    b_if: &str,
    b_addr: &str,
    queues: u32,
) -> Result<(), LabError> {
    add_veth((a, a_if, None), (b, b_if, None), queues)?;
    for (ns, ifname, addr) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
        ns.ip(&["addr", "add", addr, "dev", ifname])?;
        ns.ip(&["link", "set", ifname, "up"])?;
    }
    Ok(())
}

/// `ip link add`: a veth pair with one end in each namespace, `queues` RX and TX queues per end
/// and, where given, fixed MAC addresses (`(namespace, interface, MAC)` per end).
pub(crate) fn add_veth(
    a: (&Netns, &str, Option<&str>),
    b: (&Netns, &str, Option<&str>),
    queues: u32,
) -> Result<(), LabError> {
    let q = queues.max(1).to_string();
    let end = |(ns, ifname, mac): (&Netns, &str, Option<&str>)| {
        let mut v = vec![ifname.to_string()];
        if let Some(m) = mac {
            v.extend(["address".into(), m.to_string()]);
        }
        v.extend([
            "numtxqueues".into(),
            q.clone(),
            "numrxqueues".into(),
            q.clone(),
            "netns".into(),
            ns.name().to_string(),
        ]);
        v
    };
    let mut args = vec!["link".to_string(), "add".into()];
    args.extend(end(a));
    args.extend(["type".into(), "veth".into(), "peer".into(), "name".into()]);
    args.extend(end(b));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ip(&args).map(drop)
}
