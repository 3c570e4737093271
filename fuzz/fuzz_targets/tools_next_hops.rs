//! The router's next-hop file (`forward --next-hops`) on arbitrary text: never a panic, and an
//! error quotes at most a short excerpt of the line, whatever its length.
#![no_main]

use flowlane_tools::forward::NextHopFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = NextHopFile::parse(text) {
        assert!(e.len() < 400, "{} bytes of error", e.len());
    }
});
