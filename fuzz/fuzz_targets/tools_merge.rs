//! `flowlane merge` on any text: its report reader, the merge of whatever reports it found,
//! and the histogram decoder on the text itself — an error or a report, never a panic, and a
//! histogram's claimed sizes never trusted (a few bytes must not allocate gigabytes).
#![no_main]

use flowlane_tools::merge::{merge, read_reports};
use flowlane_tools::report::decode_histogram;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = decode_histogram(&text);
    if let Ok(r) = read_reports("fuzz", &text) {
        if !r.reports.is_empty() {
            let _ = merge(&r.reports);
        }
    }
});
