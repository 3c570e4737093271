//! Address keys (IPv4 as `u32`, IPv6 as `u128`, network byte order read as a big integer) and
//! prefixes over them.

use std::fmt;
use std::hash::Hash;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::ops::{BitOr, BitXor};
use std::str::FromStr;

use crate::{DIRECT_BITS, MAX_NEXT_HOP, STRIDE};

/// An address family's key: an unsigned integer whose most significant bit is the first
/// address bit on the wire.
pub trait Key:
    Copy
    + Eq
    + Ord
    + Hash
    + fmt::Debug
    + Default
    + Send
    + Sync
    + 'static
    + BitOr<Output = Self>
    + BitXor<Output = Self>
    + private::Sealed
{
    /// Address width in bits (32 or 128).
    const BITS: u8;
    /// The `std::net` address type.
    type Addr: Copy + fmt::Display + FromStr + Into<Self> + From<Self>;

    /// Keeps the first `len` bits (`len <= BITS`), zeroing the rest.
    fn mask(self, len: u8) -> Self;
    /// The direct-pointing slot: the first 18 bits.
    fn slot(self) -> usize;
    /// The first address of a direct slot.
    fn slot_base(slot: usize) -> Self;
    /// The 6 bits starting at bit `offset` (`offset < BITS`); bits past the end read as 0.
    fn stride(self, offset: u32) -> u32;
    /// The 64 bits starting at bit `offset` (`offset < BITS`), first bit most significant;
    /// bits past the end read as 0.
    fn bits64(self, offset: u32) -> u64;
}

mod private {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u128 {}
}

impl Key for u32 {
    const BITS: u8 = 32;
    type Addr = Ipv4Addr;
    #[inline(always)]
    fn mask(self, len: u8) -> u32 {
        if len == 0 {
            0
        } else {
            self & (u32::MAX << (32 - u32::from(len.min(32))))
        }
    }
    #[inline(always)]
    fn slot(self) -> usize {
        (self >> (32 - DIRECT_BITS)) as usize
    }
    #[inline(always)]
    fn slot_base(slot: usize) -> u32 {
        (slot as u32) << (32 - DIRECT_BITS)
    }
    #[inline(always)]
    fn stride(self, offset: u32) -> u32 {
        (self << offset) >> (32 - STRIDE)
    }
    #[inline(always)]
    fn bits64(self, offset: u32) -> u64 {
        (u64::from(self) << 32) << offset.min(32)
    }
}

impl Key for u128 {
    const BITS: u8 = 128;
    type Addr = Ipv6Addr;
    #[inline(always)]
    fn mask(self, len: u8) -> u128 {
        if len == 0 {
            0
        } else {
            self & (u128::MAX << (128 - u32::from(len.min(128))))
        }
    }
    #[inline(always)]
    fn slot(self) -> usize {
        (self >> (128 - DIRECT_BITS)) as usize
    }
    #[inline(always)]
    fn slot_base(slot: usize) -> u128 {
        (slot as u128) << (128 - DIRECT_BITS)
    }
    #[inline(always)]
    fn stride(self, offset: u32) -> u32 {
        ((self << offset) >> (128 - STRIDE)) as u32
    }
    #[inline(always)]
    fn bits64(self, offset: u32) -> u64 {
        // Two 64-bit halves and a double shift (SHLD): a general u128 shift is a longer
        // sequence, and lookups call this at every node below /18.
        let (hi, lo) = ((self >> 64) as u64, self as u64);
        if offset < 64 {
            // `lo >> 1 >> (63 - offset)`: `lo >> (64 - offset)` without a shift by 64.
            (hi << offset) | ((lo >> 1) >> (63 - offset))
        } else {
            lo << (offset - 64).min(63)
        }
    }
}

/// Why a prefix or route was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// The length is longer than the address.
    #[error("prefix length {len} is longer than the address ({max} bits)")]
    TooLong {
        /// Given length.
        len: u8,
        /// Address width.
        max: u8,
    },
    /// Bits after the prefix length are set (`10.1.2.3/8`); the message names the network.
    #[error("host bits are set after the prefix length")]
    HostBitsSet,
    /// The next hop is above [`MAX_NEXT_HOP`].
    #[error("next hop {0} is above the largest allowed index {max}", max = MAX_NEXT_HOP)]
    NextHopReserved(u32),
}

/// A prefix: the first `len` bits of `addr` (the rest are zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Prefix<K: Key> {
    addr: K,
    len: u8,
}

impl<K: Key> Prefix<K> {
    /// A prefix; refuses a length past the address width and set host bits.
    pub fn new(addr: K, len: u8) -> Result<Self, PrefixError> {
        if len > K::BITS {
            return Err(PrefixError::TooLong { len, max: K::BITS });
        }
        if addr.mask(len) != addr {
            return Err(PrefixError::HostBitsSet);
        }
        Ok(Prefix { addr, len })
    }

