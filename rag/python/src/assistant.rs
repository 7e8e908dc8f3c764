//! `ragkit.Assistant`: one [`rag::assistant::Assistant`] shared with Python.

use crate::chat;
use crate::errors::{guarded, value_error};
use crate::stream::AskStream;
use crate::text_sink::TextSink;
use crate::types::{Answer, Hit, IndexSummary};
use npu_runtime::session::KvPrecision;
use npu_runtime::weights_cache::WeightsCache;
use pyo3::prelude::*;
use rag::assistant::{AskOptions, AssistantOptions, Sampling};
use rag::engine::BackendChoice;
use rag::select::Selector;
use rag::{IndexOptions, Phase, SearchMode};
use std::path::PathBuf;
use std::sync::Arc;

/// An index plus a local LLM. Thread-safe: share one across Python threads.
#[pyclass(frozen, module = "ragkit")]
pub struct Assistant {
    pub(crate) inner: Arc<rag::assistant::Assistant>,
}

fn search_mode(mode: &str) -> PyResult<SearchMode> {
    mode.parse().map_err(value_error)
}

/// `(temperature, top_p, seed)` as Python passes them: greedy at temperature 0; no
/// seed, a fresh one.
pub(crate) fn sampling((temperature, top_p, seed): (f32, f32, Option<u64>)) -> PyResult<Sampling> {
    Sampling::new(
        temperature,
        top_p,
        seed.unwrap_or_else(Sampling::fresh_seed),
    )
    .map_err(value_error)
}

pub(crate) fn ask_options(
    top_k: usize,
    mode: &str,
    context_tokens: usize,
    max_tokens: usize,
    sampler: (f32, f32, Option<u64>),
) -> PyResult<AskOptions> {
    Ok(AskOptions {
        top_k,
        mode: search_mode(mode)?,
        context_tokens,
        max_tokens,
        sampling: sampling(sampler)?,
        ..AskOptions::default()
    })
}

/// Most samples one answer may take (`samples`): the decode graphs' rows.
const MAX_SAMPLES: usize = 16;

/// `samples`, `select` and `stop` as Python passes them.
pub(crate) fn with_samples(
    opts: AskOptions,
    samples: usize,
    select: &str,
    stop: Option<Vec<String>>,
) -> PyResult<AskOptions> {
    if !(1..=MAX_SAMPLES).contains(&samples) {
        return Err(value_error(format!(
            "samples must be between 1 and {MAX_SAMPLES}, not {samples}"
        )));
    }
    let select = Selector::parse(select).ok_or_else(|| {
        value_error(format!(
            "select must be one of {:?}, not {select:?}",
            Selector::NAMES
        ))
    })?;
    Ok(AskOptions {
        samples,
        select,
        stop: stop.unwrap_or_default(),
        ..opts
    })
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Scan => "scan",
        Phase::Parse => "parse",
        Phase::Embed => "embed",
        Phase::Finish => "finish",
    }
}

#[pymethods]
impl Assistant {
    #[new]
    #[pyo3(signature = (
        index_dir, *, model=None, spec="sdnpu", threads=0, dense=true, kv_capacity=4096,
        kv_cache="f32", backend="cpu", preload_model=false, weights_cache=true,
        npu_memory_mb=None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn new(
        py: Python<'_>,
        index_dir: PathBuf,
        model: Option<String>,
        spec: &str,
        threads: usize,
        dense: bool,
        kv_capacity: usize,
        kv_cache: &str,
        backend: &str,
        preload_model: bool,
        weights_cache: bool,
        npu_memory_mb: Option<u64>,
    ) -> PyResult<Self> {
        let mut opts = AssistantOptions::new(index_dir);
        if let Some(m) = model {
            opts.model = m;
        }
        opts.spec = specdec::Mode::parse(spec).map_err(|e| value_error(format!("spec: {e}")))?;
        opts.threads = threads;
        opts.dense = dense;
        opts.kv_capacity = kv_capacity;
        opts.kv_precision = KvPrecision::parse(kv_cache)
            .ok_or_else(|| value_error(format!("kv_cache: {kv_cache:?} (f32 or f16)")))?;
        opts.backend = BackendChoice::parse(backend).map_err(value_error)?;
        opts.preload_model = preload_model;
        opts.npu_memory_mb = npu_memory_mb;
        if !weights_cache {
            opts.weights_cache = WeightsCache::Off;
        }
        let inner = py.detach(|| guarded(|| rag::assistant::Assistant::open(opts)))?;
        Ok(Assistant {
            inner: Arc::new(inner),
        })
    }

