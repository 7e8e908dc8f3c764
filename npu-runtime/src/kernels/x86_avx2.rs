//! AVX2 kernels: the AVX-512 scheme on 256-bit vectors. Each 64-byte layout
//! vector is processed as two halves (rows 0..8 and 8..16), each half fully
//! independently. `vpmaddubsw` + `vpmaddwd` replace `vpdpbusd`; for Q8_0 the
//! sign trick keeps `vpmaddubsw` from saturating; for the K-quants the
//! `vpmaddwd` multiplies by the sub-block scale instead of 1, for free.
//! Integer sums are exact, so results equal the portable kernel's bit for bit.

use std::arch::x86_64::*;

use super::act::{pack_i16x2, QuantActs};
use super::ggml::QUANT_TYPES;
use super::layout::{block_plane_bytes, zero_point, Planes, GROUP, Q4K_MQ, Q4K_SC, Q6K_SUB};
use super::matmul::kernel_io::{Kernel, OutOp, Output};
use super::portable::{filled, TCHUNK};
use super::GgmlType;
use std::mem::MaybeUninit;

const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const Q4K: u8 = 5;
const Q6K: u8 = 6;

/// Distance of the software prefetch, in bytes of the weight stream. With the
/// per-plane prefetch 8 KB beat 4 KB at N=1 (1.5B -20%, 0.5B -10..-20% one
/// thread; 12 KB no better; N=8/16 unchanged;
/// benchmarks/runs/kernels-worklog.md#item-27).
const PREFETCH_AHEAD: usize = 8192;

/// Software prefetch shared by the AVX2 and AVX-512 kernels. A group's three
/// planes (codes, high bits, scales) are read at three different rates, so
/// each plane is prefetched on its own, the same number of blocks ahead
/// (`PREFETCH_AHEAD` bytes of the whole stream); past the group's last block
/// it continues in the next group (groups are contiguous). One linear
/// pointer over the group, as before, left the scale and high-bit planes
/// without prefetch: their loads were the hot spots of the N=1 K-quant kernel
/// (benchmarks/runs/kernels-worklog.md#item-26). Hardware prefetch alone falls behind when a batch
/// makes each block's compute long. Into L2 (T1), or for decode into L1 (T0) on the CPUs
/// [`far_prefetch_into_l1`] names ([`L1_PREFETCH_MAX_TOKENS`]). Prefetches never fault, so any address is fine.
#[derive(Clone, Copy)]
pub(crate) struct Prefetch {
    /// The hint: T0 when set, else T1.
    l1: bool,
    nb: usize,
    lead: usize,
    group_bytes: usize,
    codes: usize,
    high_at: usize,
    high: usize,
    scales_at: usize,
    scales: usize,
}

impl Prefetch {
    /// Kernels pass their format as a constant (`fmt_type(F)`, not the matrix's runtime
    /// type): inlined, the plane sizes are then known and each block's line loops unroll
    /// into straight prefetches (benchmarks/runs/kernels-worklog.md#item-68).
    #[inline(always)]
    pub fn new(ty: GgmlType, cols: usize, n_tokens: usize) -> Prefetch {
        let p = Planes::new(ty, cols);
        let (codes, high, scales) = block_plane_bytes(ty);
        Prefetch {
            l1: n_tokens <= L1_PREFETCH_MAX_TOKENS && far_prefetch_into_l1(),
            nb: cols / 32,
            // At least a super-block, so a K-quant's scales are in before its first block.
            lead: (PREFETCH_AHEAD / (codes + high + scales)).max(8),
            group_bytes: p.group_bytes(),
            codes,
            high_at: p.codes,
            high,
            scales_at: p.codes + p.high,
            scales,
        }
    }

    /// The byte offsets (from the current group's start) of the lines block
    /// `b + lead` reads: one per 64 bytes of its codes and high bits, one in
    /// its scales (<= 64 bytes per block; consecutive blocks touch every line).
    /// Past the group's last block, the group that follows starts `wrap` bytes on
    /// (`group_bytes`; two-group passes: the group two ahead).
    #[inline(always)]
    fn lines(&self, b: usize, wrap: usize, line: impl FnMut(usize)) {
        self.lines_of(b + self.lead, wrap, line)
    }

    /// [`Self::lines`] of block `pb` counted from the current group's first block (past
    /// its last block, on in the groups `wrap` bytes on).
    #[inline(always)]
    fn lines_of(&self, mut pb: usize, wrap: usize, mut line: impl FnMut(usize)) {
        let mut base = 0;
        while pb >= self.nb {
            pb -= self.nb;
            base += wrap;
        }
        let codes = base + pb * self.codes;
        for off in (0..self.codes).step_by(64) {
            line(codes + off);
        }
        let high = base + self.high_at + pb * self.high;
        for off in (0..self.high).step_by(64) {
            line(high + off);
        }
        line(base + self.scales_at + pb * self.scales);
    }

