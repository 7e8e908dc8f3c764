//! KV cache shared by every graph kind.
//!
//! Per layer: V per KV head, `[n_head_kv][capacity][head_dim]` (one head's rows contiguous,
//! so the attention's weighted sum streams them; row-major `[slot][n_head_kv][head_dim]` made
//! it read 512-byte pieces 1 KB apart for Qwen 1.5B and cost 2.4x the score pass),
//! and K transposed in tiles of 16 slots per KV head:
//! `[n_head_kv][slot / 16][d][slot % 16]` (see `kernels::attn_tiles`), so the
//! CPU attention scores one query against 16 keys as the 16 lanes of broadcast-FMAs over
//! `d`, with no horizontal fold, and one head's keys are contiguous. Readers that need
//! rows (QNN staging, the prefill output, tests) copy them out with
//! [`KvCache::k_rows_into`] and [`KvCache::v_rows_into`]; K is stored once (a row-major
//! copy beside the tiles cost 50% more KV memory).
//! Prefill graphs, decode graphs and tree verification all read and write this one
//! layout, so switching a block between graph kinds needs no relayout (pitfall 8).
//!
//! Precision ([`KvPrecision`]): f32 by default, so cached values are exactly what the
//! forward computed (the golden tests' exact-match cases rely on it); or IEEE half, as
//! llama.cpp's default cache and the HTP graphs (f16 tensors) hold them: half the memory
//! and half the bytes the attention streams per token (at depth 1000 in f32: 46 MB per
//! step for SmolLM2, a third of its weights). Either way every forward reads its own new
//! rows back from the cache after writing them, so all graph kinds and batch shapes see
//! the same values and stay bit-identical to each other. About
//! `2 * n_layer * kv_dim * (4 or 2)` bytes per slot (K's last tile is padded to 16 slots).
//!
//! Slots `[0, n_past)` are committed. A forward pass writes its new tokens' rows into the
//! scratch slots `n_past..n_past + n` without moving `n_past`; `commit` then keeps a chosen
//! subset (a tree path) by moving those rows to contiguous slots.

use crate::error::{Result, RuntimeError};
use crate::kernels::attn_tiles::{tiled_index, TILE};
pub use crate::kernels::kv_elem::KvElem;
use half::f16;

/// How the cache stores K and V.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvPrecision {
    /// Exactly the f32 values the forward computed.
    #[default]
    F32,
    /// IEEE half floats ([`KvElem::narrow`] for `f16`): half the memory and the attention's
    /// bytes per token, llama.cpp's default cache type.
    F16,
}

impl KvPrecision {
    /// `f32` or `f16` (any case).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" => Some(KvPrecision::F32),
            "f16" => Some(KvPrecision::F16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
        }
    }

    /// Bytes per stored K or V value.
    pub fn bytes_per_value(self) -> usize {
        match self {
            KvPrecision::F32 => 4,
            KvPrecision::F16 => 2,
        }
    }
}

/// One layer as the CPU attention reads it: tiled K (KV head `g` starts at
/// `g * head_stride`) and V per KV head (head `g`'s rows, `head_dim` apart, start at
/// `g * v_head_stride`), in the cache's element type.
#[derive(Clone, Copy)]
pub struct KvLayer<'a, T> {
    pub k_tiles: &'a [T],
    pub head_stride: usize,
    pub v: &'a [T],
    pub v_head_stride: usize,
}

