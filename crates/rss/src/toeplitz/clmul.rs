//! One tuple at a time by carry-less multiplication: PCLMULQDQ after a per-byte bit reversal
//! done with two SSSE3 nibble shuffles (no GFNI needed). The same products as the AVX-512
//! batch (see `avx512.rs` for why a window of `R·K` is the hash), on one 128-bit lane: three
//! for an IPv4 tuple, nine for an IPv6 one, against 12 (36) table loads on the table path.
//! Where the CPU has VPCLMULQDQ and AVX2 (Zen 3, Ice Lake and later), an IPv6 tuple's first
//! 32 bytes are reversed in one 256-bit register and eight of the nine products come from
//! four instructions, two per lane. Where it has GFNI, a byte's bits are reversed by one
//! affine transform instead of two nibble shuffles; with AVX-512 too, an IPv6 tuple's 36 bytes
//! sit in one 512-bit register and all nine products come from four instructions (20
//! instructions a hash: 0.93× the time of DPDK's `rte_thash_gfni`, BENCHMARKS.md), and an
//! IPv4 tuple takes no carry-less product at all: GF(2) affine transforms apply the key's
//! 8×8 bit matrices to its bytes directly (`short_affine`; 0.75× the time of the three
//! products on this path's first host, a Zen 5).
//!
//! The CPU check is made once, when a [`Toeplitz`](super::Toeplitz) is built: it keeps the
//! [`Cpu`] token this module hands out only after the check, and every call goes through it.

use std::arch::x86_64::*;

use super::ClmulKeys;
use crate::tuple::Tuple;

/// Proof that this CPU has PCLMULQDQ, SSSE3 and SSE4.1 (with `wide`, AVX2 and VPCLMULQDQ;
/// with `gfni`, GFNI; with `zmm`, all of those and AVX-512F/BW/VBMI): only [`Cpu::detect`]
/// makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cpu {
    wide: bool,
    gfni: bool,
    zmm: bool,
}

impl Cpu {
    pub(crate) fn detect() -> Option<Cpu> {
        let narrow = is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("ssse3")
            && is_x86_feature_detected!("sse4.1");
        let wide =
            narrow && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("vpclmulqdq");
        let gfni = narrow && is_x86_feature_detected!("gfni");
        let zmm = wide
            && gfni
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vbmi");
        narrow.then_some(Cpu { wide, gfni, zmm })
    }

    /// The same CPU, its bytes reversed by nibble shuffles even where it has GFNI (the
    /// `pclmul-ssse3` path, by its name).
    pub(crate) fn without_gfni(self) -> Cpu {
        Cpu {
            gfni: false,
            zmm: false,
            ..self
        }
    }

    /// Every kernel this CPU can run (so tests cover each on a CPU that has them all).
    #[cfg(test)]
    pub(crate) fn kernels(self) -> Vec<Cpu> {
        let mut v = Vec::new();
        for wide in [false, true] {
            for gfni in [false, true] {
                if (!wide || self.wide) && (!gfni || self.gfni) {
                    let zmm = false;
                    v.push(Cpu { wide, gfni, zmm });
                }
            }
        }
        if self.zmm {
            v.push(self);
        }
        v
    }
}

/// The hash of `t`.
#[inline(always)]
pub(crate) fn hash(cpu: Cpu, keys: &ClmulKeys, t: &Tuple) -> u32 {
    // SAFETY: a `Cpu` exists only when the features the functions enable were detected
    // (`wide` only with AVX2 and VPCLMULQDQ, `gfni` only with GFNI, `zmm` only with those and
    // AVX-512F/BW).
    unsafe {
        match (cpu.wide, cpu.gfni) {
            _ if cpu.zmm => one_zmm(keys, t),
            (true, true) => one_wide_gfni(keys, t),
            (true, false) => one_wide(keys, t),
            (false, true) => one_gfni(keys, t),
            (false, false) => one(keys, t),
        }
    }
}

/// Hashes `tuples[i]` into `out[i]` (as many as the shorter holds), bytes reversed by nibble
/// shuffles (the `pclmul-ssse3` batch).
pub(crate) fn hash_all(cpu: Cpu, keys: &ClmulKeys, tuples: &[Tuple], out: &mut [u32]) {
    // SAFETY: as in `hash`.
    unsafe {
        if cpu.wide {
            all_wide(keys, tuples, out)
        } else {
            all(keys, tuples, out)
        }
    }
}

