//! AVX-512 VNNI kernels. One `vpdpbusd` multiplies 4 unsigned weight codes of
//! each of 16 rows by the same 4 signed activations (broadcast) and adds the
//! products into 16 int32 lanes, one per row (see `layout`). Per block each
//! lane then holds its row's exact integer dot product, converted to f32 and
//! folded in with the canonical fma sequence of `portable`; for the K-quants
//! the integer sums of a whole 256-column super-block are combined first.
//! From 4 tokens on, two adjacent row groups share each activation broadcast
//! (`quant_pairs`, `kquant_pairs`).

use std::arch::x86_64::*;

use super::act::{zero_sum_index, QuantActs};
use super::ggml::QUANT_TYPES;
use super::layout::{zero_point, GROUP, Q4K_MQ, Q4K_SC, Q6K_SUB};
use super::matmul::kernel_io::{Kernel, OutOp, Output};
use super::portable::{filled, TCHUNK};
use super::x86_avx2::Prefetch;
use super::GgmlType;
use std::mem::MaybeUninit;

// Format ids for monomorphisation.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const Q4K: u8 = 5;
const Q6K: u8 = 6;

type Write<'a> = &'a Output;

/// Compute groups `g0..g1` for all tokens, writing them through `write`.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C
/// (`Isa::Avx512Vnni.is_supported()`); `acts` must hold the quantized
/// activations of `k.n_tokens` tokens of `k.cols` columns and `x` the f32 ones;
/// `write` is valid for those tokens and groups `g0..g1`, used by nobody else
/// meanwhile (`Output::put`).
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
            GgmlType::Q4_0 if k.n_tokens >= PAIR_MIN_TOKENS => {
                quant_pairs::<Q4_0>(k, acts, g0, g1, write)
            }
            GgmlType::Q4_0 => quant::<Q4_0>(k, acts, g0, g1, write),
            GgmlType::Q4_1 if k.n_tokens >= PAIR_MIN_TOKENS => {
                quant_pairs::<Q4_1>(k, acts, g0, g1, write)
            }
            GgmlType::Q4_1 => quant::<Q4_1>(k, acts, g0, g1, write),
            GgmlType::Q5_0 if k.n_tokens >= PAIR_MIN_TOKENS => {
                quant_pairs::<Q5_0>(k, acts, g0, g1, write)
            }
            GgmlType::Q5_0 => quant::<Q5_0>(k, acts, g0, g1, write),
            GgmlType::Q5_1 if k.n_tokens >= PAIR_MIN_TOKENS => {
                quant_pairs::<Q5_1>(k, acts, g0, g1, write)
            }
            GgmlType::Q5_1 => quant::<Q5_1>(k, acts, g0, g1, write),
            GgmlType::Q8_0 if k.n_tokens >= PAIR_MIN_TOKENS => {
                quant_pairs::<Q8_0>(k, acts, g0, g1, write)
            }
            GgmlType::Q8_0 => quant::<Q8_0>(k, acts, g0, g1, write),
            GgmlType::Q4K if k.n_tokens >= PAIR_MIN_TOKENS => {
                kquant_pairs::<Q4K>(k, acts, g0, g1, write)
            }
            GgmlType::Q4K => kquant::<Q4K>(k, acts, g0, g1, write),
            GgmlType::Q6K if k.n_tokens >= PAIR_MIN_TOKENS => {
                kquant_pairs::<Q6K>(k, acts, g0, g1, write)
            }
            GgmlType::Q6K => kquant::<Q6K>(k, acts, g0, g1, write),
            GgmlType::F32 | GgmlType::F16 => float(k, x, g0, g1, write),
            _ => unreachable!("{} is not a kernel type", k.ty),
        }
    }
}

#[inline(always)]
fn fmt_type(f: u8) -> GgmlType {
    QUANT_TYPES[f as usize]
}

