//! Attention scores against K stored transposed in tiles of 16 keys.
//!
//! One KV head's K is `[slot / 16][d][slot % 16]`: a tile holds 16 keys with element `d`
//! of all of them adjacent, so one broadcast of `q[d]` and one FMA advance 16 (query, key)
//! products at once, with the keys in the lanes and no horizontal fold.
//!
//! The canonical order of a score is one fused chain over `d` in order, `s = fma(q[d],
//! k[d], s)` from `s = 0` ([`score_reference`]), on the keys as the cache holds them (f32,
//! or half floats widened exactly), so a score has the same bits whatever the lane, the
//! number of queries, the batch or the ISA. With one accumulator per (query, key) the
//! AVX-512 kernel keeps 8 queries x 2 tiles in 16 registers and reads 2 tile rows and 8
//! query elements per 16 FMAs; `dot_f32`'s order (16 partials per score, folded), which
//! scores followed before, left room for 4 queries x 4 partials of one tile and read 5
//! operands per 4 FMAs (benchmarks/runs/kernels-worklog.md#item-96).

use super::kv_elem::KvElem;
use super::simd::Isa;

/// Keys per tile.
pub const TILE: usize = 16;

/// Index of element `d` of key `slot` in one head's tiled K of head size `hd`.
#[inline(always)]
pub fn tiled_index(slot: usize, d: usize, hd: usize) -> usize {
    (slot / TILE) * hd * TILE + d * TILE + slot % TILE
}

/// The canonical score of query `q` and key `k`: fused multiply-adds over the elements
/// in order, from zero.
pub fn score_reference(q: &[f32], k: &[f32]) -> f32 {
    q.iter().zip(k).fold(0.0, |s, (&x, &y)| x.mul_add(y, s))
}

/// (queries, head size, first tile, output of the first query at the first tile's first
/// key, output row stride, valid lanes of the pass's last tile).
#[cfg(target_arch = "x86_64")]
type PassArgs<T> = (*const f32, usize, *const T, *mut f32, usize, usize);

