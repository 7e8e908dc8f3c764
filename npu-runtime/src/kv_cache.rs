//! KV cache shared by every graph kind.
//!
//! Per layer: V per KV head, `[n_head_kv][capacity][head_dim]` (one head's rows contiguous,
//! so the attention's weighted sum streams them; row-major `[slot][n_head_kv][head_dim]` made
//! it read 512-byte pieces 1 KB apart for Qwen 1.5B and cost 2.4x the score pass),
//! and K transposed in tiles of 16 slots per KV head:
//! `[n_head_kv][slot / 16][tile_row(d)][slot % 16]` (see `kernels::attn_tiles`), so the
//! CPU attention scores one query against 16 keys as the 16 lanes of broadcast-FMAs over
//! `d`, with no horizontal fold, and one head's keys are contiguous. Readers that need
//! rows (QNN staging, the prefill output, tests) copy them out with
//! [`KvCache::k_rows_into`] and [`KvCache::v_rows_into`]; K is stored once (a row-major
//! copy beside the tiles cost 50% more KV memory).
//! Prefill graphs, decode graphs and tree verification all read and write this one
//! layout, so switching a block between graph kinds needs no relayout (pitfall 8).
//! f32 keeps cached values exactly what the producing graph computed, which the
//! graph-equivalence and tree tests rely on; it costs about `2 * n_layer * kv_dim * 4`
//! bytes per slot (K's last tile is padded to 16 slots).
//!
//! Slots `[0, n_past)` are committed. A forward pass writes its new tokens' rows into the
//! scratch slots `n_past..n_past + n` without moving `n_past`; `commit` then keeps a chosen
//! subset (a tree path) by moving those rows to contiguous slots.

use crate::error::{Result, RuntimeError};
use crate::kernels::attn_tiles::{tiled_index, TILE};

pub struct KvCache {
    n_layer: usize,
    kv_dim: usize,
    head_dim: usize,
    capacity: usize,
    n_past: usize,
    /// Per layer: `[n_head_kv][capacity][head_dim]`.
    v: Vec<Vec<f32>>,
    /// Per layer: `[n_head_kv][capacity / 16 rounded up][head_dim][16]` (rows by `tile_row`).
    k_tiles: Vec<Vec<f32>>,
}

/// One layer as the CPU attention reads it: tiled K (KV head `g` starts at
/// `g * head_stride`) and V per KV head (head `g`'s rows, `head_dim` apart, start at
/// `g * v_head_stride`).
#[derive(Clone, Copy)]
pub struct KvLayerView<'a> {
    pub k_tiles: &'a [f32],
    pub head_stride: usize,
    pub v: &'a [f32],
    pub v_head_stride: usize,
}

impl KvCache {
    pub fn new(n_layer: usize, n_head_kv: usize, head_dim: usize, capacity: usize) -> Self {
        let kv_dim = n_head_kv * head_dim;
        let tiled = capacity.div_ceil(TILE) * TILE * kv_dim;
        KvCache {
            n_layer,
            kv_dim,
            head_dim,
            capacity,
            n_past: 0,
            v: (0..n_layer).map(|_| vec![0.0; capacity * kv_dim]).collect(),
            k_tiles: (0..n_layer).map(|_| vec![0.0; tiled]).collect(),
        }
    }

    /// Floats per KV head in a layer's tiled K.
    fn head_stride(&self) -> usize {
        self.capacity.div_ceil(TILE) * TILE * self.head_dim
    }

