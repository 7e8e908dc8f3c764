//! Read-only Python views of the Rust results (search hits, answers, indexing summaries).

use pyo3::prelude::*;
use std::collections::BTreeMap;

/// `path:10-24`, `file.pdf#3`, or the bare path (the CLI's citation form).
fn location(path: &str, lines: Option<(u32, u32)>, page: Option<u32>) -> String {
    match (lines, page) {
        (_, Some(p)) => format!("{path}#{p}"),
        (Some((a, b)), None) => format!("{path}:{a}-{b}"),
        (None, None) => path.to_owned(),
    }
}

/// One retrieved passage, best first in `Assistant.search`'s list.
#[pyclass(frozen, get_all, module = "ragkit")]
#[derive(Clone)]
pub struct Hit {
    /// Stable id of the chunk in the index.
    pub chunk_id: i64,
    /// The indexed file (absolute path).
    pub path: String,
    /// First and last line of the passage (None for PDF pages and HTML).
    pub lines: Option<(u32, u32)>,
    /// PDF page (None otherwise).
    pub page: Option<u32>,
    /// Markdown heading path of the passage, if any.
    pub heading: Option<String>,
    pub text: String,
    /// Fused score (hybrid) or the single method's score.
    pub score: f32,
    /// 1-based rank in the BM25 list (None if absent from it).
    pub bm25_rank: Option<usize>,
    /// 1-based rank in the dense list (None if absent from it).
    pub dense_rank: Option<usize>,
}

impl From<rag::Hit> for Hit {
    fn from(h: rag::Hit) -> Self {
        Hit {
            chunk_id: h.chunk_id,
            path: h.path,
            lines: h.lines,
            page: h.page,
            heading: h.heading,
            text: h.text,
            score: h.score,
            bm25_rank: h.bm25_rank,
            dense_rank: h.dense_rank,
        }
    }
}

#[pymethods]
impl Hit {
    /// `path:10-24`, `file.pdf#3`, or the bare path.
    #[getter]
    fn location(&self) -> String {
        location(&self.path, self.lines, self.page)
    }

    fn __repr__(&self) -> String {
        format!("Hit({}, score={:.4})", self.location(), self.score)
    }
}

/// A passage that was put in the prompt, numbered as the answer cites it.
#[pyclass(frozen, get_all, module = "ragkit")]
#[derive(Clone)]
pub struct Source {
    /// The number the prompt gave it ([1] is the first).
    pub number: usize,
    pub path: String,
    pub lines: Option<(u32, u32)>,
    pub page: Option<u32>,
    pub chunk_id: i64,
    pub score: f32,
}

#[pymethods]
impl Source {
    /// `path:10-24`, `file.pdf#3`, or the bare path.
    #[getter]
    fn location(&self) -> String {
        location(&self.path, self.lines, self.page)
    }

    fn __repr__(&self) -> String {
        format!("Source([{}] {})", self.number, self.location())
    }
}

/// Where the time of one answer went, in milliseconds.
#[pyclass(frozen, get_all, module = "ragkit")]
#[derive(Clone)]
pub struct Timings {
    pub retrieve_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub decode_tok_s: f64,
    /// From the start of the question to the first text (includes a first model load).
    pub first_token_ms: f64,
    /// Progressive prefill-to-decode graph switching under a residency budget
    /// (`npu_memory_mb`); None when every graph stays resident.
    pub switching: Option<Switching>,
}

/// What progressive graph switching did during one answer's prefill.
#[pyclass(frozen, get_all, module = "ragkit")]
#[derive(Clone)]
pub struct Switching {
    /// The plan that ran (`progressive-ls`, `all-resident`, `decode-graphs`).
    pub schedule: String,
    pub prefill_ms: f64,
    /// Loader time spent switching, hidden behind compute or not.
    pub switch_ms: f64,
    /// The part of the switching the prompt waited for.
    pub stall_ms: f64,
    /// Blocks switched.
    pub switches: usize,
}

impl From<npu_runtime::session::SwitchReport> for Switching {
    fn from(r: npu_runtime::session::SwitchReport) -> Self {
        Switching {
            schedule: r.schedule,
            prefill_ms: r.prefill_ms,
            switch_ms: r.switch_ms,
            stall_ms: r.stall_ms,
            switches: r.switches,
        }
    }
}

#[pymethods]
impl Switching {
    fn __repr__(&self) -> String {
        format!(
            "Switching(schedule={:?}, switches={}, switch_ms={:.1}, stall_ms={:.1})",
            self.schedule, self.switches, self.switch_ms, self.stall_ms
        )
    }
}

#[pymethods]
impl Timings {
    fn __repr__(&self) -> String {
        format!(
            "Timings(retrieve_ms={:.1}, prefill_ms={:.1}, decode_ms={:.1}, decode_tok_s={:.1}, first_token_ms={:.1})",
            self.retrieve_ms, self.prefill_ms, self.decode_ms, self.decode_tok_s, self.first_token_ms
        )
    }
}

/// Speculative decoding's work on one answer (the answer is the same in every mode).
#[pyclass(frozen, get_all, module = "ragkit")]
#[derive(Clone)]
pub struct Speculation {
    /// none, pld, sam, samcal, samext or sdnpu.
    pub mode: String,
    /// Verification forwards.
    pub steps: usize,
    /// Tokens accepted per step.
    pub mean_accepted: f64,
}

