//! Where the speed-up below the retrieval oracle's bound goes: a diagnostic for the
//! benchmark. On one greedy output and one cost curve it compares the oracle's bound
//! ([`crate::oracle`]) with schedules that keep more and more of a real drafter's
//! limits; each step down is one part of the gap.
//!
//! - `oracle`: at each output position the longest true continuation in any source
//!   occurrence that shares the root token, cheapest schedule (dynamic programming).
//! - `myopic`: the same continuations, each step taking the chain with the most tokens
//!   per verify millisecond, no look-ahead (the oracle's foresight of later positions).
//! - `recall`: the true continuation's depth in the drafter's whole trie at every
//!   position, cheapest schedule: below the oracle where the drafter never proposed the
//!   right text (a different occurrence, a shorter match, no match).
//! - `ranked`: the same trie cut by its own ranking at each candidate budget, cheapest
//!   budget per step in hindsight: below `recall` where the right chain ranks behind
//!   other branches, so a budget that reaches it verifies more rows.
//!
//! The run itself sits below `ranked` by what choosing the budget without knowing the
//! outcome costs. The drafter is replayed at every position from the prompt, the
//! earlier answers (its database) and the output so far, without prefill top-k rows
//! and without verification feedback (so calibration and extension add nothing here).

use crate::accept_model::AcceptModel;
use crate::budget::CostCurve;
use crate::drafter::{make_drafter, Drafter, Mode};
use crate::generate::GenConfig;
use crate::oracle::{
    chain_options, cheapest_schedule, longest_true_continuations, oracle_schedule, OracleSchedule,
    OracleSources,
};
use crate::sam::SuffixAutomaton;
use crate::target::PrefillOut;
use crate::tokendb::{TokenDb, DEFAULT_MAX_TOKENS};
use crate::tree::{DraftTree, ARM_ALL};
use std::sync::Arc;

/// The schedules above for one or more outputs, plus per-position sums.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GapParts {
    pub oracle: OracleSchedule,
    pub myopic: OracleSchedule,
    pub recall: OracleSchedule,
    pub ranked: OracleSchedule,
    /// Output positions examined (1..len of each output).
    pub positions: usize,
    /// Sums over the positions of the oracle's continuation and of the trie's true
    /// depth (both capped at the chain rows).
    pub oracle_len: usize,
    pub recall_len: usize,
    /// Positions where the oracle had at least 2 tokens and the trie fewer.
    pub short_positions: usize,
    /// Of those, positions where the trie had none of the continuation.
    pub empty_positions: usize,
}

impl GapParts {
    pub fn add(&mut self, o: &GapParts) {
        self.oracle.add(&o.oracle);
        self.myopic.add(&o.myopic);
        self.recall.add(&o.recall);
        self.ranked.add(&o.ranked);
        self.positions += o.positions;
        self.oracle_len += o.oracle_len;
        self.recall_len += o.recall_len;
        self.short_positions += o.short_positions;
        self.empty_positions += o.empty_positions;
    }
}

/// Each step takes the option of `opts[j]` with the most tokens per millisecond
/// (ties: more tokens), without looking ahead.
pub fn myopic_schedule(
    opts: &[Vec<(usize, usize)>],
    need: usize,
    curve: &CostCurve,
) -> OracleSchedule {
    let need = need.min(opts.len());
    let mut s = OracleSchedule::default();
    if need <= 1 {
        return s;
    }
    let mut j = 1;
    while j < need {
        let mut pick = (1usize, 0usize);
        let rate = |(rows, acc): (usize, usize)| (acc + 1) as f64 / curve.cost(rows.max(1));
        for &(rows, acc) in &opts[j] {
            let o = (rows.max(1), acc.min(need - 1 - j));
            if rate(o) > rate(pick) || (rate(o) == rate(pick) && o.1 > pick.1) {
                pick = o;
            }
        }
        s.steps += 1;
        s.rows += pick.0;
        s.cost_ms += curve.cost(pick.0);
        j += pick.1 + 1;
    }
    s.tokens = need - 1;
    s.base_ms = (need - 1) as f64 * curve.cost(1);
    s
}

/// Builds a drafter over a database automaton.
pub type MakeDrafter<'a> = &'a dyn Fn(Option<Arc<SuffixAutomaton>>) -> Box<dyn Drafter + Send>;

/// [`gap_parts_with`] for the drafter of `mode`.
pub fn gap_parts(
    mode: Mode,
    prompt: &[u32],
    output: &[u32],
    earlier: &[&[u32]],
    curve: &CostCurve,
    max_rows: usize,
    model: &mut AcceptModel,
) -> GapParts {
    let make = |db| make_drafter(mode, db);
    gap_parts_with(&make, prompt, output, earlier, curve, max_rows, model)
}