    /// Prefetch what block `b + lead` of the group starting at `group` reads.
    #[inline(always)]
    pub fn block(&self, group: *const u8, b: usize) {
        self.fetch(group, b, self.group_bytes)
    }

    /// [`Self::block`] for a pass over two adjacent groups: past its last block a
    /// group's stream continues into the group two ahead (the next pass's), so the
    /// pair's two streams fetch the next pair and not the pass's own second group.
    #[inline(always)]
    pub fn block_of_pair(&self, group: *const u8, b: usize) {
        self.fetch(group, b, 2 * self.group_bytes)
    }

    /// Prefetch into L1 what block `b + 1` of a two-group pass reads, for a pass whose
    /// block runs many tokens: issued halfway through block `b`'s tokens, it has the
    /// next block's codes in L1 when its decode starts, instead of every block opening
    /// with a dozen L1 misses to L2 that the out-of-order window, full of the tokens'
    /// work, does not reach early (benchmarks/runs/kernels-worklog.md#item-101).
    #[inline(always)]
    pub fn next_block_of_pair_l1(&self, group: *const u8, b: usize) {
        self.next_block_of_pair_lines(b, |off| {
            // SAFETY: a prefetch is a hint that cannot fault, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(group.wrapping_add(off).cast()) }
        });
    }

    /// The lines [`Self::next_block_of_pair_l1`] fetches, as offsets from the group.
    #[inline(always)]
    fn next_block_of_pair_lines(&self, b: usize, line: impl FnMut(usize)) {
        self.lines_of(b + 1, 2 * self.group_bytes, line)
    }

    #[inline(always)]
    fn fetch(&self, group: *const u8, b: usize, wrap: usize) {
        let l1 = self.l1;
        self.lines(b, wrap, |off| {
            let p = group.wrapping_add(off).cast();
            // SAFETY: a prefetch is a hint that cannot fault, whatever the address.
            unsafe {
                if l1 {
                    _mm_prefetch::<_MM_HINT_T0>(p)
                } else {
                    _mm_prefetch::<_MM_HINT_T1>(p)
                }
            }
        });
    }
}

/// Kernel calls of up to this many tokens (decode; the pair passes start at 4) prefetch
/// into L1 where [`far_prefetch_into_l1`] says so. Larger calls keep L2: their L1 holds many
/// tokens' activations, which lines 8 KB ahead would evict (into L1 the 0.5B's prefill was
/// 2-7% slower on the Zen 5 host).
const L1_PREFETCH_MAX_TOKENS: usize = 3;

/// Whether decode's far prefetch goes into L1 (T0) instead of L2 (T1) on this CPU: AMD
/// from Zen 5 on. On a Zen 5 host T0 decoded 9-13% faster on one thread and 4-7% on two
/// when the memory bus had room
/// (benchmarks/runs/2026-11-30-prefill-limits.md); on Zen 4 T1 was ~25% faster
/// (benchmarks/runs/kernels-worklog.md#item-11), on an Intel Xeon the same (item 90).
pub(crate) fn far_prefetch_into_l1() -> bool {
    static L1: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *L1.get_or_init(|| {
        let (vendor, leaf1_eax) = cpu_id();
        l1_prefetch_for(&vendor, leaf1_eax)
    })
}

/// CPUID's vendor string and leaf-1 `eax`.
fn cpu_id() -> (Vec<u8>, u32) {
    // SAFETY: every x86-64 CPU has CPUID, and leaves 0 and 1 always exist. (Newer Rust
    // declares `__cpuid` safe; the block keeps the crate's 1.89 minimum building.)
    #[allow(unused_unsafe)]
    let (id, leaf1) = unsafe { (__cpuid(0), __cpuid(1)) };
    let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat();
    (vendor, leaf1.eax)
}

/// [`far_prefetch_into_l1`]'s rule for a CPUID vendor string and leaf-1 `eax` (the family
/// is the base family plus the extended family when the base is 0xF).
fn l1_prefetch_for(vendor: &[u8], leaf1_eax: u32) -> bool {
    let base = (leaf1_eax >> 8) & 0xF;
    let family = if base == 0xF {
        base + ((leaf1_eax >> 20) & 0xFF)
    } else {
        base
    };
    vendor == b"AuthenticAMD" && family >= 0x1A
}

