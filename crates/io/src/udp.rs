//! UDP reuseport groups with per-CPU steering.

use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};

use crate::sys::{self, BpfInsn, SysError};

/// How datagrams are spread over the group's sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Steering {
    /// A classic BPF program returns the index of the worker on the receiving CPU.
    CpuBpf,
    /// A classic BPF program returns the worker of the datagram's Toeplitz bucket
    /// ([`hash_steering_program`]), wherever the kernel processed it.
    HashBpf,
    /// The kernel's reuseport hash of the 4-tuple (steering off, or the program was refused).
    ReuseportHash {
        /// Why CPU steering is not active.
        reason: String,
    },
}

impl Steering {
    /// Short name for output: `cpu-bpf` or `reuseport-hash`.
    pub fn name(&self) -> &'static str {
        match self {
            Steering::CpuBpf => "cpu-bpf",
            Steering::HashBpf => "hash-bpf",
            Steering::ReuseportHash { .. } => "reuseport-hash",
        }
    }
}

/// Why a group could not be made.
#[derive(Debug)]
pub enum GroupError {
    /// Something else holds the address without `SO_REUSEPORT` (or as another user).
    AddrInUse(SocketAddr),
    /// Binding needs a privilege (ports below 1024: `CAP_NET_BIND_SERVICE`).
    PermissionDenied(SocketAddr),
    /// The address is not on any interface here.
    AddrNotAvailable(SocketAddr),
    /// Any other failed call.
    Sys(SysError),
}

impl fmt::Display for GroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupError::AddrInUse(a) => write!(
                f,
                "{a} is already in use by another program (find it with `ss -lpn sport = :{}`), \
                 or choose another --bind port",
                a.port()
            ),
            GroupError::PermissionDenied(a) => write!(
                f,
                "binding {a} needs privilege: run as root, grant CAP_NET_BIND_SERVICE, or use a \
                 port of 1024 or above"
            ),
            GroupError::AddrNotAvailable(a) => write!(
                f,
                "{} is not an address of this host (or of this network namespace)",
                a.ip()
            ),
            GroupError::Sys(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for GroupError {}

fn sys_err(call: &'static str, e: io::Error) -> SysError {
    SysError { call, source: e }
}

/// What to build.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// Address every socket binds.
    pub addr: SocketAddr,
    /// One socket per worker; worker `i` runs on `cpus[i]`.
    pub cpus: Vec<usize>,
    /// Requested receive buffer in bytes: SO_RCVBUFFORCE where allowed (CAP_NET_ADMIN), else
    /// SO_RCVBUF, capped at `net.core.rmem_max`. The kernel doubles the value for bookkeeping;
    /// [`buffer_sizes`] reports what was granted.
    pub rcvbuf: Option<usize>,
    /// Requested SO_SNDBUF in bytes.
    pub sndbuf: Option<usize>,
    /// IPv6 sockets accept only IPv6 (no v4-mapped addresses).
    pub v6only: bool,
    /// Attach the CPU steering program (else plain reuseport hashing).
    pub steer: bool,
}

/// A bound group: `sockets[i]` belongs to the worker on `cpus[i]`.
#[derive(Debug)]
pub struct Group {
    /// Sockets in bind order (= reuseport index).
    pub sockets: Vec<UdpSocket>,
    /// Steering in force.
    pub steering: Steering,
    /// SO_RCVBUF granted by the kernel (bytes, as getsockopt reports it).
    pub rcvbuf: usize,
    /// SO_SNDBUF granted.
    pub sndbuf: usize,
}

/// Sets a buffer size with the `*FORCE` option, which ignores `net.core.[rw]mem_max` but needs
/// CAP_NET_ADMIN; the caller falls back to the capped option when it is refused.
fn set_buffer(s: &Socket, opt: libc::c_int, bytes: usize, call: &'static str) -> io::Result<()> {
    let v = libc::c_int::try_from(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    sys::set_int(s, libc::SOL_SOCKET, opt, v, call).map_err(|e| e.source)
}

/// Builds the socket for one worker (not yet bound).
fn socket_for(cfg: &GroupConfig) -> Result<Socket, SysError> {
    let domain = Domain::for_address(cfg.addr);
    let s =
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).map_err(|e| sys_err("socket", e))?;
    s.set_reuse_port(true)
        .map_err(|e| sys_err("setsockopt(SO_REUSEPORT)", e))?;
    if cfg.addr.is_ipv6() {
        s.set_only_v6(cfg.v6only)
            .map_err(|e| sys_err("setsockopt(IPV6_V6ONLY)", e))?;
    }
    if let Some(b) = cfg.rcvbuf {
        set_buffer(&s, libc::SO_RCVBUFFORCE, b, "setsockopt(SO_RCVBUFFORCE)")
            .or_else(|_| s.set_recv_buffer_size(b))
            .map_err(|e| sys_err("setsockopt(SO_RCVBUF)", e))?;
    }
    if let Some(b) = cfg.sndbuf {
        set_buffer(&s, libc::SO_SNDBUFFORCE, b, "setsockopt(SO_SNDBUFFORCE)")
            .or_else(|_| s.set_send_buffer_size(b))
            .map_err(|e| sys_err("setsockopt(SO_SNDBUF)", e))?;
    }
    s.set_nonblocking(true)
        .map_err(|e| sys_err("fcntl(O_NONBLOCK)", e))?;
    Ok(s)
}

