//! The capture reader never panics on any bytes, stays within its limits, and every frame it
//! keeps is whole and lies within the input; a template made from one never panics either.
#![no_main]
use flowlane_wire::pcap::{read, Limits};
use flowlane_wire::Template;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        frames: 64,
        bytes: 1 << 16,
    };
    if let Ok(c) = read(data, limits) {
        assert!(c.frames.len() <= 64);
        let total: usize = c.frames.iter().map(Vec::len).sum();
        assert!(total <= data.len());
        for f in c.frames {
            if let Ok(t) = Template::from_frame(f) {
                assert!(t.payload <= t.bytes.len());
            }
        }
    }
});
