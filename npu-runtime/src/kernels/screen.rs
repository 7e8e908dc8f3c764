//! Screened argmax LM head: the exact greedy argmax of a Q8_0 LM head while reading
//! ~35% fewer of its bytes per token (benchmarks/runs/kernels-worklog.md#item-85).
//!
//! A decode step streams every weight once, and a Q8_0 LM head is over a third of a
//! small model's bytes, yet greedy decoding and speculative verification need only
//! each row's argmax. Split every weight code `q` (int8) as `q = 8·h + l` with
//! `h = q >> 3` in [-16, 15] and `l = q & 7` in [0, 7]. The *coarse* matrix holds `h`
//! as Q5_0 with block scale `8·d` (exact in f16), so with the same int8 activations
//! `a` (block scale `da`) a row's exact output is
//!
//! `L = A + Σ_b d_b·da_b·Σ_k l_k·a_k`, where `A = Σ_b 8·d_b·da_b·Σ_k h_k·a_k`,
//!
//! and since `0 <= l <= 7`, `-7·N_b <= Σ_k l_k·a_k <= 7·P_b` with `P_b` (`N_b`) the sum
//! of the block's positive (negated negative) activation codes. With every `d_b >= 0`:
//!
//! `A - E- <= L <= A + E+`, `E+ = Σ_b d_b·da_b·(7·P_b + γ·(P_b + N_b))` (`E-` with `N_b`),
//!
//! for the f32 values the kernels compute: the `γ` term covers the rounding of both
//! kernels' f32 sums and of the bound's own add ([`rounding_slack`]), and the bounds
//! are scaled by `1 + 2^-10` for their own rounding (all their terms are >= 0).
//!
//! Every row holding a maximum of `L` has `A + E+ >= T` for `T` the largest `A - E-`
//! over any set of rows, so only the row groups of such *candidates* are computed
//! exactly, by the same kernel as the full head: the argmax (ties to the lowest row)
//! is bit-for-bit [`matmul_argmax`]'s. Two stages keep that cheap: a loose pass over
//! all rows with `d_b` replaced by the row's largest scale (`dmax`, one float per row)
//! typically keeps ~1% of the rows, and the exact `E±` of those (their f32 scales, 112
//! bytes per row on Qwen2.5-0.5B) leaves a median of ~2 row groups there decoding
//! confident text (~160 on flatter text; benchmarks/runs/kernels-worklog.md#item-85).
//! Anything odd (a non-finite output, too many rows left) falls back to the full head.

use super::ggml::GgmlType;
use super::layout::{coarse_q5_0_group, legacy_scales};
use super::matmul::{argmax_in_groups, matmul_argmax_with_isa, matmul_with_isa};
use super::pool::ThreadPool;
use super::simd::Isa;
use super::{MatmulScratch, QMatrix};
use half::f16;

/// Rows per kernel group (`layout::GROUP`).
const GROUP: usize = 16;
/// Lanes of the scans over all rows (a multiple the compiler vectorises).
const LANES: usize = 16;
/// Largest block count (columns / 32) a screen is built for: keeps the f32 rounding
/// slack far below the bound's 7 per code ([`rounding_slack`]).
const MAX_BLOCKS: usize = 2048;
/// The bounds' scale-up for their own f32 rounding (relative error <= nb·2^-24).
const K: f32 = 1.0 + 1.0 / 1024.0;
/// Most calls skipped after a run of fallbacks: after `k` fallbacks in a row the next
/// `2^k - 1` calls (at most this many) take the full head directly. Flat outputs (text
/// the model finds random) come in runs, so this bounds the wasted coarse passes to
/// about one call in 32 there, while an isolated fallback costs one skipped call.
const MAX_BACKOFF: u32 = 31;
/// Smallest head (rows x cols) a model gets a screen for: SmolLM2-135M's 28M-weight
/// head (30 MB, a third of the step's bytes) measured no faster screened, the
/// 0.5B's 136M one 10-25% faster per greedy step (benchmarks/runs/kernels-worklog.md#item-85).
pub const MIN_SCREENED_WEIGHTS: usize = 64 << 20;
/// Most tokens per screened call (more go through the full head): from 8 rows on the
/// head is compute-bound and the screen no longer pays
/// (benchmarks/runs/kernels-worklog.md#item-85).
pub const SCREEN_MAX_TOKENS: usize = 4;

