//! Live frames: the XDP program `BPF_PROG_TEST_RUN` runs to stamp and send each frame.

use super::*;

/// Layout of one flow's entry in the live-frames generator's flow map (see
/// [`live_tx_program`]): the frame's first bytes up to the end of the flowlane header, as the
/// flow's template has them with sequence number and time 0, then the UDP checksum seed.
pub mod live_flow {
    /// Most header bytes an entry holds (Ethernet + VLAN + IPv6 + UDP + flowlane header = 82,
    /// rounded up to 8).
    pub const HDR_MAX: usize = 88;
    /// Byte offset of the seed: the one's complement of the template's UDP checksum field,
    /// read as a native-endian u16 (the sum of every other 16-bit word of the checksum's
    /// coverage), stored as a u32.
    pub const SEED: usize = HDR_MAX;
    /// Value size of the map.
    pub const VALUE_SIZE: usize = HDR_MAX + 8;
}

/// Layout of the paced generator's state (one entry of an array map, see [`live_tx_program`]):
/// native-endian u64s. Times are CLOCK_MONOTONIC; "fixed" values are in 1/1024 ns so rates
/// above 1 Mpps keep their precision (at 3 Mpps a whole-ns step would be 0.1 % off).
pub mod live_pace {
    /// Time origin, ns: the program paces on `(now − BASE) × 1024`.
    pub const BASE: usize = 0;
    /// When the next frame is due (fixed, since `BASE`); the program advances it.
    pub const NEXT: usize = 8;
    /// Time between frames (fixed).
    pub const STEP: usize = 16;
    /// How far `NEXT` may lag behind now (fixed): `STEP × (burst − 1)`, so after a stall at
    /// most one burst leaves at once and the rest of the credit is not banked.
    pub const SLACK: usize = 24;
    /// No frame leaves at or after this time (ns; `u64::MAX`: no deadline).
    pub const DEADLINE: usize = 32;
    /// No frame leaves once the counter has reached this (`u64::MAX`: no limit).
    pub const LIMIT: usize = 40;
    /// When the first frame left (ns), written by the program.
    pub const FIRST: usize = 48;
    /// When the latest frame left (ns), written by the program.
    pub const LAST: usize = 56;
    /// Value size of the map.
    pub const VALUE_SIZE: usize = 64;
}

/// What the live-frames generator program is generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveTx {
    /// Array map (one u64) counting the frames run; also the source of sequence numbers.
    pub counter_fd: i32,
    /// Array map of `flows` entries laid out as [`live_flow`].
    pub flows_fd: i32,
    /// Number of flows, at least 1: frame `n` belongs to flow `n % flows`.
    pub flows: u32,
    /// Header bytes copied from the flow's entry into each frame (even, at most
    /// [`live_flow::HDR_MAX`]); the frame run must be at least this long.
    pub hdr_len: usize,
    /// Offset of the flowlane header's sequence number in the frame (the 8-byte transmit time
    /// follows it).
    pub seq_off: usize,
    /// Offset of the UDP checksum in the frame.
    pub csum_off: usize,
    /// Paced: an array map of one [`live_pace`] entry. Each run first checks the deadline and
    /// the limit, then whether a frame is due; a run that may not send returns XDP_DROP
    /// without counting (in live-frames mode a dropped frame goes back to the page pool, a
    /// few ns). The run loop then spins at the rate the program can decide, so frames leave
    /// evenly spaced to within a batch, not in bursts of a whole kernel call.
    pub pace_fd: Option<i32>,
}

