//! `rss verify`'s XDP program: for each received frame, the hash the NIC computed (the
//! `bpf_xdp_metadata_rx_hash` kfunc, Linux 6.3+, a device-bound program), its type, the receive
//! queue (`rx_queue_index`) and the frame's addresses and ports, counted per distinct
//! (flow, queue, hash) in a hash map. Every frame passes on to the stack: it runs beside any
//! traffic. A flow whose frames all hashed and queued alike is one entry; one that did not is
//! several, so no frame's disagreement is averaged away.

use super::*;

/// The map key (56 bytes): what one frame showed.
pub mod verify_key {
    /// u32: the receive queue.
    pub const QUEUE: usize = 0;
    /// u32: the NIC's hash.
    pub const HASH: usize = 4;
    /// i32: the kfunc's return (0: a hash; negative errno: none, e.g. −ENODATA).
    pub const RC: usize = 8;
    /// u32: the hash's type (`XDP_RSS_TYPE_*`: L3/L4, IPv4/IPv6, TCP/UDP bits).
    pub const HASH_TYPE: usize = 12;
    /// u8: 4, 6, or 0 for a frame that is not IP.
    pub const FAMILY: usize = 16;
    /// u8: 1 when the ports were read (unfragmented UDP or TCP).
    pub const HAS_PORTS: usize = 17;
    /// u8: the IP protocol (IPv6: the first next header).
    pub const PROTO: usize = 18;
    /// Source and destination port, network order.
    pub const SPORT: usize = 20;
    pub const DPORT: usize = 22;
    /// Source and destination address (16 bytes each; IPv4 in the first 4).
    pub const SRC: usize = 24;
    pub const DST: usize = 40;
    /// Key bytes.
    pub const LEN: usize = 56;
}

/// `struct xdp_md`'s `rx_queue_index`.
const RX_QUEUE_INDEX: i16 = 16;
/// The key's place on the stack, and a u64 of value 1 below it.
const KEY: i16 = -64;
const ONE: i16 = -72;
/// A u32 zero: the index of the slot and of the full counter.
const ZERO: i16 = -80;
/// `BPF_NOEXIST`.
const NOEXIST: i32 = 1;

fn k(field: usize) -> i16 {
    KEY + field as i16
}

/// Copies `len` (a multiple of 4) frame bytes at `frame_off` (frame in R7, checked) into the key
/// at `field`; clobbers R3.
fn copy(a: &mut Asm, frame_off: i16, len: usize, field: usize) {
    for i in (0..len).step_by(4) {
        a.load(Size::W, R3, R7, frame_off + i as i16)
            .store(Size::W, R10, k(field) + i as i16, R3);
    }
}

/// The per-CPU slot of the last entry seen (index 0 of a per-CPU array, [`SLOT_LEN`] bytes):
/// its key, then its frames not yet added to the map. Frames of a flow come in bursts: a frame
/// with the slot's key only adds to the slot (no hash-map lookup, the costly step); a frame of
/// another entry first adds the slot's count to the map. Readers add the slots to the map's
/// counts (after detaching the program, so nothing moves while they read).
pub const SLOT_LEN: usize = verify_key::LEN + 8;

