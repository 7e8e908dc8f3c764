//! Progressive prefill-to-decode switching on the session's own graphs (sd.npu section
//! 4.2, `schedule`).
//!
//! Every block has two forms: G1, its prefill graph of `prefill_chunk` rows, and G2, its
//! decode/verify graphs (`min_verify..=max_verify` rows). When both forms of every block do
//! not fit the residency budget, a prefill starts with only the G1 forms resident and
//! runs a [`ScheduleKind`]'s plan: compute goes chunk by chunk on the calling thread while a
//! loader thread swaps block after block from G1 to G2, so that decoding can start as soon
//! as prefill ends. A chunk computed on G2 runs as `max_verify`-row runs; rows are
//! batch-invariant on every backend (the CPU kernels by construction, QNN through slot
//! attention), so the prompt's logits and KV do not depend on the plan.

use super::{top_k_into, Session};
use crate::attention::BatchMask;
use crate::backend::{Backend, BlockIo, LogitsRows, PAD_TOKEN};
use crate::error::{Result, RuntimeError};
use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::schedule::exec::{execute, execute_ideal, ExecReport, ScheduleExecutor};
use crate::schedule::sim::{EventKind, Unit};
use crate::schedule::warmup::{warmup_profile, WarmupConfig};
use crate::schedule::{Form, Instance, MemoryBudget, Plan, Profile, ScheduleError, ScheduleKind};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// How a session switches its blocks from prefill to decode graphs.
#[derive(Clone, Debug)]
pub struct Switching {
    /// The planner that decides when each block switches.
    pub kind: ScheduleKind,
    /// Bytes the resident graphs may take (G1 and G2 forms of every block).
    pub budget_bytes: u64,
    /// This session's per-block costs ([`Session::profile_forms`], cached by the caller).
    pub profile: Profile,
}

/// What a residency budget must hold ([`Session::residency_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Residency {
    /// One form of every block, the larger of its two: the least that can run.
    pub one_form: u64,
    /// Both forms of every block: a budget this large never switches.
    pub both_forms: u64,
}

impl Residency {
    /// An error naming both figures when `budget_bytes` cannot hold one form per block.
    pub fn check(&self, budget_bytes: u64) -> Result<()> {
        let mb = |b: u64| b.div_ceil(1 << 20);
        if budget_bytes < self.one_form {
            return Err(RuntimeError::Capacity(format!(
                "a residency budget of {} MB cannot hold one form of every block ({} MB \
                 needed; both forms take {} MB)",
                mb(budget_bytes),
                mb(self.one_form),
                mb(self.both_forms)
            )));
        }
        Ok(())
    }
}

/// Which forms are resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Forms {
    /// Every graph (no switching, or both forms fit the budget).
    All,
    /// The prefill graphs only.
    Prefill,
    /// The decode/verify graphs only.
    Decode,
    /// Unknown after a failed switch: the next use puts every block in a known state.
    Unknown,
}

/// What the last prefill's switching did (`Session::switch_report`).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SwitchReport {
    /// The plan that ran: a [`ScheduleKind`] name, `all-resident` when both forms fit the
    /// budget, `decode-graphs` when a short follow-up prompt ran on the resident G2 forms.
    pub schedule: String,
    /// Prefill compute, from its start to the last chunk's end.
    pub prefill_ms: f64,
    /// Loader time spent switching (unloading G1 and loading G2 forms), hidden or not.
    pub switch_ms: f64,
    /// The part of the switching the prompt waited for: compute stalled on a block's
    /// switch, plus switching still running when prefill ended.
    pub stall_ms: f64,
    /// Blocks switched.
    pub switches: usize,
    /// (block, chunk) steps computed on the decode graphs after their block switched.
    pub decode_graph_steps: usize,
    /// Putting the prefill graphs back before this prefill (after a previous answer).
    pub reset_ms: f64,
}

