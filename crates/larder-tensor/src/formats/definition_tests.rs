//! The decoders against the format definitions, value by value: every
//! e2m1 code in both nibbles, the e8m0 extremes (0xFF is NaN, OCP MX v1.0
//! §5.4.1), every int4 nibble with its group scale, ragged last groups and
//! misaligned or mid-block rows. Each case runs through the scalar decoder,
//! every available path's row decoder ([`KernelPath::decode`]) and every
//! path's matrix product against one-hot activations (which returns each
//! weight exactly, so it checks the decoders fused into the dot product).

use crate::formats::{decode_row, e8m0_to_f32};
use crate::kernels::{matmul_t_with, KernelPath};
use crate::weight::{RowView, SharedBytes};
use crate::{Mat, WeightMatrix};

/// The e2m1 values by code, as OCP MX v1.0 Table 5 defines them (code 8 is -0).
const E2M1_DEFINITION: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Equal bits, or both NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            same(*g, *w),
            "{what}: column {i}: {g:e} ({:#x}) vs {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// `view` decoded by the scalar reference and by every available path.
fn decoded_everywhere(view: RowView<'_>, cols: usize) -> Vec<(String, Vec<f32>)> {
    let mut out = vec![0.0f32; cols];
    decode_row(view, &mut out);
    let mut all = vec![("scalar reference".to_string(), out)];
    for path in KernelPath::available() {
        let mut got = vec![0.0f32; cols];
        path.decode(view, &mut got);
        all.push((format!("{} row decoder", path.name()), got));
    }
    all
}

/// Row 0 of `w` as every path's product returns it against the identity
/// activations (`y[c][0] = w[0][c]` exactly: one product, the rest zeros).
/// Zeros may lose their sign in the sum, so they compare as values.
fn check_products(w: &WeightMatrix, want: &[f32], what: &str) {
    let k = w.cols();
    let mut eye = vec![0.0f32; k * k];
    (0..k).for_each(|c| eye[c * k + c] = 1.0);
    let x = Mat::from_vec(k, k, eye);
    for path in KernelPath::available() {
        let y = matmul_t_with(path, &x, w);
        for (c, want) in want.iter().enumerate() {
            let got = y.row(c)[0];
            let ok = got == *want || (got.is_nan() && want.is_nan()) || same(got, *want);
            assert!(ok, "{what}: {} product, column {c}: {got:e} vs {want:e}", path.name());
        }
    }
}

fn mxfp4(blocks: Vec<u8>, scales: Vec<u8>) -> WeightMatrix {
    let cols = blocks.len() * 2;
    WeightMatrix::mxfp4("mx", 1, cols, SharedBytes::from_vec(blocks), SharedBytes::from_vec(scales)).unwrap()
}

#[test]
fn every_e2m1_code_in_either_nibble_decodes_to_its_definition() {
    // Byte b of a block holds columns 2b (low nibble, first) and 2b + 1 (high).
    for code in 0..16u8 {
        for high in [false, true] {
            let byte = if high { code << 4 } else { code };
            // Two blocks (scales 1.0 and 2^3), the code in every byte.
            let w = mxfp4(vec![byte; 32], vec![127, 130]);
            let v = E2M1_DEFINITION[code as usize];
            let want: Vec<f32> = (0..64)
                .map(|c| {
                    let value = if (c % 2 == 1) == high { v } else { 0.0 };
                    value * if c < 32 { 1.0 } else { 8.0 }
                })
                .collect();
            let what = format!("e2m1 code {code} in the {} nibble", if high { "high" } else { "low" });
            for (who, got) in decoded_everywhere(w.row_view(0), 64) {
                assert_same(&got, &want, &format!("{what}, {who}"));
            }
            check_products(&w, &want, &what);
        }
    }
    assert_eq!(crate::formats::FP4_E2M1.map(f32::to_bits), E2M1_DEFINITION.map(f32::to_bits));
}

