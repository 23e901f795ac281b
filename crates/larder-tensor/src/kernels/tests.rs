//! Kernel tests: every path against an f64 reference for every weight
//! format, batch invariance (1..64 rows), determinism across thread counts.

use super::*;
use crate::weight::SharedBytes;

fn lcg(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *seed >> 33
}

fn uniform(seed: &mut u64) -> f32 {
    (lcg(seed) as f32 / (1u64 << 31) as f32) - 0.5
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n).map(|_| uniform(&mut s)).collect()
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n).map(|_| lcg(&mut s) as u8).collect()
}

/// One weight of every format with `n x k` (k a multiple of 32).
fn weights(n: usize, k: usize) -> Vec<WeightMatrix> {
    let dense = random(n * k, 2);
    let mut out: Vec<WeightMatrix> = [WeightDType::F32, WeightDType::F16, WeightDType::BF16]
        .into_iter()
        .map(|d| WeightMatrix::from_f32(d, n, k, &dense))
        .collect();
    // fp8: avoid NaN codes; ragged 128x128 blocks.
    let codes: Vec<u8> = random_bytes(n * k, 3)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { 0x3f } else { b })
        .collect();
    let scales = random(n.div_ceil(128) * k.div_ceil(128), 4)
        .iter()
        .map(|s| s.abs() + 0.01)
        .collect();
    out.push(WeightMatrix::fp8_block("fp8", n, k, SharedBytes::from_vec(codes), scales, 128, 128).unwrap());
    let blocks = random_bytes(n * k / 2, 5);
    let sc: Vec<u8> = random_bytes(n * k / 32, 6).into_iter().map(|b| 118 + b % 16).collect();
    out.push(WeightMatrix::mxfp4("mxfp4", n, k, SharedBytes::from_vec(blocks), SharedBytes::from_vec(sc)).unwrap());
    let packed = random_bytes(n * k / 2, 7);
    let isc = random(n * k / 32, 8).iter().map(|s| s.abs() / 8.0 + 1e-3).collect();
    out.push(WeightMatrix::int4_group("int4", n, k, SharedBytes::from_vec(packed.clone()), isc, 32).unwrap());
    // Blocks and groups that are multiples of 8 but not of 32 (the fused
    // kernel's short steps; segments start mid-chunk when chunks are cut).
    let codes40: Vec<u8> = random_bytes(n * k, 9)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { 0x01 } else { b })
        .collect();
    let sc40 = random(n.div_ceil(16) * k.div_ceil(40), 10).iter().map(|s| s.abs() + 0.01).collect();
    out.push(WeightMatrix::fp8_block("fp8-40", n, k, SharedBytes::from_vec(codes40), sc40, 16, 40).unwrap());
    let isc8 = random(n * k / 8, 11).iter().map(|s| s.abs() / 8.0 + 1e-3).collect();
    out.push(WeightMatrix::int4_group("int4-8", n, k, SharedBytes::from_vec(packed), isc8, 8).unwrap());
    out
}

fn check_against_reference(path: KernelPath, x: &Mat, w: &WeightMatrix) {
    let y = matmul_t_with(path, x, w);
    let wf = w.to_f32();
    let k = w.cols();
    for r in 0..x.rows() {
        for f in 0..w.rows() {
            let prods = (0..k).map(|i| x.row(r)[i] as f64 * wf[f * k + i] as f64);
            let exact: f64 = prods.clone().sum();
            let mass: f64 = prods.map(f64::abs).sum();
            let got = y.row(r)[f] as f64;
            assert!(
                (got - exact).abs() <= 1e-5 * mass + 1e-30,
                "{} {}: row {r} feature {f}: {got} vs {exact}",
                path.name(),
                w.format()
            );
        }
    }
}

/// On every path: `x` against `w` matches the reference, and each of `rows`
/// computed alone is bit-identical to the same row inside the whole batch.
fn check_reference_and_alone_vs_batch(x: &Mat, w: &WeightMatrix, rows: &[usize], what: &str) {
    for path in KernelPath::available() {
        check_against_reference(path, x, w);
        let all = matmul_t_with(path, x, w);
        for &r in rows {
            let alone = matmul_t_with(path, &x.gather_rows(&[r]), w);
            assert_eq!(alone.row(0), all.row(r), "{} {what} row {r}", path.name());
        }
    }
}