type Write<'a> = &'a Output;

/// Compute groups `g0..g1` for all tokens, writing them through `write`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C (`Isa::Avx2.is_supported()`);
/// `acts` must hold the quantized activations of `k.n_tokens` tokens of
/// `k.cols` columns and `x` the f32 ones; `write` is valid for those tokens and
/// groups `g0..g1`, used by nobody else meanwhile (`Output::put`).
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
            GgmlType::Q4K => kquant::<Q4K>(k, acts, g0, g1, write),
            GgmlType::Q6K => kquant::<Q6K>(k, acts, g0, g1, write),
            GgmlType::F32 | GgmlType::F16 => float(k, x, g0, g1, write),
            _ => unreachable!("{} is not a kernel type", k.ty),
        }
    }
}

/// [`run`] with AVX-VNNI: `vpdpbusd` on 256 bits instead of `vpmaddubsw` + `vpmaddwd`
/// (+ `vpaddd`); the same exact integer sums, so the same bits.
///
/// # Safety
/// As [`run`], and the CPU must support AVX-VNNI (`Isa::AvxVnni.is_supported()`).
pub(crate) unsafe fn run_vnni(
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
            GgmlType::Q4_0 => quant_vnni::<Q4_0>(k, acts, g0, g1, write),
            GgmlType::Q4_1 => quant_vnni::<Q4_1>(k, acts, g0, g1, write),
            GgmlType::Q5_0 => quant_vnni::<Q5_0>(k, acts, g0, g1, write),
            GgmlType::Q5_1 => quant_vnni::<Q5_1>(k, acts, g0, g1, write),
            GgmlType::Q8_0 => quant_vnni::<Q8_0>(k, acts, g0, g1, write),
            GgmlType::Q4K => kquant_vnni::<Q4K>(k, acts, g0, g1, write),
            GgmlType::Q6K => kquant_vnni::<Q6K>(k, acts, g0, g1, write),
            GgmlType::F32 | GgmlType::F16 => float(k, x, g0, g1, write),
            _ => unreachable!("{} is not a kernel type", k.ty),
        }
    }
}

#[inline(always)]
fn fmt_type(f: u8) -> GgmlType {
    QUANT_TYPES[f as usize]
}

/// Applies the output `o` to token `t`'s group `g`, straight from the two
/// accumulator halves `v` (rows 0..8, 8..16): two 32-byte stores with the
/// epilogue's `vaddps` or the argmax's compare and blends. A partial last group
/// goes through the array path `Output::put` (same IEEE operations).
///
/// # Safety
/// AVX2; `t`, `g` as `Output::at`, and the contract of `run`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn emit(o: &Output, t: usize, g: usize, v: [__m256; 2]) {
    // SAFETY: `at` and the next `GROUP` floats of a full group are this task's; a
    // bias holds `rows` floats.
    unsafe {
        if !o.full(g) {
            return emit_partial(o, t, g, v);
        }
        let p = o.at(t, g);
        for (h, v) in v.into_iter().enumerate() {
            let p = p.add(8 * h);
            match o.op {
                OutOp::Store => _mm256_storeu_ps(p, v),
                OutOp::Bias(b) => {
                    let bias = _mm256_loadu_ps(b.add(g * GROUP + 8 * h));
                    _mm256_storeu_ps(p, _mm256_add_ps(v, bias));
                }
                OutOp::Accumulate => _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), v)),
                OutOp::Argmax(gi) => {
                    // `kernel_io::lane_best`: `_CMP_GT_OQ` is false for NaN, like `>`.
                    let best = _mm256_loadu_ps(p);
                    let m = _mm256_cmp_ps::<_CMP_GT_OQ>(v, best);
                    _mm256_storeu_ps(p, _mm256_blendv_ps(best, v, m));
                    let gp = gi.add(t * GROUP + 8 * h).cast::<f32>();
                    let gv = _mm256_castsi256_ps(_mm256_set1_epi32(g as i32));
                    _mm256_storeu_ps(gp, _mm256_blendv_ps(_mm256_loadu_ps(gp), gv, m));
                }
            }
        }
    }
}

/// [`emit`] of a partial last group, via an array (cold: at most once per token
/// and matrix).
///
/// # Safety
/// As [`emit`].
#[cold]
#[inline(never)]
#[target_feature(enable = "avx2")]
unsafe fn emit_partial(o: &Output, t: usize, g: usize, v: [__m256; 2]) {
    let mut a = [0f32; GROUP];
    // SAFETY: two 8-float stores into a 16-float array; `put`'s contract is `emit`'s.
    unsafe {
        _mm256_storeu_ps(a.as_mut_ptr(), v[0]);
        _mm256_storeu_ps(a.as_mut_ptr().add(8), v[1]);
        o.put(t, g, &a);
    }
}

