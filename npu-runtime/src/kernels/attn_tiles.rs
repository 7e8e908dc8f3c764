//! Attention scores against K stored transposed in tiles of 16 keys.
//!
//! One KV head's K is `[slot / 16][tile_row(d)][slot % 16]`: a tile holds 16 keys with
//! element `d` of all of them adjacent (rows in the order the kernel reads them), so one
//! broadcast of `q[d]` and one FMA advance 16 (query, key) products at once, with the keys in the lanes and no horizontal fold.
//! The arithmetic per lane is exactly [`super::vector::dot_f32`]'s canonical order (16
//! partials by `d mod 16`, each a fused chain; the pairwise fold l+8, l+4, l+2, l+1; the
//! tail fused in order) on the keys as the cache holds them (f32, or half floats widened
//! exactly), so a score has the same bits as `dot_f32` on those keys, whatever the lane,
//! the number of queries, the batch or the ISA.

use super::simd::Isa;
use crate::kv_cache::KvElem;

/// Keys per tile.
pub const TILE: usize = 16;

/// The order in which the kernels visit the quarters of the partials (quarter `r` holds
/// the partials `l = r, r + 4, r + 8, r + 12`): `c_0`, `c_2` (then `e_0 = c_0 + c_2`),
/// `c_1`, `c_3` (then `e_1`); the tile stores the quarters' rows in this order.
const QUARTER_ORDER: [usize; 4] = [0, 2, 1, 3];

/// Row of element `d` inside a tile of head size `hd`: the rows of the full 16-element
/// chunks grouped by quarter (in [`QUARTER_ORDER`]), each quarter's rows in the order the
/// kernel reads them (chunk, then `l`), then the tail rows in order. The AVX-512 kernel
/// so reads a tile front to back; with rows in `d` order it read every fourth 64-byte
/// line per pass, a pattern the hardware prefetcher does not follow from memory.
#[inline(always)]
pub fn tile_row(d: usize, hd: usize) -> usize {
    let full = hd - hd % 16;
    if d >= full {
        return d;
    }
    // QUARTER_ORDER is its own inverse: quarter r is the QUARTER_ORDER[r]-th visited.
    let pos = QUARTER_ORDER[d % 4];
    pos * (full / 4) + (d / 16) * 4 + (d % 16) / 4
}

/// Index of element `d` of key `slot` in one head's tiled K of head size `hd`.
#[inline(always)]
pub fn tiled_index(slot: usize, d: usize, hd: usize) -> usize {
    (slot / TILE) * hd * TILE + tile_row(d, hd) * TILE + slot % TILE
}

/// (queries, head size, tile, output of the first query at the tile's first key, output
/// row stride, valid lanes of the tile).
#[cfg(target_arch = "x86_64")]
type BlockArgs<T> = (*const f32, usize, *const T, *mut f32, usize, usize);

/// `out[a * out_stride + j] = dot_f32(q_a, K_j)` bit for bit, for the queries
/// `q_a = q[a * hd..][..hd]` and the keys `j < n_keys` of the tiled K `kt` (one head,
/// tile 0 first; half floats widened exactly). `kt` must hold every tile that key
/// `n_keys - 1` lies in; lanes past `n_keys` are computed but not stored.
///
/// `v` (the same keys' V rows, `hd` apart, or empty) is only prefetched into L2 while
/// the scores are computed, so the weighted sum that follows finds it there instead of
/// streaming it from memory after the scores (KERNELS.md 79).
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