#[target_feature(enable = "pclmulqdq,ssse3,sse4.1")]
fn all(keys: &ClmulKeys, tuples: &[Tuple], out: &mut [u32]) {
    for (t, o) in tuples.iter().zip(out.iter_mut()) {
        *o = one(keys, t);
    }
}

#[target_feature(enable = "pclmulqdq,ssse3,sse4.1,avx2,vpclmulqdq")]
fn all_wide(keys: &ClmulKeys, tuples: &[Tuple], out: &mut [u32]) {
    for (t, o) in tuples.iter().zip(out.iter_mut()) {
        *o = one_wide(keys, t);
    }
}

/// The nibble tables of [`bitrev`]: `rev4(n) << 4`, for a byte's low nibble, and `rev4(n)`,
/// for its high one.
#[inline]
#[target_feature(enable = "sse2")]
fn nibble_tables() -> (__m128i, __m128i) {
    const REV4: [u8; 16] = [
        0x0, 0x8, 0x4, 0xC, 0x2, 0xA, 0x6, 0xE, 0x1, 0x9, 0x5, 0xD, 0x3, 0xB, 0x7, 0xF,
    ];
    let lo = i128::from_le_bytes(REV4.map(|r| r << 4));
    let hi = i128::from_le_bytes(REV4);
    // SAFETY: reads of two 16-byte locals.
    unsafe {
        (
            _mm_loadu_si128(&lo as *const i128 as *const __m128i),
            _mm_loadu_si128(&hi as *const i128 as *const __m128i),
        )
    }
}

/// Reverses the bits of every byte: each nibble through a 16-entry table, swapped.
#[inline]
#[target_feature(enable = "ssse3")]
fn bitrev(x: __m128i) -> __m128i {
    let (lo_tab, hi_tab) = nibble_tables();
    let m = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(x, m);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(x), m);
    _mm_or_si128(_mm_shuffle_epi8(lo_tab, lo), _mm_shuffle_epi8(hi_tab, hi))
}

/// [`bitrev`] on both 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn bitrev256(x: __m256i) -> __m256i {
    let (lo_tab, hi_tab) = nibble_tables();
    let (lo_tab, hi_tab) = (
        _mm256_broadcastsi128_si256(lo_tab),
        _mm256_broadcastsi128_si256(hi_tab),
    );
    let m = _mm256_set1_epi8(0x0F);
    let lo = _mm256_and_si256(x, m);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m);
    _mm256_or_si256(
        _mm256_shuffle_epi8(lo_tab, lo),
        _mm256_shuffle_epi8(hi_tab, hi),
    )
}

/// GF(2) affine matrix that reverses the bits of a byte: output bit `i` is input bit `7 - i`.
const REVERSE_BITS: i64 = 0x8040_2010_0804_0201_u64 as i64;

/// [`bitrev`] in one instruction: a GF(2) affine transform of every byte.
#[inline]
#[target_feature(enable = "gfni")]
fn bitrev_gfni(x: __m128i) -> __m128i {
    _mm_gf2p8affine_epi64_epi8::<0>(x, _mm_set1_epi64x(REVERSE_BITS))
}

/// [`bitrev256`] in one instruction.
#[inline]
#[target_feature(enable = "gfni,avx")]
fn bitrev256_gfni(x: __m256i) -> __m256i {
    _mm256_gf2p8affine_epi64_epi8::<0>(x, _mm256_set1_epi64x(REVERSE_BITS))
}

/// Two key words as one vector (`lo` in the low qword).
#[inline]
#[target_feature(enable = "sse2")]
fn pair(lo: u64, hi: u64) -> __m128i {
    _mm_set_epi64x(hi as i64, lo as i64)
}