/// The generator of `flowlane blast --mode xdp-live`, run by `BPF_PROG_TEST_RUN` in
/// live-frames mode on copies of one frame. Each run takes a frame number `n` from the
/// counter (an atomic fetch-add), writes the headers of flow `n % flows` from its map entry
/// over the frame, stamps the flowlane header with sequence number `n / flows` and
/// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC, the clock the receivers compare with), updates the
/// UDP checksum for those 12 bytes (RFC 1624, through `bpf_csum_diff`), and returns XDP_TX.
/// With one program per sending thread, the flows of a thread get consecutive sequence
/// numbers and the counter says exactly how many frames the program released.
pub fn live_tx_program(p: &LiveTx) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let drop = a.label();
    let csum_nonzero = a.label();
    let (seq_off, csum_off) = (p.seq_off as i16, p.csum_off as i16);
    a.mov(R6, R1);
    if let Some(pace_fd) = p.pace_fd {
        pace_gate(&mut a, pace_fd, p.counter_fd, drop);
    }
    a
        // n = counter[0]++
        .store_imm(Size::W, R10, -4, 0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, p.counter_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, drop)
        .mov_imm(R7, 1)
        .atomic_fetch_add(Size::Dw, R0, 0, R7)
        // flow k = n % flows, sequence number n / flows
        .mov(R8, R7)
        .alu_imm(Alu::Mod, R8, p.flows.max(1) as i32)
        .alu_imm(Alu::Div, R7, p.flows.max(1) as i32)
        .store(Size::W, R10, -8, R8)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -8)
        .load_map_fd(R1, p.flows_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, drop)
        .mov(R9, R0)
        .call(Helper::KtimeGetNs)
        .mov(R8, R0)
        .load(Size::W, R2, R6, xdp_md::DATA)
        .load(Size::W, R3, R6, xdp_md::DATA_END)
        .mov(R6, R2)
        .alu_imm(Alu::Add, R2, p.hdr_len as i32)
        .jump_reg(Cond::Gt, R2, R3, drop);
    // The flow's headers, widest moves first.
    let mut off = 0usize;
    for (size, width) in [(Size::Dw, 8), (Size::W, 4), (Size::H, 2)] {
        while off + width <= p.hdr_len {
            a.load(size, R1, R9, off as i16)
                .store(size, R6, off as i16, R1);
            off += width;
        }
    }
    a.mov(R1, R7)
        .to_be(R1, 32)
        .store(Size::W, R6, seq_off, R1)
        .mov(R1, R8)
        .to_be(R1, 64)
        .store(Size::Dw, R6, seq_off + 4, R1)
        // checksum = ~fold(seed + sum(sequence, time))
        .load(Size::W, R5, R9, live_flow::SEED as i16)
        .mov_imm(R1, 0)
        .mov_imm(R2, 0)
        .mov(R3, R6)
        .alu_imm(Alu::Add, R3, seq_off as i32)
        .mov_imm(R4, 12)
        .call(Helper::CsumDiff);
    for _ in 0..2 {
        a.mov(R1, R0)
            .alu_imm(Alu::And, R1, 0xffff)
            .alu_imm(Alu::Rsh, R0, 16)
            .alu_reg(Alu::Add, R0, R1);
    }
    // A computed 0 is sent as 0xffff (RFC 768: 0 means "no checksum").
    a.alu_imm(Alu::Xor, R0, 0xffff)
        .jump_imm(Cond::Ne, R0, 0, csum_nonzero)
        .mov_imm(R0, 0xffff)
        .bind(csum_nonzero)
        .store(Size::H, R6, csum_off, R0)
        .mov_imm(R0, xdp::TX)
        .exit()
        .bind(drop)
        .mov_imm(R0, xdp::DROP)
        .exit();
    a.finish()
}

/// The paced generator's gate (registers R7–R9 are free; R6 holds the context): falls through
/// when a frame may leave now, after booking it; jumps to `drop` otherwise.
fn pace_gate(a: &mut Asm, pace_fd: i32, counter_fd: i32, drop: Label) {
    use live_pace::*;
    let no_floor = a.label();
    let keep = a.label();
    let stamped = a.label();
    a.store_imm(Size::W, R10, -4, 0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, pace_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, drop)
        .mov(R9, R0)
        .call(Helper::KtimeGetNs)
        .mov(R7, R0)
        .load(Size::Dw, R1, R9, DEADLINE as i16)
        .jump_reg(Cond::Ge, R7, R1, drop)
        // The limit: frames counted so far (this CPU is the counter's only writer).
        .store_imm(Size::W, R10, -4, 0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, counter_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, drop)
        .load(Size::Dw, R8, R0, 0)
        .load(Size::Dw, R2, R9, LIMIT as i16)
        .jump_reg(Cond::Ge, R8, R2, drop)
        // now = (ktime − base) × 1024; not yet due → drop
        .store(Size::Dw, R10, -16, R7)
        .load(Size::Dw, R1, R9, BASE as i16)
        .alu_reg(Alu::Sub, R7, R1)
        .alu_imm(Alu::Lsh, R7, 10)
        .load(Size::Dw, R8, R9, NEXT as i16)
        .jump_reg(Cond::Lt, R7, R8, drop)
        // Credit beyond one burst is not banked: next = max(next, now − slack).
        .load(Size::Dw, R1, R9, SLACK as i16)
        .jump_reg(Cond::Le, R7, R1, no_floor)
        .mov(R2, R7)
        .alu_reg(Alu::Sub, R2, R1)
        .jump_reg(Cond::Ge, R8, R2, keep)
        .mov(R8, R2)
        .bind(keep)
        .bind(no_floor)
        .load(Size::Dw, R1, R9, STEP as i16)
        .alu_reg(Alu::Add, R8, R1)
        .store(Size::Dw, R9, NEXT as i16, R8)
        // The send window, on the kernel's clock: the first frame's time once, every frame's.
        .load(Size::Dw, R2, R10, -16)
        .store(Size::Dw, R9, LAST as i16, R2)
        .load(Size::Dw, R1, R9, FIRST as i16)
        .jump_imm(Cond::Ne, R1, 0, stamped)
        .store(Size::Dw, R9, FIRST as i16, R2)
        .bind(stamped);
}