/// The coarse copy and block scales of a Q8_0 LM head.
pub struct ArgmaxScreen {
    /// `h = q >> 3` as Q5_0 with scale `8·d`.
    coarse: QMatrix,
    /// Per row, its `nb` block scales `d` as f32 (row-major; read for the rows the loose
    /// pass keeps, thousands of them when the outputs are flat, so no f16 conversions).
    scales: Vec<f32>,
    /// Per row, its largest block scale.
    dmax: Vec<f32>,
    nb: usize,
}

impl ArgmaxScreen {
    /// The screen of `head`, or `None` if it has none: not Q8_0, too wide, or a block
    /// scale that is negative, non-finite or too large for `8·d` to be exact in f16.
    pub fn build(head: &QMatrix, pool: &ThreadPool) -> Option<ArgmaxScreen> {
        let nb = head.cols() / 32;
        if head.ggml_type() != GgmlType::Q8_0 || nb > MAX_BLOCKS {
            return None;
        }
        let coarse = QMatrix::derived(head, GgmlType::Q5_0, pool, &|src, dst| {
            coarse_q5_0_group(nb, src, dst)
        })?;
        Self::with_coarse(head, coarse, pool)
    }

    /// The screen of `head` around a coarse copy [`ArgmaxScreen::build`] made earlier
    /// for the same head (a repacked-weights cache holds it, `weights_cache`); `None` as
    /// for `build`, or if `coarse` has the wrong type or shape.
    pub fn with_coarse(head: &QMatrix, coarse: QMatrix, pool: &ThreadPool) -> Option<Self> {
        let (rows, cols) = (head.rows(), head.cols());
        let nb = cols / 32;
        let fits =
            coarse.ggml_type() == GgmlType::Q5_0 && (coarse.rows(), coarse.cols()) == (rows, cols);
        if head.ggml_type() != GgmlType::Q8_0 || nb > MAX_BLOCKS || !fits {
            return None;
        }
        let mut scales = vec![0f32; rows * nb];
        pool.for_each_chunk_mut(&mut scales, GROUP * nb, &|g, chunk| {
            legacy_scales(GgmlType::Q8_0, nb, head.group(g), chunk)
        });
        // The bound needs d >= 0 and finite, and the coarse scale 8·d exact in f16
        // (checked here for a fresh copy and a cached one alike).
        let usable =
            |d: f32| d >= 0.0 && d.is_finite() && f16::from_f32(8.0 * d).to_f32() == 8.0 * d;
        if !scales.iter().all(|&d| usable(d)) {
            return None;
        }
        let dmax = scales
            .chunks_exact(nb)
            .map(|r| r.iter().fold(0f32, |m, &d| m.max(d)))
            .collect();
        Some(ArgmaxScreen {
            coarse,
            scales,
            dmax,
            nb,
        })
    }

    /// The coarse copy (what a repacked-weights cache stores).
    pub fn coarse(&self) -> &QMatrix {
        &self.coarse
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.coarse.size_bytes() + 4 * (self.scales.len() + self.dmax.len())
    }

    pub fn rows(&self) -> usize {
        self.coarse.rows()
    }

    pub fn cols(&self) -> usize {
        self.coarse.cols()
    }
}

/// The `γ` of the module comment for `nb` blocks: both kernels' f32 outputs are sums
/// of `nb` terms `fl(scale·da)·isum` with `|isum| <= 128·(P + N)` (codes in
/// [-128, 127], `8·h` in [-128, 120]), each off by at most `(nb + 2)·2^-24` of the
/// sum of the terms' magnitudes, and the bound's add by `2^-24` of its result;
/// `(nb + 4)·2^-14` per code is 4x the worst case of all three together.
fn rounding_slack(nb: usize) -> f32 {
    (nb + 4) as f32 * (1.0 / 16384.0)
}

/// Buffers of [`screened_argmax`], sized once.
pub struct ScreenScratch {
    rows: usize,
    /// Coarse outputs, `SCREEN_MAX_TOKENS x rows`.
    coarse: Vec<f32>,
    /// Per token, the per-block bound factors `da·(7·P + γ·(P + N))` then `..N..`.
    factors: Vec<f32>,
    /// Rows the loose pass keeps, at most `max_rows` per token, and their exact upper
    /// bounds.
    rows_left: Vec<u32>,
    upper: Vec<f32>,
    max_rows: usize,
    /// Candidate row groups of all tokens (ascending once sorted).
    groups: Vec<u32>,
    /// The matmul scratch of the coarse matmul and the exact groups.
    mm: MatmulScratch,
    /// Per token count (index `n - 1`), calls of that count left to skip and its
    /// fallbacks in a row ([`MAX_BACKOFF`]): speculative decoding mixes sizes, and a size
    /// that keeps falling back (4 rows of flat outputs) must not be retried after every
    /// success of another (1 row of the same text).
    backoff: [u32; SCREEN_MAX_TOKENS],
    fallbacks: [u32; SCREEN_MAX_TOKENS],
}

