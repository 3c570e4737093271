//! AVX-512 batch Toeplitz: carry-less multiplication (VPCLMULQDQ) after a per-byte bit
//! reversal (GFNI), four tuples per 512-bit vector, one tuple per 128-bit lane.
//!
//! Why it works: let `R` be the input read as a polynomial whose coefficient `i` is input bit
//! `i` (MSB-first numbering — a per-byte bit reversal of the little-endian load), and `K` the
//! first `W` key bits with key bit `k` at coefficient `W - 1 - k`. Then `R·K` (carry-less) has at
//! coefficients `W - 32 .. W` exactly the XOR of the key windows selected by the input bits: the
//! Toeplitz hash. With `W = 127` this covers inputs up to 12 bytes (IPv4) in three 64×64
//! products; with `W = 319`, inputs up to 36 bytes (IPv6) in nine.
//!
//! Every unsafe block here reads only inside the 40-byte `Tuple` records of the slices it is
//! given; CPU support is checked by the caller through [`supported`] before any call.

use std::arch::x86_64::*;

use super::ClmulKeys;
use crate::tuple::Tuple;

const TUPLE_SIZE: usize = std::mem::size_of::<Tuple>();
const _: () = assert!(TUPLE_SIZE == 40);

/// Whether this CPU has every feature the path needs.
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("gfni")
        && is_x86_feature_detected!("vpclmulqdq")
}

/// Hashes a run of tuples that all have input length `len`; returns how many it hashed (a
/// multiple of four; the caller hashes the rest). Returns 0 when the CPU lacks the features.
pub(crate) fn hash_run(keys: &ClmulKeys, tuples: &[Tuple], out: &mut [u32], len: usize) -> usize {
    if !supported() {
        return 0;
    }
    let n = tuples.len().min(out.len()) & !3;
    if len <= 12 {
        // SAFETY: `supported()` confirmed every target feature the function enables; the slices
        // are valid for `n` elements.
        unsafe { hash_short(keys, &tuples[..n], &mut out[..n], len) }
    } else {
        // SAFETY: as above.
        unsafe { hash_long(keys, &tuples[..n], &mut out[..n], len) }
    }
    n
}

/// Mask of the bytes `base..base+16` of a tuple that lie below `len`.
fn lane_mask(len: usize, base: usize) -> __mmask16 {
    let valid = len.saturating_sub(base).min(16);
    ((1u32 << valid) - 1) as __mmask16
}

/// Loads bytes `off..off+16` (masked to `mask`) of four consecutive tuples at `p`, one per lane.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load4(p: *const u8, off: usize, mask: __mmask16) -> __m512i {
    // SAFETY (all four loads): the caller guarantees four whole tuples at `p`; masked-off bytes
    // are neither read nor faulted on, and the unmasked ones lie within `off..off+16 <= 40`.
    unsafe {
        let l0 = _mm_maskz_loadu_epi8(mask, p.add(off) as *const i8);
        let l1 = _mm_maskz_loadu_epi8(mask, p.add(TUPLE_SIZE + off) as *const i8);
        let l2 = _mm_maskz_loadu_epi8(mask, p.add(2 * TUPLE_SIZE + off) as *const i8);
        let l3 = _mm_maskz_loadu_epi8(mask, p.add(3 * TUPLE_SIZE + off) as *const i8);
        let z = _mm512_castsi128_si512(l0);
        let z = _mm512_inserti32x4::<1>(z, l1);
        let z = _mm512_inserti32x4::<2>(z, l2);
        _mm512_inserti32x4::<3>(z, l3)
    }
}

/// Reverses the bits of every byte (GF2P8AFFINEQB with the anti-diagonal matrix).
#[target_feature(enable = "avx512f,gfni")]
fn bitrev(x: __m512i) -> __m512i {
    _mm512_gf2p8affine_epi64_epi8::<0>(x, _mm512_set1_epi64(0x8040_2010_0804_0201_u64 as i64))
}

/// Broadcasts two qwords to every 128-bit lane.
#[target_feature(enable = "avx512f")]
fn lanes(lo: u64, hi: u64) -> __m512i {
    _mm512_broadcast_i32x4(_mm_set_epi64x(hi as i64, lo as i64))
}

