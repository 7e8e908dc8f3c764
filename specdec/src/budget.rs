//! Draft budget from the measured verify-cost curve.
//!
//! Every step the drafters build a candidate trie larger than any budget. Once the
//! true continuation is known, the trie tells exactly how many tokens each budget
//! (cut by rank) would have accepted, so acceptance for every budget is learned
//! even while speculation is switched off — no exploration needed. The budget per
//! step maximises (1 + expected accepted) / cost(budget); budget 1 is plain decoding,
//! so in expectation a step is never slower than not speculating (pitfall 4).

use crate::target::Target;
use crate::tree::{DraftTree, FlatTree, ARMS};
use crate::SpecError;
use std::time::Instant;

/// Verify latency per batch size, measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostCurve {
    /// Increasing batch sizes, starting at 1.
    pub sizes: Vec<usize>,
    /// Milliseconds per verify forward at each size.
    pub ms: Vec<f64>,
}

/// Batch sizes profiled by default.
pub const DEFAULT_SIZES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

impl CostCurve {
    pub fn new(sizes: Vec<usize>, ms: Vec<f64>) -> Result<Self, SpecError> {
        if sizes.is_empty() || sizes.len() != ms.len() || sizes[0] != 1 {
            return Err(SpecError::Config(
                "cost curve needs matching sizes/ms starting at batch 1".into(),
            ));
        }
        if sizes.windows(2).any(|w| w[0] >= w[1]) || ms.iter().any(|m| m.is_nan() || *m <= 0.0) {
            return Err(SpecError::Config(
                "cost curve sizes must increase and costs be positive".into(),
            ));
        }
        Ok(CostCurve { sizes, ms })
    }

    /// A curve where a batch of n costs `a + b*n` (for tests and mocks).
    pub fn affine(a: f64, b: f64, sizes: &[usize]) -> Self {
        CostCurve {
            sizes: sizes.to_vec(),
            ms: sizes.iter().map(|&n| a + b * n as f64).collect(),
        }
    }

    /// Cost of a batch of n rows. The measured sizes are the static graph shapes,
    /// so a batch runs padded to the next one; past the last, cost grows linearly.
    pub fn cost(&self, n: usize) -> f64 {
        let n = n.max(1);
        match self.sizes.iter().position(|&s| s >= n) {
            Some(i) => self.ms[i],
            None => {
                let last = self.sizes.len() - 1;
                self.ms[last] * n as f64 / self.sizes[last] as f64
            }
        }
    }

    /// Saturation length: the largest measured batch that costs at most 25% more
    /// than a single-token step (the end of the "constant-cost" region).
    pub fn saturation(&self) -> usize {
        let base = self.ms[0];
        let mut s = 1;
        for (i, &n) in self.sizes.iter().enumerate() {
            if self.ms[i] <= base * 1.25 {
                s = n;
            }
        }
        s
    }

