//! Learned acceptance of draft nodes (calibrated tree scores).
//!
//! Every trie node carries features: its source, a source-specific strength
//! (suffix-match length, calibrated top-k probability, ...) and its index along the
//! source's candidate. Once the true continuation is known, each node whose parent
//! lay on the true path is a trial: accepted or not. Per feature we keep a decaying
//! hit rate, shrunk towards the heuristic prior the drafter gave the node, and rank
//! nodes by the product of these conditionals along their path: the estimated
//! probability that the node is accepted. The expected accepted length of a cut
//! tree is the sum of these over its nodes, so ranking by them and taking the best
//! `budget` nodes is the expected-acceptance-greedy tree under the budget.

/// Feature kinds (one per draft source).
pub const KIND_SELF: u8 = 0;
pub const KIND_DB: u8 = 1;
pub const KIND_CALIB: u8 = 2;
pub const KIND_EXT: u8 = 3;
pub const KIND_PLD: u8 = 4;
/// Own-context automaton nodes whose text lies in the calibrated prompt: the
/// strength also says where the text token ranked in the prefill's top-k there.
pub const KIND_SELF_CAL: u8 = 5;
pub const KIND_OTHER: u8 = 6;
const KINDS: usize = 7;
const STRENGTHS: usize = 16;
const STEPS: usize = 8;
pub const N_FEATURES: usize = KINDS * STRENGTHS * STEPS;
/// Learned keys: a node's strongest feature, alone or confirmed by other sources.
pub const N_KEYS: usize = 2 * N_FEATURES;

/// Key of a node from its strongest feature and whether several candidates (other
/// sources, or other matches) proposed the same token there: agreement is its own
/// evidence, and keeping it apart stops it from inflating single-source estimates.
pub fn node_key(best: u16, agreed: bool) -> u16 {
    best + if agreed { N_FEATURES as u16 } else { 0 }
}

/// Feature id of a node: `kind`, `strength` (0..8, saturating) and its index
/// along the inserted candidate (0..8, saturating).
pub fn feature(kind: u8, strength: usize, step: usize) -> u16 {
    let k = (kind as usize).min(KINDS - 1);
    (k * STRENGTHS * STEPS + strength.min(STRENGTHS - 1) * STEPS + step.min(STEPS - 1)) as u16
}

/// Strength bucket of a suffix-match length.
pub fn match_strength(len: usize) -> usize {
    match len {
        0 | 1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        5..=7 => 4,
        8..=15 => 5,
        16..=31 => 6,
        _ => 7,
    }
}

/// Strength of an own-context node with calibration: suffix-match length class
/// (1-2, 3-4, 5-15, 16+) x where the text token ranked among the prefill's
/// top-k successors of its position (first, lower, absent).
pub fn calibrated_match_strength(len: usize, rank: Option<usize>) -> usize {
    let m = match len {
        0..=2 => 0,
        3 | 4 => 1,
        5..=15 => 2,
        _ => 3,
    };
    let r = match rank {
        Some(0) => 0,
        Some(_) => 1,
        None => 2,
    };
    m * 3 + r
}

/// Strength bucket of a probability.
pub fn prob_strength(p: f32) -> usize {
    const EDGES: [f32; 7] = [0.1, 0.3, 0.5, 0.7, 0.85, 0.95, 0.99];
    EDGES.iter().take_while(|&&e| p >= e).count()
}

/// Decaying per-feature acceptance counts.
#[derive(Clone, Debug)]
pub struct AcceptModel {
    hits: Vec<f32>,
    trials: Vec<f32>,
    /// Weight of the heuristic prior, in pseudo-trials.
    prior_weight: f32,
    /// Forgetting per trial of a feature, so estimates follow the current text.
    decay: f32,
}

impl Default for AcceptModel {
    fn default() -> Self {
        AcceptModel {
            hits: vec![0.0; N_KEYS],
            trials: vec![0.0; N_KEYS],
            prior_weight: 4.0,
            decay: 0.995,
        }
    }
}

impl AcceptModel {
    /// Estimated probability that a node with this key is accepted given that its
    /// parent is, where the drafter's own guess was `prior`.
    pub fn p(&self, feat: u16, prior: f32) -> f32 {
        let f = feat as usize;
        let (h, n) = (self.hits[f], self.trials[f]);
        ((h + self.prior_weight * prior) / (n + self.prior_weight)).clamp(0.0, 1.0)
    }