impl ScreenScratch {
    pub fn new(screen: &ArgmaxScreen) -> Self {
        let rows = screen.rows();
        let t = SCREEN_MAX_TOKENS;
        // Past 1/8 of the rows (~19k of 152k) the exact scales' reads and the exact
        // groups approach the full head's cost.
        let max_rows = (rows / 8).max(GROUP);
        ScreenScratch {
            rows,
            coarse: vec![0.0; t * rows],
            factors: vec![0.0; 2 * t * screen.nb],
            rows_left: Vec::with_capacity(max_rows),
            upper: Vec::with_capacity(max_rows),
            max_rows,
            groups: Vec::with_capacity(t * rows.div_ceil(GROUP)),
            mm: MatmulScratch::new(t, screen.cols()),
            backoff: [0; SCREEN_MAX_TOKENS],
            fallbacks: [0; SCREEN_MAX_TOKENS],
        }
    }

    /// Whether the next argmax call of `n_tokens` (1..=[`SCREEN_MAX_TOKENS`]) should
    /// take the screen: false for a while after calls of that size that fell back to the
    /// full head ([`MAX_BACKOFF`]).
    pub fn try_screen(&mut self, n_tokens: usize) -> bool {
        let Some(backoff) = n_tokens
            .checked_sub(1)
            .and_then(|i| self.backoff.get_mut(i))
        else {
            return false;
        };
        let skip = *backoff > 0;
        *backoff = backoff.saturating_sub(1);
        !skip
    }
}

/// What one screened call did (for tests and profiles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScreenStats {
    /// Rows the loose pass kept, summed over tokens.
    pub loose_rows: usize,
    /// Row groups computed exactly (0 if the full head ran).
    pub exact_groups: usize,
    /// Whether the call fell back to the full head.
    pub fallback: bool,
}

/// `out[n] = argmax_r (x · headᵀ)[n][r]`, bit-for-bit [`matmul_argmax`]'s answer, for
/// `n_tokens <= SCREEN_MAX_TOKENS` tokens, reading the coarse copy in full and the
/// exact head only where a maximum can be.
#[allow(clippy::too_many_arguments)]
pub fn screened_argmax(
    isa: Isa,
    screen: &ArgmaxScreen,
    head: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [u32],
    s: &mut ScreenScratch,
    pool: &ThreadPool,
) -> ScreenStats {
    let (rows, nb) = (s.rows, screen.nb);
    assert!(
        n_tokens <= SCREEN_MAX_TOKENS
            && head.ggml_type() == GgmlType::Q8_0
            && head.rows() == rows
            && head.cols() == nb * 32
            && screen.rows() == rows
            && x.len() == n_tokens * nb * 32
            && out.len() == n_tokens,
        "screened_argmax: shapes"
    );
    let mut stats = ScreenStats::default();
    if n_tokens == 0 {
        return stats;
    }
    let coarse = &mut s.coarse[..n_tokens * rows];
    matmul_with_isa(isa, &screen.coarse, x, n_tokens, coarse, &mut s.mm, pool);
    // The coarse matmul left the Q8_0 activations (the head's too) in the scratch.
    bound_factors(s.mm.acts_for(GgmlType::Q5_0), nb, n_tokens, &mut s.factors);

    s.groups.clear();
    let mut ok = true;
    for t in 0..n_tokens {
        let a = &s.coarse[t * rows..(t + 1) * rows];
        let (pos, neg) = s.factors[2 * t * nb..(2 * t + 2) * nb].split_at(nb);
        let left = (&mut s.rows_left, &mut s.upper);
        let kept = candidates(screen, a, pos, neg, s.max_rows, left, &mut s.groups);
        match kept {
            Some(n) => stats.loose_rows += n,
            None => {
                ok = false;
                break;
            }
        }
    }
    if ok {
        s.groups.sort_unstable();
        s.groups.dedup();
        argmax_in_groups(isa, head, x, n_tokens, &s.groups, out, &mut s.mm, pool);
        stats.exact_groups = s.groups.len();
        s.fallbacks[n_tokens - 1] = 0;
    } else {
        matmul_argmax_with_isa(isa, head, x, n_tokens, out, &mut s.mm, pool);
        stats.fallback = true;
        let fallbacks = &mut s.fallbacks[n_tokens - 1];
        *fallbacks = (*fallbacks + 1).min(5);
        s.backoff[n_tokens - 1] = ((1 << *fallbacks) - 1).min(MAX_BACKOFF);
    }
    stats
}