/// Given per-lane `x` whose low qword holds the 64-bit word that ends in the hash at bit 31,
/// writes the four hashes to `out`.
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn store4(x: __m512i, out: *mut u32) {
    let h = _mm512_srli_epi64::<31>(x);
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    let packed = _mm512_castsi512_si128(_mm512_permutexvar_epi32(idx, h));
    // SAFETY: the caller guarantees room for four u32 at `out`.
    unsafe { _mm_storeu_si128(out as *mut __m128i, packed) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,gfni,vpclmulqdq")]
unsafe fn hash_short(keys: &ClmulKeys, tuples: &[Tuple], out: &mut [u32], len: usize) {
    let k = lanes(keys.short[0], keys.short[1]);
    let mask = lane_mask(len, 0);
    for (ts, os) in tuples.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
        // SAFETY: `ts` holds four tuples.
        let r = bitrev(unsafe { load4(ts.as_ptr() as *const u8, 0, mask) });
        // Window at coefficients 95..127 = hi(R0·K0) ^ lo(R0·K1 ^ R1·K0).
        let p = _mm512_clmulepi64_epi128::<0x00>(r, k);
        let q = _mm512_xor_si512(
            _mm512_clmulepi64_epi128::<0x10>(r, k),
            _mm512_clmulepi64_epi128::<0x01>(r, k),
        );
        let x = _mm512_xor_si512(_mm512_bsrli_epi128::<8>(p), q);
        // SAFETY: `os` has room for four hashes.
        unsafe { store4(x, os.as_mut_ptr()) }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,gfni,vpclmulqdq")]
unsafe fn hash_long(keys: &ClmulKeys, tuples: &[Tuple], out: &mut [u32], len: usize) {
    let [k0, k1, k2, k3, k4] = keys.long;
    let ka = lanes(k0, k1);
    let kb = lanes(k2, k3);
    let kc = lanes(k4, 0);
    let (m01, m23) = (lane_mask(len, 0), lane_mask(len, 16));
    // Bytes 24..40: only the high qword (bytes 32..40, holding R4) is used.
    let m4 = lane_mask(len, 24) & 0xff00;
    for (ts, os) in tuples.chunks_exact(4).zip(out.chunks_exact_mut(4)) {
        let p = ts.as_ptr() as *const u8;
        // SAFETY: `ts` holds four tuples; offsets 0, 16 and 24 (+16) stay inside each record.
        let (a01, a23, a34) = unsafe { (load4(p, 0, m01), load4(p, 16, m23), load4(p, 24, m4)) };
        let (a01, a23, a34) = (bitrev(a01), bitrev(a23), bitrev(a34));
        // Products whose index sum is 3 land at 192..319, sum 4 at 256..383; the hash is the
        // window 287..319 = hi(S3) ^ lo(S4), both shifted right by 31.
        let s3 = _mm512_xor_si512(
            _mm512_xor_si512(
                _mm512_clmulepi64_epi128::<0x10>(a01, kb), // R0·K3
                _mm512_clmulepi64_epi128::<0x01>(a01, kb), // R1·K2
            ),
            _mm512_xor_si512(
                _mm512_clmulepi64_epi128::<0x10>(a23, ka), // R2·K1
                _mm512_clmulepi64_epi128::<0x01>(a23, ka), // R3·K0
            ),
        );
        let s4 = _mm512_xor_si512(
            _mm512_xor_si512(
                _mm512_clmulepi64_epi128::<0x00>(a01, kc), // R0·K4
                _mm512_clmulepi64_epi128::<0x11>(a01, kb), // R1·K3
            ),
            _mm512_xor_si512(
                _mm512_xor_si512(
                    _mm512_clmulepi64_epi128::<0x00>(a23, kb), // R2·K2
                    _mm512_clmulepi64_epi128::<0x11>(a23, ka), // R3·K1
                ),
                _mm512_clmulepi64_epi128::<0x01>(a34, ka), // R4·K0
            ),
        );
        let x = _mm512_xor_si512(_mm512_bsrli_epi128::<8>(s3), s4);
        // SAFETY: `os` has room for four hashes.
        unsafe { store4(x, os.as_mut_ptr()) }
    }
}
