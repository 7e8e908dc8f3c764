//! The generation engine a question runs on: the runtime's one block driver
//! (`npu_runtime::session::Session`) on the CPU backend or on the QNN HTP backend, behind
//! one object-safe trait that the `Assistant` and the CLI hold. Speculative decoding
//! (`specdec`) verifies its token trees on whichever backend the engine runs.

use anyhow::{Context, Result};
use npu_qnn::{BinaryCache, QnnBackend};
use npu_runtime::backend::Backend;
use npu_runtime::schedule::profile::{cache_dir, cache_path};
use npu_runtime::schedule::profile_machine;
use npu_runtime::schedule::{Profile, ScheduleKind};
use npu_runtime::session::{
    self, BranchOutput, GenerationStats, KvPrecision, Model, Session, SessionOptions, SwitchReport,
    Switching,
};
use specdec::session_target::{generate_sampled_plain, generate_samples};
use specdec::{Sampling, Target};
use std::path::PathBuf;
use std::sync::Arc;

/// Where the block graphs run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// CPU kernels (run-time SIMD dispatch).
    #[default]
    Cpu,
    /// Qualcomm's QNN HTP (the NPU; on x86-64 its emulator, slow).
    Qnn(QnnShapes),
}

impl BackendChoice {
    /// `cpu` or `qnn` (with the default QNN shapes).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(BackendChoice::Cpu),
            "qnn" => Ok(BackendChoice::Qnn(QnnShapes::default())),
            _ => anyhow::bail!("unknown backend {s:?} (cpu or qnn)"),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            BackendChoice::Cpu => "cpu",
            BackendChoice::Qnn(_) => "qnn",
        }
    }
}

/// The static graph shapes of a QNN engine (docs/qnn.md): prefill graphs of
/// `prefill_rows` rows, decode/verify graphs of `verify_rows` rows, the model cut into
/// `blocks` graphs of consecutive layers. A row's result does not depend on which graph
/// computes it, so the two sizes are free to differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QnnShapes {
    pub prefill_rows: usize,
    pub verify_rows: usize,
    pub blocks: usize,
    /// Where compiled context binaries are kept between runs (`None`: compile every time).
    pub cache_dir: Option<PathBuf>,
}

/// Decode/verify graph rows on QNN: graphs of fewer rows compile to less precise HTP code
/// (docs/qnn.md), and 16 holds the drafts the budget controller picks on a flat curve.
pub const QNN_VERIFY_ROWS: usize = 16;
/// Prefill graph rows on QNN: the size with the shortest measured time to first token
/// among 16, 32, 64 and 128 (emulator, SmolLM2, a 148-token prompt: a graph costs its
/// full rows and the per-row cost did not fall with size, so padding decides;
/// `benchmarks/runs/2026-11-28-qnn-prefill-shapes.md`). On a phone, re-measure.
pub const QNN_PREFILL_ROWS: usize = 32;
/// Residency budget of the QNN graphs when none is given: a phone NPU's share of memory
/// for one model. Both forms of every block of the 1.5B default model (fp16 weights in
/// each, ~6 GB) do not fit, one form of each (~3 GB) does, so that model switches
/// progressively; SmolLM2-135M (~0.6 GB for both forms) keeps every graph resident.
pub const QNN_DEFAULT_MEMORY_MB: u64 = 4096;
/// The planner that decides when each block switches (polynomial, within a few percent of
/// the exact optimum in `rag-bench prefill`).
pub const SWITCH_SCHEDULE: ScheduleKind = ScheduleKind::ProgressiveLs;

impl Default for QnnShapes {
    fn default() -> Self {
        QnnShapes {
            prefill_rows: QNN_PREFILL_ROWS,
            verify_rows: QNN_VERIFY_ROWS,
            blocks: 2,
            cache_dir: Some(BinaryCache::default_dir()),
        }
    }
}

/// A session on some backend, as the assistant and the CLI use it: a speculative-decoding
/// target plus the KV-cache operations of prompt-prefix reuse.
pub trait Engine: Target + Send {
    /// The backend's name (`cpu`, `qnn-htp`).
    fn backend_name(&self) -> &'static str;
    fn truncate(&mut self, n: usize) -> Result<()>;
    fn n_past(&self) -> usize;
    fn kv_capacity(&self) -> usize;
    fn export_kv(&self, n: usize) -> Result<Vec<f32>>;
    fn import_kv(&mut self, n: usize, rows: &[f32]) -> Result<()>;
    /// Largest verification batch (the decode/verify graph rows).
    fn max_verify(&self) -> usize;
    /// Plain decoding after prefilling `prompt` (one decode step per token, no drafts),
    /// greedy or sampled: the reference speculative output must equal token for token.
    fn generate_plain(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        sampling: &Sampling,
    ) -> Result<(Vec<u32>, GenerationStats)>;