/// The portable kernel: one query and one tile at a time, in quarters: quarter `r < 4` holds the partials
/// `l = r, r + 4, r + 8, r + 12` (8 ymm on AVX2) and folds them to
/// `c_r = (p_r + p_{r+8}) + (p_{r+4} + p_{r+12})`; then `(c_0 + c_2) + (c_1 + c_3)`,
/// the additions of `dot_finish` in its tree order.
#[inline(always)]
fn canon_body<T: KvElem>(
    q: &[f32],
    hd: usize,
    kt: &[T],
    n_keys: usize,
    out: &mut [f32],
    stride: usize,
) {
    let full = hd - hd % 16;
    for t in 0..n_keys.div_ceil(TILE) {
        let tile = &kt[t * hd * TILE..(t + 1) * hd * TILE];
        let lanes = (n_keys - t * TILE).min(TILE);
        for (a, qa) in q.chunks_exact(hd).enumerate() {
            let mut quarter = [[0f32; TILE]; 4];
            for (r, cr) in quarter.iter_mut().enumerate() {
                // p[i] is partial l = r + 4 i.
                let mut p = [[0f32; TILE]; 4];
                for c in (0..full).step_by(16) {
                    for (i, p) in p.iter_mut().enumerate() {
                        let d = c + r + 4 * i;
                        let (x, row) = (qa[d], &tile[tile_row(d, hd) * TILE..][..TILE]);
                        for k in 0..TILE {
                            p[k] = x.mul_add(row[k].widen(), p[k]);
                        }
                    }
                }
                for k in 0..TILE {
                    cr[k] = (p[0][k] + p[2][k]) + (p[1][k] + p[3][k]);
                }
            }
            let mut s = [0f32; TILE];
            for k in 0..TILE {
                s[k] = (quarter[0][k] + quarter[2][k]) + (quarter[1][k] + quarter[3][k]);
            }
            for d in full..hd {
                let row = &tile[d * TILE..][..TILE];
                for k in 0..TILE {
                    s[k] = qa[d].mul_add(row[k].widen(), s[k]);
                }
            }
            out[a * stride + t * TILE..][..lanes].copy_from_slice(&s[..lanes]);
        }
    }
}

/// Queries per pass of the AVX-512 kernel over one tile: each tile-row load serves 4
/// queries with 16 accumulators live. The session-5 kernel (3 queries, even/odd halves,
/// 24 accumulators, one call per tile) took 0.085 ms for 56 queries x 1016 keys in L2,
/// this one 0.072; 5 queries were no faster, 6 slower (KERNELS.md "Session 7: attn").
#[cfg(target_arch = "x86_64")]
const QUERIES_PER_PASS: usize = 4;

/// Passes per tile from which the next tile is prefetched, a share of its rows before
/// each pass. From memory, 48 heads x 1016 keys, 56 queries: 3.76 -> 3.36 ms; in the
/// attention-only bench (1 thread) Qwen 0.5B/1.5B N=8 -6%/-9%, SmolLM2 (24-query items,
/// 6 passes) N=16 -4%. With 1-2 passes (N=1 items) the prefetches cost more than they
/// saved (0.25 -> 0.27 ms, head 128 0.22 -> 0.28), so they are left to the hardware there.
#[cfg(target_arch = "x86_64")]
const PREFETCH_MIN_PASSES: usize = 4;

/// Tile by tile (a 4 KB tile stays in L1 while every query passes over it), queries in
/// groups of [`QUERIES_PER_PASS`]; one call for the whole item, so no per-tile call
/// overhead or `vzeroupper`.
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
    // SAFETY: the contract above; each pass gets at most `QUERIES_PER_PASS` queries.
    unsafe {
        tile_passes(q, hd, kt, n_keys, out, stride, v, |qb, args| match qb {
            4 => canon_quarters_avx512::<T, 4>(args),
            3 => canon_quarters_avx512::<T, 3>(args),
            2 => canon_quarters_avx512::<T, 2>(args),
            _ => canon_quarters_avx512::<T, 1>(args),
        })
    }
}

