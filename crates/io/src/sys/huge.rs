//! Large allocations on 2 MiB pages: a global allocator for the `flowlane` binary.
//!
//! A lookup structure or packet buffer that spans megabytes touches a page per access at
//! random; on 4 KiB pages each access can miss the TLB. DPDK puts its tables on hugepages
//! for this reason, and the figures it is known by were measured so. Where transparent
//! huge pages are `madvise` (the common default), a program only gets them for memory it
//! asks for them on: [`HugeAlloc`] does that for every allocation of [`HUGE_MIN`] or more,
//! aligned to 2 MiB so that whole pages fit, and passes smaller ones to the system
//! allocator unchanged. With `transparent_hugepage=never` the advice is ignored and nothing
//! else changes. [`huge_page_bytes`] tells how much of the process the kernel did back
//! with huge pages, so that a report can say so.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of at least this many bytes are placed on 2 MiB boundaries and advised
/// `MADV_HUGEPAGE`.
pub const HUGE_MIN: usize = 2 << 20;

/// The global allocator of the `flowlane` binary: the system allocator, with allocations
/// of [`HUGE_MIN`] bytes or more aligned to 2 MiB and advised onto huge pages.
#[derive(Debug, Clone, Copy, Default)]
pub struct HugeAlloc;

/// The layout actually asked of the system allocator for `layout`.
#[inline]
fn system_layout(layout: Layout) -> Layout {
    if layout.size() >= HUGE_MIN {
        // A valid layout's size stays valid with a larger power-of-two alignment as long
        // as it does not overflow `isize` when rounded up; sizes this large are never
        // near that, and `Layout` checks it anyway (falling back to the original).
        layout.align_to(HUGE_MIN).unwrap_or(layout)
    } else {
        layout
    }
}

/// Advises the kernel to back `[p, p + size)` with huge pages. Failure is harmless (the
/// memory stays on ordinary pages), so it is ignored.
fn advise(p: *mut u8, size: usize) {
    if p.is_null() || size < HUGE_MIN {
        return;
    }
    // SAFETY: `p` is the start of a live allocation of at least `size` bytes that this
    // allocator just made, aligned to 2 MiB (a multiple of the page size, as madvise
    // requires); MADV_HUGEPAGE changes no contents and no permissions.
    unsafe {
        libc::madvise(p.cast(), size, libc::MADV_HUGEPAGE);
    }
}