/// The switching state a session carries.
pub(super) struct SwitchState {
    pub config: Switching,
    /// Both forms of every block fit the budget: nothing ever switches.
    pub all_fit: bool,
    pub report: Option<SwitchReport>,
}

fn sched_err(e: ScheduleError) -> RuntimeError {
    RuntimeError::Backend(format!("progressive prefill: {e}"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One block's graphs as the scheduler sees them.
struct BlockForms<'s, G> {
    g1: &'s mut G,
    /// `(rows, graph)`, ascending.
    g2: Vec<(usize, &'s mut G)>,
}

/// What a prefill's compute steps read and write.
struct Compute<'s> {
    kv: &'s mut KvCache,
    mask: &'s mut BatchMask,
    tokens: &'s mut [u32],
    hidden: &'s mut [f32],
    logits: &'s mut [f32],
    topk: &'s mut [Vec<(u32, f32)>],
    /// Committed tokens before the prompt (a warm-up rolls back to here).
    base: usize,
    /// Logits row of the last prompt position once the last chunk ran.
    last_row: usize,
}

/// The session's graphs and buffers behind the [`ScheduleExecutor`] interface: compute
/// on the calling thread, loads and unloads on the loader thread (different blocks).
struct SessionForms<'s, B: Backend> {
    backend: &'s B,
    model: &'s Model,
    prompt: &'s [u32],
    chunk: usize,
    /// G2 run size: the largest decode/verify graph.
    run: usize,
    topk: usize,
    /// Run a real decode step in `decode` (warm-up); a prefill leaves decoding to its caller.
    time_decode: bool,
    blocks: Vec<Mutex<BlockForms<'s, B::Graph>>>,
    state: Mutex<Compute<'s>>,
}

impl<B: Backend> SessionForms<'_, B> {
    fn load_form(&self, forms: &mut BlockForms<'_, B::Graph>, form: Form) -> Result<()> {
        let graphs: Vec<&mut B::Graph> = match form {
            Form::G1 => vec![&mut *forms.g1],
            Form::G2 => forms.g2.iter_mut().map(|(_, g)| &mut **g).collect(),
        };
        for g in graphs {
            if !self.backend.is_loaded(g) {
                self.backend.load(g)?;
            }
        }
        Ok(())
    }

    fn unload_form(&self, forms: &mut BlockForms<'_, B::Graph>, form: Form) {
        match form {
            Form::G1 => self.backend.unload(forms.g1),
            Form::G2 => forms
                .g2
                .iter_mut()
                .for_each(|(_, g)| self.backend.unload(g)),
        }
    }

    /// Runs `block` on rows `off..off + rows` of the staged chunk with `graph` (of
    /// `shape` rows), after `n_past` committed tokens.
    fn run(
        &self,
        st: &mut Compute<'_>,
        graph: &mut B::Graph,
        (off, rows, shape): (usize, usize, usize),
        n_past: usize,
        last_block: bool,
        chunk_start: usize,
    ) -> Result<()> {
        let e = self.model.config().n_embd;
        let v = self.model.vocab_size();
        st.mask.set_causal(rows)?;
        let logits_rows = if self.topk > 0 {
            LogitsRows::All
        } else {
            LogitsRows::Last
        };
        self.backend.execute(
            graph,
            BlockIo {
                tokens: &st.tokens[off..off + shape],
                hidden: &mut st.hidden[off * e..(off + shape) * e],
                kv: st.kv,
                mask: st.mask,
                n_past,
                logits: st.logits,
                logits_rows,
            },
        )?;
        if last_block {
            if self.topk > 0 {
                let first = chunk_start + off;
                for (i, out) in st.topk[first..first + rows].iter_mut().enumerate() {
                    top_k_into(&st.logits[i * v..(i + 1) * v], self.topk, out);
                }
                st.last_row = rows - 1;
            } else {
                st.last_row = 0;
            }
        }
        Ok(())
    }

    fn compute_step(&self, block: usize, chunk: usize, form: Form) -> Result<()> {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let n_blocks = self.blocks.len();
        let start = chunk * self.chunk;
        if start >= self.prompt.len() || block >= n_blocks {
            return Err(RuntimeError::InvalidInput(format!(
                "step (block {block}, chunk {chunk}) out of range"
            )));
        }
        let r = (self.prompt.len() - start).min(self.chunk);
        if block == 0 {
            st.tokens[..r].copy_from_slice(&self.prompt[start..start + r]);
            st.tokens[r..self.chunk].fill(PAD_TOKEN);
        }
        let n_past = st.kv.n_past();
        let last = block + 1 == n_blocks;
        let mut forms = lock(&self.blocks[block]);
        match form {
            Form::G1 => {
                let g = &mut *forms.g1;
                self.run(st, g, (0, r, self.chunk), n_past, last, start)?;
            }
            Form::G2 => {
                let mut off = 0;
                while off < r {
                    let rows = (r - off).min(self.run);
                    let (shape, g) = forms
                        .g2
                        .iter_mut()
                        .find(|(s, _)| *s >= rows)
                        .ok_or_else(|| RuntimeError::Backend("no decode graph".into()))?;
                    let shape = *shape;
                    self.run(st, g, (off, rows, shape), n_past + off, last, start)?;
                    off += rows;
                }
            }
        }
        if last {
            st.kv.advance(r)?;
        }
        Ok(())
    }
}

