//! The runtime's session as a verification target.

use crate::target::{PrefillOut, Target};
use crate::tree::FlatTree;
use crate::SpecError;
use npu_runtime::session::{argmax, Session};

fn rt(e: impl std::fmt::Display) -> SpecError {
    SpecError::Target(e.to_string())
}

impl Target for Session {
    fn prefill(
        &mut self,
        tokens: &[u32],
        topk: usize,
        out: &mut PrefillOut,
    ) -> Result<(), SpecError> {
        let po = Session::prefill(self, tokens, topk).map_err(rt)?;
        out.clear();
        out.next = argmax(po.logits);
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

    fn verify(&mut self, tree: &FlatTree, out: &mut Vec<u32>) -> Result<(), SpecError> {
        let v = self.model().vocab_size();
        let logits = self.forward_tree(&tree.tokens, &tree.parents).map_err(rt)?;
        out.clear();
        out.extend(logits.chunks_exact(v).take(tree.len()).map(argmax));
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

    fn context_left(&self) -> usize {
        self.kv_capacity().saturating_sub(self.n_past())
    }
}
