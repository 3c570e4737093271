//! Software RSS: the XDP program that hashes each frame with Toeplitz and redirects it through
//! a cpumap, and the program each cpumap entry runs to count arrivals.

use super::*;

/// Offsets into `struct xdp_md` (the XDP context), from `linux/bpf.h`.
pub mod xdp_md {
    /// `data`: start of the frame (u32, a packet pointer once loaded).
    pub const DATA: i16 = 0;
    /// `data_end`: one past its end.
    pub const DATA_END: i16 = 4;
    /// `ingress_ifindex`: the interface the frame came in by.
    pub const INGRESS_IFINDEX: i16 = 12;
}

/// XDP verdicts.
pub mod xdp {
    /// Drop the frame.
    pub const DROP: i32 = 1;
    /// Hand the frame to the kernel's stack on this CPU.
    pub const PASS: i32 = 2;
    /// Send the frame back out of the interface it arrived on.
    pub const TX: i32 = 3;
    /// What `bpf_redirect_map` returns when it took the frame.
    pub const REDIRECT: i32 = 4;
}

/// Layout of the software-RSS counters (one array map entry, key 0): for each CPU `c` below
/// `cpus`, two u64 at `16 c`: frames the steering program handed to that CPU's cpumap entry
/// ([`REDIRECTED`]) and frames that CPU's cpumap thread took off its queue ([`ARRIVED`]).
/// Once traffic stops, redirected − arrived is what the queue dropped because it was full —
/// a loss the kernel shows on no interface or socket counter.
pub mod rss_stats {
    /// Offset of the redirected count in a CPU's slot.
    pub const REDIRECTED: usize = 0;
    /// Offset of the arrived count in a CPU's slot.
    pub const ARRIVED: usize = 8;
    /// Bytes per CPU.
    pub const SLOT: usize = 16;
    /// Value size for `cpus` CPUs.
    pub fn value_size(cpus: u32) -> usize {
        SLOT * cpus as usize
    }
}

/// Layout of the value the software-RSS program reads (one array map entry, key 0): the
/// Toeplitz byte tables (rows of 256 u32, row `i` = contribution of input byte `i`) — an
/// IPv6 4-tuple's [`V6_ROWS`], then an IPv4 4-tuple's [`V4_ROWS`] from [`V4_ROW`] — and then
/// the CPU for each RETA index (u32 each). Each family has rows of its own so that a
/// symmetric hash can be steered: ethtool's `symmetric-xor` hashes (src^dst, src^dst,
/// sport^dport, sport^dport), and Toeplitz being linear in its input, that is the plain hash
/// with the rows of a field and of its partner XORed together — which pairs different rows
/// for IPv4 (addresses 4 bytes apart) than for IPv6 (16).
pub mod rss_table {
    /// An IPv6 4-tuple's input bytes (16 + 16 + 2 + 2).
    pub const V6_ROWS: usize = 36;
    /// An IPv4 4-tuple's (4 + 4 + 2 + 2).
    pub const V4_ROWS: usize = 12;
    /// The first IPv4 row.
    pub const V4_ROW: usize = V6_ROWS;
    /// Rows in all.
    pub const ROWS: usize = V6_ROWS + V4_ROWS;
    /// Byte offset of the RETA→CPU table.
    pub const CPU_TABLE: usize = ROWS * 256 * 4;
    /// Value size for a RETA of `reta_len` entries.
    pub fn value_size(reta_len: usize) -> usize {
        CPU_TABLE + 4 * reta_len
    }
}

/// XORs the table rows `row..row + len` of `len` frame bytes starting at `frame_off` into `R5`
/// (frame in `R7`, table in `R9`; clobbers `R3`). The caller has checked the bytes are inside
/// the frame.
fn hash_bytes(a: &mut Asm, frame_off: i16, len: usize, row: usize) {
    for i in 0..len {
        a.load(Size::B, R3, R7, frame_off + i as i16)
            .alu_imm(Alu::Lsh, R3, 2)
            .alu_reg(Alu::Add, R3, R9)
            .alu_imm(Alu::Add, R3, ((row + i) * 1024) as i32)
            .load(Size::W, R3, R3, 0)
            .alu_reg(Alu::Xor, R5, R3);
    }
}

