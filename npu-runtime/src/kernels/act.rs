//! Activation quantization, matching what ggml's CPU backend does to the
//! activations of each weight format (so our integer dot products see the same
//! int8 codes and scales as llama.cpp's):
//!
//! * [`ActFormat::Q8_0`] (for Q4_0/Q5_0/Q8_0 weights): blocks of 32,
//!   `q = round_half_even(x · (127/amax))`, scale `d = fp16(amax/127)`.
//! * [`ActFormat::Q8_1`] (for Q4_1/Q5_1): as Q8_0, plus `dsum = fp16(d₃₂ · Σq)`
//!   where `d₃₂ = amax/127` is the f32 scale before its fp16 rounding.
//! * [`ActFormat::Q8K`] (for Q4_K/Q6_K): one `amax` per 256 values,
//!   `q = round_half_even(x · (127/amax))`, f32 scale `d = 1/(127/amax)`,
//!   `dsum = d · Σq` per 32-block. (ggml stores the code of the signed maximum as −127
//!   with a negative `d`; negating both is exact, so the products are the same.)
//!
//! Every format is stored per block of 32 (a Q8K super-block repeats its scale in
//! its 8 blocks), so the matmul kernels read all three the same way. Each token's row
//! is quantized independently of every other token, so a token's quantized
//! activations do not depend on the batch it arrives in. Codes are clamped to ±127
//! (0 when `amax == 0`). Also stored per block: the code sum and the sum of its first
//! 16 codes (for the formats' zero points). Non-finite inputs give unspecified (but
//! never unsafe) codes.

use super::ggml::GgmlType;
use super::pool::ThreadPool;
use super::simd::Isa;
use half::f16;

/// How activations are quantized for one weight format (see the module docs).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActFormat {
    Q8_0,
    Q8_1,
    Q8K,
}

impl ActFormat {
    /// Number of formats (for per-format storage).
    pub const COUNT: usize = 3;

    /// Dense index `< COUNT`.
    pub fn index(self) -> usize {
        match self {
            ActFormat::Q8_0 => 0,
            ActFormat::Q8_1 => 1,
            ActFormat::Q8K => 2,
        }
    }

    /// The format ggml's CPU backend pairs with weights of type `ty` (its
    /// `vec_dot_type`); float weights are not quantized, any value is returned.
    pub fn for_weights(ty: GgmlType) -> ActFormat {
        match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 => ActFormat::Q8_1,
            GgmlType::Q4K | GgmlType::Q6K => ActFormat::Q8K,
            _ => ActFormat::Q8_0,
        }
    }

    /// Blocks of 32 sharing one `amax`.
    fn blocks_per_scale(self) -> usize {
        match self {
            ActFormat::Q8K => 8,
            _ => 1,
        }
    }

    /// `(multiplier, d)` for a group with absolute maximum `amax`.
    fn scales(self, amax: f32) -> (f32, f32) {
        if amax == 0.0 {
            return (0.0, 0.0);
        }
        let id = 127.0 / amax;
        let d = match self {
            ActFormat::Q8K => 1.0 / id,
            _ => f16::from_f32(amax / 127.0).to_f32(),
        };
        (id, d)
    }

    /// `dsum` of a block with code sum `sum`, group absolute maximum `amax` and scale `d`.
    fn dsum(self, amax: f32, d: f32, sum: i32) -> f32 {
        match self {
            ActFormat::Q8K => d * sum as f32,
            _ => f16::from_f32((amax / 127.0) * sum as f32).to_f32(),
        }
    }
}

/// Quantized activations of up to `max_tokens` rows of up to `max_cols` columns.
pub(crate) struct QuantActs {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
    pub sum_lo: Vec<i32>,
    pub dsum: Vec<f32>,
    /// [`ActFormat::Q8K`] only: entry `i` = `pack_i16x2(sum[2i], sum[2i + 1])`, the two
    /// block sums a Q4_K min pair multiplies (one `vpdpwssd` / `vpmaddwd` operand), made
    /// once per token here instead of once per token and row group in the kernels.
    pub sum_pairs: Vec<i32>,
    /// [`ActFormat::Q8_0`] only: `zsum[zero_sum_index(z)][blk] = -z * sum[blk]` for the
    /// unsigned code offsets `z` of Q4_0, Q5_0 and Q8_0 (8, 16, 128), the start of each
    /// block's integer sum in the AVX-512 kernels: a broadcast load there instead of a
    /// multiply, a move to a vector register and a broadcast per token and block
    /// (benchmarks/runs/kernels-worklog.md#item-97).
    pub zsum: [Vec<i32>; 3],
}

/// Index into [`QuantActs::zsum`] of zero point `z` (8, 16 or 128).
#[inline(always)]
pub(crate) fn zero_sum_index(z: i32) -> usize {
    match z {
        8 => 0,
        16 => 1,
        _ => 2,
    }
}

/// The zero points [`QuantActs::zsum`] holds, by index.
const ZERO_POINTS: [i32; 3] = [8, 16, 128];

