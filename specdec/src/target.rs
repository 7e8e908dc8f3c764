//! The model seen from the speculative decoder. Implemented by the runtime's
//! session (see `session_target`) and by the deterministic mock LM in `mock`.

use crate::tree::FlatTree;
use crate::SpecError;

/// What prefill hands to the drafters.
#[derive(Clone, Debug, Default)]
pub struct PrefillOut {
    /// Greedy next token after the whole prompt.
    pub next: u32,
    /// Top-k successor ids per prompt position, row-major `[prompt_len][k]`
    /// (empty when `k == 0`). Only k per position is kept, never full logits.
    pub topk_ids: Vec<u32>,
    /// Matching logits, best first within each row.
    pub topk_logits: Vec<f32>,
    pub k: usize,
    /// Prompt position of the first top-k row (rows cover `topk_start..` of the
    /// prompt; calibration only asked for a window at its end).
    pub topk_start: usize,
    /// Logits after the whole prompt (what `next` is the argmax of); empty when the
    /// target gives none. Sampled decoding draws the first token from them.
    pub logits: Vec<f32>,
}

impl PrefillOut {
    pub fn clear(&mut self) {
        self.next = 0;
        self.topk_ids.clear();
        self.topk_logits.clear();
        self.k = 0;
        self.topk_start = 0;
        self.logits.clear();
    }
}

/// A causal LM that can verify a token tree in one forward pass.
///
/// Contract (what makes tree verification lossless): the argmax reported for a
/// row must equal the argmax greedy decoding would compute at that position given
/// the committed tokens plus the row's ancestors, bit for bit; ties go to the lowest id.
pub trait Target {
    /// Process `tokens` after the committed context and commit them. When `topk > 0`,
    /// also report the top-k successors of every position of `tokens`.
    fn prefill(
        &mut self,
        tokens: &[u32],
        topk: usize,
        out: &mut PrefillOut,
    ) -> Result<(), SpecError>;

    /// [`Target::prefill`] with top-k successors wanted only for positions `from..`
    /// of `tokens`; `out.topk_start` says where the reported rows begin (at most
    /// `from`). Default: the head up to a multiple of `prefill_chunk()` at or below
    /// `from` is prefilled without top-k, so the forward passes equal one call's.
    fn prefill_topk_from(
        &mut self,
        tokens: &[u32],
        topk: usize,
        from: usize,
        out: &mut PrefillOut,
    ) -> Result<(), SpecError> {
        let chunk = self.prefill_chunk();
        let split = if topk > 0 && chunk > 0 && from < tokens.len() {
            from / chunk * chunk
        } else {
            0
        };
        if split > 0 {
            self.prefill(&tokens[..split], 0, out)?;
        }
        self.prefill(&tokens[split..], topk, out)?;
        out.topk_start = split;
        Ok(())
    }

    /// Run the flattened tree (row 0's parent is the last committed token) without
    /// committing anything; write the argmax of every row into `argmax`.
    fn verify(&mut self, tree: &FlatTree, argmax: &mut Vec<u32>) -> Result<(), SpecError>;

    /// [`Target::verify`] that writes every row's full logits, row-major
    /// `[rows][vocab]`, for sampled decoding; the same contract, bit for bit, as the
    /// logits a plain decode step would compute at that row's position.
    fn verify_logits(&mut self, tree: &FlatTree, logits: &mut Vec<f32>) -> Result<(), SpecError> {
        let _ = (tree, logits);
        Err(SpecError::Config(
            "this target gives no logits, so it cannot sample".into(),
        ))
    }

    /// Keep the KV of these rows (root-to-leaf path of the last verified tree) as the
    /// next committed positions; everything else of that tree is dropped.
    fn commit(&mut self, rows: &[usize]) -> Result<(), SpecError>;

    /// Run length of prefill: splitting a prompt into two prefill calls at a
    /// multiple of it runs exactly the same forward passes as one call (so the
    /// results are bit-identical). 0 when that does not hold: never split.
    fn prefill_chunk(&self) -> usize {
        0
    }

    /// End of generation (EOS or end of turn).
    fn is_eog(&self, id: u32) -> bool;

    /// Largest verify batch the target accepts.
    fn max_batch(&self) -> usize;

    /// Rows of the static graph a verify batch of `n` rows runs on (padded): batches
    /// that share a graph cost the same, so a cost profile measures each graph once.
    fn graph_rows(&self, n: usize) -> usize {
        n
    }

    /// Positions still free in the context (KV) window.
    fn context_left(&self) -> usize;
}