#[test]
fn every_path_matches_the_f64_reference_for_every_format() {
    for path in KernelPath::available() {
        for (m, n, k) in [(1, 40, 256), (3, 130, 288), (5, 17, 32), (2, 20, 1120), (1, 3, 2080)] {
            let x = Mat::from_vec(m, k, random(m * k, 1));
            for w in weights(n, k) {
                check_against_reference(path, &x, &w);
            }
        }
        // Dense odd widths exercise the tails.
        for k in [1, 7, 15, 17, 31, 33, 100] {
            let x = Mat::from_vec(2, k, random(2 * k, 9));
            for d in [WeightDType::F32, WeightDType::F16, WeightDType::BF16] {
                check_against_reference(path, &x, &WeightMatrix::from_f32(d, 9, k, &random(9 * k, 10)));
            }
        }
    }
}

#[test]
fn batch_invariant_for_every_path_and_format() {
    let (n, k) = (40, 1120); // crosses column chunks; fp8 blocks and int4 groups straddle them
    let x = Mat::from_vec(64, k, random(64 * k, 11));
    for path in KernelPath::available() {
        for w in weights(n, k) {
            let all = matmul_t_with(path, &x, &w);
            for m in [1, 2, 3, 5, 8, 13, 64] {
                let some = matmul_t_with(path, &x.gather_rows(&(0..m).collect::<Vec<_>>()), &w);
                for r in 0..m {
                    assert_eq!(some.row(r), all.row(r), "{} {}: row {r} in a batch of {m}", path.name(), w.format());
                }
            }
        }
    }
}

#[test]
fn batch_invariant_for_many_rows_at_any_offset() {
    // Prefill sizes: many-row register blocks and panels (5..256 rows),
    // shorter column chunks for many rows, rows at every position of a
    // block. k = 1152: whole chunks, a short last chunk, ragged fp8-40 blocks.
    let (n, k, total) = (12, 1152, 256);
    let x = Mat::from_vec(total, k, random(total * k, 71));
    for path in KernelPath::available() {
        for w in weights(n, k) {
            let all = matmul_t_with(path, &x, &w);
            for (first, m) in [(0, 5), (3, 6), (1, 7), (7, 16), (11, 65), (100, 100), (0, 129)] {
                let rows: Vec<usize> = (first..first + m).collect();
                let some = matmul_t_with(path, &x.gather_rows(&rows), &w);
                for (i, &r) in rows.iter().enumerate() {
                    assert_eq!(some.row(i), all.row(r), "{} {}: row {r} at {i} of {m}", path.name(), w.format());
                }
            }
            for r in [0, 37, 255] {
                let alone = matmul_t_with(path, &x.gather_rows(&[r]), &w);
                assert_eq!(alone.row(0), all.row(r), "{} {}: row {r} alone", path.name(), w.format());
            }
        }
    }
}

#[test]
fn deterministic_across_thread_counts() {
    let (m, n, k) = (4, 600, 512);
    let x = Mat::from_vec(m, k, random(m * k, 12));
    let w = WeightMatrix::from_f32(WeightDType::BF16, n, k, &random(n * k, 13));
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let two = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    for path in KernelPath::available() {
        let a = one.install(|| matmul_t_with(path, &x, &w));
        let b = two.install(|| matmul_t_with(path, &x, &w));
        assert_eq!(a, b, "{}", path.name());
        assert_eq!(a, matmul_t_with(path, &x, &w), "{}", path.name());
    }
}

#[test]
fn scalar_is_always_available_and_env_names_parse() {
    assert!(KernelPath::available().contains(&KernelPath::Scalar));
    for p in [KernelPath::Scalar, KernelPath::Avx2, KernelPath::Avx512, KernelPath::Neon] {
        assert_eq!(KernelPath::from_name(p.name()), Some(p));
    }
    assert_eq!(KernelPath::from_name("bogus"), None);
}

/// `LARDER_REQUIRE_KERNELS=avx512,avx2` makes this run fail unless those
/// paths are available, so a run meant to cover them (the emulated AVX-512
/// run in `scripts/emulated_avx512.sh`) cannot pass by silently skipping them.
#[test]
fn required_kernel_paths_are_available() {
    let Ok(names) = std::env::var("LARDER_REQUIRE_KERNELS") else {
        return;
    };
    for name in names.split(',').filter(|n| !n.is_empty()) {
        let path = KernelPath::from_name(name).unwrap_or_else(|| panic!("LARDER_REQUIRE_KERNELS: unknown path {name}"));
        assert!(path.is_supported(), "LARDER_REQUIRE_KERNELS: {name} is not available on this CPU");
        assert!(KernelPath::available().contains(&path));
    }
}

