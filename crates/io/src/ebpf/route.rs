//! The XDP-native router behind `flowlane forward --mode route --backend xdp`: port `i` runs
//! this program generated for its own MAC. A unicast IPv4 frame to that MAC is looked up in a
//! DIR-24-8 table built by the lpm crate (two array maps: the verifier inlines both lookups),
//! an IPv6 one in the kernel's LPM trie (one of two, see [`XdpRoute::trie6_fds`]); its next
//! hop is read from an array (port, MTU, the next hop's MAC and the port's), its MACs
//! rewritten, its TTL decremented with the checksum updated as the kernel's
//! `ip_decrease_ttl` does (IPv6: the hop limit, no checksum), and it is redirected out of its
//! port through a device map; a UDP/TCP checksum a sender on this host left to offload is
//! completed on the way (`super::csum`). Everything else — ARP, neighbour discovery, multicast, IPv4
//! with options, IPv6 to link-local addresses, frames to another MAC or to one of this host's
//! addresses (a host route to a [`route_hop::HOST`] entry) — is passed to the kernel,
//! counted. No user space on the path.

use super::csum::{complete_counted, UNTAGGED_R7};
use super::*;

/// The router's counters: indices into a per-CPU array of u64 (`PerCpuCounters`).
pub mod route_stats {
    /// Frames routed (redirected out of their port).
    pub const FORWARDED: usize = 0;
    /// Frames passed to the kernel: not unicast IP to this port's MAC, IPv4 with options, IPv6
    /// to a link-local address, or to one of this host's own addresses.
    pub const PASSED: usize = 1;
    /// No route (or a route to nowhere: a blackhole, another interface).
    pub const NO_ROUTE: usize = 2;
    /// A route whose next hop has no MAC.
    pub const NO_NEIGHBOUR: usize = 3;
    /// TTL (IPv6: hop limit) 1 or 0.
    pub const TTL_EXCEEDED: usize = 4;
    /// Larger than the outgoing port's MTU.
    pub const TOO_BIG: usize = 5;
    /// Shorter than its headers.
    pub const MALFORMED: usize = 6;
    /// Of the routed frames, those whose UDP/TCP checksum left to offload was completed.
    pub const COMPLETED: usize = 7;
    /// Left to offload over a segment longer than the program sums: dropped.
    pub const UNFINISHED: usize = 8;
    /// How many counters.
    pub const COUNT: usize = 9;
}

/// The next-hop array's layout: 24 bytes per next hop.
pub mod route_hop {
    /// Bytes per entry.
    pub const SIZE: usize = 24;
    /// u32: the port (device map index), or [`NO_NEIGHBOUR`] / [`NOWHERE`].
    pub const PORT: usize = 0;
    /// u32: the port's MTU.
    pub const MTU: usize = 4;
    /// 6 bytes: the next hop's MAC (then 2 bytes of padding).
    pub const DST_MAC: usize = 8;
    /// 6 bytes: the port's own MAC.
    pub const SRC_MAC: usize = 16;
    /// `PORT` of a next hop without a MAC.
    pub const NO_NEIGHBOUR: u32 = u32::MAX;
    /// `PORT` of a next hop nowhere (blackhole, another interface).
    pub const NOWHERE: u32 = u32::MAX - 1;
    /// `PORT` of this host's own addresses: the frame is passed to the kernel.
    pub const HOST: u32 = u32::MAX - 2;
}

/// What one port's program is generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpRoute {
    /// Array of 2^24 u32: DIR-24-8's first table.
    pub tbl24_fd: i32,
    /// Array of u32: its second-level groups.
    pub tbl8_fd: i32,
    /// Array of [`route_hop::SIZE`]-byte next hops.
    pub hops_fd: i32,
    /// Two IPv6 LPM tries (`LpmTrie6`) of next-hop indices, and an array of one u32 saying
    /// which is in use (0 or 1): the table is rebuilt in the other and switched with one
    /// store, so no lookup meets it half changed.
    pub trie6_fds: [i32; 2],
    /// Array of one u32: which of `trie6_fds` IPv6 lookups use.
    pub half_fd: i32,
    /// `BPF_MAP_TYPE_DEVMAP`: port → ifindex.
    pub ports_fd: i32,
    /// Per-CPU array of [`route_stats::COUNT`] u64.
    pub stats_fd: i32,
    /// This port's MAC: frames to another are not routed.
    pub mac: [u8; 6],
}

/// `R0 = &map[R2]` (a u32 index in R2), or to `none`. Clobbers R1–R5.
fn lookup(a: &mut Asm, map_fd: i32, none: Label) {
    a.store(Size::W, R10, -4, R2)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, map_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, none);
}