/// Applies the output `o` to token `t`'s group `g`, straight from the accumulator
/// `v`: one (masked, for a partial last group) 64-byte store, with the epilogue's
/// single `vaddps` or the argmax's compare and two masked stores. Same IEEE
/// operations as `Output::put` (masked-off lanes are neither read nor written).
///
/// # Safety
/// AVX-512 F; `t`, `g` as `Output::at`, and the contract of `run`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn emit(o: &Output, t: usize, g: usize, v: __m512) {
    let n = o.rows - g * GROUP;
    let k: __mmask16 = if n >= GROUP { !0 } else { (1 << n) - 1 };
    // SAFETY: `at` and the next `n` floats (argmax: `GROUP`) are this task's; a
    // bias holds `rows` floats; masked-off lanes are not accessed (no fault).
    unsafe {
        let p = o.at(t, g);
        match o.op {
            OutOp::Store => _mm512_mask_storeu_ps(p, k, v),
            OutOp::Bias(b) => {
                let bias = _mm512_maskz_loadu_ps(k, b.add(g * GROUP));
                _mm512_mask_storeu_ps(p, k, _mm512_add_ps(v, bias));
            }
            OutOp::Accumulate => {
                let old = _mm512_maskz_loadu_ps(k, p);
                _mm512_mask_storeu_ps(p, k, _mm512_add_ps(old, v));
            }
            OutOp::Argmax(gi) => {
                // `kernel_io::lane_best`: `_CMP_GT_OQ` is false for NaN, like `>`;
                // padding lanes of a partial group never win.
                let m = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(k, v, _mm512_loadu_ps(p));
                _mm512_mask_storeu_ps(p, m, v);
                let gp = gi.add(t * GROUP).cast::<i32>();
                _mm512_mask_storeu_epi32(gp, m, _mm512_set1_epi32(g as i32));
            }
        }
    }
}

/// [`emit`] of a two-group pass's accumulators for tokens `t0..` and groups `g`, `g + 1`:
/// per token the lower group first (the argmax keeps each lane's first maximum).
///
/// # Safety
/// As [`emit`], for every token of `acc` and both groups.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn emit_pair(o: &Output, t0: usize, g: usize, acc: &[[__m512; 2]]) {
    for (dt, acc) in acc.iter().enumerate() {
        // SAFETY: the contract above.
        unsafe {
            emit(o, t0 + dt, g, acc[0]);
            emit(o, t0 + dt, g + 1, acc[1]);
        }
    }
}

/// The 8 code vectors of block `b` (chunk `c` = columns 4c..4c+4 of each row,
/// unsigned). Q5 high bits are added; Q6_K high bits are or-ed in.
///
/// # Safety
/// AVX-512 F/BW; `codes`/`high` point at a group's planes holding block `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn load_codes<const F: u8>(codes: *const u8, high: *const u8, b: usize) -> [__m512i; 8] {
    // SAFETY: offsets stay inside this group's planes, whose sizes
    // `Planes::new` computed (codes: 256 or 512 bytes per block, high bits: 64
    // or 128); loads are unaligned.
    unsafe {
        let nib = _mm512_set1_epi8(0x0F);
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
            // Opaque to the compiler: knowing the code's bit 4 clear, it turned the masked
            // add into an `or` plus a masked move (one instruction more per vector;
            // benchmarks/runs/kernels-worklog.md#item-69).
            let sixteen = _mm512_set1_epi8(std::hint::black_box(16));
            for (c, w) in w.iter_mut().enumerate() {
                let m: __mmask64 = high.add(b * 64 + c * 8).cast::<u64>().read_unaligned();
                *w = _mm512_mask_add_epi8(*w, m, *w, sixteen);
            }
        }
        if F == Q6K {
            let m30 = _mm512_set1_epi32(0x3030_3030);
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
                    // w | (part & 0x30) in one instruction: truth table A | (B & C) = 0xF8.
                    w[c] = _mm512_ternarylogic_epi32::<0xF8>(w[c], part, m30);
                }
            }
        }
        w
    }
}

/// Block `b`'s 16 row scales and (Q4_1, Q5_1; else zeros) 16 row mins, from a group's
/// scale plane (f16: 32 bytes per block, 64 with mins).
///
/// # Safety
/// AVX-512 F and F16C; `scales` points at a group's scale plane holding block `b`.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn block_scales<const F: u8>(scales: *const u8, b: usize) -> (__m512, __m512) {
    // SAFETY: the plane holds 32 (64 with mins) bytes per block; loads are unaligned.
    unsafe {
        if F == Q4_1 || F == Q5_1 {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(b * 64).cast())),
                _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(b * 64 + 32).cast())),
            )
        } else {
            (
                _mm512_cvtph_ps(_mm256_loadu_si256(scales.add(b * 32).cast())),
                _mm512_setzero_ps(),
            )
        }
    }
}