/// Software RSS as an XDP program: the Toeplitz hash of each IPv4/IPv6 frame's input (the
/// 4-tuple for unfragmented UDP and TCP when `ports`, else the 2-tuple of addresses, as NICs
/// hash) from the byte table in map `table_fd` (see [`rss_table`]), its low bits
/// (`reta_len − 1`) index the RETA→CPU table, and the frame is redirected into the `cpumap_fd`
/// entry of that CPU, whose kernel thread then runs the stack for it there. Frames that are
/// not IP (ARP, …) pass on the CPU they came in on. `reta_len` must be a power of two. Each
/// frame redirected to CPU `c < cpus` is counted in map `stats_fd` (see [`rss_stats`]).
pub fn rss_steer_program(
    table_fd: i32,
    cpumap_fd: i32,
    stats_fd: i32,
    cpus: u32,
    reta_len: u32,
    ports: bool,
) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let pass = a.label();
    let v4 = a.label();
    let v6 = a.label();
    let steer = a.label();
    let v4_addrs = a.label();
    let v6_addrs = a.label();
    let redirected = a.label();
    let done = a.label();
    a.mov(R6, R1)
        .store_imm(Size::W, R10, -4, 0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, table_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, pass)
        .mov(R9, R0)
        .load(Size::W, R7, R6, xdp_md::DATA)
        .load(Size::W, R8, R6, xdp_md::DATA_END)
        .mov_imm(R5, 0)
        .mov(R2, R7)
        .alu_imm(Alu::Add, R2, 14)
        .jump_reg(Cond::Gt, R2, R8, pass)
        // The EtherType, read as a little-endian u16: 0x0800 reads 0x0008.
        .load(Size::H, R3, R7, 12)
        .jump_imm(Cond::Eq, R3, 0x0008, v4)
        .jump_imm(Cond::Eq, R3, 0xdd86u32 as i32, v6)
        .jump(pass);
    // IPv4: addresses at 26..34, ports (with a 20-byte header) at 34..38.
    a.bind(v4)
        .mov(R2, R7)
        .alu_imm(Alu::Add, R2, 34)
        .jump_reg(Cond::Gt, R2, R8, pass);
    if ports {
        let v4_ports = a.label();
        a.load(Size::B, R3, R7, 14)
            .jump_imm(Cond::Ne, R3, 0x45, v4_addrs)
            // Fragment offset or more-fragments set (0x3fff big-endian reads 0xff3f).
            .load(Size::H, R3, R7, 20)
            .alu_imm(Alu::And, R3, 0xff3f)
            .jump_imm(Cond::Ne, R3, 0, v4_addrs)
            .load(Size::B, R3, R7, 23)
            .jump_imm(Cond::Eq, R3, 17, v4_ports)
            .jump_imm(Cond::Eq, R3, 6, v4_ports)
            .jump(v4_addrs)
            .bind(v4_ports)
            .mov(R2, R7)
            .alu_imm(Alu::Add, R2, 38)
            .jump_reg(Cond::Gt, R2, R8, v4_addrs);
        hash_bytes(&mut a, 26, 12, rss_table::V4_ROW);
        a.jump(steer);
    }
    a.bind(v4_addrs);
    hash_bytes(&mut a, 26, 8, rss_table::V4_ROW);
    a.jump(steer);
    // IPv6: addresses at 22..54, ports at 54..58 when the next header is UDP or TCP.
    a.bind(v6)
        .mov(R2, R7)
        .alu_imm(Alu::Add, R2, 54)
        .jump_reg(Cond::Gt, R2, R8, pass);
    if ports {
        let v6_ports = a.label();
        a.load(Size::B, R3, R7, 20)
            .jump_imm(Cond::Eq, R3, 17, v6_ports)
            .jump_imm(Cond::Eq, R3, 6, v6_ports)
            .jump(v6_addrs)
            .bind(v6_ports)
            .mov(R2, R7)
            .alu_imm(Alu::Add, R2, 58)
            .jump_reg(Cond::Gt, R2, R8, v6_addrs);
        hash_bytes(&mut a, 22, 36, 0);
        a.jump(steer);
    }
    a.bind(v6_addrs);
    hash_bytes(&mut a, 22, 32, 0);
    // The CPU for RETA index hash & (len − 1); redirect there (XDP_PASS if the entry is empty).
    a.bind(steer)
        .alu_imm(Alu::And, R5, reta_len.saturating_sub(1) as i32)
        .alu_imm(Alu::Lsh, R5, 2)
        .alu_reg(Alu::Add, R5, R9)
        .alu_imm(Alu::Add, R5, rss_table::CPU_TABLE as i32)
        .load(Size::W, R7, R5, 0)
        .mov(R2, R7)
        .load_map_fd(R1, cpumap_fd)
        .mov_imm(R3, xdp::PASS)
        .call(Helper::RedirectMap)
        .jump_imm(Cond::Ne, R0, xdp::REDIRECT, done);
    // Count it against the CPU (R7; the key 0 is still at R10 − 4).
    count_for_cpu(
        &mut a,
        stats_fd,
        cpus,
        R7,
        rss_stats::REDIRECTED as i16,
        redirected,
    );
    a.bind(redirected)
        .mov_imm(R0, xdp::REDIRECT)
        .bind(done)
        .exit()
        .bind(pass)
        .mov_imm(R0, xdp::PASS)
        .exit();
    a.finish()
}

/// Adds 1 to the u64 at `off` in CPU `cpu`'s slot of the [`rss_stats`] map `stats_fd` (key 0
/// at `R10 − 4`), then goes to `next`; a CPU at or past `cpus` is not counted. `cpu` must be
/// R6–R9 (kept across the lookup); clobbers R0–R5.
fn count_for_cpu(a: &mut Asm, stats_fd: i32, cpus: u32, cpu: Reg, off: i16, next: Label) {
    a.jump_imm(Cond::Ge, cpu, cpus as i32, next)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, stats_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, next)
        .alu_imm(Alu::Lsh, cpu, 4)
        .alu_reg(Alu::Add, R0, cpu)
        .mov_imm(R1, 1)
        .atomic_add(Size::Dw, R0, off, R1)
        .jump(next);
}

/// The program each software-RSS cpumap entry runs on the frames taken off its queue, on its
/// CPU, before the stack sees them (load with [`crate::bpf::ATTACH_XDP_CPUMAP`]): counts
/// them as arrived for that CPU in map `stats_fd` (see [`rss_stats`]) and passes them on.
pub fn cpumap_arrivals_program(stats_fd: i32, cpus: u32) -> Result<Vec<Insn>, AsmError> {
    let mut a = Asm::new();
    let pass = a.label();
    a.call(Helper::GetSmpProcessorId)
        .mov(R6, R0)
        .store_imm(Size::W, R10, -4, 0);
    count_for_cpu(&mut a, stats_fd, cpus, R6, rss_stats::ARRIVED as i16, pass);
    a.bind(pass).mov_imm(R0, xdp::PASS).exit();
    a.finish()
}
