//! Completing a UDP/TCP checksum a sender left to offload, in generated XDP code — shared by
//! the reflector, the router and the bridge. A frame a sender on this host left to checksum
//! offload carries only the pseudo header's sum in its checksum (the device would add the
//! rest; forwarded by XDP, no device does). XDP is not told which frames these are, so the
//! program compares the field with the pseudo header's sum and, where they match, sums the
//! segment and writes the checksum (or, where the whole already verifies, leaves it) — as
//! `flowlane_wire::forward::complete_partial` does. The loop is bounded for the verifier (it
//! walks it once per word): segments of up to [`MAX_CSUM_WORDS`] words; the caller drops a
//! longer one and counts it, never sending it on with a checksum the peer would reject.

use super::*;

/// The longest UDP/TCP segment whose checksum the program completes, in 4-byte words (1504
/// bytes: a 1500-byte MTU's 1480 of IPv4, 1460 of IPv6). The verifier walks the bounded loop
/// once per word, for every copy of the code (one per family and protocol at each call).
pub const MAX_CSUM_WORDS: i32 = 376;

/// The registers the code works with.
pub(crate) struct CsumRegs {
    /// A packet pointer the IP header lies at `ip_off` from (its fixed part checked in
    /// bounds by the caller).
    pub(crate) base: Reg,
    /// The IP header's offset from `base`.
    pub(crate) ip_off: i16,
    /// data_end.
    pub(crate) end: Reg,
    /// A callee-saved register the code may clobber (the segment's sum).
    pub(crate) acc: Reg,
}

/// Where checksum completion goes on.
pub(crate) struct CsumExits {
    /// Nothing to complete, or nothing could be (not partial, a fragment, another protocol).
    pub(crate) next: Label,
    /// Headers that do not hold together.
    pub(crate) bad: Label,
    /// Partial, but longer than [`MAX_CSUM_WORDS`].
    pub(crate) unfinished: Label,
    /// Completed.
    pub(crate) completed: Label,
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
/// header (< 65 536), `r` as [`CsumRegs`] says. Clobbers R0–R5 and `r.acc`; never falls
/// through.
///
/// Everything is summed as loaded — little-endian words of network-order bytes — which is
/// the one's-complement sum with its bytes swapped, consistently: the pseudo header's
/// protocol and length are added swapped too, and the field is compared and stored as loaded.
fn complete_l4(a: &mut Asm, r: &CsumRegs, v6: bool, tcp: bool, x: &CsumExits) {
    let (hdr, off) = if tcp { (20, 16) } else { (8, 6) };
    let (words, tail, summed) = (a.label(), a.label(), a.label());
    a.jump_imm(Cond::Lt, R5, hdr, x.bad)
        .mov(R1, R4)
        .alu_imm(Alu::Add, R1, hdr)
        .jump_reg(Cond::Gt, R1, r.end, x.bad)
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
        a.load(Size::W, R1, r.base, r.ip_off + o)
            .alu_reg(Alu::Add, R3, R1);
    }
    a.mov(R1, R5)
        .to_be(R1, 16)
        .alu_reg(Alu::Add, R3, R1)
        .alu_imm(Alu::Add, R3, if tcp { 6 << 8 } else { 17 << 8 });
    fold32(a, R3, R1);
    fold16(a, R3, R1, 4);
    // Partial only if the field holds exactly the pseudo header's sum.
    a.jump_reg(Cond::Ne, R0, R3, x.next);
    // The segment as it is, field and all, onto the pseudo header's sum: r.acc. R1 walks it,
    // R2 is what is left, R3 counts words (the verifier's bound).
    a.mov(r.acc, R3)
        .mov(R1, R4)
        .mov(R2, R5)
        .mov_imm(R3, 0)
        .bind(words)
        .jump_imm(Cond::Lt, R2, 4, tail)
        .jump_imm(Cond::Ge, R3, MAX_CSUM_WORDS, x.unfinished)
        .mov(R0, R1)
        .alu_imm(Alu::Add, R0, 4)
        .jump_reg(Cond::Gt, R0, r.end, x.bad)
        .load(Size::W, R0, R1, 0)
        .alu_reg(Alu::Add, r.acc, R0)
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
            .jump_reg(Cond::Gt, R0, r.end, x.bad)
            .load(Size::B, R0, R1, i);
        if i > 0 {
            a.alu_imm(Alu::Lsh, R0, 8 * i32::from(i));
        }
        a.alu_reg(Alu::Add, r.acc, R0);
    }
    a.bind(summed);
    fold32(a, r.acc, R0);
    fold16(a, r.acc, R0, 4);
    // Complete as it came (the checksum equals the pseudo header's sum, 1 in 65 535): left
    // alone, and counted as `wire::forward::complete_partial` counts it.
    a.jump_imm(Cond::Eq, r.acc, 0xffff, x.completed)
        // Without the field (its complement added), complemented: the checksum.
        .load(Size::H, R0, R4, off)
        .alu_imm(Alu::Xor, R0, 0xffff)
        .alu_reg(Alu::Add, r.acc, R0);
    fold16(a, r.acc, R0, 2);
    a.alu_imm(Alu::Xor, r.acc, 0xffff);
    if !tcp {
        // UDP sends a computed 0 as 0xffff.
        let nonzero = a.label();
        a.jump_imm(Cond::Ne, r.acc, 0, nonzero)
            .mov_imm(r.acc, 0xffff)
            .bind(nonzero);
    }
    a.store(Size::H, R4, off, r.acc).jump(x.completed);
}

