//! The Internet checksum: one's-complement sum of 16-bit big-endian words (RFC 1071), and the
//! incremental update of RFC 1624 (`HC' = ~(~HC + ~m + m')`, eqn. 3).

/// One's-complement sum of `data` added to `acc` (not folded). An odd trailing byte is padded
/// with a zero byte.
#[inline]
pub fn sum(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        acc += u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64;
    }
    let rest = chunks.remainder();
    let mut i = 0;
    while i + 1 < rest.len() {
        acc += u16::from_be_bytes([rest[i], rest[i + 1]]) as u64;
        i += 2;
    }
    if i < rest.len() {
        acc += (rest[i] as u64) << 8;
    }
    acc
}

/// Folds a sum to 16 bits (end-around carry).
#[inline]
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The checksum of `data`: the complement of the folded sum.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(data, 0))
}

/// RFC 1624 eqn. 3: the checksum after bytes `old` (even length, at an even offset of the
/// checksummed data) were replaced by `new`.
#[inline]
pub fn update(check: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    let mut acc = (!check) as u64;
    // ~m is added as (0xffff - m) per word: sum of complements = words*0xffff - sum(old).
    let words = old.len().div_ceil(2) as u64;
    acc += words * 0xffff - fold_sum_exact(old);
    acc += fold_sum_exact(new);
    !fold(acc)
}

/// Unfolded sum of 16-bit words, exact (no end-around carry), for the subtraction in [`update`].
#[inline]
fn fold_sum_exact(data: &[u8]) -> u64 {
    let mut acc = 0u64;
    let mut i = 0;
    while i + 1 < data.len() {
        acc += u16::from_be_bytes([data[i], data[i + 1]]) as u64;
        i += 2;
    }
    if i < data.len() {
        acc += (data[i] as u64) << 8;
    }
    acc
}

/// Sum of an IPv4/IPv6 pseudo-header for UDP (addresses, protocol 17, UDP length).
pub fn pseudo_header(src: &[u8], dst: &[u8], udp_len: u32) -> u64 {
    let mut acc = sum(src, 0);
    acc = sum(dst, acc);
    acc + 17 + (udp_len >> 16) as u64 + (udp_len & 0xffff) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: words 0001 f203 f4f5 f6f7 sum to ddf2 (folded).
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&d, 0)), 0xddf2);
        assert_eq!(checksum(&d), !0xddf2);
    }

    #[test]
    fn ipv4_header_checks_to_zero() {
        // A real IPv4 header with its checksum (0xb861) in place sums to 0xffff.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0);
    }

    proptest! {
        /// Patching any even-aligned field incrementally equals recomputing from scratch.
        #[test]
        fn incremental_equals_full(
            mut data in proptest::collection::vec(any::<u8>(), 2..200),
            at in 0usize..100,
            new in proptest::collection::vec(any::<u8>(), 1..16),
        ) {
            let at = (at % data.len()) & !1;
            let n = (new.len() & !1).max(2).min((data.len() - at) & !1);
            prop_assume!(n >= 2);
            let before = checksum(&data);
            let old = data[at..at + n].to_vec();
            data[at..at + n].copy_from_slice(&new.iter().cycle().take(n).copied().collect::<Vec<_>>());
            let inc = update(before, &old, &data[at..at + n]);
            let full = checksum(&data);
            // 0x0000 and 0xffff are the same value in one's complement.
            prop_assert!(inc == full || (inc ^ full) == 0xffff && (inc == 0 || full == 0));
        }
    }
}
