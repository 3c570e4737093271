//! A cache prefetch hint: this crate's one `unsafe`, kept because it is measured
//! (BENCHMARKS.md, "Flow table": batched lookups with loads in its place ran at a third of
//! the rate — a load that misses blocks retirement, a prefetch does not, so only prefetches
//! let a batch's 32 misses overlap).

#![allow(unsafe_code)]

/// Asks the CPU to bring `r`'s cache line in; nothing else happens.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    prefetch_addr((r as *const T).cast());
}

/// Asks the CPU to bring the cache line of address `p` in (a byte inside a value, which no
/// reference names); nothing else happens, whatever `p` is.
#[inline(always)]
pub(crate) fn prefetch_addr(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, loads nothing into a register and writes
    // nothing, whatever the address (here always one inside a live allocation). SSE is in
    // x86-64's baseline, so the instruction exists wherever this code runs.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