/// One member of a group: socket, bound. Members must be bound in worker order: the bind
/// order is the reuseport index.
pub fn bind_one(cfg: &GroupConfig) -> Result<UdpSocket, GroupError> {
    let s = socket_for(cfg).map_err(GroupError::Sys)?;
    bind(&s, cfg.addr)?;
    Ok(UdpSocket::from(s))
}

/// Binds `s` to `addr`, saying what is wrong in the user's terms when it cannot.
pub(crate) fn bind(s: &Socket, addr: SocketAddr) -> Result<(), GroupError> {
    s.bind(&addr.into()).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => GroupError::AddrInUse(addr),
        io::ErrorKind::PermissionDenied => GroupError::PermissionDenied(addr),
        io::ErrorKind::AddrNotAvailable => GroupError::AddrNotAvailable(addr),
        _ => GroupError::Sys(sys_err("bind", e)),
    })
}

/// One member of a `SO_REUSEPORT` group kept aside (a duplicate of its descriptor) by the
/// worker that opened it, so the control thread can attach steering once every member is
/// bound — each worker binds its own socket on its own CPU, in order. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct GroupMember(std::sync::Arc<std::sync::Mutex<Option<std::os::fd::OwnedFd>>>);

impl GroupMember {
    /// Keeps a duplicate of `s` (the first call wins).
    pub fn keep(&self, s: &impl std::os::fd::AsFd) -> Result<(), GroupError> {
        let dup = s
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| GroupError::Sys(sys_err("dup", e)))?;
        if let Ok(mut g) = self.0.lock() {
            g.get_or_insert(dup);
        }
        Ok(())
    }

    /// Attaches steering through the kept member ([`attach_steering`]) and hands it back (to
    /// read its buffer sizes), or says there was none to attach to.
    pub fn attach(&self, cpus: &[usize], steer: bool) -> (Steering, Option<std::os::fd::OwnedFd>) {
        self.attach_with(|fd| attach_steering(fd, cpus, steer))
    }

    /// Attaches steering through the kept member with `attach`, and hands it back.
    pub fn attach_with(
        &self,
        attach: impl FnOnce(&std::os::fd::OwnedFd) -> Steering,
    ) -> (Steering, Option<std::os::fd::OwnedFd>) {
        match self.0.lock().ok().and_then(|mut g| g.take()) {
            Some(fd) => (attach(&fd), Some(fd)),
            None => (
                Steering::ReuseportHash {
                    reason: "no socket to attach to".into(),
                },
                None,
            ),
        }
    }
}

/// Attaches CPU steering to a group (through any one member, once all are bound). Never fails:
/// when the program is refused, the group keeps reuseport hashing and the reason is returned.
pub fn attach_steering(member: &impl AsRawFd, cpus: &[usize], steer: bool) -> Steering {
    attach_spread_steering(member, cpus, 1, steer)
}

/// [`attach_steering`] for `per_cpu` members on each CPU (bound in rounds over `cpus`, as
/// [`spread_steering_program`] expects).
pub fn attach_spread_steering(
    member: &impl AsRawFd,
    cpus: &[usize],
    per_cpu: usize,
    steer: bool,
) -> Steering {
    if !steer {
        return Steering::ReuseportHash {
            reason: "CPU steering turned off".into(),
        };
    }
    if cpus.len() == 1 && per_cpu <= 1 {
        // One socket receives everything.
        return Steering::CpuBpf;
    }
    match sys::attach_reuseport_cbpf(member, &spread_steering_program(cpus, per_cpu)) {
        Ok(()) => Steering::CpuBpf,
        Err(e) => Steering::ReuseportHash {
            reason: e.to_string(),
        },
    }
}

/// Turns on UDP_GRO (Linux 5.0+): the kernel may hand several datagrams of one flow to a
/// single receive, with their segment size in a control message.
pub fn enable_gro(s: &impl AsRawFd) -> Result<(), SysError> {
    sys::set_int(s, libc::SOL_UDP, libc::UDP_GRO, 1, "setsockopt(UDP_GRO)")
}

/// Asks the kernel to say, for each datagram it reassembled from fragments, the largest
/// fragment's size (IP_RECVFRAGSIZE, IPV6_RECVFRAGSIZE; Linux 4.10+), read back as
/// [`crate::socket::RecvMeta::fragment_size`]. An IPv6 socket also asks for IPv4's, so a
/// dual-stack socket reports both families.
pub fn enable_fragment_size(s: &impl AsRawFd, v6: bool) -> Result<(), SysError> {
    if v6 {
        sys::set_int(
            s,
            libc::SOL_IPV6,
            libc::IPV6_RECVFRAGSIZE,
            1,
            "setsockopt(IPV6_RECVFRAGSIZE)",
        )?;
        // Only a dual-stack socket gets IPv4 datagrams; a v6-only one may refuse this.
        let _ = sys::set_int(s, libc::SOL_IP, libc::IP_RECVFRAGSIZE, 1, "");
        Ok(())
    } else {
        sys::set_int(
            s,
            libc::SOL_IP,
            libc::IP_RECVFRAGSIZE,
            1,
            "setsockopt(IP_RECVFRAGSIZE)",
        )
    }
}

