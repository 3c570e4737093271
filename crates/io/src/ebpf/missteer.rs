//! The mis-steering detector: a socket filter counting datagrams processed on another CPU.

use super::*;

/// Offsets into `struct __sk_buff` (the socket-filter context), from `linux/bpf.h`.
pub mod sk_buff {
    /// `len`: bytes in the packet from the network header on (u32).
    pub const LEN: i16 = 0;
    /// `queue_mapping`: receive queue the packet arrived on (u32).
    pub const QUEUE_MAPPING: i16 = 12;
    /// `gso_segs`: datagrams in a GRO-coalesced packet, 0 or 1 for a plain one (u32).
    pub const GSO_SEGS: i16 = 164;
}

/// The mis-steering detector, a socket filter for the socket of the worker on `cpu`: a packet
/// that the kernel processed on any other CPU adds its datagram count (`gso_segs`, at least 1)
/// to the u64 at index 0 of the array map `map_fd`. Every packet is accepted whole.
pub fn missteer_filter(cpu: u32, map_fd: i32) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let accept = a.label();
    let one = a.label();
    a.mov(R6, R1)
        .call(Helper::GetSmpProcessorId)
        .jump_imm(Cond::Eq, R0, cpu as i32, accept)
        .load(Size::W, R7, R6, sk_buff::GSO_SEGS)
        .jump_imm(Cond::Ne, R7, 0, one)
        .mov_imm(R7, 1)
        .bind(one)
        .store_imm(Size::W, R10, -8, 0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -8)
        .load_map_fd(R1, map_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, accept)
        .atomic_add(Size::Dw, R0, 0, R7)
        .bind(accept)
        .load(Size::W, R0, R6, sk_buff::LEN)
        .exit();
    a.finish()
}