/// Where block `blk`'s integer sum starts: `-z * (its activation code sum)` from the
/// quantizer's `zsum` (Q4_0, Q5_0, Q8_0), zero for the formats without an offset.
///
/// # Safety
/// AVX-512F; `blk < zsum.len()` when `z != 0`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn zero_start(z: i32, zsum: &[i32], blk: usize) -> __m512i {
    match z {
        0 => _mm512_setzero_si512(),
        // SAFETY: the caller's bound.
        _ => _mm512_set1_epi32(unsafe { *zsum.get_unchecked(blk) }),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quant<const F: u8>(k: &Kernel, acts: &QuantActs, g0: usize, g1: usize, write: Write) {
    let nb = k.cols / 32;
    let z = zero_point(fmt_type(F));
    let zsum = &acts.zsum[zero_sum_index(z)];
    let has_min = matches!(F, Q4_1 | Q5_1);
    let mut acc_buf = [MaybeUninit::<__m512>::uninit(); TCHUNK];
    let pf = Prefetch::new(fmt_type(F), k.cols, k.n_tokens);
    for g in g0..g1 {
        let [codes, high, scales] = k.plane_ptrs(g);
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            let acc = filled(&mut acc_buf[..nt], _mm512_setzero_ps());
            for b in 0..nb {
                pf.block(codes, b);
                // SAFETY: block b < nb lies in this group's planes; the scale
                // plane holds 32 (or 64) bytes per block.
                let w = unsafe { load_codes::<F>(codes, high, b) };
                let (scale, min) = block_scales::<F>(scales, b);
                for (dt, acc) in acc.iter_mut().enumerate() {
                    let blk = (t0 + dt) * nb + b;
                    // SAFETY: blk < n_tokens * nb, within the quantized activations.
                    let a = acts.q.as_ptr().add(blk * 32).cast::<i32>();
                    let bc = |c: usize| _mm512_set1_epi32(a.add(c).read_unaligned());
                    let mut i0 = zero_start(z, zsum, blk);
                    let mut i1 = _mm512_setzero_si512();
                    for c in (0..8).step_by(2) {
                        i0 = _mm512_dpbusd_epi32(i0, w[c], bc(c));
                        i1 = _mm512_dpbusd_epi32(i1, w[c + 1], bc(c + 1));
                    }
                    let isum = _mm512_add_epi32(i0, i1);
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
            for (dt, acc) in acc.iter().enumerate() {
                emit(write, t0 + dt, g, *acc);
            }
        }
    }
}

/// Batch size from which the kernels run two row groups per pass ([`quant_pairs`],
/// [`kquant_pairs`]): from 4 tokens the shared broadcasts pay for loading a second
/// group's codes per block (streaming the LM head, 2 tokens were 8% slower, 4 the
/// same; benchmarks/runs/kernels-worklog.md#item-51).
const PAIR_MIN_TOKENS: usize = 4;

/// [`quant`] over two adjacent row groups per pass (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
/// each activation broadcast, `-z*sum`, activation scale and (Q4_1, Q5_1) scaled
/// activation sum feeds both groups' `vpdpbusd` and folds, halving the broadcast loads per product (what
/// limits the single-group kernel once a block's codes serve several tokens: verify
/// batches, prefill chunks). Per (token, group, block) the same integer sums and the
/// same float fold as [`quant`], so the same bits; an odd last group runs through
/// [`quant`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quant_pairs<const F: u8>(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    write: Write,
) {
    let nb = k.cols / 32;
    let z = zero_point(fmt_type(F));
    let zsum = &acts.zsum[zero_sum_index(z)];
    let has_min = matches!(F, Q4_1 | Q5_1);
    let mut acc_buf = [MaybeUninit::<[__m512; 2]>::uninit(); TCHUNK];
    let pf = Prefetch::new(fmt_type(F), k.cols, k.n_tokens);
    let mut g = g0;
    while g + 2 <= g1 {
        let [ca, ha, sa] = k.plane_ptrs(g);
        let [cb, hb, sb] = k.plane_ptrs(g + 1);
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            let acc = filled(&mut acc_buf[..nt], [_mm512_setzero_ps(); 2]);
            for b in 0..nb {
                pf.block_of_pair(ca, b);
                pf.block_of_pair(cb, b);
                // SAFETY: block b < nb lies in both groups' planes (high bits: Q5 only);
                // the scale planes hold 32 bytes per block.
                let (wa, wb) = unsafe { (load_codes::<F>(ca, ha, b), load_codes::<F>(cb, hb, b)) };
                // SAFETY: as above, for the scale planes.
                let ((scale_a, min_a), (scale_b, min_b)) =
                    unsafe { (block_scales::<F>(sa, b), block_scales::<F>(sb, b)) };
                for (dt, acc) in acc.iter_mut().enumerate() {
                    // Halfway through the tokens (a quarter earlier measured slower,
                    // benchmarks/runs/kernels-worklog.md#item-101).
                    if dt == nt / 2 {
                        pf.next_block_of_pair_l1(ca, b);
                        pf.next_block_of_pair_l1(cb, b);
                    }
                    let blk = (t0 + dt) * nb + b;
                    // SAFETY: blk < n_tokens * nb, within the quantized activations.
                    let a = acts.q.as_ptr().add(blk * 32).cast::<i32>();
                    let zs = zero_start(z, zsum, blk);
                    let (mut a0, mut b0) = (zs, zs);
                    let (mut a1, mut b1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                    for c in (0..8).step_by(2) {
                        let x0 = _mm512_set1_epi32(a.add(c).read_unaligned());
                        let x1 = _mm512_set1_epi32(a.add(c + 1).read_unaligned());
                        a0 = _mm512_dpbusd_epi32(a0, wa[c], x0);
                        b0 = _mm512_dpbusd_epi32(b0, wb[c], x0);
                        a1 = _mm512_dpbusd_epi32(a1, wa[c + 1], x1);
                        b1 = _mm512_dpbusd_epi32(b1, wb[c + 1], x1);
                    }
                    let da = _mm512_set1_ps(*acts.d.get_unchecked(blk));
                    let (ia, ib) = (_mm512_add_epi32(a0, a1), _mm512_add_epi32(b0, b1));
                    acc[0] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(scale_a, da), acc[0]);
                    acc[1] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib), _mm512_mul_ps(scale_b, da), acc[1]);
                    if has_min {
                        let ds = _mm512_set1_ps(*acts.dsum.get_unchecked(blk));
                        acc[0] = _mm512_fmadd_ps(min_a, ds, acc[0]);
                        acc[1] = _mm512_fmadd_ps(min_b, ds, acc[1]);
                    }
                }
            }
            emit_pair(write, t0, g, acc);
        }
        g += 2;
    }
    if g < g1 {
        // SAFETY: the caller's contract, for the last group.
        unsafe { quant::<F>(k, acts, g, g1, write) };
    }
}

