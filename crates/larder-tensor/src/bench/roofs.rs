//! This core's compute roofs: the issue rate of the kernels' exact inner
//! steps (fp8 and mxfp4 fused decode-and-FMA for one activation row, a bf16
//! row against eight rows), written out with `asm!` as independent chains
//! with everything in L1, turned into weight bytes per second. A kernel
//! streaming weights from RAM reaches at most the lower of this and the RAM
//! roof ([`super::ram_read_gbps`]); `larder bench kernels` reports both.
//! Plain FMA, shift and mask rates are measured too, to show the core's
//! issue width. x86-64 with AVX2 and FMA only: elsewhere [`measure`]
//! returns nothing.

/// One measured instruction stream.
#[derive(Debug, Clone)]
pub struct Roof {
    /// What the stream is.
    pub stream: &'static str,
    /// Vector instructions per second, in billions.
    pub ginstr_per_s: f64,
    /// For a kernel step: the weight GB/s that rate streams.
    pub weight_gbps: Option<f64>,
}

/// Measures every stream for about `seconds` each (one thread), keeping its
/// best 5 ms batch. Empty on CPUs without AVX2 and FMA, and off x86-64.
pub fn measure(seconds: f64) -> Vec<Roof> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        return x86::measure(seconds);
    }
    let _ = seconds;
    Vec::new()
}

