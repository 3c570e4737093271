//! RETA files (plain or `ethtool -x` output) never panic; a parsed table is a valid one.
#![no_main]
use flowlane_rss::Reta;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(r) = Reta::parse(text) {
        assert!(r.len().is_power_of_two());
        assert!(r.queues() >= 1);
        let _ = r.queue(0xffff_ffff);
    }
});
