//! RSS keys: parsing, generation and analysis.
//!
//! A Toeplitz key is a bit string; the hash of an input bit at position `i` (counted from the most
//! significant bit of the first input byte) is the 32-bit window of the key starting at key bit `i`.
//! A key of `L` bytes therefore hashes inputs of up to `L - 4` bytes. NICs use 40-byte keys
//! (Intel 82599, mlx5, virtio) or 52-byte keys (Intel ice/i40e); both are accepted here.

use std::fmt;
use std::str::FromStr;

use crate::gf2;

/// Shortest key accepted, in bytes (hashes up to 36 input bytes: an IPv6 4-tuple).
pub const KEY_MIN_LEN: usize = 40;
/// Longest key accepted, in bytes (Intel i40e / ice use 52-byte keys).
pub const KEY_MAX_LEN: usize = 52;

/// Why a key could not be made or parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// The key has this many bytes; it must have 40 to 52.
    BadLength {
        /// Bytes found.
        len: usize,
    },
    /// A character that is not a hex digit (or a misplaced `:`) at this byte offset of the text.
    BadChar {
        /// Byte offset in the text.
        offset: usize,
    },
    /// An odd number of hex digits, or a colon group that is not exactly two digits.
    OddDigits,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::BadLength { len } => write!(
                f,
                "RSS key has {len} bytes; it must have {KEY_MIN_LEN} to {KEY_MAX_LEN} bytes \
                 ({}..{} hex digits)",
                KEY_MIN_LEN * 2,
                KEY_MAX_LEN * 2
            ),
            KeyError::BadChar { offset } => {
                write!(
                    f,
                    "RSS key: character at offset {offset} is not a hex digit"
                )
            }
            KeyError::OddDigits => write!(
                f,
                "RSS key: hex digits must come in pairs (`6d5a56…` or ethtool's `6d:5a:56:…`)"
            ),
        }
    }
}

impl std::error::Error for KeyError {}

/// A Toeplitz RSS key of 40 to 52 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    bytes: [u8; KEY_MAX_LEN],
    len: u8,
}

/// The Microsoft key from the "Verifying the RSS Hash Calculation" page: the default of most NICs.
const MICROSOFT_BYTES: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

impl Key {
    /// The Microsoft default key (`6d5a56da…01fa`, 40 bytes).
    pub const MICROSOFT: Key = Key::from_array(MICROSOFT_BYTES);

    const fn from_array<const N: usize>(src: [u8; N]) -> Key {
        let mut bytes = [0u8; KEY_MAX_LEN];
        let mut i = 0;
        while i < N {
            bytes[i] = src[i];
            i += 1;
        }
        Key {
            bytes,
            len: N as u8,
        }
    }

    /// A key from raw bytes (40 to 52 of them).
    pub fn new(bytes: &[u8]) -> Result<Key, KeyError> {
        if !(KEY_MIN_LEN..=KEY_MAX_LEN).contains(&bytes.len()) {
            return Err(KeyError::BadLength { len: bytes.len() });
        }
        let mut key = Key {
            bytes: [0; KEY_MAX_LEN],
            len: bytes.len() as u8,
        };
        key.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(key)
    }

    /// The symmetric key `6d5a` repeated over 40 bytes (Woo and Park, "Scalable TCP Session
    /// Monitoring with Symmetric Receive-side Scaling"): its 16-bit period makes the hash of
    /// (a, b, p, q) equal to that of (b, a, q, p) — at the price of only 16 bits of output.
    pub fn symmetric() -> Key {
        let mut bytes = [0u8; 40];
        for pair in bytes.chunks_exact_mut(2) {
            pair.copy_from_slice(&[0x6d, 0x5a]);
        }
        Key::from_array(bytes)
    }

    /// A random key of `len` bytes from `rng`.
    pub fn random<R: rand::Rng + ?Sized>(len: usize, rng: &mut R) -> Result<Key, KeyError> {
        let mut bytes = [0u8; KEY_MAX_LEN];
        let buf = bytes.get_mut(..len).ok_or(KeyError::BadLength { len })?;
        rng.fill_bytes(buf);
        Key::new(buf)
    }

