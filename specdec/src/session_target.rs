//! The runtime's session (the one block driver, on any backend) as a verification target.

use crate::sampling::Sampling;
use crate::target::{PrefillOut, Target};
use crate::tree::FlatTree;
use crate::SpecError;
use npu_runtime::backend::Backend;
use npu_runtime::session::{
    argmax, decode_branches, generate_picked, BranchOutput, GenerationStats, Session,
};

fn rt(e: impl std::fmt::Display) -> SpecError {
    SpecError::Target(e.to_string())
}

impl<B: Backend> Target for Session<B> {
    fn prefill(
        &mut self,
        tokens: &[u32],
        topk: usize,
        out: &mut PrefillOut,
    ) -> Result<(), SpecError> {
        let po = Session::prefill(self, tokens, topk).map_err(rt)?;
        out.clear();
        out.next = argmax(po.logits);
        out.logits.extend_from_slice(po.logits);
        if topk > 0 && po.topk.len() == tokens.len() {
            // The runtime returns min(k, vocab) pairs per row; keep rows uniform.
            let k = po.topk.iter().map(|r| r.len()).min().unwrap_or(0);
            out.k = k;
            for row in po.topk {
                for &(id, logit) in &row[..k] {
                    out.topk_ids.push(id);
                    out.topk_logits.push(logit);
                }
            }
        }
        Ok(())
    }

    /// A window at the prompt's end uses the runtime's blocked LM head over just
    /// those rows (Qwen 0.5B, last 256 of ~700 positions: +420-480 CPU ms over a plain
    /// prefill against +660-920 for the split prefill); every position keeps `prefill`,
    /// whose full logit rows are cheaper than re-reading the LM head per block over a
    /// whole prompt.
    fn prefill_topk_from(
        &mut self,
        tokens: &[u32],
        topk: usize,
        from: usize,
        out: &mut PrefillOut,
    ) -> Result<(), SpecError> {
        if topk == 0 || from == 0 || from >= tokens.len() {
            return Target::prefill(
                self,
                tokens,
                if from >= tokens.len() { 0 } else { topk },
                out,
            );
        }
        let po = Session::prefill_topk_from(self, tokens, topk, from).map_err(rt)?;
        out.clear();
        out.next = argmax(po.logits);
        out.logits.extend_from_slice(po.logits);
        let rows = &po.topk[from.min(po.topk.len())..];
        if rows.len() == tokens.len() - from {
            let k = rows.iter().map(|r| r.len()).min().unwrap_or(0);
            out.k = k;
            for row in rows {
                for &(id, logit) in &row[..k] {
                    out.topk_ids.push(id);
                    out.topk_logits.push(logit);
                }
            }
        }
        out.topk_start = from;
        Ok(())
    }

    fn verify(&mut self, tree: &FlatTree, out: &mut Vec<u32>) -> Result<(), SpecError> {
        // Verification needs only each row's greedy id: the argmax-only LM head skips
        // writing N x vocab logits (same ids as `argmax` over `forward_tree`'s logits).
        self.forward_tree_argmax(&tree.tokens, &tree.parents, out)
            .map_err(rt)?;
        out.truncate(tree.len());
        Ok(())
    }

    fn verify_logits(&mut self, tree: &FlatTree, out: &mut Vec<f32>) -> Result<(), SpecError> {
        let logits = self.forward_tree(&tree.tokens, &tree.parents).map_err(rt)?;
        out.clear();
        out.extend_from_slice(logits);
        Ok(())
    }

    fn commit(&mut self, rows: &[usize]) -> Result<(), SpecError> {
        Session::commit(self, rows).map_err(rt)
    }

    /// `Session::prefill` covers a prompt with full chunks first, then the rest.
    fn prefill_chunk(&self) -> usize {
        self.options().prefill_chunk
    }

    fn is_eog(&self, id: u32) -> bool {
        self.model().is_eog(id)
    }

    fn max_batch(&self) -> usize {
        self.options().max_verify
    }

    fn graph_rows(&self, n: usize) -> usize {
        self.verify_graph_rows(n).unwrap_or(n)
    }

    fn context_left(&self) -> usize {
        self.kv_capacity().saturating_sub(self.n_past())
    }
}

/// Plain sampled decoding on `session`, one decode step per token: the reference that
/// [`crate::Generator::generate_sampled`] equals token for token (greedy when `sampling` is).
pub fn generate_sampled_plain<B: Backend>(
    session: &mut Session<B>,
    prompt: &[u32],
    max_tokens: usize,
    sampling: &Sampling,
    on_token: impl FnMut(u32) -> bool,
) -> npu_runtime::error::Result<GenerationStats> {
    let mut scratch = Vec::new();
    let pick = |logits: &[f32], i: usize| sampling.pick(logits, i, &mut scratch);
    generate_picked(session, prompt, max_tokens, pick, on_token)
}

/// `n` samples decoded together after prefilling `prompt` (one forward per step advances
/// every running branch): branch b is plain sampled decoding under
/// [`Sampling::for_branch`]`(b)`, token for token. `on_token(b, token)` returning false
/// stops branch b. The session keeps the prompt committed.
pub fn generate_samples<B: Backend>(
    session: &mut Session<B>,
    prompt: &[u32],
    n: usize,
    max_tokens: usize,
    sampling: &Sampling,
    on_token: impl FnMut(usize, u32) -> bool,
) -> npu_runtime::error::Result<(Vec<BranchOutput>, GenerationStats)> {
    let mut picks: Vec<_> = (0..n)
        .map(|b| {
            let s = sampling.for_branch(b);
            let mut scratch = Vec::new();
            move |logits: &[f32], i: usize| s.pick(logits, i, &mut scratch)
        })
        .collect();
    decode_branches(session, prompt, max_tokens, &mut picks, on_token)
}