impl<B: Backend> ScheduleExecutor for SessionForms<'_, B> {
    fn begin_prefill(&self) -> crate::schedule::Result<()> {
        let mut st = lock(&self.state);
        let base = st.base;
        st.kv.truncate(base).map_err(rt)
    }

    fn compute(&self, block: usize, chunk: usize, form: Form) -> crate::schedule::Result<()> {
        self.compute_step(block, chunk, form).map_err(rt)
    }

    fn load(&self, block: usize, form: Form) -> crate::schedule::Result<()> {
        let mut forms = lock(&self.blocks[block]);
        self.load_form(&mut forms, form).map_err(rt)
    }

    fn unload(&self, block: usize, form: Form) -> crate::schedule::Result<()> {
        let mut forms = lock(&self.blocks[block]);
        self.unload_form(&mut forms, form);
        Ok(())
    }

    fn decode(&self) -> crate::schedule::Result<()> {
        if !self.time_decode {
            return Ok(());
        }
        // One token through every block on the smallest G2 graph; its KV row stays a
        // scratch slot (not committed) and its logits are not kept.
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let v = self.model.vocab_size();
        let row = st.last_row * v;
        let kept = st.logits[row..row + v].to_vec();
        st.tokens[0] = self.prompt[0];
        let n_past = st.kv.n_past();
        let n_blocks = self.blocks.len();
        for (b, forms) in self.blocks.iter().enumerate() {
            let mut forms = lock(forms);
            let (shape, g) = forms
                .g2
                .first_mut()
                .ok_or_else(|| rt_msg("no decode graph"))?;
            let shape = *shape;
            st.tokens[1..shape].fill(PAD_TOKEN);
            self.run(st, g, (0, 1, shape), n_past, b + 1 == n_blocks, 0)
                .map_err(rt)?;
        }
        st.logits[..v].copy_from_slice(&kept);
        st.last_row = 0;
        Ok(())
    }

    fn form_bytes(&self, block: usize, form: Form) -> u64 {
        let forms = lock(&self.blocks[block]);
        match form {
            Form::G1 => self.backend.resident_bytes(forms.g1),
            Form::G2 => forms
                .g2
                .iter()
                .map(|(_, g)| self.backend.resident_bytes(g))
                .sum(),
        }
    }
}

fn rt(e: RuntimeError) -> ScheduleError {
    ScheduleError::Executor(e.to_string())
}

