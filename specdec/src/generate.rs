//! The decode loop: draft, cut the tree at the budget, verify in one forward,
//! accept the greedy path, commit its KV, stop at the first end-of-generation.

use crate::accept_model::{AcceptCounts, AcceptModel};
use crate::budget::{
    BudgetCalibration, BudgetController, CostCurve, Predictions, DEFAULT_SIZES, MAX_SIZES,
};
use crate::drafter::{make_drafter_windowed, Drafter, Feedback, Mode};
use crate::metrics::{Metrics, StopReason};
use crate::sam::SuffixAutomaton;
use crate::sampling::{argmax, Sampling};
use crate::target::{PrefillOut, Target};
use crate::tree::{DraftTree, FlatTree, ARMS, ARM_ALL, ARM_BASE};
use crate::SpecError;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct GenConfig {
    /// Upper bound of the verify batch (rows); the controller picks up to this.
    /// 16 by default: on replays of captured runs at three measured CPU curves
    /// (cost(16) / cost(1) = 3.3-3.4), steps the controller sent to 32 or 64 rows
    /// accepted about a third of what the calibrated trees promised (the steps that
    /// look best are those whose estimates are most inflated), and capping at 16 was
    /// faster on every category; raise it for a flatter curve (accelerators).
    pub max_budget: usize,
    /// Deepest draft (tokens after the root).
    pub max_depth: usize,
    /// Candidate trie size per step (larger than any budget so that every budget
    /// can be evaluated counterfactually).
    pub trie_nodes: usize,
    /// Use this budget every step instead of the controller (tests, ablations).
    pub fixed_budget: Option<usize>,
    /// Verify-cost curve; profiled through the target on first use when None.
    pub cost_curve: Option<CostCurve>,
    /// Without a cost curve, verify this many rows per step instead of profiling one
    /// before the first token (profiling costs seconds on a large model); the caller
    /// profiles later, off the latency path, with [`Generator::profile_curve`].
    /// `None`: profile on first use.
    pub provisional_budget: Option<usize>,
    pub profile_reps: usize,
    /// Rank draft nodes by acceptance learned online per node feature (else by the
    /// drafters' heuristic priors only).
    pub learned_ranking: bool,
    /// Also consider the base arm (raw-text sources only) each step and verify it
    /// when it promises more (else always the tree of every source).
    pub arm_choice: bool,
    /// Calibrate only the last this many prompt positions (`usize::MAX`: all).
    pub calib_window: usize,
    /// Choose budgets on the cost curve as profiled, not on the verify times measured
    /// while generating (ablations).
    pub fixed_costs: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            max_budget: 16,
            max_depth: 32,
            trie_nodes: 256,
            fixed_budget: None,
            cost_curve: None,
            provisional_budget: None,
            profile_reps: 3,
            learned_ranking: true,
            arm_choice: true,
            calib_window: usize::MAX,
            fixed_costs: false,
        }
    }
}

struct PendingEval {
    tree: DraftTree,
    /// Index in the context of the first token after the tree's root.
    start: usize,
    /// Each arm's own estimate of accepted drafts at every candidate budget.
    est: Predictions,
    age: u32,
}

/// Reusable generator: one drafter, the budget controller (whose acceptance
/// estimates carry over between generations) and preallocated buffers.
pub struct Generator {
    mode: Mode,
    cfg: GenConfig,
    drafter: Box<dyn Drafter + Send>,
    controller: Option<BudgetController>,
    /// Learned acceptance of draft nodes, carried over between generations.
    accept_model: AcceptModel,
    tree: DraftTree,
    pool: Vec<DraftTree>,
    evals: VecDeque<PendingEval>,
    flat: FlatTree,
    argmax: Vec<u32>,
    /// Verified rows' logits (sampled decoding only).
    logits: Vec<f32>,
    sample_scratch: Vec<(f64, u32)>,
    path: Vec<usize>,
    emitted: Vec<u32>,
    ranks: Vec<u32>,
    ctx: Vec<u32>,
    pre: PrefillOut,
}

