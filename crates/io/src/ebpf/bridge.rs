//! The XDP-native bridge behind `flowlane forward --mode bridge --backend xdp`: port `i` runs
//! this program generated for `i`; it learns the source MAC of each frame into the forwarding
//! table, looks the destination MAC up there and redirects the frame to that port through a
//! device map — or, for broadcast, multicast and unknown destinations, to every port but its
//! own (`BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS`, Linux 5.15+). A frame whose destination is
//! on its own port is dropped (filtered). A UDP/TCP checksum a sender on this host left to
//! offload is completed in a frame that leaves (`super::csum`). No user space on the path.
//!
//! The table is an array map, so the verifier inlines every lookup (no helper call): a MAC
//! hashes to one slot holding one 64-bit word — the MAC, its port and a "seen" bit — so an
//! entry is written whole or not at all. Learning writes only when the word would change (a
//! new station, a move, or the seen bit cleared since). A station whose slot another takes
//! is flooded to until it is heard again. Ageing is a clock sweep from user space
//! ([`crate::bpf::BridgeMaps::sweep`]): a slot seen since the last sweep loses its bit, one
//! not seen is emptied.

use super::csum::{complete_counted, UNTAGGED_R7};
use super::*;

/// The bridge's counters: indices into a per-CPU array of u64 (`PerCpuCounters`).
pub mod bridge_stats {
    /// Frames redirected to the one port their destination is on.
    pub const FORWARDED: usize = 0;
    /// Frames sent to every other port.
    pub const FLOODED: usize = 1;
    /// Frames dropped: their destination is on the port they came in by.
    pub const FILTERED: usize = 2;
    /// Frames shorter than an Ethernet header.
    pub const MALFORMED: usize = 3;
    /// Of the forwarded and flooded frames, those whose UDP/TCP checksum left to offload
    /// was completed.
    pub const COMPLETED: usize = 4;
    /// Left to offload over a segment longer than the program sums: dropped.
    pub const UNFINISHED: usize = 5;
    /// How many counters.
    pub const COUNT: usize = 6;
}

/// The forwarding table's layout.
pub mod fdb {
    /// Slots (a power of two).
    pub const SLOTS: u32 = 1 << 16;
    /// `word >> MAC_SHIFT` is the MAC (48 bits, as loaded from the frame).
    pub const MAC_SHIFT: u32 = 16;
    /// `(word >> PORT_SHIFT) & 0xff` is the port.
    pub const PORT_SHIFT: u32 = 8;
    /// Set in every used slot.
    pub const VALID: u64 = 1;
    /// Set when the station was heard since the last sweep.
    pub const SEEN: u64 = 2;
    /// The slot of a MAC (as the program loads it: the frame's first 4 bytes, then the next
    /// 2 above them, little-endian).
    pub fn slot(mac: u64) -> u32 {
        ((mac.wrapping_mul(HASH) >> 48) as u32) & (SLOTS - 1)
    }
    /// The multiplier of the slot hash.
    pub const HASH: u64 = 0x9E37_79B9_7F4A_7C15;
    /// A MAC's six bytes as the program loads them.
    pub fn mac_word(m: &[u8; 6]) -> u64 {
        u64::from(u32::from_le_bytes([m[0], m[1], m[2], m[3]]))
            | u64::from(u16::from_le_bytes([m[4], m[5]])) << 32
    }
    /// The MAC's six bytes from a word's MAC part.
    pub fn mac_bytes(mac: u64) -> [u8; 6] {
        let b = mac.to_le_bytes();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    }
}

/// What one port's program is generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpBridge {
    /// `BPF_MAP_TYPE_ARRAY` of [`fdb::SLOTS`] u64 words.
    pub fdb_fd: i32,
    /// `BPF_MAP_TYPE_DEVMAP`: port index → ifindex.
    pub ports_fd: i32,
    /// Counters: a per-CPU array of [`bridge_stats::COUNT`] u64.
    pub stats_fd: i32,
    /// The port this program runs on.
    pub port: u8,
}

/// `BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS`.
const FLOOD_FLAGS: i32 = (1 << 3) | (1 << 4);

/// `dst = the 6-byte MAC at data + off` as a word (clobbers R1).
fn mac_word(a: &mut Asm, dst: Reg, data: Reg, off: i16) {
    a.load(Size::W, dst, data, off)
        .load(Size::H, R1, data, off + 4)
        .alu_imm(Alu::Lsh, R1, 32)
        .alu_reg(Alu::Or, dst, R1);
}