/// The program: map `flows_fd` (hash, [`verify_key::LEN`]-byte keys, u64 frame counts), the
/// per-CPU last-entry slot `slot_fd` (see [`SLOT_LEN`]); frames not counted because the map
/// was full add to the u64 at index 0 of array map `full_fd`. `rx_hash_kfunc`: the BTF id of
/// `bpf_xdp_metadata_rx_hash`, or `None` to run without the NIC's hash (the key's RC is then
/// −EOPNOTSUPP, −95).
pub fn rss_verify_program(
    flows_fd: i32,
    slot_fd: i32,
    full_fd: i32,
    rx_hash_kfunc: Option<u32>,
) -> Result<Vec<Insn>, AsmError> {
    use verify_key as key;
    let mut a = Asm::new();
    let (record, v4, v6, v4_addrs, v6_addrs) =
        (a.label(), a.label(), a.label(), a.label(), a.label());
    let (added, pass, again) = (a.label(), a.label(), a.label());
    a.mov(R6, R1);
    for o in (0..key::LEN).step_by(8) {
        a.store_imm(Size::Dw, R10, k(o), 0);
    }
    a.load(Size::W, R2, R6, RX_QUEUE_INDEX)
        .store(Size::W, R10, k(key::QUEUE), R2);
    match rx_hash_kfunc {
        Some(id) => {
            a.mov(R1, R6)
                .mov(R2, R10)
                .alu_imm(Alu::Add, R2, k(key::HASH) as i32)
                .mov(R3, R10)
                .alu_imm(Alu::Add, R3, k(key::HASH_TYPE) as i32)
                .call_kfunc(id)
                .store(Size::W, R10, k(key::RC), R0);
        }
        None => {
            a.store_imm(Size::W, R10, k(key::RC), -95);
        }
    }
    a.load(Size::W, R7, R6, xdp_md::DATA)
        .load(Size::W, R8, R6, xdp_md::DATA_END)
        .mov(R2, R7)
        .alu_imm(Alu::Add, R2, 14)
        .jump_reg(Cond::Gt, R2, R8, record)
        .load(Size::H, R3, R7, 12)
        .jump_imm(Cond::Eq, R3, 0x0008, v4)
        .jump_imm(Cond::Eq, R3, 0xdd86u32 as i32, v6)
        .jump(record);
    // IPv4: addresses at 26..34; ports at 34..38 for a 20-byte header, unfragmented UDP/TCP.
    a.bind(v4)
        .mov(R2, R7)
        .alu_imm(Alu::Add, R2, 34)
        .jump_reg(Cond::Gt, R2, R8, record)
        .store_imm(Size::B, R10, k(key::FAMILY), 4);
    copy(&mut a, 26, 4, key::SRC);
    copy(&mut a, 30, 4, key::DST);
    a.load(Size::B, R3, R7, 23)
        .store(Size::B, R10, k(key::PROTO), R3)
        .load(Size::B, R3, R7, 14)
        .jump_imm(Cond::Ne, R3, 0x45, record)
        .load(Size::H, R3, R7, 20)
        .alu_imm(Alu::And, R3, 0xff3f)
        .jump_imm(Cond::Ne, R3, 0, record)
        .load(Size::B, R3, R7, 23)
        .jump_imm(Cond::Eq, R3, 17, v4_addrs)
        .jump_imm(Cond::Eq, R3, 6, v4_addrs)
        .jump(record)
        .bind(v4_addrs)
        .mov(R2, R7)
        .alu_imm(Alu::Add, R2, 38)
        .jump_reg(Cond::Gt, R2, R8, record)
        .load(Size::H, R3, R7, 34)
        .store(Size::H, R10, k(key::SPORT), R3)
        .load(Size::H, R3, R7, 36)
        .store(Size::H, R10, k(key::DPORT), R3)
        .store_imm(Size::B, R10, k(key::HAS_PORTS), 1)
        .jump(record);
    // IPv6: addresses at 22..54; ports at 54..58 when the next header is UDP or TCP.
    a.bind(v6)
        .mov(R2, R7)
        .alu_imm(Alu::Add, R2, 54)
        .jump_reg(Cond::Gt, R2, R8, record)
        .store_imm(Size::B, R10, k(key::FAMILY), 6);
    copy(&mut a, 22, 16, key::SRC);
    copy(&mut a, 38, 16, key::DST);
    a.load(Size::B, R3, R7, 20)
        .store(Size::B, R10, k(key::PROTO), R3)
        .jump_imm(Cond::Eq, R3, 17, v6_addrs)
        .jump_imm(Cond::Eq, R3, 6, v6_addrs)
        .jump(record)
        .bind(v6_addrs)
        .mov(R2, R7)
        .alu_imm(Alu::Add, R2, 58)
        .jump_reg(Cond::Gt, R2, R8, record)
        .load(Size::H, R3, R7, 54)
        .store(Size::H, R10, k(key::SPORT), R3)
        .load(Size::H, R3, R7, 56)
        .store(Size::H, R10, k(key::DPORT), R3)
        .store_imm(Size::B, R10, k(key::HAS_PORTS), 1);
    // Count it in the CPU's slot when it is the slot's entry; else add the slot's count to
    // the map and make this entry the slot's.
    let (slot_miss, take, flush_added, flush_full) = (a.label(), a.label(), a.label(), a.label());
    let slow = a.label();
    a.bind(record)
        .store_imm(Size::W, R10, ZERO, 0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, ZERO as i32)
        .load_map_fd(R1, slot_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, slow)
        .mov(R9, R0);
    for w in (0..key::LEN as i16).step_by(8) {
        a.load(Size::Dw, R3, R9, w)
            .load(Size::Dw, R4, R10, KEY + w)
            .jump_reg(Cond::Ne, R3, R4, slot_miss);
    }
    a.load(Size::Dw, R3, R9, key::LEN as i16)
        .alu_imm(Alu::Add, R3, 1)
        .store(Size::Dw, R9, key::LEN as i16, R3)
        .jump(pass)
        .bind(slot_miss)
        .load(Size::Dw, R3, R9, key::LEN as i16)
        .jump_imm(Cond::Eq, R3, 0, take)
        .store(Size::Dw, R10, ONE, R3)
        .mov(R2, R9)
        .load_map_fd(R1, flows_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Ne, R0, 0, flush_added)
        .mov(R2, R9)
        .mov(R3, R10)
        .alu_imm(Alu::Add, R3, ONE as i32)
        .mov_imm(R4, NOEXIST)
        .load_map_fd(R1, flows_fd)
        .call(Helper::MapUpdateElem)
        .jump_imm(Cond::Eq, R0, 0, take)
        .mov(R2, R9)
        .load_map_fd(R1, flows_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, flush_full)
        .bind(flush_added)
        .load(Size::Dw, R3, R10, ONE)
        .atomic_add(Size::Dw, R0, 0, R3)
        .jump(take)
        .bind(flush_full)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, ZERO as i32)
        .load_map_fd(R1, full_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, take)
        .load(Size::Dw, R3, R10, ONE)
        .atomic_add(Size::Dw, R0, 0, R3)
        .bind(take);
    for w in (0..key::LEN as i16).step_by(8) {
        a.load(Size::Dw, R3, R10, KEY + w)
            .store(Size::Dw, R9, w, R3);
    }
    a.store_imm(Size::Dw, R9, key::LEN as i16, 1).jump(pass);
    // No slot (cannot happen with the array made here): count it in the map directly — add 1
    // to its entry, or make the entry (a race with another CPU making the same one is settled
    // by looking again); a full map is counted apart.
    a.bind(slow)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, KEY as i32)
        .load_map_fd(R1, flows_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Ne, R0, 0, added)
        .store_imm(Size::Dw, R10, ONE, 1)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, KEY as i32)
        .mov(R3, R10)
        .alu_imm(Alu::Add, R3, ONE as i32)
        .mov_imm(R4, NOEXIST)
        .load_map_fd(R1, flows_fd)
        .call(Helper::MapUpdateElem)
        .jump_imm(Cond::Eq, R0, 0, pass)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, KEY as i32)
        .load_map_fd(R1, flows_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Ne, R0, 0, added)
        .jump(again)
        .bind(added)
        .mov_imm(R1, 1)
        .atomic_add(Size::Dw, R0, 0, R1)
        .jump(pass)
        .bind(again)
        .store_imm(Size::W, R10, ZERO, 0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, ZERO as i32)
        .load_map_fd(R1, full_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, pass)
        .mov_imm(R1, 1)
        .atomic_add(Size::Dw, R0, 0, R1)
        .bind(pass)
        .mov_imm(R0, xdp::PASS)
        .exit();
    a.finish()
}
