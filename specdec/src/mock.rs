//! A deterministic mock LM for tests and dry runs: the next token is a pure
//! function of the context, so the greedy reference is computable independently
//! of any KV bookkeeping. It copies from earlier context most of the time (so
//! retrieval drafts are partly right), paraphrases otherwise, and rarely ends.
//! It also checks the protocol: well-formed trees, commits along a real path,
//! no token ids outside the vocabulary (no padding with real or fake ids).

use crate::sampling::Sampling;
use crate::target::{PrefillOut, Target};
use crate::tree::FlatTree;
use crate::SpecError;

#[derive(Clone, Debug)]
pub struct MockLm {
    pub vocab: u32,
    pub eog: u32,
    pub seed: u64,
    /// Percent of positions that copy the successor of the last bigram's most
    /// recent earlier occurrence.
    pub copy_pct: u64,
    /// Per-mille chance of ending at a position.
    pub eog_permille: u64,
    pub ctx_limit: usize,
    pub batch_limit: usize,
    /// What `prefill_chunk` reports (0: prompts are never split).
    pub prefill_chunk: usize,
    committed: Vec<u32>,
    last_tree: Option<FlatTree>,
    scratch: Vec<u32>,
    /// Rows verified so far (for checks on budgets).
    pub rows_verified: usize,
}

fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51afd7ed558ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ceb9fe1a85ec53);
    h ^ (h >> 33)
}

impl MockLm {
    pub fn new(vocab: u32, seed: u64) -> Self {
        MockLm {
            vocab: vocab.max(4),
            eog: 1,
            seed,
            copy_pct: 75,
            eog_permille: 8,
            ctx_limit: 1 << 20,
            batch_limit: 256,
            prefill_chunk: 0,
            committed: Vec::new(),
            last_tree: None,
            scratch: Vec::new(),
            rows_verified: 0,
        }
    }

    pub fn committed(&self) -> &[u32] {
        &self.committed
    }

    pub fn reset(&mut self) {
        self.committed.clear();
        self.last_tree = None;
    }

    fn hash_tail(&self, ctx: &[u32], salt: u64) -> u64 {
        let n = ctx.len();
        let mut h = self.seed ^ salt.wrapping_mul(0x9e3779b97f4a7c15);
        for &t in &ctx[n.saturating_sub(3)..] {
            h = mix(h ^ t as u64);
        }
        mix(h ^ (n.min(3) as u64))
    }

    /// The model: greedy next token after `ctx`.
    pub fn next_token(&self, ctx: &[u32]) -> u32 {
        let h = self.hash_tail(ctx, 0);
        if h % 1000 < self.eog_permille {
            return self.eog;
        }
        let n = ctx.len();
        if n >= 2 && (h >> 10) % 100 < self.copy_pct {
            let (a, b) = (ctx[n - 2], ctx[n - 1]);
            // Most recent earlier occurrence of the bigram that has a successor.
            for j in (0..n - 2).rev() {
                if ctx[j] == a && ctx[j + 1] == b {
                    return ctx[j + 2];
                }
            }
        }
        self.fresh(h)
    }

    fn fresh(&self, h: u64) -> u32 {
        let t = ((h >> 20) % self.vocab as u64) as u32;
        if t == self.eog {
            (t + 1) % self.vocab
        } else {
            t
        }
    }

    /// Greedy reference, computed without any speculation machinery.
    pub fn greedy(&self, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
        let mut ctx = prompt.to_vec();
        let mut out = Vec::new();
        while out.len() < max_tokens {
            let t = self.next_token(&ctx);
            if t == self.eog {
                break;
            }
            out.push(t);
            ctx.push(t);
        }
        out
    }

    /// Full logits after `ctx`: the greedy token at 4, every other id hashed into
    /// [0, 3), so the argmax is [`MockLm::next_token`] and sampling has a real spread.
    pub fn logits(&self, ctx: &[u32]) -> Vec<f32> {
        let h = self.hash_tail(ctx, 0x10_6175);
        let mut l: Vec<f32> = (0..self.vocab)
            .map(|t| (mix(h ^ t as u64) % 3000) as f32 / 1000.0)
            .collect();
        l[self.next_token(ctx) as usize] = 4.0;
        l
    }

    /// Sampled reference, computed without any speculation machinery.
    pub fn sample(&self, prompt: &[u32], max_tokens: usize, sampling: &Sampling) -> Vec<u32> {
        let mut ctx = prompt.to_vec();
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        while out.len() < max_tokens {
            let t = sampling.pick(&self.logits(&ctx), out.len(), &mut scratch);
            if t == self.eog {
                break;
            }
            out.push(t);
            ctx.push(t);
        }
        out
    }

