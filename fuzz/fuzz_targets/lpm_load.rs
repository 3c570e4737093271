//! Route table loaders (plain and `ip route` output) on arbitrary text: never a panic; what
//! loads builds a FIB whose answers match the table's longest match.
#![no_main]

use flowlane_lpm::load::{parse, Format};
use flowlane_lpm::{Fib, Rib};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for format in [Format::Auto, Format::Plain, Format::IpRoute] {
        // (That a plain table writes back to itself is lpm_parse's, at 20 times the speed.)
        let Ok(t) = parse(text, format) else { continue };
        if t.v4.len() + t.v6.len() == 0 {
            continue;
        }
        let rib4 = Rib::from_routes(t.v4.iter().copied()).expect("loaded routes are valid");
        let fib4 = Fib::build(&rib4);
        for (p, _) in &t.v4 {
            assert_eq!(fib4.lookup(p.addr()), rib4.matching(p.addr()).map(|m| m.1));
        }
        let rib6 = Rib::from_routes(t.v6.iter().copied()).expect("loaded routes are valid");
        let fib6 = Fib::build(&rib6);
        for (p, _) in &t.v6 {
            assert_eq!(fib6.lookup(p.addr()), rib6.matching(p.addr()).map(|m| m.1));
        }
    }
});