/// Where the shared tail jumps for a verdict.
struct Drops {
    pass: Label,
    no_route: Label,
    no_neigh: Label,
    too_big: Label,
    unfinished: Label,
}

/// From a next-hop index in R2 to the redirect: the next hop's entry, its verdicts, the MTU,
/// the MACs, the TTL (IPv4, with the checksum as the kernel's `ip_decrease_ttl`) or hop limit
/// (IPv6, no checksum) one lower, counted and redirected out of its port.
fn tail(a: &mut Asm, p: &XdpRoute, v6: bool, d: &Drops) {
    lookup(a, p.hops_fd, d.no_route);
    // R9 = the next hop, R6 = its port.
    a.mov(R9, R0)
        .load(Size::W, R6, R9, route_hop::PORT as i16)
        .load_imm64(R1, u64::from(route_hop::NO_NEIGHBOUR))
        .jump_reg(Cond::Eq, R6, R1, d.no_neigh)
        .load_imm64(R1, u64::from(route_hop::NOWHERE))
        .jump_reg(Cond::Eq, R6, R1, d.no_route)
        .load_imm64(R1, u64::from(route_hop::HOST))
        .jump_reg(Cond::Eq, R6, R1, d.pass)
        .mov(R1, R8)
        .alu_reg(Alu::Sub, R1, R7)
        .alu_imm(Alu::Add, R1, -14)
        .load(Size::W, R2, R9, route_hop::MTU as i16)
        .jump_reg(Cond::Gt, R1, R2, d.too_big)
        // The MACs: the next hop's, the port's.
        .load(Size::W, R1, R9, route_hop::DST_MAC as i16)
        .store(Size::W, R7, 0, R1)
        .load(Size::H, R1, R9, route_hop::DST_MAC as i16 + 4)
        .store(Size::H, R7, 4, R1)
        .load(Size::W, R1, R9, route_hop::SRC_MAC as i16)
        .store(Size::W, R7, 6, R1)
        .load(Size::H, R1, R9, route_hop::SRC_MAC as i16 + 4)
        .store(Size::H, R7, 10, R1);
    if v6 {
        a.load(Size::B, R1, R7, 21)
            .alu_imm(Alu::Add, R1, -1)
            .store(Size::B, R7, 21, R1);
    } else {
        // TTL − 1, and the checksum as ip_decrease_ttl: + htons(0x0100), end-around carry.
        a.load(Size::B, R1, R7, 22)
            .alu_imm(Alu::Add, R1, -1)
            .store(Size::B, R7, 22, R1);
        let carry = a.label();
        a.load(Size::H, R1, R7, 24)
            .alu_imm(Alu::Add, R1, 1)
            .jump_imm(Cond::Lt, R1, 0xffff, carry)
            .alu_imm(Alu::Add, R1, 1)
            .bind(carry)
            .store(Size::H, R7, 24, R1);
    }
    // A checksum a sender here left to offload, completed (`super::csum`); headers it cannot
    // read are routed as they are, as the user-space router does. R9 is free by now.
    let (stats, done) = (p.stats_fd, route_stats::COMPLETED);
    complete_counted(a, &UNTAGGED_R7, v6, None, d.unfinished, stats, done);
    count_percpu(a, p.stats_fd, route_stats::FORWARDED);
    a.mov(R2, R6)
        .load_map_fd(R1, p.ports_fd)
        .mov_imm(R3, 0)
        .call(Helper::RedirectMap)
        .exit();
}

