//! Choosing the number of blocks and the chunk size from a warm-up profile.
//!
//! Warm-up measures one layout (N₀ blocks, chunks of C₀ tokens). From it we derive
//! per-layer costs, assuming a block's costs are spread evenly over its layers, compute is
//! linear in the tokens of a run, and every graph execution / load pays a fixed overhead
//! ([`Overheads`]):
//!
//! - G1 compute per layer and token: `(g1_chunk_ms − call) / (layers · C₀)`;
//! - G2 compute per layer and token: `(g2_chunk_ms − call · C₀/g2) / (layers · C₀)`;
//! - load / teardown / memory per layer: `(load_g2_ms − load_fixed) / layers`, etc.
//!
//! A candidate (N blocks, chunks of C tokens) gets a predicted profile by summing those
//! over its blocks' layers and adding the overheads back; the planner and the
//! discrete-event simulator then predict prefill, switch completion, stall and TTFT for
//! the prompt, exactly as for a measured profile. The candidate with the lowest predicted
//! TTFT whose peak resident memory fits the budget wins (ties: fewer blocks, then larger
//! chunks, i.e. fewer graphs and calls). Attention's growth with depth is not modelled.
//!
//! [`choose_measured`] then measures the layouts the choice hinges on: it warms up the
//! best predicted layout not yet measured, refits the overheads from every measured
//! profile ([`fit_overheads`]), predicts again, and repeats until the best prediction is a
//! measured layout (or the measurement budget is spent). The answer is the measured layout
//! with the lowest TTFT simulated on its own measured profile.

use super::error::{Result, ScheduleError};
use super::instance::{Instance, MemoryBudget};
use super::kind::ScheduleKind;
use super::profile::{BlockProfile, Profile};
use super::sim::simulate;
use serde::{Deserialize, Serialize};

/// Default candidates: block counts are filtered to divisors of the layer count (see
/// [`default_block_counts`]), chunks to multiples of the G2 shape.
pub const DEFAULT_BLOCKS: [usize; 7] = [1, 2, 4, 6, 8, 12, 24];
pub const DEFAULT_CHUNKS: [usize; 4] = [32, 64, 128, 256];

/// Every divisor of `n_layers` up to 24 (e.g. 1, 2, 4, 7, 14 for 28 layers), so models
/// whose layer count 6, 8, 12 and 24 do not divide still get several candidates.
pub fn default_block_counts(n_layers: usize) -> Vec<usize> {
    (1..=n_layers.min(24))
        .filter(|d| n_layers.is_multiple_of(*d))
        .collect()
}

/// Fixed costs that do not scale with layers or tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Overheads {
    /// Per graph execution (one G1 run, or one G2 run of `g2_tokens`).
    pub call_ms: f64,
    /// Per load of a block's G2 form.
    pub load_ms: f64,
}

impl Overheads {
    /// Per-call overhead estimated from one profile: a chunk on G2 takes `chunk/g2` runs
    /// where G1 takes one, so `(g2_chunk − g1_chunk) / (chunk/g2 − 1)` per block, averaged.
    /// This charges all of G2's extra time to per-call costs (an upper bound: a
    /// decode-shaped graph may also be slower per token). No load overhead is estimated.
    pub fn estimate(p: &Profile) -> Overheads {
        let runs = (p.chunk_tokens / p.g2_tokens) as f64;
        if runs <= 1.0 || p.blocks.is_empty() {
            return Overheads::default();
        }
        let per_call = p
            .blocks
            .iter()
            .map(|b| ((b.g2_chunk_ms - b.g1_chunk_ms) / (runs - 1.0)).clamp(0.0, b.g1_chunk_ms))
            .sum::<f64>()
            / p.blocks.len() as f64;
        Overheads {
            call_ms: (per_call * 1e6).round() / 1e6,
            load_ms: 0.0,
        }
    }
}