    /// The prefix covering `addr` with length `len` (host bits cleared; length clamped).
    pub fn covering(addr: K, len: u8) -> Self {
        let len = len.min(K::BITS);
        Prefix {
            addr: addr.mask(len),
            len,
        }
    }

    /// First address.
    pub fn addr(&self) -> K {
        self.addr
    }

    /// Length in bits.
    pub fn len(&self) -> u8 {
        self.len
    }

    /// True for the default route (length 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `addr` lies inside the prefix.
    pub fn contains(&self, addr: K) -> bool {
        addr.mask(self.len) == self.addr
    }
}

impl<K: Key> fmt::Display for Prefix<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", K::Addr::from(self.addr), self.len)
    }
}

/// Parses `ADDR/LEN` (or a bare address as a host route). Errors are human-readable.
impl<K: Key> FromStr for Prefix<K> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: K = a
            .parse::<K::Addr>()
            .map_err(|_| {
                format!(
                    "`{}` is not an IPv{} address",
                    crate::excerpt(a),
                    if K::BITS == 32 { 4 } else { 6 }
                )
            })?
            .into();
        let len = match l {
            None => K::BITS,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|&n| n <= K::BITS)
                .ok_or_else(|| {
                    format!(
                        "bad prefix length `{}` (allowed 0–{})",
                        crate::excerpt(l),
                        K::BITS
                    )
                })?,
        };
        Prefix::new(addr, len).map_err(|e| match e {
            PrefixError::HostBitsSet => format!(
                "`{}` has host bits set after /{len}; the network is {}",
                crate::excerpt(s),
                Prefix::covering(addr, len)
            ),
            e => e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_slots() {
        let a: u32 = 0xC612_3456; // 198.18.52.86
        assert_eq!(a.slot(), (0xC612_3456u32 >> 14) as usize);
        assert_eq!(a.stride(0), 0xC6 >> 2);
        assert_eq!(a.stride(18), (a >> 8) & 63);
        assert_eq!(a.stride(30), (a & 3) << 4, "past-the-end bits read as zero");
        let b: u128 = 0x2001_0002_0000_0000_0000_0000_0000_00ffu128;
        assert_eq!(b.stride(126), (0xff & 3) << 4);
        assert_eq!(a.bits64(0), 0xC612_3456_0000_0000);
        assert_eq!(a.bits64(18), 0x3456u64 << 50);
        assert_eq!(a.bits64(31), 0);
        assert_eq!(b.bits64(0), 0x2001_0002_0000_0000);
        assert_eq!(b.bits64(16), 0x0002_0000_0000_0000);
        assert_eq!(b.bits64(120), 0xffu64 << 56);
        assert_eq!(u128::slot_base(b.slot()), b.mask(18));
        assert_eq!(0xffff_ffffu32.mask(0), 0);
        assert_eq!(0xffff_ffffu32.mask(32), 0xffff_ffff);
        assert_eq!(u128::MAX.mask(128), u128::MAX);
    }

    #[test]
    fn bits64_is_a_shift_at_every_offset() {
        // The two-halves form against the plain 128-bit shift, at every offset either side of
        // the halves' boundary; the slot a lookup takes is its first 6 bits.
        let keys = [
            0x2001_0002_0000_ffff_8000_0000_0000_0001u128,
            u128::MAX,
            1,
            1 << 64,
            (1 << 64) - 1,
            0x8000_0000_0000_0000_0000_0000_0000_0000,
        ];
        for k in keys {
            for offset in 0..128 {
                assert_eq!(
                    k.bits64(offset),
                    ((k << offset) >> 64) as u64,
                    "{k:x} at {offset}"
                );
                assert_eq!((k.bits64(offset) >> 58) as u32, k.stride(offset));
            }
        }
        for k in [0xC612_0480u32, u32::MAX, 1] {
            for offset in 0..32 {
                assert_eq!((k.bits64(offset) >> 58) as u32, k.stride(offset));
            }
        }
    }

    #[test]
    fn parse_prefixes() {
        let p: Prefix<u32> = "198.18.0.0/15".parse().expect("test input is valid");
        assert_eq!((p.addr(), p.len()), (0xC612_0000, 15));
        assert_eq!(p.to_string(), "198.18.0.0/15");
        let h: Prefix<u32> = "198.18.0.1".parse().expect("test input is valid");
        assert_eq!(h.len(), 32);
        let e = "198.18.0.1/15"
            .parse::<Prefix<u32>>()
            .expect_err("input is invalid");
        assert!(e.contains("198.18.0.0/15"), "{e}");
        assert!("198.18.0.0/33".parse::<Prefix<u32>>().is_err());
        assert!("2001:2::/48".parse::<Prefix<u32>>().is_err());
        let v6: Prefix<u128> = "2001:2::/48".parse().expect("test input is valid");
        assert_eq!(v6.to_string(), "2001:2::/48");
        assert!(v6.contains(0x2001_0002_0000_ffff_0000_0000_0000_0001));
        assert!("::/129".parse::<Prefix<u128>>().is_err());
    }
}
