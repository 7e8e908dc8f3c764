//! Masked multi-head attention over the KV cache (GQA), batch-invariant.
//!
//! A batch of new tokens has been written to KV slots `n_past + held..n_past + held + n`
//! (`held`: scratch rows earlier batches left in place, the branch tails of multi-sequence
//! decoding; usually 0). New token `i` attends every committed slot `[0, n_past)` and the
//! scratch slots of its ancestor set (itself included): all earlier tokens for a causal
//! chunk, the tree path for verification, its own branch's tail for a branch.
//!
//! Batch invariance: a query's result depends only on the *sequence of key slots* it
//! attends, visited in slot order, with a fixed reduction order (scores, then max, then
//! exp-sum and V accumulation in that same order). A token computed inside a 128-token
//! prefill chunk, one at a time, or as a tree node whose ancestors were later compacted
//! to contiguous slots sees exactly the same key sequence, so it gets bit-identical output.

use crate::error::{Result, RuntimeError};
use crate::kernels::attn_tiles::scores_tiled_with_isa;
use crate::kernels::detected;
use crate::kernels::vector::{axpy_rows_multi_with_isa, softmax_exp_with_isa};
use crate::kv_cache::{KvElem, KvLayer, KvLayerView};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Per-batch mask and positions, preplanned for up to `max_tokens` rows.
///
/// Offsets count KV slots after the committed ones (slot `n_past + offset`). A batch's
/// rows sit after `held` scratch rows that earlier batches left in place (the branch
/// tails of multi-sequence decoding; 0 otherwise), so row i writes slot offset
/// `held + i`.
pub struct BatchMask {
    max_tokens: usize,
    n_valid: usize,
    held: usize,
    /// `vis[start[i]..start[i + 1]]`: the offsets visible to row i, ascending, ending with
    /// its own `held + i`.
    vis: Vec<u16>,
    start: Vec<usize>,
    /// Position of each row after the committed context (0 for children of the last
    /// committed token).
    depth: Vec<usize>,
}

/// Where a batch row with no parent in its batch continues: after the held rows
/// `held_visible` (ascending offsets `< held`), at position `n_past + depth`.
#[derive(Clone, Copy, Debug)]
pub struct TreeRoot<'a> {
    pub held_visible: &'a [u16],
    pub depth: usize,
}

impl TreeRoot<'_> {
    /// A child of the last committed token.
    pub const COMMITTED: TreeRoot<'static> = TreeRoot {
        held_visible: &[],
        depth: 0,
    };
}

impl BatchMask {
    pub fn new(max_tokens: usize) -> Self {
        BatchMask {
            max_tokens,
            n_valid: 0,
            held: 0,
            vis: Vec::with_capacity(max_tokens * max_tokens),
            start: vec![0; max_tokens + 1],
            depth: vec![0; max_tokens],
        }
    }

    pub fn n_valid(&self) -> usize {
        self.n_valid
    }

    /// Scratch rows kept from earlier batches before this batch's rows.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Offset of row `i` from `n_past` in positions.
    pub fn depth(&self, i: usize) -> usize {
        self.depth[i]
    }

    /// Offsets from `n_past` of the slots visible to row `i` (ascending, ending with
    /// `held + i`). Without held rows these are the batch indices of its ancestors.
    pub fn visible(&self, i: usize) -> &[u16] {
        &self.vis[self.start[i]..self.start[i + 1]]
    }

    /// Plain causal chunk of `n` tokens.
    pub fn set_causal(&mut self, n: usize) -> Result<()> {
        self.check_len(n, 0)?;
        self.n_valid = n;
        self.held = 0;
        self.vis.clear();
        for i in 0..n {
            self.start[i] = self.vis.len();
            self.vis.extend(0..=i as u16);
            self.depth[i] = i;
        }
        self.start[n] = self.vis.len();
        Ok(())
    }

    /// Tree batch: `parents[i] = -1` for children of the last committed token, else the
    /// index (< i) of the parent in this batch.
    pub fn set_tree(&mut self, parents: &[i32]) -> Result<()> {
        self.set_tree_after_held(0, parents, |_| TreeRoot::COMMITTED)
    }