/// The AVX2 form of [`scores_avx512`]: each pass runs a tile's two 8-key halves in turn
/// (16 ymm registers hold 4 partials for [`QUERIES_PER_PASS_AVX2`] queries, not for 4).
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
    // SAFETY: the contract above; each pass gets at most `QUERIES_PER_PASS` queries,
    // split here into runs of at most `QUERIES_PER_PASS_AVX2`.
    unsafe {
        tile_passes(q, hd, kt, n_keys, out, stride, v, |qb, args| {
            let (q, hd, tile, out, stride, lanes) = args;
            let mut a = 0;
            while a < qb {
                let n = (qb - a).min(QUERIES_PER_PASS_AVX2);
                let args = (q.add(a * hd), hd, tile, out.add(a * stride), stride, lanes);
                for half in 0..2 {
                    match n {
                        2 => canon_quarters_avx2::<T, 2>(args, half),
                        _ => canon_quarters_avx2::<T, 1>(args, half),
                    }
                }
                a += n;
            }
        })
    }
}

/// Queries per run of the AVX2 kernel over one tile half.
#[cfg(target_arch = "x86_64")]
const QUERIES_PER_PASS_AVX2: usize = 2;

/// Drives `pass(qb, args)` over every tile and every group of at most
/// [`QUERIES_PER_PASS`] queries, prefetching the next tile (and into L2 this tile's rows
/// of `v`) a share of its rows per pass when there are enough passes.
///
/// # Safety
/// As [`scores_avx512`] for the extents; `pass` must be safe to call on `qb` queries of
/// one tile with the given arguments.
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
    pass_fn: impl Fn(usize, BlockArgs<T>),
) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
    let n_q = q.len() / hd;
    let n_tiles = n_keys.div_ceil(TILE);
    let passes = n_q.div_ceil(QUERIES_PER_PASS);
    // 64-byte lines of the next tile prefetched per pass, when there are enough passes (a
    // tile row is one line in f32, half a line in f16); the same for this tile's V rows.
    let lines = (hd * TILE * std::mem::size_of::<T>()).div_ceil(64);
    let per_pass = if passes >= PREFETCH_MIN_PASSES {
        lines.div_ceil(passes)
    } else {
        0
    };
    let v_per_pass = if v.len() >= n_keys * hd { per_pass } else { 0 };
    for t in 0..n_tiles {
        let lanes = (n_keys - t * TILE).min(TILE);
        let next = kt.as_ptr().wrapping_add((t + 1) * hd * TILE).cast::<i8>();
        let v_tile = v.as_ptr().wrapping_add(t * TILE * hd).cast::<i8>();
        let mut a = 0;
        let mut pass = 0;
        while a < n_q {
            if t + 1 < n_tiles {
                for line in (pass * per_pass..(pass + 1) * per_pass).take_while(|&l| l < lines) {
                    // A hint: it cannot fault, whatever the address (hence `wrapping_add`).
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line * 64));
                }
            }
            for line in (pass * v_per_pass..(pass + 1) * v_per_pass).take_while(|&l| l < lines) {
                // A hint, as above (the last tile's rows may run past `v`).
                _mm_prefetch::<_MM_HINT_T1>(v_tile.wrapping_add(line * 64));
            }
            pass += 1;
            let qb = (n_q - a).min(QUERIES_PER_PASS);
            let args = (
                q[a * hd..].as_ptr(),
                hd,
                kt[t * hd * TILE..].as_ptr(),
                out[a * stride + t * TILE..].as_mut_ptr(),
                stride,
                lanes,
            );
            // (Queries a..a + qb, tile t and their output rows lie within the extents of
            // the caller's contract.)
            pass_fn(qb, args);
            a += qb;
        }
    }
}

