//! The XDP-native bridge behind `flowlane forward --mode bridge --backend xdp`: every port runs
//! this program, which learns the source MAC of each frame into a hash map (MAC → the
//! interface it came in by, and when), looks the destination MAC up there and redirects the
//! frame to that interface through a device map — or, for broadcast, multicast and unknown
//! destinations, to every port but the one it came in by (`BPF_F_BROADCAST |
//! BPF_F_EXCLUDE_INGRESS`, Linux 5.15+). A frame whose destination is on its own port is
//! dropped (filtered). No user space on the path; user space only ages the table.
//!
//! Learning writes the map only when something changed — a new MAC, a move, or a new time
//! unit (2^30 ns, about a second) — so the steady state reads it and writes nothing.

use super::*;

/// Layout of the bridge's counters: an array of u64, [`bridge_stats::SLOT`] per CPU.
pub mod bridge_stats {
    /// Frames redirected to the one port their destination is on.
    pub const FORWARDED: usize = 0;
    /// Frames sent to every other port.
    pub const FLOODED: usize = 1;
    /// Frames dropped: their destination is on the port they came in by.
    pub const FILTERED: usize = 2;
    /// Frames shorter than an Ethernet header.
    pub const MALFORMED: usize = 3;
    /// MACs learnt for the first time (or again after ageing).
    pub const LEARNED: usize = 4;
    /// Counters per CPU.
    pub const SLOT: usize = 8;
}

/// The table's time unit: `bpf_ktime_get_ns() >> BRIDGE_TIME_SHIFT` (CLOCK_MONOTONIC).
pub const BRIDGE_TIME_SHIFT: u32 = 30;

/// The maps the bridge program uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdpBridge {
    /// `BPF_MAP_TYPE_HASH`: 8-byte key (the MAC, two zero bytes) → 16-byte value (ifindex u32,
    /// 4 zero bytes, last seen u64 in time units).
    pub fdb_fd: i32,
    /// `BPF_MAP_TYPE_DEVMAP_HASH`: ifindex → ifindex, every port.
    pub ports_fd: i32,
    /// Counters, laid out as [`bridge_stats`].
    pub stats_fd: i32,
}

/// `BPF_F_BROADCAST | BPF_F_EXCLUDE_INGRESS`.
const FLOOD_FLAGS: i32 = (1 << 3) | (1 << 4);

/// Stores the 6-byte MAC at `data + off` as an 8-byte key at `R10 − 8` (clobbers R1).
fn mac_key(a: &mut Asm, data: Reg, off: i16) {
    a.load(Size::W, R1, data, off)
        .store(Size::W, R10, -8, R1)
        .load(Size::H, R1, data, off + 4)
        .store(Size::H, R10, -4, R1)
        .store_imm(Size::H, R10, -2, 0);
}