/// The path MTU of a connected socket's route (IP_MTU / IPV6_MTU): the largest IP packet
/// that leaves without being fragmented.
pub fn path_mtu(s: &impl AsRawFd, v6: bool) -> Result<usize, SysError> {
    let v = if v6 {
        sys::get_int(s, libc::SOL_IPV6, libc::IPV6_MTU, "getsockopt(IPV6_MTU)")?
    } else {
        sys::get_int(s, libc::SOL_IP, libc::IP_MTU, "getsockopt(IP_MTU)")?
    };
    Ok(usize::try_from(v).unwrap_or(0))
}

/// Lets the kernel fragment what this socket sends above the path MTU, whatever the host's
/// default (`IP_PMTUDISC_DONT` / `IPV6_PMTUDISC_DONT`: no DF bit, no EMSGSIZE).
pub fn allow_fragmenting(s: &impl AsRawFd, v6: bool) -> Result<(), SysError> {
    if v6 {
        sys::set_int(
            s,
            libc::SOL_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DONT,
            "setsockopt(IPV6_MTU_DISCOVER)",
        )
    } else {
        sys::set_int(
            s,
            libc::SOL_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DONT,
            "setsockopt(IP_MTU_DISCOVER)",
        )
    }
}

/// Checks that the kernel has UDP_SEGMENT (GSO, Linux 4.18+) by setting the socket's default
/// segment size to 0 (= none), which changes nothing.
pub fn probe_gso(s: &impl AsRawFd) -> Result<(), SysError> {
    sys::set_int(
        s,
        libc::SOL_UDP,
        libc::UDP_SEGMENT,
        0,
        "setsockopt(UDP_SEGMENT)",
    )
}

/// `SO_PREFER_BUSY_POLL` (Linux 5.11+).
const SO_PREFER_BUSY_POLL: libc::c_int = 69;
/// `SO_BUSY_POLL_BUDGET` (Linux 5.11+).
const SO_BUSY_POLL_BUDGET: libc::c_int = 70;

/// Busy polling for latency: receives spin on the device queue for up to `usec` µs before
/// sleeping (SO_BUSY_POLL; raising it above `net.core.busy_read` needs CAP_NET_ADMIN). Where
/// the kernel has them, SO_PREFER_BUSY_POLL and SO_BUSY_POLL_BUDGET = `budget` are set too;
/// returns whether they were.
pub fn set_busy_poll(s: &impl AsRawFd, usec: u32, budget: usize) -> Result<bool, SysError> {
    let usec = libc::c_int::try_from(usec).unwrap_or(libc::c_int::MAX);
    sys::set_int(
        s,
        libc::SOL_SOCKET,
        libc::SO_BUSY_POLL,
        usec,
        "setsockopt(SO_BUSY_POLL)",
    )?;
    let budget = libc::c_int::try_from(budget).unwrap_or(libc::c_int::MAX);
    let prefer = sys::set_int(
        s,
        libc::SOL_SOCKET,
        SO_PREFER_BUSY_POLL,
        1,
        "setsockopt(SO_PREFER_BUSY_POLL)",
    )
    .and_then(|()| {
        sys::set_int(
            s,
            libc::SOL_SOCKET,
            SO_BUSY_POLL_BUDGET,
            budget,
            "setsockopt(SO_BUSY_POLL_BUDGET)",
        )
    });
    Ok(prefer.is_ok())
}

/// Granted (SO_RCVBUF, SO_SNDBUF) of a socket, as getsockopt reports them.
pub fn buffer_sizes(s: &impl AsRawFd) -> Result<(usize, usize), SysError> {
    let r = sys::get_int(
        s,
        libc::SOL_SOCKET,
        libc::SO_RCVBUF,
        "getsockopt(SO_RCVBUF)",
    )?;
    let w = sys::get_int(
        s,
        libc::SOL_SOCKET,
        libc::SO_SNDBUF,
        "getsockopt(SO_SNDBUF)",
    )?;
    Ok((r.max(0) as usize, w.max(0) as usize))
}

/// Binds one socket per CPU, all to `cfg.addr`, in order, then attaches the steering program
/// (all from the calling thread; the runtime instead binds each from its pinned worker).
pub fn bind_group(cfg: &GroupConfig) -> Result<Group, GroupError> {
    let mut sockets = Vec::with_capacity(cfg.cpus.len());
    for _ in &cfg.cpus {
        sockets.push(bind_one(cfg)?);
    }
    let steering = match sockets.first() {
        Some(s) => attach_steering(s, &cfg.cpus, cfg.steer),
        None => Steering::ReuseportHash {
            reason: "no sockets".into(),
        },
    };
    let (rcvbuf, sndbuf) = match sockets.first() {
        Some(s) => buffer_sizes(s).map_err(GroupError::Sys)?,
        None => (0, 0),
    };
    Ok(Group {
        sockets,
        steering,
        rcvbuf,
        sndbuf,
    })
}