    /// Tree batch after `held` scratch rows: a row with `parents[i] = -1` continues
    /// `root(i)` (it sees those held rows, then itself); any other row sees what its
    /// parent (an earlier batch index) sees, then itself.
    pub fn set_tree_after_held<'r>(
        &mut self,
        held: usize,
        parents: &[i32],
        root: impl Fn(usize) -> TreeRoot<'r>,
    ) -> Result<()> {
        let n = parents.len();
        self.check_len(n, held)?;
        for (i, &p) in parents.iter().enumerate() {
            if p < -1 || p >= i as i32 {
                return Err(RuntimeError::InvalidInput(format!(
                    "parents[{i}] = {p}: must be -1 or an earlier batch index"
                )));
            }
            if p < 0 {
                let r = root(i);
                let ascending = r.held_visible.windows(2).all(|w| w[0] < w[1]);
                if !ascending || r.held_visible.last().is_some_and(|&h| h as usize >= held) {
                    return Err(RuntimeError::InvalidInput(format!(
                        "row {i}: held rows {:?} must be ascending offsets below {held}",
                        r.held_visible
                    )));
                }
            }
        }
        self.n_valid = n;
        self.held = held;
        self.vis.clear();
        for (i, &p) in parents.iter().enumerate() {
            self.start[i] = self.vis.len();
            if p < 0 {
                let r = root(i);
                self.depth[i] = r.depth;
                self.vis.extend_from_slice(r.held_visible);
            } else {
                let p = p as usize;
                self.depth[i] = self.depth[p] + 1;
                self.vis
                    .extend_from_within(self.start[p]..self.start[p + 1]);
            }
            self.vis.push((held + i) as u16);
        }
        self.start[n] = self.vis.len();
        Ok(())
    }

    fn check_len(&self, n: usize, held: usize) -> Result<()> {
        if n == 0 || n > self.max_tokens {
            return Err(RuntimeError::InvalidInput(format!(
                "batch of {n} tokens: must be 1..={}",
                self.max_tokens
            )));
        }
        if held + n > u16::MAX as usize {
            return Err(RuntimeError::Capacity(format!(
                "{held} held rows and a batch of {n} exceed {} scratch rows",
                u16::MAX
            )));
        }
        Ok(())
    }
}

/// Geometry of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

/// Tokens whose queries share one pass over the committed keys (one work item).
const TOK_BLOCK: usize = 8;
/// V rows per step of the weighted sum: 64 rows of a 64-wide head are 16 KB, so a
/// chunk stays in L1 while every query of an item accumulates it.
const V_CHUNK: usize = 64;
/// Rows ahead that the first queries of a chunk prefetch V: the hardware prefetchers
/// here barely follow a stream from memory (benchmarks/runs/kernels-worklog.md#item-63).
const V_PREFETCH_ROWS: usize = 16;

/// Preplanned per-task scratch: for up to `TOK_BLOCK` tokens × one GQA group of query
/// heads, the scores of every KV slot, the gathered queries, the output rows and the
/// normalisers.
pub struct AttnScratch {
    slots: Vec<Mutex<Vec<f32>>>,
    threads: usize,
    kv_capacity: usize,
    head_dim: usize,
    group: usize,
}

impl AttnScratch {
    /// For a pool of `threads` threads (4 task slots each); `group`: query heads per KV
    /// head (`n_head / n_head_kv`).
    pub fn new(threads: usize, kv_capacity: usize, head_dim: usize, group: usize) -> Self {
        let (threads, group) = (threads.max(1), group.max(1));
        let queries = TOK_BLOCK * group;
        AttnScratch {
            slots: (0..4 * threads)
                .map(|_| Mutex::new(vec![0.0; queries * (kv_capacity + 2 * head_dim + 1)]))
                .collect(),
            threads,
            kv_capacity,
            head_dim,
            group,
        }
    }
}

/// Executes `n` tasks, possibly in parallel (a thread pool's `parallel_for`).
pub type TaskRunner<'a> = dyn Fn(usize, &(dyn Fn(usize) + Sync)) + 'a;