/// 32 bytes, byte j = 0xFF if bit j of `m` is set, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bits_to_bytes(m: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(m as i32),
        _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// Σ over 4 consecutive bytes of u8 `w` times i8 `a`, into 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn dot4(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quant<const F: u8>(k: &Kernel, acts: &QuantActs, g0: usize, g1: usize, write: Write) {
    // SAFETY: forwarded from `run`.
    unsafe { quant_body::<F, false>(k, acts, g0, g1, write) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn quant_vnni<const F: u8>(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    write: Write,
) {
    // SAFETY: forwarded from `run_vnni`.
    unsafe { quant_body::<F, true>(k, acts, g0, g1, write) }
}

/// The legacy-format kernel, inlined into a wrapper per feature set (`VNNI`: AVX-VNNI
/// `vpdpbusd` on the stored unsigned codes; else `vpmaddubsw` + `vpmaddwd`).
#[inline(always)]
unsafe fn quant_body<const F: u8, const VNNI: bool>(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    write: Write,
) {
    let nb = k.cols / 32;
    // Without VNNI, Q8_0 codes are made signed again for the sign trick, so no zero point.
    let z = if F == Q8_0 && !VNNI {
        0
    } else {
        zero_point(fmt_type(F))
    };
    let has_min = matches!(F, Q4_1 | Q5_1);
    let mut acc_buf = [MaybeUninit::<[__m256; 2]>::uninit(); TCHUNK];
    let nib = _mm256_set1_epi8(0x0F);
    let m10 = _mm256_set1_epi8(0x10);
    let flip = _mm256_set1_epi8(-128);
    let pf = Prefetch::new(fmt_type(F), k.cols, k.n_tokens);
    for g in g0..g1 {
        let [codes, high, scales] = k.plane_ptrs(g);
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            let acc = filled(&mut acc_buf[..nt], [_mm256_setzero_ps(); 2]);
            for b in 0..nb {
                pf.block(codes, b);
                for h in 0..2 {
                    // SAFETY: offsets stay inside this group's planes as in the
                    // AVX-512 kernel; `h * 32` selects rows 8h..8h+8 of a vector.
                    let mut w = [_mm256_setzero_si256(); 8];
                    if F == Q8_0 {
                        for (c, w) in w.iter_mut().enumerate() {
                            *w = _mm256_loadu_si256(codes.add(b * 512 + c * 64 + h * 32).cast());
                        }
                    } else {
                        for j in 0..4 {
                            let v = _mm256_loadu_si256(codes.add(b * 256 + j * 64 + h * 32).cast());
                            w[j] = _mm256_and_si256(v, nib);
                            w[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
                        }
                    }
                    if F == Q5_0 || F == Q5_1 {
                        for (c, w) in w.iter_mut().enumerate() {
                            let m = high
                                .add(b * 64 + c * 8 + h * 4)
                                .cast::<u32>()
                                .read_unaligned();
                            *w = _mm256_or_si256(*w, _mm256_and_si256(bits_to_bytes(m), m10));
                        }
                    }
                    let (mut wabs, mut wsgn) =
                        ([_mm256_setzero_si256(); 8], [_mm256_setzero_si256(); 8]);
                    if F == Q8_0 && !VNNI {
                        for c in 0..8 {
                            wsgn[c] = _mm256_xor_si256(w[c], flip);
                            wabs[c] = _mm256_abs_epi8(wsgn[c]);
                        }
                    }
                    let f16x8 = |off: usize| {
                        _mm256_cvtph_ps(_mm_loadu_si128(scales.add(off + h * 16).cast()))
                    };
                    let (scale, min) = if F == Q4_1 || F == Q5_1 {
                        (f16x8(b * 64), f16x8(b * 64 + 32))
                    } else {
                        (f16x8(b * 32), _mm256_setzero_ps())
                    };
                    for (dt, acc) in acc.iter_mut().enumerate() {
                        let blk = (t0 + dt) * nb + b;
                        // SAFETY: blk < n_tokens * nb, within the quantized activations.
                        let a = acts.q.as_ptr().add(blk * 32).cast::<i32>();
                        let s = *acts.sum.get_unchecked(blk);
                        let bc = |c: usize| _mm256_set1_epi32(a.add(c).read_unaligned());
                        let prod = |c: usize| {
                            if F == Q8_0 {
                                dot4(wabs[c], _mm256_sign_epi8(bc(c), wsgn[c]))
                            } else {
                                dot4(w[c], bc(c))
                            }
                        };
                        let mut i0 = _mm256_set1_epi32(-z * s);
                        let mut i1 = _mm256_setzero_si256();
                        for c in (0..8).step_by(2) {
                            if VNNI {
                                i0 = _mm256_dpbusd_avx_epi32(i0, w[c], bc(c));
                                i1 = _mm256_dpbusd_avx_epi32(i1, w[c + 1], bc(c + 1));
                            } else {
                                i0 = _mm256_add_epi32(i0, prod(c));
                                i1 = _mm256_add_epi32(i1, prod(c + 1));
                            }
                        }
                        let isum = _mm256_add_epi32(i0, i1);
                        let da = _mm256_set1_ps(*acts.d.get_unchecked(blk));
                        let mut v = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isum),
                            _mm256_mul_ps(scale, da),
                            acc[h],
                        );
                        if has_min {
                            v = _mm256_fmadd_ps(
                                min,
                                _mm256_set1_ps(*acts.dsum.get_unchecked(blk)),
                                v,
                            );
                        }
                        acc[h] = v;
                    }
                }
            }
            for (dt, acc) in acc.iter().enumerate() {
                emit(write, t0 + dt, g, *acc);
            }
        }
    }
}