#[test]
fn simd_decoders_are_bit_identical_to_scalar() {
    let (n, k) = (5, 416); // 416 = 3 full fp8 blocks of 128 + a ragged 32
    let codes = random_bytes(n * k, 21); // includes fp8 NaN codes 0x7f / 0xff
    let fp8 = WeightMatrix::fp8_block("fp8", n, k, SharedBytes::from_vec(codes), random(5, 22), 128, 100).unwrap();
    let mx = WeightMatrix::mxfp4(
        "mx",
        n,
        k,
        SharedBytes::from_vec(random_bytes(n * k / 2, 23)),
        SharedBytes::from_vec(random_bytes(n * k / 32, 24)), // any e8m0, NaN 0xff included
    )
    .unwrap();
    let i4 = WeightMatrix::int4_group(
        "i4",
        n,
        k,
        SharedBytes::from_vec(random_bytes(n * k / 2, 25)),
        random(n * k / 32, 26),
        32,
    )
    .unwrap();
    for path in KernelPath::available() {
        for w in [&fp8, &mx, &i4] {
            for r in 0..n {
                let (mut a, mut b) = (vec![0.0f32; k], vec![0.0f32; k]);
                crate::formats::decode_row(w.row_view(r), &mut a);
                path.decode(w.row_view(r), &mut b);
                // Bit-identical, except that any NaN equals any NaN (payloads may differ).
                let bits = |v: &[f32]| {
                    v.iter()
                        .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                        .collect::<Vec<_>>()
                };
                assert_eq!(bits(&a), bits(&b), "{} {} row {r}", path.name(), w.format());
            }
        }
    }
}

#[test]
fn odd_block_sizes_across_chunks() {
    // fp8 blocks of 100 columns and int4 groups of 1024 start mid-chunk.
    let (n, k) = (3, 2048 + 96);
    let x = Mat::from_vec(2, k, random(2 * k, 31));
    let codes: Vec<u8> = random_bytes(n * k, 32)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { 0 } else { b })
        .collect();
    let fp8 = WeightMatrix::fp8_block("fp8", n, k, SharedBytes::from_vec(codes), random(k.div_ceil(100), 33), 128, 100).unwrap();
    let i4 = WeightMatrix::int4_group(
        "i4",
        n,
        3072,
        SharedBytes::from_vec(random_bytes(n * 3072 / 2, 34)),
        random(n * 3, 35),
        1024,
    )
    .unwrap();
    let x4 = Mat::from_vec(2, 3072, random(2 * 3072, 36));
    for path in KernelPath::available() {
        check_against_reference(path, &x, &fp8);
        check_against_reference(path, &x4, &i4);
    }
}

#[test]
fn feature_blocking_does_not_change_results() {
    // The same weight rows in matrices of 1, 3, 6 and 10 rows land in register
    // blocks of different sizes; every output must be bit-identical.
    let k = 200;
    let vals = random(10 * k, 41);
    let x = Mat::from_vec(5, k, random(5 * k, 42));
    for path in KernelPath::available() {
        for d in [WeightDType::F32, WeightDType::F16, WeightDType::BF16] {
            let full = matmul_t_with(path, &x, &WeightMatrix::from_f32(d, 10, k, &vals));
            for n in [1, 3, 6] {
                let part = matmul_t_with(path, &x, &WeightMatrix::from_f32(d, n, k, &vals[..n * k]));
                for r in 0..5 {
                    assert_eq!(part.row(r), &full.row(r)[..n], "{} {d} n={n} row {r}", path.name());
                }
            }
        }
    }
}

/// Whether `path` computes quantized rows with the decoding fused into the
/// dot product (block scales applied to block sums) rather than as the
/// products of the exactly decoded weights.
fn fuses_quantized(path: KernelPath) -> bool {
    path.is_x86_simd()
}