fn rt_msg(m: &str) -> ScheduleError {
    ScheduleError::Executor(m.into())
}

impl<B: Backend> Session<B> {
    /// Whether the prefill and decode graphs are distinct forms (the prefill chunk is not
    /// one of the decode/verify sizes), so there is something to switch.
    pub fn has_two_forms(&self) -> bool {
        self.shapes
            .iter()
            .any(|s| s.tokens == self.opts.prefill_chunk && s.tokens > self.opts.max_verify)
    }

    /// Resident bytes of each block's `(G1, G2)` forms.
    pub fn form_bytes(&self) -> Vec<(u64, u64)> {
        let chunk = self.opts.prefill_chunk;
        (0..self.n_blocks())
            .map(|b| {
                let mut g1 = 0;
                let mut g2 = 0;
                for s in &self.shapes {
                    let bytes = self.backend.resident_bytes(&s.graphs[b]);
                    if s.tokens == chunk {
                        g1 += bytes;
                    } else {
                        g2 += bytes;
                    }
                }
                (g1, g2)
            })
            .collect()
    }

    /// Resident bytes of one form of every block (the larger of the two: the least a
    /// switching budget must hold) and of both forms of every block (a budget that holds
    /// them never switches).
    pub fn residency_bytes(&self) -> Residency {
        let bytes = self.form_bytes();
        Residency {
            one_form: bytes.iter().map(|(a, b)| *a.max(b)).sum(),
            both_forms: bytes.iter().map(|(a, b)| a + b).sum(),
        }
    }

    /// Layer range of each block, e.g. "0-14".
    pub fn block_labels(&self) -> Vec<String> {
        self.shapes.first().map_or_else(Vec::new, |s| {
            s.graphs
                .iter()
                .map(|g| {
                    let l = &self.backend.block(g).layers;
                    format!("{}-{}", l.start, l.end - 1)
                })
                .collect()
        })
    }

    fn require_two_forms(&self) -> Result<()> {
        if !self.has_two_forms() {
            return Err(RuntimeError::InvalidInput(format!(
                "prefill chunk {} is one of the decode graph sizes (<= {}): there is no \
                 second form to switch to",
                self.opts.prefill_chunk, self.opts.max_verify
            )));
        }
        if !self.opts.prefill_chunk.is_multiple_of(self.opts.max_verify) {
            return Err(RuntimeError::InvalidInput(format!(
                "progressive switching needs the prefill chunk {} to be a multiple of the \
                 largest decode graph {}",
                self.opts.prefill_chunk, self.opts.max_verify
            )));
        }
        Ok(())
    }