/// An IPv4 tuple (8 or 12 bytes, zero-padded to 16 in `a01`, reversed): the window
/// 96..128 = hi(R0·K0) ^ lo(R0·K1 ^ R1·K0), in dword 1.
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.1")]
fn short(keys: &ClmulKeys, a01: __m128i) -> u32 {
    let k = pair(keys.short[0], keys.short[1]);
    let p0 = _mm_clmulepi64_si128::<0x00>(a01, k);
    let q1 = _mm_clmulepi64_si128::<0x10>(a01, k);
    let q2 = _mm_clmulepi64_si128::<0x01>(a01, k);
    let x = _mm_xor_si128(_mm_srli_si128::<8>(p0), _mm_xor_si128(q1, q2));
    _mm_extract_epi32::<1>(x) as u32
}

/// Bytes 32..36 of a tuple's input (R4) in the low dword, not yet reversed.
#[inline]
#[target_feature(enable = "sse2")]
fn tail4(t: &Tuple) -> __m128i {
    let b = t.padded_input();
    _mm_cvtsi32_si128(i32::from_le_bytes([b[32], b[33], b[34], b[35]]))
}

/// Bytes `at..at + 16` (`at` 0 or 16) of a tuple's input, not yet reversed.
#[inline]
#[target_feature(enable = "sse2")]
fn load16<const AT: usize>(t: &Tuple) -> __m128i {
    const { assert!(AT <= 16) };
    // SAFETY: a `Tuple` is a 40-byte `repr(C)` record whose first 36 bytes are the input
    // zero-padded, so bytes AT..AT + 16 (AT <= 16) are inside it.
    unsafe { _mm_loadu_si128((t as *const Tuple as *const u8).add(AT) as *const __m128i) }
}

/// Bytes 0..32 of a tuple's input, not yet reversed.
#[inline]
#[target_feature(enable = "avx")]
fn load32(t: &Tuple) -> __m256i {
    // SAFETY: bytes 0..32 of the 40-byte record (see `load16`).
    unsafe { _mm256_loadu_si256(t as *const Tuple as *const __m256i) }
}

/// An IPv6 tuple (36 bytes) from its reversed 16-byte pieces: nine products on one lane.
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.1")]
fn long(keys: &ClmulKeys, a01: __m128i, a23: __m128i, a4: __m128i) -> u32 {
    let [k0, k1, k2, k3, k4] = keys.long;
    let (ka, kb, kc) = (pair(k0, k1), pair(k2, k3), pair(k4, 0));
    // Products whose index sum is 3 land at 192..320, sum 4 at 256..384; the hash is the
    // window 288..320 = hi(S3) ^ lo(S4), in dword 1.
    let s3 = _mm_xor_si128(
        _mm_xor_si128(
            _mm_clmulepi64_si128::<0x10>(a01, kb), // R0·K3
            _mm_clmulepi64_si128::<0x01>(a01, kb), // R1·K2
        ),
        _mm_xor_si128(
            _mm_clmulepi64_si128::<0x10>(a23, ka), // R2·K1
            _mm_clmulepi64_si128::<0x01>(a23, ka), // R3·K0
        ),
    );
    let s4 = _mm_xor_si128(
        _mm_xor_si128(
            _mm_clmulepi64_si128::<0x00>(a01, kc), // R0·K4
            _mm_clmulepi64_si128::<0x11>(a01, kb), // R1·K3
        ),
        _mm_xor_si128(
            _mm_xor_si128(
                _mm_clmulepi64_si128::<0x00>(a23, kb), // R2·K2
                _mm_clmulepi64_si128::<0x11>(a23, ka), // R3·K1
            ),
            _mm_clmulepi64_si128::<0x00>(a4, ka), // R4·K0
        ),
    );
    _mm_extract_epi32::<1>(_mm_xor_si128(_mm_srli_si128::<8>(s3), s4)) as u32
}

