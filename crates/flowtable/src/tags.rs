//! A bucket's tag match: which of its ten 16-bit tags equal the one looked for, exactly.
//!
//! On x86-64 with SSE2 (in the architecture's baseline): two 16-bit lane compares and two
//! byte masks for all ten slots. Measured against the four-lanes-a-word SWAR compare it
//! replaced (a loop over three words that stopped at the first with a match, and whose
//! lowest flag alone was exact): batched lookups 1.12–1.16× on the benchmark's workload,
//! in one process, alternated (BENCHMARKS.md, "Flow table"). The lookup stages wait on
//! memory; the fewer instructions each key's match takes behind its bucket's load, the more
//! keys' loads the CPU holds in flight at once. A branch-free SWAR variant (a multiply to
//! gather the flags) measured slower for the same reason: more instructions.

#![allow(unsafe_code)]

/// Slots with a tag.
const SLOTS: usize = 10;

/// The slots of `tags` (slot `s` in bits `16 s % 64` of word `s / 4`) whose tag is `tag`:
/// bits `2 s` and `2 s + 1` set for each, nothing else (the two lanes past slot 9 are never
/// matched).
#[inline(always)]
pub(crate) fn matching(tags: &[u64; 3], tag: u16) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{
            _mm_cmpeq_epi16, _mm_cvtsi64_si128, _mm_movemask_epi8, _mm_set1_epi16, _mm_set_epi64x,
        };
        // SAFETY: these intrinsics only compute on the registers they are given (no memory
        // is read through a pointer: the words are passed by value), and they need SSE2,
        // which every x86-64 CPU has (it is in the target's baseline features).
        unsafe {
            let want = _mm_set1_epi16(tag as i16);
            let low = _mm_set_epi64x(tags[1] as i64, tags[0] as i64);
            let high = _mm_cvtsi64_si128(tags[2] as i64);
            let a = _mm_movemask_epi8(_mm_cmpeq_epi16(low, want)) as u32;
            let b = _mm_movemask_epi8(_mm_cmpeq_epi16(high, want)) as u32 & 0xf;
            a | b << 16
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        portable(tags, tag)
    }
}

/// The same, a slot at a time (other architectures; the reference the tests hold the SIMD
/// form to).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(crate) fn portable(tags: &[u64; 3], tag: u16) -> u32 {
    (0..SLOTS)
        .filter(|&s| (tags[s / 4] >> (16 * (s % 4))) as u16 == tag)
        .fold(0, |m, s| m | 3 << (2 * s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any words, a tag drawn from them or not: the SIMD form gives the portable one's
        /// slots, and never a lane past slot 9.
        #[test]
        fn simd_matches_portable(tags in any::<[u64; 3]>(), pick in 0usize..13, other: u16) {
            let tag = if pick < 12 { (tags[pick / 4] >> (16 * (pick % 4))) as u16 } else { other };
            let m = matching(&tags, tag);
            prop_assert_eq!(m, portable(&tags, tag));
            prop_assert_eq!(m >> 20, 0);
        }
    }

    #[test]
    fn repeated_tags_and_the_lanes_past_the_slots() {
        // Tag 7 in slots 1, 4 and 9, and in both lanes past slot 9 (a bucket's spill filter
        // and count): those two are not slots.
        let tags = [7u64 << 16, 7, 7 << 16 | 7 << 32 | 7 << 48];
        assert_eq!(matching(&tags, 7), 3 << 2 | 3 << 8 | 3 << 18);
        assert_eq!(matching(&tags, 0).count_ones(), 2 * 7);
        assert_eq!(matching(&tags, 8), 0);
    }
}