impl QuantActs {
    pub fn new(max_tokens: usize, max_cols: usize) -> Self {
        let nb = max_tokens * max_cols.div_ceil(32);
        QuantActs {
            q: vec![0; nb * 32],
            d: vec![0.0; nb],
            sum: vec![0; nb],
            sum_lo: vec![0; nb],
            dsum: vec![0.0; nb],
            sum_pairs: vec![0; nb.div_ceil(2)],
            zsum: std::array::from_fn(|_| vec![0; nb]),
        }
    }
}

/// Two block code sums as one i32 holding two i16 (`lo` in the low half; |sum| <= 32 * 127
/// fits).
#[inline(always)]
pub(crate) fn pack_i16x2(lo: i32, hi: i32) -> i32 {
    ((lo as u32 & 0xFFFF) | ((hi as u32) << 16)) as i32
}

/// Round to nearest, ties to even, for |v| < 2^22 (exact; matches the
/// hardware conversion under the default rounding mode, and ggml's `nearest_int`
/// and `_mm256_round_ps(_MM_ROUND_NEAREST)`).
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    (v + MAGIC) - MAGIC
}

/// Quantize `x` (`n_tokens` rows of `cols`, `cols` a multiple of 32, of 256 for
/// [`ActFormat::Q8K`]) into `a`, using flat block index `t * cols / 32 + b`, with
/// the best kernel for `isa`.
pub(crate) fn quantize(isa: Isa, fmt: ActFormat, x: &[f32], a: &mut QuantActs) {
    let n_groups = x.len() / (32 * fmt.blocks_per_scale());
    let out = ActsPtr::new(a);
    // SAFETY: the ISA is supported (checked by the caller, `matmul_with_isa`)
    // and the groups' blocks fit in `a` (the scratch was sized for this call).
    unsafe { quantize_groups(isa, fmt, x, out, 0, n_groups) }
}

/// Quantize `x` splitting scale groups across the pool (each task owns a range).
pub(crate) fn quantize_parallel(
    isa: Isa,
    fmt: ActFormat,
    x: &[f32],
    a: &mut QuantActs,
    pool: &ThreadPool,
) {
    let nblocks = x.len() / 32;
    let n_groups = nblocks / fmt.blocks_per_scale();
    let n_tasks = if nblocks < 512 {
        1
    } else {
        pool.n_threads().min(nblocks / 256)
    };
    if n_tasks <= 1 {
        return quantize(isa, fmt, x, a);
    }
    let out = ActsPtr::new(a);
    pool.parallel_for(n_tasks, &|t| {
        let (g0, g1) = (t * n_groups / n_tasks, (t + 1) * n_groups / n_tasks);
        // SAFETY: as in `quantize`; tasks cover disjoint group ranges, so no
        // two threads write the same element.
        unsafe { quantize_groups(isa, fmt, x, out, g0, g1) }
    });
}

/// Raw pointers into a `QuantActs` so pool tasks can fill disjoint blocks.
#[derive(Clone, Copy)]
pub(crate) struct ActsPtr {
    q: *mut i8,
    d: *mut f32,
    sum: *mut i32,
    sum_lo: *mut i32,
    dsum: *mut f32,
    sum_pairs: *mut i32,
    zsum: [*mut i32; 3],
    len: usize,
}
// SAFETY: only used by tasks writing disjoint blocks while the `QuantActs` is
// exclusively borrowed by the caller that created the pointers.
unsafe impl Send for ActsPtr {}
// SAFETY: as above.
unsafe impl Sync for ActsPtr {}

impl ActsPtr {
    fn new(a: &mut QuantActs) -> Self {
        ActsPtr {
            q: a.q.as_mut_ptr(),
            d: a.d.as_mut_ptr(),
            sum: a.sum.as_mut_ptr(),
            sum_lo: a.sum_lo.as_mut_ptr(),
            dsum: a.dsum.as_mut_ptr(),
            sum_pairs: a.sum_pairs.as_mut_ptr(),
            zsum: [0, 1, 2].map(|i| a.zsum[i].as_mut_ptr()),
            len: a.d.len(),
        }
    }

    /// # Safety
    /// `blk < self.len` and no other thread accesses block `blk` meanwhile.
    unsafe fn store(self, fmt: ActFormat, blk: usize, amax: f32, d: f32, sum: i32, sum_lo: i32) {
        // SAFETY: forwarded from the caller.
        unsafe {
            *self.d.add(blk) = d;
            *self.sum.add(blk) = sum;
            *self.sum_lo.add(blk) = sum_lo;
            *self.dsum.add(blk) = fmt.dsum(amax, d, sum);
            // A Q8K group (8 blocks, one task's) stores its blocks in order, so the even
            // block of an odd one's pair is already written.
            if fmt == ActFormat::Q8K && blk % 2 == 1 {
                *self.sum_pairs.add(blk / 2) = pack_i16x2(*self.sum.add(blk - 1), sum);
            }
            if fmt == ActFormat::Q8_0 {
                for (zs, z) in self.zsum.iter().zip(ZERO_POINTS) {
                    *zs.add(blk) = -z * sum;
                }
            }
        }
    }
}