#[test]
fn e8m0_extremes_follow_the_ocp_mx_definition() {
    assert_eq!(e8m0_to_f32(0x00).to_bits(), 1 << 22, "0x00 is 2^-127 (an f32 subnormal)");
    assert_eq!(e8m0_to_f32(0x00) as f64, 2f64.powi(-127));
    assert_eq!(e8m0_to_f32(0x7f), 1.0);
    assert_eq!(e8m0_to_f32(0xfe) as f64, 2f64.powi(127));
    assert!(e8m0_to_f32(0xff).is_nan(), "0xFF is NaN");
    // Codes 1 (0.5) and 7 (6.0) under each extreme: 2^-128 (subnormal),
    // 6 * 2^127 (overflows to infinity, as the f32 product does), NaN.
    for (scale, half, six) in [
        (0x00u8, 2f32.powi(-128), 6.0 * 2f32.powi(-127)),
        (0x7f, 0.5, 6.0),
        (0xfe, 2f32.powi(126), f32::INFINITY),
        (0xff, f32::NAN, f32::NAN),
    ] {
        let w = mxfp4(vec![0x71; 16], vec![scale]);
        let want: Vec<f32> = (0..32).map(|c| if c % 2 == 0 { half } else { six }).collect();
        for (who, got) in decoded_everywhere(w.row_view(0), 32) {
            assert_same(&got, &want, &format!("e8m0 {scale:#x}, {who}"));
        }
        if scale != 0xff {
            // Finite weights only (an infinite weight times a zero activation is NaN).
            let w = mxfp4(vec![0x21; 16], vec![scale]);
            let s = e8m0_to_f32(scale);
            let want: Vec<f32> = (0..32).map(|c| if c % 2 == 0 { 0.5 * s } else { s }).collect();
            check_products(&w, &want, &format!("e8m0 {scale:#x}"));
        }
    }
}

#[test]
fn a_nan_e8m0_scale_makes_its_block_and_every_output_of_its_row_nan() {
    // Zero codes too: NaN times zero is NaN, never a silent 0.
    let w = WeightMatrix::mxfp4(
        "mx-nan",
        2,
        96,
        SharedBytes::from_vec(vec![0u8; 96]),
        SharedBytes::from_vec(vec![127, 0xff, 127, 127, 127, 127]),
    )
    .unwrap();
    for (who, got) in decoded_everywhere(w.row_view(0), 96) {
        assert!(got[..32].iter().chain(&got[64..]).all(|v| *v == 0.0), "{who}");
        assert!(got[32..64].iter().all(|v| v.is_nan()), "{who}");
    }
    let x = Mat::from_vec(3, 96, (0..3 * 96).map(|i| (i % 7) as f32 - 3.0).collect());
    for path in KernelPath::available() {
        let y = matmul_t_with(path, &x, &w);
        for r in 0..3 {
            assert!(y.row(r)[0].is_nan(), "{} row {r}", path.name());
            assert_eq!(y.row(r)[1], 0.0, "{} row {r}", path.name());
        }
    }
}

/// int4 words whose nibbles are `nibbles` (column `8j + i` in nibble `i` of
/// little-endian word `j`, as compressed-tensors' `pack_to_int32` packs).
fn pack_int4(nibbles: &[u8]) -> Vec<u8> {
    nibbles
        .chunks_exact(8)
        .flat_map(|eight| {
            let word = eight.iter().enumerate().fold(0u32, |w, (i, &n)| w | (n as u32 & 0xf) << (4 * i));
            word.to_le_bytes()
        })
        .collect()
}

#[test]
fn every_int4_nibble_is_its_value_plus_8_times_its_group_scale() {
    // compressed-tensors pack-quantized stores signed q in -8..=7 as the
    // nibble q + 8; every nibble value in every position of a word, in
    // groups of 8, 32 and 96 columns with distinct scales.
    for group in [8usize, 32, 96] {
        let cols = 192;
        let nibbles: Vec<u8> = (0..cols).map(|c| ((c * 5 + c / 16) % 16) as u8).collect();
        let scales: Vec<f32> = (0..cols / group)
            .map(|g| [0.5f32, -2.0, 0.375, 3.0][g % 4] * (g + 1) as f32)
            .collect();
        let w = WeightMatrix::int4_group("i4", 1, cols, SharedBytes::from_vec(pack_int4(&nibbles)), scales.clone(), group).unwrap();
        let want: Vec<f32> = (0..cols).map(|c| (nibbles[c] as i32 - 8) as f32 * scales[c / group]).collect();
        for (who, got) in decoded_everywhere(w.row_view(0), cols) {
            assert_same(&got, &want, &format!("int4 group {group}, {who}"));
        }
        check_products(&w, &want, &format!("int4 group {group}"));
    }
    // Each value on its own: nibble 0 is -8, 8 is 0, 15 is 7.
    for nibble in 0..16u8 {
        let w = WeightMatrix::int4_group("i4", 1, 8, SharedBytes::from_vec(pack_int4(&[nibble; 8])), vec![1.0], 8).unwrap();
        let mut got = [0.0f32; 8];
        w.decode_row(0, &mut got);
        assert_eq!(got, [nibble as f32 - 8.0; 8], "nibble {nibble}");
    }
}

