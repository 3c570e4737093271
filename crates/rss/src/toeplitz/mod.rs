//! The Toeplitz hash: a bit-serial reference, a table-driven fast path and a SIMD batch path.
//!
//! Definition (Microsoft, "RSS hashing functions"): for every set bit `i` of the input, counted
//! from the most significant bit of the first byte, XOR into the result the 32-bit window of the
//! key that starts at key bit `i`. All three implementations here are checked against one table
//! of published verification values ([`crate::vectors`]) and against each other by proptests.
//!
//! * [`reference`] follows the definition literally, one input bit at a time.
//! * [`Toeplitz`] precomputes, per input byte position, the XOR of windows for each of the 256
//!   byte values, so an IPv4 4-tuple costs 12 table loads.
//! * On x86-64 with PCLMULQDQ and SSSE3 (nearly every x86-64 CPU since 2010), one tuple at a
//!   time by carry-less multiplication: Toeplitz hashing is a window of the carry-less product
//!   of the (per-byte bit-reversed) input and the key — 3 products for IPv4, 9 for IPv6,
//!   against 12 (36) table loads. [`Toeplitz::hash`] takes it whenever the CPU has it.
//! * With AVX-512 (F, BW, VL), GFNI and VPCLMULQDQ besides, [`Toeplitz::hash_batch`] hashes
//!   four tuples per instruction stream the same way.
//!
//! Paths are chosen once, when the hasher is built; the table path runs everywhere else.

use crate::key::{Key, KEY_MAX_LEN};
use crate::tuple::Tuple;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod clmul;

/// Rows of the byte table: one per input byte a 52-byte key can hash.
const TABLE_ROWS: usize = KEY_MAX_LEN - 4;

/// The bit-serial reference, exactly as the specification's pseudo-code: a 32-bit register holds
/// the current key window and shifts in one key bit per input bit. Key bits past the end of the
/// key read as zero (no NIC hashes inputs that long; see [`Key::max_input_len`]).
pub fn reference(key: &Key, input: &[u8]) -> u32 {
    let mut result = 0u32;
    let mut window = key.window(0);
    let mut next_bit = 32;
    for &byte in input {
        for b in 0..8 {
            if byte & (0x80 >> b) != 0 {
                result ^= window;
            }
            window = (window << 1) | key.bit(next_bit) as u32;
            next_bit += 1;
        }
    }
    result
}

/// Which implementation [`Toeplitz::hash_batch`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// Per-byte lookup tables (portable).
    Table,
    /// PCLMULQDQ + SSSE3 carry-less multiplication, one tuple at a time.
    Clmul,
    /// AVX-512 + GFNI + VPCLMULQDQ carry-less multiplication, four tuples per vector.
    Avx512Clmul,
}

impl Backend {
    /// Every backend this CPU can run, portable first.
    pub fn available() -> Vec<Backend> {
        let mut v = vec![Backend::Table];
        if Backend::Clmul.is_supported() {
            v.push(Backend::Clmul);
        }
        if Backend::Avx512Clmul.is_supported() {
            v.push(Backend::Avx512Clmul);
        }
        v
    }

    /// Whether this CPU can run the backend.
    pub fn is_supported(self) -> bool {
        match self {
            Backend::Table => true,
            #[cfg(target_arch = "x86_64")]
            Backend::Clmul => clmul::Cpu::detect().is_some(),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512Clmul => avx512::supported(),
            #[cfg(not(target_arch = "x86_64"))]
            Backend::Clmul | Backend::Avx512Clmul => false,
        }
    }

    /// Short name for output.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Table => "table",
            Backend::Clmul => "pclmul-ssse3",
            Backend::Avx512Clmul => "avx512-gfni-clmul",
        }
    }
}

/// The requested backend cannot run on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported(pub Backend);

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hash backend `{}` is not supported by this CPU",
            self.0.name()
        )
    }
}

impl std::error::Error for Unsupported {}

/// A Toeplitz hasher for one key: precomputed tables plus the best batch backend.
#[derive(Clone)]
pub struct Toeplitz {
    key: Key,
    table: Box<[[u32; 256]; TABLE_ROWS]>,
    backend: Backend,
    /// Set when [`Toeplitz::hash`] takes the carry-less path (every backend but `Table`, on a
    /// CPU with PCLMULQDQ): the CPU check, made once.
    #[cfg(target_arch = "x86_64")]
    single: Option<clmul::Cpu>,
    /// Key bits 0..127 and 0..319 as little-endian polynomials, for the carry-less path.
    clmul_keys: ClmulKeys,
}

