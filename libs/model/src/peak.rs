//! The machine's single-precision FMA peak, measured, to state the dense networks' speed
//! as a share of it: every thread runs twelve independent chains of fused multiply-adds on
//! the widest vectors the CPU has (AVX-512, else AVX2), enough in flight to cover the FMA
//! units' latency, so nothing but their throughput limits it.

use std::time::Instant;

use pulp::{Simd, WithSimd};

/// Independent accumulators per core (FMA latency times units, with room to spare).
const CHAINS: usize = 12;
const ITERATIONS: u64 = 50_000_000;

struct FmaChains;

impl WithSimd for FmaChains {
    /// Floating-point operations done, and a sum that keeps the work from being optimised
    /// away.
    type Output = (f64, f32);

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> (f64, f32) {
        let lanes = size_of::<S::f32s>() / size_of::<f32>();
        let mut chains = [simd.splat_f32s(1.0); CHAINS];
        let (a, b) = (simd.splat_f32s(0.999_999), simd.splat_f32s(1e-7));
        for _ in 0..ITERATIONS {
            for chain in &mut chains {
                *chain = simd.mul_add_f32s(*chain, a, b);
            }
        }
        let sum = chains.iter().map(|c| simd.reduce_sum_f32s(*c)).sum();
        ((ITERATIONS as usize * CHAINS * lanes * 2) as f64, sum)
    }
}

/// GFLOP/s of single-precision FMAs on `threads` threads at once (about a second each).
pub fn fma_peak_gflops(threads: usize) -> f64 {
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(|| pulp::Arch::new().dispatch(FmaChains)))
        .collect();
    let flops: f64 = workers
        .into_iter()
        .map(|w| {
            let (flops, sum) = w.join().expect("an FMA thread");
            std::hint::black_box(sum);
            flops
        })
        .sum();
    flops / started.elapsed().as_secs_f64() / 1e9
}