/// Per token, the per-block factors of `E+` then of `E-` (module comment, without the
/// row's `d_b`) from its quantized activations.
fn bound_factors(acts: &super::act::QuantActs, nb: usize, n_tokens: usize, out: &mut [f32]) {
    let slack = rounding_slack(nb);
    for t in 0..n_tokens {
        let (pos, neg) = out[2 * t * nb..(2 * t + 2) * nb].split_at_mut(nb);
        for b in 0..nb {
            let blk = t * nb + b;
            let (mut p, mut n) = (0i32, 0i32);
            for &a in &acts.q[blk * 32..blk * 32 + 32] {
                p += (a as i32).max(0);
                n += (-(a as i32)).max(0);
            }
            let (p, n, da) = (p as f32, n as f32, acts.d[blk]);
            pos[b] = da * (7.0 * p + slack * (p + n));
            neg[b] = da * (7.0 * n + slack * (p + n));
        }
    }
}

/// Appends to `groups` the row groups (ascending) of one token's candidates, given its
/// coarse outputs `a` and bound factors; returns how many rows the loose pass kept, or
/// `None` if an output is not finite or the loose pass keeps more than `max_rows`.
fn candidates(
    screen: &ArgmaxScreen,
    a: &[f32],
    pos: &[f32],
    neg: &[f32],
    max_rows: usize,
    (kept, upper): (&mut Vec<u32>, &mut Vec<f32>),
    groups: &mut Vec<u32>,
) -> Option<usize> {
    // Loose bounds: d_b <= dmax, so E± <= dmax·Σ_b factor±_b.
    let sum_pos = K * pos.iter().sum::<f32>();
    let sum_neg = K * neg.iter().sum::<f32>();
    let (t_loose, finite) = loose_threshold(a, &screen.dmax, sum_neg);
    if !(finite && sum_pos.is_finite() && sum_neg.is_finite()) {
        return None;
    }
    kept.clear();
    rows_reaching(a, &screen.dmax, sum_pos, t_loose, max_rows, kept)?;
    // Exact bounds of the kept rows; the threshold over them is still a lower bound
    // of every maximum.
    let nb = screen.nb;
    upper.clear();
    let mut t_exact = f32::NEG_INFINITY;
    for (i, &r) in kept.iter().enumerate() {
        // The kept rows are scattered over the scales: ask for a later row's early, or
        // each row waits a DRAM round trip.
        if let Some(&ahead) = kept.get(i + PREFETCH_ROWS) {
            prefetch(&screen.scales[ahead as usize * nb..(ahead as usize + 1) * nb]);
        }
        let d = &screen.scales[r as usize * nb..(r as usize + 1) * nb];
        let (mut ep, mut en) = (0f32, 0f32);
        for ((&d, &p), &n) in d.iter().zip(pos).zip(neg) {
            ep += d * p;
            en += d * n;
        }
        let ar = a[r as usize];
        upper.push(ar + K * ep);
        t_exact = t_exact.max(ar - K * en);
    }
    let start = groups.len();
    for (&r, &hi) in kept.iter().zip(upper.iter()) {
        if hi >= t_exact {
            let g = r / GROUP as u32;
            if groups.len() == start || groups[groups.len() - 1] != g {
                groups.push(g);
            }
        }
    }
    Some(kept.len())
}

/// Kept rows whose scales are requested ahead of use.
const PREFETCH_ROWS: usize = 16;