/// The key as the second operand of a carry-less multiplication: its first 16 (40) bytes as
/// one big-endian integer, split into little-endian 64-bit words, so that bit `b` is key bit
/// `127 - b` (`319 - b`). Multiplying the bit-reversed input by it puts the hash at bits 96..128
/// (288..320) of the product, i.e. in a whole 32-bit word.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClmulKeys {
    /// For inputs of up to 12 bytes (IPv4).
    pub(crate) short: [u64; 2],
    /// For inputs of up to 36 bytes (IPv6).
    pub(crate) long: [u64; 5],
    /// `long` arranged for two 128-bit lanes (low word first): K2, K3, K0, K1 and K4, K3,
    /// K2, K1 (see `clmul.rs`).
    pub(crate) wide_x: [u64; 4],
    pub(crate) wide_y: [u64; 4],
    /// The same for four lanes, the third holding R4's key word: K2, K3, K0, K1, 0, 0, 0, 0
    /// and K4, K3, K2, K1, K0, 0, 0, 0.
    pub(crate) zmm_x: [u64; 8],
    pub(crate) zmm_y: [u64; 8],
    /// The 8×8 bit matrices of the IPv4 affine kernel (`clmul.rs`, `short_affine`): matrix `s`
    /// maps an input byte `i` to its part of hash byte `s - i`; its byte `r` is key bits
    /// `8s + r .. 8s + r + 8`, the row of output bit `7 - r` as GF2P8AFFINEQB reads it.
    pub(crate) affine: [u64; 16],
}

impl ClmulKeys {
    fn new(key: &Key) -> ClmulKeys {
        fn pack<const N: usize>(key: &Key) -> [u64; N] {
            let bytes = key.as_bytes();
            std::array::from_fn(|w| {
                // Word `w` counts from the least significant end.
                let end = (N - w) * 8;
                let mut b = [0u8; 8];
                b.copy_from_slice(&bytes[end - 8..end]);
                u64::from_be_bytes(b)
            })
        }
        let long = pack::<5>(key);
        let [k0, k1, k2, k3, k4] = long;
        ClmulKeys {
            short: pack::<2>(key),
            long,
            wide_x: [k2, k3, k0, k1],
            wide_y: [k4, k3, k2, k1],
            zmm_x: [k2, k3, k0, k1, 0, 0, 0, 0],
            zmm_y: [k4, k3, k2, k1, k0, 0, 0, 0],
            affine: std::array::from_fn(|s| {
                u64::from_le_bytes(std::array::from_fn(|r| (key.window(8 * s + r) >> 24) as u8))
            }),
        }
    }
}