/// One evaluated candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateResult {
    pub n_blocks: usize,
    pub chunk_tokens: usize,
    pub prefill_ms: f64,
    pub switch_ms: f64,
    pub ttft_ms: f64,
    pub stall_ms: f64,
    pub peak_mem_bytes: u64,
    /// False when the peak resident memory exceeds the budget.
    pub fits: bool,
}

/// The chosen layout, cached next to the profile it was derived from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutChoice {
    pub n_blocks: usize,
    pub chunk_tokens: usize,
    /// The schedule used for the prediction.
    pub schedule: String,
    pub prompt_tokens: usize,
    pub overheads: Overheads,
    /// Prediction for the chosen candidate.
    pub predicted: CandidateResult,
    /// Every candidate evaluated, in evaluation order.
    pub candidates: Vec<CandidateResult>,
    /// Layouts measured by warm-up, each simulated on its own measured profile (in
    /// measurement order; empty when the choice is a prediction only).
    #[serde(default)]
    pub measured: Vec<CandidateResult>,
}

/// Layers of a block label: "a-b" (inclusive) or "a".
fn label_layers(label: &str) -> Option<usize> {
    let mut it = label.trim().splitn(2, '-');
    let a: usize = it.next()?.trim().parse().ok()?;
    let b: usize = match it.next() {
        Some(b) => b.trim().parse().ok()?,
        None => a,
    };
    (b >= a).then_some(b - a + 1)
}

/// Layers per block of `p`, from its labels.
pub fn block_layers(p: &Profile) -> Result<Vec<usize>> {
    p.blocks
        .iter()
        .map(|b| {
            label_layers(&b.layers).ok_or_else(|| {
                ScheduleError::Profile(format!(
                    "block label {:?} is not a layer range like \"0-3\"",
                    b.layers
                ))
            })
        })
        .collect()
}

/// The predicted profile of `p`'s model cut into `n_blocks` blocks with chunks of
/// `chunk_tokens` (see the module docs).
pub fn rescale(
    p: &Profile,
    n_blocks: usize,
    chunk_tokens: usize,
    oh: Overheads,
) -> Result<Profile> {
    let per_block = block_layers(p)?;
    let n_layers: usize = per_block.iter().sum();
    if n_blocks == 0 || !n_layers.is_multiple_of(n_blocks) {
        return Err(ScheduleError::Profile(format!(
            "{n_blocks} blocks do not divide {n_layers} layers"
        )));
    }
    if chunk_tokens == 0 || !chunk_tokens.is_multiple_of(p.g2_tokens) {
        return Err(ScheduleError::Profile(format!(
            "chunk of {chunk_tokens} tokens is not a multiple of the G2 shape {}",
            p.g2_tokens
        )));
    }
    let c0 = p.chunk_tokens as f64;
    let runs0 = c0 / p.g2_tokens as f64;
    // Per-layer costs: [g1 per token, g2 per token, load, unload, mem g1, mem g2].
    let mut layer = Vec::with_capacity(n_layers);
    for (b, &nl) in p.blocks.iter().zip(&per_block) {
        let l = nl as f64;
        let v = [
            (b.g1_chunk_ms - oh.call_ms).max(0.0) / (l * c0),
            (b.g2_chunk_ms - oh.call_ms * runs0).max(0.0) / (l * c0),
            (b.load_g2_ms - oh.load_ms).max(0.0) / l,
            b.unload_g1_ms / l,
            b.mem_g1_bytes as f64 / l,
            b.mem_g2_bytes as f64 / l,
        ];
        layer.extend(std::iter::repeat_n(v, nl));
    }
    let per = n_layers / n_blocks;
    let c = chunk_tokens as f64;
    let runs = c / p.g2_tokens as f64;
    let round_ms = |v: f64| (v * 1e6).round() / 1e6;
    let blocks = (0..n_blocks)
        .map(|i| {
            let s = layer[i * per..(i + 1) * per]
                .iter()
                .fold([0.0; 6], |mut a, v| {
                    a.iter_mut().zip(v).for_each(|(a, v)| *a += v);
                    a
                });
            BlockProfile {
                layers: format!("{}-{}", i * per, (i + 1) * per - 1),
                g1_chunk_ms: round_ms(oh.call_ms + s[0] * c),
                g2_chunk_ms: round_ms(oh.call_ms * runs + s[1] * c),
                load_g2_ms: round_ms(oh.load_ms + s[2]),
                unload_g1_ms: round_ms(s[3]),
                mem_g1_bytes: s[4].round() as u64,
                mem_g2_bytes: s[5].round() as u64,
            }
        })
        .collect();
    let out = Profile {
        source: format!(
            "predicted from {} ({} blocks, chunk {})",
            p.source,
            p.n_blocks(),
            p.chunk_tokens
        ),
        chunk_tokens,
        blocks,
        ..p.clone()
    };
    out.validate()?;
    Ok(out)
}

