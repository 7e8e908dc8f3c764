//! Oracle bound for retrieval drafting: the speed-up a drafter that copies from the
//! given sources could reach at best, for a known greedy output and cost curve.
//!
//! At each output position the oracle knows the true continuation and drafts the
//! longest stretch of it that occurs verbatim in a source available at that moment
//! (the prompt, a database text, or the output already emitted). Knowing the right
//! occurrence, one chain is the best tree, and the chain lengths over the whole
//! output are chosen by dynamic programming to minimise the total verify cost. No
//! drafter reading only these sources can beat it, so a bound below a target shows
//! the target is out of reach for these prompts whatever the drafter does.

use crate::budget::CostCurve;

/// Sources an oracle may copy from, and how much of the current context an
/// occurrence must share before it counts (0: any occurrence, the loosest bound;
/// k: the k tokens before the occurrence equal the last k emitted tokens, as a
/// suffix-matching drafter needs at least one matched token to find it).
pub struct OracleSources<'a> {
    pub fixed: Vec<&'a [u32]>,
    pub min_context: usize,
}

/// For each output position `j` (0-based; position 0 comes from prefill and gets 0),
/// the longest `l <= max_len` such that `output[j..j+l]` occurs in a fixed source or
/// inside `output[..j]` (the emitted text), with `min_context` matching tokens before it.
pub fn longest_true_continuations(
    output: &[u32],
    src: &OracleSources<'_>,
    max_len: usize,
) -> Vec<usize> {
    let n = output.len();
    let mut best = vec![0usize; n];
    for j in 1..n {
        let want = &output[j..n.min(j + max_len)];
        if want.is_empty() {
            continue;
        }
        let ctx = &output[j.saturating_sub(src.min_context)..j];
        if ctx.len() < src.min_context {
            continue;
        }
        let mut b = 0;
        let mut scan = |text: &[u32]| {
            for s in ctx.len()..text.len() {
                if text[s] != want[0] || text[s - ctx.len()..s] != *ctx {
                    continue;
                }
                let l = text[s..]
                    .iter()
                    .zip(want)
                    .take_while(|(a, b)| a == b)
                    .count();
                b = b.max(l);
            }
        };
        for t in &src.fixed {
            scan(t);
        }
        scan(&output[..j]);
        best[j] = b;
    }
    best
}

/// The cheapest schedule of verify steps for producing output positions `1..need`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OracleSchedule {
    pub steps: usize,
    /// Positions produced by the steps (`need - 1`).
    pub tokens: usize,
    pub rows: usize,
    /// Total modeled verify time of the schedule.
    pub cost_ms: f64,
    /// Modeled time of plain decoding (`tokens` steps of one row).
    pub base_ms: f64,
}

impl OracleSchedule {
    pub fn add(&mut self, o: &OracleSchedule) {
        self.steps += o.steps;
        self.tokens += o.tokens;
        self.rows += o.rows;
        self.cost_ms += o.cost_ms;
        self.base_ms += o.base_ms;
    }

    pub fn tokens_per_step(&self) -> f64 {
        self.tokens as f64 / self.steps.max(1) as f64
    }

    pub fn speedup(&self) -> f64 {
        if self.cost_ms > 0.0 {
            self.base_ms / self.cost_ms
        } else {
            1.0
        }
    }
}

/// Minimum total cost of producing positions `1..need` when a step at position `j`
/// may verify a chain of up to `cont[j]` true tokens (plus the root row, at most
/// `max_rows` rows) and emits them plus the bonus token.
pub fn oracle_schedule(
    cont: &[usize],
    need: usize,
    curve: &CostCurve,
    max_rows: usize,
) -> OracleSchedule {
    let capped: Vec<usize> = cont.iter().map(|&c| c.min(max_rows.max(1) - 1)).collect();
    cheapest_schedule(&chain_options(&capped), need, curve)
}

/// Cheapest schedule producing positions `1..need` when a step at position `j` may
/// pick any `(rows, tokens accepted)` of `opts[j]` (one row and none is always allowed).
pub fn cheapest_schedule(
    opts: &[Vec<(usize, usize)>],
    need: usize,
    curve: &CostCurve,
) -> OracleSchedule {
    let need = need.min(opts.len());
    if need <= 1 {
        return OracleSchedule::default();
    }
    let mut best = vec![(0.0f64, 0usize, 0usize); need + 1];
    for j in (1..need).rev() {
        let mut pick = (
            curve.cost(1) + best[j + 1].0,
            best[j + 1].1 + 1,
            best[j + 1].2 + 1,
        );
        for &(rows, acc) in &opts[j] {
            let next = j + 1 + acc.min(need - 1 - j);
            let (c, s, r) = best[next];
            let cost = curve.cost(rows.max(1)) + c;
            if cost < pick.0 {
                pick = (cost, s + 1, r + rows.max(1));
            }
        }
        best[j] = pick;
    }
    OracleSchedule {
        steps: best[1].1,
        tokens: need - 1,
        rows: best[1].2,
        cost_ms: best[1].0,
        base_ms: (need - 1) as f64 * curve.cost(1),
    }
}

