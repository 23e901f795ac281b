//! Criterion benches of the weight-format kernels at the shape of a
//! Kimi-class expert projection (k = 2048, n = 1408), 1 and 8 rows, on the
//! active kernel path. Throughput is weight bytes; compare it with the RAM
//! bandwidth `larder bench kernels` measures in the same session.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use larder_tensor::bench::{bench_formats, random_weight};
use larder_tensor::kernels::{active_path, matmul_t_with};
use larder_tensor::Mat;

fn kernels(c: &mut Criterion) {
    let (k, n) = (2048, 1408);
    let path = active_path();
    let mut group = c.benchmark_group(format!("gemv_{}", path.name()));
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    for (name, format) in bench_formats() {
        let w = random_weight(format, n, k, 7);
        group.throughput(Throughput::Bytes(w.byte_len() as u64));
        for rows in [1usize, 8] {
            let x = Mat::from_vec(rows, k, (0..rows * k).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect());
            group.bench_with_input(BenchmarkId::new(name, rows), &rows, |b, _| b.iter(|| matmul_t_with(path, &x, &w)));
        }
    }
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