/// # Safety
/// `isa` must be supported; the blocks of groups `g0..g1` must lie within
/// `out.len` and `x`; no other thread may access them meanwhile.
unsafe fn quantize_groups(isa: Isa, fmt: ActFormat, x: &[f32], out: ActsPtr, g0: usize, g1: usize) {
    let bps = fmt.blocks_per_scale();
    assert!(g1 * bps <= out.len && x.len() >= 32 * bps * g1);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni {
        // SAFETY: forwarded from the caller.
        return unsafe { quantize_avx512(fmt, x, out, g0, g1) };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::AvxVnni) {
        // SAFETY: forwarded from the caller (both tiers imply AVX2 and F16C).
        return unsafe { quantize_avx2(fmt, x, out, g0, g1) };
    }
    let _ = isa;
    for grp in g0..g1 {
        let xs = &x[grp * bps * 32..(grp + 1) * bps * 32];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (id, d) = fmt.scales(amax);
        for blk in grp * bps..(grp + 1) * bps {
            // SAFETY: blk < out.len (asserted), and the block is ours alone.
            let q = unsafe { std::slice::from_raw_parts_mut(out.q.add(blk * 32), 32) };
            let (mut sum, mut sum_lo) = (0i32, 0i32);
            for (k, (q, v)) in q.iter_mut().zip(&x[blk * 32..blk * 32 + 32]).enumerate() {
                let c = (round_even(v * id) as i32).clamp(-127, 127);
                *q = c as i8;
                sum += c;
                if k < 16 {
                    sum_lo += c;
                }
            }
            // SAFETY: as above.
            unsafe { out.store(fmt, blk, amax, d, sum, sum_lo) };
        }
    }
}

/// The same rule with AVX-512, 16 blocks per pass (one group of 16 Q8_0 / Q8_1 blocks or
/// two Q8K groups) so the per-block scalars are made 16 lanes at a time: `vcvtps2dq`
/// rounds to nearest even (default MXCSR), the division `127 / amax`, the half-float
/// rounding of the scales (`vcvtps2ph`, nearest even) and the integer sums are the
/// scalar loop's operations, so codes and scales match it bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quantize_avx512(fmt: ActFormat, x: &[f32], out: ActsPtr, g0: usize, g1: usize) {
    let bps = fmt.blocks_per_scale();
    let (b0, b1) = (g0 * bps, g1 * bps);
    let mut b = b0;
    while b < b1 {
        let n = (b1 - b).min(16);
        // SAFETY: the caller guarantees x holds 32 floats per block below b1 and that
        // those blocks of `out` are in bounds and exclusively ours; a Q8K pass starts on
        // a group boundary (b0 and 16 are multiples of 8).
        unsafe { quantize_pass_avx512(fmt, x.as_ptr().add(b * 32), n, out, b) };
        b += n;
    }
}