#[test]
fn quantized_rows_compute_as_their_decoded_rows() {
    // Paths that decode first give the products of the exactly decoded
    // weights, bit for bit (the same arithmetic as an f32 matrix holding the
    // decoded values); the fused x86 paths apply each block's scale to its
    // block sum, a reassociation within the reference tolerance.
    let (n, k) = (37, 1024 + 256 + 32);
    let mut quantized: Vec<WeightMatrix> = weights(n, k).into_iter().filter(|w| w.dense_dtype().is_none()).collect();
    let codes: Vec<u8> = random_bytes(n * k, 51)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { 1 } else { b })
        .collect();
    quantized.push(WeightMatrix::fp8_block("fp8-100", n, k, SharedBytes::from_vec(codes), random(k.div_ceil(96), 52), 128, 96).unwrap());
    for w in &quantized {
        let mut decoded = vec![0.0f32; n * k];
        for (r, row) in decoded.chunks_exact_mut(k).enumerate() {
            w.decode_row(r, row);
        }
        let dense = WeightMatrix::from_f32(WeightDType::F32, n, k, &decoded);
        for m in [1, 3, 8] {
            let x = Mat::from_vec(m, k, random(m * k, 53 + m as u64));
            for path in KernelPath::available() {
                if fuses_quantized(path) {
                    check_against_reference(path, &x, w);
                    continue;
                }
                let a = matmul_t_with(path, &x, w);
                let b = matmul_t_with(path, &x, &dense);
                for r in 0..m {
                    let same = a.row(r).iter().zip(b.row(r)).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(same, "{} {:?} m={m} row {r}", path.name(), w.format());
                }
            }
        }
    }
}

#[test]
fn an_fp8_nan_code_makes_its_feature_nan_on_every_path() {
    let (n, k) = (9, 512);
    let clean: Vec<u8> = random_bytes(n * k, 61)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { 0x11 } else { b })
        .collect();
    let scales = vec![0.5f32; n.div_ceil(128) * k.div_ceil(128)];
    // 3 rows take the register blocks, 12 the many-row panel.
    for m in [3, 12] {
        nan_code_rows(m, n, k, &clean, &scales);
    }
}

