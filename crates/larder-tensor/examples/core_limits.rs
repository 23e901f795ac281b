//! Prints this core's compute roofs ([`larder_tensor::bench::roofs`]): the
//! issue rates of FMAs, shifts and masks, and of the kernels' exact inner
//! steps (fp8 and mxfp4 for one activation row, bf16 against eight rows) as
//! GB/s of weights with everything in L1. `larder bench kernels` measures
//! the same roofs (shorter) next to the RAM roof; this runs them longer, for
//! a steadier figure.
//!
//! ```text
//! cargo run --release -p larder-tensor --example core_limits [SECONDS_PER_STREAM]
//! ```

use larder_tensor::bench::roofs;

fn main() {
    let seconds = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let measured = roofs::measure(seconds);
    if measured.is_empty() {
        eprintln!("compute roofs are measured on x86-64 with AVX2 and FMA only");
        return;
    }
    println!("one thread, 256-bit vectors, {seconds} s per stream:");
    println!("  {:<26} {:>14} {:>12}", "stream", "G instr/s", "weight GB/s");
    for r in &measured {
        let gbps = r.weight_gbps.map_or("-".to_string(), |g| format!("{g:.2}"));
        println!("  {:<26} {:>14.2} {:>12}", r.stream, r.ginstr_per_s, gbps);
    }
}