/// Quantizes the `n <= 16` blocks at `x` as blocks `blk0..blk0 + n` of `out`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI present; `x` holds `32 n` floats; blocks `blk0..blk0 + n` are in
/// bounds of `out` and exclusively the caller's; for Q8K, `blk0` and `n` are multiples
/// of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quantize_pass_avx512(fmt: ActFormat, x: *const f32, n: usize, out: ActsPtr, blk0: usize) {
    use std::arch::x86_64::*;
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let valid: __mmask16 = ((1u32 << n) - 1) as __mmask16;
    // SAFETY (whole body): loads read only the n blocks of `x`; stores go to blocks
    // blk0..blk0 + n of `out` only (masked or sized by n); the caller's contract.
    unsafe {
        let load = |j: usize, h: usize| {
            if j < n {
                _mm512_loadu_ps(x.add(j * 32 + h))
            } else {
                _mm512_setzero_ps()
            }
        };
        let absmax =
            |j: usize| _mm512_max_ps(_mm512_abs_ps(load(j, 0)), _mm512_abs_ps(load(j, 16)));
        // Per-lane (block) multiplier `id` and scale `d`, and for the legacy formats the
        // f32 `amax / 127` their `dsum` uses.
        let amax = if fmt == ActFormat::Q8K {
            // Lanes 0-7: the first group's maximum, lanes 8-15: the second's.
            let group = |g: usize| {
                let mut m = _mm512_setzero_ps();
                for j in 8 * g..8 * g + 8 {
                    m = _mm512_max_ps(m, absmax(j));
                }
                m
            };
            let (a, b) = (group(0), group(1));
            let r = _mm512_max_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xEE>(a, b),
            );
            let r = _mm512_max_ps(r, _mm512_shuffle_f32x4::<0xB1>(r, r));
            let r = _mm512_max_ps(r, _mm512_shuffle_ps::<0x4E>(r, r));
            _mm512_max_ps(r, _mm512_shuffle_ps::<0xB1>(r, r))
        } else {
            hmax16(std::array::from_fn(absmax))
        };
        // Per lane (block) `ActFormat::scales`: the multiplier `id`, the scale `d` and, for
        // the legacy formats, the f32 `amax / 127` their `dsum` uses.
        let nz = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(amax, _mm512_setzero_ps());
        let id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(127.0), amax);
        let d32 = _mm512_maskz_div_ps(nz, amax, _mm512_set1_ps(127.0));
        let d = if fmt == ActFormat::Q8K {
            _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0), id)
        } else {
            _mm512_cvtph_ps(_mm512_cvtps_ph::<NEAREST>(d32))
        };
        let mut ids = [0f32; 16];
        _mm512_storeu_ps(ids.as_mut_ptr(), id);
        // Codes, two blocks per 64 bytes; `w[p]` lane l = the sum of codes 4l..4l + 3.
        let lo = _mm512_set1_epi32(-127);
        let ones = _mm512_set1_epi8(1);
        // After two saturating packs, 4-byte group 4L + m holds codes 4L.. of vector m.
        let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        let mut w = [_mm512_setzero_si512(); 8];
        for (p, wp) in w.iter_mut().enumerate().take(n.div_ceil(2)) {
            let q: [__m512i; 4] = std::array::from_fn(|k| {
                let j = 2 * p + k / 2;
                let v = _mm512_mul_ps(load(j, 16 * (k % 2)), _mm512_set1_ps(ids[j.min(15)]));
                _mm512_max_epi32(_mm512_cvtps_epi32(v), lo)
            });
            let packed = _mm512_packs_epi16(
                _mm512_packs_epi32(q[0], q[1]),
                _mm512_packs_epi32(q[2], q[3]),
            );
            let z = _mm512_permutexvar_epi32(order, packed);
            let dst = out.q.add((blk0 + 2 * p) * 32);
            if 2 * p + 1 < n {
                _mm512_storeu_si512(dst.cast(), z);
            } else {
                _mm256_storeu_si256(dst.cast(), _mm512_castsi512_si256(z));
            }
            *wp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, z);
        }
        let (sum_lo, sum) = block_sums(&w);
        let at = blk0;
        _mm512_mask_storeu_epi32(out.sum.add(at).cast(), valid, sum);
        if fmt == ActFormat::Q8_0 {
            for (zs, z) in out.zsum.iter().zip(ZERO_POINTS) {
                let v = _mm512_mullo_epi32(sum, _mm512_set1_epi32(-z));
                _mm512_mask_storeu_epi32(zs.add(at).cast(), valid, v);
            }
        }
        _mm512_mask_storeu_epi32(out.sum_lo.add(at).cast(), valid, sum_lo);
        _mm512_mask_storeu_ps(out.d.add(at).cast(), valid, d);
        let sumf = _mm512_cvtepi32_ps(sum);
        let dsum = if fmt == ActFormat::Q8K {
            _mm512_mul_ps(d, sumf)
        } else {
            _mm512_cvtph_ps(_mm512_cvtps_ph::<NEAREST>(_mm512_mul_ps(d32, sumf)))
        };
        _mm512_mask_storeu_ps(out.dsum.add(at).cast(), valid, dsum);
        if fmt == ActFormat::Q8K {
            // Pair i = (sum[2i] low, sum[2i + 1] high) as i16: the sums' 16-bit truncations
            // in order.
            let pairs = _mm256_castsi256_ps(_mm512_cvtepi32_epi16(sum));
            let m8: __mmask8 = ((1u32 << (n / 2)) - 1) as __mmask8;
            _mm256_mask_storeu_ps(out.sum_pairs.add(at / 2).cast(), m8, pairs);
        }
    }
}

