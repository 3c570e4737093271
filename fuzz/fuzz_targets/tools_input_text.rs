//! The bounded text checks every input file goes through (`tools::input::text_of`, what
//! `read_text` applies to a file's bytes once read under its byte cap), on arbitrary bytes in
//! memory: never a panic; what it accepts is UTF-8 without NUL within its caps; every refusal
//! is a short message. (The file reading itself — caps, FIFOs, devices, the stop flag — is
//! tested on real files in `tools::input` and `tests/hostile_environment.rs`.)
#![no_main]

use flowlane_tools::input::{text_of, TextCaps};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let caps = TextCaps {
        bytes: 2048,
        lines: 16,
        line_bytes: 256,
    };
    match text_of("--routes", "fuzz", data.to_vec(), caps) {
        Ok(t) => {
            assert!(t.len() <= 2048 && !t.contains('\0'));
            assert!(t.lines().count() <= 16 && t.lines().all(|l| l.len() <= 256));
            assert_eq!(t.as_bytes(), data);
        }
        Err(e) => assert!(e.message.len() < 400, "{}", e.message),
    }
});