/// The kernel steps' roofs as one line, e.g. for a report header.
pub fn summary(roofs: &[Roof]) -> String {
    let steps: Vec<String> = roofs
        .iter()
        .filter_map(|r| r.weight_gbps.map(|g| format!("{} {g:.2}", r.stream)))
        .collect();
    if steps.is_empty() {
        "not measured on this CPU".into()
    } else {
        format!("{} GB/s", steps.join(", "))
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::time::Instant;

    use super::Roof;

    /// One instruction stream: `ops` vector instructions per loop iteration,
    /// run by `run(iterations, scratch)`; a kernel step also says how many
    /// weight bytes one iteration consumes.
    struct Stream {
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
            "dec rcx", "jnz 2b",
            inout("rcx") n => _,
            clobber_abi("C"),
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
            "dec rcx", "jnz 2b",
            inout("rcx") n => _, p = in(reg) p,
            clobber_abi("C"),
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
            "dec rcx", "jnz 2b",
            inout("rcx") n => _,
            clobber_abi("C"),
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
            "dec rcx", "jnz 2b",
            inout("rcx") n => _,
            clobber_abi("C"),
            options(nostack, nomem),
        );
    }

    /// One 32-code step of the fused fp8 kernel for one activation row
    /// (`quant_avx2::step32` on a permuted group: `codes_avx2::fp8_bytes`
    /// plus NaN tracking): a 32-byte code load, 2 NaN-tracking ops, one
    /// 16-bit shift moving even bytes to the top, per half (even, odd) a
    /// shift and a mask making f16 words of value x 2^-8, and their widening
    /// as they are (an extract, two F16C conversions), then 4 FMAs with L1
    /// activations (18 vector instructions).
    unsafe fn fp8_step(n: u64, p: *const f32) {
        asm!(
            "mov eax, 0xbf80bf80", "vmovd xmm15, eax", "vpbroadcastd ymm15, xmm15",
            "vpxor ymm13, ymm13, ymm13",
            "vxorps ymm0, ymm0, ymm0", "vxorps ymm1, ymm1, ymm1",
            "vxorps ymm2, ymm2, ymm2", "vxorps ymm3, ymm3, ymm3",
            "2:",
            "vmovdqu ymm4, [{p}]",
            "vpaddb ymm5, ymm4, ymm4", "vpmaxub ymm13, ymm13, ymm5",
            "vpsllw ymm6, ymm4, 8",
            "vpsraw ymm6, ymm6, 1", "vpand ymm6, ymm6, ymm15",
            "vpsraw ymm7, ymm4, 1", "vpand ymm7, ymm7, ymm15",
            "vcvtph2ps ymm9, xmm6", "vextracti128 xmm10, ymm6, 1", "vcvtph2ps ymm10, xmm10",
            "vcvtph2ps ymm12, xmm7", "vextracti128 xmm11, ymm7, 1", "vcvtph2ps ymm11, xmm11",
            "vfmadd231ps ymm0, ymm9, [{p} + 64]", "vfmadd231ps ymm1, ymm12, [{p} + 96]",
            "vfmadd231ps ymm2, ymm10, [{p} + 128]", "vfmadd231ps ymm3, ymm11, [{p} + 160]",
            "dec rcx", "jnz 2b",
            inout("rcx") n => _, p = in(reg) p,
            clobber_abi("C"),
            options(nostack, readonly),
        );
    }

    /// One 64-code step of the fused mxfp4 kernel for one activation row
    /// (as `codes_avx2::e2m1_pair` and `e2m1_lane` decode it): a 32-byte code load, low and high
    /// nibbles masked out (2 masks, a shift), each looked up by one byte
    /// shuffle (twice the e2m1 values), then every byte of a lane
    /// sign-extended by shifts (7 per half) and converted (4 per half), and
    /// 8 FMAs with L1 activations (36 vector instructions). The shuffle
    /// table is loaded from the scratch: its values (small integers after
    /// the conversion) do not change the timing.
    unsafe fn mxfp4_step(n: u64, p: *const f32) {
        asm!(
            "mov eax, 0x0f0f0f0f", "vmovd xmm14, eax", "vpbroadcastd ymm14, xmm14",
            "vmovdqu ymm13, [{p}]",
            "vxorps ymm0, ymm0, ymm0", "vxorps ymm1, ymm1, ymm1",
            "vxorps ymm2, ymm2, ymm2", "vxorps ymm3, ymm3, ymm3",
            "2:",
            "vmovdqu ymm4, [{p}]",
            "vpand ymm5, ymm4, ymm14", "vpsrlw ymm6, ymm4, 4", "vpand ymm6, ymm6, ymm14",
            "vpshufb ymm5, ymm13, ymm5", "vpshufb ymm6, ymm13, ymm6",
            "vpslld ymm7, ymm5, 24", "vpsrad ymm7, ymm7, 24", "vcvtdq2ps ymm7, ymm7",
            "vpslld ymm8, ymm5, 16", "vpsrad ymm8, ymm8, 24", "vcvtdq2ps ymm8, ymm8",
            "vpslld ymm9, ymm5, 8", "vpsrad ymm9, ymm9, 24", "vcvtdq2ps ymm9, ymm9",
            "vpsrad ymm10, ymm5, 24", "vcvtdq2ps ymm10, ymm10",
            "vpslld ymm11, ymm6, 24", "vpsrad ymm11, ymm11, 24", "vcvtdq2ps ymm11, ymm11",
            "vpslld ymm12, ymm6, 16", "vpsrad ymm12, ymm12, 24", "vcvtdq2ps ymm12, ymm12",
            "vpslld ymm15, ymm6, 8", "vpsrad ymm15, ymm15, 24", "vcvtdq2ps ymm15, ymm15",
            "vpsrad ymm4, ymm6, 24", "vcvtdq2ps ymm4, ymm4",
            "vfmadd231ps ymm0, ymm7, [{p} + 64]", "vfmadd231ps ymm1, ymm11, [{p} + 96]",
            "vfmadd231ps ymm2, ymm8, [{p} + 128]", "vfmadd231ps ymm3, ymm12, [{p} + 160]",
            "vfmadd231ps ymm0, ymm9, [{p} + 192]", "vfmadd231ps ymm1, ymm15, [{p} + 224]",
            "vfmadd231ps ymm2, ymm10, [{p} + 256]", "vfmadd231ps ymm3, ymm4, [{p} + 288]",
            "dec rcx", "jnz 2b",
            inout("rcx") n => _, p = in(reg) p,
            clobber_abi("C"),
            options(nostack, readonly),
        );
    }

    /// One 16-column step of a bf16 row against eight activation rows (the
    /// 8-row GEMM case), as the kernel compiles it: one load of 16 weights,
    /// the even ones widened by a shift and the odd ones by a blend with
    /// zero, and 16 FMAs with L1 activations, two per row (19 vector
    /// instructions).
    unsafe fn bf16_rows8_step(n: u64, p: *const f32) {
        asm!(
            "vpxor ymm15, ymm15, ymm15",
            "2:",
            "vmovdqu ymm10, [{p}]", "vpslld ymm8, ymm10, 16", "vpblendw ymm9, ymm15, ymm10, 0xaa",
            "vfmadd231ps ymm0, ymm8, [{p} + 32]", "vfmadd231ps ymm1, ymm8, [{p} + 64]",
            "vfmadd231ps ymm2, ymm8, [{p} + 96]", "vfmadd231ps ymm3, ymm8, [{p} + 128]",
            "vfmadd231ps ymm4, ymm8, [{p} + 160]", "vfmadd231ps ymm5, ymm8, [{p} + 192]",
            "vfmadd231ps ymm6, ymm8, [{p} + 224]", "vfmadd231ps ymm7, ymm8, [{p} + 256]",
            "vfmadd231ps ymm0, ymm9, [{p} + 64]", "vfmadd231ps ymm1, ymm9, [{p} + 96]",
            "vfmadd231ps ymm2, ymm9, [{p} + 128]", "vfmadd231ps ymm3, ymm9, [{p} + 160]",
            "vfmadd231ps ymm4, ymm9, [{p} + 192]", "vfmadd231ps ymm5, ymm9, [{p} + 224]",
            "vfmadd231ps ymm6, ymm9, [{p} + 256]", "vfmadd231ps ymm7, ymm9, [{p} + 288]",
            "dec rcx", "jnz 2b",
            inout("rcx") n => _, p = in(reg) p,
            clobber_abi("C"),
            options(nostack, readonly),
        );
    }

    /// Vector instructions per second of `stream` over about `seconds`: the
    /// best of the ~5 ms batches run in that time (another tenant or task
    /// taking the core only ever lowers a batch's rate, so the best batch is
    /// the closest to what the core can do).
    fn rate(stream: &Stream, scratch: &[f32], seconds: f64) -> f64 {
        let p = scratch.as_ptr();
        // SAFETY (every call below): AVX2 and FMA were detected; the streams
        // read at most 320 bytes from `p`, which holds 512.
        let mut iters = 1u64 << 12;
        loop {
            let t = Instant::now();
            unsafe { (stream.run)(iters, p) };
            if t.elapsed().as_secs_f64() > 0.005 {
                break;
            }
            iters *= 2;
        }
        let (start, mut best) = (Instant::now(), 0.0f64);
        loop {
            let t = Instant::now();
            unsafe { (stream.run)(iters, p) };
            best = best.max((iters * stream.ops) as f64 / t.elapsed().as_secs_f64());
            if start.elapsed().as_secs_f64() >= seconds {
                break;
            }
        }
        best
    }

    pub(super) fn measure(seconds: f64) -> Vec<Roof> {
        // L1-resident operands (codes and activations), finite values.
        let scratch = vec![0.5f32; 128];
        let streams = [
            Stream {
                name: "FMA, register operands",
                ops: 10,
                run: fma_registers,
                weight_bytes: None,
            },
            Stream {
                name: "FMA, one L1 operand",
                ops: 10,
                run: fma_l1,
                weight_bytes: None,
            },
            Stream {
                name: "16-bit shift",
                ops: 10,
                run: shifts,
                weight_bytes: None,
            },
            Stream {
                name: "AND",
                ops: 10,
                run: logic,
                weight_bytes: None,
            },
            Stream {
                name: "fp8 1 row",
                ops: 26,
                run: fp8_step,
                weight_bytes: Some(32.0),
            },
            Stream {
                name: "mxfp4 1 row",
                ops: 36,
                run: mxfp4_step,
                weight_bytes: Some(34.0),
            },
            Stream {
                name: "bf16 8 rows",
                ops: 19,
                run: bf16_rows8_step,
                weight_bytes: Some(32.0),
            },
        ];
        streams
            .iter()
            .map(|s| {
                let r = rate(s, &scratch, seconds);
                Roof {
                    stream: s.name,
                    ginstr_per_s: r / 1e9,
                    weight_gbps: s.weight_bytes.map(|b| r / s.ops as f64 * b / 1e9),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn streams_run_and_report_positive_rates() {
        let roofs = super::measure(0.001);
        for r in &roofs {
            assert!(r.ginstr_per_s > 0.0 && r.ginstr_per_s.is_finite(), "{r:?}");
        }
        assert_eq!(
            roofs.iter().filter(|r| r.weight_gbps.is_some()).count(),
            if roofs.is_empty() { 0 } else { 3 }
        );
        assert!(!super::summary(&roofs).is_empty());
    }
}