/// Lane j = the maximum over the lanes of `m[j]`: a transposing reduction (15 max steps
/// for 16 vectors instead of 4 per vector).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn hmax16(m: [std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // 16 -> 8: 128-bit chunks 0-1 of r[k] hold m[2k]'s 8 partials, chunks 2-3 m[2k + 1]'s.
    let r: [__m512; 8] = std::array::from_fn(|k| {
        let (a, b) = (m[2 * k], m[2 * k + 1]);
        _mm512_max_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    });
    // 8 -> 4: chunk c of s[k] holds m[4k + c]'s 4 partials.
    let s: [__m512; 4] = std::array::from_fn(|k| {
        let (a, b) = (r[2 * k], r[2 * k + 1]);
        _mm512_max_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // 4 -> 2: in chunk c of u[k], lanes 0-1 hold m[8k + c]'s 2 partials, lanes 2-3 m[8k + 4 + c]'s.
    let u: [__m512; 2] = std::array::from_fn(|k| {
        let (a, b) = (s[2 * k], s[2 * k + 1]);
        _mm512_max_ps(
            _mm512_shuffle_ps::<0x44>(a, b),
            _mm512_shuffle_ps::<0xEE>(a, b),
        )
    });
    // 2 -> 1: lane 4c + e holds m[4e + c]; transpose to lane j = m[j].
    let v = _mm512_max_ps(
        _mm512_shuffle_ps::<0x88>(u[0], u[1]),
        _mm512_shuffle_ps::<0xDD>(u[0], u[1]),
    );
    let to_blocks = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(to_blocks, v)
}

/// From `w[p]` (lane l = the sum of codes 4l..4l + 3 of blocks 2p, 2p + 1), per block j
/// the sum of its first 16 codes (lane j of the first vector) and of all 32 (the second).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn block_sums(
    w: &[std::arch::x86_64::__m512i; 8],
) -> (std::arch::x86_64::__m512i, std::arch::x86_64::__m512i) {
    use std::arch::x86_64::*;
    // Quad sums: chunk c of w[p] is half c % 2 of block 2p + c / 2.
    let pair_add = |a: __m512i, b: __m512i| {
        let (a, b) = (_mm512_castsi512_ps(a), _mm512_castsi512_ps(b));
        _mm512_add_epi32(
            _mm512_castps_si512(_mm512_shuffle_ps::<0x88>(a, b)),
            _mm512_castps_si512(_mm512_shuffle_ps::<0xDD>(a, b)),
        )
    };
    // a[k] chunk c: pair sums of w[2k] then w[2k + 1], chunk c each.
    let a: [__m512i; 4] = std::array::from_fn(|k| pair_add(w[2 * k], w[2 * k + 1]));
    // b[k] lane 4c + e = the whole chunk c of w[4k + e]: half c % 2 of block 8k + 2e + c / 2.
    let b: [__m512i; 2] = std::array::from_fn(|k| pair_add(a[2 * k], a[2 * k + 1]));
    // Block j < 8 (b[0]; j >= 8 the same in b[1], index + 16): e = (j % 8) / 2,
    // c = 2 (j % 2) + half.
    let lo_idx = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27);
    let hi_idx = _mm512_setr_epi32(4, 12, 5, 13, 6, 14, 7, 15, 20, 28, 21, 29, 22, 30, 23, 31);
    let lo = _mm512_permutex2var_epi32(b[0], lo_idx, b[1]);
    let hi = _mm512_permutex2var_epi32(b[0], hi_idx, b[1]);
    (lo, _mm512_add_epi32(lo, hi))
}

/// [`quantize_avx512`] on 256 bits, 8 blocks per pass (one group of 8 Q8_0 / Q8_1 blocks,
/// or one Q8K group): the same conversions (`vcvtps2dq`, nearest even), division and
/// half-float roundings (F16C `vcvtps2ph`), 8 lanes at a time; codes narrowed by saturating
/// packs (no value is outside [-127, 127] by then) and put back in order by one lane
/// permute.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn quantize_avx2(fmt: ActFormat, x: &[f32], out: ActsPtr, g0: usize, g1: usize) {
    let bps = fmt.blocks_per_scale();
    let (b0, b1) = (g0 * bps, g1 * bps);
    let mut b = b0;
    while b < b1 {
        let n = (b1 - b).min(8);
        // SAFETY: the caller guarantees x holds 32 floats per block below b1 and that
        // those blocks of `out` are in bounds and exclusively ours; a Q8K pass is one
        // whole group (b0 and 8 are multiples of 8).
        unsafe { quantize_pass_avx2(fmt, x.as_ptr().add(b * 32), n, out, b) };
        b += n;
    }
}