/// The 8 code vectors of half `h` (rows 8h..8h+8) of a Q4_K / Q6_K block.
///
/// # Safety
/// AVX2; `codes`/`high` point at a group's planes holding block `b`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_kcodes<const F: u8>(
    codes: *const u8,
    high: *const u8,
    b: usize,
    h: usize,
) -> [__m256i; 8] {
    // SAFETY: offsets stay inside the group's planes (256 code bytes and, for
    // Q6_K, 128 high-bit bytes per block); `h * 32` selects a vector half.
    unsafe {
        let nib = _mm256_set1_epi8(0x0F);
        let mut w = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let v = _mm256_loadu_si256(codes.add(b * 256 + j * 64 + h * 32).cast());
            w[j] = _mm256_and_si256(v, nib);
            w[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
        }
        if F == Q6K {
            let m30 = _mm256_set1_epi8(0x30);
            for q in 0..2 {
                let hv = _mm256_loadu_si256(high.add(b * 128 + q * 64 + h * 32).cast());
                let parts = [
                    _mm256_slli_epi16::<4>(hv),
                    _mm256_slli_epi16::<2>(hv),
                    hv,
                    _mm256_srli_epi16::<2>(hv),
                ];
                for (kk, part) in parts.into_iter().enumerate() {
                    let c = 4 * q + kk;
                    w[c] = _mm256_or_si256(w[c], _mm256_and_si256(part, m30));
                }
            }
        }
        w
    }
}