/// `R0 = &fdb[slot(mac)]` for the MAC word in `mac`, or to `none` if the lookup fails (it
/// cannot: the index is masked; the verifier wants the check). Clobbers R1–R5.
fn fdb_slot(a: &mut Asm, fdb_fd: i32, mac: Reg, none: Label) {
    a.load_imm64(R2, fdb::HASH)
        .alu_reg(Alu::Mul, R2, mac)
        .alu_imm(Alu::Rsh, R2, 48)
        .alu_imm(Alu::And, R2, (fdb::SLOTS - 1) as i32)
        .store(Size::W, R10, -4, R2)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, fdb_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, none);
}

/// Where data_end is kept on the stack: a bridge needs every callee-saved register for the
/// table, and a checksum left to offload is completed only once a frame is known to leave.
const END_SLOT: i16 = -16;

/// Completes a UDP/TCP checksum left to offload in an untagged IPv4 or IPv6 frame (VLAN
/// frames and what the code cannot read leave as they are), counted; a segment too long to
/// sum goes to `unfinished`. R7 = data; clobbers R0–R5, R8, R9.
fn complete(a: &mut Asm, stats_fd: i32, unfinished: Label) {
    let (v6, next) = (a.label(), a.label());
    let done = bridge_stats::COMPLETED;
    a.load(Size::Dw, R8, R10, END_SLOT)
        .load(Size::H, R1, R7, 12)
        .jump_imm(Cond::Eq, R1, 0xdd86, v6)
        .jump_imm(Cond::Ne, R1, 0x0008, next)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 34)
        .jump_reg(Cond::Gt, R1, R8, next);
    complete_counted(a, &UNTAGGED_R7, false, None, unfinished, stats_fd, done);
    a.jump(next)
        .bind(v6)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 54)
        .jump_reg(Cond::Gt, R1, R8, next);
    complete_counted(a, &UNTAGGED_R7, true, None, unfinished, stats_fd, done);
    a.bind(next);
}