/// Quantizes the `n <= 8` blocks at `x` as blocks `blk0..blk0 + n` of `out`.
///
/// # Safety
/// AVX2 and F16C present; `x` holds `32 n` floats; blocks `blk0..blk0 + n` are in bounds
/// of `out` and exclusively the caller's; for Q8K, `n` is 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn quantize_pass_avx2(fmt: ActFormat, x: *const f32, n: usize, out: ActsPtr, blk0: usize) {
    use std::arch::x86_64::*;
    const NEAREST: i32 = _MM_FROUND_TO_NEAREST_INT;
    // SAFETY (whole body): loads read only the n blocks of `x`; stores go to blocks
    // blk0..blk0 + n of `out` only (masked or sized by n); the caller's contract.
    unsafe {
        let load = |j: usize, h: usize| {
            if j < n {
                _mm256_loadu_ps(x.add(j * 32 + h))
            } else {
                _mm256_setzero_ps()
            }
        };
        let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let absmax = |j: usize| {
            let m01 = _mm256_max_ps(
                _mm256_and_ps(load(j, 0), absmask),
                _mm256_and_ps(load(j, 8), absmask),
            );
            let m23 = _mm256_max_ps(
                _mm256_and_ps(load(j, 16), absmask),
                _mm256_and_ps(load(j, 24), absmask),
            );
            _mm256_max_ps(m01, m23)
        };
        let amax = if fmt == ActFormat::Q8K {
            // One group: its maximum in every lane.
            let mut m = absmax(0);
            for j in 1..8 {
                m = _mm256_max_ps(m, absmax(j));
            }
            let m = _mm256_max_ps(m, _mm256_permute2f128_ps::<0x01>(m, m));
            let m = _mm256_max_ps(m, _mm256_shuffle_ps::<0x4E>(m, m));
            _mm256_max_ps(m, _mm256_shuffle_ps::<0xB1>(m, m))
        } else {
            hmax8(std::array::from_fn(absmax))
        };
        // Per lane (block) `ActFormat::scales`, as in `quantize_pass_avx512`.
        let zero = _mm256_setzero_ps();
        let nz = _mm256_cmp_ps::<_CMP_NEQ_OQ>(amax, zero);
        let id = _mm256_and_ps(nz, _mm256_div_ps(_mm256_set1_ps(127.0), amax));
        let d32 = _mm256_and_ps(nz, _mm256_div_ps(amax, _mm256_set1_ps(127.0)));
        let d = if fmt == ActFormat::Q8K {
            _mm256_and_ps(nz, _mm256_div_ps(_mm256_set1_ps(1.0), id))
        } else {
            _mm256_cvtph_ps(_mm256_cvtps_ph::<NEAREST>(d32))
        };
        let mut ids = [0f32; 8];
        _mm256_storeu_ps(ids.as_mut_ptr(), id);
        let lo = _mm256_set1_epi32(-127);
        // After packs_epi32 then packs_epi16 the 32-bit groups are ordered 0 4 1 5 2 6 3 7.
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
        // w[j] lane l = the sum of codes 4l..4l + 3 of block j.
        let mut w = [_mm256_setzero_si256(); 8];
        for (j, wj) in w.iter_mut().enumerate().take(n) {
            let vid = _mm256_set1_ps(ids[j]);
            let q: [__m256i; 4] = std::array::from_fn(|k| {
                _mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(load(j, 8 * k), vid)), lo)
            });
            let w16 = (
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let codes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w16.0, w16.1), order);
            _mm256_storeu_si256(out.q.add((blk0 + j) * 32).cast(), codes);
            *wj = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, codes), ones16);
        }
        let (sum_lo, sum) = block_sums8(&w);
        let valid = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        _mm256_maskstore_epi32(out.sum.add(blk0), valid, sum);
        if fmt == ActFormat::Q8_0 {
            for (zs, z) in out.zsum.iter().zip(ZERO_POINTS) {
                let v = _mm256_mullo_epi32(sum, _mm256_set1_epi32(-z));
                _mm256_maskstore_epi32(zs.add(blk0), valid, v);
            }
        }
        _mm256_maskstore_epi32(out.sum_lo.add(blk0), valid, sum_lo);
        _mm256_maskstore_ps(out.d.add(blk0), valid, d);
        let sumf = _mm256_cvtepi32_ps(sum);
        let dsum = if fmt == ActFormat::Q8K {
            _mm256_mul_ps(d, sumf)
        } else {
            _mm256_cvtph_ps(_mm256_cvtps_ph::<NEAREST>(_mm256_mul_ps(d32, sumf)))
        };
        _mm256_maskstore_ps(out.dsum.add(blk0), valid, dsum);
        if fmt == ActFormat::Q8K {
            let mut s = [0i32; 8];
            _mm256_storeu_si256(s.as_mut_ptr().cast(), sum);
            for i in 0..4 {
                *out.sum_pairs.add(blk0 / 2 + i) = pack_i16x2(s[2 * i], s[2 * i + 1]);
            }
        }
    }
}

/// Lane j = the maximum over the lanes of `m[j]` (7 transposing max steps).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hmax8(m: [std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // 8 -> 4: 128-bit half 0 of r[k] holds m[2k]'s 4 partials, half 1 m[2k + 1]'s.
    let r: [__m256; 4] = std::array::from_fn(|k| {
        let (a, b) = (m[2 * k], m[2 * k + 1]);
        _mm256_max_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    });
    // 4 -> 2: in half c of s[k], lanes 0-1 hold m[4k + c]'s 2 partials, lanes 2-3 m[4k + 2 + c]'s.
    let s: [__m256; 2] = std::array::from_fn(|k| {
        let (a, b) = (r[2 * k], r[2 * k + 1]);
        _mm256_max_ps(
            _mm256_shuffle_ps::<0x44>(a, b),
            _mm256_shuffle_ps::<0xEE>(a, b),
        )
    });
    // 2 -> 1: lane 4c + e holds m[2e + c]; reorder to lane j = m[j].
    let v = _mm256_max_ps(
        _mm256_shuffle_ps::<0x88>(s[0], s[1]),
        _mm256_shuffle_ps::<0xDD>(s[0], s[1]),
    );
    _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// From `w[j]` (lane l = the sum of codes 4l..4l + 3 of block j), per block j the sum of
