use proptest::prelude::*;

use super::*;
use crate::tuple::Tuple;
use crate::vectors;

/// (tuple, expected) for all 16 published values.
fn sixteen() -> Vec<(Tuple, u32)> {
    vectors::all()
        .into_iter()
        .flat_map(|v| {
            [
                (v.tuple.addrs_only(), v.hash_2tuple),
                (v.tuple, v.hash_4tuple),
            ]
        })
        .collect()
}

#[test]
fn suite_has_sixteen_values() {
    assert_eq!(sixteen().len(), 16);
}

#[test]
fn reference_passes_verification_suite() {
    for (t, want) in sixteen() {
        assert_eq!(reference(&Key::MICROSOFT, t.input()), want, "{t}");
    }
}

#[test]
fn table_passes_verification_suite() {
    let h = Toeplitz::with_backend(&Key::MICROSOFT, Backend::Table).expect("table always runs");
    for (t, want) in sixteen() {
        assert_eq!(h.hash(&t), want, "{t}");
        assert_eq!(h.hash_bytes(t.input()), want, "{t}");
    }
}

/// Runs the batch path of every available backend over the suite, in several arrangements
/// (homogeneous runs long enough for the vector path, and mixed kinds).
#[test]
fn every_batch_backend_passes_verification_suite() {
    let cases = sixteen();
    for backend in Backend::available() {
        let h = Toeplitz::with_backend(&Key::MICROSOFT, backend).expect("listed as available");
        // Each value repeated 8 times so every run is vector-sized.
        let tuples: Vec<Tuple> = cases.iter().flat_map(|(t, _)| [*t; 8]).collect();
        let want: Vec<u32> = cases.iter().flat_map(|(_, w)| [*w; 8]).collect();
        let mut out = vec![0; tuples.len()];
        assert_eq!(h.hash_batch(&tuples, &mut out), tuples.len());
        assert_eq!(out, want, "backend {backend:?}");
        // Mixed kinds in one batch.
        let tuples: Vec<Tuple> = cases.iter().map(|(t, _)| *t).collect();
        let want: Vec<u32> = cases.iter().map(|(_, w)| *w).collect();
        let mut out = vec![0; tuples.len()];
        h.hash_batch(&tuples, &mut out);
        assert_eq!(out, want, "backend {backend:?}, mixed");
    }
}

/// `hash` (one tuple) on every backend's hasher: the carry-less single path where the CPU has
/// it, the table path otherwise.
#[test]
fn every_single_path_passes_verification_suite() {
    for backend in Backend::available() {
        let h = Toeplitz::with_backend(&Key::MICROSOFT, backend).expect("listed as available");
        for (t, want) in sixteen() {
            assert_eq!(h.hash(&t), want, "backend {backend:?}: {t}");
        }
    }
}

#[test]
fn clmul_path_is_tested_where_the_cpu_has_it() {
    let names: Vec<&str> = Backend::available().iter().map(|b| b.name()).collect();
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("pclmulqdq") && std::is_x86_feature_detected!("sse4.1") {
        assert!(names.contains(&"pclmul-ssse3"), "{names:?}");
        // The default hasher takes it for single hashes.
        assert_ne!(Toeplitz::new(&Key::MICROSOFT).backend(), Backend::Table);
    }
    assert!(names.contains(&"table"));
}

#[test]
fn avx512_path_is_tested_where_the_cpu_has_it() {
    // Make it visible in test output which paths ran on this machine.
    let names: Vec<&str> = Backend::available().iter().map(|b| b.name()).collect();
    eprintln!("hash backends available here: {names:?}");
    assert!(names.contains(&"table"));
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("gfni") && std::is_x86_feature_detected!("avx512bw") {
        assert!(names.contains(&"avx512-gfni-clmul"));
    }
}

/// Where the CPU has GFNI (or VPCLMULQDQ), the kernels that use it are among those the
/// proptests run.
#[test]
#[cfg(target_arch = "x86_64")]
fn every_clmul_kernel_the_cpu_has_is_tested() {
    use std::is_x86_feature_detected as has;
    if let Some(cpu) = clmul::Cpu::detect() {
        let wide = has!("avx2") && has!("vpclmulqdq");
        let gfni = has!("gfni");
        let zmm = wide && gfni && has!("avx512f") && has!("avx512bw");
        assert_eq!(
            cpu.kernels().len(),
            (1 + usize::from(wide)) * (1 + usize::from(gfni)) + usize::from(zmm)
        );
    }
}

#[test]
fn batch_shorter_output_hashes_prefix_only() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    let tuples: Vec<Tuple> = sixteen().into_iter().map(|(t, _)| t).collect();
    let mut out = [0u32; 5];
    assert_eq!(h.hash_batch(&tuples, &mut out), 5);
    assert_eq!(out[4], h.hash(&tuples[4]));
}