/// A layer in whichever precision the cache holds.
#[derive(Clone, Copy)]
pub enum KvLayerView<'a> {
    F32(KvLayer<'a, f32>),
    F16(KvLayer<'a, f16>),
}

/// Index arithmetic shared by the storage of both element types.
#[derive(Clone, Copy)]
struct Geom {
    kv_dim: usize,
    head_dim: usize,
    /// Elements per KV head in a layer's tiled K.
    head_stride: usize,
    /// Elements per KV head in a layer's V.
    v_head_stride: usize,
}

/// Every layer's V and tiled K in one element type.
struct Layers<T> {
    v: Vec<Vec<T>>,
    k_tiles: Vec<Vec<T>>,
}

impl<T: KvElem> Layers<T> {
    fn new(n_layer: usize, v_len: usize, k_len: usize) -> Self {
        Layers {
            v: (0..n_layer).map(|_| T::zeros(v_len)).collect(),
            k_tiles: (0..n_layer).map(|_| T::zeros(k_len)).collect(),
        }
    }

    fn bytes(&self) -> usize {
        let n: usize = self.v.iter().chain(&self.k_tiles).map(Vec::len).sum();
        n * std::mem::size_of::<T>()
    }

    fn view(&self, layer: usize, g: Geom) -> KvLayer<'_, T> {
        KvLayer {
            k_tiles: &self.k_tiles[layer],
            head_stride: g.head_stride,
            v: &self.v[layer],
            v_head_stride: g.v_head_stride,
        }
    }

    fn write(&mut self, g: Geom, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let hd = g.head_dim;
        for (h, row) in v.chunks_exact(hd).enumerate() {
            let dst = &mut self.v[layer][h * g.v_head_stride + slot * hd..][..hd];
            for (d, &x) in dst.iter_mut().zip(row) {
                *d = T::narrow(x);
            }
        }
        let tiles = &mut self.k_tiles[layer];
        for (h, row) in k.chunks_exact(hd).enumerate() {
            let head = &mut tiles[h * g.head_stride..(h + 1) * g.head_stride];
            for (d, &x) in row.iter().enumerate() {
                head[tiled_index(slot, d, hd)] = T::narrow(x);
            }
        }
    }

    fn k_rows_into(&self, g: Geom, layer: usize, first: usize, n: usize, out: &mut [f32]) {
        let (d, hd, hs) = (g.kv_dim, g.head_dim, g.head_stride);
        let tiles = &self.k_tiles[layer];
        for h in 0..d / hd {
            let head = &tiles[h * hs..(h + 1) * hs];
            // Tile by tile, element-major: the tile is read in order, 16 rows written.
            let mut s0 = first;
            while s0 < first + n {
                let s1 = (s0 / TILE + 1) * TILE;
                let s1 = s1.min(first + n);
                for e in 0..hd {
                    let src = &head[tiled_index(s0, e, hd)..][..s1 - s0];
                    for (i, &x) in src.iter().enumerate() {
                        out[(s0 - first + i) * d + h * hd + e] = x.widen();
                    }
                }
                s0 = s1;
            }
        }
    }

    fn v_rows_into(&self, g: Geom, layer: usize, first: usize, out: &mut [f32]) {
        let (d, hd, vs) = (g.kv_dim, g.head_dim, g.v_head_stride);
        let v = &self.v[layer];
        for (i, row) in out.chunks_exact_mut(d).enumerate() {
            for (h, dst) in row.chunks_exact_mut(hd).enumerate() {
                let src = &v[h * vs + (first + i) * hd..][..hd];
                for (o, &x) in dst.iter_mut().zip(src) {
                    *o = x.widen();
                }
            }
        }
    }

    /// Copy slot `from`'s K and V rows of every layer to slot `to`.
    fn move_slot(&mut self, g: Geom, from: usize, to: usize) {
        let (hd, hs, vs) = (g.head_dim, g.head_stride, g.v_head_stride);
        for (v, tiles) in self.v.iter_mut().zip(&mut self.k_tiles) {
            for h in 0..g.kv_dim / hd {
                let src = h * vs + from * hd;
                v.copy_within(src..src + hd, h * vs + to * hd);
                let head = &mut tiles[h * hs..(h + 1) * hs];
                for e in 0..hd {
                    head[tiled_index(to, e, hd)] = head[tiled_index(from, e, hd)];
                }
            }
        }
    }
}

enum Store {
    F32(Layers<f32>),
    F16(Layers<f16>),
}

/// Runs `$body` with `$l` bound to the storage, whatever its element type.
macro_rules! with_layers {
    ($store:expr, $l:ident => $body:expr) => {
        match $store {
            Store::F32($l) => $body,
            Store::F16($l) => $body,
        }
    };
}

pub struct KvCache {
    n_layer: usize,
    kv_dim: usize,
    head_dim: usize,
    capacity: usize,
    n_past: usize,
    precision: KvPrecision,
    store: Store,
}

