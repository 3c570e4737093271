//! The HTTP head readers and the chunked walker never panic on any bytes, and what they say
//! stays within the input: a head's length, a walk's bytes used.
#![no_main]
use flowlane_wire::http::{parse_request, parse_response, ChunkStep, Chunked};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(h)) = parse_request(data) {
        assert!(h.head_len <= data.len());
    }
    if let Ok(Some(h)) = parse_response(data) {
        assert!(h.head_len <= data.len());
    }
    // The walk fed in two pieces, as reads split it, with unused bytes fed again.
    let split = data.first().map_or(0, |&b| b as usize % (data.len() + 1));
    let mut c = Chunked::default();
    let mut pending = Vec::new();
    for part in [&data[..split], &data[split..]] {
        pending.extend_from_slice(part);
        match c.step(&pending) {
            Ok(ChunkStep::More(n)) => {
                assert!(n <= pending.len());
                pending.drain(..n);
            }
            Ok(ChunkStep::Done(n)) => {
                assert!(n <= pending.len());
                break;
            }
            Err(_) => break,
        }
    }
    assert!(c.data <= data.len() as u64);
});