const MAX_PENDING_EVALS: usize = 8;

/// [`Generator::learned`]: the state a new process would otherwise rebuild from
/// scratch over its first steps (the output never depends on it, only the speed).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Learned {
    pub budget: Option<BudgetCalibration>,
    pub accept: AcceptCounts,
}

impl Generator {
    pub fn new(mode: Mode, db: Option<Arc<SuffixAutomaton>>, cfg: GenConfig) -> Self {
        let drafter = make_drafter_windowed(mode, db, cfg.calib_window);
        Self::with_drafter(mode, drafter, cfg)
    }

    pub fn with_drafter(mode: Mode, drafter: Box<dyn Drafter + Send>, cfg: GenConfig) -> Self {
        let controller = cfg
            .cost_curve
            .clone()
            .map(|c| BudgetController::new(c, cfg.max_budget).with_fixed_costs(cfg.fixed_costs));
        let tree = DraftTree::new(cfg.trie_nodes, cfg.max_depth);
        Generator {
            mode,
            drafter,
            controller,
            accept_model: AcceptModel::default(),
            pool: Vec::new(),
            evals: VecDeque::with_capacity(MAX_PENDING_EVALS + 1),
            flat: FlatTree::default(),
            argmax: Vec::new(),
            logits: Vec::new(),
            sample_scratch: Vec::new(),
            path: Vec::new(),
            emitted: Vec::new(),
            ranks: Vec::new(),
            ctx: Vec::new(),
            pre: PrefillOut::default(),
            tree,
            cfg,
        }
    }

    /// Swap the token database (e.g. after a finished interaction was added);
    /// the budget controller keeps what it learned.
    pub fn set_database(&mut self, db: Option<Arc<SuffixAutomaton>>) {
        self.drafter = make_drafter_windowed(self.mode, db, self.cfg.calib_window);
    }

