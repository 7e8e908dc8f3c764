//! Sampled decoding that speculation cannot change.
//!
//! The token at generated index `i` (0 = the first token after the prompt) is drawn
//! from the row's distribution with one uniform number that depends only on
//! `(seed, i)`. A verified tree row at index `i` sees the same context as a plain
//! decode step would, and its logits are bit-identical (the runtime's batch
//! invariance, the same property greedy speculation relies on), so it draws the same
//! token. Following the drawn token down the draft tree and stopping at the first
//! row whose draw has no matching child therefore emits exactly the tokens of plain
//! sampled decoding with the same seed, and each token is distributed exactly as the
//! target's tempered, top-p-truncated softmax: speculation stays lossless.

use crate::SpecError;
/// The runtime's greedy rule: the largest logit, ties to the lowest id, NaN never wins.
pub use npu_runtime::session::argmax;

/// Logits more than this many tempered units below the best get weight 0 (their
/// total mass is below `vocab * e^-40`, far under f32 resolution of any probability
/// that matters); skipping their `exp` keeps a 150k-token row cheap.
const CUTOFF: f64 = 40.0;

/// How the next token is chosen from a row of logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy (argmax, ties to the lowest id). Else logits are divided by it.
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose mass reaches this (1: all).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::GREEDY
    }
}

impl Sampling {
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };

    /// Checked constructor: temperature finite and >= 0, top_p in (0, 1].
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Result<Self, SpecError> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(SpecError::Config(format!(
                "temperature must be a number >= 0, not {temperature}"
            )));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(SpecError::Config(format!(
                "top_p must be in (0, 1], not {top_p}"
            )));
        }
        Ok(Sampling {
            temperature,
            top_p,
            seed,
        })
    }

    /// A seed nobody chose (a request or answer without one): the process's random
    /// hasher keys mixed with the clock.
    pub fn fresh_seed() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The sampling of branch `b` of a multi-sample answer: branch 0 is this sampling
    /// itself (one sample equals a plain sampled answer), the others get seeds derived
    /// from this one.
    pub fn for_branch(&self, b: usize) -> Sampling {
        let seed = if b == 0 {
            self.seed
        } else {
            splitmix64(self.seed ^ splitmix64(b as u64 ^ 0xB4A2_C4E5_u64))
        };
        Sampling { seed, ..*self }
    }

    /// The uniform number in [0, 1) that decides generated index `index`.
    pub fn uniform(&self, index: usize) -> f64 {
        let x = splitmix64(self.seed ^ splitmix64(index as u64 ^ 0x5EED_0F5A_u64));
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The token at generated index `index` given its row of logits. `scratch` is
    /// reused between calls (candidates of the row).
    pub fn pick(&self, logits: &[f32], index: usize, scratch: &mut Vec<(f64, u32)>) -> u32 {
        let best = argmax(logits);
        if self.is_greedy() {
            return best;
        }
        let top = logits.get(best as usize).copied().unwrap_or(0.0) as f64;
        if !top.is_finite() {
            return best;
        }
        let t = self.temperature as f64;
        scratch.clear();
        let mut total = 0.0f64;
        for (i, &l) in logits.iter().enumerate() {
            let z = (l as f64 - top) / t;
            // NaN compares false: never a candidate.
            if z >= -CUTOFF {
                let w = z.exp();
                total += w;
                scratch.push((w, i as u32));
            }
        }
        let mut mass = total;
        if self.top_p < 1.0 {
            let want = self.top_p as f64 * total;
            // Only the nucleus needs sorting: if the candidates of weight >= NUCLEUS_FLOOR
            // already reach `want`, the sorted prefix that reaches it lies among them (all
            // of them sort before the rest), so sorting just those gives the same nucleus,
            // in the same order, with the same sums. Otherwise sort everything.
            let heavy: f64 = scratch
                .iter()
                .filter(|c| c.0 >= NUCLEUS_FLOOR)
                .map(|c| c.0)
                .sum();
            // The margin covers the summation order: the sorted running sum of the heavy
            // candidates then surely reaches `want` before they run out.
            if heavy >= want * (1.0 + 1e-9) {
                scratch.retain(|c| c.0 >= NUCLEUS_FLOOR);
            }
            // Most likely first; ties to the lower id so the order is a function of
            // the logits alone.
            scratch.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut acc = 0.0;
            let mut keep = scratch.len();
            for (k, &(w, _)) in scratch.iter().enumerate() {
                acc += w;
                if acc >= want {
                    keep = k + 1;
                    break;
                }
            }
            scratch.truncate(keep);
            mass = acc.min(total);
        }
        let mut target = self.uniform(index) * mass;
        for &(w, id) in scratch.iter() {
            if target < w {
                return id;
            }
            target -= w;
        }
        // Rounding left the draw past the last weight: the last candidate.
        scratch.last().map_or(best, |&(_, id)| id)
    }
}

