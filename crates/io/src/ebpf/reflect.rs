//! The XDP-native reflector behind `flowlane forward --mode reflect --backend xdp`: every frame
//! is turned around in the driver and sent back out of the interface it came in on (`XDP_TX`),
//! no user space at all. The same swaps as `flowlane_wire::forward::reflect`: the MACs always,
//! addresses and UDP/TCP ports when asked — checksums stay valid untouched, since swapping two
//! fields of one checksum's coverage leaves its sum as it was.
//!
//! Checksums a sender on this host left to offload are completed where the frame is
//! (`super::csum`); a segment longer than the program sums is dropped and counted
//! ([`reflect_stats::UNFINISHED`]), never sent back with a checksum the peer would reject.

use super::csum::{complete_counted, CsumRegs};
use super::*;

/// The reflector's counters: indices into a per-CPU array of u64 (`PerCpuCounters`: each CPU
/// adds to its own copy, no atomic).
pub mod reflect_stats {
    /// Frames sent back (`XDP_TX`).
    pub const REFLECTED: usize = 0;
    /// Frames that are not IPv4/IPv6, where addresses or ports are swapped.
    pub const NOT_IP: usize = 1;
    /// Frames too short for their headers.
    pub const MALFORMED: usize = 2;
    /// Of the reflected frames, those whose checksum left to offload was completed.
    pub const COMPLETED: usize = 3;
    /// Frames left to offload whose segment is longer than the program sums: dropped.
    pub const UNFINISHED: usize = 4;
    /// How many counters.
    pub const COUNT: usize = 5;
}

/// What the reflector program is generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reflect {
    /// Per-CPU array of [`reflect_stats::COUNT`] u64 counters.
    pub stats_fd: i32,
    /// Swap source and destination IP addresses.
    pub swap_ip: bool,
    /// Swap source and destination UDP/TCP ports.
    pub swap_ports: bool,
    /// Hand frames that are not IP to the kernel (`XDP_PASS`) instead of dropping them.
    pub pass_not_ip: bool,
    /// Complete UDP/TCP checksums left to offload (see the module's comment).
    pub complete_checksums: bool,
}

/// Adds 1 to counter `which` of the running CPU's copy (clobbers R0–R5).
fn count(a: &mut Asm, stats_fd: i32, which: usize) {
    count_percpu(a, stats_fd, which);
}

/// Swaps the `width`-byte fields at `x` and `y` of the packet pointed to by `base` (clobbers
/// R1, R2). The caller has checked both lie inside the frame.
fn swap(a: &mut Asm, base: Reg, size: Size, x: i16, y: i16) {
    a.load(size, R1, base, x)
        .load(size, R2, base, y)
        .store(size, base, x, R2)
        .store(size, base, y, R1);
}

