//! Key parsing never panics; what parses prints back to itself.
#![no_main]
use flowlane_rss::Key;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(k) = Key::parse(text) {
        assert_eq!(Key::parse(&k.to_hex()), Ok(k));
        assert_eq!(Key::parse(&k.to_colon_hex()), Ok(k));
        let _ = k.period_bits();
        assert!(k.entropy_bits(36) <= 32);
    }
});