/// Evaluates every (block count dividing the layers, chunk that is a multiple of the G2
/// shape) candidate for a prompt and returns the best that fits the budget.
pub fn choose(
    p: &Profile,
    prompt_tokens: usize,
    budget: MemoryBudget,
    kind: ScheduleKind,
    block_counts: &[usize],
    chunk_sizes: &[usize],
    oh: Overheads,
) -> Result<LayoutChoice> {
    let n_layers: usize = block_layers(p)?.iter().sum();
    let mut candidates = Vec::new();
    for &n in block_counts {
        if n == 0 || !n_layers.is_multiple_of(n) {
            continue;
        }
        for &c in chunk_sizes {
            if c == 0 || !c.is_multiple_of(p.g2_tokens) {
                continue;
            }
            let q = rescale(p, n, c, oh)?;
            let inst = match Instance::from_profile(&q, prompt_tokens, budget) {
                Ok(i) => i,
                // Below one form per block: this candidate cannot run at all.
                Err(_) if matches!(budget, MemoryBudget::Bytes(_)) => continue,
                Err(e) => return Err(e),
            };
            let plan = match kind.plan(&inst) {
                Ok(plan) => plan,
                Err(ScheduleError::TooLarge(_)) => continue,
                Err(e) => return Err(e),
            };
            let sim = simulate(&inst, &plan)?;
            let m = sim.metrics;
            let fits = match budget {
                MemoryBudget::OneFormPerBlock => true,
                MemoryBudget::Bytes(b) => sim.peak_mem <= b,
            };
            candidates.push(CandidateResult {
                n_blocks: n,
                chunk_tokens: c,
                prefill_ms: m.prefill_ms,
                switch_ms: m.switch_ms,
                ttft_ms: m.ttft_ms,
                stall_ms: m.stall_ms,
                peak_mem_bytes: sim.peak_mem,
                fits,
            });
        }
    }
    let best = candidates
        .iter()
        .filter(|c| c.fits)
        .min_by(|a, b| {
            a.ttft_ms
                .total_cmp(&b.ttft_ms)
                .then(a.n_blocks.cmp(&b.n_blocks))
                .then(b.chunk_tokens.cmp(&a.chunk_tokens))
        })
        .cloned()
        .ok_or_else(|| {
            ScheduleError::Profile(format!(
                "no (blocks, chunk) candidate for {n_layers} layers fits the memory budget \
                 (blocks tried {block_counts:?}, chunks {chunk_sizes:?}, G2 shape {})",
                p.g2_tokens
            ))
        })?;
    Ok(LayoutChoice {
        n_blocks: best.n_blocks,
        chunk_tokens: best.chunk_tokens,
        schedule: kind.name().into(),
        prompt_tokens,
        overheads: oh,
        predicted: best,
        candidates,
        measured: Vec::new(),
    })
}