    /// Read a curve cached by `save` (per model and machine); invalid files are errors.
    pub fn load(path: &std::path::Path) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError::Config(format!("reading {}: {e}", path.display())))?;
        let c: CostCurve = serde_json::from_str(&text)
            .map_err(|e| SpecError::Config(format!("{}: not a cost curve: {e}", path.display())))?;
        CostCurve::new(c.sizes, c.ms)
    }

    /// Cache the curve as JSON (temp file + rename).
    pub fn save(&self, path: &std::path::Path) -> Result<(), SpecError> {
        let text = serde_json::to_string(self).map_err(|e| SpecError::Config(e.to_string()))?;
        crate::atomic_file::write_replacing(path, text.as_bytes())
            .map_err(|e| SpecError::Config(format!("writing {}: {e}", path.display())))
    }

    /// Measure the curve through the target: verify chains of the pending token
    /// (nothing is committed). One warm-up per size, then `reps` rounds that visit
    /// every size in turn; each size keeps its fastest run. Interleaving spreads a slow
    /// phase of a shared machine over all sizes instead of one, and interference only
    /// ever adds time, so the minimum is the estimate of the cost itself (a slow N=1
    /// alone once inflated the whole curve through the running maximum below).
    pub fn profile<T: Target + ?Sized>(
        target: &mut T,
        pending: u32,
        sizes: &[usize],
        reps: usize,
    ) -> Result<Self, SpecError> {
        let max = target.max_batch().min(target.context_left());
        let mut flat = FlatTree::default();
        let mut argmax = Vec::new();
        let out_sizes: Vec<usize> = sizes
            .iter()
            .copied()
            .filter(|&n| n >= 1 && n <= max)
            .collect();
        let mut out_ms = vec![f64::INFINITY; out_sizes.len()];
        // Sizes that run on the same static graph cost the same: measure the largest of
        // each graph (a QNN session has one verify graph for every size).
        let graph = |n: usize| target.graph_rows(n);
        let measured: Vec<bool> = (0..out_sizes.len())
            .map(|i| {
                out_sizes
                    .get(i + 1)
                    .is_none_or(|&m| graph(m) != graph(out_sizes[i]))
            })
            .collect();
        for round in 0..=reps.max(1) {
            for (i, &n) in out_sizes.iter().enumerate() {
                if !measured[i] {
                    continue;
                }
                chain_of(&mut flat, pending, n);
                let t = Instant::now();
                target.verify(&flat, &mut argmax)?;
                // Round 0 warms each size up (first-touch of its buffers).
                if round > 0 {
                    out_ms[i] = out_ms[i].min(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        for i in (0..out_ms.len()).rev() {
            if !measured[i] {
                out_ms[i] = out_ms[i + 1];
            }
        }
        for ms in &mut out_ms {
            *ms = ms.max(1e-6);
        }
        // Costs must not decrease with size for the model to make sense: noise can
        // make a larger batch look cheaper; take the running maximum.
        for i in 1..out_ms.len() {
            if out_ms[i] < out_ms[i - 1] {
                out_ms[i] = out_ms[i - 1];
            }
        }
        CostCurve::new(out_sizes, out_ms)
    }
}

/// Most candidate budgets a controller considers (the curve's first sizes).
pub const MAX_SIZES: usize = 8;

/// A trie's own estimate of its accepted drafts at each candidate budget, per arm.
pub type Predictions = [[f64; MAX_SIZES]; ARMS];

/// [`BudgetController`]'s learned sums per arm and candidate budget.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BudgetCalibration {
    pub sizes: Vec<usize>,
    pub est_sum: Vec<Vec<f64>>,
    pub acc_sum: Vec<Vec<f64>>,
    /// The latest verify times (ms) seen per candidate budget, oldest first (absent in
    /// files written before costs were tracked).
    #[serde(default)]
    pub costs: Vec<Vec<f64>>,
}

/// Verify times kept per candidate budget: the live cost is their median.
pub const COST_WINDOW: usize = 8;
/// Below this many times the profiled cost counts as one more of them.
const COST_TRUSTED: usize = 3;
/// A budget not verified for this many steps is stale ...
const COST_STALE_STEPS: u64 = 64;
/// ... and may be verified once (when it promises at least `PROBE_MIN_RATE` of the
/// best rate) on every this-many-th step, so that its cost is measured again.
const PROBE_EVERY: u64 = 16;
const PROBE_MIN_RATE: f64 = 0.75;

/// The verify times of one candidate budget.
#[derive(Clone, Debug, Default)]
struct LiveCost {
    recent: std::collections::VecDeque<f64>,
    /// The controller's step count at the latest time (0: never, or restored).
    last_step: u64,
}

/// Picks the arm and budget of each step from the trie's own estimate of what every
/// budget accepts, calibrated per arm and budget against what such cuts really
/// accepted (counterfactually, every step).
///
/// Why per step and not per confidence bucket (replay on captured runs at
/// three measured curves): a bucket's mean, shrunk towards the mean over all buckets,
/// handed rarely seen buckets the large acceptances of the confident ones (bucket 3
/// at 32 rows: 14.8 predicted, 0 accepted), and the controller lost to the best
/// fixed budget on every category; the tree's estimate times a per-budget ratio
/// follows each step's own drafts.
#[derive(Clone, Debug)]
pub struct BudgetController {
    curve: CostCurve,
    /// Candidate budgets (the curve's sizes up to the cap).
    sizes: Vec<usize>,
    /// `[arm][budget]`: decayed sums of the trees' estimates and of the drafts accepted.
    est_sum: Vec<[f64; MAX_SIZES]>,
    acc_sum: Vec<[f64; MAX_SIZES]>,
    /// Pseudo-tokens of "estimated but not accepted": speculation that costs more than
    /// one row starts off and turns on once the evidence says it pays (free rows are
    /// verified from the start, see `choose`).
    prior_weight: f64,
    /// Exponential forgetting so the calibration follows the current text.
    decay: f64,
    /// `[budget]`: verify times measured while generating. The profiled curve goes
    /// stale on a shared machine: one host measured 20.5 ms for one row and 27.9 ms
    /// for eight, and minutes later 27.9 ms for both (memory bandwidth taken by a
    /// neighbour); and deeper contexts cost more. Budgets are chosen on these.
    live: Vec<LiveCost>,
    /// Verify steps observed (`observe_cost`), for staleness and probing.
    steps: u64,
    /// Choose on the profiled curve only (ablations, or a curve known to be exact).
    fixed_costs: bool,
}

impl BudgetController {
    pub fn new(curve: CostCurve, max_budget: usize) -> Self {
        let mut sizes: Vec<usize> = curve
            .sizes
            .iter()
            .copied()
            .filter(|&s| s <= max_budget.max(1))
            .take(MAX_SIZES)
            .collect();
        if sizes.is_empty() {
            sizes.push(1);
        }
        let n = sizes.len();
        BudgetController {
            curve,
            sizes,
            est_sum: vec![[0.0; MAX_SIZES]; ARMS],
            acc_sum: vec![[0.0; MAX_SIZES]; ARMS],
            prior_weight: 1.0,
            decay: 0.98,
            live: vec![LiveCost::default(); n],
            steps: 0,
            fixed_costs: false,
        }
    }

    /// Choose budgets on the profiled curve only, ignoring measured verify times.
    pub fn with_fixed_costs(mut self, fixed: bool) -> Self {
        self.fixed_costs = fixed;
        self
    }

    /// Index of the candidate budget whose graph runs a verify of `rows` rows.
    fn size_index(&self, rows: usize) -> Option<usize> {
        self.sizes.iter().position(|&s| s >= rows.max(1))
    }

    /// Record the measured time of one verify of `rows` rows.
    pub fn observe_cost(&mut self, rows: usize, ms: f64) {
        self.steps += 1;
        if !(ms.is_finite() && ms > 0.0) {
            return;
        }
        let Some(j) = self.size_index(rows) else {
            return;
        };
        let steps = self.steps;
        let l = &mut self.live[j];
        if l.recent.len() == COST_WINDOW {
            l.recent.pop_front();
        }
        l.recent.push_back(ms);
        l.last_step = steps;
    }

    /// What a verify of `rows` rows costs now: the median of its latest measured times
    /// (with the profiled cost as one more while there are few), else the profile.
    pub fn cost(&self, rows: usize) -> f64 {
        let prior = self.curve.cost(rows);
        let Some(j) = self.size_index(rows).filter(|_| !self.fixed_costs) else {
            return prior;
        };
        let recent = &self.live[j].recent;
        if recent.is_empty() {
            return prior;
        }
        // On the stack: `choose` asks for up to 2 x MAX_SIZES costs every step.
        let mut buf = [0.0; COST_WINDOW + 1];
        let mut n = 0;
        for &ms in recent {
            buf[n] = ms;
            n += 1;
        }
        if n < COST_TRUSTED {
            buf[n] = prior;
            n += 1;
        }
        let v = &mut buf[..n];
        v.sort_by(f64::total_cmp);
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    /// The live cost of every candidate budget (for reports).
    pub fn live_costs(&self) -> Vec<(usize, f64)> {
        self.sizes.iter().map(|&s| (s, self.cost(s))).collect()
    }

    pub fn curve(&self) -> &CostCurve {
        &self.curve
    }

    pub fn max_budget(&self) -> usize {
        *self.sizes.last().unwrap_or(&1)
    }

    /// The trie's own estimates (sums of its ranked nodes' acceptance) at every
    /// candidate budget, for both arms.
    pub fn predict(&self, tree: &DraftTree, out: &mut Predictions) {
        for (arm, row) in out.iter_mut().enumerate() {
            for (j, &s) in self.sizes.iter().enumerate() {
                row[j] = f64::from(tree.expected_accepted(s, arm));
            }
        }
    }

    /// Record one evaluated step of `arm`: `est` were the trie's estimates, `ranks`
    /// are the arm's trie ranks along the path the true output follows (increasing).
    pub fn observe(&mut self, arm: usize, est: &[f64; MAX_SIZES], ranks: &[u32]) {
        for (j, &s) in self.sizes.iter().enumerate() {
            let acc = ranks.iter().take_while(|&&r| (r as usize) < s).count();
            self.est_sum[arm][j] = self.est_sum[arm][j] * self.decay + est[j];
            self.acc_sum[arm][j] = self.acc_sum[arm][j] * self.decay + acc as f64;
        }
    }

    /// Accepted per estimated draft token at each candidate budget (for reports).
    pub fn ratios(&self, arm: usize) -> Vec<(usize, f64)> {
        (0..self.sizes.len())
            .map(|j| (self.sizes[j], self.ratio(arm, j)))
            .collect()
    }

    fn ratio(&self, arm: usize, j: usize) -> f64 {
        self.acc_sum[arm][j] / (self.est_sum[arm][j] + self.prior_weight)
    }

    /// Expected accepted drafts of `arm` at candidate budget index j, for a trie
    /// whose own estimate there is `est`.
    pub fn expected_accepted(&self, arm: usize, j: usize, est: f64) -> f64 {
        est * self.ratio(arm, j)
    }

    /// What the controller has learned, so that a later process (every `rag ask` is one)
    /// starts where this one stopped instead of verifying single rows until evidence
    /// arrives.
    pub fn calibration(&self) -> BudgetCalibration {
        let n = self.sizes.len();
        BudgetCalibration {
            sizes: self.sizes.clone(),
            est_sum: self.est_sum.iter().map(|r| r[..n].to_vec()).collect(),
            acc_sum: self.acc_sum.iter().map(|r| r[..n].to_vec()).collect(),
            costs: self
                .live
                .iter()
                .map(|l| l.recent.iter().copied().collect())
                .collect(),
        }
    }

    /// Starts from `c` (an earlier [`Self::calibration`]); refused, and nothing changed,
    /// unless it was learned for the same candidate budgets and holds only finite,
    /// non-negative sums.
    pub fn restore(&mut self, c: &BudgetCalibration) -> Result<(), String> {
        let n = self.sizes.len();
        if c.sizes != self.sizes {
            return Err(format!(
                "learned for budgets {:?}, not {:?}",
                c.sizes, self.sizes
            ));
        }
        let ok = |rows: &[Vec<f64>]| {
            rows.len() == ARMS
                && rows
                    .iter()
                    .all(|r| r.len() == n && r.iter().all(|v| v.is_finite() && *v >= 0.0))
        };
        if !ok(&c.est_sum) || !ok(&c.acc_sum) {
            return Err("malformed budget calibration".into());
        }
        let costs_ok = c.costs.is_empty()
            || (c.costs.len() == n
                && c.costs.iter().all(|w| {
                    w.len() <= COST_WINDOW && w.iter().all(|v| v.is_finite() && *v > 0.0)
                }));
        if !costs_ok {
            return Err("malformed verify times in the budget calibration".into());
        }
        for arm in 0..ARMS {
            self.est_sum[arm][..n].copy_from_slice(&c.est_sum[arm]);
            self.acc_sum[arm][..n].copy_from_slice(&c.acc_sum[arm]);
        }
        // Restored times are the latest evidence but of unknown age: stale at once.
        for (l, w) in self.live.iter_mut().zip(&c.costs) {
            l.recent = w.iter().copied().collect();
            l.last_step = 0;
        }
        Ok(())
    }

    /// Budget for a step cut by `arm` with `tree_len` nodes and estimates `est`:
    /// maximise expected emitted tokens per verify millisecond. Returns (budget,
    /// tokens per ms).
    ///
    /// Costs are the live ones ([`Self::cost`]). A budget whose cost was not measured
    /// for a while is chosen instead of the best on every `PROBE_EVERY`-th step when it
    /// promises at least `PROBE_MIN_RATE` of the best rate: without it a budget never
    /// chosen keeps its profiled cost however wrong that has become.
    pub fn choose(&self, arm: usize, est: &[f64; MAX_SIZES], tree_len: usize) -> (usize, f64) {
        let cost1 = self.cost(1);
        let mut best = (1.0 / cost1, 1usize);
        if tree_len <= 1 {
            return (best.1, best.0);
        }
        let mut rates = [(0.0, 0usize); MAX_SIZES];
        rates[0] = best;
        let mut last = 0;
        for (j, &s) in self.sizes.iter().enumerate().skip(1) {
            let rows = s.min(tree_len);
            let cost = self.cost(rows);
            let rate = (1.0 + self.expected_accepted(arm, j, est[j])) / cost;
            rates[j] = (rate, rows);
            last = j;
            // Rows that cost nothing more (a flat curve's start, e.g. 1, 2, 4 rows of a
            // bandwidth-bound model) are verified even before any evidence: they can only
            // add tokens. A fresh process (every `rag ask`) would otherwise start with no
            // speculation until the calibration had seen a few steps.
            let free = cost <= cost1;
            if rate > best.0 * 1.0001 || (free && rate >= best.0) {
                best = (rate, rows);
            }
            if s >= tree_len {
                break;
            }
        }
        if let Some(probe) = self.probe(&rates[..=last], best) {
            return (probe.1, probe.0);
        }
        (best.1, best.0)
    }

    /// The stale candidate to measure again this step, if it is a probing step.
    fn probe(&self, rates: &[(f64, usize)], best: (f64, usize)) -> Option<(f64, usize)> {
        if self.fixed_costs || self.steps == 0 || !self.steps.is_multiple_of(PROBE_EVERY) {
            return None;
        }
        let stale = |j: usize| self.live[j].last_step + COST_STALE_STEPS <= self.steps;
        rates
            .iter()
            .enumerate()
            .filter(|&(j, &(rate, rows))| {
                rows != best.1 && stale(j) && rate >= best.0 * PROBE_MIN_RATE
            })
            .map(|(_, &r)| r)
            .max_by(|a, b| a.0.total_cmp(&b.0))
    }
}

/// `flat` := a chain of `n` copies of `pending` (each the child of the previous).
fn chain_of(flat: &mut FlatTree, pending: u32, n: usize) {
    flat.tokens.clear();
    flat.parents.clear();
    flat.depths.clear();
    flat.node_ids.clear();
    flat.sources.clear();
    for i in 0..n {
        flat.tokens.push(pending);
        flat.parents.push(i as i32 - 1);
        flat.depths.push(i as u32);
        flat.node_ids.push(i as u32);
        flat.sources.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::PrefillOut;

    /// Records the verify batch sizes it is asked for; batches run on graphs of at
    /// least `min_graph` rows.
    struct Recorder {
        seen: Vec<usize>,
        min_graph: usize,
    }

    impl Target for Recorder {
        fn prefill(&mut self, _: &[u32], _: usize, _: &mut PrefillOut) -> Result<(), SpecError> {
            Ok(())
        }
        fn verify(&mut self, tree: &FlatTree, argmax: &mut Vec<u32>) -> Result<(), SpecError> {
            assert_eq!(
                tree.parents,
                (0..tree.len() as i32).map(|i| i - 1).collect::<Vec<_>>()
            );
            self.seen.push(tree.len());
            argmax.clear();
            argmax.resize(tree.len(), 0);
            Ok(())
        }
        fn commit(&mut self, _: &[usize]) -> Result<(), SpecError> {
            Ok(())
        }
        fn is_eog(&self, _: u32) -> bool {
            false
        }
        fn max_batch(&self) -> usize {
            8
        }
        fn graph_rows(&self, n: usize) -> usize {
            n.max(self.min_graph)
        }
        fn context_left(&self) -> usize {
            100
        }
    }

    #[test]
    fn profile_visits_sizes_in_rounds_within_the_batch_limit() {
        let mut t = Recorder {
            seen: Vec::new(),
            min_graph: 1,
        };
        let c = CostCurve::profile(&mut t, 7, &[1, 2, 4, 8, 16], 3).unwrap();
        // A warm-up round, then 3 timed rounds, each over every size the target takes.
        let round = [1, 2, 4, 8];
        assert_eq!(t.seen, round.repeat(4));
        assert_eq!(c.sizes, round.to_vec());
        assert!(c.ms.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn profile_measures_each_static_graph_once() {
        // Sizes 1, 2 and 4 all run on the 4-row graph: only 4 and 8 are verified, and
        // 1 and 2 get the 4-row graph's cost.
        let mut t = Recorder {
            seen: Vec::new(),
            min_graph: 4,
        };
        let c = CostCurve::profile(&mut t, 7, &[1, 2, 4, 8, 16], 2).unwrap();
        assert_eq!(t.seen, [4, 8].repeat(3));
        assert_eq!(c.sizes, vec![1, 2, 4, 8]);
        assert_eq!(c.ms[0], c.ms[2]);
        assert_eq!(c.ms[1], c.ms[2]);
    }

    #[test]
    fn cost_interpolates_and_saturates() {
        let c = CostCurve::new(vec![1, 2, 4, 8], vec![10.0, 10.0, 11.0, 20.0]).unwrap();
        assert_eq!(c.cost(3), 11.0); // padded to the 4-row graph
        assert_eq!(c.cost(16), 40.0);
        assert_eq!(c.saturation(), 4);
        assert!(CostCurve::new(vec![2], vec![1.0]).is_err());
        assert!(CostCurve::new(vec![1, 1], vec![1.0, 1.0]).is_err());
        assert!(CostCurve::new(vec![1], vec![f64::NAN]).is_err());
    }

    #[test]
    fn cache_roundtrip_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("curve.json");
        let c = CostCurve::affine(5.0, 1.0, &DEFAULT_SIZES);
        c.save(&p).unwrap();
        assert_eq!(CostCurve::load(&p).unwrap(), c);
        std::fs::write(&p, "{\"sizes\":[2],\"ms\":[1.0]}").unwrap();
        assert!(CostCurve::load(&p).is_err());
        std::fs::write(&p, "garbage").unwrap();
        assert!(CostCurve::load(&p).is_err());
    }

    /// Estimates of a chain whose nodes are each accepted with probability p.
    fn chain_est(ctl: &BudgetController, p: f64) -> [f64; MAX_SIZES] {
        let mut e = [0.0; MAX_SIZES];
        for (j, &s) in ctl.sizes.iter().enumerate() {
            e[j] = (1..s).map(|d| p.powi(d as i32)).sum();
        }
        e
    }

    #[test]
    fn no_evidence_means_no_speculation() {
        let ctl = BudgetController::new(CostCurve::affine(10.0, 0.1, &DEFAULT_SIZES), 64);
        let est = chain_est(&ctl, 0.9);
        assert_eq!(ctl.choose(0, &est, 64).0, 1);
    }

    #[test]
    fn rows_that_cost_nothing_more_are_verified_from_the_start() {
        // A bandwidth-bound start of the curve (1, 2 and 4 rows cost the same): without
        // evidence the controller still verifies the free rows, and no costlier ones.
        let curve = CostCurve::new(vec![1, 2, 4, 8, 16], vec![10.0, 10.0, 10.0, 10.5, 18.0]);
        let ctl = BudgetController::new(curve.unwrap(), 16);
        let est = chain_est(&ctl, 0.9);
        assert_eq!(ctl.choose(0, &est, 64).0, 4);
        assert_eq!(ctl.choose(0, &est, 3).0, 3, "the whole (smaller) tree");
        assert_eq!(ctl.choose(0, &est, 1).0, 1);
    }

    #[test]
    fn flat_curve_and_good_drafts_pick_large_budget() {
        let mut ctl = BudgetController::new(CostCurve::affine(10.0, 0.01, &DEFAULT_SIZES), 64);
        let est = chain_est(&ctl, 0.95);
        for _ in 0..50 {
            ctl.observe(0, &est, &[1, 3, 6, 10, 20]);
        }
        assert!(ctl.choose(0, &est, 64).0 >= 32);
        // Tree smaller than the budget: the whole tree.
        assert_eq!(ctl.choose(0, &est, 9).0, 9);
    }

    #[test]
    fn linear_curve_and_poor_drafts_stay_at_one() {
        // Each row costs as much as a whole step: drafts must be accepted almost
        // always to pay; a 10% first-token acceptance never does.
        let mut ctl = BudgetController::new(CostCurve::affine(0.0, 10.0, &DEFAULT_SIZES), 64);
        let est = chain_est(&ctl, 0.9);
        for i in 0..100 {
            let ranks: &[u32] = if i % 10 == 0 { &[1] } else { &[] };
            ctl.observe(0, &est, ranks);
        }
        assert_eq!(ctl.choose(0, &est, 64).0, 1);
    }

    #[test]
    fn calibration_scales_each_step_by_its_own_estimate() {
        // The trees claim twice what they deliver at every budget: the ratio learns
        // 1/2, and a step whose own estimate is low gets a smaller budget than one
        // whose estimate is high.
        let mut ctl = BudgetController::new(CostCurve::affine(10.0, 1.0, &DEFAULT_SIZES), 64);
        let est = chain_est(&ctl, 0.95);
        for _ in 0..200 {
            let acc: Vec<u32> = (1..16).collect();
            let mut half = [0.0; MAX_SIZES];
            for (j, &s) in ctl.sizes.iter().enumerate() {
                half[j] = 2.0 * acc.iter().filter(|&&r| (r as usize) < s).count() as f64;
            }
            ctl.observe(0, &half, &acc);
        }
        for (_, r) in ctl.ratios(0).into_iter().skip(1) {
            assert!((r - 0.5).abs() < 0.01, "{r}");
        }
        let weak = chain_est(&ctl, 0.3);
        let (b_strong, _) = ctl.choose(0, &est, 64);
        let (b_weak, _) = ctl.choose(0, &weak, 64);
        assert!(b_weak < b_strong, "{b_weak} {b_strong}");
    }

    /// A controller that has learned its trees deliver about one draft in four rows.
    fn calibrated_on_flat_profile() -> BudgetController {
        // Profiled while a neighbour took the memory bandwidth: 1 to 8 rows cost the same.
        let curve = CostCurve::new(vec![1, 2, 4, 8, 16], vec![10.0, 10.0, 10.0, 10.0, 18.0]);
        let mut ctl = BudgetController::new(curve.unwrap(), 16);
        let est = chain_est(&ctl, 0.9);
        for _ in 0..100 {
            ctl.observe(0, &est, &[1]);
        }
        ctl
    }

    #[test]
    fn measured_verify_times_replace_a_stale_profile() {
        let mut ctl = calibrated_on_flat_profile();
        let est = chain_est(&ctl, 0.9);
        assert_eq!(ctl.choose(0, &est, 64).0, 8, "eight rows cost nothing more");
        // The neighbour left: up to four rows cost 5 ms, eight 12 ms. The one draft a
        // step accepts comes as well from two or four rows.
        let measure = |ctl: &mut BudgetController| {
            for _ in 0..COST_WINDOW {
                for (rows, ms) in [(1, 5.0), (2, 5.0), (3, 5.0), (8, 12.0)] {
                    ctl.observe_cost(rows, ms);
                }
            }
        };
        measure(&mut ctl);
        assert_eq!(ctl.cost(1), 5.0);
        assert_eq!(ctl.cost(4), 5.0, "three rows run on the four-row graph");
        assert_eq!(ctl.cost(5), 12.0, "five rows run on the eight-row graph");
        assert_eq!(ctl.cost(16), 18.0, "never measured: the profile");
        let (b, _) = ctl.choose(0, &est, 64);
        assert!(b == 2 || b == 4, "{b}");
        // The same evidence on a controller told to keep the profile changes nothing.
        let mut fixed = calibrated_on_flat_profile().with_fixed_costs(true);
        measure(&mut fixed);
        assert_eq!(fixed.cost(1), 10.0);
        assert_eq!(fixed.choose(0, &est, 64).0, 8);
    }

    #[test]
    fn live_cost_is_a_median_that_trusts_few_times_less() {
        let mut ctl = calibrated_on_flat_profile();
        ctl.observe_cost(1, 30.0);
        // One time and the profile: their mean.
        assert_eq!(ctl.cost(1), 20.0);
        ctl.observe_cost(1, 6.0);
        assert_eq!(ctl.cost(1), 10.0, "median of 30, 6 and the profile's 10");
        ctl.observe_cost(1, 8.0);
        assert_eq!(
            ctl.cost(1),
            8.0,
            "three times: the profile no longer counts"
        );
        // A spike does not move a median; the window forgets the oldest.
        for _ in 0..COST_WINDOW {
            ctl.observe_cost(1, 5.0);
        }
        ctl.observe_cost(1, 500.0);
        assert_eq!(ctl.cost(1), 5.0);
        // Nonsense times are ignored.
        ctl.observe_cost(1, f64::NAN);
        ctl.observe_cost(1, -1.0);
        assert_eq!(ctl.cost(1), 5.0);
    }

    #[test]
    fn a_budget_not_measured_for_long_is_probed_on_every_sixteenth_step() {
        let mut ctl = calibrated_on_flat_profile();
        let est = chain_est(&ctl, 0.9);
        let mut probes = Vec::new();
        for step in 0..200u64 {
            let (b, _) = ctl.choose(0, &est, 64);
            if b != 8 {
                probes.push((step, b));
            }
            ctl.observe_cost(b, 10.0);
        }
        // `choose` at step i sees the i verifies before it. Two and four rows go stale
        // at step 64 and are measured in turn, once per stale period each; one row (half
        // the best rate: one token for the cost of two) and sixteen (costlier) never.
        let steps: Vec<u64> = probes.iter().map(|p| p.0).collect();
        assert!(steps.iter().all(|s| s % PROBE_EVERY == 0), "{probes:?}");
        assert!(steps[0] >= COST_STALE_STEPS, "{probes:?}");
        let probed: std::collections::BTreeSet<usize> = probes.iter().map(|p| p.1).collect();
        assert_eq!(
            probed.into_iter().collect::<Vec<_>>(),
            vec![2, 4],
            "{probes:?}"
        );
        assert!(probes.len() <= 4, "{probes:?}");
    }

    #[test]
    fn verify_times_are_restored_and_checked() {
        let mut ctl = calibrated_on_flat_profile();
        for _ in 0..4 {
            ctl.observe_cost(1, 7.0);
        }
        let cal = ctl.calibration();
        assert_eq!(cal.costs[0], vec![7.0; 4]);
        let mut fresh = calibrated_on_flat_profile();
        fresh.restore(&cal).unwrap();
        assert_eq!(fresh.cost(1), 7.0);
        for bad in [
            vec![vec![f64::NAN]; 5],
            vec![vec![0.0]; 5],
            vec![vec![1.0]; 4],
            vec![vec![1.0; COST_WINDOW + 1]; 5],
        ] {
            let mut c = cal.clone();
            c.costs = bad;
            let mut other = calibrated_on_flat_profile();
            let before = other.calibration();
            assert!(other.restore(&c).is_err());
            assert_eq!(other.calibration(), before, "refused: nothing changed");
        }
        // A file written before verify times were kept has none: the profile stays.
        let mut json = serde_json::to_value(&cal).unwrap();
        json.as_object_mut().unwrap().remove("costs");
        let old: BudgetCalibration = serde_json::from_value(json).unwrap();
        let mut other = calibrated_on_flat_profile();
        other.restore(&old).unwrap();
        assert_eq!(other.cost(1), 10.0);
    }

    #[test]
    fn arms_learn_separately() {
        let mut ctl = BudgetController::new(CostCurve::affine(10.0, 0.5, &DEFAULT_SIZES), 64);
        let est = chain_est(&ctl, 0.9);
        for _ in 0..50 {
            ctl.observe(1, &est, &[0, 1, 2, 3]);
            ctl.observe(0, &est, &[]);
        }
        let (b0, r0) = ctl.choose(0, &est, 64);
        let (b1, r1) = ctl.choose(1, &est, 64);
        assert_eq!(b0, 1);
        assert!(b1 > 1 && r1 > r0, "{b1} {r1} {r0}");
    }
}