/// Attention for the first `mask.n_valid()` rows of `q` (`[T][n_head * head_dim]`, RoPE
/// applied). `kv` (tiled K, V per KV head) holds slots `[0, n_past + held + n_valid)` of one
/// layer. Output rows go to `out` (f32 bits in atomics so tasks can write disjoint rows
/// without `unsafe`). `run` executes `n` tasks, possibly in parallel.
///
/// Work items are (block of up to `TOK_BLOCK` tokens, KV head) or, when those cannot be
/// shared evenly among the threads, slices of one: by tokens, or by query heads for a
/// single token. One
/// pass of the tiled score kernel over the head's K tiles serves every query of an item (each
/// tile row is loaded once per 8 queries, 16 keys per FMA); V rows are shared in
/// L1-sized chunks. A score depends only on its query and key (one fused chain over the
/// head's elements, `attn_tiles::score_reference`, lane by lane), scores stay in key order,
/// and V rows are added in ascending key order, so a result does not depend on the batch,
/// the item split or the thread count.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    kv: KvLayerView<'_>,
    n_past: usize,
    mask: &BatchMask,
    dims: AttnDims,
    scratch: &AttnScratch,
    out: &[AtomicU32],
    run: &TaskRunner<'_>,
) {
    match kv {
        KvLayerView::F32(kv) => attend(q, kv, n_past, mask, dims, scratch, out, run),
        KvLayerView::F16(kv) => attend(q, kv, n_past, mask, dims, scratch, out, run),
    }
}