/// Per-graph-call and per-load overheads fitted by least squares to measured profiles of
/// different layouts. Per profile (N blocks, chunk C, G2 runs R = C/g2), summed over blocks:
/// `G1 = N·call + C·a1`, `G2 = N·R·call + C·a2`, `load = N·load + w` with unknowns `call`,
/// `a1`, `a2` (the model's compute per token on each form) and `load`, `w`. `None` when
/// the layouts do not determine them (one layout, or only proportional ones); negative
/// fits are clamped to zero.
pub fn fit_overheads(profiles: &[Profile]) -> Option<Overheads> {
    // Rows of [call, a1, a2] = y.
    let mut rows: Vec<([f64; 3], f64)> = Vec::new();
    let mut load_rows: Vec<([f64; 2], f64)> = Vec::new();
    for p in profiles {
        let (n, c) = (p.n_blocks() as f64, p.chunk_tokens as f64);
        let r = c / p.g2_tokens.max(1) as f64;
        let g1: f64 = p.blocks.iter().map(|b| b.g1_chunk_ms).sum();
        let g2: f64 = p.blocks.iter().map(|b| b.g2_chunk_ms).sum();
        let ld: f64 = p.blocks.iter().map(|b| b.load_g2_ms).sum();
        rows.push(([n, c, 0.0], g1));
        rows.push(([n * r, 0.0, c], g2));
        load_rows.push(([n, 1.0], ld));
    }
    let call = solve_normal::<3>(&rows)?[0].max(0.0);
    let load = solve_normal::<2>(&load_rows).map_or(0.0, |x| x[0].max(0.0));
    let round = |v: f64| (v * 1e6).round() / 1e6;
    Some(Overheads {
        call_ms: round(call),
        load_ms: round(load),
    })
}

/// Least squares `min |Xβ − y|` through the normal equations (Gaussian elimination with
/// partial pivoting); `None` if `XᵀX` is (numerically) singular.
fn solve_normal<const K: usize>(rows: &[([f64; K], f64)]) -> Option<[f64; K]> {
    let mut a = [[0.0f64; K]; K];
    let mut b = [0.0f64; K];
    for (x, y) in rows {
        for i in 0..K {
            b[i] += x[i] * y;
            for j in 0..K {
                a[i][j] += x[i] * x[j];
            }
        }
    }
    let scale = (0..K).map(|i| a[i][i]).fold(0.0, f64::max);
    if scale <= 0.0 {
        return None;
    }
    for col in 0..K {
        let piv = (col..K).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[piv][col].abs() <= 1e-9 * scale {
            return None;
        }
        a.swap(col, piv);
        b.swap(col, piv);
        for r in col + 1..K {
            let f = a[r][col] / a[col][col];
            let prow = a[col];
            for (x, p) in a[r][col..].iter_mut().zip(&prow[col..]) {
                *x -= f * p;
            }
            b[r] -= f * b[col];
        }
    }
    let mut x = [0.0f64; K];
    for i in (0..K).rev() {
        let s: f64 = (i + 1..K).map(|j| a[i][j] * x[j]).sum();
        x[i] = (b[i] - s) / a[i][i];
    }
    Some(x)
}

