//! The XDP-native reflector behind `flowlane forward --mode reflect --backend xdp`: every frame
//! is turned around in the driver and sent back out of the interface it came in on (`XDP_TX`),
//! no user space at all. The same swaps as `flowlane_wire::forward::reflect`: the MACs always,
//! addresses and UDP/TCP ports when asked — checksums stay valid untouched, since swapping two
//! fields of one checksum's coverage leaves its sum as it was.
//!
//! A frame a sender on this host left to checksum offload carries only the pseudo header's
//! sum in its UDP/TCP checksum (the device would add the rest; turned around, no device
//! does). XDP is not told which frames these are, so the program compares the field with the
//! pseudo header's sum and, where they match and the whole does not verify, sums the segment
//! and writes the checksum — as `flowlane_wire::forward::complete_partial` does. The loop is
//! bounded for the verifier (it walks it once per word): segments of up to
//! [`MAX_CSUM_WORDS`] words (a 1500-byte MTU's); a longer one is dropped and counted
//! ([`reflect_stats::UNFINISHED`]), never sent on with a checksum the peer would reject.

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

/// The longest UDP/TCP segment whose checksum the program completes, in 4-byte words (1504
/// bytes: a 1500-byte MTU's 1480 of IPv4, 1460 of IPv6). The verifier walks the bounded loop
/// once per word; twice this passed it too, but no frame of a 1500-byte link needs more.
pub const MAX_CSUM_WORDS: i32 = 376;

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

/// Where checksum completion goes on.
struct CsumExits {
    /// Nothing to complete, or nothing could be (not partial, a fragment, another protocol).
    next: Label,
    /// Headers that do not hold together.
    bad: Label,
    /// Partial, but longer than [`MAX_CSUM_WORDS`].
    unfinished: Label,
    /// Completed.
    completed: Label,
}

/// `r` folded to 16 bits `times` times (end-around carry; clobbers `tmp`).
fn fold16(a: &mut Asm, r: Reg, tmp: Reg, times: usize) {
    for _ in 0..times {
        a.mov(tmp, r)
            .alu_imm(Alu::Rsh, tmp, 16)
            .alu_imm(Alu::And, r, 0xffff)
            .alu_reg(Alu::Add, r, tmp);
    }
}

/// `r`'s 64 bits folded to 32 (clobbers `tmp`).
fn fold32(a: &mut Asm, r: Reg, tmp: Reg) {
    a.mov(tmp, r)
        .alu_imm(Alu::Rsh, tmp, 32)
        .alu_imm(Alu::Lsh, r, 32)
        .alu_imm(Alu::Rsh, r, 32)
        .alu_reg(Alu::Add, r, tmp);
}