/// The canonical order for `QB` queries sharing each tile-row load, one quarter of the
/// partials at a time: quarter `r` holds the partials `l = r, r + 4, r + 8, r + 12`
/// (4 accumulators per query) and folds them to `c_r = (p_r + p_{r+8}) + (p_{r+4} +
/// p_{r+12})`; the quarters run in the order 0, 2, 1, 3 so that `e_0 = c_0 + c_2` and
/// `e_1 = c_1 + c_3` form as soon as their halves exist, then `e_0 + e_1` and the tail
/// fused in order: exactly the additions of `dot_finish`'s fold tree, per lane.
///
/// # Safety
/// AVX-512F and FMA; `QB` query rows of `hd` at `q`, one tile at `tile`, `QB` output rows
/// at `stride` with `lanes` (1..=16) writable floats each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[inline]
unsafe fn canon_quarters_avx512<T: KvElem, const QB: usize>(args: BlockArgs<T>) {
    use std::arch::x86_64::*;
    let (q, hd, tile, out, stride, lanes) = args;
    let full = hd - hd % 16;
    let zero = _mm512_setzero_ps();
    // e0[a] = e_0 of query a; s[a]: c_1, then the whole score.
    let mut e0 = [zero; QB];
    let mut s = [zero; QB];
    // SAFETY (this block): reads stay in the QB query rows and the tile, stores in the
    // first `lanes` floats of each output row (contract above).
    unsafe {
        for (step, r) in QUARTER_ORDER.into_iter().enumerate() {
            // p[a][i]: partial l = r + 4 i of query a. The quarter's rows follow each
            // other in the tile (`tile_row`), read front to back.
            let rows = tile.add(step * (full / 4) * TILE);
            let mut p = [[zero; 4]; QB];
            let mut c = 0;
            while c < full {
                for i in 0..4 {
                    let d = c + r + 4 * i;
                    let k = row16(rows.add((c / 4 + i) * TILE));
                    for (a, p) in p.iter_mut().enumerate() {
                        p[i] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(a * hd + d)), k, p[i]);
                    }
                }
                c += 16;
            }
            for (a, p) in p.iter().enumerate() {
                let cr = _mm512_add_ps(_mm512_add_ps(p[0], p[2]), _mm512_add_ps(p[1], p[3]));
                match step {
                    0 => e0[a] = cr,
                    1 => e0[a] = _mm512_add_ps(e0[a], cr),
                    2 => s[a] = cr,
                    _ => s[a] = _mm512_add_ps(e0[a], _mm512_add_ps(s[a], cr)),
                }
            }
        }
        let mask: __mmask16 = if lanes >= TILE {
            0xFFFF
        } else {
            (1u16 << lanes) - 1
        };
        for (a, s) in s.iter_mut().enumerate() {
            for d in full..hd {
                let k = row16(tile.add(d * TILE));
                *s = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(a * hd + d)), k, *s);
            }
            _mm512_mask_storeu_ps(out.add(a * stride), mask, *s);
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