    /// `n` samples of the answer to `prompt`, decoded together (one forward per step for
    /// every running sample): sample b equals [`Engine::generate_plain`] under
    /// [`Sampling::for_branch`]`(b)`. `on_token(b, token)` returning false stops sample b.
    fn generate_samples(
        &mut self,
        prompt: &[u32],
        n: usize,
        max_tokens: usize,
        sampling: &Sampling,
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<(Vec<BranchOutput>, GenerationStats)>;

    /// What progressive switching did during the last prefill (`None`: not switching).
    fn switch_report(&self) -> Option<SwitchReport>;

    /// What the verify-cost curve and cached KV rows depend on beyond the model: `cpu`,
    /// or the backend and its verify graph rows (`qnn-htp v16`), so they are cached apart.
    fn profile_tag(&self) -> String {
        match self.backend_name() {
            "cpu" => "cpu".to_owned(),
            other => format!("{other} v{}", self.max_verify()),
        }
    }
}

impl<B: Backend + Send> Engine for Session<B>
where
    B::Graph: Send,
{
    fn backend_name(&self) -> &'static str {
        self.backend().name()
    }
    fn truncate(&mut self, n: usize) -> Result<()> {
        Ok(Session::truncate(self, n)?)
    }
    fn n_past(&self) -> usize {
        Session::n_past(self)
    }
    fn kv_capacity(&self) -> usize {
        Session::kv_capacity(self)
    }
    fn export_kv(&self, n: usize) -> Result<Vec<f32>> {
        Ok(Session::export_kv(self, n)?)
    }
    fn import_kv(&mut self, n: usize, rows: &[f32]) -> Result<()> {
        Ok(Session::import_kv(self, n, rows)?)
    }
    fn max_verify(&self) -> usize {
        self.options().max_verify
    }
    fn switch_report(&self) -> Option<SwitchReport> {
        Session::switch_report(self).cloned()
    }
    fn generate_samples(
        &mut self,
        prompt: &[u32],
        n: usize,
        max_tokens: usize,
        sampling: &Sampling,
        on_token: &mut dyn FnMut(usize, u32) -> bool,
    ) -> Result<(Vec<BranchOutput>, GenerationStats)> {
        Ok(generate_samples(
            self, prompt, n, max_tokens, sampling, on_token,
        )?)
    }
    fn generate_plain(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        sampling: &Sampling,
    ) -> Result<(Vec<u32>, GenerationStats)> {
        let mut out = Vec::new();
        let push = |t| {
            out.push(t);
            true
        };
        let stats = if sampling.is_greedy() {
            // The argmax-only head.
            session::generate_greedy(self, prompt, max_tokens, push)?
        } else {
            generate_sampled_plain(self, prompt, max_tokens, sampling, push)?
        };
        Ok((out, stats))
    }
}

/// The residency budget in MB for `backend` (`None`: every graph stays resident): the
/// given one, else [`QNN_DEFAULT_MEMORY_MB`] on QNN; the CPU switches only when asked.
pub fn memory_budget_mb(backend: &BackendChoice, npu_memory_mb: Option<u64>) -> Option<u64> {
    match backend {
        BackendChoice::Cpu => npu_memory_mb,
        BackendChoice::Qnn(_) => Some(npu_memory_mb.unwrap_or(QNN_DEFAULT_MEMORY_MB)),
    }
}

/// Turns on progressive prefill-to-decode switching under `budget_mb`, with the session's
/// warm-up profile (measured once per model, layout, backend and machine, then read from
/// the profile cache, `npu_runtime::schedule::profile::cache_dir`).
/// Nothing switches when both forms of every block fit the budget (returns false).
pub fn enable_switching<B: Backend>(session: &mut Session<B>, budget_mb: u64) -> Result<bool> {
    let budget_bytes = budget_mb.saturating_mul(1 << 20);
    let need = session.residency_bytes();
    if budget_bytes >= need.both_forms || !session.has_two_forms() {
        return Ok(false);
    }
    need.check(budget_bytes)?;
    let model = Arc::clone(session.model());
    let o = session.options().clone();
    let name = model
        .path()
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let backend = session.backend().name();
    let machine = profile_machine(backend, model.threads());
    let layout = format!("{name}-b{}-v{}-{}", o.blocks, o.min_verify, o.max_verify);
    // Static QNN graphs attend over every KV slot, so their costs depend on the capacity;
    // the CPU's do not. Warm-up repetitions: medians of 3, which shrug off one slow run on
    // a shared machine (on the emulator that is minutes, once per layout and machine).
    let label = if backend == "cpu" {
        layout
    } else {
        format!("{layout}-kv{}", o.kv_capacity)
    };
    let path = cache_path(&cache_dir(), &label, backend, &machine, o.prefill_chunk);
    // A cached profile of another layout (a file edited or written by another build) is
    // measured again, like an unreadable one.
    let cached = Profile::load(&path)
        .ok()
        .filter(|p| session.profile_fits(p));
    let profile = match cached {
        Some(p) => p,
        None => {
            let t0 = std::time::Instant::now();
            let p = session
                .profile_forms(&label, &machine, WARMUP_REPS)
                .context("profiling the prefill and decode graphs")?;
            // A failed write only costs another warm-up next time.
            if let Err(e) = p.save(&path) {
                tracing::warn!("{e}");
            }
            tracing::info!(
                "warm-up profile of the graph forms in {:.1} s, cached at {}",
                t0.elapsed().as_secs_f64(),
                path.display()
            );
            p
        }
    };
    session.enable_switching(Some(Switching {
        kind: SWITCH_SCHEDULE,
        budget_bytes,
        profile,
    }))?;
    Ok(true)
}