    pub fn observe(&mut self, feat: u16, hit: bool) {
        let f = feat as usize;
        self.trials[f] = self.trials[f] * self.decay + 1.0;
        self.hits[f] = self.hits[f] * self.decay + if hit { 1.0 } else { 0.0 };
    }

    /// Trials seen for a key (decayed).
    pub fn trials(&self, feat: u16) -> f32 {
        self.trials[feat as usize]
    }

    /// The learned counts, for a later process to start from.
    pub fn counts(&self) -> AcceptCounts {
        AcceptCounts {
            hits: self.hits.clone(),
            trials: self.trials.clone(),
        }
    }

    /// Starts from `c` (an earlier [`Self::counts`]); refused, and nothing changed,
    /// unless it has one count per key, finite, with `0 <= hits <= trials`.
    pub fn restore(&mut self, c: &AcceptCounts) -> Result<(), String> {
        let valid = c.hits.len() == N_KEYS
            && c.trials.len() == N_KEYS
            && c.hits.iter().zip(&c.trials).all(|(&h, &n)| {
                h.is_finite() && n.is_finite() && h >= 0.0 && h <= n * (1.0 + 1e-5) + 1e-5
            });
        if !valid {
            return Err("malformed acceptance counts".into());
        }
        self.hits.clone_from(&c.hits);
        self.trials.clone_from(&c.trials);
        Ok(())
    }
}

/// [`AcceptModel`]'s decayed hits and trials per key.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AcceptCounts {
    pub hits: Vec<f32>,
    pub trials: Vec<f32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_distinct_and_saturate() {
        let mut seen = std::collections::HashSet::new();
        for k in 0..KINDS as u8 {
            for s in 0..STRENGTHS {
                for d in 0..STEPS {
                    assert!(seen.insert(feature(k, s, d)));
                }
            }
        }
        assert_eq!(seen.len(), N_FEATURES);
        assert_eq!(feature(9, 99, 99) as usize, N_FEATURES - 1);
        assert_eq!(node_key(feature(9, 99, 99), true) as usize, N_KEYS - 1);
        assert_ne!(node_key(3, true), node_key(3, false));
        assert_eq!(match_strength(1), 0);
        assert_eq!(match_strength(6), 4);
        assert_eq!(match_strength(100), 7);
        assert_eq!(prob_strength(0.0), 0);
        assert_eq!(prob_strength(0.96), 6);
        assert_eq!(prob_strength(1.0), 7);
    }

    #[test]
    fn counts_restore_the_same_estimates_and_refuse_nonsense() {
        let mut m = AcceptModel::default();
        let f = feature(KIND_DB, 2, 1);
        for i in 0..50 {
            m.observe(f, i % 3 == 0);
        }
        let mut fresh = AcceptModel::default();
        fresh.restore(&m.counts()).unwrap();
        assert_eq!(fresh.p(f, 0.5), m.p(f, 0.5));
        assert_ne!(AcceptModel::default().p(f, 0.5), m.p(f, 0.5));
        let mut bad = m.counts();
        bad.hits[7] = bad.trials[7] + 1.0;
        assert!(fresh.restore(&bad).is_err());
        bad = m.counts();
        bad.trials.pop();
        assert!(fresh.restore(&bad).is_err());
        bad = m.counts();
        bad.trials[3] = f32::NAN;
        assert!(fresh.restore(&bad).is_err());
        // A refused restore leaves the model as it was.
        assert_eq!(fresh.p(f, 0.5), m.p(f, 0.5));
    }

    #[test]
    fn estimate_moves_from_prior_to_observed_rate() {
        let mut m = AcceptModel::default();
        let f = feature(KIND_SELF, 3, 0);
        assert!((m.p(f, 0.5) - 0.5).abs() < 1e-6);
        for i in 0..400 {
            m.observe(f, i % 10 == 0);
        }
        assert!((m.p(f, 0.5) - 0.1).abs() < 0.03, "{}", m.p(f, 0.5));
        // Other features keep their prior.
        assert!((m.p(feature(KIND_DB, 3, 0), 0.7) - 0.7).abs() < 1e-6);
    }
}