fn nan_code_rows(m: usize, n: usize, k: usize, clean: &[u8], scales: &[f32]) {
    let x = Mat::from_vec(m, k, random(m * k, 62));
    for (row, col, code) in [(0, 0, 0x7fu8), (4, 300, 0xff), (8, 511, 0x7f)] {
        let mut codes = clean.to_vec();
        codes[row * k + col] = code;
        let bad = WeightMatrix::fp8_block("nan", n, k, SharedBytes::from_vec(codes), scales.to_vec(), 128, 128).unwrap();
        let good = WeightMatrix::fp8_block("clean", n, k, SharedBytes::from_vec(clean.to_vec()), scales.to_vec(), 128, 128).unwrap();
        for path in KernelPath::available() {
            let (yb, yg) = (matmul_t_with(path, &x, &bad), matmul_t_with(path, &x, &good));
            for r in 0..m {
                for f in 0..n {
                    if f == row {
                        assert!(yb.row(r)[f].is_nan(), "{} row {r} feature {f}", path.name());
                    } else {
                        assert_eq!(
                            yb.row(r)[f].to_bits(),
                            yg.row(r)[f].to_bits(),
                            "{} row {r} feature {f}",
                            path.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn fp8_activations_of_any_magnitude_stay_exact_and_batch_invariant() {
    // The fused fp8 kernel prescales each activation row unless its values
    // are huge; tiny, huge and ordinary rows side by side must each match
    // the reference and compute as they do alone.
    let (n, k) = (20, 640);
    let w = weights(n, k)
        .into_iter()
        .find(|w| w.format().to_string().starts_with("fp8"))
        .unwrap();
    let base = random(k, 71);
    let mut rows = Vec::new();
    for factor in [1.0f32, 1e-30, 1e-38, 3e29, 1e33, 1.0] {
        rows.extend(base.iter().map(|v| v * factor));
    }
    let x = Mat::from_vec(6, k, rows);
    check_reference_and_alone_vs_batch(&x, &w, &[0, 1, 2, 3, 4, 5], "fp8 magnitudes");
}

#[test]
fn every_fp8_code_decodes_exactly_on_every_path() {
    // All 256 codes (NaNs, subnormals, both zeros) under ordinary, tiny and huge scales.
    let codes: Vec<u8> = (0..=255u8).collect();
    for scale in [1.0f32, 0.37, 1e-30, 3e36, f32::INFINITY] {
        let w = WeightMatrix::fp8_block("all", 1, 256, SharedBytes::from_vec(codes.clone()), vec![scale, scale], 128, 128).unwrap();
        let mut reference = vec![0.0f32; 256];
        crate::formats::decode_row(w.row_view(0), &mut reference);
        for path in KernelPath::available() {
            let mut got = vec![0.0f32; 256];
            path.decode(w.row_view(0), &mut got);
            for (c, (g, r)) in got.iter().zip(&reference).enumerate() {
                assert!(
                    g.to_bits() == r.to_bits() || (g.is_nan() && r.is_nan()),
                    "{} code {c:#x} scale {scale}: {g} vs {r}",
                    path.name()
                );
            }
        }
    }
}

#[test]
fn fp8_rows_with_a_ragged_tail_match_alone_and_in_chunked_batches() {
    // 128-column blocks (the fused kernel's 32-column-group order) over a
    // width that leaves 8-column steps and a < 8 tail; 40 rows are chunked.
    for k in [2048 + 96 + 8, 2048 + 96 + 13, 200] {
        let n = 11;
        let codes: Vec<u8> = random_bytes(n * k, 81)
            .into_iter()
            .map(|b| if b & 0x7f == 0x7f { 0x12 } else { b })
            .collect();
        let scales = random(k.div_ceil(128), 82).iter().map(|s| s.abs() + 0.01).collect();
        let w = WeightMatrix::fp8_block("fp8-ragged", n, k, SharedBytes::from_vec(codes), scales, 128, 128).unwrap();
        let x = Mat::from_vec(40, k, random(40 * k, 83));
        check_reference_and_alone_vs_batch(&x, &w, &[0, 17, 39], &format!("k={k}"));
    }
}

#[test]
fn fp8_scales_that_cannot_fold_into_activations_take_the_per_block_path() {
    // A scale of 2^70 (or 2^-70) anywhere keeps the whole weight on the
    // per-block scale step; results match the reference and are
    // batch-invariant either way.
    let (n, k) = (12, 640);
    let codes: Vec<u8> = random_bytes(n * k, 91)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { 0x21 } else { b })
        .collect();
    for odd in [2f32.powi(70), 2f32.powi(-70), 0.0] {
        let mut scales: Vec<f32> = random(k.div_ceil(128), 92).iter().map(|s| s.abs() + 0.01).collect();
        scales[2] = odd;
        let w = WeightMatrix::fp8_block("fp8-odd-scale", n, k, SharedBytes::from_vec(codes.clone()), scales, 128, 128).unwrap();
        let x = Mat::from_vec(40, k, random(40 * k, 93));
        check_reference_and_alone_vs_batch(&x, &w, &[0, 39], &format!("scale {odd}"));
    }
}

#[test]
fn mxfp4_scales_across_the_e8m0_range_match_the_reference() {
    // 2^-127 (the subnormal code 0) up to 2^100, in both lanes of a 64-column
    // group and in a last 32-column group (k = 2080); a NaN scale (255)
    // makes its feature NaN, as decode-then-multiply gives.
    let (n, k) = (9, 2080);
    let codes = random_bytes(n * k / 2, 94);
    let picks = [0u8, 1, 20, 127, 200, 227];
    let scales: Vec<u8> = random_bytes(n * k / 32, 95)
        .iter()
        .map(|b| picks[*b as usize % picks.len()])
        .collect();
    let w = WeightMatrix::mxfp4(
        "mxfp4-range",
        n,
        k,
        SharedBytes::from_vec(codes.clone()),
        SharedBytes::from_vec(scales.clone()),
    )
    .unwrap();
    let x = Mat::from_vec(5, k, random(5 * k, 96));
    check_reference_and_alone_vs_batch(&x, &w, &[0, 1, 2, 3, 4], "mxfp4 e8m0 range");
    let mut nan_scales = scales;
    nan_scales[3 * k / 32 + 40] = 255;
    let w = WeightMatrix::mxfp4("mxfp4-nan", n, k, SharedBytes::from_vec(codes), SharedBytes::from_vec(nan_scales)).unwrap();
    for path in KernelPath::available() {
        let y = matmul_t_with(path, &x, &w);
        for r in 0..5 {
            for f in 0..n {
                assert_eq!(y.row(r)[f].is_nan(), f == 3, "{} row {r} feature {f}", path.name());
            }
        }
    }
}

#[test]
fn int4_groups_that_are_odd_multiples_of_32_match_alone_and_in_chunked_batches() {
    // Groups of 96 and 224 columns: 64-column decoding steps straddle group
    // boundaries inside a step's halves never, and column chunks (64 rows
    // do not fit the activation cache) start on whole groups and whole
    // 64-column steps (224: chunks of 1344, not 672).
    for (group, k) in [(96, 1152), (224, 1344)] {
        let n = 8;
        let packed = random_bytes(n * k / 2, 97);
        let scales = random(n * k / group, 98).iter().map(|s| s.abs() / 8.0 + 1e-3).collect();
        let w = WeightMatrix::int4_group("int4-odd", n, k, SharedBytes::from_vec(packed), scales, group).unwrap();
        let x = Mat::from_vec(64, k, random(64 * k, 99));
        check_reference_and_alone_vs_batch(&x, &w, &[0, 17, 63], &format!("int4 group {group}"));
    }
}

#[test]
fn activations_of_the_wrong_width_are_errors_on_every_path_and_format() {
    let (n, k) = (24, 256);
    for w in weights(n, k) {
        for path in KernelPath::available() {
            for cols in [0, k - 32, k + 1] {
                let err = try_matmul_t_with(path, &Mat::zeros(2, cols), &w).unwrap_err();
                assert_eq!(
                    err,
                    KernelError::Shape {
                        activation_cols: cols,
                        weight_rows: n,
                        weight_cols: k,
                        format: w.format(),
                    }
                );
                assert!(err.to_string().contains(&format!("{n}x{k} {}", w.format())), "{err}");
            }
            let x = Mat::from_vec(3, k, random(3 * k, 12));
            assert_eq!(try_matmul_t_with(path, &x, &w).unwrap(), matmul_t_with(path, &x, &w));
        }
    }
}

/// `data` as shared bytes starting `offset` bytes into a larger buffer, so
/// at any alignment.
fn at_offset(data: &[u8], offset: usize) -> SharedBytes {
    let mut v = vec![0xa5u8; offset];
    v.extend_from_slice(data);
    v.extend_from_slice(&[0xa5; 7]);
    SharedBytes::new(std::sync::Arc::new(v), offset, data.len())
}

#[test]
fn weights_at_any_byte_offset_compute_bit_identically() {
    let (n, k) = (20, 256);
    let dense = random(n * k, 21);
    let codes: Vec<u8> = random_bytes(n * k, 22)
        .into_iter()
        .map(|b| if b & 0x7f == 0x7f { 0x3f } else { b })
        .collect();
    let fp8_scales: Vec<f32> = random(n.div_ceil(128) * k.div_ceil(128), 23)
        .iter()
        .map(|s| s.abs() + 0.01)
        .collect();
    let blocks = random_bytes(n * k / 2, 24);
    let e8m0: Vec<u8> = random_bytes(n * k / 32, 25).into_iter().map(|b| 118 + b % 16).collect();
    let packed = random_bytes(n * k / 2, 26);
    let int4_scales: Vec<f32> = random(n * k / 32, 27).iter().map(|s| s.abs() / 8.0 + 1e-3).collect();
    let build = |offset: usize| -> Vec<WeightMatrix> {
        let mut out: Vec<WeightMatrix> = [WeightDType::F32, WeightDType::F16, WeightDType::BF16]
            .into_iter()
            .map(|d| WeightMatrix::new("dense", d, n, k, at_offset(&crate::dtype::encode(d, &dense), offset)).unwrap())
            .collect();
        out.push(WeightMatrix::fp8_block("fp8", n, k, at_offset(&codes, offset), fp8_scales.clone(), 128, 128).unwrap());
        out.push(WeightMatrix::mxfp4("mxfp4", n, k, at_offset(&blocks, offset), at_offset(&e8m0, offset)).unwrap());
        out.push(WeightMatrix::int4_group("int4", n, k, at_offset(&packed, offset), int4_scales.clone(), 32).unwrap());
        out
    };
    let aligned = build(0);
    for offset in [1, 2, 3, 5] {
        for (a, w) in aligned.iter().zip(build(offset)) {
            for path in KernelPath::available() {
                for rows in [1, 3, 9] {
                    let x = Mat::from_vec(rows, k, random(rows * k, 28 + rows as u64));
                    assert_eq!(
                        matmul_t_with(path, &x, &w),
                        matmul_t_with(path, &x, a),
                        "{} at byte offset {offset} on {path:?} with {rows} rows",
                        w.format()
                    );
                }
            }
        }
    }
}
