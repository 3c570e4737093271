//! `http load --scenario` TOML on arbitrary text: never a panic; an error says its line and
//! column and a short excerpt of the message, never the whole line.
#![no_main]

use flowlane_tools::http::HttpLoadConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = HttpLoadConfig::from_toml(text) {
        assert!(e.message.len() < 400, "{} bytes of error", e.message.len());
    }
});
