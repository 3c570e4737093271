//! The bounded text reader every input file goes through (`tools::input`), on arbitrary
//! bytes written to a file: never a panic; what it accepts is UTF-8 without NUL within its
//! caps; every refusal is a short message.
#![no_main]

use flowlane_tools::input::{read_text, TextCaps};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("fl-fuzz-input-{}", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let caps = TextCaps {
        bytes: 2048,
        lines: 16,
        line_bytes: 256,
    };
    match read_text("--routes", &path, caps, None) {
        Ok(t) => {
            assert!(t.len() <= 2048 && !t.contains('\0'));
            assert!(t.lines().count() <= 16 && t.lines().all(|l| l.len() <= 256));
        }
        Err(e) => assert!(e.message.len() < 400, "{}", e.message),
    }
});