/// One port's program: see the module's comment.
pub fn bridge_program(p: &XdpBridge) -> Result<Vec<Insn>, AsmError> {
    use bridge_stats::*;
    let mut a = Asm::new();
    let malformed = a.label();
    let dst = a.label();
    let flood = a.label();
    let filtered = a.label();
    let unfinished = a.label();
    // R7 = data, R8 = the source word wanted in the table, R9 = the destination MAC.
    a.load(Size::W, R7, R1, xdp_md::DATA)
        .load(Size::W, R2, R1, xdp_md::DATA_END)
        .store(Size::Dw, R10, END_SLOT, R2)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 14)
        .jump_reg(Cond::Gt, R1, R2, malformed)
        // A multicast source is not a station: not learnt.
        .load(Size::B, R1, R7, 6)
        .jump_imm(Cond::Set, R1, 1, dst);
    mac_word(&mut a, R6, R7, 6);
    fdb_slot(&mut a, p.fdb_fd, R6, dst);
    a.mov(R8, R6)
        .alu_imm(Alu::Lsh, R8, fdb::MAC_SHIFT as i32)
        .alu_imm(
            Alu::Or,
            R8,
            (i32::from(p.port) << fdb::PORT_SHIFT) | (fdb::VALID | fdb::SEEN) as i32,
        )
        .load(Size::Dw, R1, R0, 0)
        .jump_reg(Cond::Eq, R1, R8, dst)
        .store(Size::Dw, R0, 0, R8)
        .bind(dst)
        .load(Size::B, R1, R7, 0)
        .jump_imm(Cond::Set, R1, 1, flood);
    mac_word(&mut a, R9, R7, 0);
    fdb_slot(&mut a, p.fdb_fd, R9, flood);
    // The slot must hold this MAC (another may have taken it).
    a.load(Size::Dw, R6, R0, 0)
        .mov(R1, R6)
        .alu_imm(Alu::Rsh, R1, fdb::MAC_SHIFT as i32)
        .jump_reg(Cond::Ne, R1, R9, flood)
        .jump_imm(Cond::Eq, R6, 0, flood)
        .alu_imm(Alu::Rsh, R6, fdb::PORT_SHIFT as i32)
        .alu_imm(Alu::And, R6, 0xff)
        .jump_imm(Cond::Eq, R6, i32::from(p.port), filtered);
    complete(&mut a, p.stats_fd, unfinished);
    count_percpu(&mut a, p.stats_fd, FORWARDED);
    a.mov(R2, R6)
        .load_map_fd(R1, p.ports_fd)
        .mov_imm(R3, 0)
        .call(Helper::RedirectMap)
        .exit()
        .bind(flood);
    complete(&mut a, p.stats_fd, unfinished);
    count_percpu(&mut a, p.stats_fd, FLOODED);
    a.load_map_fd(R1, p.ports_fd)
        .mov_imm(R2, 0)
        .mov_imm(R3, FLOOD_FLAGS)
        .call(Helper::RedirectMap)
        .exit()
        .bind(filtered);
    count_percpu(&mut a, p.stats_fd, FILTERED);
    a.mov_imm(R0, xdp::DROP).exit().bind(malformed);
    count_percpu(&mut a, p.stats_fd, MALFORMED);
    a.mov_imm(R0, xdp::DROP).exit().bind(unfinished);
    count_percpu(&mut a, p.stats_fd, UNFINISHED);
    a.mov_imm(R0, xdp::DROP).exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::bridge_stats::*;
    use super::*;
    use crate::maps::{BridgeMaps, PerCpuCounters};
    use crate::sys::bpf;

    fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f
    }

    /// Against the kernel's verifier and test runner (needs CAP_BPF; skipped without it; the
    /// test runs are port 0's program, its frames coming in by loopback): a station is
    /// learnt, an unknown destination is flooded, a destination on the ingress port is
    /// filtered, one on another port is forwarded, and sweeps age what was not heard.
    #[test]
    fn the_bridge_learns_floods_filters_forwards_and_ages() {
        let maps = match BridgeMaps::create() {
            Ok(m) => m,
            Err(e) if e.source.kind() == std::io::ErrorKind::PermissionDenied => {
                eprintln!("SKIP: needs CAP_BPF");
                return;
            }
            Err(e) => panic!("maps: {e}"),
        };
        maps.set_port(0, 1).expect("lo is port 0");
        maps.set_port(1, 1).expect("and port 1");
        let stats = PerCpuCounters::create("fl_t_br", COUNT as u32).expect("stats");
        let (fdb_fd, ports_fd) = maps.fds();
        let prog = |port| {
            let insns = bridge_program(&XdpBridge {
                fdb_fd,
                ports_fd,
                stats_fd: stats.raw_fd(),
                port,
            })
            .expect("assembles");
            bpf::prog_load(bpf::PROG_XDP, "fl_t_bridge", &insns).expect("verifier")
        };
        let (p0, p1) = (prog(0), prog(1));
        let (a, b) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
        let run = |p: &std::os::fd::OwnedFd, f: Vec<u8>| bpf::xdp_test_run(p, &f).expect("run").0;
        // A → B on port 0: A learnt on 0, B unknown: flooded (a redirect).
        assert_eq!(run(&p0, frame(b, a)), xdp::REDIRECT as u32);
        // B → A on port 1: B learnt on 1, A is on port 0: forwarded (a redirect).
        assert_eq!(run(&p1, frame(a, b)), xdp::REDIRECT as u32);
        // A → B on port 1 (A moved): B is on port 1: filtered.
        assert_eq!(run(&p1, frame(b, a)), xdp::DROP as u32);
        // Broadcast: flooded.
        assert_eq!(run(&p0, frame([0xff; 6], b)), xdp::REDIRECT as u32);
        let total = |which: usize| -> u64 { stats.per_cpu(which as u32).iter().sum() };
        assert_eq!(
            (total(FORWARDED), total(FLOODED), total(FILTERED)),
            (1, 2, 1)
        );
        let mut e = maps.entries().expect("entries");
        e.sort();
        // A last heard on port 1, B on port 0 (the broadcast came in there).
        assert_eq!(e, vec![(a, 1), (b, 0)]);
        assert_eq!(maps.sweep().expect("sweep"), 0, "both heard since");
        assert_eq!(run(&p0, frame([0xff; 6], a)), xdp::REDIRECT as u32);
        assert_eq!(
            maps.sweep().expect("sweep"),
            1,
            "B not heard since the last sweep"
        );
        assert_eq!(maps.entries().expect("entries"), vec![(a, 0)]);
    }

    #[test]
    fn macs_round_trip_through_words_and_spread_over_slots() {
        let m = [0x02, 0xf1, 0x0e, 0x00, 0x01, 0x02];
        assert_eq!(fdb::mac_bytes(fdb::mac_word(&m)), m);
        let slots: std::collections::HashSet<u32> = (0..1000u16)
            .map(|i| fdb::slot(fdb::mac_word(&[2, 0, 0, 0, (i >> 8) as u8, i as u8])))
            .collect();
        assert!(slots.len() > 990, "{}", slots.len());
    }
}
