//! # flowlane-io — packet I/O backends
//!
//! Layer: I/O. Every system call goes through the private `sys` module, the only one with
//! `unsafe`; each block there carries a `// SAFETY:` comment and every failure names its call
//! ([`SysError`]). What the rest of flowlane sees is this safe face, by concern:
//!
//! * [`udp`]: a `SO_REUSEPORT` group of UDP sockets, one per worker, steered by a classic BPF
//!   program so that the socket receiving a datagram is the one whose worker runs on the CPU
//!   that processed it (the Linux counterpart of FreeBSD's per-bucket listen sockets);
//!   [`udp::MissteerDetector`] counts datagrams a worker got from another CPU.
//! * [`tcp`]: the same steering for `SO_REUSEPORT` listeners, non-blocking connects from
//!   chosen source addresses, an epoll set with nanosecond timeouts, `sendfile` from a memfd.
//! * [`socket`]: batched `recvmmsg`/`sendmmsg` with per-datagram truncation flags and GRO/GSO
//!   ([`socket::MmsgBatch`], [`socket::SendBatch`]), socket options, the drop counter.
//! * [`frame`]: whole frames — AF_PACKET TX and RX rings, AF_XDP transmit and receive — and
//!   [`frame::Capabilities`], what the kernel and an interface offer them, asked once.
//! * [`netdev`]: interfaces — index, offloads by `SIOCETHTOOL`, XDP attached by rtnetlink, XDP
//!   features by generic netlink.
//! * [`ebpf`] assembles programs in Rust (no toolchain); [`bpf`] loads them, makes maps and
//!   attaches them.
//! * [`perf`]: the calling thread's performance counters (cycles, instructions, LLC misses; or
//!   software events), or why they cannot be had.
//! * [`os`]: CPU pinning and affinity, the monotonic clock, namespaces, signals, mounts;
//!   [`huge`]: the binary's huge-page allocator.

#![deny(unsafe_code)]

pub mod ebpf;
pub mod frame;
mod link;
mod maps;
pub mod perf;
#[allow(unsafe_code)]
mod sys;
pub mod tcp;
pub mod udp;
mod verify;

pub use sys::SysError;

/// The calling thread and process: CPU affinity and pinning, the monotonic clock the
/// flowlane header's timestamps use, network namespaces, signals, mounts.
pub mod os {
    pub use crate::sys::netdev::{mount_fs, private_sysfs};
    pub use crate::sys::rt::{
        fifo_priority, hold_cpu_dma_latency, lock_memory, realtime_ns, set_fifo_priority,
        sleep_until_ns, sleep_until_realtime_ns, thread_id, wall_clock, DmaLatency, WallClock,
    };
    pub use crate::sys::stream::{
        clock_ticks_per_s, nofile_limit, process_cpu_ns, raise_nofile_limit, refuse_unshare_here,
        set_timer_slack_ns, unshare_files, wait_child, ChildUsage,
    };
    pub use crate::sys::{
        allowed_cpus, block_sigpipe_here, current_cpu, enter_netns, monotonic_ns,
        open_read_nonblocking, pin_current_thread, possible_cpus, signal_process, thread_cpu_ns,
        Signal, ThreadHandle,
    };
}

/// Large allocations on huge pages: the binary's global allocator, and what the kernel
/// granted.
pub mod huge {
    pub use crate::sys::huge::*;
}

/// Socket options and batched UDP I/O (`recvmmsg`/`sendmmsg` with GRO/GSO), readiness, and the
/// socket's drop counter.
pub mod socket {
    pub use crate::sys::{
        encode_sockaddr, get_int, poll_any_readable, poll_readable, set_int, socket_drops,
        wait_readable, Epoll, MmsgBatch, RecvMeta, SendBatch, SendOutcome, GSO_MAX_SEGMENT,
        MAX_DATAGRAM,
    };
}

/// Interfaces: index and name, MAC, MTU, speed and counters (sysfs), offloads (the
/// `SIOCETHTOOL` ioctl), and through rtnetlink the XDP attach, neighbours' MACs and the
/// interface a route leaves by — no `ip` run.
pub mod netdev {
    pub use crate::link::{counter, mac, mtu, parse_mac, speed_mbps};
    pub use crate::sys::netdev::{driver_stats, offload, set_offload, Offload};
    pub use crate::sys::netlink::{
        attach_xdp_to_link, ifname, link_facts, link_facts_of, neighbour_entry, neighbour_mac,
        neighbours, parse_ack, resolve_neighbour, route_changes, route_get, route_of, route_oif,
        routes, xdp_features, xdp_features_of, KernelRoute, LinkFacts, Neighbour, RouteChange,
        RouteKind, RouteMonitor, XDP_FLAGS_DRV_MODE,
    };
    pub use crate::sys::packet::ifindex;
    pub use crate::sys::qstats::{qstats_of, queue_stats, QueueStats};
}

/// nftables' base chains, as `nft list chains` reads them.
pub mod nft {
    pub use crate::sys::nft::*;
}

/// An interface's RSS and queues as `ethtool` reads them (generic netlink where the kernel has
/// the message, `SIOCETHTOOL` otherwise; each reading says which).
pub mod ethtool {
    pub use crate::sys::ethtool::*;
}

/// The `bpf(2)` side of generated programs: loading, maps, attaching, test runs (the programs
/// themselves are assembled by [`ebpf`]).
pub mod bpf {
    pub use crate::maps::{
        AddrSet, ArrayMap, BridgeMaps, CpuMap, LpmTrie6, PerCpuCounters, XskMap,
    };
    pub use crate::sys::bpf::*;
    pub use crate::sys::btf::{func_id, vmlinux_func_id};
    pub use crate::verify::{seen_of, RssVerifier, SeenEntry};
}
