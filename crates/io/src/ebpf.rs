//! A small eBPF assembler: programs are generated in Rust (no clang, no object files) and loaded
//! through [`crate::bpf`]. Only what flowlane's programs use is here; the encoding follows
//! the kernel's `Documentation/bpf/standardization/instruction-set.rst`.
//!
//! Jumps take [`Label`]s that are bound later; [`Asm::finish`] resolves them and refuses a label
//! that was never bound or an offset that does not fit 16 bits.

use std::fmt;

/// One 64-bit instruction (`struct bpf_insn`): opcode, dst (low nibble) and src (high nibble)
/// registers, signed 16-bit offset, signed 32-bit immediate.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Insn {
    /// Opcode: class | size/op | mode/source.
    pub code: u8,
    /// `dst | src << 4`.
    pub regs: u8,
    /// Offset (memory) or jump distance in instructions.
    pub off: i16,
    /// Immediate.
    pub imm: i32,
}

/// A register, r0 … r10 (r10 is the read-only frame pointer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(u8);

/// Return value and helper result.
pub const R0: Reg = Reg(0);
/// First argument (the context on entry).
pub const R1: Reg = Reg(1);
/// Second argument.
pub const R2: Reg = Reg(2);
/// Third argument.
pub const R3: Reg = Reg(3);
/// Fourth argument.
pub const R4: Reg = Reg(4);
/// Fifth argument.
pub const R5: Reg = Reg(5);
/// Callee-saved.
pub const R6: Reg = Reg(6);
/// Callee-saved.
pub const R7: Reg = Reg(7);
/// Callee-saved.
pub const R8: Reg = Reg(8);
/// Callee-saved.
pub const R9: Reg = Reg(9);
/// Frame pointer (read-only); the stack is the 512 bytes below it.
pub const R10: Reg = Reg(10);

// Instruction classes.
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ALU: u8 = 0x04;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
// Sources.
const K: u8 = 0x00;
const X: u8 = 0x08;
// Modes.
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const ATOMIC: u8 = 0xc0;
// Atomic operation flag: the old value is returned in the source register.
const FETCH: i32 = 0x01;
// Byte-swap op (`BPF_END`) and its "to big-endian" source bit.
const END: u8 = 0xd0;
const TO_BE: u8 = 0x08;
// Jump ops that are not conditions.
const JA: u8 = 0x00;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;

/// Memory access width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// 1 byte.
    B = 0x10,
    /// 2 bytes.
    H = 0x08,
    /// 4 bytes.
    W = 0x00,
    /// 8 bytes.
    Dw = 0x18,
}

/// 64-bit ALU operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alu {
    /// `+=`
    Add = 0x00,
    /// `-=`
    Sub = 0x10,
    /// `*=`
    Mul = 0x20,
    /// `|=`
    Or = 0x40,
    /// `&=`
    And = 0x50,
    /// `/=` (unsigned)
    Div = 0x30,
    /// `<<=`
    Lsh = 0x60,
    /// `>>=` (logical)
    Rsh = 0x70,
    /// `%=` (unsigned)
    Mod = 0x90,
    /// `^=`
    Xor = 0xa0,
    /// `=`
    Mov = 0xb0,
}

/// Jump conditions (unsigned unless named otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// `==`
    Eq = 0x10,
    /// `>`
    Gt = 0x20,
    /// `>=`
    Ge = 0x30,
    /// `&` is non-zero.
    Set = 0x40,
    /// `!=`
    Ne = 0x50,
    /// `<`
    Lt = 0xa0,
    /// `<=`
    Le = 0xb0,
}

/// Kernel helper functions by number (`enum bpf_func_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Helper {
    /// `void *bpf_map_lookup_elem(map, key)`
    MapLookupElem = 1,
    /// `u64 bpf_ktime_get_ns(void)`: CLOCK_MONOTONIC, ns.
    KtimeGetNs = 5,
    /// `u32 bpf_get_smp_processor_id(void)`
    GetSmpProcessorId = 8,
    /// `s64 bpf_csum_diff(from, from_size, to, to_size, seed)`: the 32-bit one's-complement
    /// sum `seed + sum(to) − sum(from)` (sizes multiples of 4), unfolded.
    CsumDiff = 28,
    /// `long bpf_redirect_map(map, key, flags)`
    RedirectMap = 51,
}

/// A jump target, bound to a position with [`Asm::bind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// Why a program could not be assembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsmError {
    /// A jump names a label that was never bound.
    Unbound(usize),
    /// A jump is longer than a 16-bit offset allows.
    TooFar(usize),
}

impl fmt::Display for AsmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsmError::Unbound(l) => write!(f, "label {l} is used but never bound"),
            AsmError::TooFar(at) => write!(f, "jump at instruction {at} is out of 16-bit range"),
        }
    }
}

impl std::error::Error for AsmError {}

/// An instruction stream with labels.
#[derive(Debug, Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

fn insn(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst.0 | (src.0 << 4),
        off,
        imm,
    }
}

