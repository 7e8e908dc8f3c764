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

use super::instance::{Instance, MemoryBudget};
use super::plan::ScheduleKind;
use super::profile::{BlockProfile, Profile};
use super::sim::simulate;
use super::{Result, ScheduleError};
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
    })
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
    use crate::schedule::profile::PROFILE_FORMAT;

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
