//! The crate's one `unsafe` block: a cache prefetch hint for the batch lookup.
//!
//! Measured necessary (BENCHMARKS.md): without it the batch lookup's node and leaf loads
//! wait behind branches on data still in memory.

#![allow(unsafe_code)]

/// Asks the CPU to bring `r`'s cache line into L1 (`PREFETCHT0`); nothing is read into a
/// register and no fault can result. A no-op on other architectures.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, never changes memory or registers, and
    // `r` is a live reference (so the address is valid anyway). SSE, which it needs, is part
    // of every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (r as *const T).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}
