//! `SRC DST [SPORT DPORT]` lines (what `flowlane hash --stdin` reads) never panic; a parsed
//! tuple survives a print/parse round trip.
#![no_main]
use flowlane_rss::Tuple;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(t) = Tuple::parse_line(text) {
        let line = match t.ports() {
            Some((s, d)) => format!("{} {} {s} {d}", t.src(), t.dst()),
            None => format!("{} {}", t.src(), t.dst()),
        };
        assert_eq!(Tuple::parse_line(&line), Ok(t));
        assert_eq!(Tuple::from_input_bytes(t.input()), Some(t));
    }
});