#[test]
fn int4_rows_not_a_whole_number_of_groups_are_refused_and_ragged_views_decode() {
    // A matrix needs whole groups (fail closed: a ragged last group would
    // need a scale layout no supported checkpoint ships).
    let err = WeightMatrix::int4_group("ragged", 1, 40, SharedBytes::from_vec(vec![0; 20]), vec![1.0; 2], 32).unwrap_err();
    assert!(err.to_string().contains("divides the columns (40)"), "{err}");
    // A view that starts and ends inside groups (kernel chunks cut rows so):
    // a partial first group (lead), whole groups and a ragged last group.
    let (cols, group) = (256, 96);
    let nibbles: Vec<u8> = (0..cols).map(|c| ((c * 3 + 1) % 16) as u8).collect();
    let scales: Vec<f32> = vec![0.25, -1.5, 4.0];
    let packed = pack_int4(&nibbles);
    let want_all: Vec<f32> = (0..cols).map(|c| (nibbles[c] as i32 - 8) as f32 * scales[c / group]).collect();
    for (c0, c1) in [(8, 104), (64, 256), (32, 200), (96, 136), (0, 8)] {
        let view = RowView::Int4 {
            packed: &packed[c0 / 2..c1 / 2],
            scales: &scales[c0 / group..],
            group,
            lead: c0 % group,
        };
        for (who, got) in decoded_everywhere(view, c1 - c0) {
            assert_same(&got, &want_all[c0..c1], &format!("int4 columns {c0}..{c1}, {who}"));
        }
    }
}

#[test]
fn int4_and_fp8_nan_scales_make_their_feature_nan() {
    let x = Mat::from_vec(2, 64, (0..128).map(|i| (i % 5) as f32 - 2.0).collect());
    let i4 = WeightMatrix::int4_group(
        "i4",
        2,
        64,
        SharedBytes::from_vec(vec![0x88; 64]),
        vec![1.0, f32::NAN, 1.0, 1.0],
        32,
    )
    .unwrap();
    let fp8 = WeightMatrix::fp8_block(
        "fp8",
        2,
        64,
        SharedBytes::from_vec(vec![0; 128]),
        vec![f32::NAN, 1.0, 1.0, 1.0],
        1,
        32,
    )
    .unwrap();
    for path in KernelPath::available() {
        for w in [&i4, &fp8] {
            let y = matmul_t_with(path, &x, w);
            for r in 0..2 {
                assert!(y.row(r)[0].is_nan(), "{} {} row {r}", path.name(), w.format());
                assert_eq!(y.row(r)[1], 0.0, "{} {} row {r}", path.name(), w.format());
            }
        }
    }
}

/// `data` copied to start one byte past an 8-byte boundary.
fn misaligned(data: &[u8]) -> (Vec<u8>, usize) {
    let mut v = vec![0u8; data.len() + 16];
    let at = (8 - v.as_ptr() as usize % 8) % 8 + 1;
    v[at..at + data.len()].copy_from_slice(data);
    (v, at)
}

/// One row of each quantized format over the same buffers.
fn views<'a>(codes: &'a [u8], nibbles: &'a [u8], e8m0: &'a [u8]) -> [RowView<'a>; 3] {
    [
        RowView::Fp8 {
            codes,
            scales: &[0.5, 3.0, -0.125],
            block_cols: 128,
            lead: 0,
        },
        RowView::Mxfp4 {
            blocks: nibbles,
            scales: e8m0,
        },
        RowView::Int4 {
            packed: nibbles,
            scales: &[0.75, -0.5, 2.0, 1.0, 0.125],
            group: 64,
            lead: 0,
        },
    ]
}

#[test]
fn misaligned_and_mid_block_rows_decode_identically() {
    let cols = 320;
    let codes: Vec<u8> = (0..cols).map(|c| (c * 37 % 251) as u8).collect();
    let nibbles: Vec<u8> = (0..cols / 2).map(|b| (b * 29 % 256) as u8).collect();
    let e8m0: Vec<u8> = (0..cols / 32).map(|b| 120 + b as u8).collect();
    let (mc, ac) = misaligned(&codes);
    let (mn, an) = misaligned(&nibbles);
    let (me, ae) = misaligned(&e8m0);
    let shifted = views(&mc[ac..ac + cols], &mn[an..an + cols / 2], &me[ae..ae + cols / 32]);
    for (aligned, shifted) in views(&codes, &nibbles, &e8m0).iter().zip(shifted) {
        let reference = decoded_everywhere(*aligned, cols).remove(0).1;
        for (who, got) in decoded_everywhere(shifted, cols) {
            assert_same(&got, &reference, &format!("misaligned {aligned:?}, {who}"));
        }
        // Rows that start mid-block (32-column multiples, as kernels cut them).
        for (c0, c1) in [(32, 320), (96, 160), (160, 288)] {
            for (who, got) in decoded_everywhere(shifted.slice(c0, c1), c1 - c0) {
                assert_same(&got, &reference[c0..c1], &format!("columns {c0}..{c1}, {who}"));
            }
        }
    }
}