/// An IPv6 tuple from its first 32 bytes reversed in one 256-bit register and R4 reversed:
/// eight products from four instructions, two per lane, and one more.
#[inline]
#[target_feature(enable = "pclmulqdq,sse4.1,avx2,vpclmulqdq")]
fn wide(keys: &ClmulKeys, r: __m256i, a4: __m128i) -> u32 {
    // Lane 0 holds R0, R1 and lane 1 R2, R3. With `wide.x` = (K2, K3 | K0, K1) the two
    // cross products give R0·K3, R1·K2 | R2·K1, R3·K0 (index sum 3); with `wide.y` =
    // (K4, K3 | K2, K1) the straight ones give R0·K4, R1·K3 | R2·K2, R3·K1 (sum 4).
    // SAFETY: each array is 32 bytes.
    let (kx, ky) = unsafe {
        (
            _mm256_loadu_si256(keys.wide_x.as_ptr() as *const __m256i),
            _mm256_loadu_si256(keys.wide_y.as_ptr() as *const __m256i),
        )
    };
    let s3 = _mm256_xor_si256(
        _mm256_clmulepi64_epi128::<0x10>(r, kx),
        _mm256_clmulepi64_epi128::<0x01>(r, kx),
    );
    let s4 = _mm256_xor_si256(
        _mm256_clmulepi64_epi128::<0x00>(r, ky),
        _mm256_clmulepi64_epi128::<0x11>(r, ky),
    );
    // hi(S3) ^ lo(S4) in each lane (the byte shift stays in its lane), then the lanes folded.
    let w = _mm256_xor_si256(_mm256_srli_si256::<8>(s3), s4);
    let w = _mm_xor_si128(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
    // R4·K0: K0 is the low word of `wide.x`'s upper lane.
    let k0 = _mm256_extracti128_si256::<1>(kx);
    let w = _mm_xor_si128(w, _mm_clmulepi64_si128::<0x00>(a4, k0));
    _mm_extract_epi32::<1>(w) as u32
}

/// The single-tuple kernels for one way of reversing bytes: `$one` on 128-bit registers,
/// `$one_wide` with the IPv6 tuple's first 32 bytes in one 256-bit register. Each is one
/// function with every feature its parts need, so they inline into it.
macro_rules! kernels {
    ($one:ident, $one_wide:ident, $feat:literal, $wide_feat:literal, $rev:ident, $rev256:ident) => {
        #[inline]
        #[target_feature(enable = $feat)]
        fn $one(keys: &ClmulKeys, t: &Tuple) -> u32 {
            let a01 = $rev(load16::<0>(t));
            if t.input_len() & 32 == 0 {
                return short(keys, a01);
            }
            long(keys, a01, $rev(load16::<16>(t)), $rev(tail4(t)))
        }

        #[inline]
        #[target_feature(enable = $wide_feat)]
        fn $one_wide(keys: &ClmulKeys, t: &Tuple) -> u32 {
            if t.input_len() & 32 == 0 {
                return short(keys, $rev(load16::<0>(t)));
            }
            wide(keys, $rev256(load32(t)), $rev(tail4(t)))
        }
    };
}

kernels!(
    one,
    one_wide,
    "pclmulqdq,ssse3,sse4.1",
    "pclmulqdq,ssse3,sse4.1,avx2,vpclmulqdq",
    bitrev,
    bitrev256
);
kernels!(
    one_gfni,
    one_wide_gfni,
    "pclmulqdq,ssse3,sse4.1,gfni",
    "pclmulqdq,ssse3,sse4.1,avx2,vpclmulqdq,gfni",
    bitrev_gfni,
    bitrev256_gfni
);

/// An IPv6 tuple in one 512-bit register: its 36 bytes loaded (masked) and reversed at once —
/// lanes R0, R1 | R2, R3 | R4, 0 | 0, 0 — and the nine products from four instructions (the
/// 256-bit kernel's, with R4·K0 from the third lane), the lanes then folded.
#[inline]
#[target_feature(enable = "sse4.1,avx2,avx512f,avx512bw,vpclmulqdq,gfni")]
fn long512(keys: &ClmulKeys, t: &Tuple) -> u32 {
    // SAFETY: the mask limits the load to bytes 0..36 of the 40-byte record (see `load16`):
    // masked-off bytes are not read.
    let r = unsafe { _mm512_maskz_loadu_epi8(0xF_FFFF_FFFF, t as *const Tuple as *const i8) };
    let r = _mm512_gf2p8affine_epi64_epi8::<0>(r, _mm512_set1_epi64(REVERSE_BITS));
    // SAFETY: each array is 64 bytes.
    let (kx, ky) = unsafe {
        (
            _mm512_loadu_si512(keys.zmm_x.as_ptr() as *const __m512i),
            _mm512_loadu_si512(keys.zmm_y.as_ptr() as *const __m512i),
        )
    };
    let s3 = _mm512_xor_si512(
        _mm512_clmulepi64_epi128::<0x10>(r, kx),
        _mm512_clmulepi64_epi128::<0x01>(r, kx),
    );
    let s4 = _mm512_xor_si512(
        _mm512_clmulepi64_epi128::<0x00>(r, ky),
        _mm512_clmulepi64_epi128::<0x11>(r, ky),
    );
    let w = _mm512_xor_si512(_mm512_bsrli_epi128::<8>(s3), s4);
    let w = _mm256_xor_si256(_mm512_castsi512_si256(w), _mm512_extracti64x4_epi64::<1>(w));
    let w = _mm_xor_si128(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
    _mm_extract_epi32::<1>(w) as u32
}

/// Which input byte each byte of the two permuted registers of [`short_affine`] takes: qword
/// `s` (0..16 over both) holds, at byte `7 - o` (`o` 0..4), input byte `s - o`, and 15 (a zero
/// byte of an IPv4 tuple's padded input, which every matrix maps to zero) wherever `s - o` is
/// outside 0..12 and at bytes 0..4. The hash then comes out in dword 1, where the IPv6
/// kernel's does: with both in one place the compiler keeps one `vpextrd` for the two paths
/// (with the IPv4 hash in dword 0 it merged them into a store and a load by index).
const AFFINE_PICK: [[u8; 64]; 2] = {
    let mut pick = [[15u8; 64]; 2];
    let mut s = 0;
    while s < 16 {
        let mut o = 0;
        while o < 4 {
            if s >= o && s - o < 12 {
                pick[s / 8][(s % 8) * 8 + 7 - o] = (s - o) as u8;
            }
            o += 1;
        }
        s += 1;
    }
    pick
};

/// An IPv4 tuple by GF(2) affine transforms, no carry-less product: hash byte `o` is the XOR,
/// over input bytes `i`, of an 8×8 bit matrix of the key (bits `8(i + o)` onwards, so one
/// matrix for every `s = i + o`, `keys.affine[s]`) applied to byte `i`. Two byte permutes put
/// input byte `s - o` in qword `s`, two affine transforms apply each qword's matrix, and the
/// sixteen qwords are XORed into one, whose high dword is the hash.
#[inline]
#[target_feature(enable = "sse4.1,avx2,avx512f,avx512bw,avx512vbmi,gfni")]
fn short_affine(keys: &ClmulKeys, t: &Tuple) -> u32 {
    let x = _mm512_zextsi128_si512(load16::<0>(t));
    // SAFETY: each array is 64 bytes.
    let (pa, pb, ma, mb) = unsafe {
        (
            _mm512_loadu_si512(AFFINE_PICK[0].as_ptr() as *const __m512i),
            _mm512_loadu_si512(AFFINE_PICK[1].as_ptr() as *const __m512i),
            _mm512_loadu_si512(keys.affine.as_ptr() as *const __m512i),
            _mm512_loadu_si512(keys.affine[8..].as_ptr() as *const __m512i),
        )
    };
    let a = _mm512_gf2p8affine_epi64_epi8::<0>(_mm512_permutexvar_epi8(pa, x), ma);
    let b = _mm512_gf2p8affine_epi64_epi8::<0>(_mm512_permutexvar_epi8(pb, x), mb);
    let w = _mm512_xor_si512(a, b);
    let w = _mm256_xor_si256(_mm512_castsi512_si256(w), _mm512_extracti64x4_epi64::<1>(w));
    let w = _mm_xor_si128(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
    let w = _mm_xor_si128(w, _mm_unpackhi_epi64(w, w));
    _mm_extract_epi32::<1>(w) as u32
}

/// The single-tuple kernel of a CPU with AVX-512 and GFNI.
#[inline]
#[target_feature(
    enable = "pclmulqdq,ssse3,sse4.1,avx2,avx512f,avx512bw,avx512vbmi,vpclmulqdq,gfni"
)]
fn one_zmm(keys: &ClmulKeys, t: &Tuple) -> u32 {
    if t.input_len() & 32 == 0 {
        return short_affine(keys, t);
    }
    long512(keys, t)
}