/// Q4_K / Q6_K: integer sums over each 256-column super-block; `vpmaddwd`
/// applies the sub-block scale (an i16 pair per lane) instead of 1, and the
/// Q4_K mins / Q6_K zero points are one `vpmaddwd` per block pair / block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant<const F: u8>(k: &Kernel, acts: &QuantActs, g0: usize, g1: usize, write: Write) {
    // SAFETY: forwarded from `run`.
    unsafe { kquant_body::<F, false>(k, acts, g0, g1, write) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn kquant_vnni<const F: u8>(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    write: Write,
) {
    // SAFETY: forwarded from `run_vnni`.
    unsafe { kquant_body::<F, true>(k, acts, g0, g1, write) }
}

/// The K-quant kernel, inlined into a wrapper per feature set (`VNNI`: half-block
/// `vpdpbusd` sums times the sub-block scales by `vpmulld`, as on AVX-512).
#[inline(always)]
unsafe fn kquant_body<const F: u8, const VNNI: bool>(
    k: &Kernel,
    acts: &QuantActs,
    g0: usize,
    g1: usize,
    write: Write,
) {
    let nb = k.cols / 32;
    let mut acc_buf = [MaybeUninit::<[__m256; 2]>::uninit(); TCHUNK];
    let mut isum_buf = [MaybeUninit::<[__m256i; 2]>::uninit(); TCHUNK];
    let sign = _mm256_set1_epi32(i32::MIN);
    // Per 32-bit lane (i16 lo, i16 hi) -> (lo, lo) / (hi, hi).
    // (`vpshufb` indexes bytes within each 128-bit half.)
    let dup_lo = _mm256_setr_epi8(
        0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12,
        13, 12, 13,
    );
    let dup_hi = _mm256_add_epi8(dup_lo, _mm256_set1_epi8(2));
    // Initialised once per call: each super-block's first block overwrites them.
    let isum_all = filled(
        &mut isum_buf[..TCHUNK.min(k.n_tokens)],
        [_mm256_setzero_si256(); 2],
    );
    let pf = Prefetch::new(fmt_type(F), k.cols, k.n_tokens);
    for g in g0..g1 {
        let [codes, high, scales] = k.plane_ptrs(g);
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            let acc = filled(&mut acc_buf[..nt], [_mm256_setzero_ps(); 2]);
            let isum = &mut isum_all[..nt];
            for sb in 0..nb / 8 {
                // SAFETY (this block): the scale plane holds 320 bytes per
                // super-block (layout docs); block sb*8+j < nb; activation
                // blocks (t0+dt)*nb + b < n_tokens*nb.
                let s = scales.add(sb * 320);
                for j in 0..8 {
                    let b = sb * 8 + j;
                    pf.block(codes, b);
                    for h in 0..2 {
                        let w = load_kcodes::<F>(codes, high, b, h);
                        // Scales as an i16 pair per lane: Q4_K (sc, sc); Q6_K
                        // (lo, hi) for the zero point, and duplicated halves.
                        // (VNNI: the same scales as i32, `s32_lo` / `s32_hi`.)
                        let (pair, sc_lo, sc_hi, s32_lo, s32_hi) = if F == Q4K {
                            let sc32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                s.add(Q4K_SC + 16 * j + 8 * h).cast(),
                            ));
                            let sc = _mm256_or_si256(sc32, _mm256_slli_epi32::<16>(sc32));
                            (sc, sc, sc, sc32, sc32)
                        } else {
                            let pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(
                                s.add(Q6K_SUB + 32 * j + 16 * h).cast(),
                            ));
                            (
                                pair,
                                _mm256_shuffle_epi8(pair, dup_lo),
                                _mm256_shuffle_epi8(pair, dup_hi),
                                _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(pair)),
                                _mm256_srai_epi32::<16>(pair),
                            )
                        };
                        for (dt, isum) in isum.iter_mut().enumerate() {
                            let blk = (t0 + dt) * nb + b;
                            let a = acts.q.as_ptr().add(blk * 32).cast::<i32>();
                            let bc = |c: usize| _mm256_set1_epi32(a.add(c).read_unaligned());
                            let mut v = if VNNI {
                                let (mut lo, mut hi) =
                                    (_mm256_setzero_si256(), _mm256_setzero_si256());
                                for c in 0..4 {
                                    lo = _mm256_dpbusd_avx_epi32(lo, w[c], bc(c));
                                    hi = _mm256_dpbusd_avx_epi32(hi, w[c + 4], bc(c + 4));
                                }
                                if F == Q4K {
                                    _mm256_mullo_epi32(_mm256_add_epi32(lo, hi), s32_lo)
                                } else {
                                    _mm256_add_epi32(
                                        _mm256_mullo_epi32(lo, s32_lo),
                                        _mm256_mullo_epi32(hi, s32_hi),
                                    )
                                }
                            } else {
                                let prod = |c: usize, sc: __m256i| {
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(w[c], bc(c)), sc)
                                };
                                let mut lo = prod(0, sc_lo);
                                let mut hi = prod(4, sc_hi);
                                for c in 1..4 {
                                    lo = _mm256_add_epi32(lo, prod(c, sc_lo));
                                    hi = _mm256_add_epi32(hi, prod(c + 4, sc_hi));
                                }
                                _mm256_add_epi32(lo, hi)
                            };
                            if F == Q6K {
                                let s_all = *acts.sum.get_unchecked(blk);
                                let s_lo = *acts.sum_lo.get_unchecked(blk);
                                let zs = _mm256_set1_epi32(pack_i16x2(s_lo, s_all - s_lo));
                                let corr = _mm256_madd_epi16(pair, zs);
                                v = _mm256_sub_epi32(v, _mm256_slli_epi32::<5>(corr));
                            }
                            // The first block starts the super-block's sums.
                            isum[h] = if j == 0 {
                                v
                            } else {
                                _mm256_add_epi32(isum[h], v)
                            };
                        }
                    }
                }
                for h in 0..2 {
                    let f16x8 =
                        |off: usize| _mm256_cvtph_ps(_mm_loadu_si128(s.add(off + h * 16).cast()));
                    let (d, dmin) = (f16x8(0), f16x8(32));
                    let mut mq = [_mm256_setzero_si256(); 4];
                    if F == Q4K {
                        for (pp, mq) in mq.iter_mut().enumerate() {
                            *mq = _mm256_cvtepu8_epi16(_mm_loadu_si128(
                                s.add(Q4K_MQ + 32 * pp + 16 * h).cast(),
                            ));
                        }
                    }
                    for (dt, acc) in acc.iter_mut().enumerate() {
                        let blk0 = (t0 + dt) * nb + sb * 8;
                        let da = _mm256_set1_ps(*acts.d.get_unchecked(blk0));
                        let v = _mm256_cvtepi32_ps(isum[dt][h]);
                        acc[h] = _mm256_fmadd_ps(v, _mm256_mul_ps(d, da), acc[h]);
                        if F == Q4K {
                            // blk0 is even (nb is a multiple of 8): pairs blk0/2 .. blk0/2 + 4.
                            let pairs = acts.sum_pairs.as_ptr().add(blk0 / 2);
                            let mut m = _mm256_setzero_si256();
                            for (pp, mq) in mq.iter().enumerate() {
                                m = _mm256_add_epi32(
                                    m,
                                    _mm256_madd_epi16(*mq, _mm256_set1_epi32(*pairs.add(pp))),
                                );
                            }
                            let neg = _mm256_castsi256_ps(_mm256_xor_si256(
                                _mm256_castps_si256(_mm256_mul_ps(dmin, da)),
                                sign,
                            ));
                            acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), neg, acc[h]);
                        }
                    }
                }
            }
            for (dt, acc) in acc.iter().enumerate() {
                emit(write, t0 + dt, g, *acc);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float(k: &Kernel, x: &[f32], g0: usize, g1: usize, write: Write) {
    let f32w = k.ty == GgmlType::F32;
    let mut acc_buf = [MaybeUninit::<[__m256; 2]>::uninit(); TCHUNK];
    for g in g0..g1 {
        let w = k.group(g).as_ptr();
        for t0 in (0..k.n_tokens).step_by(TCHUNK) {
            let nt = TCHUNK.min(k.n_tokens - t0);
            let acc = filled(&mut acc_buf[..nt], [_mm256_setzero_ps(); 2]);
            for kk in 0..k.cols {
                // SAFETY: column kk's 16 values lie at kk*64 (f32) or kk*32 (f16)
                // inside the group (cols*64 or cols*32 bytes).
                let (w0, w1) = if f32w {
                    (
                        _mm256_loadu_ps(w.add(kk * 64).cast()),
                        _mm256_loadu_ps(w.add(kk * 64 + 32).cast()),
                    )
                } else {
                    (
                        _mm256_cvtph_ps(_mm_loadu_si128(w.add(kk * 32).cast())),
                        _mm256_cvtph_ps(_mm_loadu_si128(w.add(kk * 32 + 16).cast())),
                    )
                };
                for (dt, acc) in acc.iter_mut().enumerate() {
                    let xv = _mm256_set1_ps(*x.get_unchecked((t0 + dt) * k.cols + kk));
                    acc[0] = _mm256_fmadd_ps(w0, xv, acc[0]);
                    acc[1] = _mm256_fmadd_ps(w1, xv, acc[1]);
                }
            }
            for (dt, acc) in acc.iter().enumerate() {
                emit(write, t0 + dt, g, *acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::ggml::QUANT_TYPES;
    use std::collections::HashMap;

    #[test]
    fn far_prefetch_goes_into_l1_on_amd_from_zen_5_only() {
        // Leaf-1 eax: stepping 0-3, model 4-7, base family 8-11, extended family 20-27.
        let eax = |base: u32, ext: u32| (ext << 20) | (base << 8);
        assert!(l1_prefetch_for(b"AuthenticAMD", eax(0xF, 0x0B))); // Zen 5: 0x1A
        assert!(l1_prefetch_for(b"AuthenticAMD", eax(0xF, 0x0C)));
        assert!(!l1_prefetch_for(b"AuthenticAMD", eax(0xF, 0x0A))); // Zen 3/4: 0x19
        assert!(!l1_prefetch_for(b"GenuineIntel", eax(0x6, 0))); // family 6
        assert!(!l1_prefetch_for(b"GenuineIntel", eax(0xF, 0x0B)));
        // The extended family counts only when the base family is 0xF.
        assert!(!l1_prefetch_for(b"AuthenticAMD", eax(0x6, 0xFF)));
        // This machine: whatever it is, the rule gives the cached answer.
        let (vendor, leaf1_eax) = cpu_id();
        assert_eq!(far_prefetch_into_l1(), l1_prefetch_for(&vendor, leaf1_eax));
        // Only decode-sized calls take it; from the pair passes' 4 tokens on, L2.
        for n in 1..=L1_PREFETCH_MAX_TOKENS {
            assert_eq!(
                Prefetch::new(GgmlType::Q4K, 1536, n).l1,
                far_prefetch_into_l1()
            );
        }
        assert!(!Prefetch::new(GgmlType::Q4K, 1536, 4).l1);
        assert!(!Prefetch::new(GgmlType::Q8_0, 896, 128).l1);
        if std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains("AuthenticAMD")) {
            assert_eq!(vendor, b"AuthenticAMD");
        }
    }

    /// Every 64-byte line a kernel reads for block `b` of group `g` (offsets from
    /// group 0); a K-quant super-block's whole scale entry counts at its first block.
    fn lines_read(ty: GgmlType, cols: usize, g: usize, b: usize) -> Vec<usize> {
        let p = Planes::new(ty, cols);
        let (c, h, s) = block_plane_bytes(ty);
        let base = g * p.group_bytes();
        let mut ranges = vec![(base + b * c, c), (base + p.codes + b * h, h)];
        let scales = base + p.codes + p.high;
        if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) {
            if matches!(b % 8, 0) {
                ranges.push((scales + (b / 8) * 320, 320));
            }
        } else {
            ranges.push((scales + b * s, s));
        }
        let mut out = Vec::new();
        for (at, len) in ranges {
            out.extend((at / 64..(at + len).div_ceil(64)).map(|l| l * 64));
        }
        out
    }

    /// The L1 prefetch of a two-group pass (`next_block_of_pair_l1`, called for both
    /// groups during block b) covers every code and high-bit line block b + 1 of the same
    /// group reads, and past the last block those of block 0 of the group two on (the next
    /// pass's); for the legacy formats also the block's scales.
    #[test]
    fn next_block_l1_prefetch_covers_what_the_next_block_reads() {
        for &ty in QUANT_TYPES.iter() {
            for cols in [256, 896, 1536, 4864, 8960] {
                if cols % ty.block_size() != 0 {
                    continue;
                }
                let pf = Prefetch::new(ty, cols, 1);
                let nb = cols / 32;
                let planes = Planes::new(ty, cols);
                let gb = planes.group_bytes();
                let kquant = matches!(ty, GgmlType::Q4K | GgmlType::Q6K);
                for g in 0..4 {
                    for b in 0..nb {
                        let mut got = Vec::new();
                        pf.next_block_of_pair_lines(b, |off| got.push((g * gb + off) / 64 * 64));
                        let (ng, nbk) = if b + 1 < nb { (g, b + 1) } else { (g + 2, 0) };
                        let mut want = lines_read(ty, cols, ng, nbk);
                        if kquant {
                            // Codes and high bits only (the scales are a super-block's).
                            let scales = ng * gb + planes.codes + planes.high;
                            want.retain(|&l| l + 64 <= scales);
                        }
                        for l in want {
                            assert!(
                                got.contains(&l),
                                "{ty} cols {cols}: group {g} block {b}: line {l} not prefetched"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Single-group passes (`per_pass` 1: `Prefetch::block`) and two-group passes
    /// (2: `block_of_pair`, both groups' block b read, then both prefetched): past the
    /// first pass's lead, every line a block reads was prefetched at an earlier step.
    #[test]
    fn prefetch_reaches_every_plane_line_before_it_is_read() {
        for per_pass in [1, 2] {
            for &ty in QUANT_TYPES.iter() {
                for cols in [256, 896, 1536, 4864, 8960] {
                    if cols % ty.block_size() != 0 {
                        continue;
                    }
                    let pf = Prefetch::new(ty, cols, 1);
                    let (nb, passes) = (cols / 32, 4);
                    let gb = Planes::new(ty, cols).group_bytes();
                    // Step at which each line was first prefetched.
                    let mut when: HashMap<usize, usize> = HashMap::new();
                    for pass in 0..passes {
                        for b in 0..nb {
                            let step = pass * nb + b;
                            let groups = pass * per_pass..(pass + 1) * per_pass;
                            // A kernel reads block b's lines, then prefetches ahead.
                            for g in groups.clone().filter(|_| step >= pf.lead) {
                                for l in lines_read(ty, cols, g, b) {
                                    let at = when.get(&l).copied();
                                    assert!(
                                        at.is_some_and(|s| s < step),
                                        "{ty} cols {cols} x{per_pass}: line {l} of group {g} block {b} not prefetched"
                                    );
                                }
                            }
                            for g in groups {
                                pf.lines(b, per_pass * gb, |off| {
                                    when.entry(g * gb + off / 64 * 64).or_insert(step);
                                });
                            }
                        }
                    }
                }
            }
        }
    }
}
