//! Static-shape block-graph IR.
//!
//! A model is cut into *blocks* of consecutive transformer layers. A *graph* is one block
//! compiled for one fixed shape: `tokens` new tokens (T) against a KV cache of fixed
//! `kv_capacity`. Static-graph accelerators (NPUs) can only run such fixed shapes, so the
//! runtime keeps a small set of them: one prefill shape (G1, e.g. T = 128) and a ladder of
//! decode/verify shapes (G2, T in {1, 2, 4, .., 64}). Inputs shorter than a shape are padded
//! to the next shape; padding rows are masked (they read nothing and write no KV).
//!
//! This module knows no backend: it only describes blocks and shapes and how to cover a
//! token count with shapes.

use std::ops::Range;

/// Default prefill chunk (tokens per prefill-graph run).
pub const DEFAULT_PREFILL_TOKENS: usize = 128;

/// Decode/verify graph sizes, ascending. Every size is a power of two so any remainder can
/// be covered exactly by a sum of them.
pub const DECODE_SHAPES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// A run of consecutive layers compiled as one graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockSpec {
    /// Layers of the model this block computes, in order.
    pub layers: Range<usize>,
    /// The block starts with the token-embedding lookup (input: token ids).
    pub first: bool,
    /// The block ends with the output norm and the LM head (output: logits).
    pub last: bool,
}

impl BlockSpec {
    /// The whole model as one block.
    pub fn whole(n_layer: usize) -> Self {
        BlockSpec {
            layers: 0..n_layer,
            first: true,
            last: true,
        }
    }

    /// Split `n_layer` layers into `n_blocks` blocks of near-equal size (the first blocks
    /// take the extra layers). `n_blocks` is clamped to `1..=n_layer`.
    pub fn split(n_layer: usize, n_blocks: usize) -> Vec<BlockSpec> {
        let n_blocks = n_blocks.clamp(1, n_layer.max(1));
        let base = n_layer / n_blocks;
        let extra = n_layer % n_blocks;
        let mut out = Vec::with_capacity(n_blocks);
        let mut start = 0;
        for b in 0..n_blocks {
            let len = base + usize::from(b < extra);
            out.push(BlockSpec {
                layers: start..start + len,
                first: b == 0,
                last: b + 1 == n_blocks,
            });
            start += len;
        }
        out
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }
}

/// Which role a shape plays. Both kinds share one KV-cache layout, so switching a block
/// from one kind to the other needs no relayout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphKind {
    /// G1: large fixed chunk, causal mask.
    Prefill,
    /// G2: small batch with an arbitrary (tree) mask; also used for plain decoding (T = 1).
    Decode,
}

/// The static shape a graph is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphShape {
    /// New tokens per run (T). Inputs with fewer valid tokens are padded.
    pub tokens: usize,
    /// KV slots available (committed past + this run's new tokens).
    pub kv_capacity: usize,
}

impl GraphShape {
    pub fn new(tokens: usize, kv_capacity: usize) -> Self {
        GraphShape {
            tokens,
            kv_capacity,
        }
    }
}

/// The smallest decode shape that holds `n` tokens, or `None` if `n` exceeds the largest
/// allowed shape `max` (itself clamped to the ladder).
pub fn decode_shape_for(n: usize, max: usize) -> Option<usize> {
    DECODE_SHAPES
        .iter()
        .copied()
        .filter(|&s| s <= max.max(1))
        .find(|&s| s >= n)
}

/// Cover `n` tokens with graph runs: as many full prefill chunks as fit, then the remainder
/// as a sum of decode shapes (largest first, at most `max_decode`), so no run is padded.
/// Returns the run sizes in order.
pub fn cover_with_shapes(n: usize, prefill: usize, max_decode: usize) -> Vec<usize> {
    let mut runs = Vec::new();
    let mut left = n;
    if prefill > 0 {
        while left >= prefill {
            runs.push(prefill);
            left -= prefill;
        }
    }
    for &s in DECODE_SHAPES.iter().rev() {
        if s > max_decode.max(1) {
            continue;
        }
        while left >= s {
            runs.push(s);
            left -= s;
        }
    }
    debug_assert_eq!(left, 0);
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_all_layers_in_order() {
        for n_layer in 1..40 {
            for n_blocks in 1..10 {
                let blocks = BlockSpec::split(n_layer, n_blocks);
                assert!(blocks[0].first && blocks.last().unwrap().last);
                let mut next = 0;
                for b in &blocks {
                    assert_eq!(b.layers.start, next);
                    assert!(!b.layers.is_empty());
                    next = b.layers.end;
                }
                assert_eq!(next, n_layer);
                let sizes: Vec<_> = blocks.iter().map(|b| b.n_layers()).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            }
        }
    }

    #[test]
    fn decode_shape_pads_up() {
        assert_eq!(decode_shape_for(1, 64), Some(1));
        assert_eq!(decode_shape_for(3, 64), Some(4));
        assert_eq!(decode_shape_for(33, 64), Some(64));
        assert_eq!(decode_shape_for(65, 64), None);
        assert_eq!(decode_shape_for(9, 8), None);
    }

    #[test]
    fn cover_sums_to_n_without_padding() {
        for n in 0..600 {
            let runs = cover_with_shapes(n, 128, 64);
            assert_eq!(runs.iter().sum::<usize>(), n);
            assert!(runs.iter().all(|r| *r == 128 || DECODE_SHAPES.contains(r)));
            assert!(runs.iter().filter(|&&r| r == 128).count() == n / 128);
        }
        assert_eq!(cover_with_shapes(300, 128, 64), vec![128, 128, 32, 8, 4]);
        assert_eq!(cover_with_shapes(5, 128, 2), vec![2, 2, 1]);
    }
}