// SAFETY: every method forwards to `System` with a layout that `system_layout` derives
// deterministically from the caller's layout, so `dealloc` and `realloc` always hand
// `System` the layout the block was allocated with. Alignment is only ever raised, so each
// block satisfies the caller's layout.
unsafe impl GlobalAlloc for HugeAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let l = system_layout(layout);
        // SAFETY: `l` has a non-zero size (the caller's, which `GlobalAlloc` requires to be
        // non-zero) and a valid alignment.
        let p = unsafe { System.alloc(l) };
        advise(p, l.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let l = system_layout(layout);
        if l.size() < HUGE_MIN {
            // SAFETY: as in `alloc`.
            return unsafe { System.alloc_zeroed(l) };
        }
        // The advice must come before the first write: the system allocator zeroes an
        // over-aligned block itself, which would fault it in on ordinary pages first. So the
        // block is zeroed here, after the advice; it may be reused heap memory, not a fresh
        // mapping, so the write cannot be skipped (a large `vec![0; n]` is faulted in whole
        // at once, as the system allocator's own zeroing of an aligned block would).
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc(l) };
        advise(p, l.size());
        if !p.is_null() {
            // SAFETY: `p` is a live block of `l.size()` bytes.
            unsafe { std::ptr::write_bytes(p, 0, l.size()) };
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `system_layout(layout)` (see `alloc`).
        unsafe { System.dealloc(ptr, system_layout(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = system_layout(layout);
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        let new = system_layout(new_layout);
        if old.align() == new.align() {
            // Both small, or both large: the system allocator can resize in place.
            // SAFETY: `ptr` was allocated by `System` with `old`; `new.size()` is
            // non-zero (the caller's `new_size`, required non-zero) and, rounded up to
            // `old.align()`, does not overflow (`from_size_align` checked it).
            let p = unsafe { System.realloc(ptr, old, new.size()) };
            advise(p, new.size());
            return p;
        }
        // Crossing `HUGE_MIN`: the alignment changes, so move the block.
        // SAFETY: `new_layout` is valid and non-zero-sized (see above).
        let p = unsafe { self.alloc(new_layout) };
        if !p.is_null() {
            // SAFETY: both blocks are live, distinct, and at least `min(old, new)` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        p
    }
}

/// The kernel's transparent-huge-page settings, as selected in
/// `/sys/kernel/mm/transparent_hugepage/{enabled,defrag}` (e.g. `madvise`, `madvise`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thp {
    /// `always`, `madvise` or `never`.
    pub enabled: String,
    /// `always`, `defer`, `defer+madvise`, `madvise` or `never`.
    pub defrag: String,
}

impl Thp {
    /// The settings of this kernel, or `None` where it has no THP (or they are unreadable).
    pub fn read() -> Option<Thp> {
        let selected = |f: &str| {
            let text =
                std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{f}")).ok()?;
            Thp::selected(&text)
        };
        Some(Thp {
            enabled: selected("enabled")?,
            defrag: selected("defrag")?,
        })
    }

    /// The bracketed choice of a sysfs setting: `always [madvise] never` → `madvise`.
    fn selected(text: &str) -> Option<String> {
        let (_, rest) = text.split_once('[')?;
        let (v, _) = rest.split_once(']')?;
        Some(v.to_string())
    }

    /// Whether memory advised `MADV_HUGEPAGE` is faulted in on huge pages, compacting memory
    /// for them if need be. With `defrag` `defer` or `never` it gets one only when a free
    /// 2 MiB page happens to be at hand (or later, from khugepaged).
    pub fn advice_is_honoured(&self) -> bool {
        matches!(self.enabled.as_str(), "always" | "madvise")
            && matches!(self.defrag.as_str(), "always" | "madvise" | "defer+madvise")
    }
}

/// Bytes of this process's anonymous memory the kernel backs with huge pages
/// (`AnonHugePages` of `/proc/self/smaps_rollup`), or `None` where that file is missing
/// or unreadable.
pub fn huge_page_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    text.lines().find_map(anon_huge_bytes)
}

/// The bytes of an smaps `AnonHugePages:   2048 kB` line; `None` for any other line.
fn anon_huge_bytes(line: &str) -> Option<u64> {
    let kb = line
        .strip_prefix("AnonHugePages:")?
        .trim()
        .strip_suffix("kB")?;
    kb.trim().parse::<u64>().ok().map(|k| k * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_blocks_are_left_alone_and_large_ones_aligned() {
        let a = HugeAlloc;
        let small = Layout::from_size_align(4096, 8).expect("valid layout");
        // SAFETY: a non-zero layout; freed below with the same layout.
        let p = unsafe { a.alloc(small) };
        assert!(!p.is_null());
        // SAFETY: allocated above with `small`.
        unsafe { a.dealloc(p, small) };

        let big = Layout::from_size_align(6 << 20, 8).expect("valid layout");
        // SAFETY: as above.
        let p = unsafe { a.alloc_zeroed(big) };
        assert!(!p.is_null());
        assert_eq!(p as usize % HUGE_MIN, 0, "2 MiB aligned");
        // SAFETY: `p` is a live, zeroed block of `big.size()` bytes.
        let s = unsafe { std::slice::from_raw_parts_mut(p, big.size()) };
        assert!(s.iter().all(|&b| b == 0));
        s.fill(7);
        // SAFETY: allocated above with `big`.
        unsafe { a.dealloc(p, big) };
    }

    #[test]
    fn realloc_keeps_contents_across_the_threshold() {
        let a = HugeAlloc;
        let mut layout = Layout::from_size_align(1 << 20, 4).expect("valid layout");
        // SAFETY: a non-zero layout.
        let mut p = unsafe { a.alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: `p` is live with `layout.size()` bytes.
        unsafe { std::slice::from_raw_parts_mut(p, layout.size()) }
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        // Up past HUGE_MIN, up again (both large), then back down below it.
        let mut keep = layout.size();
        for new_size in [3 << 20, 9 << 20, 512 << 10] {
            // The bytes written at first that every size since has held.
            keep = keep.min(new_size);
            // SAFETY: `p` was allocated with `layout`; `new_size` is non-zero.
            p = unsafe { a.realloc(p, layout, new_size) };
            assert!(!p.is_null());
            layout = Layout::from_size_align(new_size, 4).expect("valid layout");
            if new_size >= HUGE_MIN {
                assert_eq!(p as usize % HUGE_MIN, 0);
            }
            // SAFETY: `p` is live with at least `keep` bytes.
            let s = unsafe { std::slice::from_raw_parts(p, keep) };
            assert!(
                s.iter().enumerate().all(|(i, &b)| b == i as u8),
                "{new_size}"
            );
        }
        // SAFETY: `p` was last (re)allocated with `layout`.
        unsafe { a.dealloc(p, layout) };
    }

    /// `AnonHugePages` of the mapping holding `addr`, from `/proc/self/smaps`.
    fn huge_bytes_at(addr: usize) -> Option<u64> {
        let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for l in text.lines() {
            let head = l.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = head.split_once('-') {
                if let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                {
                    inside = lo <= addr && addr < hi;
                    continue;
                }
            }
            if inside && l.starts_with("AnonHugePages:") {
                return anon_huge_bytes(l);
            }
        }
        None
    }

    #[test]
    fn thp_settings_read_the_bracketed_choice() {
        assert_eq!(
            Thp::selected("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(
            Thp::selected("always defer [defer+madvise] madvise never").as_deref(),
            Some("defer+madvise")
        );
        assert_eq!(Thp::selected("garbage"), None);
        let t = |e: &str, d: &str| Thp {
            enabled: e.into(),
            defrag: d.into(),
        };
        assert!(t("madvise", "madvise").advice_is_honoured());
        assert!(t("always", "defer+madvise").advice_is_honoured());
        assert!(!t("never", "madvise").advice_is_honoured());
        assert!(!t("madvise", "defer").advice_is_honoured());
    }

    #[test]
    fn the_kernel_backs_large_blocks_with_huge_pages() {
        let thp = Thp::read();
        let a = HugeAlloc;
        let big = Layout::from_size_align(16 << 20, 8).expect("valid layout");
        // SAFETY: a non-zero layout; freed below with it.
        let p = unsafe { a.alloc(big) };
        assert!(!p.is_null());
        // SAFETY: `p` is a live block of `big.size()` bytes; writing faults it in.
        unsafe { std::ptr::write_bytes(p, 1, big.size()) };
        let here = huge_bytes_at(p as usize);
        // Zeroed blocks too (`vec![0; n]`): zeroing must not fault them in before the advice.
        // SAFETY: as above.
        let z = unsafe { a.alloc_zeroed(big) };
        assert!(!z.is_null());
        let zeroed_here = huge_bytes_at(z as usize);
        // SAFETY: allocated above with `big`.
        unsafe { a.dealloc(z, big) };
        let process = huge_page_bytes();
        // SAFETY: allocated above with `big`.
        unsafe { a.dealloc(p, big) };
        if !thp.as_ref().is_some_and(Thp::advice_is_honoured) {
            eprintln!(
                "THP here ({thp:?}) does not promise huge pages for advice: nothing to check"
            );
            return;
        }
        // The 2 MiB-aligned, advised block is faulted in on huge pages (the kernel compacts
        // memory for advised blocks if need be).
        let here = here.expect("the block's mapping is in /proc/self/smaps");
        assert!(
            here >= 8 << 20,
            "THP {thp:?}: only {here} bytes of 16 MiB on huge pages"
        );
        assert!(process.expect("smaps_rollup readable") >= here);
        let zeroed_here = zeroed_here.expect("the zeroed block's mapping is in /proc/self/smaps");
        assert!(
            zeroed_here >= 8 << 20,
            "zeroed: only {zeroed_here} bytes of 16 MiB on huge pages"
        );
    }
}