/// Completes the checksum of one family and protocol where the sender left it to offload. On
/// entry R4 = the transport header (a packet pointer), R5 = the segment's length from the IP
/// header (< 65 536), R7 = data_end, R8 = the IP header with its fixed part in bounds.
/// Clobbers R0–R5 and R9; never falls through.
///
/// Everything is summed as loaded — little-endian words of network-order bytes — which is
/// the one's-complement sum with its bytes swapped, consistently: the pseudo header's
/// protocol and length are added swapped too, and the field is compared and stored as loaded.
fn complete_l4(a: &mut Asm, v6: bool, tcp: bool, x: &CsumExits) {
    let (hdr, off) = if tcp { (20, 16) } else { (8, 6) };
    let (words, tail, summed) = (a.label(), a.label(), a.label());
    a.jump_imm(Cond::Lt, R5, hdr, x.bad)
        .mov(R1, R4)
        .alu_imm(Alu::Add, R1, hdr)
        .jump_reg(Cond::Gt, R1, R7, x.bad)
        .load(Size::H, R0, R4, off);
    if !v6 && !tcp {
        // IPv4 UDP's 0 is "no checksum".
        a.jump_imm(Cond::Eq, R0, 0, x.next);
    }
    // The pseudo header: addresses, protocol, length.
    a.mov_imm(R3, 0);
    let addrs: &[i16] = if v6 {
        &[8, 12, 16, 20, 24, 28, 32, 36]
    } else {
        &[12, 16]
    };
    for &o in addrs {
        a.load(Size::W, R1, R8, o).alu_reg(Alu::Add, R3, R1);
    }
    a.mov(R1, R5)
        .to_be(R1, 16)
        .alu_reg(Alu::Add, R3, R1)
        .alu_imm(Alu::Add, R3, if tcp { 6 << 8 } else { 17 << 8 });
    fold32(a, R3, R1);
    fold16(a, R3, R1, 4);
    // Partial only if the field holds exactly the pseudo header's sum.
    a.jump_reg(Cond::Ne, R0, R3, x.next);
    // The segment as it is, field and all, onto the pseudo header's sum: R9. R1 walks it,
    // R2 is what is left, R3 counts words (the verifier's bound).
    a.mov(R9, R3)
        .mov(R1, R4)
        .mov(R2, R5)
        .mov_imm(R3, 0)
        .bind(words)
        .jump_imm(Cond::Lt, R2, 4, tail)
        .jump_imm(Cond::Ge, R3, MAX_CSUM_WORDS, x.unfinished)
        .mov(R0, R1)
        .alu_imm(Alu::Add, R0, 4)
        .jump_reg(Cond::Gt, R0, R7, x.bad)
        .load(Size::W, R0, R1, 0)
        .alu_reg(Alu::Add, R9, R0)
        .alu_imm(Alu::Add, R1, 4)
        .alu_imm(Alu::Sub, R2, 4)
        .alu_imm(Alu::Add, R3, 1)
        .jump(words)
        .bind(tail);
    // 0-3 bytes left: as a word loaded with zeros after them.
    for i in 0..3i16 {
        a.jump_imm(Cond::Eq, R2, i32::from(i), summed)
            .mov(R0, R1)
            .alu_imm(Alu::Add, R0, i32::from(i) + 1)
            .jump_reg(Cond::Gt, R0, R7, x.bad)
            .load(Size::B, R0, R1, i);
        if i > 0 {
            a.alu_imm(Alu::Lsh, R0, 8 * i32::from(i));
        }
        a.alu_reg(Alu::Add, R9, R0);
    }
    a.bind(summed);
    fold32(a, R9, R0);
    fold16(a, R9, R0, 4);
    // Valid as it is (the field equals the pseudo header's sum by chance): left alone.
    a.jump_imm(Cond::Eq, R9, 0xffff, x.next)
        // Without the field (its complement added), complemented: the checksum.
        .load(Size::H, R0, R4, off)
        .alu_imm(Alu::Xor, R0, 0xffff)
        .alu_reg(Alu::Add, R9, R0);
    fold16(a, R9, R0, 2);
    a.alu_imm(Alu::Xor, R9, 0xffff);
    if !tcp {
        // UDP sends a computed 0 as 0xffff.
        let nonzero = a.label();
        a.jump_imm(Cond::Ne, R9, 0, nonzero)
            .mov_imm(R9, 0xffff)
            .bind(nonzero);
    }
    a.store(Size::H, R4, off, R9).jump(x.completed);
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
    let completions = |a: &mut Asm, v6: bool| {
        let (completed, next, udp) = (a.label(), a.label(), a.label());
        let x = CsumExits {
            next,
            bad,
            unfinished,
            completed,
        };
        if v6 {
            // No extension headers: the transport header right after the fixed one.
            a.load(Size::B, R2, R8, 6)
                .mov(R4, R8)
                .alu_imm(Alu::Add, R4, 40)
                .load(Size::H, R5, R8, 4)
                .to_be(R5, 16);
        } else {
            // Not a fragment (offset 0, no more fragments): the checksum covers the whole.
            a.load(Size::H, R3, R8, 6)
                .jump_imm(Cond::Set, R3, 0xff3f, next)
                .load(Size::B, R2, R8, 9)
                .load(Size::B, R4, R8, 0)
                .alu_imm(Alu::And, R4, 0x0f)
                .alu_imm(Alu::Lsh, R4, 2)
                .jump_imm(Cond::Lt, R4, 20, bad)
                .load(Size::H, R5, R8, 2)
                .to_be(R5, 16)
                .jump_reg(Cond::Lt, R5, R4, bad)
                .alu_reg(Alu::Sub, R5, R4)
                .alu_reg(Alu::Add, R4, R8);
        }
        a.jump_imm(Cond::Eq, R2, 17, udp)
            .jump_imm(Cond::Ne, R2, 6, next);
        complete_l4(a, v6, true, &x);
        a.bind(udp);
        complete_l4(a, v6, false, &x);
        a.bind(completed);
        count(a, p.stats_fd, reflect_stats::COMPLETED);
        a.bind(next);
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