/// Chains of every length up to `cont[j]` (the oracle's options).
pub fn chain_options(cont: &[usize]) -> Vec<Vec<(usize, usize)>> {
    cont.iter()
        .map(|&c| (1..=c).map(|l| (l + 1, l)).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force over every split of the positions into steps (small n only).
    fn brute(cont: &[usize], j: usize, need: usize, curve: &CostCurve, max_rows: usize) -> f64 {
        if j >= need {
            return 0.0;
        }
        let mut best = f64::INFINITY;
        for l in 0..=cont[j].min(max_rows - 1).min(need - 1 - j) {
            best = best.min(curve.cost(l + 1) + brute(cont, j + l + 1, need, curve, max_rows));
        }
        best
    }

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, m: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % m
        }
    }

    #[test]
    fn continuations_match_a_naive_substring_search() {
        let mut rng = Lcg(7);
        for case in 0..200 {
            let vocab = 2 + case % 4;
            let prompt: Vec<u32> = (0..rng.next(30)).map(|_| rng.next(vocab) as u32).collect();
            let out: Vec<u32> = (0..1 + rng.next(25))
                .map(|_| rng.next(vocab) as u32)
                .collect();
            let ctx = (case % 3) as usize;
            let src = OracleSources {
                fixed: vec![&prompt],
                min_context: ctx,
            };
            let got = longest_true_continuations(&out, &src, 8);
            for j in 1..out.len() {
                // Naive: the longest l whose (context + continuation) window appears.
                let mut want = 0;
                for l in 1..=8.min(out.len() - j) {
                    if j < ctx {
                        break;
                    }
                    let needle = &out[j - ctx..j + l];
                    let in_text = |t: &[u32]| t.windows(needle.len()).any(|w| w == needle);
                    if in_text(&prompt) || in_text(&out[..j]) && needle.len() <= j {
                        want = l;
                    }
                }
                assert_eq!(
                    got[j], want,
                    "case {case} j {j} out {out:?} prompt {prompt:?}"
                );
            }
            assert_eq!(got[0], 0);
        }
    }

    #[test]
    fn emitted_text_counts_only_before_the_position() {
        // "a b a b": at j=2 the emitted text is "a b", so "a b" is a 2-token continuation;
        // at j=1 only "a" is emitted and "b" is nowhere.
        let out = [1, 2, 1, 2];
        let c = longest_true_continuations(
            &out,
            &OracleSources {
                fixed: vec![],
                min_context: 0,
            },
            8,
        );
        assert_eq!(c, vec![0, 0, 2, 1]);
    }

    #[test]
    fn schedule_is_the_cheapest_split() {
        let mut rng = Lcg(11);
        let curve = CostCurve::new(vec![1, 2, 4, 8], vec![10.0, 11.0, 14.0, 25.0]).unwrap();
        for _ in 0..300 {
            let n = 2 + rng.next(14) as usize;
            let cont: Vec<usize> = (0..n).map(|_| rng.next(9) as usize).collect();
            let max_rows = 1 + rng.next(8) as usize;
            let s = oracle_schedule(&cont, n, &curve, max_rows);
            let b = brute(&cont, 1, n, &curve, max_rows);
            assert!(
                (s.cost_ms - b).abs() < 1e-9,
                "{cont:?} {max_rows}: {} vs {b}",
                s.cost_ms
            );
            assert_eq!(s.tokens, n - 1);
            assert!(s.steps >= 1 && s.steps < n && s.rows >= s.tokens);
            assert!(s.speedup() >= 1.0 - 1e-12);
        }
    }

    #[test]
    fn no_drafts_is_plain_decoding_and_perfect_drafts_fill_the_batch() {
        let curve = CostCurve::new(vec![1, 2, 4], vec![10.0, 10.0, 10.0]).unwrap();
        let none = oracle_schedule(&[0; 9], 9, &curve, 4);
        assert_eq!((none.steps, none.rows), (8, 8));
        assert!((none.speedup() - 1.0).abs() < 1e-12);
        let all = oracle_schedule(&[99; 9], 9, &curve, 4);
        assert_eq!(all.steps, 2);
        assert!((all.speedup() - 4.0).abs() < 1e-12);
    }
}