/// `out[a * out_stride + j] = score_reference(q_a, K_j)` bit for bit, for the queries
/// `q_a = q[a * hd..][..hd]` and the keys `j < n_keys` of the tiled K `kt` (one head,
/// tile 0 first; half floats widened exactly). `kt` must hold every tile that key
/// `n_keys - 1` lies in; lanes past `n_keys` are computed but not stored.
///
/// `v` (the same keys' V rows, `hd` apart, or empty) is only prefetched into L2 while
/// the scores are computed, so the weighted sum that follows finds it there instead of
/// streaming it from memory after the scores (benchmarks/runs/kernels-worklog.md#item-79).
#[allow(clippy::too_many_arguments)]
pub fn scores_tiled_with_isa<T: KvElem>(
    isa: Isa,
    q: &[f32],
    hd: usize,
    kt: &[T],
    n_keys: usize,
    out: &mut [f32],
    out_stride: usize,
    v: &[T],
) {
    let n_q = q.len().checked_div(hd).unwrap_or(0);
    assert_eq!(
        n_q * hd,
        q.len(),
        "scores_tiled: queries are not rows of hd"
    );
    if n_q == 0 || n_keys == 0 {
        return;
    }
    assert!(
        n_keys.div_ceil(TILE) * TILE * hd <= kt.len(),
        "scores_tiled: K tiles too short"
    );
    assert!(
        (n_q - 1) * out_stride + n_keys <= out.len(),
        "scores_tiled: output too short"
    );
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && isa.is_supported() {
        // SAFETY: AVX-512F/FMA present (AVX-512F widens halves); the query rows, the tiles of every key below
        // `n_keys` and the output rows hold the extents checked above.
        return unsafe { scores_avx512(q, hd, kt, n_keys, out, out_stride, v) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable && isa.is_supported() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (both AVX2 tiers); extents as above.
        return unsafe { scores_avx2(q, hd, kt, n_keys, out, out_stride, v) };
    }
    let _ = (isa, v);
    canon_body(q, hd, kt, n_keys, out, out_stride)
}

/// The portable kernel: one query and one tile at a time, 16 chains (one per key).
fn canon_body<T: KvElem>(
    q: &[f32],
    hd: usize,
    kt: &[T],
    n_keys: usize,
    out: &mut [f32],
    stride: usize,
) {
    for t in 0..n_keys.div_ceil(TILE) {
        let tile = &kt[t * hd * TILE..(t + 1) * hd * TILE];
        let lanes = (n_keys - t * TILE).min(TILE);
        for (a, qa) in q.chunks_exact(hd).enumerate() {
            let mut s = [0f32; TILE];
            for (&x, row) in qa.iter().zip(tile.chunks_exact(TILE)) {
                for (s, k) in s.iter_mut().zip(row) {
                    *s = x.mul_add(k.widen(), *s);
                }
            }
            out[a * stride + t * TILE..][..lanes].copy_from_slice(&s[..lanes]);
        }
    }
}

/// Queries and tiles per pass of the AVX-512 kernel: 16 accumulators, and per element
/// `d` two tile-row loads and 8 query broadcasts for 16 FMAs.
#[cfg(target_arch = "x86_64")]
const AVX512_PASS: (usize, usize) = (8, 2);

/// Queries per pass of the AVX2 kernel over one tile (two 8-key halves): 12 of the 16
/// `ymm` registers accumulate.
#[cfg(target_arch = "x86_64")]
const AVX2_PASS: (usize, usize) = (6, 1);

/// Passes per group of tiles from which the next group is prefetched, a share of its rows
/// before each pass (and this group's V rows into L2). A single pass (one token's heads)
/// leaves it to the hardware, as before (benchmarks/runs/kernels-worklog.md#item-96).
#[cfg(target_arch = "x86_64")]
const PREFETCH_MIN_PASSES: usize = 2;

/// Calls `$f::<T, QB, NT>($args)` (`T` the caller's key type) with the pass's query and
/// tile counts as constants.
#[cfg(target_arch = "x86_64")]
macro_rules! by_shape {
    ($qb:expr, $nt:expr, $f:ident, $args:expr) => {
        match ($qb, $nt) {
            (8, 2) => $f::<T, 8, 2>($args),
            (7, 2) => $f::<T, 7, 2>($args),
            (6, 2) => $f::<T, 6, 2>($args),
            (5, 2) => $f::<T, 5, 2>($args),
            (4, 2) => $f::<T, 4, 2>($args),
            (3, 2) => $f::<T, 3, 2>($args),
            (2, 2) => $f::<T, 2, 2>($args),
            (_, 2) => $f::<T, 1, 2>($args),
            (8, _) => $f::<T, 8, 1>($args),
            (7, _) => $f::<T, 7, 1>($args),
            (6, _) => $f::<T, 6, 1>($args),
            (5, _) => $f::<T, 5, 1>($args),
            (4, _) => $f::<T, 4, 1>($args),
            (3, _) => $f::<T, 3, 1>($args),
            (2, _) => $f::<T, 2, 1>($args),
            (_, _) => $f::<T, 1, 1>($args),
        }
    };
}

/// Tiles in pairs, queries in groups of 8; one call for the whole item, so no per-tile
/// call overhead or `vzeroupper`.
///
/// # Safety
/// AVX-512F and FMA; `q` holds whole rows of `hd`, `kt` every tile up to key
/// `n_keys - 1`, `out` `(n_q - 1) * stride + n_keys` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn scores_avx512<T: KvElem>(
    q: &[f32],
    hd: usize,
    kt: &[T],
    n_keys: usize,
    out: &mut [f32],
    stride: usize,
    v: &[T],
) {
    // SAFETY: the contract above; each pass gets at most `AVX512_PASS` queries and tiles.
    unsafe {
        tile_passes(
            q,
            hd,
            kt,
            n_keys,
            out,
            stride,
            v,
            AVX512_PASS,
            |qb, nt, args| by_shape!(qb, nt, pass_avx512, args),
        )
    }
}

/// The AVX2 form of [`scores_avx512`]: one tile per pass as two 8-key halves.
///
/// # Safety
/// AVX2, FMA and F16C; extents as [`scores_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_avx2<T: KvElem>(
    q: &[f32],
    hd: usize,
    kt: &[T],
    n_keys: usize,
    out: &mut [f32],
    stride: usize,
    v: &[T],
) {
    // SAFETY: the contract above; each pass gets at most `AVX2_PASS` queries and tiles.
    unsafe {
        tile_passes(
            q,
            hd,
            kt,
            n_keys,
            out,
            stride,
            v,
            AVX2_PASS,
            |qb, _, args| match qb {
                6 => pass_avx2::<T, 6>(args),
                5 => pass_avx2::<T, 5>(args),
                4 => pass_avx2::<T, 4>(args),
                3 => pass_avx2::<T, 3>(args),
                2 => pass_avx2::<T, 2>(args),
                _ => pass_avx2::<T, 1>(args),
            },
        )
    }
}