impl KvCache {
    /// An f32 cache.
    pub fn new(n_layer: usize, n_head_kv: usize, head_dim: usize, capacity: usize) -> Self {
        Self::with_precision(n_layer, n_head_kv, head_dim, capacity, KvPrecision::F32)
    }

    pub fn with_precision(
        n_layer: usize,
        n_head_kv: usize,
        head_dim: usize,
        capacity: usize,
        precision: KvPrecision,
    ) -> Self {
        let kv_dim = n_head_kv * head_dim;
        let (v_len, k_len) = (capacity * kv_dim, capacity.div_ceil(TILE) * TILE * kv_dim);
        let store = match precision {
            KvPrecision::F32 => Store::F32(Layers::new(n_layer, v_len, k_len)),
            KvPrecision::F16 => Store::F16(Layers::new(n_layer, v_len, k_len)),
        };
        KvCache {
            n_layer,
            kv_dim,
            head_dim,
            capacity,
            n_past: 0,
            precision,
            store,
        }
    }

    fn geom(&self) -> Geom {
        Geom {
            kv_dim: self.kv_dim,
            head_dim: self.head_dim,
            head_stride: self.capacity.div_ceil(TILE) * TILE * self.head_dim,
            v_head_stride: self.capacity * self.head_dim,
        }
    }

    pub fn precision(&self) -> KvPrecision {
        self.precision
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
        with_layers!(&self.store, l => l.bytes())
    }

    /// Free slots after the committed prefix.
    pub fn free(&self) -> usize {
        self.capacity - self.n_past
    }