#[test]
fn long_inputs_follow_reference() {
    let h = Toeplitz::new(&Key::MICROSOFT);
    let input: Vec<u8> = (0..60u8).map(|i| i.wrapping_mul(37)).collect();
    for n in [0, 1, 36, 37, 48, 49, 60] {
        assert_eq!(
            h.hash_bytes(&input[..n]),
            reference(&Key::MICROSOFT, &input[..n])
        );
    }
}

fn any_key() -> impl Strategy<Value = Key> {
    (40usize..=52).prop_flat_map(|len| {
        proptest::collection::vec(any::<u8>(), len)
            .prop_map(|b| Key::new(&b).expect("length in range"))
    })
}

fn any_tuple() -> impl Strategy<Value = Tuple> {
    (
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        any::<u16>(),
        any::<u16>(),
        0u8..4,
    )
        .prop_map(|(s, d, sp, dp, kind)| {
            let t6 = Tuple::v6(s.into(), d.into(), sp, dp);
            let s4 = [s[0], s[1], s[2], s[3]];
            let d4 = [d[0], d[1], d[2], d[3]];
            let t4 = Tuple::v4(s4.into(), d4.into(), sp, dp);
            match kind {
                0 => t4,
                1 => t4.addrs_only(),
                2 => t6,
                _ => t6.addrs_only(),
            }
        })
}

proptest! {
    #[test]
    fn table_equals_reference(key in any_key(), t in any_tuple()) {
        let h = Toeplitz::with_backend(&key, Backend::Table).expect("table always runs");
        prop_assert_eq!(h.hash(&t), reference(&key, t.input()));
    }

    #[test]
    fn every_single_path_equals_reference(key in any_key(), t in any_tuple()) {
        for backend in Backend::available() {
            let h = Toeplitz::with_backend(&key, backend).expect("listed as available");
            prop_assert_eq!(h.hash(&t), reference(&key, t.input()), "backend {:?}", backend);
        }
    }

    /// Every carry-less kernel the CPU runs (128-bit, 256-bit where it has VPCLMULQDQ; bytes
    /// reversed by nibble shuffles, and by GFNI where it has that) on every kind.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_clmul_kernel_equals_reference(key in any_key(), t in any_tuple()) {
        if let Some(cpu) = clmul::Cpu::detect() {
            let keys = ClmulKeys::new(&key);
            let want = reference(&key, t.input());
            for k in cpu.kernels() {
                prop_assert_eq!(clmul::hash(k, &keys, &t), want, "{:?}", k);
            }
        }
    }

    #[test]
    fn every_batch_backend_equals_reference(
        key in any_key(),
        tuples in proptest::collection::vec(any_tuple(), 0..40),
    ) {
        let want: Vec<u32> = tuples.iter().map(|t| reference(&key, t.input())).collect();
        for backend in Backend::available() {
            let h = Toeplitz::with_backend(&key, backend).expect("listed as available");
            let mut out = vec![0; tuples.len()];
            h.hash_batch(&tuples, &mut out);
            prop_assert_eq!(&out, &want, "backend {:?}", backend);
        }
    }

    /// Homogeneous batches exercise the vector loop rather than the scalar tail.
    #[test]
    fn homogeneous_batches_equal_reference(key in any_key(), t in any_tuple(), n in 4usize..33) {
        let tuples: Vec<Tuple> = (0..n)
            .map(|i| {
                let mut b = *t.padded_input();
                b[i % t.input().len()] ^= i as u8;
                let len = t.input().len();
                let line = crate::tuple::Tuple::from_input_bytes(&b[..len]);
                line.unwrap_or(t)
            })
            .collect();
        for backend in Backend::available() {
            let h = Toeplitz::with_backend(&key, backend).expect("listed as available");
            let mut out = vec![0; n];
            h.hash_batch(&tuples, &mut out);
            for (t, o) in tuples.iter().zip(&out) {
                prop_assert_eq!(*o, reference(&key, t.input()), "backend {:?} {}", backend, t);
            }
        }
    }

    #[test]
    fn hash_is_linear(key in any_key(), a in any::<[u8; 12]>(), b in any::<[u8; 12]>()) {
        let x: Vec<u8> = a.iter().zip(&b).map(|(p, q)| p ^ q).collect();
        prop_assert_eq!(
            reference(&key, &x),
            reference(&key, &a) ^ reference(&key, &b)
        );
    }
}

#[test]
fn byte_rows_xor_to_the_hash() {
    let key = Key::MICROSOFT;
    let t = Toeplitz::new(&key);
    let rows = t.byte_rows(36);
    assert_eq!(rows.len(), 36);
    let tuple = Tuple::v4(
        "66.9.149.187".parse().expect("ip"),
        "161.142.100.80".parse().expect("ip"),
        2794,
        1766,
    );
    let h = tuple
        .input()
        .iter()
        .enumerate()
        .fold(0, |h, (i, &b)| h ^ rows[i][b as usize]);
    assert_eq!(h, 0x51ccc178);
    assert_eq!(h, reference(&key, tuple.input()));
}
