//! AVX-512 batch Toeplitz: carry-less multiplication (VPCLMULQDQ) after a per-byte bit
//! reversal (GFNI), one tuple per 128-bit lane, sixteen tuples per loop iteration.
//!
//! Why it works: let `R` be the input read as a polynomial whose coefficient `i` is input bit
//! `i` (MSB-first numbering — a per-byte bit reversal of the little-endian load), and `K` the
//! first `W` key bits as a big-endian integer (key bit `k` at coefficient `W - 1 - k`). Input bit
//! `i` then selects `K·x^i`, whose coefficients `W - 32 .. W` are key bits `i .. i + 32`: the
//! Toeplitz window. So the hash is coefficients `W - 32 .. W` of the carry-less product `R·K`.
//! With `W = 128` (16 key bytes) this covers inputs up to 12 bytes in three 64×64 products and
//! lands in the high dword of a lane's low qword; with `W = 320` (40 key bytes), inputs up to
//! 36 bytes in nine products.
//!
//! Loads: each lane is filled from one tuple's first 16 bytes (and for IPv6 also bytes 16..32
//! and 24..40) — always inside that tuple's 40-byte record. Bytes past the tuple's input length
//! are zero by `Tuple`'s invariant; the one load that reaches the `len` field is masked.

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

/// Hashes `tuples` into `out` (equal lengths), except a tail of fewer than four, and returns
/// how many it hashed. Returns 0 when the CPU lacks the features.
///
/// Kinds may be mixed: bytes past a tuple's input length are zero and contribute nothing, so
/// the 36-byte kernel is right for every kind and the 12-byte kernel for both IPv4 kinds. Each
/// group uses the 12-byte kernel when it holds no IPv6 tuple (input length bit 5 clear: 8 and 12
/// vs 32 and 36) — a branch-free scalar check that overlaps the vector work.
pub(crate) fn hash_all(keys: &ClmulKeys, tuples: &[Tuple], out: &mut [u32]) -> usize {
    if !supported() {
        return 0;
    }
    let n = tuples.len().min(out.len()) & !3;
    // SAFETY: `supported()` confirmed every target feature the function enables.
    unsafe { hash_mixed(keys, &tuples[..n], &mut out[..n]) };
    n
}

/// True when no tuple in the group is IPv6.
#[inline(always)]
fn all_v4(ts: &[Tuple]) -> bool {
    ts.iter().fold(0usize, |m, t| m | t.input_len()) & 32 == 0
}

/// Loads bytes `off..off + 16` of four consecutive tuples at `p`, one per 128-bit lane.
///
/// # Safety
/// `p` must point at four whole tuples and `off + 16 <= 40`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load4(p: *const u8, off: usize) -> __m512i {
    // SAFETY: per the contract, each 16-byte read lies inside one tuple record.
    unsafe {
        let z = _mm512_castsi128_si512(_mm_loadu_si128(p.add(off) as *const __m128i));
        let z = _mm512_inserti32x4::<1>(
            z,
            _mm_loadu_si128(p.add(TUPLE_SIZE + off) as *const __m128i),
        );
        let z = _mm512_inserti32x4::<2>(
            z,
            _mm_loadu_si128(p.add(2 * TUPLE_SIZE + off) as *const __m128i),
        );
        _mm512_inserti32x4::<3>(
            z,
            _mm_loadu_si128(p.add(3 * TUPLE_SIZE + off) as *const __m128i),
        )
    }
}

/// Reverses the bits of every byte (GF2P8AFFINEQB with the anti-diagonal matrix).
#[inline]
#[target_feature(enable = "avx512f,gfni")]
fn bitrev(x: __m512i) -> __m512i {
    _mm512_gf2p8affine_epi64_epi8::<0>(x, _mm512_set1_epi64(0x8040_2010_0804_0201_u64 as i64))
}

/// Broadcasts two qwords to every 128-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn lanes(lo: u64, hi: u64) -> __m512i {
    _mm512_broadcast_i32x4(_mm_set_epi64x(hi as i64, lo as i64))
}

