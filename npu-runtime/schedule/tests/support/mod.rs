//! Instance builders shared by the scheduling tests (`schedule_*.rs`), so that a study such as
//! `gap.rs` draws from exactly the distributions the other tests check.
#![allow(dead_code)]

use npu_schedule::{Instance, Load};
use proptest::prelude::*;

/// xorshift64: a seeded generator the tests can replay without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() % 1_000_000) as f64 / 1e6
    }
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random instance in the paper's regime: similar blocks (+-10% per step), G2 up to 30%
/// slower than G1 on a chunk, a switch 0.3x-3x a block's step.
pub fn paper_regime_instance(rng: &mut Rng) -> Instance {
    let n = 2 + (rng.next() % 7) as usize;
    let c = 1 + (rng.next() % 4) as usize;
    let base = 5.0 + 35.0 * rng.unit();
    let slow = 1.0 + 0.3 * rng.unit();
    let sw = 0.3 + 2.7 * rng.unit();
    let mut inst = Instance::uniform(n, c, 0, 0, 0, 0, 1000);
    for s in 0..n * c {
        let g = base * (0.9 + 0.2 * rng.unit());
        inst.g1[s] = (g * 1000.0) as u64;
        inst.g2[s] = (g * slow * 1000.0) as u64;
    }
    for b in 0..n {
        inst.load[b] = (base * sw * (0.8 + 0.4 * rng.unit()) * 1000.0) as u64;
    }
    inst
}

/// The appendix's 2-Partition reduction: item blocks with tiny compute on G1 and a dearer G2,
/// followed by a long block L (compute W per chunk on G1, prohibitive on G2, free switch), two
/// chunks. The items' switches fit under L's two windows iff the items split into two halves.
pub fn partition_instance(items: &[u64]) -> Instance {
    let n = items.len() + 1;
    let scale = 100;
    let w: u64 = items.iter().sum::<u64>() * scale / 2;
    let mut inst = Instance::uniform(n, 2, 1, 2, 0, 0, 1);
    for c in 0..2 {
        inst.g1[c * n + n - 1] = w;
        inst.g2[c * n + n - 1] = 100 * w;
    }
    for (i, &a) in items.iter().enumerate() {
        inst.load[i] = a * scale;
    }
    inst.load[n - 1] = 0;
    inst
}

/// Upper bounds (exclusive) of a small random instance's figures.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub max_blocks: usize,
    pub max_chunks: usize,
    /// G1 step in `1..g1`.
    pub g1: u64,
    /// G2 step = G1 step + `0..g2_extra`.
    pub g2_extra: u64,
    pub load: u64,
    pub unload: u64,
    pub decode_step: u64,
}

/// The bounds of `greedy.rs`'s proptest (also drawn, seeded, by `gap.rs`).
pub const GREEDY_BOUNDS: Bounds = Bounds {
    max_blocks: 5,
    max_chunks: 3,
    g1: 50,
    g2_extra: 20,
    load: 120,
    unload: 10,
    decode_step: 7,
};

/// Proptest strategy for small instances within `b`.
pub fn arb_instance(b: Bounds) -> impl Strategy<Value = Instance> {
    (1..=b.max_blocks, 1..=b.max_chunks).prop_flat_map(move |(n, c)| {
        (
            prop::collection::vec(1u64..b.g1, n * c),
            prop::collection::vec(0u64..b.g2_extra, n * c),
            prop::collection::vec(0u64..b.load, n),
            prop::collection::vec(0u64..b.unload, n),
        )
            .prop_map(move |(g1, extra, load, unload)| {
                let mut inst = Instance::uniform(n, c, 0, 0, 0, 0, b.decode_step);
                inst.g2 = g1.iter().zip(&extra).map(|(a, e)| a + e).collect();
                inst.g1 = g1;
                inst.load = load;
                inst.unload = unload;
                inst
            })
    })
}

/// The same distribution as [`arb_instance`], drawn from a seeded [`Rng`].
pub fn seeded_instance(rng: &mut Rng, b: Bounds) -> Instance {
    let n = 1 + rng.below(b.max_blocks as u64) as usize;
    let c = 1 + rng.below(b.max_chunks as u64) as usize;
    let mut inst = Instance::uniform(n, c, 0, 0, 0, 0, b.decode_step);
    for s in 0..n * c {
        inst.g1[s] = 1 + rng.below(b.g1 - 1);
        inst.g2[s] = inst.g1[s] + rng.below(b.g2_extra);
    }
    for blk in 0..n {
        inst.load[blk] = rng.below(b.load);
        inst.unload[blk] = rng.below(b.unload);
    }
    inst
}

/// Loads from `(block, release)` pairs.
pub fn load_list(pairs: &[(usize, usize)]) -> Vec<Load> {
    pairs
        .iter()
        .map(|&(block, release)| Load { block, release })
        .collect()
}
