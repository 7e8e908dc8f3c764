//! AVX-512 VNNI kernels. One `vpdpbusd` multiplies 4 unsigned weight codes of
//! each of 16 rows by the same 4 signed activations (broadcast) and adds the
//! products into 16 int32 lanes, one per row (see `layout`). Per block each
//! lane then holds its row's exact integer dot product, converted to f32 and
//! folded in with the canonical fma sequence of `portable`.

use std::arch::x86_64::*;

use super::act::QuantActs;
use super::ggml::QUANT_TYPES;
use super::layout::{zero_point, GROUP};
use super::matmul::Kernel;
use super::portable::TCHUNK;
use super::GgmlType;

// Format ids for monomorphisation.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const Q4K: u8 = 5;
const Q6K: u8 = 6;

/// Distance of the software prefetch, in bytes.
const PREFETCH_AHEAD: usize = 4096;

type Write<'a> = &'a dyn Fn(usize, usize, &[f32; GROUP]);

/// Compute groups `g0..g1` for all tokens.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C
/// (`Isa::Avx512Vnni.is_supported()`); `acts` must hold the quantized
/// activations of `k.n_tokens` tokens of `k.cols` columns and `x` the f32 ones.
pub(crate) unsafe fn run(
    k: &Kernel,
    acts: &QuantActs,
    x: &[f32],
    g0: usize,
    g1: usize,
    write: Write,
) {
    // SAFETY (all arms): the caller guarantees the CPU features and inputs.
    unsafe {
        match k.ty {
            GgmlType::Q4_0 => quant::<Q4_0>(k, acts, g0, g1, write),
            GgmlType::Q4_1 => quant::<Q4_1>(k, acts, g0, g1, write),
            GgmlType::Q5_0 => quant::<Q5_0>(k, acts, g0, g1, write),
            GgmlType::Q5_1 => quant::<Q5_1>(k, acts, g0, g1, write),
            GgmlType::Q8_0 => quant::<Q8_0>(k, acts, g0, g1, write),
            GgmlType::Q4K => quant::<Q4K>(k, acts, g0, g1, write),
            GgmlType::Q6K => quant::<Q6K>(k, acts, g0, g1, write),
            GgmlType::F32 | GgmlType::F16 => float(k, x, g0, g1, write),
            _ => unreachable!("{} is not a kernel type", k.ty),
        }
    }
}