/// [`attention`] for the cache's element type.
#[allow(clippy::too_many_arguments)]
fn attend<T: KvElem>(
    q: &[f32],
    kv: KvLayer<'_, T>,
    n_past: usize,
    mask: &BatchMask,
    dims: AttnDims,
    scratch: &AttnScratch,
    out: &[AtomicU32],
    run: &TaskRunner<'_>,
) {
    let AttnDims {
        n_head,
        n_head_kv,
        head_dim: hd,
    } = dims;
    let group = n_head / n_head_kv;
    let n = mask.n_valid();
    let held = mask.held();
    assert!(
        group <= scratch.group
            && hd <= scratch.head_dim
            && n_past + held + n <= scratch.kv_capacity,
        "attention: scratch planned for a smaller group, head or KV capacity"
    );
    if n == 0 {
        return;
    }
    let isa = detected();
    let n_blocks = n.div_ceil(TOK_BLOCK);
    let units = n_blocks * n_head_kv;
    // Slicing a unit makes every slice stream the KV head's K and V again (from L2 at
    // best: a 1.5B head's K and V at depth 1000 are 1 MB), so units are sliced only when
    // they cannot be shared evenly, and then only where a thread's share ends inside a
    // unit (`Items`): 3 KV heads on 2 threads run as 1.5 heads per thread
    // (benchmarks/runs/kernels-worklog.md#item-77).
    let parts = if scratch.threads > 1 && !units.is_multiple_of(scratch.threads) {
        (2 * scratch.threads).div_ceil(units).clamp(1, group)
    } else {
        1
    };
    let items = Items {
        units,
        parts,
        threads: scratch.threads,
    };
    let n_items = items.count();
    let n_tasks = scratch.slots.len().min(n_items);
    let scale = 1.0 / (hd as f32).sqrt();
    // Score row stride: every slot up to the batch's last new key.
    let stride = n_past + held + n;
    let v = kv.v;
    let task = |t: usize| {
        let mut guard = scratch.slots[t].lock().unwrap_or_else(|e| e.into_inner());
        let queries = TOK_BLOCK * scratch.group;
        let (scores, rest) = guard.split_at_mut(queries * scratch.kv_capacity);
        let (qbuf, rest) = rest.split_at_mut(queries * scratch.head_dim);
        let (acc, inv) = rest.split_at_mut(queries * scratch.head_dim);
        let lo = n_items * t / n_tasks;
        let hi = n_items * (t + 1) / n_tasks;
        items.for_each(lo, hi, |unit, p0, p1| {
            // KV-head-major: the token blocks and slices of one KV head follow each other,
            // and a thread runs a contiguous share of the items, so a second pass over the
            // head's K and V usually finds them in this core's L2.
            let (g, blk) = (unit / n_blocks, unit % n_blocks);
            let (b0, b1) = (blk * TOK_BLOCK, (blk * TOK_BLOCK + TOK_BLOCK).min(n));
            // A block of several tokens is sliced by tokens (every slice has all the
            // group's heads: 8 tokens x 3 heads give two items of 12 queries, not 8 and
            // 16), a single token by heads.
            let ((h0, h1), (i0, i1)) = if b1 - b0 >= parts {
                let nt = b1 - b0;
                let t0 = b0 + nt * p0 / parts;
                let t1 = b0 + nt * p1 / parts;
                ((g * group, (g + 1) * group), (t0, t1))
            } else {
                let h0 = g * group + group * p0 / parts;
                let h1 = g * group + group * p1 / parts;
                ((h0, h1), (b0, b1))
            };
            let nh = h1 - h0;
            let nq = (i1 - i0) * nh;
            // Query a = (token - i0) * nh + (head - h0), gathered contiguously.
            let qs = &mut qbuf[..nq * hd];
            for (ti, dst) in (i0..i1).zip(qs.chunks_exact_mut(nh * hd)) {
                dst.copy_from_slice(&q[ti * n_head * hd + h0 * hd..][..nh * hd]);
            }
            let qs = &qs[..];
            let scores = &mut scores[..nq * stride];
            let acc = &mut acc[..nq * hd];
            // This KV head's V rows, `hd` apart.
            let vh = &v[g * kv.v_head_stride..];
            // Every query of the item against slots [0, n_past + held + i1): token ti's
            // visible new keys are slots up to n_past + held + ti (held rows of other
            // branches are scored and then dropped). Then each token's visible new keys
            // are moved to follow the committed ones (visible[idx] >= idx, ascending).
            let kt = &kv.k_tiles[g * kv.head_stride..];
            let n_scored = n_past + held + i1;
            scores_tiled_with_isa(isa, qs, hd, kt, n_scored, scores, stride, vh);
            for ti in i0..i1 {
                let a0 = (ti - i0) * nh;
                let vis = mask.visible(ti);
                for a in a0..a0 + nh {
                    let row = &mut scores[a * stride + n_past..][..held + i1];
                    for (idx, &b) in vis.iter().enumerate() {
                        row[idx] = row[b as usize];
                    }
                }
                let n_keys = n_past + vis.len();
                for a in a0..a0 + nh {
                    let s = &mut scores[a * stride..][..n_keys];
                    inv[a] = 1.0 / softmax_exp_with_isa(isa, s, scale);
                }
            }
            acc.fill(0.0);
            let mut r0 = 0;
            while r0 < n_past {
                let r = V_CHUNK.min(n_past - r0);
                let rows = &vh[r0 * hd..];
                let w = &scores[r0..];
                axpy_rows_multi_with_isa(isa, w, stride, r, rows, hd, acc, hd, V_PREFETCH_ROWS);
                r0 += r;
            }
            for ti in i0..i1 {
                let a0 = (ti - i0) * nh;
                let acc = &mut acc[a0 * hd..(a0 + nh) * hd];
                for_each_run(0, mask.visible(ti), |key, slot, len| {
                    let rows = &vh[(n_past + slot) * hd..];
                    let w = &scores[a0 * stride + n_past + key..];
                    axpy_rows_multi_with_isa(isa, w, stride, len, rows, hd, acc, hd, 0);
                });
                let o = &out[ti * n_head * hd + h0 * hd..][..nh * hd];
                let (acc, inv) = (&acc[..], &inv[a0..a0 + nh]);
                for ((o, acc), &inv) in o.chunks_exact(hd).zip(acc.chunks_exact(hd)).zip(inv) {
                    for (dst, &x) in o.iter().zip(acc) {
                        dst.store((x * inv).to_bits(), Ordering::Relaxed);
                    }
                }
            }
        });
    };
    run(n_tasks, &task);
}

/// The work items of one attention call: `units` units of `parts` slices each, the slice
/// range `[0, units * parts)` cut at every unit boundary and wherever one of `threads`
/// equal shares ends, so a slice boundary inside a unit exists only where two threads
/// split it.
#[derive(Clone, Copy, Debug)]
struct Items {
    units: usize,
    parts: usize,
    threads: usize,
}

impl Items {
    fn count(self) -> usize {
        let mut n = 0;
        self.walk(|_, _, _, _| n += 1);
        n
    }

    /// Calls `f(unit, p0, p1)` (slices `p0..p1` of `unit`) for items `lo..hi`, in order.
    fn for_each(self, lo: usize, hi: usize, mut f: impl FnMut(usize, usize, usize)) {
        self.walk(|i, unit, p0, p1| {
            if (lo..hi).contains(&i) {
                f(unit, p0, p1)
            }
        });
    }

