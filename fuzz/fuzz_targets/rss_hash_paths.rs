//! Differential: every hash path (reference, table, batch backends) agrees on arbitrary keys
//! and tuples.
#![no_main]
use flowlane_rss::toeplitz::{reference, Backend, Toeplitz};
use flowlane_rss::{Key, Tuple};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 41 {
        return;
    }
    let klen = 40 + (data[0] as usize % 13);
    if data.len() < 1 + klen {
        return;
    }
    let Ok(key) = Key::new(&data[1..1 + klen]) else { return };
    let tuples: Vec<Tuple> = data[1 + klen..]
        .chunks(36)
        .filter_map(|c| {
            let len = [8, 12, 32, 36].into_iter().filter(|&l| l <= c.len()).last()?;
            Tuple::from_input_bytes(&c[..len])
        })
        .collect();
    let want: Vec<u32> = tuples.iter().map(|t| reference(&key, t.input())).collect();
    for backend in Backend::available() {
        let h = Toeplitz::with_backend(&key, backend).expect("available");
        let mut out = vec![0; tuples.len()];
        h.hash_batch(&tuples, &mut out);
        assert_eq!(out, want, "{backend:?}");
        for (t, w) in tuples.iter().zip(&want) {
            assert_eq!(h.hash(t), *w);
        }
    }
});
