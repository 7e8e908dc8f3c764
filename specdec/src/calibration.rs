//! In-context distribution calibration (BRIEF 4.2).
//!
//! Prefill already computes the model's next-token distribution after every
//! prompt position. We keep only the top-k successors per position (never full
//! logits) as calibrated anchors `<context token, model-preferred successor>`.
//! Drafting from a matched prompt position then follows the model's own
//! predictions instead of the raw text: sample the preferred successors there,
//! search an occurrence of each in the context, and expand from that occurrence's
//! own successors, recursively (depth-first).

use crate::target::PrefillOut;
use std::collections::HashMap;

#[derive(Clone, Debug, Default)]
pub struct Calibration {
    k: usize,
    /// First prompt position with a top-k row.
    start: usize,
    prompt: Vec<u32>,
    ids: Vec<u32>,
    /// Probability of each successor within its row's top-k (softmax over the
    /// kept logits: an upper bound of the true probability, used as confidence).
    probs: Vec<f32>,
    /// Positions of every token in the prompt, ascending.
    occ: HashMap<u32, Vec<u32>>,
    /// DFS scratch, reused so drafting does not allocate per step.
    scratch_toks: Vec<u32>,
    scratch_probs: Vec<f32>,
    /// DFS: the raw text's next token is the first successor (else the prefill's top-1).
    pub follow_text: bool,
}

/// One calibrated chain: tokens and the top-k probability of each.
pub type ChainSink<'a> = dyn FnMut(&[u32], &[f32]) + 'a;

impl Calibration {
    pub fn clear(&mut self) {
        self.k = 0;
        self.start = 0;
        self.prompt.clear();
        self.ids.clear();
        self.probs.clear();
        self.occ.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.k == 0 || self.prompt.is_empty()
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }

    /// Whether prompt position `pos` has top-k successors.
    pub fn covers(&self, pos: usize) -> bool {
        pos >= self.start && pos < self.prompt.len()
    }

    /// Build from the prompt and the prefill's per-position top-k (rows for prompt
    /// positions `pre.topk_start..`). Rows that are missing or malformed leave
    /// calibration off rather than guessing.
    pub fn build(&mut self, prompt: &[u32], pre: &PrefillOut) {
        self.clear();
        let k = pre.k;
        if k == 0
            || pre.topk_start >= prompt.len()
            || pre.topk_ids.len() != (prompt.len() - pre.topk_start) * k
            || pre.topk_logits.len() != pre.topk_ids.len()
        {
            return;
        }
        self.k = k;
        self.start = pre.topk_start;
        self.prompt.extend_from_slice(prompt);
        self.ids.extend_from_slice(&pre.topk_ids);
        self.probs.reserve(pre.topk_logits.len());
        for row in pre.topk_logits.chunks(k) {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = row.iter().map(|&l| (l - m).exp()).sum();
            for &l in row {
                let p = (l - m).exp() / z;
                self.probs.push(if p.is_finite() { p } else { 0.0 });
            }
        }
        for (i, &t) in prompt.iter().enumerate() {
            self.occ.entry(t).or_default().push(i as u32);
        }
    }

    /// Model-preferred successors after prompt position `pos` (which `covers`).
    pub fn successors(&self, pos: usize) -> (&[u32], &[f32]) {
        let r = (pos - self.start) * self.k..(pos - self.start + 1) * self.k;
        (&self.ids[r.clone()], &self.probs[r])
    }

    /// Rank of `tok` among the top-k successors of prompt position `pos` (None when
    /// absent or the position has no row).
    pub fn rank_of(&self, pos: usize, tok: u32) -> Option<usize> {
        if self.is_empty() || !self.covers(pos) {
            return None;
        }
        self.successors(pos).0.iter().position(|&t| t == tok)
    }

    /// Votes of the model's own predictions for what follows `suffix`: the top-k
    /// successors of every calibrated prompt occurrence of `suffix` (at most
    /// `MAX_VOTE_OCC`, earliest first), their probabilities summed and divided by the
    /// number of occurrences. Writes up to `out.len()` (token, share, occurrence)
    /// best first, the occurrence being where that token was predicted most strongly;
    /// returns how many. Where the context has several continuations of a short
    /// suffix, this ranks them by what the model itself prefers there.
    pub fn votes(&self, suffix: &[u32], out: &mut [(u32, f32, u32)]) -> usize {
        const MAX_VOTE_OCC: usize = 64;
        let Some(&last) = suffix.last() else {
            return 0;
        };
        if self.is_empty() || out.is_empty() {
            return 0;
        }
        let Some(occ) = self.occ.get(&last) else {
            return 0;
        };
        let l = suffix.len();
        // Small fixed table: (token, summed probability, best occurrence, best prob).
        let mut acc = [(0u32, 0f32, 0u32, 0f32); 16]; // 16: see the insert below
        let mut n_acc = 0;
        let mut n_occ = 0usize;
        for &q in occ {
            let q = q as usize;
            if q + 1 < l || !self.covers(q) || self.prompt[q + 1 - l..=q] != *suffix {
                continue;
            }
            n_occ += 1;
            let (ids, ps) = self.successors(q);
            for (&t, &p) in ids.iter().zip(ps) {
                match acc[..n_acc].iter_mut().find(|e| e.0 == t) {
                    Some(e) => {
                        e.1 += p;
                        if p > e.3 {
                            e.2 = q as u32;
                            e.3 = p;
                        }
                    }
                    None if n_acc < 16 => {
                        acc[n_acc] = (t, p, q as u32, p);
                        n_acc += 1;
                    }
                    None => {}
                }
            }
            if n_occ == MAX_VOTE_OCC {
                break;
            }
        }
        if n_occ == 0 {
            return 0;
        }
        acc[..n_acc].sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let n = n_acc.min(out.len());
        for (o, e) in out.iter_mut().zip(&acc[..n]) {
            *o = (e.0, e.1 / n_occ as f32, e.2);
        }
        n
    }