/// Q4_K / Q6_K: integer sums over each 256-column super-block (the
/// sub-block scales are applied with `vpmulld` on the per-block dot
/// products, Q4_K's mins with 4 `vpdpwssd`), one float step per super-block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn kquant<const F: u8>(k: &Kernel, acts: &QuantActs, g0: usize, g1: usize, write: Write) {
    let nb = k.cols / 32;
    let mut acc_buf = [MaybeUninit::<__m512>::uninit(); TCHUNK];
    let mut isum_buf = [MaybeUninit::<__m512i>::uninit(); TCHUNK];
    // Initialised once per call: each super-block's first block overwrites them.
    let isum_all = filled(
        &mut isum_buf[..TCHUNK.min(k.n_tokens)],
        _mm512_setzero_si512(),
    );
    let pf = Prefetch::new(fmt_type(F), k.cols, k.n_tokens);
    for g in g0..g1 {
        let [codes, high, scales] = k.plane_ptrs(g);
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            let acc = filled(&mut acc_buf[..nt], _mm512_setzero_ps());
            let isum = &mut isum_all[..nt];
            for sb in 0..nb / 8 {
                // SAFETY (this block): the scale plane holds 320 bytes per
                // super-block (layout docs), the code planes block sb*8+j < nb;
                // activation blocks (t0+dt)*nb + b < n_tokens*nb.
                let s = scales.add(sb * 320);
                for j in 0..8 {
                    let b = sb * 8 + j;
                    pf.block(codes, b);
                    let w = load_codes::<F>(codes, high, b);
                    let (sc_lo, sc_hi) = sub_scales::<F>(s, j);
                    for (dt, isum) in isum.iter_mut().enumerate() {
                        let blk = (t0 + dt) * nb + b;
                        let a = acts.q.as_ptr().add(blk * 32).cast::<i32>();
                        let bc = |c: usize| _mm512_set1_epi32(a.add(c).read_unaligned());
                        let (mut lo, mut hi) = if F == Q6K {
                            let s_all = *acts.sum.get_unchecked(blk);
                            let s_lo = *acts.sum_lo.get_unchecked(blk);
                            (
                                _mm512_set1_epi32(-32 * s_lo),
                                _mm512_set1_epi32(-32 * (s_all - s_lo)),
                            )
                        } else {
                            (_mm512_setzero_si512(), _mm512_setzero_si512())
                        };
                        for c in 0..4 {
                            lo = _mm512_dpbusd_epi32(lo, w[c], bc(c));
                            hi = _mm512_dpbusd_epi32(hi, w[c + 4], bc(c + 4));
                        }
                        let v = if F == Q4K {
                            _mm512_mullo_epi32(_mm512_add_epi32(lo, hi), sc_lo)
                        } else {
                            _mm512_add_epi32(
                                _mm512_mullo_epi32(lo, sc_lo),
                                _mm512_mullo_epi32(hi, sc_hi),
                            )
                        };
                        // The first block starts the super-block's sums.
                        *isum = if j == 0 {
                            v
                        } else {
                            _mm512_add_epi32(*isum, v)
                        };
                    }
                }
                let ss = super_scales::<F>(s);
                for (dt, acc) in acc.iter_mut().enumerate() {
                    let blk0 = (t0 + dt) * nb + sb * 8;
                    *acc = super_step::<F>(&ss, acts, blk0, isum[dt], *acc);
                }
            }
            for (dt, acc) in acc.iter().enumerate() {
                emit(write, t0 + dt, g, *acc);
            }
        }
    }
}