    /// Add or update files and folders (incremental: unchanged content is not re-read).
    #[pyo3(signature = (paths, *, progress=None))]
    fn add_paths(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<IndexSummary> {
        let inner = &self.inner;
        let on_progress = |p: rag::IndexProgress| {
            if let Some(cb) = &progress {
                Python::attach(|py| {
                    let args = (phase_name(p.phase), p.done, p.total, p.current);
                    // A failing progress callback must not fail the indexing: report it.
                    if let Err(e) = cb.call1(py, args) {
                        e.write_unraisable(py, Some(cb.bind(py)));
                    }
                });
            }
        };
        let summary = py.detach(|| {
            guarded(|| inner.add_paths(&paths, &IndexOptions::default(), &on_progress))
        })?;
        Ok(summary.into())
    }

    /// Remove a file, or every file under a folder, from the index; returns the count.
    fn remove_path(&self, py: Python<'_>, path: PathBuf) -> PyResult<usize> {
        let inner = &self.inner;
        py.detach(|| guarded(|| inner.remove_path(&path)))
    }

    /// The `k` best passages for `query`.
    #[pyo3(signature = (query, k=5, *, mode="hybrid"))]
    fn search(&self, py: Python<'_>, query: String, k: usize, mode: &str) -> PyResult<Vec<Hit>> {
        let mode = search_mode(mode)?;
        let inner = &self.inner;
        let hits = py.detach(|| guarded(|| inner.retrieve(&query, k, mode)))?;
        Ok(hits.into_iter().map(Hit::from).collect())
    }

    /// Retrieve, prompt with numbered sources, and generate the answer.
    #[pyo3(signature = (
        question, *, top_k=5, mode="hybrid", context_tokens=1024, max_tokens=256,
        temperature=0.0, top_p=1.0, seed=None, samples=1, select="vote", stop=None,
        on_text=None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn ask(
        &self,
        py: Python<'_>,
        question: String,
        top_k: usize,
        mode: &str,
        context_tokens: usize,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        seed: Option<u64>,
        samples: usize,
        select: &str,
        stop: Option<Vec<String>>,
        on_text: Option<Py<PyAny>>,
    ) -> PyResult<Answer> {
        let opts = ask_options(
            top_k,
            mode,
            context_tokens,
            max_tokens,
            (temperature, top_p, seed),
        )?;
        let opts = with_samples(opts, samples, select, stop)?;
        let inner = &self.inner;
        let mut sink = TextSink::new(on_text.as_ref());
        let answer = py.detach(|| guarded(|| inner.ask(&question, &opts, &mut |p| sink.push(p))));
        sink.finish()?;
        Ok(answer?.into())
    }

    /// Like `ask`, but returns at once an iterator over the answer's text pieces.
    #[pyo3(signature = (
        question, *, top_k=5, mode="hybrid", context_tokens=1024, max_tokens=256,
        temperature=0.0, top_p=1.0, seed=None, samples=1, select="vote", stop=None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn ask_stream(
        &self,
        question: String,
        top_k: usize,
        mode: &str,
        context_tokens: usize,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        seed: Option<u64>,
        samples: usize,
        select: &str,
        stop: Option<Vec<String>>,
    ) -> PyResult<AskStream> {
        let opts = ask_options(
            top_k,
            mode,
            context_tokens,
            max_tokens,
            (temperature, top_p, seed),
        )?;
        let opts = with_samples(opts, samples, select, stop)?;
        let (events, cancel) = self.inner.ask_stream(question, opts);
        Ok(AskStream::new(events, cancel))
    }

    /// Answer the last user message of `messages` (`{"role", "content"}` dicts: system,
    /// earlier turns, the question last), with the earlier turns in the prompt.
    #[pyo3(signature = (
        messages, *, retrieval=true, top_k=5, mode="hybrid", context_tokens=1024,
        max_tokens=256, temperature=0.0, top_p=1.0, seed=None, samples=1, select="vote",
        stop=None, on_text=None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        retrieval: bool,
        top_k: usize,
        mode: &str,
        context_tokens: usize,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        seed: Option<u64>,
        samples: usize,
        select: &str,
        stop: Option<Vec<String>>,
        on_text: Option<Py<PyAny>>,
    ) -> PyResult<Answer> {
        let messages = chat::messages(messages, retrieval)?;
        let opts = ask_options(
            top_k,
            mode,
            context_tokens,
            max_tokens,
            (temperature, top_p, seed),
        )?;
        let opts = with_samples(opts, samples, select, stop)?;
        let inner = &self.inner;
        let mut sink = TextSink::new(on_text.as_ref());
        let answer = py
            .detach(|| guarded(|| inner.chat(&messages, retrieval, &opts, &mut |p| sink.push(p))));
        sink.finish()?;
        Ok(answer?.into())
    }