    /// Top-k after `ctx`: the greedy token first, then hashed alternatives.
    fn topk(&self, ctx: &[u32], k: usize, ids: &mut Vec<u32>, logits: &mut Vec<f32>) {
        let top = self.next_token(ctx);
        ids.push(top);
        logits.push(8.0);
        let mut salt = 1;
        let mut got = 1;
        while got < k {
            let t = self.fresh(self.hash_tail(ctx, salt));
            salt += 1;
            if t != top && !ids[ids.len() - got..].contains(&t) {
                ids.push(t);
                logits.push(8.0 - 2.0 * got as f32);
                got += 1;
            }
        }
    }

    fn err(msg: String) -> SpecError {
        SpecError::Target(msg)
    }
}

impl Target for MockLm {
    fn prefill(
        &mut self,
        tokens: &[u32],
        topk: usize,
        out: &mut PrefillOut,
    ) -> Result<(), SpecError> {
        if tokens.iter().any(|&t| t >= self.vocab) {
            return Err(Self::err("prefill token outside the vocabulary".into()));
        }
        if self.committed.len() + tokens.len() > self.ctx_limit {
            return Err(Self::err("context full".into()));
        }
        out.clear();
        out.k = topk;
        let base = self.committed.len();
        self.committed.extend_from_slice(tokens);
        if topk > 0 {
            for i in 0..tokens.len() {
                let ctx = &self.committed[..base + i + 1];
                self.topk(ctx, topk, &mut out.topk_ids, &mut out.topk_logits);
            }
        }
        out.next = self.next_token(&self.committed);
        out.logits = self.logits(&self.committed);
        self.last_tree = None;
        Ok(())
    }

    fn verify(&mut self, tree: &FlatTree, argmax: &mut Vec<u32>) -> Result<(), SpecError> {
        let n = tree.len();
        if n == 0 || n > self.batch_limit || tree.parents.len() != n {
            return Err(Self::err(format!("bad batch of {n} rows")));
        }
        if self.committed.len() + n > self.ctx_limit {
            return Err(Self::err("verify past the context window".into()));
        }
        if tree.parents[0] != -1 {
            return Err(Self::err("row 0 must be the root".into()));
        }
        for i in 0..n {
            if tree.tokens[i] >= self.vocab {
                return Err(Self::err(format!(
                    "row {i}: token {} is not a real id",
                    tree.tokens[i]
                )));
            }
            if i > 0 && (tree.parents[i] < 0 || tree.parents[i] as usize >= i) {
                return Err(Self::err(format!("row {i}: parent not before it")));
            }
        }
        argmax.clear();
        for i in 0..n {
            // Context of row i: committed + its ancestors + itself.
            self.scratch.clear();
            let mut r = i as i32;
            while r >= 0 {
                self.scratch.push(tree.tokens[r as usize]);
                r = tree.parents[r as usize];
            }
            self.scratch.reverse();
            let mut ctx = self.committed.clone();
            ctx.extend_from_slice(&self.scratch);
            argmax.push(self.next_token(&ctx));
        }
        self.rows_verified += n;
        self.last_tree = Some(tree.clone());
        Ok(())
    }

    fn verify_logits(&mut self, tree: &FlatTree, logits: &mut Vec<f32>) -> Result<(), SpecError> {
        let mut ids = Vec::new();
        self.verify(tree, &mut ids)?;
        logits.clear();
        for i in 0..tree.len() {
            let mut path = Vec::new();
            let mut r = i as i32;
            while r >= 0 {
                path.push(tree.tokens[r as usize]);
                r = tree.parents[r as usize];
            }
            path.reverse();
            let mut ctx = self.committed.clone();
            ctx.extend_from_slice(&path);
            logits.extend_from_slice(&self.logits(&ctx));
        }
        Ok(())
    }

    fn commit(&mut self, rows: &[usize]) -> Result<(), SpecError> {
        let tree = self
            .last_tree
            .take()
            .ok_or_else(|| Self::err("commit without a verified tree".into()))?;
        let mut prev = -1i32;
        for &r in rows {
            if r >= tree.len() || tree.parents[r] != prev {
                return Err(Self::err(format!(
                    "commit rows {rows:?} are not a root path"
                )));
            }
            prev = r as i32;
        }
        for &r in rows {
            self.committed.push(tree.tokens[r]);
        }
        Ok(())
    }

    fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    fn is_eog(&self, id: u32) -> bool {
        id == self.eog
    }

    fn max_batch(&self) -> usize {
        self.batch_limit
    }

    fn context_left(&self) -> usize {
        self.ctx_limit.saturating_sub(self.committed.len())
    }
}