    /// Copy one slot's K row into the tiled K of `layer`.
    fn write_tiled(&mut self, layer: usize, slot: usize, k: &[f32]) {
        let (hd, hs) = (self.head_dim, self.head_stride());
        let tiles = &mut self.k_tiles[layer];
        for (g, row) in k.chunks_exact(hd).enumerate() {
            let head = &mut tiles[g * hs..(g + 1) * hs];
            for (d, &x) in row.iter().enumerate() {
                head[tiled_index(slot, d, hd)] = x;
            }
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn n_past(&self) -> usize {
        self.n_past
    }

    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    /// Floats per slot per layer for K (and for V).
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        let tiled: usize = self.k_tiles.iter().map(Vec::len).sum();
        (self.n_layer * self.capacity * self.kv_dim + tiled) * std::mem::size_of::<f32>()
    }

    /// Free slots after the committed prefix.
    pub fn free(&self) -> usize {
        self.capacity - self.n_past
    }

    /// Floats per KV head in a layer's V.
    fn v_head_stride(&self) -> usize {
        self.capacity * self.head_dim
    }

    /// Write one token's K and V rows (`[n_head_kv][head_dim]`) of `layer` into `slot`.
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let (hd, vs) = (self.head_dim, self.v_head_stride());
        assert_eq!(v.len(), self.kv_dim, "KvCache::write: one V row");
        for (g, row) in v.chunks_exact(hd).enumerate() {
            self.v[layer][g * vs + slot * hd..][..hd].copy_from_slice(row);
        }
        self.write_tiled(layer, slot, k);
    }