/// A super-block's sub-block scales for block `j` (Q4_K: one vector; Q6_K: the low
/// and high halves' 16-bit pairs sign-extended), as [`kquant`] reads them.
///
/// # Safety
/// AVX-512 F/BW; `s` points at a group's 320 scale bytes of one super-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn sub_scales<const F: u8>(s: *const u8, j: usize) -> (__m512i, __m512i) {
    // SAFETY: Q4K_SC + 16 * j + 16 and Q6K_SUB + 32 * j + 32 are within the 320 bytes.
    unsafe {
        if F == Q4K {
            let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(s.add(Q4K_SC + 16 * j).cast()));
            (sc, sc)
        } else {
            let pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256(s.add(Q6K_SUB + 32 * j).cast()));
            (
                _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair)),
                _mm512_srai_epi32::<16>(pair),
            )
        }
    }
}

/// A super-block's float-step constants for one row group: `d`, `dmin` and (Q4_K) the
/// sub-block mins widened to i16 pairs.
struct SuperScales {
    d: __m512,
    dmin: __m512,
    mq: [__m512i; 4],
}

/// # Safety
/// AVX-512 F/BW; `s` points at a group's 320 scale bytes of one super-block.
#[inline(always)]
unsafe fn super_scales<const F: u8>(s: *const u8) -> SuperScales {
    // SAFETY: d at 0, dmin at 32 and the mins at Q4K_MQ + 32 * pp + 32 lie within the 320 bytes.
    unsafe {
        let mut mq = [_mm512_setzero_si512(); 4];
        if F == Q4K {
            for (pp, mq) in mq.iter_mut().enumerate() {
                *mq = _mm512_cvtepu8_epi16(_mm256_loadu_si256(s.add(Q4K_MQ + 32 * pp).cast()));
            }
        }
        SuperScales {
            d: _mm512_cvtph_ps(_mm256_loadu_si256(s.cast())),
            dmin: _mm512_cvtph_ps(_mm256_loadu_si256(s.add(32).cast())),
            mq,
        }
    }
}