/// Drives `pass(qb, nt, args)` over every group of at most `per_pass.1` tiles and every
/// group of at most `per_pass.0` queries, prefetching the next group of tiles (and into
/// L2 this group's rows of `v`) a share of their rows per pass when there are enough
/// passes.
///
/// # Safety
/// As [`scores_avx512`] for the extents; `pass` must be safe to call on `qb` queries of
/// `nt` consecutive tiles with the given arguments.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_passes<T: KvElem>(
    q: &[f32],
    hd: usize,
    kt: &[T],
    n_keys: usize,
    out: &mut [f32],
    stride: usize,
    v: &[T],
    (queries_per_pass, tiles_per_pass): (usize, usize),
    pass_fn: impl Fn(usize, usize, PassArgs<T>),
) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
    let n_q = q.len() / hd;
    let n_tiles = n_keys.div_ceil(TILE);
    let passes = n_q.div_ceil(queries_per_pass);
    // 64-byte lines of one tile (a tile row is one line in f32, half a line in f16).
    let tile_lines = (hd * TILE * std::mem::size_of::<T>()).div_ceil(64);
    let prefetch = passes >= PREFETCH_MIN_PASSES;
    let v_ok = v.len() >= n_keys * hd;
    let mut t = 0;
    while t < n_tiles {
        let nt = (n_tiles - t).min(tiles_per_pass);
        let lanes = (n_keys - (t + nt - 1) * TILE).min(TILE);
        // The next group's tiles (as many as exist) and this group's V rows, shared out
        // over the passes.
        let next_lines = (n_tiles - t - nt).min(tiles_per_pass) * tile_lines;
        let v_lines = if v_ok { nt * tile_lines } else { 0 };
        let (next_share, v_share) = match prefetch {
            true => (next_lines.div_ceil(passes), v_lines.div_ceil(passes)),
            false => (0, 0),
        };
        let next = kt.as_ptr().wrapping_add((t + nt) * hd * TILE).cast::<i8>();
        let v_tiles = v.as_ptr().wrapping_add(t * TILE * hd).cast::<i8>();
        let mut a = 0;
        let mut pass = 0;
        while a < n_q {
            for line in (pass * next_share..(pass + 1) * next_share).take_while(|&l| l < next_lines)
            {
                // A hint: it cannot fault, whatever the address (hence `wrapping_add`).
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line * 64));
            }
            for line in (pass * v_share..(pass + 1) * v_share).take_while(|&l| l < v_lines) {
                // A hint, as above (the last tile's rows may run past `v`).
                _mm_prefetch::<_MM_HINT_T1>(v_tiles.wrapping_add(line * 64));
            }
            pass += 1;
            let qb = (n_q - a).min(queries_per_pass);
            let args = (
                q[a * hd..].as_ptr(),
                hd,
                kt[t * hd * TILE..].as_ptr(),
                out[a * stride + t * TILE..].as_mut_ptr(),
                stride,
                lanes,
            );
            // (Queries a..a + qb, tiles t..t + nt and their output rows lie within the
            // extents of the caller's contract.)
            pass_fn(qb, nt, args);
            a += qb;
        }
        t += nt;
    }
}

/// `QB` queries against `NT` consecutive tiles: one accumulator per (query, tile), each
/// the canonical chain over `d` of its 16 keys; each tile-row load serves `QB` queries.
///
/// # Safety
/// AVX-512F and FMA; `QB` query rows of `hd` at `q`, `NT` tiles at `tile`, `QB` output
/// rows at `stride` with `16 * (NT - 1) + lanes` (`lanes` 1..=16) writable floats each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn pass_avx512<T: KvElem, const QB: usize, const NT: usize>(args: PassArgs<T>) {
    use std::arch::x86_64::*;
    let (q, hd, tile, out, stride, lanes) = args;
    let mut acc = [[_mm512_setzero_ps(); NT]; QB];
    // SAFETY (this block): reads stay in the QB query rows and the NT tiles, stores in
    // the first 16 floats of each full tile's output and `lanes` of the last one's.
    unsafe {
        for d in 0..hd {
            let k: [__m512; NT] = std::array::from_fn(|j| row16(tile.add((j * hd + d) * TILE)));
            for (a, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*q.add(a * hd + d));
                for (acc, &k) in acc.iter_mut().zip(&k) {
                    *acc = _mm512_fmadd_ps(x, k, *acc);
                }
            }
        }
        let last: __mmask16 = if lanes >= TILE {
            0xFFFF
        } else {
            (1u16 << lanes) - 1
        };
        for (a, acc) in acc.iter().enumerate() {
            for (j, &s) in acc.iter().enumerate() {
                let mask = if j + 1 == NT { last } else { 0xFFFF };
                _mm512_mask_storeu_ps(out.add(a * stride + j * TILE), mask, s);
            }
        }
    }
}