/// Counts the datagrams delivered to one worker's socket that the kernel processed on another
/// CPU. An eBPF socket filter on the socket compares `bpf_get_smp_processor_id()` with the
/// worker's CPU and adds mismatches (GRO-coalesced packets by their segment count) to a
/// memory-mapped array, so reading the count is a load, not a system call.
///
/// The filter runs where the kernel queues the datagram to the socket (after the reuseport
/// choice, before the receive-buffer check), so datagrams later dropped for a full buffer are
/// counted too. SO_INCOMING_CPU cannot do this job: the kernel updates it only for connected
/// UDP sockets.
#[derive(Debug)]
pub struct MissteerDetector {
    counts: sys::bpf::MappedArray,
}

/// Why the detector could not be attached (the run goes on without it).
#[derive(Debug)]
pub enum DetectError {
    /// Map creation, mapping or attachment failed.
    Sys(SysError),
    /// The program was refused.
    Load(sys::bpf::LoadError),
    /// The program could not be assembled (a bug).
    Asm(crate::ebpf::AsmError),
}

impl fmt::Display for DetectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DetectError::Sys(e) => e.fmt(f),
            DetectError::Load(e) => e.fmt(f),
            DetectError::Asm(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for DetectError {}

impl MissteerDetector {
    /// Attaches a detector for the worker on `cpu` to `sock`.
    pub fn attach(sock: &impl AsRawFd, cpu: usize) -> Result<MissteerDetector, DetectError> {
        let counts = sys::bpf::MappedArray::new("fl_missteer", 1).map_err(DetectError::Sys)?;
        let cpu = u32::try_from(cpu).map_err(|_| {
            DetectError::Sys(SysError {
                call: "missteer detector",
                source: io::Error::from_raw_os_error(libc::EINVAL),
            })
        })?;
        let insns = crate::ebpf::missteer_filter(cpu, counts.fd()).map_err(DetectError::Asm)?;
        let prog = sys::bpf::prog_load(sys::bpf::PROG_SOCKET_FILTER, "fl_missteer", &insns)
            .map_err(DetectError::Load)?;
        sys::bpf::attach_socket_filter(sock, &prog).map_err(DetectError::Sys)?;
        Ok(MissteerDetector { counts })
    }

    /// Datagrams this socket received from another CPU since the detector was attached.
    #[inline]
    pub fn count(&self) -> u64 {
        self.counts.get(0)
    }
}

// Classic BPF opcodes (linux/bpf_common.h): class | op | source. BPF_LD=0x00, BPF_W=0x00,
// BPF_ABS=0x20; BPF_JMP=0x05, BPF_JEQ=0x10; BPF_ALU=0x04, BPF_MOD=0x90; BPF_K=0x00;
// BPF_RET=0x06, BPF_A=0x10.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_ALU_MOD_K: u16 = 0x94;
const BPF_RET_K: u16 = 0x06;
const BPF_RET_A: u16 = 0x16;
// BPF_LD|BPF_W|BPF_IMM (0x00), BPF_ALU|BPF_MUL|BPF_K (0x20), BPF_ALU|BPF_ADD|BPF_X (0x08),
// BPF_MISC|BPF_TAX (0x07|0x00).
const BPF_LD_IMM: u16 = 0x00;
const BPF_ALU_MUL_K: u16 = 0x24;
const BPF_ALU_ADD_X: u16 = 0x0c;
const BPF_MISC_TAX: u16 = 0x07;
/// `SKF_AD_OFF + SKF_AD_CPU`: loading this "offset" yields the current CPU number.
const AD_CPU: u32 = (-0x1000i32 + 36) as u32;
/// `SKF_AD_OFF + SKF_AD_RXHASH`: the packet's flow hash (`skb->hash`: the NIC's RSS hash, or
/// on loopback and veth the sending socket's random `sk_txhash`; 0 when nobody set one).
const AD_RXHASH: u32 = (-0x1000i32 + 32) as u32;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> BpfInsn {
    BpfInsn { code, jt, jf, k }
}

/// The steering program for workers on `cpus` (socket `i` on `cpus[i]`):
/// `A = cpu; if A == cpus[0] return 0; …; return A % n`. When `cpus` is `0..n` this is the
/// kernel selftest's `A = cpu; A %= n; return A`. A CPU without a worker falls through to
/// `% n` (and the receiving worker counts the datagrams as mis-steered).
pub fn steering_program(cpus: &[usize]) -> Vec<BpfInsn> {
    let n = cpus.len().max(1) as u32;
    let mut prog = vec![insn(BPF_LD_W_ABS, 0, 0, AD_CPU)];
    let identity = cpus.iter().enumerate().all(|(i, &c)| i == c);
    // Jump offsets are 8-bit: an explicit table only up to 120 CPUs, else modulo alone.
    if !identity && cpus.len() <= 120 {
        for (i, &c) in cpus.iter().enumerate() {
            prog.push(insn(BPF_JMP_JEQ_K, 0, 1, c as u32));
            prog.push(insn(BPF_RET_K, 0, 0, i as u32));
        }
    }
    prog.push(insn(BPF_ALU_MOD_K, 0, 0, n));
    prog.push(insn(BPF_RET_A, 0, 0, 0));
    prog
}

/// The steering program for `per_cpu` workers on each of `cpus`, bound in rounds (socket
/// `p + j·m` on `cpus[p]`, `m = cpus.len()`, `j < per_cpu`): the CPU picks `p` as in
/// [`steering_program`], the flow hash picks `j`:
/// `X = hash % per_cpu * m; A = cpu; if A == cpus[0] return 0 + X; …; return A % m + X`.
/// With one worker per CPU it is [`steering_program`]. Packets without a hash all go to the
/// CPU's first worker.
pub fn spread_steering_program(cpus: &[usize], per_cpu: usize) -> Vec<BpfInsn> {
    if per_cpu <= 1 {
        return steering_program(cpus);
    }
    let m = cpus.len().max(1) as u32;
    let mut prog = vec![
        insn(BPF_LD_W_ABS, 0, 0, AD_RXHASH),
        insn(BPF_ALU_MOD_K, 0, 0, per_cpu as u32),
        insn(BPF_ALU_MUL_K, 0, 0, m),
        insn(BPF_MISC_TAX, 0, 0, 0),
        insn(BPF_LD_W_ABS, 0, 0, AD_CPU),
    ];
    let identity = cpus.iter().enumerate().all(|(i, &c)| i == c);
    if !identity && cpus.len() <= 120 {
        for (i, &c) in cpus.iter().enumerate() {
            prog.push(insn(BPF_JMP_JEQ_K, 0, 3, c as u32));
            prog.push(insn(BPF_LD_IMM, 0, 0, i as u32));
            prog.push(insn(BPF_ALU_ADD_X, 0, 0, 0));
            prog.push(insn(BPF_RET_A, 0, 0, 0));
        }
    }
    prog.push(insn(BPF_ALU_MOD_K, 0, 0, m));
    prog.push(insn(BPF_ALU_ADD_X, 0, 0, 0));
    prog.push(insn(BPF_RET_A, 0, 0, 0));
    prog
}

/// `SKF_NET_OFF`: loads at this "offset" plus k read the packet from its network header.
const NET_OFF: u32 = (-0x0010_0000i32) as u32;
const BPF_LD_B_ABS: u16 = 0x30;
const BPF_LD_MEM: u16 = 0x60;
const BPF_ST: u16 = 0x02;
const BPF_JMP_JSET_K: u16 = 0x45;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_ALU_XOR_K: u16 = 0xa4;
const BPF_ALU_AND_K: u16 = 0x54;
const BPF_JMP_JA: u16 = 0x05;

/// The most buckets [`hash_steering_program`] takes (its jump offsets are 8 bits).
pub const HASH_STEERING_MAX_BUCKETS: usize = 256;

/// A reuseport program that steers each datagram by the software Toeplitz hash of its
/// 4-tuple, as FreeBSD re-dispatches a reassembled datagram to the CPU owning its RSS bucket:
/// socket `buckets[hash % buckets.len()]`. The tuple is read from the network header (IPv4
/// without options: source, destination, ports at 12, 16, 20; IPv6 without extension
/// headers: 8, 24, 40), so a datagram the kernel reassembled is steered like a whole one.
/// With `v6` the program takes both families (a dual-stack socket gets IPv4 datagrams too):
/// it reads the version and hashes each by its own header. `key`: the Toeplitz key (at least
/// 16 bytes for IPv4, 40 with `v6`). The hash is built bit by bit (5 instructions a bit:
/// ~600 for IPv4, ~1 500 for IPv6, both under the kernel's 4 096), then a tree of comparisons
/// over runs of equal buckets picks the socket. An IPv4 header with options goes to
/// `buckets[0]`'s socket (its ports are elsewhere). `None`: a key too short, no buckets, or
/// more than [`HASH_STEERING_MAX_BUCKETS`].
pub fn hash_steering_program(key: &[u8], buckets: &[u32], v6: bool) -> Option<Vec<BpfInsn>> {
    let need = if v6 { 40 } else { 16 };
    if key.len() < need || buckets.is_empty() || buckets.len() > HASH_STEERING_MAX_BUCKETS {
        return None;
    }
    let mut v4 = vec![
        // Only a header without options: else the ports are elsewhere.
        insn(BPF_LD_B_ABS, 0, 0, NET_OFF),
        insn(BPF_JMP_JEQ_K, 1, 0, 0x45),
        insn(BPF_RET_K, 0, 0, buckets[0]),
    ];
    hash_and_pick(key, buckets, &[(12, 4), (16, 4), (20, 4)], &mut v4);
    if !v6 {
        return Some(v4);
    }
    let mut ip6 = Vec::new();
    hash_and_pick(key, buckets, &[(8, 16), (24, 16), (40, 4)], &mut ip6);
    // The version nibble: 6 falls through to the IPv6 part, anything else jumps over it.
    let mut prog = vec![
        insn(BPF_LD_B_ABS, 0, 0, NET_OFF),
        insn(BPF_ALU_AND_K, 0, 0, 0xf0),
        insn(BPF_JMP_JEQ_K, 1, 0, 0x60),
        insn(BPF_JMP_JA, 0, 0, ip6.len() as u32),
    ];
    prog.extend(ip6);
    prog.extend(v4);
    Some(prog)
}

/// Appends the Toeplitz hash of the header `fields` ((offset, bytes) from the network
/// header) and the pick of the bucket's socket.
fn hash_and_pick(key: &[u8], buckets: &[u32], fields: &[(u32, u32)], prog: &mut Vec<BpfInsn>) {
    // The 32 key bits from bit p on.
    let window = |p: usize| -> u32 {
        (0..32).fold(0u32, |w, i| {
            let bit = p + i;
            let b = (key[bit / 8] >> (7 - bit % 8)) & 1;
            (w << 1) | u32::from(b)
        })
    };
    // M[0]: the hash; M[1]: the byte being hashed.
    prog.push(insn(BPF_LD_IMM, 0, 0, 0));
    prog.push(insn(BPF_ST, 0, 0, 0));
    let mut p = 0;
    for &(at, n) in fields {
        for k in 0..n {
            prog.push(insn(BPF_LD_B_ABS, 0, 0, NET_OFF.wrapping_add(at + k)));
            prog.push(insn(BPF_ST, 0, 0, 1));
            for j in 0..8 {
                prog.push(insn(BPF_LD_MEM, 0, 0, 1));
                prog.push(insn(BPF_JMP_JSET_K, 0, 3, 0x80 >> j));
                prog.push(insn(BPF_LD_MEM, 0, 0, 0));
                prog.push(insn(BPF_ALU_XOR_K, 0, 0, window(p)));
                prog.push(insn(BPF_ST, 0, 0, 0));
                p += 1;
            }
        }
    }
    prog.push(insn(BPF_LD_MEM, 0, 0, 0));
    let nb = buckets.len() as u32;
    prog.push(if nb.is_power_of_two() {
        insn(BPF_ALU_AND_K, 0, 0, nb - 1)
    } else {
        insn(BPF_ALU_MOD_K, 0, 0, nb)
    });
    // Runs of buckets with one socket: (first bucket, socket).
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for (b, &s) in buckets.iter().enumerate() {
        if runs.last().is_none_or(|r| r.1 != s) {
            runs.push((b as u32, s));
        }
    }
    tree(&runs, prog);
}

/// A comparison tree over `runs` (A holds the bucket): `JGE` the middle run's first bucket,
/// the lower half falling through, each leaf a `RET` of its socket.
fn tree(runs: &[(u32, u32)], prog: &mut Vec<BpfInsn>) {
    if let [(_, sock)] = runs {
        prog.push(insn(BPF_RET_K, 0, 0, *sock));
        return;
    }
    let mid = runs.len() / 2;
    let at = prog.len();
    prog.push(insn(BPF_JMP_JGE_K, 0, 0, runs[mid].0));
    tree(&runs[..mid], prog);
    let skip = prog.len() - at - 1;
    // A subtree of r runs takes 2r - 1 instructions: 256 buckets fit the 8-bit jump.
    prog[at].jt = u8::try_from(skip).unwrap_or(u8::MAX);
    tree(&runs[mid..], prog);
}

/// Attaches [`hash_steering_program`] to a reuseport group through one member.
pub fn attach_hash_steering(
    member: &impl AsRawFd,
    key: &[u8],
    buckets: &[u32],
    v6: bool,
) -> Result<(), String> {
    let prog = hash_steering_program(key, buckets, v6).ok_or_else(|| {
        format!(
            "hash steering takes a key of at least {} bytes and 1 to {HASH_STEERING_MAX_BUCKETS} \
             buckets",
            if v6 { 40 } else { 16 }
        )
    })?;
    sys::attach_reuseport_cbpf(member, &prog).map_err(|e| e.to_string())
}

/// Runs a classic BPF steering program on a CPU number (for tests and `--explain`): only the
/// instructions [`steering_program`] emits are understood.
pub fn run_steering_program(prog: &[BpfInsn], cpu: u32) -> Option<u32> {
    run_spread_steering_program(prog, cpu, 0)
}

/// Runs a program of [`spread_steering_program`] (or [`steering_program`]) on a CPU number
/// and a flow hash.
pub fn run_spread_steering_program(prog: &[BpfInsn], cpu: u32, hash: u32) -> Option<u32> {
    let (mut a, mut x) = (0u32, 0u32);
    let mut pc = 0usize;
    for _ in 0..prog.len() + 1 {
        let i = prog.get(pc)?;
        match i.code {
            BPF_LD_W_ABS if i.k == AD_CPU => a = cpu,
            BPF_LD_W_ABS if i.k == AD_RXHASH => a = hash,
            BPF_LD_IMM => a = i.k,
            BPF_ALU_MUL_K => a = a.wrapping_mul(i.k),
            BPF_ALU_ADD_X => a = a.wrapping_add(x),
            BPF_MISC_TAX => x = a,
            BPF_JMP_JEQ_K => {
                pc += 1 + if a == i.k { i.jt } else { i.jf } as usize;
                continue;
            }
            BPF_ALU_MOD_K => a = a.checked_rem(i.k)?,
            BPF_RET_K => return Some(i.k),
            BPF_RET_A => return Some(a),
            _ => return None,
        }
        pc += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for what [`hash_steering_program`] emits, over a packet
    /// given from its network header.
    fn run_cbpf(prog: &[BpfInsn], net: &[u8]) -> Option<u32> {
        let (mut a, mut m, mut pc) = (0u32, [0u32; 16], 0usize);
        while let Some(i) = prog.get(pc) {
            pc += 1;
            match i.code {
                BPF_LD_IMM => a = i.k,
                BPF_ST => m[i.k as usize] = a,
                BPF_LD_MEM => a = m[i.k as usize],
                BPF_LD_B_ABS => a = u32::from(*net.get(i.k.wrapping_sub(NET_OFF) as usize)?),
                BPF_ALU_XOR_K => a ^= i.k,
                BPF_ALU_AND_K => a &= i.k,
                BPF_ALU_MOD_K => a %= i.k,
                BPF_JMP_JSET_K | BPF_JMP_JGE_K | BPF_JMP_JEQ_K => {
                    let t = match i.code {
                        BPF_JMP_JSET_K => a & i.k != 0,
                        BPF_JMP_JGE_K => a >= i.k,
                        _ => a == i.k,
                    };
                    pc += usize::from(if t { i.jt } else { i.jf });
                }
                BPF_JMP_JA => pc += i.k as usize,
                BPF_RET_K => return Some(i.k),
                _ => return None,
            }
        }
        None
    }

    /// The program computes the same Toeplitz hash as `flowlane-rss` and picks the bucket's
    /// socket, IPv4 and IPv6, for any buckets (runs merged, not a power of two too).
    #[test]
    fn hash_steering_follows_the_toeplitz_hash() {
        use flowlane_rss::{Key, Toeplitz, Tuple};
        let h = Toeplitz::new(&Key::MICROSOFT);
        let key = Key::MICROSOFT.as_bytes().to_vec();
        for nb in [128usize, 100, 1] {
            let buckets: Vec<u32> = (0..nb as u32).map(|b| (b / 3) % 5).collect();
            for v6 in [false, true] {
                let prog = hash_steering_program(&key, &buckets, v6).expect("program");
                assert!(prog.len() < 4096, "{} instructions", prog.len());
                for i in 0..200u32 {
                    let (src, dst): (std::net::IpAddr, std::net::IpAddr) = if v6 {
                        (
                            std::net::Ipv6Addr::from(
                                (0x2001_0002_u128 << 96) | u128::from(i * 7919),
                            )
                            .into(),
                            "2001:2::9".parse().expect("addr"),
                        )
                    } else {
                        (
                            std::net::Ipv4Addr::from(0xc612_0000 | (i * 13)).into(),
                            "198.18.1.2".parse().expect("addr"),
                        )
                    };
                    let (sp, dp) = (1024 + (i * 37) as u16, 9000);
                    let t = Tuple::new(src, dst, Some((sp, dp))).expect("tuple");
                    let want = buckets[(h.hash(&t) as usize) % nb];
                    let mut net = vec![0u8; 48];
                    match (src, dst) {
                        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => {
                            net[0] = 0x45;
                            net[12..16].copy_from_slice(&s.octets());
                            net[16..20].copy_from_slice(&d.octets());
                            net[20..22].copy_from_slice(&sp.to_be_bytes());
                            net[22..24].copy_from_slice(&dp.to_be_bytes());
                        }
                        (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => {
                            net[0] = 0x60;
                            net[8..24].copy_from_slice(&s.octets());
                            net[24..40].copy_from_slice(&d.octets());
                            net[40..42].copy_from_slice(&sp.to_be_bytes());
                            net[42..44].copy_from_slice(&dp.to_be_bytes());
                        }
                        _ => unreachable!(),
                    }
                    assert_eq!(run_cbpf(&prog, &net), Some(want), "v6 {v6}, {nb} buckets");
                    if !v6 {
                        // The dual-stack program hashes an IPv4 datagram as the IPv4 one.
                        let dual = hash_steering_program(&key, &buckets, true).expect("program");
                        assert_eq!(
                            run_cbpf(&dual, &net),
                            Some(want),
                            "IPv4 on a dual-stack socket"
                        );
                    }
                }
            }
        }
        assert!(hash_steering_program(&key[..8], &[0], false).is_none());
        assert!(hash_steering_program(&key, &[0; 257], false).is_none());
    }

    /// On a real reuseport group (loopback): every datagram of 64 source ports reaches the
    /// socket its Toeplitz bucket names, as the kernel runs the program.
    #[test]
    fn the_kernel_steers_a_group_by_the_hash() {
        // An IPv4 group, and a dual-stack IPv6 one taking IPv4 and IPv6 clients alike.
        steered_by_the_hash("127.0.0.1:0", false, &["127.0.0.1"]);
        steered_by_the_hash("[::]:0", true, &["127.0.0.1", "::1"]);
    }

    fn steered_by_the_hash(bind: &str, v6: bool, clients: &[&str]) {
        use flowlane_rss::{Key, Toeplitz, Tuple};
        let h = Toeplitz::new(&Key::MICROSOFT);
        let key = Key::MICROSOFT.as_bytes().to_vec();
        let buckets: Vec<u32> = (0..128).map(|b| b % 4).collect();
        let first = reuse_socket(bind.parse().expect("addr"));
        let port = first.local_addr().expect("addr").port();
        let mut group = vec![first];
        for _ in 1..4 {
            group.push(reuse_socket(
                bind.parse::<SocketAddr>()
                    .map(|mut a| {
                        a.set_port(port);
                        a
                    })
                    .expect("addr"),
            ));
        }
        attach_hash_steering(&group[0], &key, &buckets, v6).expect("attached");
        let mut want = std::collections::HashMap::new();
        for i in 0..64u16 {
            let ip: std::net::IpAddr = clients[usize::from(i) % clients.len()].parse().expect("ip");
            let to = SocketAddr::new(ip, port);
            let c = UdpSocket::bind(SocketAddr::new(ip, 0)).expect("client");
            let src = c.local_addr().expect("addr");
            c.send_to(&i.to_be_bytes(), to).expect("sent");
            let t = Tuple::from_socket_addrs(src, to).expect("tuple");
            want.insert(i, buckets[h.hash(&t) as usize % 128]);
        }
        let mut got = std::collections::HashMap::new();
        for (k, s) in group.iter().enumerate() {
            s.set_nonblocking(true).expect("nonblocking");
            let mut b = [0u8; 4];
            while let Ok(n) = s.recv(&mut b) {
                assert_eq!(n, 2);
                got.insert(u16::from_be_bytes([b[0], b[1]]), k as u32);
            }
        }
        assert_eq!(got, want, "{bind}");
    }

    fn reuse_socket(addr: SocketAddr) -> UdpSocket {
        let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
            .expect("socket");
        s.set_reuse_port(true).expect("SO_REUSEPORT");
        s.bind(&addr.into()).expect("bind");
        s.into()
    }

    #[test]
    fn identity_program_is_the_selftest_one() {
        let p = steering_program(&[0, 1, 2, 3]);
        assert_eq!(p.len(), 3);
        for cpu in 0..8 {
            assert_eq!(run_steering_program(&p, cpu), Some(cpu % 4));
        }
    }

    #[test]
    fn cpu_lists_map_to_bind_order() {
        let cpus = [2, 3, 7];
        let p = steering_program(&cpus);
        for (i, &c) in cpus.iter().enumerate() {
            assert_eq!(run_steering_program(&p, c as u32), Some(i as u32));
        }
        // A CPU without a worker falls through to modulo.
        assert_eq!(run_steering_program(&p, 5), Some(5 % 3));
    }

    #[test]
    fn spread_programs_pick_the_cpu_then_one_of_its_workers_by_hash() {
        for cpus in [vec![0, 1], vec![3, 1, 6], vec![0]] {
            let m = cpus.len() as u32;
            for per_cpu in 1..=4u32 {
                let p = spread_steering_program(&cpus, per_cpu as usize);
                for (i, &c) in cpus.iter().enumerate() {
                    let mut seen = std::collections::BTreeSet::new();
                    for hash in [0u32, 1, 2, 3, 7, 0xdead_beef, u32::MAX] {
                        let got = run_spread_steering_program(&p, c as u32, hash);
                        let want = if per_cpu == 1 {
                            i as u32
                        } else {
                            i as u32 + hash % per_cpu * m
                        };
                        assert_eq!(got, Some(want), "cpus {cpus:?} × {per_cpu}, hash {hash}");
                        seen.insert(want);
                    }
                    // Every worker of the CPU is reachable, and only those.
                    let all: std::collections::BTreeSet<u32> =
                        (0..per_cpu).map(|j| i as u32 + j * m).collect();
                    assert_eq!(seen, all, "cpus {cpus:?} × {per_cpu}");
                }
            }
        }
    }

    #[test]
    fn busy_port_is_reported_clearly() {
        let holder = UdpSocket::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let addr = holder.local_addr().expect("local addr");
        let cfg = GroupConfig {
            addr,
            cpus: vec![0],
            rcvbuf: None,
            sndbuf: None,
            v6only: false,
            steer: true,
        };
        match bind_group(&cfg) {
            Err(GroupError::AddrInUse(a)) => assert_eq!(a, addr),
            other => panic!("expected AddrInUse, got {other:?}"),
        }
    }

    /// Sends `n` datagrams to `to` from a thread pinned to `cpu` (on loopback the sender's CPU
    /// processes them).
    fn send_from(cpu: usize, to: SocketAddr, n: usize) {
        std::thread::spawn(move || {
            sys::pin_current_thread(cpu).expect("pin sender");
            let s = UdpSocket::bind("127.0.0.1:0").expect("sender socket");
            for _ in 0..n {
                s.send_to(b"x", to).expect("send");
            }
        })
        .join()
        .expect("sender thread");
    }

    #[test]
    fn detector_counts_only_packets_from_other_cpus() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 {
            eprintln!("skipped: needs two CPUs");
            return;
        }
        let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let to = sock.local_addr().expect("addr");
        let det = match MissteerDetector::attach(&sock, 0) {
            Ok(d) => d,
            Err(e) => panic!("detector refused: {e}"),
        };
        send_from(0, to, 50);
        assert_eq!(det.count(), 0, "packets processed on the worker's own CPU");
        send_from(1, to, 70);
        assert_eq!(det.count(), 70, "packets processed on CPU 1");
        let mut buf = [0u8; 8];
        for _ in 0..120 {
            sock.recv(&mut buf)
                .expect("every datagram is accepted by the filter");
        }
    }
}