/// A layout simulated on its own (measured) profile; `None` if it cannot run at all.
pub fn evaluate(
    p: &Profile,
    prompt_tokens: usize,
    budget: MemoryBudget,
    kind: ScheduleKind,
) -> Result<Option<CandidateResult>> {
    let inst = match Instance::from_profile(p, prompt_tokens, budget) {
        Ok(i) => i,
        Err(_) if matches!(budget, MemoryBudget::Bytes(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let plan = match kind.plan(&inst) {
        Ok(plan) => plan,
        Err(ScheduleError::TooLarge(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let sim = simulate(&inst, &plan)?;
    let m = sim.metrics;
    Ok(Some(CandidateResult {
        n_blocks: p.n_blocks(),
        chunk_tokens: p.chunk_tokens,
        prefill_ms: m.prefill_ms,
        switch_ms: m.switch_ms,
        ttft_ms: m.ttft_ms,
        stall_ms: m.stall_ms,
        peak_mem_bytes: sim.peak_mem,
        fits: match budget {
            MemoryBudget::OneFormPerBlock => true,
            MemoryBudget::Bytes(b) => sim.peak_mem <= b,
        },
    }))
}

/// [`choose`], then measurement of the layouts the answer hinges on (see the module
/// docs). `base` is a measured profile; `measure(n_blocks, chunk_tokens)` warms up (or
/// reads from its cache) another layout; at most `max_measure` layouts besides `base` are
/// measured. Overheads come from [`fit_overheads`] once two layouts are measured, from
/// [`Overheads::estimate`] before.
#[allow(clippy::too_many_arguments)]
pub fn choose_measured(
    base: &Profile,
    prompt_tokens: usize,
    budget: MemoryBudget,
    kind: ScheduleKind,
    block_counts: &[usize],
    chunk_sizes: &[usize],
    max_measure: usize,
    mut measure: impl FnMut(usize, usize) -> Result<Profile>,
) -> Result<LayoutChoice> {
    let layout = |p: &Profile| (p.n_blocks(), p.chunk_tokens);
    let in_set = |(n, c): (usize, usize)| block_counts.contains(&n) && chunk_sizes.contains(&c);
    let better = |a: &&CandidateResult, b: &&CandidateResult| {
        a.ttft_ms
            .total_cmp(&b.ttft_ms)
            .then(a.n_blocks.cmp(&b.n_blocks))
            .then(b.chunk_tokens.cmp(&a.chunk_tokens))
    };
    let mut profiles = vec![base.clone()];
    let mut measured = Vec::new();
    if in_set(layout(base)) {
        measured.extend(evaluate(base, prompt_tokens, budget, kind)?);
    }
    loop {
        let oh = fit_overheads(&profiles).unwrap_or_else(|| Overheads::estimate(base));
        let mut choice = choose(
            base,
            prompt_tokens,
            budget,
            kind,
            block_counts,
            chunk_sizes,
            oh,
        )?;
        // Measured layouts count with their measured figures, the others as predicted.
        let best = choice
            .candidates
            .iter()
            .filter(|c| {
                !measured.iter().any(|m: &CandidateResult| {
                    m.n_blocks == c.n_blocks && m.chunk_tokens == c.chunk_tokens
                })
            })
            .chain(&measured)
            .filter(|c| c.fits)
            .min_by(better)
            .cloned();
        let want = best.as_ref().map(|b| (b.n_blocks, b.chunk_tokens));
        let done = want.is_none_or(|w| profiles.iter().any(|p| layout(p) == w));
        if done || profiles.len() > max_measure {
            if let Some(b) = measured.iter().filter(|c| c.fits).min_by(better) {
                choice.n_blocks = b.n_blocks;
                choice.chunk_tokens = b.chunk_tokens;
                choice.predicted = b.clone();
            }
            choice.measured = measured;
            return Ok(choice);
        }
        let want = want.expect("not done");
        let p = measure(want.0, want.1)?;
        if layout(&p) != want {
            return Err(ScheduleError::Profile(format!(
                "asked to measure {want:?}, got a profile of {:?}",
                layout(&p)
            )));
        }
        measured.extend(evaluate(&p, prompt_tokens, budget, kind)?);
        profiles.push(p);
    }
}

impl LayoutChoice {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("choice serializes")
    }

    /// Reads a cached choice; `None` if the file is missing or not a choice (it is then
    /// simply recomputed).
    pub fn load(path: &std::path::Path) -> Option<LayoutChoice> {
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
    }

    /// Writes atomically (temp file + rename).
    pub fn save(&self, path: &std::path::Path) -> Result<()> {
        let io = |source| ScheduleError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.to_json()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// Where the choice derived from the profile cached at `profile_path` is kept (one file
/// per prompt length and budget, since both change the answer).
pub fn choice_path(
    profile_path: &std::path::Path,
    prompt_tokens: usize,
    budget: MemoryBudget,
) -> std::path::PathBuf {
    let b = match budget {
        MemoryBudget::OneFormPerBlock => "one-form".to_string(),
        MemoryBudget::Bytes(b) => format!("{b}B"),
    };
    profile_path.with_extension(format!("choice-p{prompt_tokens}-{b}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::PROFILE_FORMAT;

    /// 4 one-layer blocks, chunks of 32, G2 runs of 32 (so G1 and G2 cost the same).
    fn profile(g1_ms: f64, load_ms: f64) -> Profile {
        Profile {
            format: PROFILE_FORMAT.into(),
            model: "hand".into(),
            backend: "sim".into(),
            machine: "test".into(),
            source: "hand-made".into(),
            chunk_tokens: 32,
            g2_tokens: 32,
            decode_step_ms: 1.0,
            switch_needed: true,
            blocks: (0..4)
                .map(|i| BlockProfile {
                    layers: format!("{i}-{i}"),
                    g1_chunk_ms: g1_ms,
                    g2_chunk_ms: g1_ms,
                    load_g2_ms: load_ms,
                    unload_g1_ms: 0.0,
                    mem_g1_bytes: 100,
                    mem_g2_bytes: 100,
                })
                .collect(),
        }
    }

    #[test]
    fn rescaling_to_the_profiled_layout_is_the_identity_and_totals_are_kept() {
        let oh = Overheads {
            call_ms: 0.5,
            load_ms: 0.25,
        };
        let p = profile(2.0, 3.0);
        let same = rescale(&p, 4, 32, oh).unwrap();
        assert_eq!(same.blocks, p.blocks);
        let two = rescale(&p, 2, 64, oh).unwrap();
        assert_eq!(two.blocks[1].layers, "2-3");
        // Two layers of 1.5 ms compute per 32 tokens, 64 tokens, plus one call.
        assert_eq!(two.blocks[0].g1_chunk_ms, 0.5 + 2.0 * 1.5 * 2.0);
        assert_eq!(two.blocks[0].load_g2_ms, 0.25 + 2.0 * 2.75);
        assert_eq!(two.blocks[0].mem_g1_bytes, 200);
        assert!(
            rescale(&p, 3, 32, oh).is_err(),
            "3 does not divide 4 layers"
        );
        assert!(
            rescale(&p, 2, 48, oh).is_err(),
            "48 is not a multiple of 32"
        );
    }

    /// Free loads and a large per-call overhead: one block and the largest chunk that
    /// covers the prompt win. Hand-computed: 256 tokens in one G1 run of 4 layers at
    /// 0.01 ms per layer-token plus 10 ms per call = 20.24 ms; + 1 ms decode.
    #[test]
    fn call_overhead_picks_one_block_and_the_largest_chunk() {
        let oh = Overheads {
            call_ms: 10.0,
            load_ms: 0.0,
        };
        let p = profile(10.0 + 32.0 * 0.01, 0.0);
        let c = choose(
            &p,
            256,
            MemoryBudget::OneFormPerBlock,
            ScheduleKind::ProgressiveWc,
            &DEFAULT_BLOCKS,
            &DEFAULT_CHUNKS,
            oh,
        )
        .unwrap();
        assert_eq!((c.n_blocks, c.chunk_tokens), (1, 256));
        assert!(
            (c.predicted.ttft_ms - 21.24).abs() < 1e-6,
            "{:?}",
            c.predicted
        );
        // Blocks 1, 2, 4 (6, 8, 12, 24 do not divide 4 layers) x 4 chunk sizes.
        assert_eq!(c.candidates.len(), 12);
    }

    /// No overheads, expensive loads: with one block nothing can hide the load (the
    /// block cannot compute while it switches), so the whole 8 ms load stalls; four
    /// blocks hide three of the four 2 ms loads behind later blocks' compute.
    #[test]
    fn expensive_loads_pick_more_blocks() {
        let p = profile(1.0, 2.0);
        let c = choose(
            &p,
            256,
            MemoryBudget::OneFormPerBlock,
            ScheduleKind::ProgressiveWc,
            &[1, 2, 4],
            &[32],
            Overheads::default(),
        )
        .unwrap();
        let one = &c.candidates[0];
        assert_eq!(one.n_blocks, 1);
        // 8 chunks x 4 layers x 1 ms, then the 8 ms load; + 1 ms decode.
        assert!((one.ttft_ms - (32.0 + 8.0 + 1.0)).abs() < 1e-6, "{one:?}");
        // Four blocks: each 2 ms load runs while the other three blocks compute 3 ms, and
        // G2 costs what G1 does, so every load hides: 32 ms prefill + 1 ms decode.
        assert_eq!(c.n_blocks, 4);
        assert!(
            (c.predicted.ttft_ms - 33.0).abs() < 1e-6,
            "{:?}",
            c.predicted
        );
        assert_eq!(c.predicted.stall_ms, 0.0);
    }

    /// The paper-derived phone profile (28 layers in 7 blocks, chunks of 256, G2 of 64):
    /// every divisor layout is evaluated, and the choice is no worse than the profiled
    /// layout's own prediction.
    #[test]
    fn paper_profile_choice_beats_or_equals_the_profiled_layout() {
        let p = Profile::paper_phone();
        let blocks = default_block_counts(28);
        assert_eq!(blocks, [1, 2, 4, 7, 14]);
        let c = choose(
            &p,
            1024,
            MemoryBudget::OneFormPerBlock,
            ScheduleKind::ProgressiveWc,
            &blocks,
            &DEFAULT_CHUNKS,
            Overheads::default(),
        )
        .unwrap();
        let own = c
            .candidates
            .iter()
            .find(|r| (r.n_blocks, r.chunk_tokens) == (7, 256))
            .unwrap();
        assert!(c.predicted.ttft_ms <= own.ttft_ms);
        assert_eq!(c.candidates.len(), 5 * 3, "32 is not a multiple of 64");
    }

    #[test]
    fn overhead_estimate_charges_g2_extra_time_to_calls() {
        let mut p = profile(2.0, 1.0);
        p.chunk_tokens = 128; // 4 G2 runs per chunk
        p.blocks
            .iter_mut()
            .for_each(|b| b.g2_chunk_ms = 2.0 + 3.0 * 0.5);
        assert_eq!(Overheads::estimate(&p).call_ms, 0.5);
        assert_eq!(Overheads::estimate(&profile(2.0, 1.0)).call_ms, 0.0);
    }

    #[test]
    fn a_budget_that_fits_no_candidate_is_an_error() {
        let p = profile(1.0, 2.0);
        let e = choose(
            &p,
            256,
            MemoryBudget::Bytes(10),
            ScheduleKind::Progressive,
            &DEFAULT_BLOCKS,
            &DEFAULT_CHUNKS,
            Overheads::default(),
        );
        assert!(e.is_err());
        let mut bad = p.clone();
        bad.blocks[0].layers = "first".into();
        assert!(block_layers(&bad).is_err());
    }

    /// A "true" machine: per call 2 ms, per load 1 ms, per layer-token 0.01 ms on G1 and
    /// 0.012 ms on G2, per layer load 0.5 ms. Profiles of any layout follow exactly.
    fn true_profile(n_blocks: usize, chunk: usize) -> Profile {
        let per = 4 / n_blocks;
        let c = chunk as f64;
        let mut p = profile(0.0, 0.0);
        p.g2_tokens = 16;
        p.chunk_tokens = chunk;
        p.blocks = (0..n_blocks)
            .map(|i| BlockProfile {
                layers: format!("{}-{}", i * per, (i + 1) * per - 1),
                g1_chunk_ms: 2.0 + 0.01 * per as f64 * c,
                g2_chunk_ms: 2.0 * c / 16.0 + 0.012 * per as f64 * c,
                load_g2_ms: 1.0 + 0.5 * per as f64,
                unload_g1_ms: 0.0,
                mem_g1_bytes: 100,
                mem_g2_bytes: 100,
            })
            .collect();
        p
    }

    #[test]
    fn overheads_are_recovered_from_two_measured_layouts() {
        assert_eq!(fit_overheads(&[true_profile(4, 32)]), None);
        let oh = fit_overheads(&[true_profile(4, 32), true_profile(2, 64)]).unwrap();
        assert!((oh.call_ms - 2.0).abs() < 1e-6, "{oh:?}");
        assert!((oh.load_ms - 1.0).abs() < 1e-6, "{oh:?}");
        // Same block count and chunk twice: nothing to separate.
        assert_eq!(
            fit_overheads(&[true_profile(2, 32), true_profile(2, 32)]),
            None
        );
    }

    /// The measured choice warms up the layouts the prediction points at, stops when the
    /// best is measured, and answers with measured figures only.
    #[test]
    fn measured_choice_measures_what_it_picks() {
        let mut asked = Vec::new();
        let c = choose_measured(
            &true_profile(4, 32),
            256,
            MemoryBudget::OneFormPerBlock,
            ScheduleKind::ProgressiveWc,
            &[1, 2, 4],
            &[32, 64, 128],
            3,
            |n, ch| {
                asked.push((n, ch));
                Ok(true_profile(n, ch))
            },
        )
        .unwrap();
        assert!(!asked.is_empty() && asked.len() <= 3, "{asked:?}");
        assert!(!asked.contains(&(4, 32)), "the base is not measured again");
        assert_eq!(c.measured.len(), 1 + asked.len());
        let picked = c
            .measured
            .iter()
            .find(|m| (m.n_blocks, m.chunk_tokens) == (c.n_blocks, c.chunk_tokens))
            .unwrap();
        assert_eq!(&c.predicted, picked);
        assert!(c.measured.iter().all(|m| m.ttft_ms >= picked.ttft_ms));
        // With the true overheads fitted, every measured layout's prediction equals its
        // measurement (the model of the module docs is exact for this machine).
        for m in &c.measured[1..] {
            let pred = c
                .candidates
                .iter()
                .find(|x| (x.n_blocks, x.chunk_tokens) == (m.n_blocks, m.chunk_tokens))
                .unwrap();
            assert!((pred.ttft_ms - m.ttft_ms).abs() < 1e-3, "{pred:?} vs {m:?}");
        }
        // A measurement budget of zero only evaluates the base.
        let c0 = choose_measured(
            &true_profile(4, 32),
            256,
            MemoryBudget::OneFormPerBlock,
            ScheduleKind::ProgressiveWc,
            &[1, 2, 4],
            &[32, 64, 128],
            0,
            |_, _| panic!("nothing may be measured"),
        )
        .unwrap();
        assert_eq!((c0.n_blocks, c0.chunk_tokens), (4, 32));
    }

    #[test]
    fn choice_round_trips_through_its_cache_file() {
        let p = profile(1.0, 2.0);
        let c = choose(
            &p,
            100,
            MemoryBudget::OneFormPerBlock,
            ScheduleKind::Progressive,
            &DEFAULT_BLOCKS,
            &DEFAULT_CHUNKS,
            Overheads::default(),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = choice_path(
            &dir.path().join("m--cpu--x--c32.json"),
            100,
            MemoryBudget::OneFormPerBlock,
        );
        assert!(path.ends_with("m--cpu--x--c32.choice-p100-one-form.json"));
        c.save(&path).unwrap();
        assert_eq!(LayoutChoice::load(&path), Some(c));
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(LayoutChoice::load(&path), None);
    }
}