/// [`pass_avx512`] on 256 bits for one tile: each query's 16 keys in two 8-lane chains.
///
/// # Safety
/// AVX2, FMA and F16C; `QB` query rows of `hd` at `q`, one tile at `tile`, `QB` output
/// rows at `stride` with `lanes` (1..=16) writable floats each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn pass_avx2<T: KvElem, const QB: usize>(args: PassArgs<T>) {
    use std::arch::x86_64::*;
    let (q, hd, tile, out, stride, lanes) = args;
    let mut acc = [[_mm256_setzero_ps(); 2]; QB];
    // SAFETY (this block): reads stay in the QB query rows and the tile, stores in the
    // first `lanes` floats of each output row.
    unsafe {
        for d in 0..hd {
            let row = tile.add(d * TILE);
            let k = [row8(row), row8(row.add(8))];
            for (a, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_set1_ps(*q.add(a * hd + d));
                acc[0] = _mm256_fmadd_ps(x, k[0], acc[0]);
                acc[1] = _mm256_fmadd_ps(x, k[1], acc[1]);
            }
        }
        // Lane i of half h is stored when 8 h + i < lanes (the masks' sign bits).
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let masks = [0, 8].map(|h| _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes as i32 - h), idx));
        for (a, acc) in acc.iter().enumerate() {
            for h in 0..2 {
                _mm256_maskstore_ps(out.add(a * stride + 8 * h), masks[h], acc[h]);
            }
        }
    }
}

/// 16 floats from `p` (f32, or half floats widened exactly).
///
/// # Safety
/// AVX-512F; 16 elements readable at `p`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c")]
#[inline]
pub(crate) unsafe fn row16<T: KvElem>(p: *const T) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller's 16 elements (32 or 64 bytes), unaligned loads.
    unsafe {
        if T::HALF {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
        } else {
            _mm512_loadu_ps(p.cast())
        }
    }
}

/// 8 floats from `p` (f32, or half floats widened exactly).
///
/// # Safety
/// AVX and F16C; 8 elements readable at `p`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(crate) unsafe fn row8<T: KvElem>(p: *const T) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the caller's 8 elements (16 or 32 bytes), unaligned loads.
    unsafe {
        if T::HALF {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        } else {
            _mm256_loadu_ps(p.cast())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::uniform as rnd;

    /// Row-major keys `[n][hd]` into one head's tiles (zero padding past `n`), and the
    /// keys as the tiles hold them.
    fn tile<T: KvElem>(keys: &[f32], hd: usize) -> (Vec<T>, Vec<f32>) {
        let n = keys.len() / hd;
        let mut t = vec![T::default(); n.div_ceil(TILE) * TILE * hd];
        for (j, row) in keys.chunks_exact(hd).enumerate() {
            for (d, &x) in row.iter().enumerate() {
                t[tiled_index(j, d, hd)] = T::narrow(x);
            }
        }
        (t, keys.iter().map(|&x| T::narrow(x).widen()).collect())
    }

    /// Every ISA equals [`score_reference`] on the keys as stored, bit for bit, for f32 and
    /// half-float tiles, query counts 1..20 (whole passes of 8 and 6 and every remainder),
    /// key counts with partial tiles and odd tile counts (a last pass of one tile), head
    /// sizes 64 and 128 and ones not a multiple of 16; output outside `[0, n_keys)` of
    /// each row is left alone.
    #[test]
    fn tiled_scores_equal_the_reference_on_every_isa() {
        tiled_scores_equal_reference::<f32>();
        tiled_scores_equal_reference::<half::f16>();
    }

    fn tiled_scores_equal_reference<T: KvElem>() {
        let mut seed = 12;
        for (hd, n_q, n_keys) in [
            (64usize, 3usize, 37usize),
            (64, 7, 100),
            (24, 5, 70),
            (13, 2, 16),
            (64, 1, 1),
            (64, 4, 33),
            (128, 8, 50),
            (64, 9, 17),
            (80, 13, 48),
            // Enough passes per tile group for the prefetches of K and V.
            (64, 20, 100),
            (64, 56, 1008),
        ] {
            let q = rnd(&mut seed, n_q * hd);
            let (kt, keys) = tile::<T>(&rnd(&mut seed, n_keys * hd), hd);
            let stride = n_keys + 3;
            let want: Vec<u32> = (0..n_q)
                .flat_map(|a| {
                    let qa = &q[a * hd..][..hd];
                    let row: Vec<u32> = (0..stride)
                        .map(|j| match j < n_keys {
                            true => score_reference(qa, &keys[j * hd..][..hd]).to_bits(),
                            false => 7f32.to_bits(),
                        })
                        .collect();
                    row
                })
                .collect();
            // V to prefetch (any rows of the keys' extent): it must not change a bit.
            for (isa, v) in Isa::available()
                .into_iter()
                .flat_map(|i| [(i, &[][..]), (i, &kt[..])])
            {
                let mut out = vec![7f32; n_q * stride];
                scores_tiled_with_isa(isa, &q, hd, &kt, n_keys, &mut out, stride, v);
                let got: Vec<u32> = out.iter().map(|x| x.to_bits()).collect();
                let half = T::HALF;
                assert_eq!(
                    got,
                    want,
                    "{isa:?} half {half} hd={hd} n_q={n_q} n_keys={n_keys} v {}",
                    v.len()
                );
            }
        }
    }
}