    /// Like `chat`, but returns at once an iterator over the answer's text pieces.
    #[pyo3(signature = (
        messages, *, retrieval=true, top_k=5, mode="hybrid", context_tokens=1024, max_tokens=256,
        temperature=0.0, top_p=1.0, seed=None, samples=1, select="vote", stop=None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn chat_stream(
        &self,
        messages: &Bound<'_, PyAny>,
        retrieval: bool,
        top_k: usize,
        mode: &str,
        context_tokens: usize,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        seed: Option<u64>,
        samples: usize,
        select: &str,
        stop: Option<Vec<String>>,
    ) -> PyResult<AskStream> {
        let messages = chat::messages(messages, retrieval)?;
        let opts = ask_options(
            top_k,
            mode,
            context_tokens,
            max_tokens,
            (temperature, top_p, seed),
        )?;
        let opts = with_samples(opts, samples, select, stop)?;
        let (events, cancel) = self.inner.chat_stream(messages, retrieval, opts);
        Ok(AskStream::new(events, cancel))
    }

    /// Answer over caller-supplied context (a UI agent's screen) instead of retrieval.
    #[pyo3(signature = (
        question, context, system=None, *, max_tokens=256, temperature=0.0, top_p=1.0,
        seed=None, samples=1, select="vote", stop=None, on_text=None
    ))]
    #[allow(clippy::too_many_arguments)] // Python keyword arguments
    fn ask_with_context(
        &self,
        py: Python<'_>,
        question: String,
        context: String,
        system: Option<String>,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        seed: Option<u64>,
        samples: usize,
        select: &str,
        stop: Option<Vec<String>>,
        on_text: Option<Py<PyAny>>,
    ) -> PyResult<Answer> {
        let opts = AskOptions {
            max_tokens,
            sampling: sampling((temperature, top_p, seed))?,
            ..AskOptions::default()
        };
        let opts = with_samples(opts, samples, select, stop)?;
        let inner = &self.inner;
        let mut sink = TextSink::new(on_text.as_ref());
        let answer = py.detach(|| {
            guarded(|| {
                inner.ask_with_context(&question, &context, system.as_deref(), &opts, &mut |p| {
                    sink.push(p)
                })
            })
        });
        sink.finish()?;
        Ok(answer?.into())
    }

    /// Load the generation model now instead of on the first question.
    fn load_model(&self, py: Python<'_>) -> PyResult<()> {
        let inner = &self.inner;
        py.detach(|| guarded(|| inner.load_model()))
    }

    /// Wait for work that outlives an answer (writing the repacked-weights cache after the
    /// model's first load), so the next process finds the cache.
    fn finish_background_work(&self, py: Python<'_>) {
        let inner = &self.inner;
        py.detach(|| inner.finish_background_work(|_| {}));
    }

    /// Name or path of the generation model.
    #[getter]
    fn model(&self) -> String {
        self.inner.model_name().to_owned()
    }

    /// The index directory.
    #[getter]
    fn index_dir(&self) -> String {
        self.inner
            .options()
            .index_dir
            .to_string_lossy()
            .into_owned()
    }

    fn __repr__(&self) -> String {
        format!(
            "Assistant(index_dir={:?}, model={:?})",
            self.inner.options().index_dir.display().to_string(),
            self.inner.model_name()
        )
    }
}