impl std::fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toeplitz")
            .field("key", &self.key)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Toeplitz {
    /// A hasher for `key` using the fastest paths this CPU supports.
    pub fn new(key: &Key) -> Toeplitz {
        let best = Backend::available()
            .last()
            .copied()
            .unwrap_or(Backend::Table);
        Toeplitz::build(key, best)
    }

    /// A hasher whose batch path is `backend` (for tests and benchmarks). With
    /// [`Backend::Table`] single hashes take the table path too.
    pub fn with_backend(key: &Key, backend: Backend) -> Result<Toeplitz, Unsupported> {
        if !backend.is_supported() {
            return Err(Unsupported(backend));
        }
        Ok(Toeplitz::build(key, backend))
    }

    fn build(key: &Key, backend: Backend) -> Toeplitz {
        let mut table = Box::new([[0u32; 256]; TABLE_ROWS]);
        for (pos, row) in table.iter_mut().enumerate() {
            let windows: [u32; 8] = std::array::from_fn(|j| key.window(pos * 8 + j));
            for (v, slot) in row.iter_mut().enumerate() {
                *slot = (0..8)
                    .filter(|j| v & (0x80 >> j) != 0)
                    .fold(0, |acc, j| acc ^ windows[j]);
            }
        }
        Toeplitz {
            key: *key,
            table,
            backend,
            #[cfg(target_arch = "x86_64")]
            single: match backend {
                Backend::Table => None,
                // The named path reverses bytes by nibble shuffles; GFNI (which the AVX-512
                // backend needs anyway) reverses them in one instruction.
                Backend::Clmul => clmul::Cpu::detect().map(clmul::Cpu::without_gfni),
                Backend::Avx512Clmul => clmul::Cpu::detect(),
            },
            clmul_keys: ClmulKeys::new(key),
        }
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The byte table behind the hash: row `i`, column `b` is the hash contribution of input
    /// byte `i` having value `b`, so a hash is the XOR of one entry per input byte. Other
    /// implementations (e.g. the XDP steering program) load these rows. `rows` ≤ 48.
    pub fn byte_rows(&self, rows: usize) -> &[[u32; 256]] {
        &self.table[..rows.min(TABLE_ROWS)]
    }

    /// The batch backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// XOR of one table entry per input byte (fully unrolled for each tuple length).
    #[inline(always)]
    fn hash_fixed<const N: usize>(&self, bytes: &[u8; crate::tuple::MAX_INPUT_LEN]) -> u32 {
        // N <= 36 and both arrays are longer, so the slices compile to no checks.
        self.table[..N]
            .iter()
            .zip(&bytes[..N])
            .fold(0, |h, (row, &b)| h ^ row[b as usize])
    }

    /// Hash of a tuple: carry-less where the CPU has it, else the table path.
    #[inline]
    pub fn hash(&self, tuple: &Tuple) -> u32 {
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = self.single {
            return clmul::hash(cpu, &self.clmul_keys, tuple);
        }
        self.hash_table(tuple)
    }

    /// The table path, always inlined so batch loops do not pay a call per tuple.
    #[inline(always)]
    fn hash_table(&self, tuple: &Tuple) -> u32 {
        let bytes = tuple.padded_input();
        match tuple.input_len() {
            8 => self.hash_fixed::<8>(bytes),
            12 => self.hash_fixed::<12>(bytes),
            32 => self.hash_fixed::<32>(bytes),
            _ => self.hash_fixed::<36>(bytes),
        }
    }

    /// Hash of arbitrary input bytes (table path). Bytes past [`Key::max_input_len`] are hashed
    /// with zero key bits, as [`reference`] does.
    pub fn hash_bytes(&self, input: &[u8]) -> u32 {
        let (head, tail) = input.split_at(input.len().min(TABLE_ROWS));
        let mut h = head
            .iter()
            .zip(self.table.iter())
            .fold(0, |acc, (&b, row)| acc ^ row[b as usize]);
        for (i, &b) in tail.iter().enumerate() {
            for j in 0..8 {
                if b & (0x80 >> j) != 0 {
                    h ^= self.key.window((TABLE_ROWS + i) * 8 + j);
                }
            }
        }
        h
    }

    /// Hashes `tuples[i]` into `out[i]` for `i < min(tuples.len(), out.len())` and returns that
    /// count. Tuples of different kinds may be mixed; runs of one kind go through the SIMD path.
    pub fn hash_batch(&self, tuples: &[Tuple], out: &mut [u32]) -> usize {
        let n = tuples.len().min(out.len());
        let (tuples, out) = (&tuples[..n], &mut out[..n]);
        match self.backend {
            Backend::Table => {
                for (t, o) in tuples.iter().zip(out.iter_mut()) {
                    *o = self.hash_table(t);
                }
            }
            Backend::Clmul => self.hash_batch_single(tuples, out),
            Backend::Avx512Clmul => self.hash_batch_simd(tuples, out),
        }
        n
    }

    /// One carry-less hash after another (the CPU check made once, outside the loop).
    fn hash_batch_single(&self, tuples: &[Tuple], out: &mut [u32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(cpu) = self.single {
            return clmul::hash_all(cpu, &self.clmul_keys, tuples, out);
        }
        for (t, o) in tuples.iter().zip(out.iter_mut()) {
            *o = self.hash_table(t);
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn hash_batch_simd(&self, tuples: &[Tuple], out: &mut [u32]) {
        let done = avx512::hash_all(&self.clmul_keys, tuples, out);
        for (t, o) in tuples[done..].iter().zip(out[done..].iter_mut()) {
            *o = self.hash(t);
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn hash_batch_simd(&self, tuples: &[Tuple], out: &mut [u32]) {
        for (t, o) in tuples.iter().zip(out.iter_mut()) {
            *o = self.hash(t);
        }
    }
}

#[cfg(test)]
mod tests;
