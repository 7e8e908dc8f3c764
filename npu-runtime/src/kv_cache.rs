//! KV cache shared by every graph kind.
//!
//! Layout per layer: K and V as `[capacity][n_head_kv][head_dim]` IEEE binary16, one slot
//! per token position. Prefill graphs, decode graphs and tree verification all read and
//! write this one layout, so switching a block between graph kinds needs no relayout
//! (pitfall 8).
//!
//! f16 (as llama.cpp's default cache): decode at depth reads K/V of every committed slot
//! per token, so half the bytes is up to half that traffic. A row is rounded once, when
//! written (nearest, ties to even,
//! [`crate::kernels::vector::f32_to_f16`]); widening back to f32 is exact. So the
//! value a query sees depends only on the f32 row the graph computed, never on which graph,
//! batch or ISA wrote or reads it, and batch invariance holds as with f32. Costs
//! `2 * n_layer * kv_dim * 2` bytes per slot.
//!
//! Slots `[0, n_past)` are committed. A forward pass writes its new tokens' rows into the
//! scratch slots `n_past..n_past + n` without moving `n_past`; `commit` then keeps a chosen
//! subset (a tree path) by moving those rows to contiguous slots.

use crate::error::{Result, RuntimeError};
use crate::kernels::vector::f32_to_f16_slice;
use half::f16;

pub struct KvCache {
    n_layer: usize,
    kv_dim: usize,
    capacity: usize,
    n_past: usize,
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

impl KvCache {
    pub fn new(n_layer: usize, n_head_kv: usize, head_dim: usize, capacity: usize) -> Self {
        let kv_dim = n_head_kv * head_dim;
        KvCache {
            n_layer,
            kv_dim,
            capacity,
            n_past: 0,
            k: (0..n_layer)
                .map(|_| vec![f16::ZERO; capacity * kv_dim])
                .collect(),
            v: (0..n_layer)
                .map(|_| vec![f16::ZERO; capacity * kv_dim])
                .collect(),
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

    /// Values per slot per layer for K (and for V).
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        2 * self.n_layer * self.capacity * self.kv_dim * std::mem::size_of::<f16>()
    }

    /// Free slots after the committed prefix.
    pub fn free(&self) -> usize {
        self.capacity - self.n_past
    }

    /// Write one token's K and V rows of `layer` into `slot`, rounded to f16 (nearest,
    /// ties to even).
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        f32_to_f16_slice(k, &mut self.k[layer][slot * d..(slot + 1) * d]);
        f32_to_f16_slice(v, &mut self.v[layer][slot * d..(slot + 1) * d]);
    }

    /// Write one token's K and V rows given as little-endian f16 bytes (`2 * kv_dim`
    /// each, as an fp16 accelerator graph returns them): the bits are stored unchanged.
    pub fn write_f16_le(&mut self, layer: usize, slot: usize, k: &[u8], v: &[u8]) {
        let d = self.kv_dim;
        for (src, dst) in [(k, &mut self.k[layer]), (v, &mut self.v[layer])] {
            assert_eq!(src.len(), 2 * d, "write_f16_le: row is not kv_dim halves");
            for (o, b) in dst[slot * d..(slot + 1) * d]
                .iter_mut()
                .zip(src.chunks_exact(2))
            {
                *o = f16::from_le_bytes([b[0], b[1]]);
            }
        }
    }

    /// K and V of `layer`, slots `[0, n_slots)`.
    pub fn layer(&self, layer: usize, n_slots: usize) -> (&[f16], &[f16]) {
        let n = n_slots * self.kv_dim;
        (&self.k[layer][..n], &self.v[layer][..n])
    }

    /// One slot's K row of a layer (tests and debugging).
    pub fn k_row(&self, layer: usize, slot: usize) -> &[f16] {
        &self.k[layer][slot * self.kv_dim..(slot + 1) * self.kv_dim]
    }

    /// One slot's V row of a layer.
    pub fn v_row(&self, layer: usize, slot: usize) -> &[f16] {
        &self.v[layer][slot * self.kv_dim..(slot + 1) * self.kv_dim]
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
        let d = self.kv_dim;
        let base = self.n_past;
        for layer in 0..self.n_layer {
            for (i, &p) in path.iter().enumerate() {
                // p >= i because the path is strictly increasing, so moving in ascending
                // order never overwrites a row that is still to be moved.
                if p != i {
                    let src = (base + p) * d;
                    let dst = (base + i) * d;
                    self.k[layer].copy_within(src..src + d, dst);
                    self.v[layer].copy_within(src..src + d, dst);
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

/// `src` as little-endian f16 bytes into `dst` (`2 * src.len()` bytes): staging K/V for an
/// fp16 accelerator graph is a copy of the stored bits.
pub fn f16_to_le_bytes(src: &[f16], dst: &mut [u8]) {
    assert_eq!(dst.len(), 2 * src.len(), "f16_to_le_bytes: length mismatch");
    for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(tag: f32, d: usize) -> Vec<f32> {
        (0..d).map(|i| tag * 100.0 + i as f32).collect()
    }

    fn widened(r: &[f16]) -> Vec<f32> {
        r.iter().map(|h| h.to_f32()).collect()
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
        for l in 0..2 {
            assert_eq!(widened(kv.k_row(l, 2)), row(2.0, d).as_slice());
            assert_eq!(widened(kv.k_row(l, 3)), row(10.0, d).as_slice());
            assert_eq!(widened(kv.k_row(l, 4)), row(12.0, d).as_slice());
            assert_eq!(widened(kv.k_row(l, 5)), row(15.0, d).as_slice());
            assert_eq!(widened(kv.v_row(l, 5)), row(-15.0, d).as_slice());
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

    #[test]
    fn rows_are_rounded_to_f16_on_write_and_f16_bytes_round_trip() {
        let mut kv = KvCache::new(1, 1, 4, 3);
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even (1) wins; 65520 overflows.
        let k = [1.0 + 2f32.powi(-11), 65520.0, 1e-8, -0.1];
        kv.write(0, 1, &k, &[0.5; 4]);
        let want: Vec<u16> = k.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        let got: Vec<u16> = kv.k_row(0, 1).iter().map(|h| h.to_bits()).collect();
        assert_eq!(got, want);
        assert_eq!(got[0], 0x3C00);
        assert_eq!(got[1], 0x7C00);
        let mut kb = [0u8; 8];
        let mut vb = [0u8; 8];
        f16_to_le_bytes(kv.k_row(0, 1), &mut kb);
        f16_to_le_bytes(kv.v_row(0, 1), &mut vb);
        kv.write_f16_le(0, 2, &kb, &vb);
        assert_eq!(kv.k_row(0, 2), kv.k_row(0, 1));
        assert_eq!(kv.v_row(0, 2), kv.v_row(0, 1));
        assert_eq!(kv.bytes(), 2 * 3 * 4 * 2);
    }
}