/// Repetitions of the switching warm-up (medians).
pub const WARMUP_REPS: usize = 3;

/// A CPU session with `opts`, switching under `budget_mb` if given. The KV capacity grows
/// when switching so that the warm-up's prefill chunk fits (never past the model's context).
pub fn cpu_session(
    model: &Arc<Model>,
    mut opts: SessionOptions,
    budget_mb: Option<u64>,
) -> Result<Session> {
    if budget_mb.is_some() {
        opts.kv_capacity = opts
            .kv_capacity
            .max(opts.prefill_chunk + opts.max_verify + 1)
            .min(model.config().ctx_len);
    }
    let mut s = Session::new(Arc::clone(model), opts)?;
    if let Some(mb) = budget_mb {
        enable_switching(&mut s, mb)?;
    }
    Ok(s)
}

/// A session on the QNN HTP backend with `shapes` and `kv_capacity` slots (the graphs'
/// static KV shape), compiled or read from the context cache, switching under `budget_mb`
/// if given.
pub fn qnn_session(
    model: &Arc<Model>,
    shapes: &QnnShapes,
    kv_capacity: usize,
    kv_precision: KvPrecision,
    budget_mb: Option<u64>,
) -> Result<Session<QnnBackend>> {
    let opts = qnn_session_options(shapes, kv_capacity, kv_precision)?;
    // Before the backend sizes its tables by the capacity.
    opts.check(model.config())?;
    let b = QnnBackend::new(
        Arc::clone(model),
        kv_capacity,
        shapes.cache_dir.clone().map(BinaryCache::new),
    )?;
    let mut s =
        Session::with_backend(b, Arc::clone(model), opts).context("building the QNN graphs")?;
    if let Some(mb) = budget_mb {
        enable_switching(&mut s, mb)?;
    }
    Ok(s)
}

/// Opens an engine for `model` with `kv_capacity` KV slots on `backend`. On QNN this
/// compiles (or reads from the context cache) every block graph. With a residency budget
/// ([`memory_budget_mb`]) the prefill switches blocks from prefill to decode graphs
/// progressively ([`enable_switching`]).
pub fn open(
    model: &Arc<Model>,
    backend: &BackendChoice,
    kv_capacity: usize,
    kv_precision: KvPrecision,
    npu_memory_mb: Option<u64>,
) -> Result<Box<dyn Engine>> {
    let budget = memory_budget_mb(backend, npu_memory_mb);
    Ok(match backend {
        BackendChoice::Cpu => {
            let opts = SessionOptions {
                kv_capacity,
                kv_precision,
                ..SessionOptions::default()
            };
            Box::new(cpu_session(model, opts, budget)?)
        }
        BackendChoice::Qnn(shapes) => Box::new(qnn_session(
            model,
            shapes,
            kv_capacity,
            kv_precision,
            budget,
        )?),
    })
}

/// Session options for `shapes`: one decode/verify size, one prefill size.
pub fn qnn_session_options(
    shapes: &QnnShapes,
    kv_capacity: usize,
    kv_precision: KvPrecision,
) -> Result<SessionOptions> {
    anyhow::ensure!(
        graphs::ir::DECODE_SHAPES.contains(&shapes.verify_rows),
        "QNN verify rows must be one of {:?}",
        graphs::ir::DECODE_SHAPES
    );
    anyhow::ensure!(
        shapes.prefill_rows >= 1 && shapes.blocks >= 1,
        "QNN prefill rows and blocks must be positive"
    );
    Ok(SessionOptions {
        kv_capacity,
        prefill_chunk: shapes.prefill_rows,
        max_verify: shapes.verify_rows,
        min_verify: shapes.verify_rows,
        blocks: shapes.blocks,
        kv_precision,
    })
}
