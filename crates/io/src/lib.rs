//! # flowlane-io — packet I/O backends
//!
//! Layer: I/O. Every system call goes through [`sys`], the only module with `unsafe`; each
//! block there carries a `// SAFETY:` comment and every failure names its call.
//!
//! * [`udp`]: a `SO_REUSEPORT` group of UDP sockets, one per worker, steered by a classic BPF
//!   program so that the socket receiving a datagram is the one whose worker runs on the CPU
//!   that processed it (the Linux counterpart of FreeBSD's per-bucket listen sockets).
//! * [`sys::MmsgBatch`]: batched `recvmmsg`/`sendmmsg` with per-datagram truncation flags and
//!   GRO/GSO; [`sys::socket_drops`] reads the socket's drop counter.
//! * [`ebpf`]: an eBPF assembler (programs are generated in Rust and loaded with `bpf(2)`);
//!   [`udp::MissteerDetector`] uses it to count datagrams a worker got from another CPU.

#![deny(unsafe_code)]

pub mod ebpf;
#[allow(unsafe_code)]
pub mod sys;
pub mod udp;

pub use sys::SysError;