    /// Replace the drafter (e.g. one with a custom configuration, rebuilt over a
    /// grown database); the budget controller and acceptance model keep what they learned.
    pub fn set_drafter(&mut self, drafter: Box<dyn Drafter + Send>) {
        self.drafter = drafter;
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// What this generator has learned about its drafts (budget calibration, node
    /// acceptance), for a later process to start from ([`Self::restore_learned`]).
    pub fn learned(&self) -> Learned {
        Learned {
            budget: self.controller.as_ref().map(BudgetController::calibration),
            accept: self.accept_model.counts(),
        }
    }

    /// Starts from what an earlier generator learned. Checked whole before anything
    /// changes: an error leaves this generator as it was. The budget part applies only
    /// when both have a controller (a cost curve).
    pub fn restore_learned(&mut self, l: &Learned) -> Result<(), String> {
        let mut accept = self.accept_model.clone();
        accept.restore(&l.accept)?;
        let mut controller = self.controller.clone();
        if let (Some(c), Some(b)) = (controller.as_mut(), l.budget.as_ref()) {
            c.restore(b)?;
        }
        self.accept_model = accept;
        self.controller = controller;
        Ok(())
    }

    pub fn cost_curve(&self) -> Option<&CostCurve> {
        self.controller.as_ref().map(|c| c.curve())
    }

    /// Profiles the verify-cost curve through `target` (chains after `pending`, nothing
    /// committed) and starts the budget controller on it, unless it already has a curve.
    /// Returns the milliseconds spent (0 if there was a curve).
    pub fn profile_curve<T: Target + ?Sized>(
        &mut self,
        target: &mut T,
        pending: u32,
    ) -> Result<f64, SpecError> {
        if self.controller.is_some() {
            return Ok(0.0);
        }
        let t = Instant::now();
        let curve = CostCurve::profile(target, pending, &DEFAULT_SIZES, self.cfg.profile_reps)?;
        self.controller = Some(
            BudgetController::new(curve, self.cfg.max_budget)
                .with_fixed_costs(self.cfg.fixed_costs),
        );
        Ok(ms(t))
    }

    /// The verify cost the controller chooses on per candidate budget (measured while
    /// generating, else profiled).
    pub fn live_costs(&self) -> Vec<(usize, f64)> {
        self.controller
            .as_ref()
            .map(BudgetController::live_costs)
            .unwrap_or_default()
    }

    /// Accepted per estimated draft token at each candidate budget (tree of every
    /// source), as the controller has calibrated it so far.
    pub fn calibration_ratios(&self) -> Vec<(usize, f64)> {
        self.controller
            .as_ref()
            .map(|c| c.ratios(ARM_ALL))
            .unwrap_or_default()
    }

    /// Generate greedily after `prompt` (which is prefilled after whatever the
    /// target has committed). Returns the tokens (without the end-of-generation
    /// token) and the run's metrics. `on_token` sees each token as it is decided.
    pub fn generate<T: Target + ?Sized>(
        &mut self,
        target: &mut T,
        prompt: &[u32],
        max_tokens: usize,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<(Vec<u32>, Metrics), SpecError> {
        self.generate_until(target, prompt, max_tokens, on_token, &|| false)
    }

    /// [`Generator::generate`] that also stops (with [`StopReason::Stopped`]) before
    /// the next step once `should_stop` returns true: cancellation, a closed stream.
    pub fn generate_until<T: Target + ?Sized>(
        &mut self,
        target: &mut T,
        prompt: &[u32],
        max_tokens: usize,
        on_token: &mut dyn FnMut(u32),
        should_stop: &dyn Fn() -> bool,
    ) -> Result<(Vec<u32>, Metrics), SpecError> {
        self.generate_sampled(
            target,
            prompt,
            max_tokens,
            &Sampling::GREEDY,
            on_token,
            should_stop,
        )
    }

    /// [`Generator::generate_until`] choosing tokens by `sampling` (see
    /// [`crate::sampling`]): the output equals plain sampled decoding with the same
    /// sampling, token for token, whatever was drafted. Greedy sampling is greedy
    /// decoding.
    pub fn generate_sampled<T: Target + ?Sized>(
        &mut self,
        target: &mut T,
        prompt: &[u32],
        max_tokens: usize,
        sampling: &Sampling,
        on_token: &mut dyn FnMut(u32),
        should_stop: &dyn Fn() -> bool,
    ) -> Result<(Vec<u32>, Metrics), SpecError> {
        let sampled = !sampling.is_greedy();
        let mut m = Metrics {
            runs: 1,
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let mut out = Vec::with_capacity(max_tokens);
        if prompt.is_empty() {
            return Err(SpecError::Config("empty prompt".into()));
        }
        let t = Instant::now();
        let topk = self.drafter.prefill_topk();
        // Top-k rows cost a full-vocabulary logit row each: when the drafter wants
        // them only for a window at the end, the target computes just those.
        let from = prompt.len().saturating_sub(self.drafter.prefill_window());
        target.prefill_topk_from(prompt, topk, from, &mut self.pre)?;
        m.prefill_ms = ms(t);
        if self.controller.is_none() && self.cfg.provisional_budget.is_none() {
            m.profile_ms = self.profile_curve(target, self.pre.next)?;
        }
        let saturation = self
            .controller
            .as_ref()
            .map_or(1, |c| c.curve().saturation());
        m.saturation = saturation;
        let t = Instant::now();
        self.drafter.begin(prompt, &self.pre);
        m.draft_ms += ms(t);
        self.ctx.clear();
        self.ctx.extend_from_slice(prompt);
        for e in self.evals.drain(..) {
            self.pool.push(e.tree);
        }

        let first = if sampled {
            if self.pre.logits.is_empty() {
                return Err(SpecError::Config(
                    "the target gave no logits after the prompt, so it cannot sample".into(),
                ));
            }
            sampling.pick(&self.pre.logits, 0, &mut self.sample_scratch)
        } else {
            self.pre.next
        };
        if target.is_eog(first) {
            m.stop = StopReason::EndOfGeneration;
            return Ok((out, m));
        }
        if max_tokens == 0 {
            return Ok((out, m));
        }
        out.push(first);
        on_token(first);
        self.ctx.push(first);
        self.drafter.observe(&[first], None);

        let decode_start = Instant::now();
        let mut step: u64 = 0;
        m.stop = StopReason::MaxTokens;
        while out.len() < max_tokens {
            if should_stop() {
                m.stop = StopReason::Stopped;
                break;
            }
            let room_ctx = target.context_left();
            if room_ctx == 0 {
                m.stop = StopReason::ContextFull;
                break;
            }
            // Draft and cut.
            let t = Instant::now();
            let pending = *self.ctx.last().unwrap_or(&first);
            self.tree.reset(pending);
            self.drafter.draft(&self.ctx, &mut self.tree, step);
            self.tree
                .rank(Some(&self.accept_model).filter(|_| self.cfg.learned_ranking));
            let mut est = [[0.0; MAX_SIZES]; ARMS];
            if let Some(c) = self.controller.as_ref() {
                c.predict(&self.tree, &mut est);
            }
            // Arm and budget: the fixed budget cuts every source; else the arm whose
            // learned acceptance promises the most tokens per verify millisecond (the
            // base arm only when the tree has nodes it excludes).
            let (arm, budget) = match (self.cfg.fixed_budget, self.controller.as_ref()) {
                (Some(b), _) => (ARM_ALL, b),
                (None, None) => (ARM_ALL, self.cfg.provisional_budget.unwrap_or(1)),
                (None, Some(c)) => {
                    let all = c.choose(ARM_ALL, &est[ARM_ALL], self.tree.arm_len(ARM_ALL));
                    let base_len = self.tree.arm_len(ARM_BASE);
                    if self.cfg.arm_choice && base_len < self.tree.arm_len(ARM_ALL) {
                        let base = c.choose(ARM_BASE, &est[ARM_BASE], base_len);
                        if base.1 > all.1 {
                            (ARM_BASE, base.0)
                        } else {
                            (ARM_ALL, all.0)
                        }
                    } else {
                        (ARM_ALL, all.0)
                    }
                }
            };
            let budget = budget.min(target.max_batch()).min(room_ctx).max(1);
            self.tree.flatten_arm(budget, arm, &mut self.flat);
            if arm == ARM_BASE && budget > 1 {
                m.base_arm_steps += 1;
            }
            m.draft_ms += ms(t);

            // Verify.
            let t = Instant::now();
            let rows = self.flat.len();
            if sampled {
                target.verify_logits(&self.flat, &mut self.logits)?;
                if rows == 0 || self.logits.is_empty() || !self.logits.len().is_multiple_of(rows) {
                    return Err(SpecError::Target(format!(
                        "verify returned {} logits for {rows} rows",
                        self.logits.len()
                    )));
                }
                let vocab = self.logits.len() / rows;
                self.argmax.clear();
                self.argmax
                    .extend(self.logits.chunks_exact(vocab).map(argmax));
            } else {
                target.verify(&self.flat, &mut self.argmax)?;
            }
            let verify_ms = ms(t);
            m.verify_ms += verify_ms;
            if let Some(c) = self.controller.as_mut() {
                c.observe_cost(rows, verify_ms);
            }
            if self.argmax.len() != rows {
                return Err(SpecError::Target(format!(
                    "verify returned {} argmax for {} rows",
                    self.argmax.len(),
                    rows
                )));
            }

            // Accept: path rows then the bonus token. Sampled: the row `depth` below
            // the root chooses generated index `out.len() + depth`.
            let bonus = if sampled {
                let vocab = self.logits.len() / rows;
                let (logits, scratch, done) = (&self.logits, &mut self.sample_scratch, out.len());
                self.flat.accept_by(
                    |r, depth| {
                        sampling.pick(&logits[r * vocab..(r + 1) * vocab], done + depth, scratch)
                    },
                    &mut self.path,
                )
            } else {
                self.flat.accept(&self.argmax, &mut self.path)
            };
            self.emitted.clear();
            for &r in &self.path[1..] {
                self.emitted.push(self.flat.tokens[r]);
                m.count_accepted_source(self.flat.sources[r]);
            }
            m.count_step_sources(&self.flat.sources, &self.path);
            self.emitted.push(bonus);
            let mut keep = self.emitted.len();
            let mut stop = None;
            // Pitfall 1: the first end-of-generation among the emitted tokens ends it.
            if let Some(i) = self.emitted.iter().position(|&t| target.is_eog(t)) {
                keep = i;
                stop = Some(StopReason::EndOfGeneration);
            }
            let room = max_tokens - out.len();
            if keep > room {
                keep = room;
                stop = Some(StopReason::MaxTokens);
            }
            // KV holds every forwarded token: the root and the kept accepted rows
            // (the last kept token becomes the next root, like in greedy decoding).
            target.commit(&self.path[..keep.max(1)])?;

            if let Some(c) = self.controller.as_ref() {
                m.modeled_verify_ms += c.curve().cost(rows);
            }
            m.steps += 1;
            m.step_tokens += self.emitted.len();
            m.kept_tokens += keep;
            m.verified_rows += rows;
            m.valid_rows += self.path.len();
            m.wasted_rows += rows - self.path.len();
            m.underutilized_rows += saturation.saturating_sub(rows);
            m.budget_sum += rows;

            for &tok in &self.emitted[..keep] {
                out.push(tok);
                on_token(tok);
            }
            let start = self.ctx.len();
            self.ctx.extend_from_slice(&self.emitted[..keep]);

            let t = Instant::now();
            let fb = Feedback {
                flat: &self.flat,
                argmax: &self.argmax,
                path: &self.path,
                step,
            };
            self.drafter.observe(&self.emitted[..keep], Some(&fb));
            if self.controller.is_some() && self.mode != Mode::None {
                let mut spare = self
                    .pool
                    .pop()
                    .unwrap_or_else(|| DraftTree::new(self.cfg.trie_nodes, self.cfg.max_depth));
                std::mem::swap(&mut spare, &mut self.tree);
                self.evals.push_back(PendingEval {
                    tree: spare,
                    start,
                    est,
                    age: 0,
                });
                self.evaluate_pending(stop.is_some() || out.len() >= max_tokens, &mut m);
            }
            m.draft_ms += ms(t);
            step += 1;
            if let Some(s) = stop {
                m.stop = s;
                break;
            }
        }
        m.decode_ms = ms(decode_start);
        m.tokens = out.len();
        Ok((out, m))
    }

    /// Score past trees against the output that followed them, once decided.
    fn evaluate_pending(&mut self, finish: bool, m: &mut Metrics) {
        let n = self.evals.len();
        for _ in 0..n {
            let Some(mut e) = self.evals.pop_front() else {
                break;
            };
            e.age += 1;
            let future = &self.ctx[e.start.min(self.ctx.len())..];
            let decided = e.tree.path_ranks(future, ARM_ALL, &mut self.ranks);
            if decided || finish || e.age as usize >= MAX_PENDING_EVALS {
                e.tree.learn(future, &mut self.accept_model);
                m.observe_counterfactual(&self.ranks);
                if let Some(c) = self.controller.as_mut() {
                    c.observe(ARM_ALL, &e.est[ARM_ALL], &self.ranks);
                    e.tree.path_ranks(future, ARM_BASE, &mut self.ranks);
                    c.observe(ARM_BASE, &e.est[ARM_BASE], &self.ranks);
                }
                self.pool.push(e.tree);
            } else {
                self.evals.push_back(e);
            }
        }
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// One-shot convenience: generate with `mode`, no token database, the cost curve
/// profiled through the target.
pub fn generate<T: Target + ?Sized>(
    target: &mut T,
    mode: Mode,
    prompt: &[u32],
    max_tokens: usize,
    on_token: &mut dyn FnMut(u32),
) -> Result<(Vec<u32>, Metrics), SpecError> {
    Generator::new(mode, None, GenConfig::default()).generate(target, prompt, max_tokens, on_token)
}