/// its first 16 codes (lane j of the first vector) and of all 32 (the second).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn block_sums8(
    w: &[std::arch::x86_64::__m256i; 8],
) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
    use std::arch::x86_64::*;
    let pair_add = |a: __m256i, b: __m256i| {
        let (a, b) = (_mm256_castsi256_ps(a), _mm256_castsi256_ps(b));
        _mm256_add_epi32(
            _mm256_castps_si256(_mm256_shuffle_ps::<0x88>(a, b)),
            _mm256_castps_si256(_mm256_shuffle_ps::<0xDD>(a, b)),
        )
    };
    let a: [__m256i; 4] = std::array::from_fn(|k| pair_add(w[2 * k], w[2 * k + 1]));
    // b[k] lane 4c + e = half c of block 4k + e (c = 0: its first 16 codes).
    let b: [__m256i; 2] = std::array::from_fn(|k| pair_add(a[2 * k], a[2 * k + 1]));
    let lo = _mm256_permute2x128_si256::<0x20>(b[0], b[1]);
    let hi = _mm256_permute2x128_si256::<0x31>(b[0], b[1]);
    (lo, _mm256_add_epi32(lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMATS: [ActFormat; 3] = [ActFormat::Q8_0, ActFormat::Q8_1, ActFormat::Q8K];

    /// Rows of 512 with blocks of very different magnitudes, a row of exact
    /// ties (`x · 127/amax` = k + 0.5) and a zero row.
    fn sample() -> Vec<f32> {
        let mut x: Vec<f32> = (0..512 * 6)
            .map(|i| ((i * 7919 % 2003) as f32 - 1000.0) * if i % 64 < 32 { 0.001 } else { 0.37 })
            .collect();
        x.extend((0..512).map(|i| {
            if i % 32 == 0 {
                127.0
            } else {
                (i % 32) as f32 - 15.5
            }
        }));
        x.extend([0.0; 512]);
        x
    }

    #[test]
    fn every_isa_quantizes_identically() {
        let x = sample();
        let pool = ThreadPool::new(2);
        for fmt in FORMATS {
            let mut want = QuantActs::new(8, 512);
            quantize(Isa::Portable, fmt, &x, &mut want);
            for isa in Isa::available() {
                let mut got = QuantActs::new(8, 512);
                quantize_parallel(isa, fmt, &x, &mut got, &pool);
                assert_eq!(got.q, want.q, "{isa:?} {fmt:?}");
                assert_eq!(got.sum, want.sum, "{isa:?} {fmt:?}");
                assert_eq!(got.sum_lo, want.sum_lo, "{isa:?} {fmt:?}");
                if fmt == ActFormat::Q8_0 {
                    // the zero-point terms the x86 kernels start their integer sums from
                    let n = x.len() / 32;
                    for (zs, z) in got.zsum.iter().zip(ZERO_POINTS) {
                        assert_eq!(
                            zero_sum_index(z),
                            ZERO_POINTS.iter().position(|&p| p == z).unwrap()
                        );
                        let want_zs: Vec<i32> = want.sum[..n].iter().map(|&s| -z * s).collect();
                        assert_eq!(zs[..n], want_zs, "{isa:?} z={z}");
                    }
                }
                if fmt == ActFormat::Q8K {
                    // every pair of block sums, read back as the two i16 the kernels see
                    let n = x.len() / 32;
                    for (i, &p) in got.sum_pairs[..n / 2].iter().enumerate() {
                        let (lo, hi) = (p as i16 as i32, p >> 16);
                        assert_eq!(
                            (lo, hi),
                            (want.sum[2 * i], want.sum[2 * i + 1]),
                            "{isa:?} {i}"
                        );
                    }
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.d), bits(&want.d), "{isa:?} {fmt:?}");
                assert_eq!(bits(&got.dsum), bits(&want.dsum), "{isa:?} {fmt:?}");
            }
        }
    }

    /// Every block count the passes of 16 blocks can end on (Q8_0 / Q8_1: 1 to 40 blocks;
    /// Q8K: 1 to 5 groups of 8), each ISA against the scalar loop, scalars bit for bit.
    #[test]
    fn every_isa_quantizes_every_length_identically() {
        let x = sample();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for fmt in FORMATS {
            let step = 32 * fmt.blocks_per_scale();
            for len in (step..=1280).step_by(step) {
                // Start inside the sample's mixed-magnitude rows, not at its beginning.
                let xs = &x[512 + 96..][..len];
                let mut want = QuantActs::new(1, len);
                quantize(Isa::Portable, fmt, xs, &mut want);
                let nb = len / 32;
                for isa in Isa::available() {
                    let mut got = QuantActs::new(1, len + 512);
                    // Poison: a pass must not write past its blocks.
                    got.q.fill(99);
                    got.sum.fill(-5);
                    got.d.fill(7.0);
                    quantize(isa, fmt, xs, &mut got);
                    let what = format!("{isa:?} {fmt:?} {nb} blocks");
                    assert_eq!(got.q[..len], want.q[..len], "{what}");
                    assert!(
                        got.q[len..].iter().all(|&c| c == 99),
                        "{what}: codes past the end"
                    );
                    assert!(
                        got.sum[nb..].iter().all(|&c| c == -5),
                        "{what}: sums past the end"
                    );
                    assert!(
                        got.d[nb..].iter().all(|&c| c == 7.0),
                        "{what}: scales past the end"
                    );
                    assert_eq!(got.sum[..nb], want.sum[..nb], "{what}");
                    assert_eq!(got.sum_lo[..nb], want.sum_lo[..nb], "{what}");
                    assert_eq!(bits(&got.d[..nb]), bits(&want.d[..nb]), "{what}");
                    assert_eq!(bits(&got.dsum[..nb]), bits(&want.dsum[..nb]), "{what}");
                    if fmt == ActFormat::Q8K {
                        assert_eq!(got.sum_pairs[..nb / 2], want.sum_pairs[..nb / 2], "{what}");
                    }
                    if fmt == ActFormat::Q8_0 {
                        for (g, w) in got.zsum.iter().zip(&want.zsum) {
                            assert_eq!(g[..nb], w[..nb], "{what}");
                        }
                    }
                }
            }
        }
    }

    /// ggml's rules written out independently (ggml-quants.c `quantize_row_q8_K_ref`
    /// with the signed maximum, `nearest_int`'s bit trick; the x86 `quantize_row_q8_0/1`
    /// with `127/amax` and fp16 scales): our codes, scales and sums must equal them
    /// (Q8K's up to the exact negation of codes and scale).
    #[test]
    fn matches_ggml_rules() {
        fn nearest_int(v: f32) -> i32 {
            let bits = (v + 12_582_912.0).to_bits() as i32;
            (bits & 0x007f_ffff) - 0x0040_0000
        }
        let x = sample();
        for fmt in FORMATS {
            let mut a = QuantActs::new(8, 512);
            quantize(Isa::Portable, fmt, &x, &mut a);
            let group = if fmt == ActFormat::Q8K { 256 } else { 32 };
            for (gi, xs) in x.chunks_exact(group).enumerate() {
                let (mut max, mut amax) = (0f32, 0f32);
                for &v in xs {
                    if v.abs() > amax {
                        (amax, max) = (v.abs(), v);
                    }
                }
                for (j, xb) in xs.chunks_exact(32).enumerate() {
                    let blk = gi * group / 32 + j;
                    let got = &a.q[blk * 32..blk * 32 + 32];
                    let (codes, d): (Vec<i32>, f32) = if fmt == ActFormat::Q8K {
                        if amax == 0.0 {
                            (vec![0; 32], 0.0)
                        } else {
                            // ggml's scale is negative when the maximum is positive.
                            let iscale = -127.0 / max;
                            let c = xb.iter().map(|&v| nearest_int(iscale * v).min(127));
                            let s = iscale.signum() as i32;
                            (c.map(|c| c * s).collect(), (1.0 / iscale) * s as f32)
                        }
                    } else {
                        let bmax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let id = if bmax != 0.0 { 127.0 / bmax } else { 0.0 };
                        let c = xb.iter().map(|&v| (v * id).round_ties_even() as i32);
                        (c.collect(), f16::from_f32(bmax / 127.0).to_f32())
                    };
                    let got_codes: Vec<i32> = got.iter().map(|&c| c as i32).collect();
                    assert_eq!(got_codes, codes, "{fmt:?} block {blk}");
                    assert_eq!(a.d[blk].to_bits(), d.to_bits(), "{fmt:?} block {blk}");
                    let sum: i32 = codes.iter().sum();
                    assert_eq!(a.sum[blk], sum);
                    assert_eq!(a.sum_lo[blk], codes[..16].iter().sum::<i32>());
                    if fmt == ActFormat::Q8_1 {
                        let bmax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let s = f16::from_f32(bmax / 127.0 * sum as f32).to_f32();
                        assert_eq!(a.dsum[blk].to_bits(), s.to_bits(), "block {blk}");
                    }
                }
            }
        }
    }

    #[test]
    fn ties_round_to_even() {
        // Block max 127 makes the multiplier exactly 1, so x = k + 0.5 is a tie.
        let mut x = vec![0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        x[3] = 0.5;
        let mut a = QuantActs::new(1, 32);
        quantize(Isa::Portable, ActFormat::Q8_0, &x, &mut a);
        assert_eq!(&a.q[..4], &[127, 2, -4, 0]);
    }

    #[test]
    fn round_even_matches_std() {
        for i in -3000..3000 {
            let v = i as f32 * 0.05;
            assert_eq!(round_even(v), v.round_ties_even(), "{v}");
        }
        assert_eq!(round_even(2.5), 2.0);
        assert_eq!(round_even(-3.5), -4.0);
    }

    #[test]
    fn quantization_error_is_within_half_step() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.3 * (1 + i / 64) as f32)
            .collect();
        for fmt in FORMATS {
            let mut a = QuantActs::new(1, 512);
            quantize(Isa::Portable, fmt, &x, &mut a);
            for b in 0..16 {
                // The fp16 scale is off by at most 2^-11 relative; codes reach 127.
                let d = a.d[b];
                for k in 0..32 {
                    let err = (a.q[b * 32 + k] as f32 * d - x[b * 32 + k]).abs();
                    assert!(err <= d * 0.5 + d * 127.0 / 2048.0 + 1e-6, "{fmt:?}");
                }
                if fmt == ActFormat::Q8K {
                    assert_eq!(a.d[b].to_bits(), a.d[b / 8 * 8].to_bits());
                }
            }
        }
        let zero = vec![0f32; 256];
        let mut a = QuantActs::new(1, 256);
        for fmt in FORMATS {
            quantize(Isa::Portable, fmt, &zero, &mut a);
            assert!(a.d.iter().all(|&d| d == 0.0) && a.q.iter().all(|&q| q == 0));
        }
    }
}