/// [`canon_quarters_avx512`] on one 8-key half (`half` 0 or 1) of a tile: the same
/// additions per lane in the same order.
///
/// # Safety
/// AVX2, FMA and F16C; `QB` query rows of `hd` at `q`, one tile at `tile`, `QB` output
/// rows at `stride` with `lanes` (1..=16) writable floats each.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn canon_quarters_avx2<T: KvElem, const QB: usize>(args: BlockArgs<T>, half: usize) {
    use std::arch::x86_64::*;
    let (q, hd, tile, out, stride, lanes) = args;
    let n = lanes.saturating_sub(8 * half).min(8);
    if n == 0 {
        return;
    }
    let full = hd - hd % 16;
    let zero = _mm256_setzero_ps();
    let mut e0 = [zero; QB];
    let mut s = [zero; QB];
    // SAFETY (this block): reads stay in the QB query rows and the tile (each row's
    // 16 floats, this half's 8), stores in the first `lanes` floats of each output row.
    unsafe {
        let tile = tile.add(8 * half);
        for (step, r) in QUARTER_ORDER.into_iter().enumerate() {
            let rows = tile.add(step * (full / 4) * TILE);
            let mut p = [[zero; 4]; QB];
            let mut c = 0;
            while c < full {
                for i in 0..4 {
                    let d = c + r + 4 * i;
                    let k = row8(rows.add((c / 4 + i) * TILE));
                    for (a, p) in p.iter_mut().enumerate() {
                        p[i] = _mm256_fmadd_ps(_mm256_set1_ps(*q.add(a * hd + d)), k, p[i]);
                    }
                }
                c += 16;
            }
            for (a, p) in p.iter().enumerate() {
                let cr = _mm256_add_ps(_mm256_add_ps(p[0], p[2]), _mm256_add_ps(p[1], p[3]));
                match step {
                    0 => e0[a] = cr,
                    1 => e0[a] = _mm256_add_ps(e0[a], cr),
                    2 => s[a] = cr,
                    _ => s[a] = _mm256_add_ps(e0[a], _mm256_add_ps(s[a], cr)),
                }
            }
        }
        // Lane i is stored when i < n (the mask's sign bits).
        let mask = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        for (a, s) in s.iter_mut().enumerate() {
            for d in full..hd {
                let k = row8(tile.add(d * TILE));
                *s = _mm256_fmadd_ps(_mm256_set1_ps(*q.add(a * hd + d)), k, *s);
            }
            _mm256_maskstore_ps(out.add(a * stride + 8 * half), mask, *s);
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

    /// The tile rows are a permutation of `0..hd` (no element lost or shared), and each
    /// quarter's rows follow each other in the order the AVX-512 kernel reads them.
    #[test]
    fn tile_rows_are_a_permutation_in_reading_order() {
        for hd in [13usize, 16, 24, 64, 80, 128] {
            let mut rows: Vec<usize> = (0..hd).map(|d| tile_row(d, hd)).collect();
            let full = hd - hd % 16;
            let mut read = Vec::new();
            for r in QUARTER_ORDER {
                for c in (0..full).step_by(16) {
                    read.extend((0..4).map(|i| tile_row(c + r + 4 * i, hd)));
                }
            }
            read.extend((full..hd).map(|d| tile_row(d, hd)));
            assert_eq!(read, (0..hd).collect::<Vec<_>>(), "hd={hd}");
            rows.sort_unstable();
            assert_eq!(rows, (0..hd).collect::<Vec<_>>(), "hd={hd}");
        }
    }

    /// Every ISA equals `dot_f32` (portable) on the keys as stored, bit for bit, for f32
    /// and half-float tiles, query counts 1..9 (whole passes of 4 and every remainder), key
    /// counts with partial tiles, head sizes 64 and 128 and ones with a tail; output
    /// outside `[0, n_keys)` of each row is left alone.
    #[test]
    fn tiled_scores_equal_dot_f32_on_every_isa() {
        tiled_scores_equal_dot_f32::<f32>();
        tiled_scores_equal_dot_f32::<half::f16>();
    }

    fn tiled_scores_equal_dot_f32<T: KvElem>() {
        use crate::kernels::vector::dot_f32_with_isa;
        let mut seed = 12;
        for (hd, n_q, n_keys) in [
            (64usize, 3usize, 37usize),
            (64, 7, 100),
            (24, 5, 70),
            (13, 2, 16),
            (64, 1, 1),
            (64, 4, 33),
            (128, 8, 50),
            // Enough passes per tile for the prefetches of K and V.
            (64, 20, 100),
        ] {
            let q = rnd(&mut seed, n_q * hd);
            let (kt, keys) = tile::<T>(&rnd(&mut seed, n_keys * hd), hd);
            let stride = n_keys + 3;
            let want: Vec<u32> = (0..n_q)
                .flat_map(|a| {
                    let qa = &q[a * hd..][..hd];
                    let row: Vec<u32> = (0..stride)
                        .map(|j| match j < n_keys {
                            true => {
                                dot_f32_with_isa(Isa::Portable, qa, &keys[j * hd..][..hd]).to_bits()
                            }
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