impl Asm {
    /// An empty program.
    pub fn new() -> Asm {
        Asm::default()
    }

    fn push(&mut self, i: Insn) -> &mut Asm {
        self.insns.push(i);
        self
    }

    /// A new, unbound label.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `l` to the next instruction.
    pub fn bind(&mut self, l: Label) -> &mut Asm {
        self.labels[l.0] = Some(self.insns.len());
        self
    }

    /// `dst op= imm` (64-bit).
    pub fn alu_imm(&mut self, op: Alu, dst: Reg, imm: i32) -> &mut Asm {
        self.push(insn(ALU64 | op as u8 | K, dst, R0, 0, imm))
    }

    /// `dst op= src` (64-bit).
    pub fn alu_reg(&mut self, op: Alu, dst: Reg, src: Reg) -> &mut Asm {
        self.push(insn(ALU64 | op as u8 | X, dst, src, 0, 0))
    }

    /// `dst = imm` (sign-extended to 64 bits).
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) -> &mut Asm {
        self.alu_imm(Alu::Mov, dst, imm)
    }

    /// `dst = src`.
    pub fn mov(&mut self, dst: Reg, src: Reg) -> &mut Asm {
        self.alu_reg(Alu::Mov, dst, src)
    }

    /// `dst = *(size *)(src + off)` (zero-extended).
    pub fn load(&mut self, size: Size, dst: Reg, src: Reg, off: i16) -> &mut Asm {
        self.push(insn(LDX | MEM | size as u8, dst, src, off, 0))
    }

    /// `*(size *)(dst + off) = src`.
    pub fn store(&mut self, size: Size, dst: Reg, off: i16, src: Reg) -> &mut Asm {
        self.push(insn(STX | MEM | size as u8, dst, src, off, 0))
    }

    /// `*(size *)(dst + off) = imm`.
    pub fn store_imm(&mut self, size: Size, dst: Reg, off: i16, imm: i32) -> &mut Asm {
        self.push(insn(ST | MEM | size as u8, dst, R0, off, imm))
    }

    /// `lock *(size *)(dst + off) += src` (W or Dw).
    pub fn atomic_add(&mut self, size: Size, dst: Reg, off: i16, src: Reg) -> &mut Asm {
        self.push(insn(STX | ATOMIC | size as u8, dst, src, off, 0))
    }

    /// `src = atomic_fetch_add((size *)(dst + off), src)`: `lock xadd` that returns the old
    /// value in `src` (W or Dw; Linux 5.12+).
    pub fn atomic_fetch_add(&mut self, size: Size, dst: Reg, off: i16, src: Reg) -> &mut Asm {
        self.push(insn(STX | ATOMIC | size as u8, dst, src, off, FETCH))
    }

    /// `dst = htobe{bits}(dst)` (16, 32 or 64; the upper bits are cleared).
    pub fn to_be(&mut self, dst: Reg, bits: i32) -> &mut Asm {
        self.push(insn(ALU | END | TO_BE, dst, R0, 0, bits))
    }

    /// `dst = map` by file descriptor (a two-slot `ld_imm64` with `BPF_PSEUDO_MAP_FD`).
    pub fn load_map_fd(&mut self, dst: Reg, fd: i32) -> &mut Asm {
        self.push(insn(LD | IMM | Size::Dw as u8, dst, Reg(1), 0, fd))
            .push(Insn::default())
    }

    /// `if dst cond imm goto l`.
    pub fn jump_imm(&mut self, c: Cond, dst: Reg, imm: i32, l: Label) -> &mut Asm {
        self.fixups.push((self.insns.len(), l));
        self.push(insn(JMP | c as u8 | K, dst, R0, 0, imm))
    }

    /// `if dst cond src goto l`.
    pub fn jump_reg(&mut self, c: Cond, dst: Reg, src: Reg, l: Label) -> &mut Asm {
        self.fixups.push((self.insns.len(), l));
        self.push(insn(JMP | c as u8 | X, dst, src, 0, 0))
    }

    /// `goto l`.
    pub fn jump(&mut self, l: Label) -> &mut Asm {
        self.fixups.push((self.insns.len(), l));
        self.push(insn(JMP | JA, R0, R0, 0, 0))
    }

    /// `r0 = helper(r1, …, r5)`; r1–r5 are clobbered.
    pub fn call(&mut self, h: Helper) -> &mut Asm {
        self.push(insn(JMP | CALL, R0, R0, 0, h as i32))
    }

    /// `return r0`.
    pub fn exit(&mut self) -> &mut Asm {
        self.push(insn(JMP | EXIT, R0, R0, 0, 0))
    }

    /// The finished program with every jump resolved.
    pub fn finish(&self) -> Result<Vec<Insn>, AsmError> {
        let mut out = self.insns.clone();
        for &(at, l) in &self.fixups {
            let target = self.labels[l.0].ok_or(AsmError::Unbound(l.0))?;
            let off = target as i64 - at as i64 - 1;
            out[at].off = i16::try_from(off).map_err(|_| AsmError::TooFar(at))?;
        }
        Ok(out)
    }
}

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