    /// Raw prompt text after the model-preferred token `tok` predicted at prompt
    /// position `q`: where `tok` continues (see `locate`), at most `max` tokens.
    pub fn text_after(&self, tok: u32, q: usize, max: usize) -> &[u32] {
        match self.locate(tok, q) {
            Some(p) => {
                let start = (p + 1).min(self.prompt.len());
                &self.prompt[start..(start + max).min(self.prompt.len())]
            }
            None => &[],
        }
    }

    /// Search: where does the model-preferred token `tok`, predicted after
    /// position `from`, continue in the context? The next text position when it
    /// agrees with the text, else an occurrence preceded by the same token, else
    /// the first occurrence after `from`, else the first occurrence.
    fn locate(&self, tok: u32, from: usize) -> Option<usize> {
        if self.prompt.get(from + 1) == Some(&tok) {
            return Some(from + 1);
        }
        let occ = self.occ.get(&tok)?;
        let prev = self.prompt[from];
        let bigram = occ
            .iter()
            .take(256)
            .find(|&&q| q > 0 && self.prompt[q as usize - 1] == prev);
        let q = bigram
            .or_else(|| occ.iter().find(|&&q| q as usize > from))
            .or(occ.first())?;
        Some(*q as usize)
    }

    /// Calibrated token tree after prompt position `pos`, emitted as root-to-leaf
    /// chains: `branch[d]` alternatives at depth d (1 beyond the listed depths),
    /// at most `depth` tokens per chain.
    pub fn chains(&mut self, pos: usize, branch: &[usize], depth: usize, sink: &mut ChainSink<'_>) {
        if self.is_empty() || !self.covers(pos) || depth == 0 {
            return;
        }
        let mut toks = std::mem::take(&mut self.scratch_toks);
        let mut probs = std::mem::take(&mut self.scratch_probs);
        toks.clear();
        probs.clear();
        self.dfs(pos, branch, depth, &mut toks, &mut probs, sink);
        self.scratch_toks = toks;
        self.scratch_probs = probs;
    }