    /// Calls `f(index, unit, p0, p1)` for every item: the cuts at multiples of `parts`
    /// and at `t * total / threads`, merged in ascending order.
    fn walk(self, mut f: impl FnMut(usize, usize, usize, usize)) {
        let total = self.units * self.parts;
        let threads = self.threads.max(1);
        let (mut at, mut i, mut t) = (0, 0, 1);
        while at < total {
            // The next share end after `at` (shares are ascending in t).
            while t < threads && t * total / threads <= at {
                t += 1;
            }
            let share_end = if t < threads {
                t * total / threads
            } else {
                total
            };
            let unit = at / self.parts;
            let next = share_end.min((unit + 1) * self.parts);
            f(i, unit, at - unit * self.parts, next - unit * self.parts);
            (at, i) = (next, i + 1);
        }
    }
}

/// Calls `f(first_key, first_slot, len)` for each maximal run of adjacent KV slots in
/// the key sequence `[0, n_past)` then `n_past + visible[..]`, in key order.
fn for_each_run(n_past: usize, visible: &[u16], mut f: impl FnMut(usize, usize, usize)) {
    let (mut key, mut slot, mut len) = (0, 0, n_past);
    for (idx, &b) in visible.iter().enumerate() {
        let s = n_past + b as usize;
        if len > 0 && slot + len == s {
            len += 1;
        } else {
            if len > 0 {
                f(key, slot, len);
            }
            (key, slot, len) = (n_past + idx, s, 1);
        }
    }
    if len > 0 {
        f(key, slot, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::{KvCache, KvPrecision};

    fn serial(n: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n).for_each(f)
    }

    use crate::test_rng::uniform as rnd;

    /// Random K or V rows that a half float holds exactly, so f32 and f16 caches store
    /// the same values (and the f64 references see what the kernels read).
    fn kv_rnd(seed: &mut u64, n: usize) -> Vec<f32> {
        rnd(seed, n)
            .into_iter()
            .map(|x| half::f16::narrow(x).widen())
            .collect()
    }

    /// Plain two-pass f64 softmax attention for one query head over explicit key slots.
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        slots: &[usize],
        kv_off: usize,
        kv_dim: usize,
        hd: usize,
    ) -> Vec<f32> {
        let s: Vec<f64> = slots
            .iter()
            .map(|&j| {
                (0..hd)
                    .map(|d| q[d] as f64 * k[j * kv_dim + kv_off + d] as f64)
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..hd)
            .map(|d| {
                (slots
                    .iter()
                    .zip(&e)
                    .map(|(&j, w)| w * v[j * kv_dim + kv_off + d] as f64)
                    .sum::<f64>()
                    / z) as f32
            })
            .collect()
    }

    /// The K/V rows a tree node sees, laid out as if it were decoded alone: the committed
    /// rows, then its visible new rows in order (the node itself last).
    fn alone_kv(
        k: &[f32],
        v: &[f32],
        n_past: usize,
        vis: &[u16],
        kv_dim: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut k2 = k[..n_past * kv_dim].to_vec();
        let mut v2 = v[..n_past * kv_dim].to_vec();
        for &p in vis {
            k2.extend_from_slice(&k[(n_past + p as usize) * kv_dim..][..kv_dim]);
            v2.extend_from_slice(&v[(n_past + p as usize) * kv_dim..][..kv_dim]);
        }
        (k2, v2)
    }

    fn run_attn(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n_past: usize,
        mask: &BatchMask,
        dims: AttnDims,
        tasks: usize,
    ) -> Vec<f32> {
        // The rows are half floats (`kv_rnd`), so an f32 and an f16 cache hold the same
        // values: the two element types' kernels must agree bit for bit.
        let [a, b] = [KvPrecision::F32, KvPrecision::F16]
            .map(|p| run_attn_in(p, q, k, v, n_past, mask, dims, tasks));
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "f32 and f16 caches disagree");
        a
    }

    #[allow(clippy::too_many_arguments)]
    fn run_attn_in(
        precision: KvPrecision,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        n_past: usize,
        mask: &BatchMask,
        dims: AttnDims,
        tasks: usize,
    ) -> Vec<f32> {
        let n = mask.n_valid() * dims.n_head * dims.head_dim;
        let out: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
        let group = dims.n_head / dims.n_head_kv;
        // A cache holding exactly the given slots (capacity rarely a multiple of 16).
        let kv_dim = dims.n_head_kv * dims.head_dim;
        let slots = k.len() / kv_dim;
        let mut kv = KvCache::with_precision(1, dims.n_head_kv, dims.head_dim, slots, precision);
        for (s, (k, v)) in k
            .chunks_exact(kv_dim)
            .zip(v.chunks_exact(kv_dim))
            .enumerate()
        {
            kv.write(0, s, k, v);
        }
        let scratch = AttnScratch::new(tasks, slots, dims.head_dim, group);
        let view = kv.layer_view(0);
        attention(q, view, n_past, mask, dims, &scratch, &out, &serial);
        out.iter()
            .map(|a| f32::from_bits(a.load(Ordering::Relaxed)))
            .collect()
    }

    #[test]
    fn tree_mask_matches_reference_and_is_batch_invariant() {
        let dims = AttnDims {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 20,
        };
        let hd = dims.head_dim;
        let kv_dim = dims.n_head_kv * hd;
        let qd = dims.n_head * hd;
        let mut seed = 7;
        let n_past = 37;
        let parents = [-1, 0, 0, 1, -1, 3, 2];
        let n = parents.len();
        let k = kv_rnd(&mut seed, (n_past + n) * kv_dim);
        let v = kv_rnd(&mut seed, (n_past + n) * kv_dim);
        let q = rnd(&mut seed, n * qd);
        let mut mask = BatchMask::new(8);
        mask.set_tree(&parents).unwrap();
        assert_eq!(mask.visible(5), &[0, 1, 3, 5]);
        assert_eq!(mask.depth(5), 3);
        assert_eq!(mask.visible(4), &[4]);
        let got = run_attn(&q, &k, &v, n_past, &mask, dims, 3);
        for i in 0..n {
            let mut slots: Vec<usize> = (0..n_past).collect();
            slots.extend(mask.visible(i).iter().map(|&j| n_past + j as usize));
            for h in 0..dims.n_head {
                let r = reference(
                    &q[i * qd + h * hd..],
                    &k,
                    &v,
                    &slots,
                    (h / 2) * hd,
                    kv_dim,
                    hd,
                );
                for d in 0..hd {
                    assert!((got[i * qd + h * hd + d] - r[d]).abs() < 1e-5);
                }
            }
        }
        // Node 5 alone, with its ancestors compacted into committed slots, must be bitwise equal.
        let path = [0usize, 1, 3];
        let mut k2 = k[..n_past * kv_dim].to_vec();
        let mut v2 = v[..n_past * kv_dim].to_vec();
        for &p in path.iter().chain([5usize].iter()) {
            k2.extend_from_slice(&k[(n_past + p) * kv_dim..][..kv_dim]);
            v2.extend_from_slice(&v[(n_past + p) * kv_dim..][..kv_dim]);
        }
        let mut m1 = BatchMask::new(1);
        m1.set_causal(1).unwrap();
        let single = run_attn(&q[5 * qd..6 * qd], &k2, &v2, n_past + 3, &m1, dims, 1);
        assert_eq!(single, got[5 * qd..6 * qd].to_vec());
    }

    #[test]
    fn causal_chunk_equals_token_by_token() {
        let dims = AttnDims {
            n_head: 3,
            n_head_kv: 3,
            head_dim: 16,
        };
        let kv_dim = 48;
        let mut seed = 99;
        let (n_past, n) = (5, 9);
        let k = kv_rnd(&mut seed, (n_past + n) * kv_dim);
        let v = kv_rnd(&mut seed, (n_past + n) * kv_dim);
        let q = rnd(&mut seed, n * kv_dim);
        let mut mask = BatchMask::new(16);
        mask.set_causal(n).unwrap();
        let chunk = run_attn(&q, &k, &v, n_past, &mask, dims, 4);
        let mut m1 = BatchMask::new(1);
        m1.set_causal(1).unwrap();
        for i in 0..n {
            let one = run_attn(
                &q[i * kv_dim..(i + 1) * kv_dim],
                &k,
                &v,
                n_past + i,
                &m1,
                dims,
                2,
            );
            assert_eq!(one, chunk[i * kv_dim..(i + 1) * kv_dim].to_vec());
        }
    }

    /// A long committed prefix (several V chunks, 16-row tails), a tree of more than
    /// `TOK_BLOCK` nodes and 1-3 threads: every node equals itself computed alone over
    /// its compacted ancestors, bitwise, and the f64 reference closely.
    #[test]
    fn tree_blocks_equal_single_tokens_over_long_prefix() {
        let dims = AttnDims {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 24,
        };
        let (hd, kv_dim, qd) = (24, 48, 144);
        let mut seed = 5;
        let n_past = 150;
        let parents = [-1, 0, 1, 0, 3, 2, -1, 6, 5, 4, 9, 10, 7, 12, 8, 11, 13, 14];
        let n = parents.len();
        let k = kv_rnd(&mut seed, (n_past + n) * kv_dim);
        let v = kv_rnd(&mut seed, (n_past + n) * kv_dim);
        let q = rnd(&mut seed, n * qd);
        let mut mask = BatchMask::new(32);
        mask.set_tree(&parents).unwrap();
        let batch: Vec<Vec<f32>> = (1..=3)
            .map(|threads| run_attn(&q, &k, &v, n_past, &mask, dims, threads))
            .collect();
        assert_eq!(batch[0], batch[1]);
        assert_eq!(batch[0], batch[2]);
        let mut m1 = BatchMask::new(1);
        m1.set_causal(1).unwrap();
        for i in 0..n {
            let vis = mask.visible(i);
            let (k2, v2) = alone_kv(&k, &v, n_past, vis, kv_dim);
            let single = run_attn(
                &q[i * qd..][..qd],
                &k2,
                &v2,
                n_past + vis.len() - 1,
                &m1,
                dims,
                2,
            );
            assert_eq!(single, batch[0][i * qd..][..qd].to_vec(), "node {i}");
            let slots: Vec<usize> = (0..n_past + vis.len()).collect();
            for h in 0..dims.n_head {
                let r = reference(
                    &q[i * qd + h * hd..],
                    &k2,
                    &v2,
                    &slots,
                    (h / 3) * hd,
                    kv_dim,
                    hd,
                );
                for d in 0..hd {
                    assert!(
                        (single[h * hd + d] - r[d]).abs() < 1e-5,
                        "node {i} head {h}"
                    );
                }
            }
        }
    }

    /// Random trees (and causal chunks) over random committed depths, GQA groups 1, 3
    /// and 7, head size 64, 1-3 tasks: every node equals itself computed alone over its
    /// compacted ancestors, bitwise, and the f64 reference closely.
    #[test]
    fn random_trees_are_batch_invariant_for_gqa_groups() {
        let mut seed: u64 = 21;
        let mut pick = |m: usize| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 33) as usize % m
        };
        for (case, &(group, n_past, n)) in [
            (1usize, 0usize, 9usize),
            (3, 37, 16),
            (7, 130, 11),
            (3, 203, 1),
            (7, 16, 20),
        ]
        .iter()
        .enumerate()
        {
            let dims = AttnDims {
                n_head: 2 * group,
                n_head_kv: 2,
                head_dim: 64,
            };
            let (hd, kv_dim, qd) = (64, 128, 2 * group * 64);
            let parents: Vec<i32> = match case % 2 {
                0 => (0..n as i32).map(|i| i - 1).collect(),
                _ => (0..n).map(|i| pick(i + 1) as i32 - 1).collect(),
            };
            let mut rs = case as u64 + 100;
            let k = kv_rnd(&mut rs, (n_past + n) * kv_dim);
            let v = kv_rnd(&mut rs, (n_past + n) * kv_dim);
            let q = rnd(&mut rs, n * qd);
            let mut mask = BatchMask::new(32);
            mask.set_tree(&parents).unwrap();
            let batch = run_attn(&q, &k, &v, n_past, &mask, dims, 1 + case % 3);
            let mut m1 = BatchMask::new(1);
            m1.set_causal(1).unwrap();
            for i in 0..n {
                let vis = mask.visible(i);
                let (k2, v2) = alone_kv(&k, &v, n_past, vis, kv_dim);
                let alone = n_past + vis.len() - 1;
                let single = run_attn(&q[i * qd..][..qd], &k2, &v2, alone, &m1, dims, 2);
                assert_eq!(
                    single,
                    batch[i * qd..][..qd].to_vec(),
                    "case {case} node {i}"
                );
                let slots: Vec<usize> = (0..=alone).collect();
                for h in 0..dims.n_head {
                    let r = reference(
                        &q[i * qd + h * hd..],
                        &k2,
                        &v2,
                        &slots,
                        (h / group) * hd,
                        kv_dim,
                        hd,
                    );
                    for d in 0..hd {
                        let e = (single[h * hd + d] - r[d]).abs();
                        assert!(e < 1e-5, "case {case} node {i} head {h}: {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn bad_parents_are_rejected() {
        let mut m = BatchMask::new(4);
        assert!(m.set_tree(&[0]).is_err());
        assert!(m.set_tree(&[-1, 1]).is_err());
        assert!(m.set_tree(&[-2]).is_err());
        assert!(m.set_tree(&[-1; 5]).is_err());
        assert!(m.set_tree(&[]).is_err());
    }

    #[test]
    fn rows_after_held_rows_see_their_branch_then_themselves() {
        let mut m = BatchMask::new(4);
        let tails: [&[u16]; 3] = [&[0, 3], &[], &[2, 4]];
        m.set_tree_after_held(5, &[-1, -1, -1, 0], |i| TreeRoot {
            held_visible: tails[i],
            depth: tails[i].len(),
        })
        .unwrap();
        assert_eq!(m.held(), 5);
        assert_eq!(m.visible(0), &[0, 3, 5]);
        assert_eq!(m.visible(1), &[6]);
        assert_eq!(m.visible(2), &[2, 4, 7]);
        assert_eq!(m.visible(3), &[0, 3, 5, 8]);
        assert_eq!((m.depth(0), m.depth(1), m.depth(3)), (2, 0, 3));
        let bad = |held_visible: &'static [u16]| TreeRoot {
            held_visible,
            depth: 1,
        };
        assert!(m.set_tree_after_held(5, &[-1], |_| bad(&[5])).is_err());
        assert!(m.set_tree_after_held(5, &[-1], |_| bad(&[2, 2])).is_err());
        // A plain tree afterwards has no held rows.
        m.set_tree(&[-1, 0]).unwrap();
        assert_eq!((m.held(), m.visible(1)), (0, &[0u16, 1][..]));
    }

    /// Items tile every unit's slices in order, never straddle a unit or a thread's share
    /// end, and cut a unit only at a share end.
    #[test]
    fn items_cut_units_only_where_shares_end() {
        for threads in 1..=5 {
            for units in 1..=9 {
                for parts in 1..=4 {
                    let items = Items {
                        units,
                        parts,
                        threads,
                    };
                    let total = units * parts;
                    let ends: Vec<usize> = (1..threads).map(|t| t * total / threads).collect();
                    let mut got = Vec::new();
                    items.for_each(0, usize::MAX, |u, p0, p1| got.push((u, p0, p1)));
                    assert_eq!(got.len(), items.count());
                    let mut at = 0;
                    for &(u, p0, p1) in &got {
                        let (a, b) = (u * parts + p0, u * parts + p1);
                        assert!(
                            a == at && p0 < p1 && p1 <= parts,
                            "{units} {parts} {threads}: {got:?}"
                        );
                        assert!(
                            !ends.iter().any(|&e| a < e && e < b),
                            "straddles a share end"
                        );
                        if p1 < parts {
                            assert!(
                                ends.contains(&b),
                                "{units} {parts} {threads}: needless cut {got:?}"
                            );
                        }
                        at = b;
                    }
                    assert_eq!(at, total);
                    let mut sub = Vec::new();
                    items.for_each(1, 3, |u, p0, p1| sub.push((u, p0, p1)));
                    assert_eq!(sub, got[1.min(got.len())..3.min(got.len())]);
                }
            }
        }
    }

    #[test]
    fn runs_cover_keys_in_order() {
        let mut got = Vec::new();
        for_each_run(3, &[0, 1, 3, 5, 6], |k, s, l| got.push((k, s, l)));
        assert_eq!(got, vec![(0, 0, 5), (5, 6, 1), (6, 8, 2)]);
        got.clear();
        for_each_run(0, &[2, 4], |k, s, l| got.push((k, s, l)));
        assert_eq!(got, vec![(0, 2, 1), (1, 4, 1)]);
    }
}