/// Gathers dword 1 of every lane of four vectors (the hashes of 16 tuples) into one vector.
#[inline]
#[target_feature(enable = "avx512f")]
fn gather16([a, b, c, d]: [__m512i; 4]) -> __m512i {
    let idx = _mm512_setr_epi32(1, 5, 9, 13, 17, 21, 25, 29, 0, 0, 0, 0, 0, 0, 0, 0);
    let ab = _mm512_permutex2var_epi32(a, idx, b);
    let cd = _mm512_permutex2var_epi32(c, idx, d);
    _mm512_inserti64x4::<1>(ab, _mm512_castsi512_si256(cd))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,gfni,vpclmulqdq")]
unsafe fn hash_mixed(keys: &ClmulKeys, tuples: &[Tuple], out: &mut [u32]) {
    let k = Keys::new(keys);
    let mut chunks = tuples.chunks_exact(16);
    let mut outs = out.chunks_exact_mut(16);
    for (ts, os) in (&mut chunks).zip(&mut outs) {
        let p = ts.as_ptr() as *const u8;
        let q = |g: usize| p.wrapping_add(4 * g * TUPLE_SIZE);
        // SAFETY: `ts` holds sixteen whole tuples, so each group of four is whole.
        let v = unsafe {
            if all_v4(ts) {
                [
                    short4(&k, q(0)),
                    short4(&k, q(1)),
                    short4(&k, q(2)),
                    short4(&k, q(3)),
                ]
            } else {
                [
                    long4(&k, q(0)),
                    long4(&k, q(1)),
                    long4(&k, q(2)),
                    long4(&k, q(3)),
                ]
            }
        };
        // SAFETY: `os` has room for sixteen u32.
        unsafe { _mm512_storeu_si512(os.as_mut_ptr() as *mut __m512i, gather16(v)) }
    }
    // Dword 1 of every lane of a four-tuple kernel's result holds the hash.
    let idx = _mm512_setr_epi32(1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    for (ts, os) in chunks
        .remainder()
        .chunks_exact(4)
        .zip(outs.into_remainder().chunks_exact_mut(4))
    {
        let p = ts.as_ptr() as *const u8;
        // SAFETY: `ts` holds four whole tuples.
        let x = unsafe {
            if all_v4(ts) {
                short4(&k, p)
            } else {
                long4(&k, p)
            }
        };
        let packed = _mm512_castsi512_si128(_mm512_permutexvar_epi32(idx, x));
        // SAFETY: `os` has room for four u32.
        unsafe { _mm_storeu_si128(os.as_mut_ptr() as *mut __m128i, packed) }
    }
}

/// The key words broadcast to every lane, plus constants.
struct Keys {
    short: __m512i,
    ka: __m512i,
    kb: __m512i,
    kc: __m512i,
    /// Keeps bytes 32..36 of a tuple in the load of bytes 24..40 (drops `len` and padding).
    m4: __m512i,
}

impl Keys {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new(keys: &ClmulKeys) -> Keys {
        let [k0, k1, k2, k3, k4] = keys.long;
        Keys {
            short: lanes(keys.short[0], keys.short[1]),
            ka: lanes(k0, k1),
            kb: lanes(k2, k3),
            kc: lanes(k4, 0),
            m4: _mm512_maskz_set1_epi32(0x4444, -1),
        }
    }
}

/// Hashes of four IPv4 tuples at `p`, in dword 1 of each lane.
///
/// # Safety
/// `p` must point at four whole tuples.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,gfni,vpclmulqdq")]
unsafe fn short4(k: &Keys, p: *const u8) -> __m512i {
    // SAFETY: per the contract; bytes 0..16 of each tuple are input bytes (zero past the
    // input length).
    let r = bitrev(unsafe { load4(p, 0) });
    // Window at coefficients 96..128 = hi(R0·K0) ^ lo(R0·K1 ^ R1·K0), in dword 1.
    let p0 = _mm512_clmulepi64_epi128::<0x00>(r, k.short);
    let q1 = _mm512_clmulepi64_epi128::<0x10>(r, k.short);
    let q2 = _mm512_clmulepi64_epi128::<0x01>(r, k.short);
    _mm512_ternarylogic_epi64::<0x96>(_mm512_bsrli_epi128::<8>(p0), q1, q2)
}

/// Hashes of four tuples of any kind at `p`, in dword 1 of each lane.
///
/// # Safety
/// `p` must point at four whole tuples.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,gfni,vpclmulqdq")]
unsafe fn long4(k: &Keys, p: *const u8) -> __m512i {
    // SAFETY: per the contract; offsets 0, 16 and 24 (+16) stay inside each 40-byte record.
    let (a01, a23, a34) = unsafe { (load4(p, 0), load4(p, 16), load4(p, 24)) };
    let (a01, a23, a34) = (
        bitrev(a01),
        bitrev(a23),
        bitrev(_mm512_and_si512(a34, k.m4)),
    );
    let (ka, kb, kc) = (k.ka, k.kb, k.kc);
    // Products whose index sum is 3 land at 192..320, sum 4 at 256..384; the hash is the
    // window 288..320 = hi(S3) ^ lo(S4), in dword 1.
    let s3 = _mm512_ternarylogic_epi64::<0x96>(
        _mm512_clmulepi64_epi128::<0x10>(a01, kb), // R0·K3
        _mm512_clmulepi64_epi128::<0x01>(a01, kb), // R1·K2
        _mm512_clmulepi64_epi128::<0x10>(a23, ka), // R2·K1
    );
    let s3 = _mm512_xor_si512(s3, _mm512_clmulepi64_epi128::<0x01>(a23, ka)); // R3·K0
    let s4 = _mm512_ternarylogic_epi64::<0x96>(
        _mm512_clmulepi64_epi128::<0x00>(a01, kc), // R0·K4
        _mm512_clmulepi64_epi128::<0x11>(a01, kb), // R1·K3
        _mm512_clmulepi64_epi128::<0x00>(a23, kb), // R2·K2
    );
    let s4 = _mm512_ternarylogic_epi64::<0x96>(
        s4,
        _mm512_clmulepi64_epi128::<0x11>(a23, ka), // R3·K1
        _mm512_clmulepi64_epi128::<0x01>(a34, ka), // R4·K0
    );
    _mm512_xor_si512(_mm512_bsrli_epi128::<8>(s3), s4)
}
