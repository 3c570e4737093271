//! The CPU-list parser every role's --cpus goes through never panics, and what it accepts
//! reads back the same after formatting.
#![no_main]
use flowlane_runtime::cpus::{format_cpu_list, parse_cpu_list};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(cpus) = parse_cpu_list(text) {
        let mut sorted = cpus.clone();
        sorted.sort_unstable();
        assert_eq!(parse_cpu_list(&format_cpu_list(&cpus)), Ok(sorted));
    }
});
