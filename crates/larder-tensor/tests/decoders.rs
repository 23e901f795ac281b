//! Property tests of the quantized decoders: the scalar decoders against the
//! format definitions, every SIMD path against the scalar decoders, and
//! column slices against whole rows.

use larder_tensor::formats::{decode_row, e8m0_to_f32, fp8_e4m3_to_f32, RowView, FP4_E2M1};
use larder_tensor::kernels::KernelPath;
use larder_tensor::{SharedBytes, WeightMatrix};
use proptest::prelude::*;

fn same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

fn decode_all(path: Option<KernelPath>, view: RowView<'_>, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n];
    match path {
        Some(p) => p.decode(view, &mut out),
        None => decode_row(view, &mut out),
    }
    out
}

fn check_paths(w: &WeightMatrix) -> Result<(), TestCaseError> {
    let k = w.cols();
    for r in 0..w.rows() {
        let reference = decode_all(None, w.row_view(r), k);
        for path in KernelPath::available() {
            let got = decode_all(Some(path), w.row_view(r), k);
            for (i, (a, b)) in reference.iter().zip(&got).enumerate() {
                prop_assert!(same(*a, *b), "{} {} row {r} col {i}: {a} vs {b}", path.name(), w.format());
            }
            // Any 32-aligned slice decodes to the same values as the whole row.
            for c0 in (0..k).step_by(96) {
                let c1 = (c0 + 160).min(k);
                let part = decode_all(Some(path), w.row_view(r).slice(c0, c1), c1 - c0);
                for (i, (a, b)) in reference[c0..c1].iter().zip(&part).enumerate() {
                    prop_assert!(same(*a, *b), "{} {} slice {c0}..{c1} col {i}", path.name(), w.format());
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn fp8_matches_the_e4m3fn_definition(b in any::<u8>()) {
        let (s, e, m) = (b >> 7, (b >> 3) & 0xf, b & 7);
        let v = fp8_e4m3_to_f32(b);
        if e == 15 && m == 7 {
            prop_assert!(v.is_nan());
        } else {
            let mag = if e == 0 { m as f64 / 8.0 * 2f64.powi(-6) } else { (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7) };
            let want = if s == 1 { -mag } else { mag };
            prop_assert_eq!(v as f64, want);
        }
    }

    #[test]
    fn fp4_and_e8m0_match_their_definitions(code in 0u8..16, s in any::<u8>()) {
        let (sign, e, m) = (code >> 3, (code >> 1) & 3, code & 1);
        let mag = if e == 0 { m as f64 * 0.5 } else { (1.0 + m as f64 / 2.0) * 2f64.powi(e as i32 - 1) };
        prop_assert_eq!(FP4_E2M1[code as usize] as f64, if sign == 1 { -mag } else { mag });
        if s == 255 { prop_assert!(e8m0_to_f32(s).is_nan()); } else { prop_assert_eq!(e8m0_to_f32(s) as f64, 2f64.powi(s as i32 - 127)); }
    }

    #[test]
    fn fp8_paths_agree(rows in 1usize..4, blocks in 1usize..12, block_cols in prop::sample::select(vec![32usize, 100, 128]), seed in any::<u64>()) {
        let k = blocks * 32;
        let codes: Vec<u8> = (0..rows * k).map(|i| (seed.wrapping_mul(i as u64 + 1) >> 13) as u8).collect();
        let scales: Vec<f32> = (0..rows.div_ceil(2) * k.div_ceil(block_cols)).map(|i| 0.001 * (i + 1) as f32).collect();
        let w = WeightMatrix::fp8_block("p", rows, k, SharedBytes::from_vec(codes), scales, 2, block_cols).unwrap();
        check_paths(&w)?;
    }

    #[test]
    fn mxfp4_paths_agree(rows in 1usize..4, blocks in 1usize..12, seed in any::<u64>()) {
        let k = blocks * 32;
        let bytes: Vec<u8> = (0..rows * k / 2).map(|i| (seed.wrapping_mul(i as u64 + 7) >> 17) as u8).collect();
        let scales: Vec<u8> = (0..rows * k / 32).map(|i| (seed.wrapping_add(i as u64) % 256) as u8).collect();
        let w = WeightMatrix::mxfp4("p", rows, k, SharedBytes::from_vec(bytes), SharedBytes::from_vec(scales)).unwrap();
        check_paths(&w)?;
    }

    #[test]
    fn int4_paths_agree(rows in 1usize..4, groups in 1usize..6, group in prop::sample::select(vec![32usize, 64, 128]), seed in any::<u64>()) {
        let k = groups * group;
        let bytes: Vec<u8> = (0..rows * k / 2).map(|i| (seed.wrapping_mul(i as u64 + 3) >> 11) as u8).collect();
        let scales: Vec<f32> = (0..rows * groups).map(|i| 0.01 * (i as f32 - 3.0)).collect();
        let w = WeightMatrix::int4_group("p", rows, k, SharedBytes::from_vec(bytes), scales, group).unwrap();
        check_paths(&w)?;
    }

    #[test]
    fn malformed_layouts_are_errors(rows in 1usize..8, cols in 1usize..300, extra in 1usize..5) {
        // Wrong byte counts and bad block sizes never panic.
        prop_assert!(WeightMatrix::mxfp4("m", rows, cols, SharedBytes::from_vec(vec![0; rows * cols / 2 + extra]), SharedBytes::from_vec(vec![0; rows * cols / 32])).is_err());
        prop_assert!(WeightMatrix::int4_group("i", rows, cols, SharedBytes::from_vec(vec![0; rows * cols / 2]), vec![0.0; 1], 0).is_err());
        prop_assert!(WeightMatrix::fp8_block("f", rows, cols, SharedBytes::from_vec(vec![0; rows * cols]), vec![1.0; extra + 1000], 128, 128).is_err());
        prop_assert!(WeightMatrix::fp8_block("f", rows, cols, SharedBytes::from_vec(vec![0; rows * cols + extra]), vec![1.0; rows.div_ceil(128) * cols.div_ceil(128)], 128, 128).is_err());
    }
}