/// One port's program: see the module's comment.
///
/// Long: a BPF program assembled instruction by instruction in the order the verifier reads it;
/// split into parts, the registers each part expects would be hidden.
pub fn route_program(p: &XdpRoute) -> Result<Vec<Insn>, AsmError> {
    use route_stats::*;
    let mut a = Asm::new();
    let (pass, malformed, no_route, no_neigh, ttl, too_big) = (
        a.label(),
        a.label(),
        a.label(),
        a.label(),
        a.label(),
        a.label(),
    );
    let unfinished = a.label();
    let drops = Drops {
        pass,
        no_route,
        no_neigh,
        too_big,
        unfinished,
    };
    let direct = a.label();
    let (have_hop, v6) = (a.label(), a.label());
    let mac_lo = u32::from_le_bytes([p.mac[0], p.mac[1], p.mac[2], p.mac[3]]);
    let mac_hi = u16::from_le_bytes([p.mac[4], p.mac[5]]);
    // R7 = data, R8 = data_end.
    a.load(Size::W, R7, R1, xdp_md::DATA)
        .load(Size::W, R8, R1, xdp_md::DATA_END)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 14)
        .jump_reg(Cond::Gt, R1, R8, malformed)
        // To this port's MAC; IPv6 (0x86dd as loaded little-endian) or IPv4 (0x0800).
        .load(Size::W, R1, R7, 0)
        .load_imm64(R2, u64::from(mac_lo))
        .jump_reg(Cond::Ne, R1, R2, pass)
        .load(Size::H, R1, R7, 4)
        .jump_imm(Cond::Ne, R1, i32::from(mac_hi), pass)
        .load(Size::H, R1, R7, 12)
        .jump_imm(Cond::Eq, R1, 0xdd86, v6)
        .jump_imm(Cond::Ne, R1, 0x0008, pass)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 34)
        .jump_reg(Cond::Gt, R1, R8, malformed)
        // Version 4, no options; TTL above 1.
        .load(Size::B, R1, R7, 14)
        .jump_imm(Cond::Ne, R1, 0x45, pass)
        .load(Size::B, R1, R7, 22)
        .jump_imm(Cond::Le, R1, 1, ttl)
        // R9 = the destination, host order.
        .load(Size::W, R9, R7, 30)
        .to_be(R9, 32)
        .mov(R2, R9)
        .alu_imm(Alu::Rsh, R2, 8);
    lookup(&mut a, p.tbl24_fd, no_route);
    a.load(Size::W, R2, R0, 0)
        .jump_imm(Cond::Eq, R2, 0x7fff_ffff, no_route)
        .jump_imm(Cond::Set, R2, i32::MIN, direct)
        .jump(have_hop)
        .bind(direct)
        .alu_imm(Alu::And, R2, 0x7fff_ffff)
        .alu_imm(Alu::Lsh, R2, 8)
        .mov(R1, R9)
        .alu_imm(Alu::And, R1, 0xff)
        .alu_reg(Alu::Or, R2, R1);
    lookup(&mut a, p.tbl8_fd, no_route);
    // (Loaded u32 values are zero-extended: compared with 64-bit registers, not immediates,
    // which are sign-extended.)
    a.load(Size::W, R2, R0, 0)
        .load_imm64(R1, u64::from(u32::MAX))
        .jump_reg(Cond::Eq, R2, R1, no_route)
        .bind(have_hop);
    tail(&mut a, p, false, &drops);
    // IPv6: a whole header; link-local destinations are the kernel's (multicast ones came to
    // a multicast MAC, not this port's); hop limit above 1.
    let (trie1, key_done) = (a.label(), a.label());
    a.bind(v6)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 54)
        .jump_reg(Cond::Gt, R1, R8, malformed)
        .load(Size::B, R1, R7, 14)
        .alu_imm(Alu::And, R1, 0xf0)
        .jump_imm(Cond::Ne, R1, 0x60, pass)
        .load(Size::B, R1, R7, 38)
        .jump_imm(Cond::Eq, R1, 0xff, pass);
    let not_link_local = a.label();
    a.jump_imm(Cond::Ne, R1, 0xfe, not_link_local)
        .load(Size::B, R1, R7, 39)
        .alu_imm(Alu::And, R1, 0xc0)
        .jump_imm(Cond::Eq, R1, 0x80, pass)
        .bind(not_link_local)
        .load(Size::B, R1, R7, 21)
        .jump_imm(Cond::Le, R1, 1, ttl)
        // The trie's key on the stack at R10 − 24: length 128, then the destination.
        .store_imm(Size::W, R10, -24, 128);
    for k in 0..4i16 {
        a.load(Size::W, R1, R7, 38 + 4 * k)
            .store(Size::W, R10, -20 + 4 * k, R1);
    }
    // Which of the two tries is in use (see `XdpRoute::trie6_fds`).
    a.mov_imm(R2, 0);
    lookup(&mut a, p.half_fd, no_route);
    a.load(Size::W, R1, R0, 0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -24)
        .jump_imm(Cond::Ne, R1, 0, trie1)
        .load_map_fd(R1, p.trie6_fds[0])
        .jump(key_done)
        .bind(trie1)
        .load_map_fd(R1, p.trie6_fds[1])
        .bind(key_done)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, no_route)
        .load(Size::W, R2, R0, 0);
    tail(&mut a, p, true, &drops);
    for (l, which, verdict) in [
        (pass, PASSED, xdp::PASS),
        (malformed, MALFORMED, xdp::DROP),
        (no_route, NO_ROUTE, xdp::DROP),
        (no_neigh, NO_NEIGHBOUR, xdp::DROP),
        (ttl, TTL_EXCEEDED, xdp::DROP),
        (too_big, TOO_BIG, xdp::DROP),
        (unfinished, UNFINISHED, xdp::DROP),
    ] {
        a.bind(l);
        count_percpu(&mut a, p.stats_fd, which);
        a.mov_imm(R0, verdict).exit();
    }
    a.finish()
}