fn fmt_type(f: u8) -> GgmlType {
    QUANT_TYPES[f as usize]
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quant<const F: u8>(k: &Kernel, acts: &QuantActs, g0: usize, g1: usize, write: Write) {
    let nb = k.cols / 32;
    let p = k.planes;
    let z = zero_point(fmt_type(F));
    let has_min = matches!(F, Q4_1 | Q5_1 | Q4K);
    let mut acc = [_mm512_setzero_ps(); TCHUNK];
    let mut res = [0f32; GROUP];
    let nib = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let sixteen = _mm512_set1_epi8(16);
    let sign = _mm512_set1_epi32(i32::MIN);
    let bytes_per_block = p.group_bytes() / nb;
    for g in g0..g1 {
        let group = k.group(g);
        let codes = group.as_ptr();
        let high = group[p.codes..].as_ptr();
        let scales = group[p.codes + p.high..].as_ptr();
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            for a in &mut acc[..nt] {
                *a = _mm512_setzero_ps();
            }
            for b in 0..nb {
                // Software prefetch PREFETCH_AHEAD bytes ahead of this block's
                // share of the group (groups are contiguous, so this runs into
                // the next group). Hardware prefetch alone falls behind when
                // a batch makes each block's compute long.
                let base = codes.wrapping_add(b * bytes_per_block + PREFETCH_AHEAD);
                let mut off = 0;
                while off < bytes_per_block {
                    _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(off).cast());
                    off += 64;
                }
                // SAFETY: every offset below stays inside this group's planes,
                // whose sizes `Planes::new` computed for `nb` blocks (codes:
                // 256 or 512 bytes per block, high bits: 64 or 128, scales: 32
                // or 64 per block, 320 per super-block); loads are unaligned.
                let mut w = [_mm512_setzero_si512(); 8];
                if F == Q8_0 {
                    for (c, w) in w.iter_mut().enumerate() {
                        *w = _mm512_loadu_si512(codes.add(b * 512 + c * 64).cast());
                    }
                } else {
                    for j in 0..4 {
                        let v = _mm512_loadu_si512(codes.add(b * 256 + j * 64).cast());
                        w[j] = _mm512_and_si512(v, nib);
                        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                    }
                }
                if F == Q5_0 || F == Q5_1 {
                    for (c, w) in w.iter_mut().enumerate() {
                        let m: __mmask64 = high.add(b * 64 + c * 8).cast::<u64>().read_unaligned();
                        *w = _mm512_mask_add_epi8(*w, m, *w, sixteen);
                    }
                }
                if F == Q6K {
                    for q in 0..2 {
                        let h = _mm512_loadu_si512(high.add(b * 128 + q * 64).cast());
                        let parts = [
                            _mm512_slli_epi16::<4>(h),
                            _mm512_slli_epi16::<2>(h),
                            h,
                            _mm512_srli_epi16::<2>(h),
                        ];
                        for (kk, part) in parts.into_iter().enumerate() {
                            let c = 4 * q + kk;
                            w[c] = _mm512_or_si512(w[c], _mm512_and_si512(part, m30));
                        }
                    }
                }
                // Per-row scale, additive minimum and Q6_K sub-scales.
                let (scale, min, sub_lo, sub_hi);
                match F {
                    Q4_1 | Q5_1 => {
                        scale = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(b * 64).cast()));
                        min = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(b * 64 + 32).cast()));
                        (sub_lo, sub_hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    }
                    Q4K => {
                        let s = scales.add((b / 8) * 320);
                        let j = b % 8;
                        let d = _mm512_cvtph_ps(_mm256_loadu_si256(s.cast()));
                        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(s.add(32).cast()));
                        let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                            s.add(64 + j * 32).cast(),
                        )));
                        let mq = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                            s.add(80 + j * 32).cast(),
                        )));
                        scale = _mm512_mul_ps(d, sc);
                        min = _mm512_castsi512_ps(_mm512_xor_si512(
                            _mm512_castps_si512(_mm512_mul_ps(dmin, mq)),
                            sign,
                        ));
                        (sub_lo, sub_hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    }
                    Q6K => {
                        let s = scales.add((b / 8) * 320);
                        let j = b % 8;
                        scale = _mm512_cvtph_ps(_mm256_loadu_si256(s.cast()));
                        min = _mm512_setzero_ps();
                        sub_lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(s.add(64 + j * 32).cast()));
                        sub_hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(s.add(80 + j * 32).cast()));
                    }
                    _ => {
                        scale = _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(b * 32).cast()));
                        min = _mm512_setzero_ps();
                        (sub_lo, sub_hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    }
                }
                for (dt, acc) in acc[..nt].iter_mut().enumerate() {
                    let blk = (t0 + dt) * nb + b;
                    // SAFETY: blk < n_tokens * nb, within the quantized activations.
                    let a = acts.q.as_ptr().add(blk * 32).cast::<i32>();
                    let s = *acts.sum.get_unchecked(blk);
                    let bc = |c: usize| _mm512_set1_epi32(a.add(c).read_unaligned());
                    let isum = if F == Q6K {
                        let s_lo = *acts.sum_lo.get_unchecked(blk);
                        let mut lo = _mm512_set1_epi32(-32 * s_lo);
                        let mut hi = _mm512_set1_epi32(-32 * (s - s_lo));
                        for c in 0..4 {
                            lo = _mm512_dpbusd_epi32(lo, w[c], bc(c));
                            hi = _mm512_dpbusd_epi32(hi, w[c + 4], bc(c + 4));
                        }
                        _mm512_add_epi32(
                            _mm512_mullo_epi32(lo, sub_lo),
                            _mm512_mullo_epi32(hi, sub_hi),
                        )
                    } else {
                        let mut i0 = _mm512_set1_epi32(-z * s);
                        let mut i1 = _mm512_setzero_si512();
                        for c in (0..8).step_by(2) {
                            i0 = _mm512_dpbusd_epi32(i0, w[c], bc(c));
                            i1 = _mm512_dpbusd_epi32(i1, w[c + 1], bc(c + 1));
                        }
                        _mm512_add_epi32(i0, i1)
                    };
                    let da = _mm512_set1_ps(*acts.d.get_unchecked(blk));
                    *acc =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(scale, da), *acc);
                    if has_min {
                        *acc = _mm512_fmadd_ps(
                            min,
                            _mm512_set1_ps(*acts.dsum.get_unchecked(blk)),
                            *acc,
                        );
                    }
                }
            }
            for (dt, acc) in acc[..nt].iter().enumerate() {
                _mm512_storeu_ps(res.as_mut_ptr(), *acc);
                write(t0 + dt, g, &res);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn float(k: &Kernel, x: &[f32], g0: usize, g1: usize, write: Write) {
    let f32w = k.ty == GgmlType::F32;
    let mut acc = [_mm512_setzero_ps(); TCHUNK];
    let mut res = [0f32; GROUP];
    for g in g0..g1 {
        let w = k.group(g).as_ptr();
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            for a in &mut acc[..nt] {
                *a = _mm512_setzero_ps();
            }
            for kk in 0..k.cols {
                // SAFETY: column kk's 16 values lie at kk*64 (f32) or kk*32 (f16)
                // inside the group (cols*64 or cols*32 bytes).
                let wv = if f32w {
                    _mm512_loadu_ps(w.add(kk * 64).cast())
                } else {
                    _mm512_cvtph_ps(_mm256_loadu_si256(w.add(kk * 32).cast()))
                };
                for (dt, acc) in acc[..nt].iter_mut().enumerate() {
                    let xv = *x.get_unchecked((t0 + dt) * k.cols + kk);
                    *acc = _mm512_fmadd_ps(wv, _mm512_set1_ps(xv), *acc);
                }
            }
            for (dt, acc) in acc[..nt].iter().enumerate() {
                _mm512_storeu_ps(res.as_mut_ptr(), *acc);
                write(t0 + dt, g, &res);
            }
        }
    }
}