/// Asks for the cache lines of `v` (a hint: no effect on results).
#[inline(always)]
fn prefetch(v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in v.chunks(16) {
        // SAFETY: a prefetch hint for an address inside a live slice; it reads and
        // writes nothing architecturally and cannot fault.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

/// `max_r (a_r - dmax_r·c)` and whether every `a_r` is finite.
fn loose_threshold(a: &[f32], dmax: &[f32], c: f32) -> (f32, bool) {
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut bad = [0u32; LANES];
    let (ac, dc) = (a.chunks_exact(LANES), dmax.chunks_exact(LANES));
    let (ar, dr) = (ac.remainder(), dc.remainder());
    let mut lane = |i: usize, a: f32, d: f32| {
        let lo = a - d * c;
        best[i] = if lo > best[i] { lo } else { best[i] };
        bad[i] |= u32::from(a.to_bits() & 0x7FFF_FFFF >= 0x7F80_0000);
    };
    for (a16, d16) in ac.zip(dc) {
        for i in 0..LANES {
            lane(i, a16[i], d16[i]);
        }
    }
    for (i, (&a, &d)) in ar.iter().zip(dr).enumerate() {
        lane(i, a, d);
    }
    let t = best.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    (t, bad.iter().all(|&b| b == 0) && t.is_finite())
}

/// Pushes the rows with `a_r + dmax_r·c >= t` (ascending) onto `out`; `None` past
/// `max_rows`.
fn rows_reaching(
    a: &[f32],
    dmax: &[f32],
    c: f32,
    t: f32,
    max_rows: usize,
    out: &mut Vec<u32>,
) -> Option<()> {
    let (ac, dc) = (a.chunks_exact(LANES), dmax.chunks_exact(LANES));
    let (ar, dr) = (ac.remainder(), dc.remainder());
    let base = a.len() - ar.len();
    let mut push = |r: usize| -> Option<()> {
        if out.len() == max_rows {
            return None;
        }
        out.push(r as u32);
        Some(())
    };
    for (j, (a16, d16)) in ac.zip(dc).enumerate() {
        let mut mask = 0u32;
        for i in 0..LANES {
            mask |= u32::from(a16[i] + d16[i] * c >= t) << i;
        }
        while mask != 0 {
            push(j * LANES + mask.trailing_zeros() as usize)?;
            mask &= mask - 1;
        }
    }
    for (i, (&a, &d)) in ar.iter().zip(dr).enumerate() {
        if a + d * c >= t {
            push(base + i)?;
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::matmul_argmax_with_isa;
    use crate::test_rng::uniform;

    /// One ggml Q5_0 block (f16 d, 32 high bits, 16 bytes of low nibbles) of codes
    /// `u` in [0, 31] (value `u - 16`).
    fn q5_0_block(d: f16, u: &[u8; 32], out: &mut [u8]) {
        out[..2].copy_from_slice(&d.to_le_bytes());
        let mut qh = 0u32;
        for (k, &c) in u.iter().enumerate() {
            qh |= u32::from(c >> 4 & 1) << k;
        }
        out[2..6].copy_from_slice(&qh.to_le_bytes());
        for k in 0..16 {
            out[6 + k] = (u[k] & 15) | (u[k + 16] & 15) << 4;
        }
    }

    /// The coarse copy, built on the packed planes, is byte for byte the repacking of
    /// the ggml Q5_0 matrix of `h = q >> 3` and `8·d` (partial last group included), and
    /// the row scales are the ggml ones.
    #[test]
    fn coarse_copy_equals_repacked_ggml_reference() {
        let mut seed = 9;
        for (rows, cols) in [(16 * 5, 64), (16 * 7 + 9, 96), (3, 32)] {
            let bytes = random_q8_0(rows, cols, &mut seed);
            let head = QMatrix::from_ggml(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
            let mut q5 = vec![0u8; rows * cols / 32 * 22];
            for (src, dst) in bytes.chunks_exact(34).zip(q5.chunks_exact_mut(22)) {
                let d = f16::from_le_bytes([src[0], src[1]]).to_f32();
                let u = std::array::from_fn(|k| ((src[2 + k] as i8 >> 3) + 16) as u8);
                q5_0_block(f16::from_f32(8.0 * d), &u, dst);
            }
            let want = QMatrix::from_ggml(GgmlType::Q5_0, rows, cols, &q5).unwrap();
            for threads in [1, 3] {
                let screen = ArgmaxScreen::build(&head, &ThreadPool::new(threads)).unwrap();
                assert_eq!(screen.coarse.repacked_bytes(), want.repacked_bytes());
                let d: Vec<f32> = bytes
                    .chunks_exact(34)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                    .collect();
                assert_eq!(screen.scales, d);
            }
        }
    }

    /// Q8_0 ggml bytes of `rows` random rows (scales of 0.002-0.006, all codes).
    fn random_q8_0(rows: usize, cols: usize, seed: &mut u64) -> Vec<u8> {
        let noise = uniform(seed, rows * cols / 32 * 34);
        let mut bytes: Vec<u8> = noise.iter().map(|v| (v.to_bits() >> 7) as u8).collect();
        for b in bytes.chunks_exact_mut(34) {
            let d = 0.002 + 0.004 * (b[0] as f32 / 256.0);
            b[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        }
        bytes
    }

    /// Row `r`'s weights as f32.
    fn row_f32(bytes: &[u8], cols: usize, r: usize) -> Vec<f32> {
        let rb = cols / 32 * 34;
        let mut out = Vec::with_capacity(cols);
        for blk in bytes[r * rb..(r + 1) * rb].chunks_exact(34) {
            let d = f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            out.extend(blk[2..].iter().map(|&q| d * (q as i8) as f32));
        }
        out
    }

    /// For every ISA, thread count and 1..=4 tokens, the screened argmax equals the full
    /// head's, on a head whose winning rows are near-ties: each token's x is a row's own
    /// weights (plus noise), and that row also appears as an exact copy further down (a
    /// tie: the lower row must win), as a copy whose low bits differ (same coarse value,
    /// different exact one) and as a copy with one code one step higher; other tokens
    /// get noise-only x or zeros (every row tied: the fallback must be right too).
    #[test]
    fn screened_argmax_equals_full_argmax() {
        let mut seed = 7;
        let (rows, cols) = (16 * 61 + 5, 128);
        let rb = cols / 32 * 34;
        let mut bytes = random_q8_0(rows, cols, &mut seed);
        let winners = [40usize, 333, 700];
        for (k, &w) in winners.iter().enumerate() {
            let src = bytes[w * rb..(w + 1) * rb].to_vec();
            // An exact copy (tie), a low-bit variant and a +1 variant, in later groups.
            for (j, delta) in [(0usize, 0i8), (1, 1), (2, 8)] {
                let r = rows - 1 - 3 * k - j;
                let mut v = src.clone();
                for blk in v.chunks_exact_mut(34) {
                    let q = blk[2 + (j * 5) % 32] as i8;
                    blk[2 + (j * 5) % 32] = q.saturating_add(delta) as u8;
                }
                bytes[r * rb..(r + 1) * rb].copy_from_slice(&v);
            }
        }
        let head = QMatrix::from_ggml(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
        let (mut screened, mut fell_back) = (0, 0);
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let screen = ArgmaxScreen::build(&head, &pool).expect("a Q8_0 head has a screen");
            let mut s = ScreenScratch::new(&screen);
            let mut mm = MatmulScratch::new(SCREEN_MAX_TOKENS, cols);
            for n in 1..=SCREEN_MAX_TOKENS {
                for round in 0..6 {
                    let mut x = Vec::with_capacity(n * cols);
                    for t in 0..n {
                        let noise = uniform(&mut seed, cols);
                        match (round + t) % 3 {
                            0 => {
                                let w = row_f32(&bytes, cols, winners[(round + t) / 3 % 3]);
                                x.extend(w.iter().zip(&noise).map(|(w, e)| 300.0 * w + 0.05 * e));
                            }
                            1 => x.extend(noise),
                            // Every output 0: all rows tie, far too many to screen.
                            _ => x.extend(std::iter::repeat_n(0.0, cols)),
                        }
                    }
                    for isa in Isa::available() {
                        let mut want = vec![0u32; n];
                        matmul_argmax_with_isa(isa, &head, &x, n, &mut want, &mut mm, &pool);
                        let mut got = vec![u32::MAX; n];
                        let st =
                            screened_argmax(isa, &screen, &head, &x, n, &mut got, &mut s, &pool);
                        assert_eq!(got, want, "{isa:?} n={n} round={round} t={threads}");
                        if st.fallback {
                            fell_back += 1;
                        } else {
                            screened += 1;
                            assert!(st.exact_groups < rows / 16, "{st:?}");
                        }
                    }
                }
            }
        }
        // Both paths ran: peaked tokens screen, calls with a flat token fall back.
        assert!(
            screened > 0 && fell_back > 0,
            "{screened} screened, {fell_back} fell back"
        );
    }

    /// Rows whose low bits all sit at 7 reach the bound exactly: with activation codes
    /// 127 and nineteen 1s (P = 146), row 40 (codes 7: coarse 0, exact 7·146 = 1022)
    /// beats row 3 (one code 8: coarse = exact = 8·127 = 1016) although its coarse value
    /// is lower by more than 6.9·P; negated, row 20 (one code -8: 1016) beats row 9
    /// (codes -9 then 7: coarse 2032, exact 1010) whose coarse value is higher by more
    /// than 6.9·N. A bound of 6.9 per code instead of 7 drops the winner.
    #[test]
    fn bounds_hold_where_low_bits_are_extreme() {
        let (rows, cols) = (48, 32);
        let mut bytes = vec![0u8; rows * 34];
        let mut set = |r: usize, codes: [i8; 32]| {
            let blk = &mut bytes[r * 34..(r + 1) * 34];
            blk[..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
            for (k, c) in codes.iter().enumerate() {
                blk[2 + k] = *c as u8;
            }
        };
        set(40, [7; 32]);
        let mut one = [0i8; 32];
        one[0] = 8;
        set(3, one);
        let mut c = [7i8; 32];
        c[0] = -9;
        set(9, c);
        one[0] = -8;
        set(20, one);
        let head = QMatrix::from_ggml(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
        let pool = ThreadPool::new(1);
        let screen = ArgmaxScreen::build(&head, &pool).unwrap();
        let mut s = ScreenScratch::new(&screen);
        // Codes 127 and nineteen 1s (P = 146): 8·127 lies between 6.9·P and 7·P.
        let mut x = vec![0.0; 2 * cols];
        x[0] = 1.0;
        x[1..20].fill(1.0 / 127.0);
        x.copy_within(0..cols, cols);
        for v in &mut x[cols..] {
            *v = -*v;
        }
        for isa in Isa::available() {
            let mut got = [u32::MAX; 2];
            let st = screened_argmax(isa, &screen, &head, &x, 2, &mut got, &mut s, &pool);
            assert_eq!(got, [40, 20], "{isa:?}");
            assert!(!st.fallback, "{st:?}");
        }
    }

    /// Rows that differ from the winner only in their low 3 bits have the same coarse
    /// output and different exact ones: over many random heads, every ISA must rank them
    /// exactly as the full head does.
    #[test]
    fn low_bit_variants_are_ranked_exactly() {
        let mut seed = 21;
        let (rows, cols) = (16 * 20, 96);
        let rb = cols / 32 * 34;
        let pool = ThreadPool::new(2);
        let mut mm = MatmulScratch::new(2, cols);
        let mut screened = 0;
        for case in 0..40 {
            let mut bytes = random_q8_0(rows, cols, &mut seed);
            let winner = (case * 37) % rows;
            let src = bytes[winner * rb..(winner + 1) * rb].to_vec();
            let noise = uniform(&mut seed, 8 * rb);
            for v in 0..8 {
                let r = (winner + 1 + v * 41) % rows;
                let mut row = src.clone();
                for (k, byte) in row.iter_mut().enumerate() {
                    if k % 34 >= 2 {
                        let low = (noise[v * rb + k].to_bits() >> 9) as u8 & 7;
                        *byte = (*byte & !7) | low;
                    }
                }
                bytes[r * rb..(r + 1) * rb].copy_from_slice(&row);
            }
            let head = QMatrix::from_ggml(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
            let screen = ArgmaxScreen::build(&head, &pool).unwrap();
            let mut s = ScreenScratch::new(&screen);
            let w = row_f32(&bytes, cols, winner);
            let e = uniform(&mut seed, 2 * cols);
            let x: Vec<f32> = (0..2 * cols)
                .map(|i| 200.0 * w[i % cols] + 0.1 * e[i])
                .collect();
            for isa in Isa::available() {
                let mut want = [0u32; 2];
                matmul_argmax_with_isa(isa, &head, &x, 2, &mut want, &mut mm, &pool);
                let mut got = [u32::MAX; 2];
                let st = screened_argmax(isa, &screen, &head, &x, 2, &mut got, &mut s, &pool);
                assert_eq!(got, want, "case {case} {isa:?}");
                screened += usize::from(!st.fallback);
            }
        }
        assert!(screened > 0);
    }

    /// A peaked token's winner has exact ties and near-ties in other groups: the screen
    /// must keep them all and return the lowest of the tied rows.
    #[test]
    fn ties_between_groups_go_to_the_lowest_row() {
        let mut seed = 11;
        let (rows, cols) = (16 * 40, 64);
        let rb = cols / 32 * 34;
        let mut bytes = random_q8_0(rows, cols, &mut seed);
        let src = bytes[500 * rb..501 * rb].to_vec();
        for r in [90, 300, 637] {
            bytes[r * rb..(r + 1) * rb].copy_from_slice(&src);
        }
        let head = QMatrix::from_ggml(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
        let pool = ThreadPool::new(2);
        let screen = ArgmaxScreen::build(&head, &pool).unwrap();
        let mut s = ScreenScratch::new(&screen);
        let x: Vec<f32> = row_f32(&bytes, cols, 500)
            .iter()
            .map(|w| 100.0 * w)
            .collect();
        for isa in Isa::available() {
            let mut got = [u32::MAX];
            let st = screened_argmax(isa, &screen, &head, &x, 1, &mut got, &mut s, &pool);
            assert_eq!(got, [90], "{isa:?}");
            assert!(!st.fallback && st.exact_groups >= 4, "{st:?}");
        }
    }

    /// Sizes back off separately: a 4-row call that keeps falling back is tried ever more
    /// rarely, while the 1-row calls between them (which succeed) are tried every time.
    #[test]
    fn each_size_backs_off_on_its_own() {
        let mut seed = 5;
        let (rows, cols) = (16 * 40, 64);
        let bytes = random_q8_0(rows, cols, &mut seed);
        let head = QMatrix::from_ggml(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
        let pool = ThreadPool::new(1);
        let screen = ArgmaxScreen::build(&head, &pool).unwrap();
        let mut s = ScreenScratch::new(&screen);
        // One peaked token (its screen succeeds); four tokens, one infinite (falls back).
        let peaked: Vec<f32> = row_f32(&bytes, cols, 300)
            .iter()
            .map(|w| 100.0 * w)
            .collect();
        let mut want = [0u32];
        let mut mm = MatmulScratch::new(1, cols);
        matmul_argmax_with_isa(Isa::Portable, &head, &peaked, 1, &mut want, &mut mm, &pool);
        let mut flat = uniform(&mut seed, 4 * cols);
        flat[2 * cols + 5] = f32::INFINITY;
        let (mut one_tried, mut four_tried) = (0, 0);
        for _ in 0..32 {
            if s.try_screen(1) {
                let mut got = [u32::MAX];
                let st = screened_argmax(
                    Isa::Portable,
                    &screen,
                    &head,
                    &peaked,
                    1,
                    &mut got,
                    &mut s,
                    &pool,
                );
                assert!(!st.fallback && got == want, "{st:?} {got:?} {want:?}");
                one_tried += 1;
            }
            if s.try_screen(4) {
                let mut got = [u32::MAX; 4];
                let st = screened_argmax(
                    Isa::Portable,
                    &screen,
                    &head,
                    &flat,
                    4,
                    &mut got,
                    &mut s,
                    &pool,
                );
                assert!(st.fallback, "{st:?}");
                four_tried += 1;
            }
        }
        // Tries at calls 0, 2, 6, 14 and 30 of the 4-row size (skips of 1, 3, 7, 15).
        assert_eq!((one_tried, four_tried), (32, 5));
        assert!(!s.try_screen(0) && !s.try_screen(SCREEN_MAX_TOKENS + 1));
    }

    /// Odd inputs give the full head's answer; infinite ones take the full head.
    #[test]
    fn non_finite_inputs_fall_back() {
        let mut seed = 3;
        let (rows, cols) = (100, 64);
        let head = QMatrix::from_ggml(
            GgmlType::Q8_0,
            rows,
            cols,
            &random_q8_0(rows, cols, &mut seed),
        )
        .unwrap();
        let pool = ThreadPool::new(1);
        let screen = ArgmaxScreen::build(&head, &pool).unwrap();
        let mut s = ScreenScratch::new(&screen);
        let mut mm = MatmulScratch::new(1, cols);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 3e38] {
            let mut x = uniform(&mut seed, cols);
            x[17] = bad;
            let mut want = [0u32];
            matmul_argmax_with_isa(Isa::Portable, &head, &x, 1, &mut want, &mut mm, &pool);
            let mut got = [u32::MAX];
            let st = screened_argmax(
                Isa::Portable,
                &screen,
                &head,
                &x,
                1,
                &mut got,
                &mut s,
                &pool,
            );
            assert_eq!(got, want, "{bad}");
            // An infinite input makes the outputs non-finite (a NaN one is quantized
            // to finite codes, for both heads alike).
            if bad.is_infinite() {
                assert!(st.fallback, "{bad}: {st:?}");
            }
        }
    }

    /// Heads the screen's bound does not hold for get none: other formats, a negative
    /// block scale, a scale whose 8x overflows f16.
    #[test]
    fn screen_is_built_only_where_its_bound_holds() {
        let mut seed = 5;
        let (rows, cols) = (40, 64);
        let pool = ThreadPool::new(1);
        let good = random_q8_0(rows, cols, &mut seed);
        assert!(ArgmaxScreen::build(
            &QMatrix::from_ggml(GgmlType::Q8_0, rows, cols, &good).unwrap(),
            &pool
        )
        .is_some());
        for d in [-0.001f32, 10000.0, f32::NAN, f32::INFINITY] {
            let mut bytes = good.clone();
            bytes[34 * 5..34 * 5 + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
            let head = QMatrix::from_ggml(GgmlType::Q8_0, rows, cols, &bytes).unwrap();
            assert!(ArgmaxScreen::build(&head, &pool).is_none(), "{d}");
        }
        let q4 = vec![0u8; rows * cols / 32 * 18];
        let head = QMatrix::from_ggml(GgmlType::Q4_0, rows, cols, &q4).unwrap();
        assert!(ArgmaxScreen::build(&head, &pool).is_none());
    }
}
