//! Runs one kernel case in a loop for a fixed time and prints its weight
//! GB/s: the harness behind same-conditions A/B comparisons (build two
//! revisions, run them back to back) and `perf record` profiles, which
//! `larder bench kernels` (median of short timings per case) is not made for.
//!
//! ```text
//! cargo run --release -p larder-tensor --example matmul_loop -- FORMAT K N [ROWS] [SECONDS] [hot]
//! RAYON_NUM_THREADS=1 cargo run --release -p larder-tensor --example matmul_loop -- fp8 2048 1408 1 3
//! ```
//!
//! FORMAT is one of `larder bench kernels`' formats (f32, f16, bf16, fp8,
//! mxfp4, int4). Cold (the default) cycles through 256 MiB of distinct
//! weights; `hot` reuses one.

use std::process::ExitCode;
use std::time::Instant;

use larder_tensor::bench::{bench_formats, random_weight, COLD_SET_BYTES};
use larder_tensor::kernels::matmul_t;
use larder_tensor::Mat;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: matmul_loop FORMAT K N [ROWS] [SECONDS] [hot]";
    let number = |i: usize, default: Option<f64>| -> Option<f64> {
        match args.get(i) {
            Some(s) => s.parse().ok(),
            None => default,
        }
    };
    let format = args.first().and_then(|name| bench_formats().into_iter().find(|(n, _)| n == name));
    let (Some((name, format)), Some(k), Some(n), Some(rows), Some(secs)) =
        (format, number(1, None), number(2, None), number(3, Some(1.0)), number(4, Some(3.0)))
    else {
        eprintln!(
            "{usage}\nformats: {:?}",
            bench_formats().iter().map(|(n, _)| *n).collect::<Vec<_>>()
        );
        return ExitCode::FAILURE;
    };
    let (k, n, rows) = (k as usize, n as usize, (rows as usize).max(1));
    if k == 0 || k % 128 != 0 || n == 0 {
        eprintln!("{usage}\nK must be a positive multiple of 128 (every format's blocks fit), N positive");
        return ExitCode::FAILURE;
    }
    let hot = args.get(5).is_some_and(|s| s == "hot");
    let first = random_weight(format, n, k, 1);
    let copies = if hot { 1 } else { COLD_SET_BYTES.div_ceil(first.byte_len()).max(2) };
    let mut weights = vec![first];
    weights.extend((1..copies).map(|c| random_weight(format, n, k, c as u64 + 1)));
    let x = Mat::from_vec(rows, k, (0..rows * k).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect());
    let start = Instant::now();
    let mut calls = 0;
    while start.elapsed().as_secs_f64() < secs {
        std::hint::black_box(matmul_t(&x, &weights[calls % copies]));
        calls += 1;
    }
    let seconds = start.elapsed().as_secs_f64();
    let gbps = (calls * weights[0].byte_len()) as f64 / seconds / 1e9;
    println!(
        "{name} {k}x{n} rows={rows} {}: {gbps:.2} GB/s ({calls} calls)",
        if hot { "hot" } else { "cold" }
    );
    ExitCode::SUCCESS
}
