//! A small eBPF assembler: programs are generated in Rust (no clang, no object files) and loaded
//! through [`crate::bpf`]. Only what flowlane's programs use is here; the encoding follows
//! the kernel's `Documentation/bpf/standardization/instruction-set.rst`.
//!
//! One file per generated program (`missteer.rs`, `rss_steer.rs`, `live_tx.rs`) over the
//! assembler here. Jumps take [`Label`]s that are bound later; [`Asm::finish`] resolves them and refuses a label
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
    /// `long bpf_map_update_elem(map, key, value, flags)`
    MapUpdateElem = 2,
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

    /// `dst = imm` for a 64-bit immediate (a two-slot `ld_imm64`).
    pub fn load_imm64(&mut self, dst: Reg, imm: u64) -> &mut Asm {
        self.push(insn(
            LD | IMM | Size::Dw as u8,
            dst,
            R0,
            0,
            imm as u32 as i32,
        ))
        .push(insn(0, R0, R0, 0, (imm >> 32) as u32 as i32))
    }

    /// `dst = map` by file descriptor (a two-slot `ld_imm64` with `BPF_PSEUDO_MAP_FD`).
    pub fn load_map_fd(&mut self, dst: Reg, fd: i32) -> &mut Asm {
        self.push(insn(LD | IMM | Size::Dw as u8, dst, Reg(1), 0, fd))
            .push(Insn::default())
    }

    /// `dst = &value[off]` of a one-entry array map, by file descriptor (a two-slot `ld_imm64`
    /// with `BPF_PSEUDO_MAP_VALUE`, Linux 5.2+): a pointer the verifier knows, with no lookup
    /// at run time — how libbpf reaches global variables.
    pub fn load_map_value(&mut self, dst: Reg, fd: i32, off: i32) -> &mut Asm {
        self.push(insn(LD | IMM | Size::Dw as u8, dst, Reg(2), 0, fd))
            .push(insn(0, R0, R0, 0, off))
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

    /// Calls kernel function `btf_id` (its type id in the kernel's BTF: `BPF_PSEUDO_KFUNC_CALL`,
    /// src register 2, offset 0 for vmlinux). Arguments in R1–R5, result in R0; R1–R5 clobbered.
    pub fn call_kfunc(&mut self, btf_id: u32) -> &mut Asm {
        self.push(insn(JMP | CALL, R0, Reg(2), 0, btf_id as i32))
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

mod bridge;
mod csum;
mod live_tx;
mod missteer;
mod reflect;
mod route;
mod rss_steer;
mod rss_verify;
mod xsk_redirect;

pub use bridge::{bridge_program, bridge_stats, fdb, XdpBridge};
pub use csum::MAX_CSUM_WORDS;
pub use live_tx::{live_flow, live_pace, live_tx_program, stamp as live_stamp, LiveTx};
pub use missteer::{missteer_filter, sk_buff};
pub use reflect::{reflect_program, reflect_stats, Reflect};
pub use route::{route_hop, route_program, route_stats, XdpRoute};
pub use rss_steer::{
    cpumap_arrivals_program, rss_stats, rss_steer_program, rss_table, xdp, xdp_md,
};
pub use rss_verify::{rss_verify_program, verify_key, SLOT_LEN as VERIFY_SLOT_LEN};
pub use xsk_redirect::{
    xsk_redirect_ip_program, xsk_redirect_program, xsk_redirect_router_program,
    xsk_redirect_unicast_ip_program,
};

/// Adds 1 to counter `which` of a per-CPU array of u64 (this CPU's copy: no atomic, no CPU
/// number asked for; clobbers R0–R5).
pub(crate) fn count_percpu(a: &mut Asm, map_fd: i32, which: usize) {
    let skip = a.label();
    a.store_imm(Size::W, R10, -4, which as i32)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, map_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, skip)
        .load(Size::Dw, R1, R0, 0)
        .alu_imm(Alu::Add, R1, 1)
        .store(Size::Dw, R0, 0, R1)
        .bind(skip);
}

/// Adds 1 to counter `which` of the running CPU's slot in the u64 array map `stats_fd`, `slot`
/// counters per CPU, the CPU's at `slot * cpu` (clobbers R0–R5).
pub(crate) fn count_per_cpu(a: &mut Asm, stats_fd: i32, slot: usize, which: usize) {
    let skip = a.label();
    a.call(Helper::GetSmpProcessorId)
        .alu_imm(Alu::Mul, R0, slot as i32)
        .alu_imm(Alu::Add, R0, which as i32)
        .store(Size::W, R10, -4, R0)
        .mov(R2, R10)
        .alu_imm(Alu::Add, R2, -4)
        .load_map_fd(R1, stats_fd)
        .call(Helper::MapLookupElem)
        .jump_imm(Cond::Eq, R0, 0, skip)
        .mov_imm(R1, 1)
        .atomic_add(Size::Dw, R0, 0, R1)
        .bind(skip);
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