/// One token's float step at the end of a super-block, from its integer sums `isum`:
/// `acc + isum·(d·da)`, then for Q4_K `- mins·(dmin·da)` (the mins' products with the
/// activation sum pairs by `vpdpwssd`, the negation by a sign flip), the canonical order.
///
/// # Safety
/// AVX-512 F/BW/VNNI; `blk0` is the token's first activation block of the super-block.
#[inline(always)]
unsafe fn super_step<const F: u8>(
    ss: &SuperScales,
    acts: &QuantActs,
    blk0: usize,
    isum: __m512i,
    acc: __m512,
) -> __m512 {
    // SAFETY: blk0 + 8 <= n_tokens * nb and blk0 / 2 + 4 <= the sum pairs (caller).
    unsafe {
        let da = _mm512_set1_ps(*acts.d.get_unchecked(blk0));
        let acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(ss.d, da), acc);
        if F != Q4K {
            return acc;
        }
        // blk0 is even (nb is a multiple of 8): pairs blk0/2 .. blk0/2 + 4.
        let pairs = acts.sum_pairs.as_ptr().add(blk0 / 2);
        let mut m = _mm512_setzero_si512();
        for (pp, mq) in ss.mq.iter().enumerate() {
            m = _mm512_dpwssd_epi32(m, *mq, _mm512_set1_epi32(*pairs.add(pp)));
        }
        let sign = _mm512_set1_epi32(i32::MIN);
        let neg = _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(_mm512_mul_ps(ss.dmin, da)),
            sign,
        ));
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), neg, acc)
    }
}

