//! The crate's only `unsafe`: two uses of `core::arch` for the batch lookup, each measured
//! necessary (docs/benchmarks-history.md).
//!
//! - [`prefetch`]: without it the batch lookup's node and leaf loads wait behind branches on
//!   data still in memory (1.7–2.8× on batch lookups).
//! - [`bounds_at_or_below`]: a range line's ten comparisons as three vector compares and one
//!   population count. Written as plain Rust, the compiler vectorises part of it and then
//!   takes the lanes' results apart one by one: IPv6 batch lookups ran 203 instructions
//!   each against 176 with this, and 1.06× (inside) to 1.11× (working set) slower.

#![allow(unsafe_code)]

/// Asks the CPU to bring the cache line at `p` into L1 (`PREFETCHT0`); nothing is read into
/// a register and no fault can result, whatever the address, so callers may pass one they
/// have not bounds-checked (a reference coerces). A no-op on other architectures.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults (not even on an unmapped address), never
    // changes memory or registers, and nothing is dereferenced. SSE, which it needs, is part
    // of every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// How many of the ten `bounds` are at or below `x` (unsigned): three 4-lane compares, the
/// last overlapping the second by two lanes, narrowed into one byte mask and counted.
#[cfg(all(target_arch = "x86_64", target_feature = "sse4.1"))]
#[inline(always)]
pub(crate) fn bounds_at_or_below(bounds: &[u32; 10], x: u32) -> u32 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi32, _mm_min_epu32, _mm_movemask_epi8, _mm_packs_epi16,
        _mm_packs_epi32, _mm_set1_epi32, _mm_set_epi32,
    };
    // SAFETY: these intrinsics take no pointers and touch no memory; all they need is SSE4.1
    // (PMINUD), which the `cfg` above proves the build targets. `bounds` is read by safe,
    // constant indexing; the compiler fuses each group of four into one load.
    unsafe {
        let xv = _mm_set1_epi32(x as i32);
        let four = |i: usize| {
            _mm_set_epi32(
                bounds[i + 3] as i32,
                bounds[i + 2] as i32,
                bounds[i + 1] as i32,
                bounds[i] as i32,
            )
        };
        // b <= x exactly when min(b, x) == b: a lane of all ones.
        let le = |b: __m128i| _mm_cmpeq_epi32(_mm_min_epu32(b, xv), b);
        // Narrowed with signed saturation (all ones stays all ones, zero stays zero) into
        // one byte a lane: bounds 0-7, then 6-9 twice. Lanes 6 and 7 are in both the second
        // and the third compare: keep the third's lanes 8 and 9 only (mask bits 10, 11).
        let third = le(four(6));
        let bytes = _mm_packs_epi16(
            _mm_packs_epi32(le(four(0)), le(four(4))),
            _mm_packs_epi32(third, third),
        );
        (_mm_movemask_epi8(bytes) as u32 & 0x0CFF).count_ones()
    }
}

/// How many of the ten `bounds` are at or below `x`.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse4.1")))]
#[inline(always)]
pub(crate) fn bounds_at_or_below(bounds: &[u32; 10], x: u32) -> u32 {
    bounds.iter().map(|&b| u32::from(b <= x)).sum()
}

#[cfg(test)]
mod tests {
    use super::bounds_at_or_below;
    use proptest::prelude::*;

    fn plain(bounds: &[u32; 10], x: u32) -> u32 {
        bounds.iter().filter(|&&b| b <= x).count() as u32
    }

    #[test]
    fn counts_at_the_edges() {
        let mut b = [u32::MAX; 10];
        assert_eq!(bounds_at_or_below(&b, 0), 0);
        assert_eq!(bounds_at_or_below(&b, u32::MAX), 10);
        for (i, v) in b.iter_mut().enumerate() {
            *v = (i as u32 + 1) << 28;
        }
        // Above the sign bit, where a signed compare would go wrong.
        for i in 0..10u32 {
            let x = (i + 1) << 28;
            assert_eq!(bounds_at_or_below(&b, x), i + 1);
            assert_eq!(bounds_at_or_below(&b, x - 1), i);
        }
    }

    proptest! {
        #[test]
        fn counts_like_a_plain_loop(mut b in proptest::array::uniform10(any::<u32>()), x in any::<u32>()) {
            b.sort_unstable();
            prop_assert_eq!(bounds_at_or_below(&b, x), plain(&b, x));
            // Unsorted too: the count never relies on the order.
            b.reverse();
            prop_assert_eq!(bounds_at_or_below(&b, x), plain(&b, x));
        }
    }
}