/// Offsets into `struct xdp_md` (the XDP context), from `linux/bpf.h`.
pub mod xdp_md {
    /// `data`: start of the frame (u32, a packet pointer once loaded).
    pub const DATA: i16 = 0;
    /// `data_end`: one past its end.
    pub const DATA_END: i16 = 4;
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
/// Toeplitz byte table (`ROWS` rows of 256 u32, row `i` = contribution of input byte `i`) and
/// then the CPU for each RETA index (u32 each).
pub mod rss_table {
    /// Input bytes the table covers: an IPv6 4-tuple (16 + 16 + 2 + 2).
    pub const ROWS: usize = 36;
    /// Byte offset of the RETA→CPU table.
    pub const CPU_TABLE: usize = ROWS * 256 * 4;
    /// Value size for a RETA of `reta_len` entries.
    pub fn value_size(reta_len: usize) -> usize {
        CPU_TABLE + 4 * reta_len
    }
}

/// XORs the table rows of `len` frame bytes starting at `frame_off` into `R5` (frame in `R7`,
/// table in `R9`; clobbers `R3`). The caller has checked the bytes are inside the frame.
fn hash_bytes(a: &mut Asm, frame_off: i16, len: usize) {
    for i in 0..len {
        a.load(Size::B, R3, R7, frame_off + i as i16)
            .alu_imm(Alu::Lsh, R3, 2)
            .alu_reg(Alu::Add, R3, R9)
            .alu_imm(Alu::Add, R3, (i * 1024) as i32)
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
        hash_bytes(&mut a, 26, 12);
        a.jump(steer);
    }
    a.bind(v4_addrs);
    hash_bytes(&mut a, 26, 8);
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
        hash_bytes(&mut a, 22, 36);
        a.jump(steer);
    }
    a.bind(v6_addrs);
    hash_bytes(&mut a, 22, 32);
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
    a.mov(R6, R1)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_the_kernel_macros() {
        let mut a = Asm::new();
        a.mov(R6, R1) // BPF_MOV64_REG(R6, R1) = 0xbf, regs 0x16
            .load(Size::W, R0, R6, 164) // BPF_LDX_MEM(BPF_W, R0, R6, 164) = 0x61
            .atomic_add(Size::Dw, R0, 0, R7) // BPF_ATOMIC_OP(BPF_DW, BPF_ADD, …) = 0xdb
            .load_map_fd(R1, 5) // BPF_LD_MAP_FD = 0x18, src = 1
            .call(Helper::MapLookupElem) // 0x85 imm 1
            .exit(); // 0x95
        let p = a.finish().expect("no labels");
        let codes: Vec<u8> = p.iter().map(|i| i.code).collect();
        assert_eq!(codes, [0xbf, 0x61, 0xdb, 0x18, 0x00, 0x85, 0x95]);
        assert_eq!(p[0].regs, 0x16);
        assert_eq!((p[1].regs, p[1].off), (0x60, 164));
        assert_eq!(p[2].regs, 0x70);
        assert_eq!((p[3].regs, p[3].imm), (0x11, 5));
        assert_eq!(p[5].imm, 1);
    }

    #[test]
    fn fetch_add_and_byte_swap_encode_like_the_kernel_macros() {
        let mut a = Asm::new();
        a.atomic_fetch_add(Size::Dw, R0, 8, R7) // BPF_ATOMIC_OP(BPF_DW, BPF_ADD | BPF_FETCH, …)
            .to_be(R1, 64) // BPF_ENDIAN(BPF_TO_BE, R1, 64) = 0xdc
            .alu_imm(Alu::Div, R2, 3); // BPF_ALU64_IMM(BPF_DIV, …) = 0x37
        let p = a.finish().expect("no labels");
        assert_eq!(
            (p[0].code, p[0].regs, p[0].off, p[0].imm),
            (0xdb, 0x70, 8, 0x01)
        );
        assert_eq!((p[1].code, p[1].regs, p[1].imm), (0xdc, 0x01, 64));
        assert_eq!((p[2].code, p[2].imm), (0x37, 3));
    }

    #[test]
    fn labels_resolve_forward_and_backward() {
        let mut a = Asm::new();
        let top = a.label();
        let end = a.label();
        a.bind(top)
            .jump_imm(Cond::Eq, R0, 0, end) // 0 → 3: off 2
            .alu_imm(Alu::Add, R0, 1)
            .jump(top) // 2 → 0: off -3
            .bind(end)
            .exit();
        let p = a.finish().expect("bound");
        assert_eq!(p[0].off, 2);
        assert_eq!(p[2].off, -3);
        assert_eq!(p[0].code, 0x15);
    }

    #[test]
    fn unbound_label_is_an_error() {
        let mut a = Asm::new();
        let l = a.label();
        a.jump(l);
        assert_eq!(a.finish(), Err(AsmError::Unbound(0)));
    }
}
