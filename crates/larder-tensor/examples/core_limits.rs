//! Measures what one core of this machine can issue: 256-bit FMAs (register
//! and L1 operands), vector shifts, vector logic, and the exact instruction
//! mixes of the fused fp8 and mxfp4 dot-product steps (`quant_avx2`) and of
//! a bf16 row against eight activation rows (`blocked`), each as
//! independent chains so that only throughput counts. From the mixes it
//! prints the most weight bytes per second those kernels could reach on one
//! thread with everything already in L1: the compute roof that a
//! `larder bench kernels` figure below the RAM roof should be read against
//! (a kernel streaming from RAM reaches at most the lower of the two).
//!
//! ```text
//! cargo run --release -p larder-tensor --example core_limits [SECONDS_PER_CASE]
//! ```
//!
//! x86-64 with AVX2 and FMA only (the instruction streams are written out
//! with `asm!`, so the compiler cannot reorder or drop them).

#[cfg(target_arch = "x86_64")]
fn main() {
    x86::main()
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("core_limits measures x86-64 AVX2 instruction streams; nothing to do on this architecture");
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::time::Instant;

    /// One measured instruction stream: `ops` vector instructions per loop
    /// iteration, run by `run(iterations, scratch)`; a kernel step also says
    /// how many weight bytes one iteration consumes.
    struct Case {
        name: &'static str,
        ops: u64,
        run: unsafe fn(u64, *const f32),
        weight_bytes: Option<f64>,
    }

    /// Ten FMAs on registers, ten independent accumulators.
    unsafe fn fma_registers(n: u64, _: *const f32) {
        asm!(
            "2:",
            "vfmadd231ps ymm0, ymm14, ymm15", "vfmadd231ps ymm1, ymm14, ymm15",
            "vfmadd231ps ymm2, ymm14, ymm15", "vfmadd231ps ymm3, ymm14, ymm15",
            "vfmadd231ps ymm4, ymm14, ymm15", "vfmadd231ps ymm5, ymm14, ymm15",
            "vfmadd231ps ymm6, ymm14, ymm15", "vfmadd231ps ymm7, ymm14, ymm15",
            "vfmadd231ps ymm8, ymm14, ymm15", "vfmadd231ps ymm9, ymm14, ymm15",
            "dec {n}", "jnz 2b",
            n = inout(reg) n => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm14") _, out("ymm15") _,
            options(nostack),
        );
    }

    /// Ten FMAs each reading one operand from L1.
    unsafe fn fma_l1(n: u64, p: *const f32) {
        asm!(
            "2:",
            "vfmadd231ps ymm0, ymm14, [{p}]", "vfmadd231ps ymm1, ymm14, [{p} + 32]",
            "vfmadd231ps ymm2, ymm14, [{p} + 64]", "vfmadd231ps ymm3, ymm14, [{p} + 96]",
            "vfmadd231ps ymm4, ymm14, [{p} + 128]", "vfmadd231ps ymm5, ymm14, [{p} + 160]",
            "vfmadd231ps ymm6, ymm14, [{p} + 192]", "vfmadd231ps ymm7, ymm14, [{p} + 224]",
            "vfmadd231ps ymm8, ymm14, [{p} + 256]", "vfmadd231ps ymm9, ymm14, [{p} + 288]",
            "dec {n}", "jnz 2b",
            n = inout(reg) n => _, p = in(reg) p,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm14") _,
            options(nostack, readonly),
        );
    }

    /// Ten 16-bit arithmetic shifts, independent.
    unsafe fn shifts(n: u64, _: *const f32) {
        asm!(
            "2:",
            "vpsraw ymm0, ymm15, 4", "vpsraw ymm1, ymm15, 4", "vpsraw ymm2, ymm15, 4",
            "vpsraw ymm3, ymm15, 4", "vpsraw ymm4, ymm15, 4", "vpsraw ymm5, ymm15, 4",
            "vpsraw ymm6, ymm15, 4", "vpsraw ymm7, ymm15, 4", "vpsraw ymm8, ymm15, 4",
            "vpsraw ymm9, ymm15, 4",
            "dec {n}", "jnz 2b",
            n = inout(reg) n => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm15") _,
            options(nostack, nomem),
        );
    }

    /// Ten vector ANDs, independent.
    unsafe fn logic(n: u64, _: *const f32) {
        asm!(
            "2:",
            "vpand ymm0, ymm14, ymm15", "vpand ymm1, ymm14, ymm15", "vpand ymm2, ymm14, ymm15",
            "vpand ymm3, ymm14, ymm15", "vpand ymm4, ymm14, ymm15", "vpand ymm5, ymm14, ymm15",
            "vpand ymm6, ymm14, ymm15", "vpand ymm7, ymm14, ymm15", "vpand ymm8, ymm14, ymm15",
            "vpand ymm9, ymm14, ymm15",
            "dec {n}", "jnz 2b",
            n = inout(reg) n => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm14") _, out("ymm15") _,
            options(nostack, nomem),
        );
    }

    /// One 32-code step of the fused fp8 kernel for one activation row
    /// (`quant_avx2::fp8_bytes` plus NaN tracking): a 32-byte code load, 5
    /// shifts, 4 masks, 2 NaN-tracking ops and 4 FMAs with L1 activations
    /// (15 vector instructions).
    unsafe fn fp8_step(n: u64, p: *const f32) {
        asm!(
            "2:",
            "vmovdqu ymm4, [{p}]",
            "vpaddb ymm5, ymm4, ymm4", "vpmaxub ymm13, ymm13, ymm5",
            "vpsraw ymm6, ymm4, 4", "vpsllw ymm7, ymm4, 8", "vpsraw ymm7, ymm7, 4",
            "vpslld ymm8, ymm7, 16", "vpslld ymm9, ymm6, 16",
            "vpand ymm8, ymm8, ymm15", "vpand ymm9, ymm9, ymm15",
            "vpand ymm7, ymm7, ymm15", "vpand ymm6, ymm6, ymm15",
            "vfmadd231ps ymm0, ymm8, [{p} + 64]", "vfmadd231ps ymm1, ymm9, [{p} + 96]",
            "vfmadd231ps ymm2, ymm7, [{p} + 128]", "vfmadd231ps ymm3, ymm6, [{p} + 160]",
            "dec {n}", "jnz 2b",
            n = inout(reg) n => _, p = in(reg) p,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm13") _, out("ymm15") _,
            options(nostack, readonly),
        );
    }

    /// One 64-code step of the fused mxfp4 kernel for one activation row
    /// (`quant_avx2::e2m1_lanes`): a 32-byte code load, 11 shifts, 8 masks
    /// and 8 FMAs with L1 activations (27 vector instructions).
    unsafe fn mxfp4_step(n: u64, p: *const f32) {
        asm!(
            "2:",
            "vmovdqu ymm4, [{p}]",
            "vpsllw ymm5, ymm4, 12", "vpsraw ymm5, ymm5, 6",
            "vpsllw ymm6, ymm4, 8", "vpsraw ymm6, ymm6, 6",
            "vpsllw ymm7, ymm4, 4", "vpsraw ymm7, ymm7, 6",
            "vpsraw ymm8, ymm4, 6",
            "vpslld ymm9, ymm5, 16", "vpslld ymm10, ymm6, 16",
            "vpslld ymm11, ymm7, 16", "vpslld ymm12, ymm8, 16",
            "vpand ymm5, ymm5, ymm15", "vpand ymm6, ymm6, ymm15",
            "vpand ymm7, ymm7, ymm15", "vpand ymm8, ymm8, ymm15",
            "vpand ymm9, ymm9, ymm15", "vpand ymm10, ymm10, ymm15",
            "vpand ymm11, ymm11, ymm15", "vpand ymm12, ymm12, ymm15",
            "vfmadd231ps ymm0, ymm9, [{p} + 64]", "vfmadd231ps ymm1, ymm10, [{p} + 96]",
            "vfmadd231ps ymm2, ymm11, [{p} + 128]", "vfmadd231ps ymm3, ymm12, [{p} + 160]",
            "vfmadd231ps ymm0, ymm5, [{p} + 192]", "vfmadd231ps ymm1, ymm6, [{p} + 224]",
            "vfmadd231ps ymm2, ymm7, [{p} + 256]", "vfmadd231ps ymm3, ymm8, [{p} + 288]",
            "dec {n}", "jnz 2b",
            n = inout(reg) n => _, p = in(reg) p,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm15") _,
            options(nostack, readonly),
        );
    }

    /// One 8-column step of a bf16 row against eight activation rows (the
    /// 8-row GEMM case): the 8 weights widened (zero-extend, shift) and 8
    /// FMAs with L1 activations, one per row (10 vector instructions).
    unsafe fn bf16_rows8_step(n: u64, p: *const f32) {
        asm!(
            "2:",
            "vpmovzxwd ymm8, [{p}]", "vpslld ymm8, ymm8, 16",
            "vfmadd231ps ymm0, ymm8, [{p} + 32]", "vfmadd231ps ymm1, ymm8, [{p} + 64]",
            "vfmadd231ps ymm2, ymm8, [{p} + 96]", "vfmadd231ps ymm3, ymm8, [{p} + 128]",
            "vfmadd231ps ymm4, ymm8, [{p} + 160]", "vfmadd231ps ymm5, ymm8, [{p} + 192]",
            "vfmadd231ps ymm6, ymm8, [{p} + 224]", "vfmadd231ps ymm7, ymm8, [{p} + 256]",
            "dec {n}", "jnz 2b",
            n = inout(reg) n => _, p = in(reg) p,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _,
            options(nostack, readonly),
        );
    }

    /// Vector instructions per second of `case`, run for about `seconds`.
    fn rate(case: &Case, scratch: &[f32], seconds: f64) -> f64 {
        let p = scratch.as_ptr();
        // Calibrate a batch of about 10 ms, then repeat it.
        let mut iters = 1u64 << 16;
        loop {
            let t = Instant::now();
            unsafe { (case.run)(iters, p) };
            if t.elapsed().as_secs_f64() > 0.01 {
                break;
            }
            iters *= 2;
        }
        let (start, mut done) = (Instant::now(), 0u64);
        while start.elapsed().as_secs_f64() < seconds {
            unsafe { (case.run)(iters, p) };
            done += iters;
        }
        (done * case.ops) as f64 / start.elapsed().as_secs_f64()
    }

    pub fn main() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("core_limits needs AVX2 and FMA");
            std::process::exit(1);
        }
        let seconds = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
        // L1-resident operands (codes and activations), finite values.
        let scratch = vec![0.5f32; 128];
        let cases = [
            Case {
                name: "FMA, register operands",
                ops: 10,
                run: fma_registers,
                weight_bytes: None,
            },
            Case {
                name: "FMA, one L1 operand",
                ops: 10,
                run: fma_l1,
                weight_bytes: None,
            },
            Case {
                name: "16-bit shift",
                ops: 10,
                run: shifts,
                weight_bytes: None,
            },
            Case {
                name: "AND",
                ops: 10,
                run: logic,
                weight_bytes: None,
            },
            Case {
                name: "fp8 fused step (32 weights)",
                ops: 15,
                run: fp8_step,
                weight_bytes: Some(32.0),
            },
            Case {
                name: "mxfp4 fused step (64 weights, scales)",
                ops: 27,
                run: mxfp4_step,
                weight_bytes: Some(34.0),
            },
            Case {
                name: "bf16 step, 8 activation rows",
                ops: 10,
                run: bf16_rows8_step,
                weight_bytes: Some(16.0),
            },
        ];
        println!("one thread, 256-bit vectors, {seconds} s per case (G vector instructions/s):");
        let mut roofs = Vec::new();
        for case in &cases {
            let r = rate(case, &scratch, seconds);
            println!("  {:<38} {:6.2}", case.name, r / 1e9);
            if let Some(bytes) = case.weight_bytes {
                roofs.push((case.name, r / case.ops as f64 * bytes));
            }
        }
        // Iterations per second times the weight bytes of one.
        println!("compute roofs with everything in L1 (one thread, GB/s of weights):");
        for (name, roof) in roofs {
            println!("  {:<38} {:6.2}", name, roof / 1e9);
        }
    }
}