/// The gap parts of one greedy `output` after `prompt`, drafting with `make`'s drafter
/// from the prompt, the output so far and (as the conversation database) `earlier`
/// answers; chains of at most `max_rows` rows. `model` is the node-acceptance model
/// the replay ranks with and teaches at every position (carry it over a run's outputs).
pub fn gap_parts_with(
    make: MakeDrafter<'_>,
    prompt: &[u32],
    output: &[u32],
    earlier: &[&[u32]],
    curve: &CostCurve,
    max_rows: usize,
    model: &mut AcceptModel,
) -> GapParts {
    let need = output.len();
    let max_rows = max_rows.max(1);
    let mut parts = GapParts::default();
    if need <= 1 || prompt.is_empty() {
        return parts;
    }
    let mut fixed: Vec<&[u32]> = vec![prompt];
    fixed.extend_from_slice(earlier);
    let src = OracleSources {
        fixed,
        min_context: 1,
    };
    let cont = longest_true_continuations(output, &src, max_rows - 1);

    let db = (!earlier.is_empty()).then(|| {
        let mut d = TokenDb::new(DEFAULT_MAX_TOKENS);
        for e in earlier {
            d.add(e);
        }
        Arc::new(d.build_index())
    });
    let mut drafter = make(db);
    drafter.begin(prompt, &PrefillOut::default());
    let mut ctx = prompt.to_vec();
    ctx.push(output[0]);
    drafter.observe(&output[..1], None);
    let cfg = GenConfig::default();
    let mut tree = DraftTree::new(cfg.trie_nodes, cfg.max_depth);
    let sizes: Vec<usize> = curve
        .sizes
        .iter()
        .copied()
        .filter(|&s| s > 1 && s <= max_rows)
        .collect();
    let mut recall = vec![0usize; need];
    let mut ranked: Vec<Vec<(usize, usize)>> = vec![Vec::new(); need];
    let mut ranks = Vec::new();
    for j in 1..need {
        tree.reset(output[j - 1]);
        drafter.draft(&ctx, &mut tree, j as u64);
        tree.rank(Some(&*model));
        let future = &output[j..];
        tree.path_ranks(future, ARM_ALL, &mut ranks);
        recall[j] = ranks.len().min(max_rows - 1);
        for &s in &sizes {
            let rows = s.min(tree.arm_len(ARM_ALL));
            let acc = ranks.iter().take_while(|&&r| (r as usize) < rows).count();
            ranked[j].push((rows, acc));
        }
        tree.learn(future, model);
        drafter.observe(&output[j..=j], None);
        ctx.push(output[j]);

        parts.positions += 1;
        parts.oracle_len += cont[j];
        parts.recall_len += recall[j];
        if cont[j] >= 2 && recall[j] < cont[j] {
            parts.short_positions += 1;
            parts.empty_positions += usize::from(recall[j] == 0);
        }
    }
    parts.oracle = oracle_schedule(&cont, need, curve, max_rows);
    parts.myopic = myopic_schedule(&chain_options(&cont), need, curve);
    parts.recall = cheapest_schedule(&chain_options(&recall), need, curve);
    parts.ranked = cheapest_schedule(&ranked, need, curve);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve() -> CostCurve {
        CostCurve::new(vec![1, 2, 4, 8, 16], vec![10.0, 11.0, 12.0, 16.0, 30.0]).unwrap()
    }

    #[test]
    fn myopic_never_beats_the_cheapest_schedule() {
        let c = curve();
        let mut x = 12345u64;
        for _ in 0..200 {
            let cont: Vec<usize> = (0..20)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((x >> 40) % 9) as usize
                })
                .collect();
            let opts = chain_options(&cont);
            let m = myopic_schedule(&opts, cont.len(), &c);
            let d = cheapest_schedule(&opts, cont.len(), &c);
            assert!(m.cost_ms >= d.cost_ms - 1e-9);
            assert_eq!(m.tokens, d.tokens);
        }
    }

    #[test]
    fn a_copied_answer_is_recalled_and_no_drafter_recalls_nothing() {
        // The answer copies a stretch of the prompt: the suffix automaton's trie holds
        // it, so recall reaches the oracle; without a drafter nothing is recalled.
        let prompt: Vec<u32> = (0..60).map(|i| (i * 7 % 23) as u32).collect();
        let output: Vec<u32> = prompt[20..50].to_vec();
        let c = curve();
        let mut model = AcceptModel::default();
        let sam = gap_parts(Mode::Sam, &prompt, &output, &[], &c, 16, &mut model);
        assert_eq!(sam.positions, output.len() - 1);
        assert!(sam.oracle.speedup() > 1.5);
        assert!((sam.recall.cost_ms - sam.oracle.cost_ms).abs() < 1e-9);
        assert!(sam.ranked.cost_ms >= sam.recall.cost_ms - 1e-9);
        assert!(sam.myopic.cost_ms >= sam.oracle.cost_ms - 1e-9);
        let none = gap_parts(Mode::None, &prompt, &output, &[], &c, 16, &mut model);
        assert!((none.recall.speedup() - 1.0).abs() < 1e-12);
        assert_eq!(none.recall_len, 0);
        assert!(none.short_positions > 0 && none.short_positions == none.empty_positions);
    }
}