/// [`kquant`] over two adjacent row groups per pass (see [`quant_pairs`]): the
/// activation broadcasts and per-token sums of each block feed both groups; per
/// (token, group) the same integer super-block sums and float steps as [`kquant`], so
/// the same bits; an odd last group runs through [`kquant`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn kquant_pairs<const F: u8>(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    write: Write,
) {
    let nb = k.cols / 32;
    assert!(nb >= 8, "K-quant rows are whole super-blocks");
    let mut acc_buf = [MaybeUninit::<[__m512; 2]>::uninit(); TCHUNK];
    let mut isum_buf = [MaybeUninit::<[__m512i; 2]>::uninit(); TCHUNK];
    // Initialised once per call: each super-block's first block overwrites them.
    let isum_all = filled(
        &mut isum_buf[..TCHUNK.min(k.n_tokens)],
        [_mm512_setzero_si512(); 2],
    );
    let pf = Prefetch::new(fmt_type(F), k.cols, k.n_tokens);
    let mut g = g0;
    while g + 2 <= g1 {
        let [ca, ha, sa] = k.plane_ptrs(g);
        let [cb, hb, sb] = k.plane_ptrs(g + 1);
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            let isum = &mut isum_all[..nt];
            for sup in 0..nb / 8 {
                // SAFETY (this block): as in `kquant`, for each of the two groups.
                let (s_a, s_b) = (sa.add(sup * 320), sb.add(sup * 320));
                for j in 0..8 {
                    let b = sup * 8 + j;
                    pf.block_of_pair(ca, b);
                    pf.block_of_pair(cb, b);
                    let wa = load_codes::<F>(ca, ha, b);
                    let wb = load_codes::<F>(cb, hb, b);
                    let (sc_lo_a, sc_hi_a) = sub_scales::<F>(s_a, j);
                    let (sc_lo_b, sc_hi_b) = sub_scales::<F>(s_b, j);
                    for (dt, isum) in isum.iter_mut().enumerate() {
                        if dt == nt / 2 {
                            pf.next_block_of_pair_l1(ca, b);
                            pf.next_block_of_pair_l1(cb, b);
                        }
                        let blk = (t0 + dt) * nb + b;
                        let a = acts.q.as_ptr().add(blk * 32).cast::<i32>();
                        let (lo0, hi0) = if F == Q6K {
                            let s_all = *acts.sum.get_unchecked(blk);
                            let s_lo = *acts.sum_lo.get_unchecked(blk);
                            (
                                _mm512_set1_epi32(-32 * s_lo),
                                _mm512_set1_epi32(-32 * (s_all - s_lo)),
                            )
                        } else {
                            (_mm512_setzero_si512(), _mm512_setzero_si512())
                        };
                        let (mut lo_a, mut hi_a, mut lo_b, mut hi_b) = (lo0, hi0, lo0, hi0);
                        for c in 0..4 {
                            let xl = _mm512_set1_epi32(a.add(c).read_unaligned());
                            let xh = _mm512_set1_epi32(a.add(c + 4).read_unaligned());
                            lo_a = _mm512_dpbusd_epi32(lo_a, wa[c], xl);
                            lo_b = _mm512_dpbusd_epi32(lo_b, wb[c], xl);
                            hi_a = _mm512_dpbusd_epi32(hi_a, wa[c + 4], xh);
                            hi_b = _mm512_dpbusd_epi32(hi_b, wb[c + 4], xh);
                        }
                        let (va, vb) = if F == Q4K {
                            (
                                _mm512_mullo_epi32(_mm512_add_epi32(lo_a, hi_a), sc_lo_a),
                                _mm512_mullo_epi32(_mm512_add_epi32(lo_b, hi_b), sc_lo_b),
                            )
                        } else {
                            (
                                _mm512_add_epi32(
                                    _mm512_mullo_epi32(lo_a, sc_lo_a),
                                    _mm512_mullo_epi32(hi_a, sc_hi_a),
                                ),
                                _mm512_add_epi32(
                                    _mm512_mullo_epi32(lo_b, sc_lo_b),
                                    _mm512_mullo_epi32(hi_b, sc_hi_b),
                                ),
                            )
                        };
                        // The first block starts the super-block's sums.
                        *isum = if j == 0 {
                            [va, vb]
                        } else {
                            [_mm512_add_epi32(isum[0], va), _mm512_add_epi32(isum[1], vb)]
                        };
                    }
                }
                let ss = [super_scales::<F>(s_a), super_scales::<F>(s_b)];
                for (dt, slot) in acc_buf[..nt].iter_mut().enumerate() {
                    let blk0 = (t0 + dt) * nb + sup * 8;
                    // The first super-block starts from zero: the same operations as
                    // zeroed accumulators, without a memset per pass.
                    let prev = if sup == 0 {
                        [_mm512_setzero_ps(); 2]
                    } else {
                        // SAFETY: super-block 0 wrote this slot.
                        slot.assume_init()
                    };
                    slot.write([
                        super_step::<F>(&ss[0], acts, blk0, isum[dt][0], prev[0]),
                        super_step::<F>(&ss[1], acts, blk0, isum[dt][1], prev[1]),
                    ]);
                }
            }
            // SAFETY: K-quant rows hold at least one super-block (nb >= 8), and the
            // first wrote every slot `..nt`; `MaybeUninit<T>` has the layout of `T`.
            let acc =
                &*(&acc_buf[..nt] as *const [MaybeUninit<[__m512; 2]>] as *const [[__m512; 2]]);
            emit_pair(write, t0, g, acc);
        }
        g += 2;
    }
    if g < g1 {
        // SAFETY: the caller's contract, for the last group.
        unsafe { kquant::<F>(k, acts, g, g1, write) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn float(k: &Kernel, x: &[f32], g0: usize, g1: usize, write: Write) {
    let f32w = k.ty == GgmlType::F32;
    let mut acc_buf = [MaybeUninit::<__m512>::uninit(); TCHUNK];
    for g in g0..g1 {
        let w = k.group(g).as_ptr();
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            let acc = filled(&mut acc_buf[..nt], _mm512_setzero_ps());
            for kk in 0..k.cols {
                // SAFETY: column kk's 16 values lie at kk*64 (f32) or kk*32 (f16)
                // inside the group (cols*64 or cols*32 bytes).
                let wv = if f32w {
                    _mm512_loadu_ps(w.add(kk * 64).cast())
                } else {
                    _mm512_cvtph_ps(_mm256_loadu_si256(w.add(kk * 32).cast()))
                };
                for (dt, acc) in acc.iter_mut().enumerate() {
                    let xv = *x.get_unchecked((t0 + dt) * k.cols + kk);
                    *acc = _mm512_fmadd_ps(wv, _mm512_set1_ps(xv), *acc);
                }
            }
            for (dt, acc) in acc.iter().enumerate() {
                emit(write, t0 + dt, g, *acc);
            }
        }
    }
}