/// Weight (relative to the most likely token's 1) below which a candidate rarely belongs
/// to a top-p nucleus: the pre-filter of [`Sampling::pick`]'s sort.
const NUCLEUS_FLOOR: f64 = 1e-4;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Sampling::pick`] with the whole candidate list sorted (no nucleus pre-filter).
    fn pick_full_sort(s: &Sampling, logits: &[f32], index: usize) -> u32 {
        let best = argmax(logits);
        let top = logits[best as usize] as f64;
        let t = s.temperature as f64;
        let mut c: Vec<(f64, u32)> = Vec::new();
        let mut total = 0.0f64;
        for (i, &l) in logits.iter().enumerate() {
            let z = (l as f64 - top) / t;
            if z >= -CUTOFF {
                let w = z.exp();
                total += w;
                c.push((w, i as u32));
            }
        }
        c.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let want = s.top_p as f64 * total;
        let (mut acc, mut keep) = (0.0, c.len());
        for (k, &(w, _)) in c.iter().enumerate() {
            acc += w;
            if acc >= want {
                keep = k + 1;
                break;
            }
        }
        c.truncate(keep);
        let mut target = s.uniform(index) * acc.min(total);
        for &(w, id) in &c {
            if target < w {
                return id;
            }
            target -= w;
        }
        c.last().map_or(best, |&(_, id)| id)
    }

    #[test]
    fn the_nucleus_prefilter_picks_what_a_full_sort_picks() {
        let mut z = 99u64;
        let mut next = || {
            z = splitmix64(z);
            (z >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut scratch = Vec::new();
        for case in 0..300 {
            let n = 50 + (next() * 3000.0) as usize;
            // Flat, peaked and long-tailed rows; some exact ties.
            let spread = [2.0, 8.0, 30.0][case % 3];
            let logits: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 97 == 5 {
                        3.0
                    } else {
                        (next() * spread) as f32
                    }
                })
                .collect();
            let top_p = [0.5f32, 0.9, 0.95, 0.99, 0.999_99][case % 5];
            let temperature = [0.3f32, 0.7, 1.0, 1.8][case % 4];
            let s = Sampling::new(temperature, top_p, case as u64).unwrap();
            for index in 0..8 {
                assert_eq!(
                    s.pick(&logits, index, &mut scratch),
                    pick_full_sort(&s, &logits, index),
                    "case {case} index {index}"
                );
            }
        }
    }

    #[test]
    fn branch_zero_is_the_sampling_itself_and_others_differ() {
        let s = Sampling::new(0.7, 0.9, 42).unwrap();
        assert_eq!(s.for_branch(0), s);
        let seeds: std::collections::HashSet<u64> = (0..16).map(|b| s.for_branch(b).seed).collect();
        assert_eq!(seeds.len(), 16);
        assert_eq!(s.for_branch(3).temperature, 0.7);
        assert_eq!(s.for_branch(3), s.for_branch(3));
    }

    fn s(t: f32, p: f32, seed: u64) -> Sampling {
        Sampling::new(t, p, seed).unwrap()
    }

    #[test]
    fn greedy_is_argmax_with_ties_to_the_lowest_id() {
        let mut sc = Vec::new();
        let l = [1.0, 3.0, f32::NAN, 3.0, -2.0];
        for i in 0..10 {
            assert_eq!(Sampling::GREEDY.pick(&l, i, &mut sc), 1);
        }
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(Sampling::new(-0.1, 1.0, 0).is_err());
        assert!(Sampling::new(f32::NAN, 1.0, 0).is_err());
        assert!(Sampling::new(f32::INFINITY, 1.0, 0).is_err());
        assert!(Sampling::new(1.0, 0.0, 0).is_err());
        assert!(Sampling::new(1.0, 1.5, 0).is_err());
        assert!(Sampling::new(0.7, 0.9, 3).is_ok());
    }

    #[test]
    fn draws_depend_only_on_seed_and_index() {
        let a = s(1.0, 1.0, 7);
        let b = s(1.0, 1.0, 8);
        assert_eq!(a.uniform(5), a.uniform(5));
        assert_ne!(a.uniform(5), a.uniform(6));
        assert_ne!(a.uniform(5), b.uniform(5));
        for i in 0..1000 {
            let u = a.uniform(i);
            assert!((0.0..1.0).contains(&u));
        }
    }

    /// Frequencies over many indices match softmax(logits / T) (chi-square-like bound).
    #[test]
    fn frequencies_follow_the_tempered_softmax() {
        let logits = [0.0f32, 1.0, 2.0, 0.5, -1.0];
        for &t in &[0.5f32, 1.0, 1.7] {
            let sm = s(t, 1.0, 11);
            let z: Vec<f64> = logits
                .iter()
                .map(|&l| (l as f64 / t as f64).exp())
                .collect();
            let tot: f64 = z.iter().sum();
            let n = 200_000;
            let mut counts = [0usize; 5];
            let mut sc = Vec::new();
            for i in 0..n {
                counts[sm.pick(&logits, i, &mut sc) as usize] += 1;
            }
            for k in 0..5 {
                let p = z[k] / tot;
                let f = counts[k] as f64 / n as f64;
                let sd = (p * (1.0 - p) / n as f64).sqrt();
                assert!((f - p).abs() < 5.0 * sd + 1e-9, "t={t} k={k}: {f} vs {p}");
            }
        }
    }

    #[test]
    fn top_p_keeps_only_the_nucleus_in_proportion() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 at T = 1 (log weights).
        let logits = [
            (0.5f64).ln() as f32,
            (0.25f64).ln() as f32,
            (0.125f64).ln() as f32,
            (0.125f64).ln() as f32,
        ];
        // 0.7 needs the two most likely: 2/3 and 1/3 of the draws.
        let sm = s(1.0, 0.7, 3);
        let mut sc = Vec::new();
        let n = 60_000;
        let mut counts = [0usize; 4];
        for i in 0..n {
            counts[sm.pick(&logits, i, &mut sc) as usize] += 1;
        }
        assert_eq!(counts[2] + counts[3], 0, "{counts:?}");
        let f0 = counts[0] as f64 / n as f64;
        assert!((f0 - 2.0 / 3.0).abs() < 0.01, "{counts:?}");
        // A tiny top_p keeps the argmax alone.
        let sm = s(1.0, 0.01, 3);
        for i in 0..100 {
            assert_eq!(sm.pick(&logits, i, &mut sc), 0);
        }
    }

    #[test]
    fn rows_without_a_finite_logit_fall_back_to_argmax() {
        let mut sc = Vec::new();
        let l = [f32::NAN, f32::NEG_INFINITY, f32::NAN];
        assert_eq!(s(1.0, 1.0, 1).pick(&l, 0, &mut sc), 0);
        assert_eq!(s(1.0, 0.5, 1).pick(&[], 0, &mut sc), 0);
    }
}