    /// Borrows the graphs and buffers as a [`ScheduleExecutor`] for `prompt`.
    fn forms_view<'s>(
        &'s mut self,
        prompt: &'s [u32],
        topk: usize,
        time_decode: bool,
    ) -> SessionForms<'s, B> {
        let chunk = self.opts.prefill_chunk;
        let run = self.opts.max_verify;
        let n_blocks = self.n_blocks();
        let mut g1: Vec<Option<&mut B::Graph>> = (0..n_blocks).map(|_| None).collect();
        let mut g2: Vec<Vec<(usize, &mut B::Graph)>> = (0..n_blocks).map(|_| Vec::new()).collect();
        for s in self.shapes.iter_mut() {
            let t = s.tokens;
            for (b, g) in s.graphs.iter_mut().enumerate() {
                if t == chunk {
                    g1[b] = Some(g);
                } else {
                    g2[b].push((t, g));
                }
            }
        }
        let blocks = g1
            .into_iter()
            .zip(g2)
            .map(|(g1, mut g2)| {
                g2.sort_by_key(|(t, _)| *t);
                Mutex::new(BlockForms {
                    g1: g1.expect("require_two_forms: every block has a prefill graph"),
                    g2,
                })
            })
            .collect();
        let base = self.kv.n_past();
        SessionForms {
            backend: &self.backend,
            model: &self.model,
            prompt,
            chunk,
            run,
            topk,
            time_decode,
            blocks,
            state: Mutex::new(Compute {
                kv: &mut self.kv,
                mask: &mut self.mask,
                tokens: &mut self.tokens,
                hidden: &mut self.hidden,
                logits: &mut self.logits,
                topk: &mut self.topk,
                base,
                last_row: 0,
            }),
        }
    }

    /// Loads and unloads graphs so that `target` forms are resident.
    pub(super) fn set_forms(&mut self, target: Forms) -> Result<()> {
        let chunk = self.opts.prefill_chunk;
        let Session {
            backend, shapes, ..
        } = self;
        let result = (|| {
            for s in shapes.iter_mut() {
                let want = match target {
                    Forms::All => true,
                    Forms::Prefill => s.tokens == chunk,
                    Forms::Decode => s.tokens != chunk,
                    Forms::Unknown => continue,
                };
                for g in s.graphs.iter_mut() {
                    match (want, backend.is_loaded(g)) {
                        (true, false) => backend.load(g)?,
                        (false, true) => backend.unload(g),
                        _ => {}
                    }
                }
            }
            Ok(())
        })();
        self.forms = if result.is_ok() {
            target
        } else {
            Forms::Unknown
        };
        result
    }

    /// Measures this session's per-block costs by warm-up (`reps` repetitions of one
    /// chunk on each form, a switch of every block, one decode step; medians): the
    /// profile [`Session::enable_switching`] plans with. Leaves the context as it was.
    pub fn profile_forms(&mut self, model: &str, machine: &str, reps: usize) -> Result<Profile> {
        self.require_two_forms()?;
        let chunk = self.opts.prefill_chunk;
        self.check_room(chunk + 1)?;
        let before = self.forms;
        let n_past = self.kv.n_past();
        let vocab = self.model.vocab_size() as u32;
        // Any tokens do: costs do not depend on the values.
        let prompt: Vec<u32> = (0..chunk as u32)
            .map(|i| (i.wrapping_mul(7919) + 13) % vocab)
            .collect();
        self.set_forms(Forms::Prefill)?;
        let cfg = WarmupConfig {
            model: model.into(),
            backend: self.backend.name().into(),
            machine: machine.into(),
            chunk_tokens: chunk,
            g2_tokens: self.opts.max_verify,
            layers: self.block_labels(),
            reps,
            switch_needed: true,
        };
        let profile = {
            let view = self.forms_view(&prompt, 0, true);
            warmup_profile(&view, &cfg).map_err(sched_err)
        };
        self.forms = Forms::Unknown;
        self.kv.truncate(n_past)?;
        self.last_batch = 0;
        self.set_forms(if before == Forms::Unknown {
            Forms::All
        } else {
            before
        })?;
        profile
    }

    /// Whether `p` describes this session's layout: its blocks, prefill chunk and decode
    /// graph rows (a cached profile of another layout must be measured again).
    pub fn profile_fits(&self, p: &Profile) -> bool {
        p.n_blocks() == self.n_blocks()
            && p.chunk_tokens == self.opts.prefill_chunk
            && p.g2_tokens == self.opts.max_verify
    }

    /// Turns progressive switching on (`None`: off, every graph resident). With a budget
    /// that holds both forms of every block nothing ever switches; one that holds less than
    /// one form of each is an error.
    pub fn enable_switching(&mut self, switching: Option<Switching>) -> Result<()> {
        let Some(config) = switching else {
            self.switching = None;
            return self.set_forms(Forms::All);
        };
        self.require_two_forms()?;
        let p = &config.profile;
        let labels = self.block_labels();
        if !self.profile_fits(p) {
            return Err(RuntimeError::InvalidInput(format!(
                "profile of {} blocks x {} tokens (G2 {}) does not describe this session's {} \
                 blocks x {} tokens (G2 {})",
                p.n_blocks(),
                p.chunk_tokens,
                p.g2_tokens,
                labels.len(),
                self.opts.prefill_chunk,
                self.opts.max_verify
            )));
        }
        let need = self.residency_bytes();
        need.check(config.budget_bytes)?;
        let all_fit = config.budget_bytes >= need.both_forms;
        self.switching = Some(SwitchState {
            config,
            all_fit,
            report: None,
        });
        self.set_forms(if all_fit { Forms::All } else { Forms::Prefill })
    }

    /// What switching did during the last prefill (`None` without switching).
    pub fn switch_report(&self) -> Option<&SwitchReport> {
        self.switching.as_ref().and_then(|s| s.report.as_ref())
    }

    /// Whether decode/verify graphs are resident (puts them there if not).
    pub(super) fn ensure_decode_forms(&mut self) -> Result<()> {
        match self.forms {
            Forms::All | Forms::Decode => Ok(()),
            Forms::Prefill | Forms::Unknown if self.switching.is_none() => {
                self.set_forms(Forms::All)
            }
            Forms::Prefill | Forms::Unknown => self.set_forms(Forms::Decode),
        }
    }

    /// The prefill of [`Session::prefill`] under switching; returns the logits row of the
    /// last prompt position (top-k rows as `prefill` fills them).
    pub(super) fn prefill_switching(&mut self, tokens: &[u32], topk: usize) -> Result<usize> {
        if self.switching.as_ref().is_some_and(|s| s.all_fit) {
            let t0 = Instant::now();
            let last = self.prefill_plain(tokens, topk)?;
            if let Some(s) = &mut self.switching {
                s.report = Some(SwitchReport {
                    schedule: "all-resident".into(),
                    prefill_ms: t0.elapsed().as_secs_f64() * 1e3,
                    ..SwitchReport::default()
                });
            }
            return Ok(last);
        }
        let topk = self.begin_prefill(tokens, topk)?;
        let mut state = self.switching.take().expect("switching is on");
        let result = self.prefill_scheduled(tokens, topk, &mut state);
        self.switching = Some(state);
        if result.is_err() {
            // Whatever ran is not a committed prefix the caller knows about.
            self.forms = Forms::Unknown;
        }
        if topk == 0 {
            self.topk.clear();
        }
        result
    }

    fn prefill_scheduled(
        &mut self,
        tokens: &[u32],
        topk: usize,
        state: &mut SwitchState,
    ) -> Result<usize> {
        let n_blocks = self.n_blocks();
        let n_chunks = tokens.len().div_ceil(self.opts.prefill_chunk);
        let base = self.kv.n_past();
        let t0 = Instant::now();
        let mut report = SwitchReport::default();
        if self.forms == Forms::Decode && tokens.len() < self.opts.prefill_chunk {
            report.schedule = "decode-graphs".into();
        } else if self.forms != Forms::Prefill {
            let t = Instant::now();
            self.set_forms(Forms::Prefill)?;
            report.reset_ms = t.elapsed().as_secs_f64() * 1e3;
        }
        let fail = |s: &mut Self, e: RuntimeError| {
            let _ = s.kv.truncate(base);
            e
        };
        if report.schedule == "decode-graphs" {
            // A short follow-up: its chunk runs on the resident G2 forms, nothing switches.
            let view = self.forms_view(tokens, topk, false);
            let r = (0..n_chunks * n_blocks)
                .try_for_each(|s| view.compute_step(s % n_blocks, s / n_blocks, Form::G2));
            let last = lock(&view.state).last_row;
            drop(view);
            r.map_err(|e| fail(self, e))?;
            report.decode_graph_steps = n_chunks * n_blocks;
            report.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
            state.report = Some(report);
            return Ok(last);
        }
        let p = &state.config.profile;
        let inst = Instance::from_profile(p, tokens.len(), MemoryBudget::OneFormPerBlock)
            .map_err(sched_err)?;
        let plan = state.config.kind.plan(&inst).map_err(sched_err)?;
        let view = self.forms_view(tokens, topk, false);
        let exec = execute(&view, n_blocks, n_chunks, &plan, false);
        let last = lock(&view.state).last_row;
        drop(view);
        let exec = exec.map_err(|e| fail(self, sched_err(e)))?;
        self.forms = Forms::Decode;
        let ms = |ns: u64| ns as f64 / 1e6;
        let (mut busy, mut loader, mut switches) = (0u64, 0u64, 0usize);
        for ev in &exec.events {
            let d = ev.end.saturating_sub(ev.start);
            match (ev.unit, &ev.kind) {
                (Unit::Compute, _) => busy += d,
                (Unit::Loader, EventKind::Load { .. }) => {
                    loader += d;
                    switches += 1;
                }
                (Unit::Loader, _) => loader += d,
            }
        }
        report.schedule = state.config.kind.name().into();
        report.prefill_ms = ms(exec.prefill_end);
        report.switch_ms = ms(loader);
        report.stall_ms = ms(exec.prefill_end.saturating_sub(busy)
            + exec.switch_end.saturating_sub(exec.prefill_end));
        report.switches = switches;
        report.decode_graph_steps = exec.forms.iter().filter(|&&f| f == Form::G2).count();
        state.report = Some(report);
        Ok(last)
    }

    /// Prefills `tokens` from an empty context under `plan`, starting with the prefill
    /// graphs resident (`double_resident`: each block's decode graphs load beside them,
    /// which are freed after the first decode step), then times one decode step, as
    /// `schedule::exec::execute` defines. Returns the timeline and the last prompt
    /// position's logits. For `rag-bench prefill`, which compares plans.
    pub fn prefill_planned(
        &mut self,
        tokens: &[u32],
        plan: &Plan,
        double_resident: bool,
    ) -> Result<(ExecReport, Vec<f32>)> {
        self.require_two_forms()?;
        self.truncate(0)?;
        self.set_forms(Forms::Prefill)?;
        self.begin_prefill(tokens, 0)?;
        let (n, c) = self.plan_shape(tokens);
        let view = self.forms_view(tokens, 0, true);
        let report = execute(&view, n, c, plan, double_resident);
        drop(view);
        self.finish_bench_prefill(report, Forms::Decode)
    }

    /// [`Session::prefill_planned`]'s ideal: every form resident, every step on the
    /// prefill graphs, nothing switches.
    pub fn prefill_ideal(&mut self, tokens: &[u32]) -> Result<(ExecReport, Vec<f32>)> {
        self.require_two_forms()?;
        self.truncate(0)?;
        self.set_forms(Forms::All)?;
        self.begin_prefill(tokens, 0)?;
        let (n, c) = self.plan_shape(tokens);
        let view = self.forms_view(tokens, 0, true);
        let report = execute_ideal(&view, n, c);
        drop(view);
        self.finish_bench_prefill(report, Forms::All)
    }

    /// (blocks, chunks) of a prefill of `tokens`.
    fn plan_shape(&self, tokens: &[u32]) -> (usize, usize) {
        (
            self.n_blocks(),
            tokens.len().div_ceil(self.opts.prefill_chunk),
        )
    }

    fn finish_bench_prefill(
        &mut self,
        report: crate::schedule::Result<ExecReport>,
        forms: Forms,
    ) -> Result<(ExecReport, Vec<f32>)> {
        self.topk.clear();
        match report {
            Ok(r) => {
                self.forms = forms;
                Ok((r, self.logits[..self.model.vocab_size()].to_vec()))
            }
            Err(e) => {
                self.forms = Forms::Unknown;
                self.kv.truncate(0)?;
                Err(sched_err(e))
            }
        }
    }
}
