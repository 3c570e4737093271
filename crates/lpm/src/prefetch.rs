//! The crate's one `unsafe` block: a cache prefetch hint for the batch lookup.
//!
//! Measured necessary (BENCHMARKS.md): without it the batch lookup's node and leaf loads
//! wait behind branches on data still in memory.

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
