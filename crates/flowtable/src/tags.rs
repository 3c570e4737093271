//! A bucket's tag match: which of its thirty 16-bit tags equal the one looked for, exactly.
//!
//! On x86-64 with SSE2 (in the architecture's baseline): four 16-bit lane compares, packed
//! to bytes and gathered into one bit a slot. The lookup stages wait on memory; the fewer
//! instructions each key's match takes behind its bucket's load, the more keys' loads the
//! CPU holds in flight at once. (Ten slots compared this way ran 1.12–1.16× the
//! four-lanes-a-word SWAR loop it replaced; a branch-free SWAR variant with a multiply to
//! gather the flags measured slower: more instructions. BENCHMARKS.md, "Flow table".)

#![allow(unsafe_code)]

/// Slots with a tag.
pub(crate) const SLOTS: usize = 30;
/// Lanes in a bucket's line: its slots' tags, then two more (the bucket's spill filter and
/// count), never matched.
pub(crate) const LANES: usize = 32;

/// The slots of `tags` whose tag is `tag`: bit `s` set for each slot `s` that matches,
/// nothing else (the two lanes past the slots are never matched).
#[inline(always)]
pub(crate) fn matching(tags: &[u16; LANES], tag: u16) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{
            __m128i, _mm_cmpeq_epi16, _mm_loadu_si128, _mm_movemask_epi8, _mm_packs_epi16,
            _mm_set1_epi16,
        };
        let p = tags.as_ptr().cast::<__m128i>();
        // SAFETY: the four unaligned 16-byte loads read lanes 0-7, 8-15, 16-23 and 24-31 of
        // `tags`, all inside the 64-byte array the reference names; the other intrinsics
        // compute on registers. They need SSE2, which every x86-64 CPU has (it is in the
        // target's baseline features).
        unsafe {
            let want = _mm_set1_epi16(tag as i16);
            let a = _mm_cmpeq_epi16(_mm_loadu_si128(p), want);
            let b = _mm_cmpeq_epi16(_mm_loadu_si128(p.add(1)), want);
            let c = _mm_cmpeq_epi16(_mm_loadu_si128(p.add(2)), want);
            let d = _mm_cmpeq_epi16(_mm_loadu_si128(p.add(3)), want);
            // A matching lane is all ones (-1), packed to the byte -1; others to 0.
            let low = _mm_movemask_epi8(_mm_packs_epi16(a, b)) as u32;
            let high = _mm_movemask_epi8(_mm_packs_epi16(c, d)) as u32;
            (low | high << 16) & ((1 << SLOTS) - 1)
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
pub(crate) fn portable(tags: &[u16; LANES], tag: u16) -> u32 {
    (0..SLOTS)
        .filter(|&s| tags[s] == tag)
        .fold(0, |m, s| m | 1 << s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any lanes, a tag drawn from them or not: the SIMD form gives the portable one's
        /// slots, and never a lane past the slots.
        #[test]
        fn simd_matches_portable(tags in any::<[u16; LANES]>(), pick in 0usize..33, other: u16) {
            let tag = if pick < LANES { tags[pick] } else { other };
            let m = matching(&tags, tag);
            prop_assert_eq!(m, portable(&tags, tag));
            prop_assert_eq!(m >> SLOTS, 0);
        }
    }

    #[test]
    fn repeated_tags_and_the_lanes_past_the_slots() {
        // Tag 7 in slots 1, 4, 9 and 29, and in both lanes past the slots (a bucket's spill
        // filter and count): those two are not slots.
        let mut tags = [0u16; LANES];
        for s in [1, 4, 9, 29, 30, 31] {
            tags[s] = 7;
        }
        assert_eq!(matching(&tags, 7), 1 << 1 | 1 << 4 | 1 << 9 | 1 << 29);
        assert_eq!(matching(&tags, 0).count_ones(), SLOTS as u32 - 4);
        assert_eq!(matching(&tags, 8), 0);
        // A tag whose high bit is set (the compare is of whole lanes, not signed bytes).
        tags[12] = 0x8001;
        assert_eq!(matching(&tags, 0x8001), 1 << 12);
    }
}
