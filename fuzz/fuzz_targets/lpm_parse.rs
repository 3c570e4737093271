//! The route table reader (`forward --routes FILE`, `route lookup --table`) on arbitrary text,
//! the reading alone: never a panic, and a plain table that loads writes back to the same
//! table. (`lpm_load` goes on to build FIBs from what loads, at a thousandth of the speed.)
#![no_main]

use flowlane_lpm::load::{parse, Format};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for format in [Format::Auto, Format::Plain, Format::IpRoute] {
        let Ok(t) = parse(text, format) else { continue };
        if format == Format::Plain {
            assert_eq!(parse(&t.to_plain(), Format::Plain).as_ref(), Ok(&t));
        }
    }
});