    /// Parses hex (`6d5a56da…`, optional `0x`) or ethtool's colon form (`6d:5a:56:da:…`).
    /// Surrounding whitespace is ignored.
    pub fn parse(text: &str) -> Result<Key, KeyError> {
        let s = text.trim();
        let lead = text.len() - text.trim_start().len();
        let (s, lead) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(rest) => (rest, lead + 2),
            None => (s, lead),
        };
        let mut out = [0u8; KEY_MAX_LEN];
        let mut n = 0usize;
        let raw = s.as_bytes();
        let colon_form = raw.contains(&b':');
        let mut i = 0usize;
        while i < raw.len() {
            if colon_form && i > 0 {
                // Groups are separated by exactly one colon.
                if raw[i] != b':' {
                    return Err(KeyError::OddDigits);
                }
                i += 1;
            }
            let hi = *raw.get(i).ok_or(KeyError::OddDigits)?;
            let lo = *raw.get(i + 1).ok_or(KeyError::OddDigits)?;
            let hi = hex_val(hi).ok_or(KeyError::BadChar { offset: lead + i })?;
            let lo = hex_val(lo).ok_or(KeyError::BadChar {
                offset: lead + i + 1,
            })?;
            if n < KEY_MAX_LEN {
                out[n] = (hi << 4) | lo;
            }
            n += 1;
            i += 2;
        }
        if n > KEY_MAX_LEN {
            return Err(KeyError::BadLength { len: n });
        }
        Key::new(&out[..n])
    }

    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len()]
    }

    /// Length in bytes.
    #[allow(clippy::len_without_is_empty)] // a key is never empty
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Longest input this key can hash, in bytes (`len - 4`).
    pub fn max_input_len(&self) -> usize {
        self.len() - 4
    }

    /// Key bit `i`, counted from the most significant bit of byte 0. Bits past the end are 0.
    pub fn bit(&self, i: usize) -> bool {
        match self.bytes.get(i / 8) {
            Some(b) if i / 8 < self.len() => (b >> (7 - (i % 8))) & 1 == 1,
            _ => false,
        }
    }

    /// The 32-bit window of the key starting at bit `i` (what input bit `i` contributes).
    pub fn window(&self, i: usize) -> u32 {
        let byte = i / 8;
        let shift = i % 8;
        let mut w: u64 = 0;
        for k in 0..5 {
            let b = if byte + k < self.len() {
                self.bytes[byte + k]
            } else {
                0
            };
            w = (w << 8) | b as u64;
        }
        ((w << shift) >> 8) as u32
    }

    /// Lower-case hex, no separators.
    pub fn to_hex(&self) -> String {
        self.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// ethtool's colon form (`6d:5a:…`), as `ethtool -x` prints and `ethtool -X hkey` takes.
    pub fn to_colon_hex(&self) -> String {
        let parts: Vec<String> = self.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        parts.join(":")
    }

    /// The smallest `p` such that key bit `i` equals bit `i + p` wherever both exist, i.e. the
    /// key's period in bits; `None` when the key does not repeat at least twice (a "period"
    /// longer than half the key only says its head equals its tail, which harms nothing).
    /// A key with period `p` maps input bits `i` and `i + p` to the same window: fields that are
    /// `p` bits apart can be swapped without changing the hash (the symmetric-key trick).
    pub fn period_bits(&self) -> Option<usize> {
        let nbits = self.len() * 8;
        (1..=nbits / 2).find(|&p| (0..nbits - p).all(|i| self.bit(i) == self.bit(i + p)))
    }

    /// How many independent output bits the hash has for inputs of `input_len` bytes: the rank
    /// over GF(2) of the windows of all input bit positions. A good key gives 32; the symmetric
    /// `6d5a` key gives 16, so at most 65 536 distinct hash values exist however varied the input.
    pub fn entropy_bits(&self, input_len: usize) -> u32 {
        let n = input_len.min(self.max_input_len()) * 8;
        let rows: Vec<u64> = (0..n).map(|i| self.window(i) as u64).collect();
        gf2::rank(&rows)
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl Default for Key {
    fn default() -> Key {
        Key::MICROSOFT
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.to_hex())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Key, KeyError> {
        Key::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS_HEX: &str =
        "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa";

    #[test]
    fn parses_hex_and_colon_forms() {
        assert_eq!(Key::parse(MS_HEX), Ok(Key::MICROSOFT));
        let colon = Key::MICROSOFT.to_colon_hex();
        assert_eq!(&colon[..8], "6d:5a:56");
        assert_eq!(Key::parse(&colon), Ok(Key::MICROSOFT));
        assert_eq!(
            Key::parse(&format!("  0x{}\n", MS_HEX.to_uppercase())),
            Ok(Key::MICROSOFT)
        );
        assert_eq!(Key::MICROSOFT.to_string(), MS_HEX);
    }

    #[test]
    fn rejects_bad_keys() {
        assert_eq!(Key::parse("6d5a"), Err(KeyError::BadLength { len: 2 }));
        assert_eq!(Key::parse(""), Err(KeyError::BadLength { len: 0 }));
        assert_eq!(Key::parse(&MS_HEX[1..]), Err(KeyError::OddDigits));
        let mut bad = MS_HEX.to_string();
        bad.replace_range(4..5, "g");
        assert_eq!(Key::parse(&bad), Err(KeyError::BadChar { offset: 4 }));
        assert_eq!(Key::parse("6d:5a5:6"), Err(KeyError::OddDigits));
        assert_eq!(Key::parse("6d::5a"), Err(KeyError::BadChar { offset: 3 }));
        let long = "ab".repeat(KEY_MAX_LEN + 1);
        assert_eq!(Key::parse(&long), Err(KeyError::BadLength { len: 53 }));
        assert!(Key::parse(&"ab".repeat(KEY_MAX_LEN)).is_ok());
    }

    #[test]
    fn windows_are_key_bit_slices() {
        let k = Key::MICROSOFT;
        assert_eq!(k.window(0), 0x6d5a56da);
        assert_eq!(k.window(8), 0x5a56da25);
        assert_eq!(k.window(4), 0xd5a56da2);
        // The last window runs off the end of the key into zeros.
        assert_eq!(k.window(k.len() * 8 - 8), 0xfa00_0000);
    }

    #[test]
    fn symmetric_key_has_period_16_and_16_bits() {
        let s = Key::symmetric();
        assert_eq!(s.period_bits(), Some(16));
        assert_eq!(s.entropy_bits(12), 16);
        assert_eq!(s.entropy_bits(36), 16);
        assert_eq!(Key::MICROSOFT.period_bits(), None);
        assert_eq!(Key::MICROSOFT.entropy_bits(12), 32);
        assert_eq!(Key::MICROSOFT.entropy_bits(36), 32);
    }

    #[test]
    fn random_keys_have_requested_length() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let k = Key::random(52, &mut rng).expect("52 is a valid length");
        assert_eq!(k.len(), 52);
        assert_eq!(
            Key::random(39, &mut rng),
            Err(KeyError::BadLength { len: 39 })
        );
        assert_eq!(
            Key::random(100, &mut rng),
            Err(KeyError::BadLength { len: 100 })
        );
    }
}
