//! The machine's int8 multiply-accumulate peak, measured: the physical floor that
//! prefill throughput is reported against (`rag-bench vs-llamacpp`).
//!
//! Each thread runs independent chains of the widest int8 dot-product instruction
//! the run-time ISA has (`vpdpbusd` on 512 bits for AVX-512 VNNI: 64 MACs each;
//! `vpmaddubsw` + `vpmaddwd` + `vpaddd` on 256 bits for AVX2: 32 MACs per three
//! instructions), enough chains to hide the latency, on register operands only.

use std::time::Instant;

use super::simd::{detected, Isa};

/// Iterations of the inner loop per timed run (each iteration is one round of
/// every chain).
const ITERS: u64 = 1 << 23;

/// Independent accumulator chains per thread.
const CHAINS: usize = 12;

/// Measured int8 multiply-accumulates per second over `threads` threads (best of
/// `rounds` runs), with the detected ISA; `None` where there is no int8 SIMD path.
pub fn int8_macs_per_sec(threads: usize, rounds: usize) -> Option<f64> {
    let isa = detected();
    let macs_per_iter = match isa {
        Isa::Avx512Vnni => CHAINS as u64 * 64,
        Isa::Avx2 | Isa::AvxVnni => CHAINS as u64 * 32,
        _ => return None,
    };
    let threads = threads.max(1);
    let mut best = 0f64;
    for _ in 0..rounds.max(1) {
        let t0 = Instant::now();
        let sink: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|i| s.spawn(move || run_chains(isa, i as i32 + 1)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        let secs = t0.elapsed().as_secs_f64();
        std::hint::black_box(sink);
        best = best.max((threads as u64 * ITERS * macs_per_iter) as f64 / secs);
    }
    Some(best)
}

/// One thread's chains; returns a value depending on every chain so nothing is
/// optimised away.
fn run_chains(isa: Isa, seed: i32) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512Vnni && isa.is_supported() {
            // SAFETY: the CPU supports AVX-512 F/VNNI (checked just above).
            return unsafe { chains_avx512(seed) };
        }
        if isa == Isa::AvxVnni && isa.is_supported() {
            // SAFETY: the CPU supports AVX2 and AVX-VNNI (checked just above).
            return unsafe { chains_avx_vnni(seed) };
        }
        if isa == Isa::Avx2 && isa.is_supported() {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { chains_avx2(seed) };
        }
    }
    let _ = (isa, seed);
    0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn chains_avx512(seed: i32) -> u64 {
    use std::arch::x86_64::*;
    let a = _mm512_set1_epi32(0x0101_0101 * (seed & 0x3F));
    let b = _mm512_set1_epi32(0x0102_0301);
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..ITERS {
        for c in acc.iter_mut() {
            *c = _mm512_dpbusd_epi32(*c, a, b);
        }
    }
    let mut s = _mm512_setzero_si512();
    for c in acc {
        s = _mm512_add_epi32(s, c);
    }
    _mm512_reduce_add_epi32(s) as u32 as u64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn chains_avx_vnni(seed: i32) -> u64 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_epi32(0x0101_0101 * (seed & 0x3F));
    let b = _mm256_set1_epi32(0x0102_0301);
    let mut acc = [_mm256_setzero_si256(); CHAINS];
    for _ in 0..ITERS {
        for c in acc.iter_mut() {
            *c = _mm256_dpbusd_avx_epi32(*c, a, b);
        }
    }
    lane_sum(acc)
}

/// Wrapping sum of every lane of the chains (depends on all of them).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn lane_sum(acc: [std::arch::x86_64::__m256i; CHAINS]) -> u64 {
    use std::arch::x86_64::*;
    let mut s = _mm256_setzero_si256();
    for c in acc {
        s = _mm256_add_epi32(s, c);
    }
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` holds 8 i32, the 32 bytes stored.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s) };
    lanes.iter().fold(0u32, |s, &x| s.wrapping_add(x as u32)) as u64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chains_avx2(seed: i32) -> u64 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_epi32(0x0101_0101 * (seed & 0x3F));
    let b = _mm256_set1_epi32(0x0102_0301);
    let ones = _mm256_set1_epi16(1);
    // Unlike `vpdpbusd`, the products do not read the accumulator, so with constant
    // inputs the compiler computed them once outside the loop (the probe then timed
    // `vpaddd` alone: 2.2 T MAC/s here). `a` is opaque in every iteration and each chain
    // has its own opaque copy of `b`, so every chain multiplies in every iteration.
    let bs: [__m256i; CHAINS] = std::array::from_fn(|_| std::hint::black_box(b));
    let mut acc = [_mm256_setzero_si256(); CHAINS];
    for _ in 0..ITERS {
        let a = std::hint::black_box(a);
        for (c, b) in acc.iter_mut().zip(&bs) {
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(a, *b), ones);
            *c = _mm256_add_epi32(*c, p);
        }
    }
    lane_sum(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chains compute what they claim: ITERS rounds of the same dot product.
    #[test]
    fn chains_sum_the_expected_products() {
        let isa = detected();
        let seed = 3;
        // Per 32-bit lane and instruction: bytes (3,3,3,3) . (1,3,2,1) = 21.
        let per_lane_iter: u64 = 3 * (1 + 3 + 2 + 1);
        let lanes = match isa {
            Isa::Avx512Vnni => 16,
            Isa::Avx2 | Isa::AvxVnni => 8,
            _ => return,
        };
        let want = (per_lane_iter * ITERS * CHAINS as u64 * lanes) as u32 as u64;
        assert_eq!(run_chains(isa, seed), want);
        // Every supported x86 tier, not only the detected one.
        for isa in [Isa::AvxVnni, Isa::Avx2]
            .into_iter()
            .filter(|i| i.is_supported())
        {
            let want = (per_lane_iter * ITERS * CHAINS as u64 * 8) as u32 as u64;
            assert_eq!(run_chains(isa, seed), want, "{isa:?}");
        }
    }
}