    /// Write one token's K and V rows (`[n_head_kv][head_dim]`) of `layer` into `slot`
    /// (as the cache's precision stores them).
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        assert_eq!(v.len(), self.kv_dim, "KvCache::write: one V row");
        assert_eq!(k.len(), self.kv_dim, "KvCache::write: one K row");
        let g = self.geom();
        with_layers!(&mut self.store, l => l.write(g, layer, slot, k, v))
    }

    /// `layer` for the CPU attention (all slots; the caller bounds what it reads).
    pub fn layer_view(&self, layer: usize) -> KvLayerView<'_> {
        let g = self.geom();
        match &self.store {
            Store::F32(l) => KvLayerView::F32(l.view(layer, g)),
            Store::F16(l) => KvLayerView::F16(l.view(layer, g)),
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
    /// the tiles into `out` as `[slot][n_head_kv][head_dim]` (the floats `write` got, as
    /// stored).
    pub fn k_rows_into(&self, layer: usize, first: usize, out: &mut [f32]) {
        let n = self.whole_rows("k_rows_into", first, out.len());
        let g = self.geom();
        with_layers!(&self.store, l => l.k_rows_into(g, layer, first, n, out))
    }

    /// K rows of `layer`, slots `[0, n_slots)`, as a new buffer (outputs and tests; the
    /// forward paths use [`Self::k_rows_into`] with a preplanned buffer).
    pub fn k_rows(&self, layer: usize, n_slots: usize) -> Vec<f32> {
        let mut out = vec![0.0; n_slots * self.kv_dim];
        self.k_rows_into(layer, 0, &mut out);
        out
    }

    /// V rows of `layer` for the slots `first..first + out.len() / kv_dim`, copied into
    /// `out` as `[slot][n_head_kv][head_dim]` (the rows `write` got, as stored).
    pub fn v_rows_into(&self, layer: usize, first: usize, out: &mut [f32]) {
        self.whole_rows("v_rows_into", first, out.len());
        let g = self.geom();
        with_layers!(&self.store, l => l.v_rows_into(g, layer, first, out))
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
        let (base, g) = (self.n_past, self.geom());
        for (i, &p) in path.iter().enumerate() {
            // p >= i because the path is strictly increasing, so moving in ascending
            // order never overwrites a row that is still to be moved.
            if p != i {
                with_layers!(&mut self.store, l => l.move_slot(g, base + p, base + i));
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

    const BOTH: [KvPrecision; 2] = [KvPrecision::F32, KvPrecision::F16];

    /// `x` as a cache of `precision` stores it.
    fn stored(precision: KvPrecision, x: f32) -> f32 {
        match precision {
            KvPrecision::F32 => x,
            KvPrecision::F16 => f16::narrow(x).widen(),
        }
    }

    #[test]
    fn compact_moves_path_rows_to_contiguous_slots() {
        for p in BOTH {
            compact_moves_path_rows(p);
        }
    }

    fn compact_moves_path_rows(precision: KvPrecision) {
        let d = 4;
        let mut kv = KvCache::with_precision(2, 2, 2, 16, precision);
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
            let at = |s: usize, x: usize| {
                let (g, e) = (x / 2, x % 2);
                match kv.layer_view(l) {
                    KvLayerView::F32(v) => v.k_tiles[g * v.head_stride + tiled_index(s, e, 2)],
                    KvLayerView::F16(v) => {
                        v.k_tiles[g * v.head_stride + tiled_index(s, e, 2)].widen()
                    }
                }
            };
            for (s, &tag) in tags.iter().enumerate() {
                for (x, want) in row(tag, d).into_iter().enumerate() {
                    assert_eq!(at(s, x), want, "layer {l} slot {s} element {x}");
                }
            }
        }
    }

    #[test]
    fn k_and_v_rows_into_return_the_written_rows_for_any_slot_range() {
        for p in BOTH {
            rows_into_return_the_written_rows(p);
        }
    }

    fn rows_into_return_the_written_rows(precision: KvPrecision) {
        // Capacity not a multiple of 16, 3 KV heads of 5: ranges start and end inside
        // tiles, span several tiles, and reach the padded last tile.
        let (n_layer, n_head_kv, hd, cap) = (2, 3, 5, 37);
        let d = n_head_kv * hd;
        let mut kv = KvCache::with_precision(n_layer, n_head_kv, hd, cap, precision);
        let mut seed = 0x2545_f491_u32;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as f32 / u32::MAX as f32 - 0.5
        };
        // Values the cache holds exactly come back as they were written.
        let rows: Vec<Vec<f32>> = (0..n_layer * cap)
            .map(|_| (0..d).map(|_| stored(precision, rnd())).collect())
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

    /// f16: writes round to nearest even (ties included), saturate beyond the half range,
    /// keep signed zeros, subnormals and NaN; reads widen exactly. f32 keeps every value.
    #[test]
    fn stored_values_are_rounded_half_floats() {
        let round_as_cached = |x: f32| stored(KvPrecision::F16, x);
        // 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10): ties to even (1).
        let cases: [(f32, f32); 9] = [
            (1.0, 1.0),
            (1.0 + 2f32.powi(-11), 1.0),
            (1.0 + 3.0 * 2f32.powi(-11), 1.0 + 2.0 * 2f32.powi(-10)),
            (-2.5, -2.5),
            (1e6, 65504.0),
            (-1e6, -65504.0),
            (f32::INFINITY, 65504.0),
            (2f32.powi(-24), 2f32.powi(-24)),
            (2f32.powi(-26), 0.0),
        ];
        for (x, want) in cases {
            assert_eq!(round_as_cached(x), want, "{x}");
        }
        assert!(round_as_cached(f32::NAN).is_nan());
        assert_eq!(round_as_cached(-0.0).to_bits(), (-0.0f32).to_bits());
        let k = [0.1f32, -7.3, 1e6, 3.0];
        let v = [2.0f32.powi(-20), 0.5, -65519.0, 1.0 / 3.0];
        for precision in BOTH {
            let mut kv = KvCache::with_precision(1, 1, 4, 3, precision);
            kv.write(0, 2, &k, &v);
            let r = |x: &[f32]| x.iter().map(|&x| stored(precision, x)).collect::<Vec<_>>();
            assert_eq!(kv.k_row(0, 2), r(&k));
            assert_eq!(kv.v_row(0, 2), r(&v));
            // V: 3 slots x 4; K: one padded tile of 16 slots x 4.
            assert_eq!(kv.bytes(), (3 * 4 + 16 * 4) * precision.bytes_per_value());
        }
        assert_eq!(KvPrecision::parse("F16"), Some(KvPrecision::F16));
        assert_eq!(
            KvPrecision::parse(KvPrecision::F32.name()),
            Some(KvPrecision::F32)
        );
        assert_eq!(KvPrecision::parse("q8"), None);
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