/// The bridge: see the module's comment.
pub fn bridge_program(p: &XdpBridge) -> Result<Vec<Insn>, AsmError> {
    use bridge_stats::*;
    let mut a = Asm::new();
    let malformed = a.label();
    let dst = a.label();
    let learn = a.label();
    let learn_new = a.label();
    let flood = a.label();
    let filtered = a.label();
    // R6 = ctx, R7 = data, R8 = ingress ifindex, R9 = now (time units).
    a.mov(R6, R1)
        .load(Size::W, R7, R6, xdp_md::DATA)
        .load(Size::W, R2, R6, xdp_md::DATA_END)
        .mov(R1, R7)
        .alu_imm(Alu::Add, R1, 14)
        .jump_reg(Cond::Gt, R1, R2, malformed)
        .load(Size::W, R8, R6, xdp_md::INGRESS_IFINDEX)
        .call(Helper::KtimeGetNs)
        .alu_imm(Alu::Rsh, R0, BRIDGE_TIME_SHIFT as i32)
        .mov(R9, R0)
        // A multicast source is not a station: not learnt.
        .load(Size::B, R1, R7, 6)
        .jump_imm(Cond::Set, R1, 1, dst);
    mac_key(&mut a, R7, 6);
    a.mov(R2, R10)
        .alu_imm(Alu::Add, R2, -8)
        .load_map_fd(R1, p.fdb_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, learn_new)
        .load(Size::W, R1, R0, 0)
        .jump_reg(Cond::Ne, R1, R8, learn)
        .load(Size::Dw, R1, R0, 8)
        .jump_reg(Cond::Ne, R1, R9, learn)
        .jump(dst)
        .bind(learn_new);
    count_per_cpu(&mut a, p.stats_fd, SLOT, LEARNED);
    // The key is still at R10 − 8 (the count used R10 − 4 … R10 − 1: write it again).
    mac_key(&mut a, R7, 6);
    a.bind(learn)
        .store(Size::W, R10, -24, R8)
        .store_imm(Size::W, R10, -20, 0)
        .store(Size::Dw, R10, -16, R9)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -8)
        .mov(R3, R10)
        .alu_imm(Alu::Add, R3, -24)
        .mov_imm(R4, 0) // BPF_ANY
        .load_map_fd(R1, p.fdb_fd)
        .call(Helper::MapUpdateElem)
        .bind(dst)
        .load(Size::B, R1, R7, 0)
        .jump_imm(Cond::Set, R1, 1, flood);
    mac_key(&mut a, R7, 0);
    a.mov(R2, R10)
        .alu_imm(Alu::Add, R2, -8)
        .load_map_fd(R1, p.fdb_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, flood)
        .load(Size::W, R1, R0, 0)
        .jump_reg(Cond::Eq, R1, R8, filtered)
        .store(Size::W, R10, -32, R1);
    count_per_cpu(&mut a, p.stats_fd, SLOT, FORWARDED);
    a.load(Size::W, R2, R10, -32)
        .load_map_fd(R1, p.ports_fd)
        .mov_imm(R3, 0)
        .call(Helper::RedirectMap)
        .exit()
        .bind(flood);
    count_per_cpu(&mut a, p.stats_fd, SLOT, FLOODED);
    a.load_map_fd(R1, p.ports_fd)
        .mov_imm(R2, 0)
        .mov_imm(R3, FLOOD_FLAGS)
        .call(Helper::RedirectMap)
        .exit()
        .bind(filtered);
    count_per_cpu(&mut a, p.stats_fd, SLOT, FILTERED);
    a.mov_imm(R0, xdp::DROP).exit().bind(malformed);
    count_per_cpu(&mut a, p.stats_fd, SLOT, MALFORMED);
    a.mov_imm(R0, xdp::DROP).exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::BridgeMaps;
    use crate::sys::bpf::{self, MappedArray};

    fn frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f
    }

    /// Against the kernel's verifier and test runner (needs CAP_BPF; skipped without it; a
    /// test run's frames come in by loopback, ifindex 1): a station is learnt, an unknown
    /// destination is flooded, a destination on the ingress port is filtered, and ageing
    /// forgets what it must.
    #[test]
    fn the_bridge_learns_floods_filters_and_ages() {
        let maps = match BridgeMaps::create(64) {
            Ok(m) => m,
            Err(e) if e.source.kind() == std::io::ErrorKind::PermissionDenied => {
                eprintln!("SKIP: needs CAP_BPF");
                return;
            }
            Err(e) => panic!("maps: {e}"),
        };
        maps.add_port(1).expect("lo is a port");
        let stats = MappedArray::new("fl_t_br", 1024 * bridge_stats::SLOT as u32).expect("stats");
        let (fdb_fd, ports_fd) = maps.fds();
        let insns = bridge_program(&XdpBridge {
            fdb_fd,
            ports_fd,
            stats_fd: stats.fd(),
        })
        .expect("assembles");
        let prog = bpf::prog_load(bpf::PROG_XDP, "fl_t_bridge", &insns).expect("verifier");
        let (a, b) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
        // A → B: A learnt, B unknown: flooded (a redirect).
        let (ret, _) = bpf::xdp_test_run(&prog, &frame(b, a)).expect("run");
        assert_eq!(ret, xdp::REDIRECT as u32);
        // B → A: B learnt, A is on the port this came in by: filtered.
        let (ret, _) = bpf::xdp_test_run(&prog, &frame(a, b)).expect("run");
        assert_eq!(ret, xdp::DROP as u32);
        // Broadcast: flooded. Again A → B: both known, on the ingress port: filtered.
        let (ret, _) = bpf::xdp_test_run(&prog, &frame([0xff; 6], a)).expect("run");
        assert_eq!(ret, xdp::REDIRECT as u32);
        let (ret, _) = bpf::xdp_test_run(&prog, &frame(b, a)).expect("run");
        assert_eq!(ret, xdp::DROP as u32);
        let total = |which: usize| -> u64 {
            (0..1024)
                .map(|c| stats.get(c * bridge_stats::SLOT + which))
                .sum()
        };
        assert_eq!(total(bridge_stats::LEARNED), 2);
        assert_eq!(total(bridge_stats::FLOODED), 2);
        assert_eq!(total(bridge_stats::FILTERED), 2);
        let mut e = maps.entries().expect("entries");
        e.sort_by_key(|e| e.mac);
        assert_eq!(
            e.iter().map(|e| (e.mac, e.ifindex)).collect::<Vec<_>>(),
            vec![(a, 1), (b, 1)]
        );
        let now = crate::sys::monotonic_ns() >> BRIDGE_TIME_SHIFT;
        assert_eq!(maps.age(now, 300).expect("age"), 0, "just seen");
        assert_eq!(maps.age(now + 301, 300).expect("age"), 2);
        assert!(maps.entries().expect("entries").is_empty());
    }
}