/// Completes the checksum of an IPv4 (`v6` false) or IPv6 frame's UDP or TCP segment where
/// the sender left it to offload; other protocols, fragments and IPv6 extension headers go
/// on to `x.next`. Clobbers R0–R5 and `r.acc`; never falls through.
pub(crate) fn complete_checksum(a: &mut Asm, r: &CsumRegs, v6: bool, x: &CsumExits) {
    let (udp, ip) = (a.label(), r.ip_off);
    if v6 {
        // No extension headers: the transport header right after the fixed one.
        a.load(Size::B, R2, r.base, ip + 6)
            .mov(R4, r.base)
            .alu_imm(Alu::Add, R4, i32::from(ip) + 40)
            .load(Size::H, R5, r.base, ip + 4)
            .to_be(R5, 16);
    } else {
        // Not a fragment (offset 0, no more fragments): the checksum covers the whole.
        a.load(Size::H, R3, r.base, ip + 6)
            .jump_imm(Cond::Set, R3, 0xff3f, x.next)
            .load(Size::B, R2, r.base, ip + 9)
            .load(Size::B, R4, r.base, ip)
            .alu_imm(Alu::And, R4, 0x0f)
            .alu_imm(Alu::Lsh, R4, 2)
            .jump_imm(Cond::Lt, R4, 20, x.bad)
            .load(Size::H, R5, r.base, ip + 2)
            .to_be(R5, 16)
            .jump_reg(Cond::Lt, R5, R4, x.bad)
            .alu_reg(Alu::Sub, R5, R4)
            .alu_reg(Alu::Add, R4, r.base)
            .alu_imm(Alu::Add, R4, i32::from(ip));
    }
    a.jump_imm(Cond::Eq, R2, 17, udp)
        .jump_imm(Cond::Ne, R2, 6, x.next);
    complete_l4(a, r, v6, true, x);
    a.bind(udp);
    complete_l4(a, r, v6, false, x);
}

/// [`complete_checksum`] with its ends tied: a completion counts `counter` in the per-CPU
/// array `stats_fd` and goes on, as does what needs none (and, `bad_goes_on`, headers it
/// cannot read; else those go to `bad`); a segment too long to sum goes to `unfinished`.
/// Falls through to what follows.
pub(crate) fn complete_counted(
    a: &mut Asm,
    r: &CsumRegs,
    v6: bool,
    bad: Option<Label>,
    unfinished: Label,
    stats_fd: i32,
    counter: usize,
) {
    let (completed, next) = (a.label(), a.label());
    let x = CsumExits {
        next,
        bad: bad.unwrap_or(next),
        unfinished,
        completed,
    };
    complete_checksum(a, r, v6, &x);
    a.bind(completed);
    count_percpu(a, stats_fd, counter);
    a.bind(next);
}

/// The registers of a program that keeps data in R7 and data_end in R8, with R9 free: the IP
/// header right after an untagged Ethernet header.
pub(crate) const UNTAGGED_R7: CsumRegs = CsumRegs {
    base: R7,
    ip_off: 14,
    end: R8,
    acc: R9,
};