/// The reflector: see the module's comment. Frames too short for what is swapped are dropped
/// and counted (malformed); frames that are not IP, when addresses or ports are swapped, are
/// counted and passed to the kernel or dropped as [`Reflect::pass_not_ip`] says. An 802.1Q tag
/// is stepped over.
///
/// Long: a BPF program assembled instruction by instruction in the order the verifier reads it;
/// split into parts, the registers each part expects would be hidden.
pub fn reflect_program(p: &Reflect) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let malformed = a.label();
    let not_ip = a.label();
    let macs = a.label();
    // R6 = data, R7 = data_end, R8 = the IP header.
    a.load(Size::W, R6, R1, xdp_md::DATA)
        .load(Size::W, R7, R1, xdp_md::DATA_END)
        .mov(R1, R6)
        .alu_imm(Alu::Add, R1, 14)
        .jump_reg(Cond::Gt, R1, R7, malformed);
    let swapping = p.swap_ip || p.swap_ports;
    // With only the MACs swapped every frame is reflected: what the checksum step cannot
    // read goes on to the MACs, as it would without it.
    let (bad, non_ip) = if swapping {
        (malformed, not_ip)
    } else {
        (macs, macs)
    };
    let unfinished = a.label();
    let regs = CsumRegs {
        base: R8,
        ip_off: 0,
        end: R7,
        acc: R9,
    };
    let completions = |a: &mut Asm, v6: bool| {
        let stats = p.stats_fd;
        complete_counted(
            a,
            &regs,
            v6,
            Some(bad),
            unfinished,
            stats,
            reflect_stats::COMPLETED,
        );
    };
    if swapping || p.complete_checksums {
        let untagged = a.label();
        let v6 = a.label();
        a.mov(R8, R6)
            .alu_imm(Alu::Add, R8, 14)
            .load(Size::H, R3, R6, 12)
            // EtherTypes as loaded (network order read little-endian): 802.1Q 0x8100.
            .jump_imm(Cond::Ne, R3, 0x0081, untagged)
            .mov(R1, R6)
            .alu_imm(Alu::Add, R1, 18)
            .jump_reg(Cond::Gt, R1, R7, bad)
            .load(Size::H, R3, R6, 16)
            .alu_imm(Alu::Add, R8, 4)
            .bind(untagged)
            .jump_imm(Cond::Eq, R3, 0xdd86, v6)
            .jump_imm(Cond::Ne, R3, 0x0008, non_ip)
            // IPv4: the fixed header must be there.
            .mov(R1, R8)
            .alu_imm(Alu::Add, R1, 20)
            .jump_reg(Cond::Gt, R1, R7, bad);
        if p.complete_checksums {
            completions(&mut a, false);
        }
        if p.swap_ip {
            swap(&mut a, R8, Size::W, 12, 16);
        }
        if p.swap_ports {
            // Unfragmented or first fragment (offset 0), UDP or TCP: ports at IHL * 4.
            let v4_ports = a.label();
            a.load(Size::H, R3, R8, 6)
                .jump_imm(Cond::Set, R3, 0xff1f, macs)
                .load(Size::B, R3, R8, 9)
                .jump_imm(Cond::Eq, R3, 17, v4_ports)
                .jump_imm(Cond::Ne, R3, 6, macs)
                .bind(v4_ports)
                .load(Size::B, R4, R8, 0)
                .alu_imm(Alu::And, R4, 0x0f)
                .alu_imm(Alu::Lsh, R4, 2)
                .jump_imm(Cond::Lt, R4, 20, malformed)
                .alu_reg(Alu::Add, R4, R8)
                .mov(R1, R4)
                .alu_imm(Alu::Add, R1, 4)
                .jump_reg(Cond::Gt, R1, R7, malformed);
            swap(&mut a, R4, Size::H, 0, 2);
        }
        a.jump(macs);
        // IPv6: addresses at 8 and 24, ports right after the fixed header.
        a.bind(v6)
            .mov(R1, R8)
            .alu_imm(Alu::Add, R1, 40)
            .jump_reg(Cond::Gt, R1, R7, bad);
        if p.complete_checksums {
            completions(&mut a, true);
        }
        if p.swap_ip {
            swap(&mut a, R8, Size::Dw, 8, 24);
            swap(&mut a, R8, Size::Dw, 16, 32);
        }
        if p.swap_ports {
            let v6_ports = a.label();
            a.load(Size::B, R3, R8, 6)
                .jump_imm(Cond::Eq, R3, 17, v6_ports)
                .jump_imm(Cond::Ne, R3, 6, macs)
                .bind(v6_ports)
                .mov(R1, R8)
                .alu_imm(Alu::Add, R1, 44)
                .jump_reg(Cond::Gt, R1, R7, malformed);
            swap(&mut a, R8, Size::H, 40, 42);
        }
    }
    a.bind(macs);
    swap(&mut a, R6, Size::W, 0, 6);
    swap(&mut a, R6, Size::H, 4, 10);
    count(&mut a, p.stats_fd, reflect_stats::REFLECTED);
    a.mov_imm(R0, xdp::TX).exit();
    if p.complete_checksums {
        a.bind(unfinished);
        count(&mut a, p.stats_fd, reflect_stats::UNFINISHED);
        a.mov_imm(R0, xdp::DROP).exit();
    }
    // Only reachable when the IP header is looked at (the verifier refuses dead code).
    if swapping {
        a.bind(not_ip);
        count(&mut a, p.stats_fd, reflect_stats::NOT_IP);
        a.mov_imm(R0, if p.pass_not_ip { xdp::PASS } else { xdp::DROP })
            .exit();
    }
    a.bind(malformed);
    count(&mut a, p.stats_fd, reflect_stats::MALFORMED);
    a.mov_imm(R0, xdp::DROP).exit();
    a.finish()
}

// Tested where the library's reflect is at hand: `tools::forward::xdp`'s tests run every
// variant through the verifier and BPF_PROG_TEST_RUN against `flowlane_wire::forward`.
