//! A cache prefetch hint: this crate's one `unsafe`, kept because it is measured
//! (BENCHMARKS.md, "Flow table": batched lookups with loads in its place ran at a third of
//! the rate — a load that misses blocks retirement, a prefetch does not, so only prefetches
//! let a batch's 32 misses overlap).

#![allow(unsafe_code)]

/// Asks the CPU to bring `r`'s cache line in; nothing else happens.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, loads nothing into a register and writes
    // nothing, whatever the address (here a live reference's). SSE is in x86-64's baseline, so
    // the instruction exists wherever this code runs.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            (r as *const T).cast(),
        )
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