    fn dfs(
        &self,
        pos: usize,
        branch: &[usize],
        depth: usize,
        toks: &mut Vec<u32>,
        probs: &mut Vec<f32>,
        sink: &mut ChainSink<'_>,
    ) {
        let d = toks.len();
        let width = branch.get(d).copied().unwrap_or(1).clamp(1, self.k);
        let (ids, ps) = self.successors(pos);
        let mut expanded = false;
        // The raw text's next token first when `follow_text`: in copy-heavy output the
        // model reproduces the text far more often than its prefill top-1 there.
        let text = if self.follow_text {
            self.prompt.get(pos + 1).copied()
        } else {
            None
        };
        let mut cands = [(0u32, 0f32); 9];
        let mut n = 0;
        if let Some(t) = text {
            let p = ids.iter().position(|&x| x == t).map_or(0.05, |j| ps[j]);
            cands[0] = (t, p);
            n = 1;
        }
        for j in 0..self.k {
            if n >= width || n >= cands.len() {
                break;
            }
            if Some(ids[j]) != text {
                cands[n] = (ids[j], ps[j]);
                n += 1;
            }
        }
        for (j, &(t, p)) in cands[..n].iter().enumerate() {
            // Alternatives far below the best are not worth a branch.
            if j > 0 && p < 0.1 {
                break;
            }
            toks.push(t);
            probs.push(p);
            expanded = true;
            let next = if Some(t) == text {
                Some(pos + 1)
            } else {
                self.locate(t, pos)
            };
            match next {
                Some(q) if toks.len() < depth && self.covers(q) => {
                    self.dfs(q, branch, depth, toks, probs, sink)
                }
                _ => sink(toks, probs),
            }
            toks.pop();
            probs.pop();
        }
        if !expanded && d > 0 {
            sink(toks, probs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre(prompt_len: usize, k: usize, f: impl Fn(usize) -> Vec<u32>) -> PrefillOut {
        let mut p = PrefillOut {
            next: 0,
            k,
            ..Default::default()
        };
        for i in 0..prompt_len {
            let row = f(i);
            assert_eq!(row.len(), k);
            p.topk_ids.extend(row);
            p.topk_logits.extend((0..k).map(|j| 5.0 - 2.0 * j as f32));
        }
        p
    }

    #[test]
    fn follows_model_preference_and_jumps_to_occurrence() {
        // Paper example with ids: prompt "Clinton 's security detail has arrived at Des Moines ."
        // The model after "Clinton" prefers "arrived"; "arrived" occurs at 5, whose
        // own top-1 is "at", then "Des", "Moines".
        let prompt = [1u32, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        let p = pre(prompt.len(), 2, |i| match i {
            0 => vec![6, 2],  // after Clinton: arrived, 's
            5 => vec![7, 11], // after arrived: at, in
            6 => vec![8, 12],
            7 => vec![9, 13],
            8 => vec![10, 14],
            _ => vec![prompt.get(i + 1).copied().unwrap_or(0), 99],
        });
        let mut c = Calibration::default();
        c.build(&prompt, &p);
        let mut chains = Vec::new();
        c.chains(0, &[1], 4, &mut |t, _| chains.push(t.to_vec()));
        assert_eq!(chains, vec![vec![6, 7, 8, 9]]);
        // Two branches at the root: also the raw-text successor "'s".
        chains.clear();
        c.chains(0, &[2], 3, &mut |t, _| chains.push(t.to_vec()));
        assert_eq!(chains, vec![vec![6, 7, 8], vec![2, 3, 4]]);
    }

    #[test]
    fn unknown_token_ends_chain_and_bad_input_disables() {
        let prompt = [1u32, 2, 3];
        let p = pre(3, 1, |i| vec![[50, 3, 1][i]]);
        let mut c = Calibration::default();
        c.build(&prompt, &p);
        let mut chains = Vec::new();
        c.chains(0, &[1], 5, &mut |t, _| chains.push(t.to_vec()));
        assert_eq!(chains, vec![vec![50]]); // 50 never occurs: stop after it
                                            // Row count mismatch: calibration stays off.
        let mut bad = p.clone();
        bad.topk_ids.pop();
        c.build(&prompt, &bad);
        assert!(c.is_empty());
        chains.clear();
        c.chains(0, &[1], 5, &mut |t, _| chains.push(t.to_vec()));
        assert!(chains.is_empty());
    }

    #[test]
    fn window_covers_only_the_tail() {
        // Rows only for positions 6..10 (topk_start = 6): earlier positions are not
        // calibrated, and a chain stops instead of jumping before the window.
        let prompt = [1u32, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        let mut p = pre(4, 1, |i| vec![[8, 5, 10, 11][i]]);
        p.topk_start = 6;
        let mut c = Calibration::default();
        c.build(&prompt, &p);
        assert!(!c.covers(5) && c.covers(6) && c.covers(9));
        let mut chains = Vec::new();
        c.chains(2, &[1], 5, &mut |t, _| chains.push(t.to_vec()));
        assert!(chains.is_empty());
        // After position 6 the model prefers 8 (at position 7), whose successor 5
        // lies at position 4, outside the window: the chain ends there.
        c.chains(6, &[1], 5, &mut |t, _| chains.push(t.to_vec()));
        assert_eq!(chains, vec![vec![8, 5]]);
        // Rows that do not match the window length disable calibration.
        p.topk_start = 5;
        c.build(&prompt, &p);
        assert!(c.is_empty());
    }

    #[test]
    fn votes_sum_over_occurrences_of_the_suffix() {
        // "1 2" occurs at 0-1, 3-4 and 6-7; the text continues 3, 4, 4 but the model
        // preferred 9 at two of the three occurrences.
        let prompt = [1u32, 2, 3, 1, 2, 4, 1, 2, 4, 9, 5];
        let p = pre(prompt.len(), 2, |i| match i {
            1 => vec![9, 3],
            4 => vec![9, 4],
            7 => vec![4, 9],
            _ => vec![prompt.get(i + 1).copied().unwrap_or(0), 99],
        });
        let mut c = Calibration::default();
        c.build(&prompt, &p);
        let mut out = [(0u32, 0f32, 0u32); 3];
        let n = c.votes(&[1, 2], &mut out);
        assert_eq!(n, 3);
        // Row probabilities: softmax of (5, 3) = 0.881 / 0.119.
        assert_eq!(out[0].0, 9);
        assert!((out[0].1 - (0.881 * 2.0 + 0.119) / 3.0).abs() < 1e-3);
        assert_eq!(out[0].2, 1); // first occurrence with the strongest vote
        assert_eq!((out[1].0, out[2].0), (4, 3));
        // Text after the voted token: 9 occurs at 9, followed by 5.
        assert_eq!(c.text_after(9, 1, 4), &[5]);
        // A suffix that never occurs, or an empty one, has no votes.
        assert_eq!(c.votes(&[2, 1, 7], &mut out), 0);
        assert_eq!(c.votes(&[], &mut out), 0);
    }
}
