//! Per-run measurements: steps, acceptance, latency, and the paper's split of
//! verify compute into valid / wasted / underutilized rows.

use serde::Serialize;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum StopReason {
    #[default]
    MaxTokens,
    EndOfGeneration,
    ContextFull,
    /// The caller asked to stop (cancellation, closed output).
    Stopped,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Metrics {
    pub runs: usize,
    pub prompt_tokens: usize,
    /// Tokens returned (the first one comes from prefill).
    pub tokens: usize,
    /// Verification steps (each a forward pass of the decode graph).
    pub steps: usize,
    /// Tokens produced by verification steps (accepted drafts + bonus), before
    /// truncation at EOG / max tokens.
    pub step_tokens: usize,
    /// Tokens verification steps delivered: `step_tokens` after truncation at EOG /
    /// max tokens (a last step that accepts past the cap counts only what is kept).
    pub kept_tokens: usize,
    pub verified_rows: usize,
    /// Rows whose result was used: the root and accepted drafts.
    pub valid_rows: usize,
    /// Rows verified and rejected.
    pub wasted_rows: usize,
    /// Capacity left unused below the saturation length of the cost curve.
    pub underutilized_rows: usize,
    pub saturation: usize,
    pub prefill_ms: f64,
    /// Wall time of all decode steps (drafting + verification + bookkeeping).
    pub decode_ms: f64,
    /// Drafting, tree building and budget bookkeeping: the speculation overhead.
    pub draft_ms: f64,
    pub verify_ms: f64,
    /// Verify time the cost curve predicts for the batches run (sum of
    /// `cost(rows)` over steps): a load-independent view of decode time.
    pub modeled_verify_ms: f64,
    /// One-off verify-cost profiling (not part of decode time).
    pub profile_ms: f64,
    pub budget_sum: usize,
    /// Speculative steps that verified the base arm (raw-text sources only) because
    /// it promised more than the tree of every source.
    pub base_arm_steps: usize,
    pub stop: StopReason,
    /// Accepted draft tokens by where they came from: a raw-text source (own or
    /// database automaton, prompt lookup) proposed them, else only calibration, else
    /// only extension.
    pub accepted_base: usize,
    pub accepted_calib_only: usize,
    pub accepted_ext_only: usize,
    /// Steps whose verified tree held a node only calibration proposed, and steps
    /// whose accepted path went through one (how often calibration changes the
    /// tree, and how often that change is what the model accepted).
    pub steps_calib_in_tree: usize,
    pub steps_calib_accepted: usize,
    /// The same for nodes only the extension (Eq. 3) proposed.
    pub steps_ext_in_tree: usize,
    pub steps_ext_accepted: usize,
    /// Counterfactual acceptance, independent of the cost curve: for the trie of
    /// every evaluated step, the draft tokens a budget of `CF_SIZES[j]` rows would
    /// have accepted (summed), and the number of evaluated steps.
    pub cf_accepted: [usize; CF_SIZES.len()],
    pub cf_steps: usize,
}

/// Budgets at which acceptance is evaluated counterfactually.
pub const CF_SIZES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

impl Metrics {
    /// Mean tokens emitted per verification step (accepted drafts + 1).
    pub fn mean_accepted(&self) -> f64 {
        ratio(self.step_tokens as f64, self.steps as f64)
    }

    /// Mean tokens delivered per verification step: like `mean_accepted` but without
    /// what a step accepted past EOG or the token cap (the stricter figure).
    pub fn mean_kept(&self) -> f64 {
        ratio(self.kept_tokens as f64, self.steps as f64)
    }

    /// Decode tokens: everything after the prefill's token.
    pub fn decode_tokens(&self) -> usize {
        self.tokens.saturating_sub(self.runs)
    }

    pub fn ms_per_token(&self) -> f64 {
        ratio(self.decode_ms, self.decode_tokens() as f64)
    }

    pub fn decode_tok_s(&self) -> f64 {
        ratio(1000.0 * self.decode_tokens() as f64, self.decode_ms)
    }

    pub fn mean_budget(&self) -> f64 {
        ratio(self.budget_sum as f64, self.steps as f64)
    }

    /// (valid, wasted, underutilized) shares of verify capacity.
    pub fn shares(&self) -> (f64, f64, f64) {
        let total = (self.valid_rows + self.wasted_rows + self.underutilized_rows) as f64;
        (
            ratio(self.valid_rows as f64, total),
            ratio(self.wasted_rows as f64, total),
            ratio(self.underutilized_rows as f64, total),
        )
    }

    /// Decode ms per token predicted by the cost curve, plus the measured drafting
    /// time (so overhead counts in full).
    pub fn modeled_ms_per_token(&self) -> f64 {
        ratio(
            self.modeled_verify_ms + self.draft_ms,
            self.decode_tokens() as f64,
        )
    }

    /// Drafting overhead as a share of decode time.
    pub fn overhead_share(&self) -> f64 {
        ratio(self.draft_ms, self.decode_ms)
    }

    /// Tokens per step (accepted drafts + 1) had every step verified the top
    /// `budget` rows of its trie (budget must be one of `CF_SIZES`). A lower bound:
    /// a trie still undecided 8 steps later is scored on the output known by then.
    pub fn potential_accepted(&self, budget: usize) -> f64 {
        match CF_SIZES.iter().position(|&s| s == budget) {
            Some(j) => 1.0 + ratio(self.cf_accepted[j] as f64, self.cf_steps as f64),
            None => 0.0,
        }
    }

    /// Count one accepted draft token by its node's source tags.
    pub fn count_accepted_source(&mut self, sources: u8) {
        use crate::tree::{BASE_SOURCES, SRC_CALIB, SRC_EXT};
        if sources & BASE_SOURCES != 0 {
            self.accepted_base += 1;
        } else if sources & SRC_CALIB != 0 {
            self.accepted_calib_only += 1;
        } else if sources & SRC_EXT != 0 {
            self.accepted_ext_only += 1;
        }
    }

    /// Count one verified step by the sources of its rows and of its accepted path
    /// (`path[0]` is the root).
    pub fn count_step_sources(&mut self, sources: &[u8], path: &[usize]) {
        use crate::tree::{BASE_SOURCES, SRC_CALIB, SRC_EXT};
        let only = |s: u8, src: u8| s & BASE_SOURCES == 0 && s & src != 0;
        let in_tree = |src: u8| sources.iter().skip(1).any(|&s| only(s, src));
        let on_path = |src: u8| path.iter().skip(1).any(|&r| only(sources[r], src));
        self.steps_calib_in_tree += in_tree(SRC_CALIB) as usize;
        self.steps_calib_accepted += on_path(SRC_CALIB) as usize;
        self.steps_ext_in_tree += in_tree(SRC_EXT) as usize;
        self.steps_ext_accepted += on_path(SRC_EXT) as usize;
    }

    /// Record one evaluated trie (ranks along the true continuation's path).
    pub fn observe_counterfactual(&mut self, ranks: &[u32]) {
        self.cf_steps += 1;
        for (j, &s) in CF_SIZES.iter().enumerate() {
            self.cf_accepted[j] += ranks.iter().take_while(|&&r| (r as usize) < s).count();
        }
    }

    /// Accumulate another run (for benchmark totals).
    pub fn add(&mut self, o: &Metrics) {
        self.runs += o.runs;
        self.prompt_tokens += o.prompt_tokens;
        self.tokens += o.tokens;
        self.steps += o.steps;
        self.step_tokens += o.step_tokens;
        self.kept_tokens += o.kept_tokens;
        self.verified_rows += o.verified_rows;
        self.valid_rows += o.valid_rows;
        self.wasted_rows += o.wasted_rows;
        self.underutilized_rows += o.underutilized_rows;
        self.saturation = self.saturation.max(o.saturation);
        self.prefill_ms += o.prefill_ms;
        self.decode_ms += o.decode_ms;
        self.draft_ms += o.draft_ms;
        self.verify_ms += o.verify_ms;
        self.modeled_verify_ms += o.modeled_verify_ms;
        self.profile_ms += o.profile_ms;
        self.budget_sum += o.budget_sum;
        self.base_arm_steps += o.base_arm_steps;
        self.accepted_base += o.accepted_base;
        self.accepted_calib_only += o.accepted_calib_only;
        self.accepted_ext_only += o.accepted_ext_only;
        self.steps_calib_in_tree += o.steps_calib_in_tree;
        self.steps_calib_accepted += o.steps_calib_accepted;
        self.steps_ext_in_tree += o.steps_ext_in_tree;
        self.steps_ext_accepted += o.steps_ext_accepted;
        self.stop = o.stop;
        self.cf_steps += o.cf_steps;
        for j in 0..CF_SIZES.len() {
            self.cf_accepted[j] += o.cf_accepted[j];
        }
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{SRC_CALIB, SRC_EXT, SRC_SELF};

    #[test]
    fn step_sources_count_only_nodes_no_raw_text_source_proposed() {
        let mut m = Metrics::default();
        // Root, a sam node also proposed by calibration, a calibration-only node and an
        // extension-only node; the path takes the root and the shared node.
        let sources = [0, SRC_SELF | SRC_CALIB, SRC_CALIB, SRC_EXT];
        m.count_step_sources(&sources, &[0, 1]);
        assert_eq!(
            (m.steps_calib_in_tree, m.steps_calib_accepted),
            (1, 0),
            "a node sam also proposed is not calibration's"
        );
        assert_eq!((m.steps_ext_in_tree, m.steps_ext_accepted), (1, 0));
        m.count_step_sources(&sources, &[0, 2]);
        m.count_step_sources(&[0, SRC_SELF], &[0, 1]);
        assert_eq!((m.steps_calib_in_tree, m.steps_calib_accepted), (2, 1));
        assert_eq!((m.steps_ext_in_tree, m.steps_ext_accepted), (2, 0));
        let mut t = Metrics::default();
        t.add(&m);
        t.add(&m);
        assert_eq!(t.steps_calib_accepted, 2);
        assert_eq!(t.steps_ext_in_tree, 4);
    }
}