#[pymethods]
impl Speculation {
    fn __repr__(&self) -> String {
        format!(
            "Speculation(mode={:?}, steps={}, mean_accepted={:.2})",
            self.mode, self.steps, self.mean_accepted
        )
    }
}

/// One of several sampled answers (`samples=N`).
#[pyclass(frozen, get_all, module = "ragkit")]
#[derive(Clone)]
pub struct Candidate {
    pub text: String,
    /// Mean log-probability per generated token (natural log).
    pub mean_logprob: f64,
    /// Samples that agree with this one (itself included; 0 when its answer did not count).
    pub votes: usize,
    pub tokens: usize,
    /// With `select="verify"`: the model's log-odds of "Yes" over "No" for this answer.
    pub verify: Option<f64>,
}

#[pymethods]
impl Candidate {
    fn __repr__(&self) -> String {
        format!(
            "Candidate({:?}, votes={}, mean_logprob={:.3})",
            self.text, self.votes, self.mean_logprob
        )
    }
}

/// A finished answer: text, cited sources, timings.
#[pyclass(frozen, get_all, module = "ragkit")]
#[derive(Clone)]
pub struct Answer {
    /// The generated answer, trimmed.
    pub answer: String,
    /// The passages put in the prompt, in citation order (empty for `ask_with_context`).
    pub sources: Vec<Source>,
    pub timings: Timings,
    pub tokens_generated: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was reused from an earlier question or the cached prompt head.
    pub reused_prompt_tokens: usize,
    /// Stopped by the caller (a callback returning False, a broken stream loop, `cancel()`).
    pub cancelled: bool,
    pub speculation: Speculation,
    /// Where the block graphs ran: `cpu` or `qnn-htp`.
    pub backend: String,
    /// With `samples` > 1: every sample, the kept one among them.
    pub candidates: Vec<Candidate>,
}

impl From<rag::assistant::Answer> for Answer {
    fn from(a: rag::assistant::Answer) -> Self {
        Answer {
            answer: a.answer,
            sources: a
                .sources
                .into_iter()
                .map(|s| Source {
                    number: s.number,
                    path: s.path,
                    lines: s.lines,
                    page: s.page,
                    chunk_id: s.chunk_id,
                    score: s.score,
                })
                .collect(),
            timings: Timings {
                retrieve_ms: a.timings.retrieve_ms,
                prefill_ms: a.timings.prefill_ms,
                decode_ms: a.timings.decode_ms,
                decode_tok_s: a.timings.decode_tok_s,
                first_token_ms: a.timings.first_token_ms,
                switching: a.timings.switching.map(Switching::from),
            },
            tokens_generated: a.tokens_generated,
            prompt_tokens: a.prompt_tokens,
            reused_prompt_tokens: a.reused_prompt_tokens,
            cancelled: a.cancelled,
            speculation: Speculation {
                mode: a.speculation.mode.to_owned(),
                steps: a.speculation.steps,
                mean_accepted: a.speculation.mean_accepted,
            },
            backend: a.backend.to_owned(),
            candidates: a
                .candidates
                .into_iter()
                .map(|c| Candidate {
                    text: c.text,
                    mean_logprob: c.mean_logprob,
                    votes: c.votes,
                    tokens: c.tokens,
                    verify: c.verify,
                })
                .collect(),
        }
    }
}

#[pymethods]
impl Answer {
    fn __str__(&self) -> String {
        self.answer.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "Answer({:?}, sources={}, tokens_generated={}, cancelled={})",
            self.answer,
            self.sources.len(),
            self.tokens_generated,
            if self.cancelled { "True" } else { "False" }
        )
    }
}

/// What one `Assistant.add_paths` did.
#[pyclass(frozen, get_all, module = "ragkit")]
#[derive(Clone)]
pub struct IndexSummary {
    pub files_seen: u64,
    /// New or changed files parsed this run.
    pub files_indexed: u64,
    pub files_unchanged: u64,
    pub files_removed: u64,
    /// Files that gave no chunks, counted by reason (unsupported, binary, too-large, ...).
    pub skipped: BTreeMap<String, u64>,
    pub walk_errors: u64,
    pub chunks_added: u64,
    pub chunks_removed: u64,
    pub chunks_total: u64,
    pub chunks_embedded: u64,
    /// The committed index generation.
    pub generation: u64,
    pub elapsed_s: f64,
}

impl From<rag::IndexSummary> for IndexSummary {
    fn from(s: rag::IndexSummary) -> Self {
        IndexSummary {
            files_seen: s.files_seen,
            files_indexed: s.files_indexed,
            files_unchanged: s.files_unchanged,
            files_removed: s.files_removed,
            skipped: s.skipped,
            walk_errors: s.walk_errors,
            chunks_added: s.chunks_added,
            chunks_removed: s.chunks_removed,
            chunks_total: s.chunks_total,
            chunks_embedded: s.chunks_embedded,
            generation: s.generation,
            elapsed_s: s.elapsed.as_secs_f64(),
        }
    }
}

#[pymethods]
impl IndexSummary {
    fn __repr__(&self) -> String {
        format!(
            "IndexSummary(files_seen={}, files_indexed={}, chunks_total={}, generation={})",
            self.files_seen, self.files_indexed, self.chunks_total, self.generation
        )
    }
}