    /// `layer` for the CPU attention (all slots; the caller bounds what it reads).
    pub fn layer_view(&self, layer: usize) -> KvLayerView<'_> {
        KvLayerView {
            k_tiles: &self.k_tiles[layer],
            head_stride: self.head_stride(),
            v: &self.v[layer],
            v_head_stride: self.v_head_stride(),
        }
    }

    /// Rows in `len` floats from slot `first`; panics unless they are whole rows within
    /// the capacity (a caller's bug, not user input).
    fn whole_rows(&self, what: &str, first: usize, len: usize) -> usize {
        let n = len / self.kv_dim;
        assert!(
            n * self.kv_dim == len && first + n <= self.capacity,
            "{what}: {len} floats from slot {first} are not whole rows within {} slots",
            self.capacity
        );
        n
    }

    /// K rows of `layer` for the slots `first..first + out.len() / kv_dim`, copied out of
    /// the tiles into `out` as `[slot][n_head_kv][head_dim]` (the same floats `write` got).
    pub fn k_rows_into(&self, layer: usize, first: usize, out: &mut [f32]) {
        let (d, hd, hs) = (self.kv_dim, self.head_dim, self.head_stride());
        let n = self.whole_rows("k_rows_into", first, out.len());
        let tiles = &self.k_tiles[layer];
        for g in 0..d / hd {
            let head = &tiles[g * hs..(g + 1) * hs];
            // Tile by tile, element-major: the tile is read in order, 16 rows written.
            let mut s0 = first;
            while s0 < first + n {
                let s1 = (s0 / TILE + 1) * TILE;
                let s1 = s1.min(first + n);
                for e in 0..hd {
                    let src = &head[tiled_index(s0, e, hd)..][..s1 - s0];
                    for (i, &x) in src.iter().enumerate() {
                        out[(s0 - first + i) * d + g * hd + e] = x;
                    }
                }
                s0 = s1;
            }
        }
    }

    /// K rows of `layer`, slots `[0, n_slots)`, as a new buffer (outputs and tests; the
    /// forward paths use [`Self::k_rows_into`] with a preplanned buffer).
    pub fn k_rows(&self, layer: usize, n_slots: usize) -> Vec<f32> {
        let mut out = vec![0.0; n_slots * self.kv_dim];
        self.k_rows_into(layer, 0, &mut out);
        out
    }

    /// V rows of `layer` for the slots `first..first + out.len() / kv_dim`, copied into
    /// `out` as `[slot][n_head_kv][head_dim]` (the rows `write` got).
    pub fn v_rows_into(&self, layer: usize, first: usize, out: &mut [f32]) {
        let (d, hd, vs) = (self.kv_dim, self.head_dim, self.v_head_stride());
        self.whole_rows("v_rows_into", first, out.len());
        let v = &self.v[layer];
        for (i, row) in out.chunks_exact_mut(d).enumerate() {
            for (g, dst) in row.chunks_exact_mut(hd).enumerate() {
                dst.copy_from_slice(&v[g * vs + (first + i) * hd..][..hd]);
            }
        }
    }

    /// V rows of `layer`, slots `[0, n_slots)`, as a new buffer (outputs and tests).
    pub fn v_rows(&self, layer: usize, n_slots: usize) -> Vec<f32> {
        let mut out = vec![0.0; n_slots * self.kv_dim];
        self.v_rows_into(layer, 0, &mut out);
        out
    }

    /// One slot's K row of a layer (tests and debugging).
    pub fn k_row(&self, layer: usize, slot: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.kv_dim];
        self.k_rows_into(layer, slot, &mut out);
        out
    }

    /// One slot's V row of a layer (tests and debugging).
    pub fn v_row(&self, layer: usize, slot: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.kv_dim];
        self.v_rows_into(layer, slot, &mut out);
        out
    }

    /// Commit `n` scratch slots that are already in place (plain causal runs).
    pub fn advance(&mut self, n: usize) -> Result<()> {
        if n > self.free() {
            return Err(RuntimeError::Capacity(format!(
                "cannot commit {n} tokens: {} of {} KV slots used",
                self.n_past, self.capacity
            )));
        }
        self.n_past += n;
        Ok(())
    }

    /// Keep the scratch rows `n_past + path[i]` as slots `n_past + i` and commit them.
    /// `path` must be strictly increasing (a root-to-leaf path of a BFS/parent-before-child
    /// ordered batch) and index rows written by the last forward (`< n_written`).
    pub fn compact(&mut self, path: &[usize], n_written: usize) -> Result<()> {
        for (i, &p) in path.iter().enumerate() {
            if p >= n_written {
                return Err(RuntimeError::InvalidInput(format!(
                    "path index {p} outside the last batch of {n_written} tokens"
                )));
            }
            if i > 0 && p <= path[i - 1] {
                return Err(RuntimeError::InvalidInput(format!(
                    "path must be strictly increasing (got {} then {p})",
                    path[i - 1]
                )));
            }
        }
        if path.len() > self.free() {
            return Err(RuntimeError::Capacity(
                "path longer than free KV slots".into(),
            ));
        }
        let base = self.n_past;
        let (hd, hs, vs) = (self.head_dim, self.head_stride(), self.v_head_stride());
        for layer in 0..self.n_layer {
            for (i, &p) in path.iter().enumerate() {
                // p >= i because the path is strictly increasing, so moving in ascending
                // order never overwrites a row that is still to be moved.
                if p != i {
                    for g in 0..self.kv_dim / hd {
                        let src = g * vs + (base + p) * hd;
                        self.v[layer].copy_within(src..src + hd, g * vs + (base + i) * hd);
                        let head = &mut self.k_tiles[layer][g * hs..(g + 1) * hs];
                        for e in 0..hd {
                            head[tiled_index(base + i, e, hd)] = head[tiled_index(base + p, e, hd)];
                        }
                    }
                }
            }
        }
        self.n_past += path.len();
        Ok(())
    }

    /// Roll back to `n` committed tokens (`n <= n_past`).
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.n_past {
            return Err(RuntimeError::InvalidInput(format!(
                "cannot truncate to {n}: only {} tokens committed",
                self.n_past
            )));
        }
        self.n_past = n;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tag: f32, d: usize) -> Vec<f32> {
        (0..d).map(|i| tag * 100.0 + i as f32).collect()
    }

    #[test]
    fn compact_moves_path_rows_to_contiguous_slots() {
        let d = 4;
        let mut kv = KvCache::new(2, 2, 2, 16);
        for s in 0..3 {
            for l in 0..2 {
                kv.write(l, s, &row(s as f32, d), &row(-(s as f32), d));
            }
        }
        kv.advance(3).unwrap();
        // batch of 6 scratch rows at slots 3..9
        for j in 0..6 {
            for l in 0..2 {
                kv.write(
                    l,
                    3 + j,
                    &row(10.0 + j as f32, d),
                    &row(-10.0 - j as f32, d),
                );
            }
        }
        kv.compact(&[0, 2, 5], 6).unwrap();
        assert_eq!(kv.n_past(), 6);
        let tags = [0.0, 1.0, 2.0, 10.0, 12.0, 15.0];
        for l in 0..2 {
            for (s, &tag) in tags.iter().enumerate() {
                assert_eq!(kv.k_row(l, s), row(tag, d), "K layer {l} slot {s}");
                assert_eq!(kv.v_row(l, s), row(-tag, d), "V layer {l} slot {s}");
            }
            // The tiles the attention reads hold the same rows (head g, element e of slot s).
            let view = kv.layer_view(l);
            for (s, &tag) in tags.iter().enumerate() {
                for (x, want) in row(tag, d).into_iter().enumerate() {
                    let (g, e) = (x / 2, x % 2);
                    let got = view.k_tiles[g * view.head_stride + tiled_index(s, e, 2)];
                    assert_eq!(got, want, "layer {l} slot {s} element {x}");
                }
            }
        }
    }

    #[test]
    fn k_and_v_rows_into_return_the_written_rows_for_any_slot_range() {
        // Capacity not a multiple of 16, 3 KV heads of 5: ranges start and end inside
        // tiles, span several tiles, and reach the padded last tile.
        let (n_layer, n_head_kv, hd, cap) = (2, 3, 5, 37);
        let d = n_head_kv * hd;
        let mut kv = KvCache::new(n_layer, n_head_kv, hd, cap);
        let mut seed = 0x2545_f491_u32;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 - 0.5
        };
        let rows: Vec<Vec<f32>> = (0..n_layer * cap)
            .map(|_| (0..d).map(|_| rnd()).collect())
            .collect();
        for l in 0..n_layer {
            for s in 0..cap {
                let v: Vec<f32> = rows[l * cap + s].iter().map(|x| -x).collect();
                kv.write(l, s, &rows[l * cap + s], &v);
            }
        }
        let mut out = vec![f32::NAN; cap * d];
        for l in 0..n_layer {
            for first in 0..cap {
                for n in 0..=cap - first {
                    let out = &mut out[..n * d];
                    out.fill(f32::NAN);
                    kv.k_rows_into(l, first, out);
                    for (i, got) in out.chunks_exact(d).enumerate() {
                        assert_eq!(
                            got,
                            rows[l * cap + first + i],
                            "layer {l} slot {}",
                            first + i
                        );
                    }
                    out.fill(f32::NAN);
                    kv.v_rows_into(l, first, out);
                    for (i, got) in out.chunks_exact(d).enumerate() {
                        let want: Vec<f32> = rows[l * cap + first + i].iter().map(|x| -x).collect();
                        assert_eq!(got, want, "V layer {l} slot {}", first + i);
                    }
                }
            }
            let all = kv.k_rows(l, cap);
            assert_eq!(all, rows[l * cap..(l + 1) * cap].concat());
        }
    }

    #[test]
    fn bad_paths_and_rollback_are_errors_not_panics() {
        let mut kv = KvCache::new(1, 1, 2, 4);
        assert!(kv.compact(&[1, 0], 2).is_err());
        assert!(kv.compact(&[0, 0], 2).is_err());
        assert!(kv.compact(&[3], 2).is_err());
        assert!(kv.advance(5).is_err());
        kv.advance(3).unwrap();
        assert!(kv.compact(&[0, 1], 2).is_err()); // only one free slot
        assert!(kv.truncate(4).is_err());
        kv.truncate(1).unwrap();
        assert_eq!(kv.n_past(), 1);
        assert_eq!(kv.free(), 3);
    }
}
