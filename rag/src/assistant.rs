//! The embeddable API: an index plus a local LLM behind one thread-safe handle.
//!
//! ```no_run
//! use rag::assistant::{Assistant, AssistantOptions, AskOptions};
//! let assistant = Assistant::open(AssistantOptions::new(".rag-index"))?;
//! assistant.add_paths(&["docs".into()], &Default::default(), &|_| {})?;
//! let answer = assistant.ask("How do I factory reset the console?", &AskOptions::default(), &mut |piece| {
//!     print!("{piece}");
//!     true // return false to stop early
//! })?;
//! for s in &answer.sources { println!("[{}] {}", s.number, s.location()); }
//! # Ok::<(), anyhow::Error>(())
//! ```
//!
//! One generation runs at a time per `Assistant` (the KV cache and draft state live in one
//! session behind a mutex); retrieval and indexing do not wait for it. `Assistant` is `Send +
//! Sync`: share it across threads with `Arc<Assistant>`. [`Assistant::ask_stream`] gives a
//! tokio channel of events and a cancellation handle for async callers.
//!
//! # From async code (tokio)
//!
//! Opening, indexing and retrieval are blocking calls (file I/O, the embedding model):
//! run them on tokio's blocking pool; answers stream through [`Assistant::ask_stream`].
//!
//! ```no_run
//! use rag::assistant::{Assistant, AssistantOptions};
//! use rag::SearchMode;
//! use std::sync::Arc;
//! # async fn demo() -> anyhow::Result<()> {
//! let assistant = Arc::new(
//!     tokio::task::spawn_blocking(|| Assistant::open(AssistantOptions::new(".rag-index"))).await??,
//! );
//! let a = Arc::clone(&assistant);
//! let summary = tokio::task::spawn_blocking(move || {
//!     a.add_paths(&["docs".into()], &Default::default(), &|_| {})
//! })
//! .await??;
//! println!("{} chunks", summary.chunks_total);
//! let a = Arc::clone(&assistant);
//! let removed = tokio::task::spawn_blocking(move || a.remove_path("docs/old.md".as_ref())).await??;
//! let a = Arc::clone(&assistant);
//! let hits = tokio::task::spawn_blocking(move || a.retrieve("warranty", 5, SearchMode::Hybrid)).await??;
//! for h in &hits {
//!     println!("{:.3} {} {:?}", h.score, h.path, h.lines);
//! }
//! # let _ = removed;
//! # Ok(())
//! # }
//! ```

use crate::embed_api::Embedder;
use crate::engine::{self, BackendChoice, Engine};
use crate::index::{Hit, Index, IndexOptions, IndexProgress, IndexSummary, SearchMode};
use crate::models;
use crate::prompt::{self, PromptSource};
use crate::prompt_head::{self, PromptHead};
use crate::select::{self, Candidate, Selector, VoteKey};
use crate::stop::StopMatcher;
use anyhow::{anyhow, Context, Result};
/// A message of [`Assistant::chat`] (role `system`, `user` or `assistant`, and its text).
pub use graphs::chat::ChatMessage;
use graphs::tokenizer::Tokenizer;
use npu_runtime::session::SwitchReport;
use npu_runtime::session::{KvPrecision, LoadOptions, Model};
use npu_runtime::weights_cache::WeightsCache;
use serde::Serialize;
use specdec::curve_cache::{self, CurveKey};
use specdec::generate::{GenConfig, Generator};
pub use specdec::Sampling;
use specdec::{Mode, TokenDb};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

/// Shortest prompt head worth a cache file.
const MIN_HEAD_TOKENS: usize = 8;

/// [`AssistantOptions::calib_window`]'s default: the question and the prompt template's tail.
pub const DEFAULT_CALIB_WINDOW: usize = 64;

/// Passages retrieved for a question ([`AskOptions::top_k`]; also the default of
/// `rag search` and `/v1/search`). The answer-quality figures were measured with it
/// (`rag-bench answers`).
pub const DEFAULT_TOP_K: usize = 5;

/// Token budget of the numbered sources in the prompt ([`AskOptions::context_tokens`]).
pub const DEFAULT_CONTEXT_TOKENS: usize = 1024;

/// Answer tokens at most ([`AskOptions::max_tokens`]).
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Speculative decoding mode ([`AssistantOptions::spec`]).
pub const DEFAULT_SPEC: Mode = Mode::Sdnpu;

/// How to open an [`Assistant`].
#[derive(Clone, Debug)]
pub struct AssistantOptions {
    pub index_dir: PathBuf,
    /// A manifest name (fetched on first use) or a path to a GGUF file.
    pub model: String,
    /// Dense retrieval with the embedder the index was built with (`rag index --embedder`;
    /// MiniLM for a new index), fetched on first use; BM25 only if false.
    pub dense: bool,
    /// Compute threads; 0 = all cores.
    pub threads: usize,
    /// KV slots of the generation session (prompt + answer).
    pub kv_capacity: usize,
    /// How the session's KV cache stores K and V (f32 default; f16 halves its memory and
    /// the bytes attention reads per token, with llama.cpp's default cache precision).
    pub kv_precision: KvPrecision,
    /// Speculative decoding mode (output is identical in every mode; only speed differs).
    pub spec: Mode,
    /// Bound of the persistent token database used for drafting.
    pub token_db_max_tokens: usize,
    /// Start loading the generation model on a background thread in [`Assistant::open`], so
    /// the load overlaps the embedder load, index opening and retrieval (a CLI that asks at
    /// once). Off by default: retrieval-only callers never pay for the model.
    pub preload_model: bool,
    /// Where repacked model weights are cached between runs (loading maps them instead of
    /// repacking; ~1 model size of disk). Default: `<model cache>/repacked`.
    pub weights_cache: WeightsCache,
    /// Prompt positions (the last ones) whose prefill logits calibrate the drafter
    /// (`specdec` `GenConfig::calib_window`; `usize::MAX`: all). Each calibrated position
    /// runs the full-vocabulary LM head. On the CPU backend calibrating all of an
    /// ~800-token RAG prompt cost +18% prefill for no measured acceptance (1.5B, Spec-Bench
    /// rag, 5 prompts: all 2448 ms / 1.38 tokens per step, last 64 2070 ms / 1.37, none
    /// 2001 ms; benchmarks/runs/2026-11-24-rag-ask-ttft.md).
    pub calib_window: usize,
    /// Keep the KV rows of the prompt's constant head (chat template, system message) in
    /// the index directory, so the next process does not prefill them again
    /// ([`crate::prompt_head`]; exact: the answer is the same either way).
    pub prompt_head_cache: bool,
    /// Load the LM head without its screen (`npu_runtime::kernels::screen`): saves 0.75x
    /// the head's size of memory (~110 MB for Qwen2.5-0.5B) for greedy steps that read
    /// the whole head; the answers are the same either way.
    pub plain_lm_head: bool,
    /// Where the block graphs run: the CPU, or the QNN HTP (an NPU; its x86-64
    /// emulator here). Speculative decoding verifies on the same backend.
    pub backend: BackendChoice,
    /// Residency budget of the block graphs in MB: when both the prefill and the decode
    /// graphs of every block do not fit, the prefill switches blocks from one to the other
    /// progressively (`engine::enable_switching`). `None`: the backend's default (QNN:
    /// `engine::QNN_DEFAULT_MEMORY_MB`; CPU: no budget, every graph resident).
    pub npu_memory_mb: Option<u64>,
}

impl AssistantOptions {
    pub fn new(index_dir: impl Into<PathBuf>) -> Self {
        AssistantOptions {
            index_dir: index_dir.into(),
            model: models::DEFAULT_MODEL.to_owned(),
            dense: true,
            threads: 0,
            kv_capacity: 4096,
            kv_precision: KvPrecision::F32,
            spec: DEFAULT_SPEC,
            token_db_max_tokens: specdec::tokendb::DEFAULT_MAX_TOKENS,
            preload_model: false,
            weights_cache: WeightsCache::Dir(crate::models::weights_cache_dir()),
            calib_window: DEFAULT_CALIB_WINDOW,
            prompt_head_cache: true,
            plain_lm_head: false,
            backend: BackendChoice::Cpu,
            npu_memory_mb: None,
        }
    }
}

/// Per-question knobs.
#[derive(Clone, Debug)]
pub struct AskOptions {
    pub top_k: usize,
    pub mode: SearchMode,
    /// Token budget for the numbered sources in the prompt.
    pub context_tokens: usize,
    pub max_tokens: usize,
    /// Greedy by default; a temperature above 0 samples (speculation stays lossless:
    /// the answer equals plain sampled decoding with the same seed, token for token).
    pub sampling: Sampling,
    /// Answers sampled (in one batched decode, sample b under
    /// [`Sampling::for_branch`]`(b)`) before `select` keeps one; 1 is a single answer.
    /// With more than one, the text arrives in one piece once the samples are done.
    pub samples: usize,
    pub select: Selector,
    /// What a vote compares instead of [`crate::select::normalize`]d text.
    pub vote_key: Option<VoteKey>,
    /// Stop sequences: an answer (each sample) ends before the first occurrence of any,
    /// and streamed text never shows part of one.
    pub stop: Vec<String>,
    pub cancel: Option<CancelToken>,
}

impl Default for AskOptions {
    fn default() -> Self {
        AskOptions {
            top_k: DEFAULT_TOP_K,
            mode: SearchMode::Hybrid,
            context_tokens: DEFAULT_CONTEXT_TOKENS,
            max_tokens: DEFAULT_MAX_TOKENS,
            sampling: Sampling::GREEDY,
            samples: 1,
            select: Selector::Vote,
            vote_key: None,
            stop: Vec::new(),
            cancel: None,
        }
    }
}

/// Cooperative cancellation: generation stops at the next token once cancelled.
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A cited source of an answer.
#[derive(Clone, Debug, Serialize)]
pub struct Source {
    /// The number the prompt gave it ([1] is the first).
    pub number: usize,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lines: Option<(u32, u32)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page: Option<u32>,
    pub chunk_id: i64,
    pub score: f32,
}

impl Source {
    /// `path:10-24`, `file.pdf#3`, or the bare path.
    pub fn location(&self) -> String {
        location(&self.path, self.lines, self.page)
    }
}

fn location(path: &str, lines: Option<(u32, u32)>, page: Option<u32>) -> String {
    match (lines, page) {
        (_, Some(p)) => format!("{path}#{p}"),
        (Some((a, b)), None) => format!("{path}:{a}-{b}"),
        (None, None) => path.to_owned(),
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    pub retrieve_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub decode_tok_s: f64,
    /// From the start of `ask` to the first streamed piece of text.
    pub first_token_ms: f64,
    /// Progressive prefill-to-decode switching during this answer's prefill (schedule,
    /// `switch_ms`, `stall_ms`, ...); absent when every graph stays resident.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switching: Option<SwitchReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SpecSummary {
    pub mode: &'static str,
    pub steps: usize,
    pub mean_accepted: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Answer {
    pub answer: String,
    pub sources: Vec<Source>,
    pub timings: Timings,
    pub tokens_generated: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV was already in the session (an earlier question's prefix in
    /// this process, or the cached prompt head) and were not prefilled.
    pub reused_prompt_tokens: usize,
    pub cancelled: bool,
    pub speculation: SpecSummary,
    /// Where the block graphs ran (`cpu`, `qnn-htp`).
    pub backend: &'static str,
    /// With [`AskOptions::samples`] > 1: every sample, the chosen one among them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<Candidate>,
}

/// What [`Assistant::build_prompt`] returns.
#[derive(Clone, Debug)]
pub struct BuiltPrompt {
    /// The chat messages (system, then the user turn with the numbered sources).
    pub messages: Vec<ChatMessage>,
    /// Their token ids with the model's chat template applied (generation prompt included).
    pub tokens: Vec<u32>,
    /// The chat template's rendering of `messages` (what `tokens` encode; another engine
    /// given this text with special tokens parsed should get the same ids).
    pub text: String,
    /// The sources that fit the budget, in citation order.
    pub sources: Vec<Source>,
}

/// Events of [`Assistant::ask_stream`].
#[derive(Debug)]
pub enum AskEvent {
    Text(String),
    Done(Box<Answer>),
    Error(String),
}

/// The generation side, loaded on first use so retrieval-only callers never pay for it.
struct Llm {
    model: Arc<Model>,
    state: Mutex<GenState>,
    name: String,
}

struct GenState {
    session: Box<dyn Engine>,
    /// Tokens whose KV the session holds (for prompt-prefix reuse between questions).
    committed: Vec<u32>,
    generator: Generator,
    /// Tokenized corpus chunks (rebuilt when the index generation changes).
    corpus_db: TokenDb,
    /// Finished interactions (the answers), kept across index changes.
    conversations: TokenDb,
    conversations_path: PathBuf,
    /// Where the measured verify-cost curve is cached, and its key (model fingerprint,
    /// threads, machine, engine build: `specdec::curve_cache`, shared with the specdec
    /// bench); `curve_stored` once the cache holds this run's or a valid older curve. What
    /// drafting learned is kept beside it (`curve_cache::learned_file`).
    curve_file: PathBuf,
    curve_key: Option<CurveKey>,
    curve_stored: bool,
    /// The prompt-head cache file and its key (model fingerprint + engine build; `None`:
    /// off), and the head tokens that file holds (not rewritten while they match).
    head_file: PathBuf,
    head_key: Option<String>,
    head_stored: Vec<u32>,
}

/// Floats per token of a session's exported K/V rows.
fn kv_floats_per_token(model: &Model) -> usize {
    let c = model.config();
    c.n_layer * 2 * c.n_head_kv * c.head_dim
}

pub struct Assistant {
    opts: AssistantOptions,
    index: Index,
    llm: OnceLock<Arc<Llm>>,
    llm_init: Mutex<()>,
    /// The background model load started by `open` when `preload_model` is set; joined by
    /// the first use of the model.
    preloading: Mutex<Option<JoinHandle<Result<LoadedModel>>>>,
}

/// A generation model, the file it came from, and a session on it.
type LoadedModel = (PathBuf, Arc<Model>, Box<dyn Engine>);

/// Resolve (fetching on first use) and load the generation model, and make its session
/// (graphs and buffers: part of what a preload hides).
fn load_model_file(opts: &AssistantOptions) -> Result<LoadedModel> {
    let path = models::ensure(&opts.model)?;
    let load = LoadOptions {
        threads: opts.threads,
        weights_cache: opts.weights_cache.clone(),
        plain_lm_head: opts.plain_lm_head,
    };
    let model = Model::load(&path, &load)?;
    if let Some(w) = model.chat_template().warning() {
        tracing::warn!("{w}");
    }
    let session = engine::open(
        &model,
        &opts.backend,
        opts.kv_capacity,
        opts.kv_precision,
        opts.npu_memory_mb,
    )?;
    Ok((path, model, session))
}

impl Assistant {
    /// Open (or create) the index; the LLM is loaded on the first question.
    pub fn open(opts: AssistantOptions) -> Result<Self> {
        let preloading = opts.preload_model.then(|| {
            let opts = opts.clone();
            std::thread::spawn(move || load_model_file(&opts))
        });
        let embedder: Option<Arc<dyn Embedder>> = if opts.dense {
            // The embedder the index was built with (MiniLM for a new one).
            let name = crate::embed::choose_embedder(&opts.index_dir, None)?;
            models::ensure(&name)?;
            Some(crate::embed::load_named(&name)?)
        } else {
            None
        };
        let index = Index::open(&opts.index_dir, embedder)
            .with_context(|| format!("opening the index at {}", opts.index_dir.display()))?;
        Ok(Assistant {
            opts,
            index,
            llm: OnceLock::new(),
            llm_init: Mutex::new(()),
            preloading: Mutex::new(preloading),
        })
    }

    pub fn index(&self) -> &Index {
        &self.index
    }

    pub fn options(&self) -> &AssistantOptions {
        &self.opts
    }

    /// Add or update documents (incremental: unchanged content is not re-embedded).
    pub fn add_paths(
        &self,
        paths: &[PathBuf],
        opts: &IndexOptions,
        progress: &dyn Fn(IndexProgress),
    ) -> Result<IndexSummary> {
        self.index.add_paths(paths, opts, progress)
    }

    /// Remove a file (or every file under a folder) from the index.
    pub fn remove_path(&self, path: &Path) -> Result<usize> {
        self.index.remove_path(path)
    }

    pub fn retrieve(&self, query: &str, k: usize, mode: SearchMode) -> Result<Vec<Hit>> {
        self.index.search(query, k, mode)
    }

    /// Retrieve, assemble a cited prompt, and stream the answer to `on_text`
    /// (return `false` from it to stop).
    pub fn ask(
        &self,
        question: &str,
        opts: &AskOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Answer> {
        let started = Instant::now();
        let hits = self.index.search(question, opts.top_k, opts.mode)?;
        let retrieve_ms = ms(started);
        let llm = self.llm()?;
        let (messages, cited) = cited_prompt(&llm, question, &hits, opts);
        let mut answer = self.generate(&llm, &messages, opts, started, on_text)?;
        answer.sources = cited;
        answer.timings.retrieve_ms = retrieve_ms;
        Ok(answer)
    }

    /// The prompt [`Assistant::ask`] would feed the model for `question` (retrieval, numbered
    /// sources under the budget, chat template), without generating: for inspection, and to
    /// check that retrieved text stays data.
    pub fn build_prompt(&self, question: &str, opts: &AskOptions) -> Result<BuiltPrompt> {
        let hits = self.index.search(question, opts.top_k, opts.mode)?;
        let llm = self.llm()?;
        let (messages, sources) = cited_prompt(&llm, question, &hits, opts);
        let template = llm.model.chat_template();
        let tokens = template.encode_chat(llm.model.tokenizer(), &messages, true)?;
        let text = template.render(&messages, true)?;
        Ok(BuiltPrompt {
            messages,
            tokens,
            text,
            sources,
        })
    }

    /// Ask with caller-supplied context instead of retrieval (a UI agent passes the current
    /// screen); `system` optionally becomes the system message. The context is data: it is
    /// tokenized without special tokens, like retrieved text.
    ///
    /// ```no_run
    /// use rag::assistant::{AskOptions, Assistant, AssistantOptions};
    /// let mut opts = AssistantOptions::new(".rag-index");
    /// opts.dense = false; // no retrieval needed: no embedder
    /// let agent = Assistant::open(opts)?;
    /// let screen = "<button id=3>Send</button>\n<input id=4>To</input>";
    /// let answer = agent.ask_with_context(
    ///     "Task: send the draft. Next action?",
    ///     screen,
    ///     Some("Reply with one action: click(ID) or input(ID, \"text\")."),
    ///     &AskOptions { max_tokens: 16, ..Default::default() },
    ///     &mut |_| true,
    /// )?;
    /// println!("{}", answer.answer);
    /// # Ok::<(), anyhow::Error>(())
    /// ```
    pub fn ask_with_context(
        &self,
        question: &str,
        context: &str,
        system: Option<&str>,
        opts: &AskOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Answer> {
        let started = Instant::now();
        let llm = self.llm()?;
        let messages = prompt::with_context(question, context, system);
        self.generate(&llm, &messages, opts, started, on_text)
    }

    /// Answer the last user message of a caller's chat (OpenAI-style: system messages,
    /// earlier turns, the question last). With `retrieve`, the last message becomes the
    /// numbered-sources turn of [`Assistant::ask`] (the caller's system messages follow
    /// ours, earlier turns are kept as they are); without, the messages go to the model's
    /// chat template unchanged and `sources` is empty.
    ///
    /// The search query is [`prompt::search_query`] of the messages: the last user message,
    /// preceded by the user's previous one, so that a follow-up ("how long does it take?")
    /// is searched with its subject.
    pub fn chat(
        &self,
        messages: &[ChatMessage],
        retrieve: bool,
        opts: &AskOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Answer> {
        let query = retrieve.then(|| prompt::search_query(messages));
        self.chat_with_query(messages, query.as_deref(), opts, on_text)
    }

    /// [`Assistant::chat`] with the search query given (`None`: no retrieval): the
    /// sources come from searching `query`, the prompt is built as `chat` builds it.
    pub fn chat_with_query(
        &self,
        messages: &[ChatMessage],
        query: Option<&str>,
        opts: &AskOptions,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Answer> {
        let started = Instant::now();
        anyhow::ensure!(!messages.is_empty(), "the chat has no messages");
        let Some(query) = query else {
            let llm = self.llm()?;
            return self.generate(&llm, messages, opts, started, on_text);
        };
        let question = match messages.last() {
            Some(m) if m.role == "user" => m.content.as_str(),
            _ => anyhow::bail!("with retrieval, the last message must be the user's question"),
        };
        let hits = self.index.search(query, opts.top_k, opts.mode)?;
        let retrieve_ms = ms(started);
        let llm = self.llm()?;
        let (cited_messages, cited) = cited_prompt(&llm, question, &hits, opts);
        let merged = prompt::with_history(messages, cited_messages);
        let mut answer = self.generate(&llm, &merged, opts, started, on_text)?;
        answer.sources = cited;
        answer.timings.retrieve_ms = retrieve_ms;
        Ok(answer)
    }

    /// Async-friendly streaming: the answer arrives as [`AskEvent`]s on a tokio channel
    /// (`Text` pieces, then one `Done` with the full [`Answer`], or one `Error`); the
    /// returned [`CancelToken`] stops generation at the next token (the `Done` answer then
    /// has `cancelled: true`), and so does dropping the receiver. Generation runs on
    /// tokio's blocking pool when called inside a runtime, on a plain thread otherwise, so
    /// an async task awaiting `recv` is never blocked.
    ///
    /// ```no_run
    /// use rag::assistant::{AskEvent, AskOptions, Assistant, AssistantOptions};
    /// use std::sync::Arc;
    /// # async fn demo() -> anyhow::Result<()> {
    /// let assistant = Arc::new(Assistant::open(AssistantOptions::new(".rag-index"))?);
    /// let (mut events, cancel) =
    ///     assistant.ask_stream("How long is the warranty?".into(), AskOptions::default());
    /// let mut pieces = 0;
    /// while let Some(event) = events.recv().await {
    ///     match event {
    ///         AskEvent::Text(piece) => {
    ///             print!("{piece}");
    ///             pieces += 1;
    ///             if pieces == 50 {
    ///                 cancel.cancel(); // e.g. the user pressed Stop
    ///             }
    ///         }
    ///         AskEvent::Done(answer) => println!("\n{} sources", answer.sources.len()),
    ///         AskEvent::Error(e) => eprintln!("{e}"),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn ask_stream(
        self: &Arc<Self>,
        question: String,
        opts: AskOptions,
    ) -> (tokio::sync::mpsc::UnboundedReceiver<AskEvent>, CancelToken) {
        self.stream(opts, move |me, opts, send| me.ask(&question, opts, send))
    }

    /// [`Assistant::chat`] as [`Assistant::ask_stream`] streams [`Assistant::ask`].
    pub fn chat_stream(
        self: &Arc<Self>,
        messages: Vec<ChatMessage>,
        retrieve: bool,
        opts: AskOptions,
    ) -> (tokio::sync::mpsc::UnboundedReceiver<AskEvent>, CancelToken) {
        self.stream(opts, move |me, opts, send| {
            me.chat(&messages, retrieve, opts, send)
        })
    }

    /// Runs `answer` off the caller's thread, its text and result sent as [`AskEvent`]s.
    fn stream(
        self: &Arc<Self>,
        mut opts: AskOptions,
        answer: impl FnOnce(&Assistant, &AskOptions, &mut dyn FnMut(&str) -> bool) -> Result<Answer>
            + Send
            + 'static,
    ) -> (tokio::sync::mpsc::UnboundedReceiver<AskEvent>, CancelToken) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let cancel = opts.cancel.get_or_insert_with(CancelToken::default).clone();
        let me = Arc::clone(self);
        let job = move || {
            let mut send = |s: &str| tx.send(AskEvent::Text(s.to_owned())).is_ok();
            let event = match answer(&me, &opts, &mut send) {
                Ok(a) => AskEvent::Done(Box::new(a)),
                Err(e) => AskEvent::Error(format!("{e:#}")),
            };
            let _ = tx.send(event);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(job);
            }
            Err(_) => {
                std::thread::spawn(job);
            }
        }
        (rx, cancel)
    }

    /// The chat-formatted token ids of `messages` for this assistant's model.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        let llm = self.llm()?;
        Ok(llm
            .model
            .chat_template()
            .encode_chat(llm.model.tokenizer(), messages, true)?)
    }

    /// Load the generation model now instead of on the first question (callers that time
    /// questions, or want the load to overlap other work).
    pub fn load_model(&self) -> Result<()> {
        self.llm().map(|_| ())
    }

    /// Waits for work that outlives an answer: writing the repacked-weights cache after
    /// the model's first load. A short-lived process (the CLI) calls this before exiting so
    /// the next run finds the cache; a long-lived one need not.
    /// `on_wait` is told what is being waited for, only if something is.
    pub fn finish_background_work(&self, on_wait: impl FnOnce(&str)) {
        if let Some(l) = self.llm.get() {
            if let Some(note) = l.model.weights_cache().writing_note() {
                on_wait(&note);
            }
            l.model.wait_weights_cache();
        }
    }

    /// Name or path of the generation model.
    pub fn model_name(&self) -> &str {
        &self.opts.model
    }

    fn llm(&self) -> Result<Arc<Llm>> {
        if let Some(l) = self.llm.get() {
            return Ok(Arc::clone(l));
        }
        let _guard = self
            .llm_init
            .lock()
            .map_err(|_| anyhow!("model loader poisoned"))?;
        if let Some(l) = self.llm.get() {
            return Ok(Arc::clone(l));
        }
        let llm = Arc::new(self.load_llm()?);
        let _ = self.llm.set(Arc::clone(&llm));
        Ok(llm)
    }

    fn load_llm(&self) -> Result<Llm> {
        let pending = self
            .preloading
            .lock()
            .map_err(|_| anyhow!("model preloader poisoned"))?
            .take();
        let (path, model, session) = match pending {
            Some(handle) => handle
                .join()
                .map_err(|_| anyhow!("the model loading thread panicked"))??,
            None => load_model_file(&self.opts)?,
        };
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("model")
            .to_owned();
        let db_path = self.opts.index_dir.join(format!("tokendb-{stem}.bin"));
        let corpus_db = self.load_token_db(&db_path, model.tokenizer())?;
        let conversations_path = self.opts.index_dir.join(format!("convdb-{stem}.bin"));
        let conversations = TokenDb::open(
            &conversations_path,
            (self.opts.token_db_max_tokens / 4).max(1),
        )
        .unwrap_or_else(|_| TokenDb::new((self.opts.token_db_max_tokens / 4).max(1)));
        let sam = Arc::new(drafting_db(&corpus_db, &conversations).build_index());
        // Curves (and prompt-head KV rows) of another backend are kept apart.
        let backend = session.profile_tag();
        let curve_file = curve_cache::backend_cache_file(
            &npu_runtime::schedule::profile::cache_dir(),
            &path,
            model.threads(),
            &backend,
        );
        let curve_key = CurveKey::current(&path, model.threads())
            .ok()
            .map(|k| k.on_backend(&backend));
        // Without a valid cached curve the first answer uses `provisional_budget` and the
        // curve is profiled after it (see `ask`).
        let cached = curve_key
            .as_ref()
            .and_then(|k| curve_cache::load(&curve_file, k).ok());
        let curve_stored = cached.is_some();
        let head_file = prompt_head::file(&self.opts.index_dir, &stem);
        // Rows computed with another cache precision would not be what this session's
        // prefill computes, so the precision is part of the key.
        let head_key = match (&curve_key, self.opts.prompt_head_cache) {
            (Some(k), true) => Some(format!(
                "{} | {} | kv {}",
                k.model_fingerprint,
                k.engine,
                self.opts.kv_precision.name()
            )),
            _ => None,
        };
        let mut session = session;
        let mut committed = Vec::new();
        let mut head_stored = Vec::new();
        if let Some(key) = &head_key {
            let head = prompt_head::load(&head_file, key, kv_floats_per_token(&model));
            if let Some(head) = head.filter(|h| h.tokens.len() < session.kv_capacity() / 2) {
                match session.import_kv(head.tokens.len(), &head.rows) {
                    Ok(()) => {
                        committed = head.tokens.clone();
                        head_stored = head.tokens;
                    }
                    Err(e) => {
                        tracing::debug!("prompt head not restored: {e}");
                        session.truncate(0)?;
                    }
                }
            }
        }
        let cfg = GenConfig {
            cost_curve: cached,
            // Without a cached curve the first answer verifies 4-row drafts (cost(4) ~
            // cost(1) on every CPU measured) and the curve is profiled after it, not
            // before its first token.
            provisional_budget: Some(4),
            calib_window: self.opts.calib_window,
            ..GenConfig::default()
        };
        let mut generator = Generator::new(self.opts.spec, Some(sam), cfg);
        // Start from what the last process learned about its drafts (a fresh one would
        // verify single rows until its calibration had seen a few steps).
        if let Some(key) = curve_key.as_ref().filter(|_| curve_stored) {
            if let Err(e) = curve_cache::load_learned(&curve_cache::learned_file(&curve_file), key)
                .and_then(|l| generator.restore_learned(&l))
            {
                tracing::debug!("drafting starts unlearned: {e}");
            }
        }
        Ok(Llm {
            model,
            state: Mutex::new(GenState {
                session,
                committed,
                generator,
                corpus_db,
                conversations,
                conversations_path,
                curve_file,
                curve_key,
                curve_stored,
                head_file,
                head_key,
                head_stored,
            }),
            name: stem,
        })
    }

    /// The corpus part of the drafting database: the saved one if it matches the index
    /// generation, else rebuilt from the indexed chunks and saved.
    fn load_token_db(&self, path: &Path, tok: &Tokenizer) -> Result<TokenDb> {
        let generation = self.index.generation();
        let gen_path = path.with_extension("generation");
        let saved_gen = std::fs::read_to_string(&gen_path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if saved_gen == Some(generation) {
            if let Ok(db) = TokenDb::open(path, self.opts.token_db_max_tokens) {
                return Ok(db);
            }
        }
        let mut db = TokenDb::new(self.opts.token_db_max_tokens);
        self.index.for_each_chunk_text(&mut |_, text| {
            if let Ok(ids) = tok.encode(text, false) {
                db.add(&ids);
            }
        })?;
        if std::fs::create_dir_all(&self.opts.index_dir).is_ok() && db.save(path).is_ok() {
            let _ = std::fs::write(&gen_path, generation.to_string());
        }
        Ok(db)
    }

    fn generate(
        &self,
        llm: &Llm,
        messages: &[ChatMessage],
        opts: &AskOptions,
        started: Instant,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Answer> {
        let prompt =
            llm.model
                .chat_template()
                .encode_chat(llm.model.tokenizer(), messages, true)?;
        // The constant head: what this prompt shares with the same messages ending in
        // another text (chat template and system message). The cache never fails a question.
        let head = match messages.split_last() {
            Some((last, rest)) if self.opts.prompt_head_cache => {
                let mut probe = rest.to_vec();
                probe.push(ChatMessage {
                    role: last.role.clone(),
                    content: "\u{1}".into(),
                });
                llm.model
                    .chat_template()
                    .encode_chat(llm.model.tokenizer(), &probe, true)
                    .map_or(0, |probe| prompt_head::common_prefix(&prompt, &probe))
            }
            _ => 0,
        };
        let mut guard = llm
            .state
            .lock()
            .map_err(|_| anyhow!("generation state poisoned"))?;
        let st = &mut *guard;
        anyhow::ensure!(
            !prompt.is_empty(),
            "the chat template produced an empty prompt"
        );
        if prompt.len() + opts.max_tokens.min(64) >= st.session.kv_capacity() {
            anyhow::bail!(
                "the prompt has {} tokens but the context holds {}: lower --top-k or the context budget",
                prompt.len(),
                st.session.kv_capacity()
            );
        }
        // Reuse the KV of the longest common prefix with the previous prompt (system
        // prompt, agent instructions); at least one token is always prefilled.
        let common = prompt_head::common_prefix(&st.committed, &prompt).min(prompt.len() - 1);
        st.session.truncate(common)?;
        st.committed.truncate(common);

        let stopped = Cell::new(false);
        let cancel = opts.cancel.clone();
        let tokenizer = llm.model.tokenizer();
        let should_stop = || stopped.get() || stopped_flag(&cancel);
        let room = st.session.kv_capacity() - prompt.len() - 1;
        let mut first_token_ms = 0.0;
        let text;
        let mut candidates = Vec::new();
        let gen = if opts.samples > 1 {
            // Every sample's tokens are held in the KV cache until the end.
            let max_tokens = opts.max_tokens.min(room / opts.samples);
            let mut texts: Vec<StopText> = (0..opts.samples)
                .map(|_| StopText::new(&opts.stop))
                .collect();
            let mut on_token = |b: usize, id: u32| {
                let t = &mut texts[b];
                t.push(tokenizer.piece(id));
                !t.stop.stopped() && !stopped_flag(&cancel)
            };
            let (outs, stats) = st
                .session
                .generate_samples(
                    &prompt[common..],
                    opts.samples,
                    max_tokens,
                    &opts.sampling,
                    &mut on_token,
                )
                .map_err(|e| {
                    st.committed.clear();
                    let _ = st.session.truncate(0);
                    anyhow!("generation failed: {e}")
                })?;
            candidates = texts
                .iter_mut()
                .zip(&outs)
                .map(|(t, o)| Candidate {
                    text: {
                        t.finish();
                        t.text.trim().to_owned()
                    },
                    mean_logprob: o.mean_logprob(),
                    votes: 0,
                    tokens: o.tokens.len(),
                    verify: None,
                })
                .collect();
            if opts.select == Selector::Verify {
                verify_candidates(&mut *st.session, llm, messages, &prompt, &mut candidates)
                    .map_err(|e| {
                        st.committed.clear();
                        let _ = st.session.truncate(0);
                        anyhow!("verifying the samples failed: {e}")
                    })?;
            }
            let chosen = select::select(&mut candidates, opts.select, opts.vote_key.as_ref());
            text = candidates[chosen].text.clone();
            first_token_ms = ms(started);
            if !should_stop() && !text.is_empty() && !on_text(&text) {
                stopped.set(true);
            }
            let decode_tokens = stats.generated;
            Generated {
                tokens: outs[chosen].tokens.clone(),
                prefill_ms: stats.prefill_ms,
                decode_ms: stats.decode_ms,
                decode_tokens,
                steps: stats.steps,
                mean_accepted: 1.0,
                mode: "samples",
            }
        } else {
            let mut out = StopText::new(&opts.stop);
            let ended = Cell::new(false);
            let mut on_token = |id: u32| {
                if stopped.get() || ended.get() {
                    return;
                }
                let shown = out.push(tokenizer.piece(id));
                ended.set(out.stop.stopped());
                if !shown.is_empty() {
                    if first_token_ms == 0.0 {
                        first_token_ms = ms(started);
                    }
                    if !on_text(&shown) {
                        stopped.set(true);
                    }
                }
            };
            let max_tokens = opts.max_tokens.min(room);
            let result = st.generator.generate_sampled(
                &mut *st.session,
                &prompt[common..],
                max_tokens,
                &opts.sampling,
                &mut on_token,
                &|| should_stop() || ended.get(),
            );
            let (tokens, metrics) = match result {
                Ok(r) => r,
                Err(e) => {
                    // Leave a clean session behind: the next question re-prefills.
                    st.committed.clear();
                    let _ = st.session.truncate(0);
                    return Err(anyhow!("generation failed: {e}"));
                }
            };
            // A cancelled answer ends with the text already shown.
            if !stopped.get() {
                let rest = out.finish();
                if !rest.is_empty() {
                    on_text(&rest);
                }
            }
            text = out.text;
            Generated {
                tokens,
                prefill_ms: metrics.prefill_ms,
                decode_ms: metrics.decode_ms,
                decode_tokens: metrics.decode_tokens(),
                steps: metrics.steps,
                mean_accepted: metrics.mean_accepted(),
                mode: st.generator.mode().name(),
            }
        };
        let tokens = &gen.tokens;
        st.committed.extend_from_slice(&prompt[common..]);
        st.committed.extend_from_slice(tokens);
        // The session may hold one more token than `committed` (the last emitted one is
        // not yet fed back); keep them consistent for the next prefix match.
        st.session
            .truncate(st.committed.len().min(st.session.n_past()))?;
        st.committed.truncate(st.session.n_past());

        // Keep this prompt's head for the next process, unless the file already holds it
        // (a head of a few tokens is not worth a file).
        if head >= MIN_HEAD_TOKENS && st.head_stored[..] != prompt[..head] {
            if let Some(key) = st.head_key.clone() {
                let saved = st.session.export_kv(head).map(|rows| PromptHead {
                    tokens: prompt[..head].to_vec(),
                    rows,
                });
                match saved.map(|h| prompt_head::store(&st.head_file, &key, &h).map(|_| h)) {
                    Ok(Ok(h)) => st.head_stored = h.tokens,
                    Ok(Err(e)) => tracing::warn!("could not cache the prompt head: {e}"),
                    Err(e) => tracing::warn!("could not export the prompt head: {e}"),
                }
            }
        }

        // Without a cached verify-cost curve, profile it now that the answer is out (at
        // this depth, nothing committed) and keep it for the next run.
        if st.generator.cost_curve().is_none() {
            let GenState {
                generator,
                session,
                committed,
                ..
            } = &mut *st;
            let pending = committed.last().copied().unwrap_or(0);
            if let Err(e) = generator.profile_curve(&mut **session, pending) {
                tracing::warn!("could not profile the verify-cost curve: {e}");
            }
        }
        if !st.curve_stored {
            let stored = match (&st.curve_key, st.generator.cost_curve()) {
                (Some(key), Some(curve)) => {
                    if let Err(e) = curve_cache::store(&st.curve_file, key, curve) {
                        tracing::warn!("could not cache the verify-cost curve: {e}");
                    }
                    true
                }
                _ => false,
            };
            st.curve_stored = stored;
        }
        if let (Some(key), true) = (&st.curve_key, st.curve_stored) {
            let file = curve_cache::learned_file(&st.curve_file);
            if let Err(e) = curve_cache::store_learned(&file, key, &st.generator.learned()) {
                tracing::warn!("could not keep what drafting learned: {e}");
            }
        }

        // Grow the drafting database with the finished interaction: the answer only (the
        // question's sources are corpus chunks already in the database).
        if !tokens.is_empty() {
            st.conversations.add(tokens);
            if let Some(dir) = st.conversations_path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(e) = st.conversations.save(&st.conversations_path) {
                tracing::warn!("could not save the conversation token database: {e}");
            }
            let db = drafting_db(&st.corpus_db, &st.conversations);
            st.generator.set_database(Some(Arc::new(db.build_index())));
        }

        Ok(Answer {
            answer: text.trim().to_owned(),
            sources: Vec::new(),
            timings: Timings {
                retrieve_ms: 0.0,
                prefill_ms: gen.prefill_ms,
                decode_ms: gen.decode_ms,
                decode_tok_s: if gen.decode_ms > 0.0 {
                    gen.decode_tokens as f64 / (gen.decode_ms / 1e3)
                } else {
                    0.0
                },
                first_token_ms,
                switching: st.session.switch_report(),
            },
            tokens_generated: tokens.len(),
            prompt_tokens: prompt.len(),
            reused_prompt_tokens: common,
            cancelled: stopped.get() || stopped_flag(&cancel),
            backend: st.session.backend_name(),
            speculation: SpecSummary {
                mode: gen.mode,
                steps: gen.steps,
                mean_accepted: gen.mean_accepted,
            },
            candidates,
        })
    }
}

/// The question [`Selector::Verify`] asks after each sampled answer.
const VERIFY_QUESTION: &str =
    "Is your answer above correct and complete? Reply with Yes or No only.";

/// Scores each distinct candidate with the model's log-odds of "Yes" over "No" when asked
/// [`VERIFY_QUESTION`] after it. `session` holds `prompt` committed; afterwards it holds the
/// longest prefix of `prompt` that every verification prompt shares (usually all of it).
fn verify_candidates(
    session: &mut dyn Engine,
    llm: &Llm,
    messages: &[ChatMessage],
    prompt: &[u32],
    candidates: &mut [Candidate],
) -> Result<()> {
    let tokenizer = llm.model.tokenizer();
    let first_id = |w: &str| -> Result<u32> {
        tokenizer
            .encode(w, false)?
            .first()
            .copied()
            .with_context(|| format!("`{w}` encodes to no token"))
    };
    let (yes, no) = (first_id("Yes")?, first_id("No")?);
    let mut scored: Vec<(String, f64)> = Vec::new();
    let mut out = specdec::PrefillOut::default();
    // Rows past the prompt's longest prefix shared with every question are overwritten.
    let mut intact = prompt.len();
    for c in candidates.iter_mut() {
        if let Some(&(_, s)) = scored.iter().find(|(t, _)| *t == c.text) {
            c.verify = Some(s);
            continue;
        }
        let mut asked = messages.to_vec();
        asked.push(ChatMessage {
            role: "assistant".into(),
            content: c.text.clone(),
        });
        asked.push(ChatMessage {
            role: "user".into(),
            content: VERIFY_QUESTION.into(),
        });
        let tokens = llm
            .model
            .chat_template()
            .encode_chat(tokenizer, &asked, true)?;
        let common = prompt_head::common_prefix(prompt, &tokens).min(tokens.len() - 1);
        anyhow::ensure!(
            tokens.len() < session.kv_capacity(),
            "the verification prompt does not fit the context"
        );
        intact = intact.min(common);
        session.truncate(common)?;
        session.prefill(&tokens[common..], 0, &mut out)?;
        let (Some(&y), Some(&n)) = (out.logits.get(yes as usize), out.logits.get(no as usize))
        else {
            anyhow::bail!("the engine returned no logits to score the answer");
        };
        let s = (y - n) as f64;
        c.verify = Some(s);
        scored.push((c.text.clone(), s));
    }
    // Back to the part of the prompt still in the cache.
    session.truncate(session.n_past().min(intact))?;
    Ok(())
}

/// What a generation produced, whichever path ran.
struct Generated {
    tokens: Vec<u32>,
    prefill_ms: f64,
    decode_ms: f64,
    /// Tokens decoded after the prefill (every sample's, for several).
    decode_tokens: usize,
    steps: usize,
    mean_accepted: f64,
    mode: &'static str,
}

/// Token bytes to text, cut before the first stop sequence; `text` holds all it released.
struct StopText {
    utf8: Utf8Stream,
    stop: StopMatcher,
    text: String,
}

impl StopText {
    fn new(stops: &[String]) -> Self {
        StopText {
            utf8: Utf8Stream::default(),
            stop: StopMatcher::new(stops.to_vec()),
            text: String::new(),
        }
    }

    /// Adds a token's bytes; returns the text that may be shown now.
    fn push(&mut self, bytes: &[u8]) -> String {
        let shown = match self.utf8.push(bytes) {
            Some(piece) => self.stop.push(&piece),
            None => String::new(),
        };
        self.text.push_str(&shown);
        shown
    }

    /// The text held back once generation has ended.
    fn finish(&mut self) -> String {
        let tail = self.utf8.finish();
        let mut rest = self.stop.push(&tail);
        if !self.stop.stopped() {
            rest.push_str(&self.stop.finish());
        }
        self.text.push_str(&rest);
        rest
    }
}

/// Turns token bytes into text as soon as they form whole UTF-8 characters (a character
/// can be split across byte-level BPE tokens).
#[derive(Default)]
struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    fn push(&mut self, bytes: &[u8]) -> Option<String> {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // An incomplete sequence at the end waits for the next token; an invalid one
            // in the middle can never become valid and is replaced.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => {
                let s = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                return Some(s);
            }
        };
        if valid == 0 {
            return None;
        }
        let s = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        Some(s)
    }

    fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// Corpus chunks plus past answers, bounded like either part.
fn drafting_db(corpus: &TokenDb, conversations: &TokenDb) -> TokenDb {
    let mut db = TokenDb::new(corpus.max_tokens() + conversations.max_tokens());
    db.ingest(corpus);
    db.ingest(conversations);
    db
}

/// The numbered-sources prompt for `question` over `hits` (best first), and the sources
/// that fit the context budget, in citation order.
fn cited_prompt(
    llm: &Llm,
    question: &str,
    hits: &[Hit],
    opts: &AskOptions,
) -> (Vec<ChatMessage>, Vec<Source>) {
    let sources: Vec<PromptSource> = hits
        .iter()
        .map(|h| PromptSource {
            // The model sees the file name only: full paths are noise it tends to copy.
            label: location(file_name(&h.path), h.lines, h.page),
            heading: h.heading.clone(),
            text: h.text.clone(),
        })
        .collect();
    let count = |s: &str| {
        llm.model
            .tokenizer()
            .encode(s, false)
            .map(|t| t.len())
            .unwrap_or(s.len())
    };
    let assembled = prompt::assemble(question, &sources, opts.context_tokens, &count);
    let cited = assembled
        .used
        .iter()
        .enumerate()
        .map(|(n, &i)| Source {
            number: n + 1,
            path: hits[i].path.clone(),
            lines: hits[i].lines,
            page: hits[i].page,
            chunk_id: hits[i].chunk_id,
            score: hits[i].score,
        })
        .collect();
    (assembled.messages, cited)
}

fn file_name(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path)
}

fn stopped_flag(cancel: &Option<CancelToken>) -> bool {
    cancel.as_ref().is_some_and(|c| c.is_cancelled())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl std::fmt::Debug for Assistant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assistant")
            .field("index_dir", &self.opts.index_dir)
            .field("model", &self.opts.model)
            .field("llm_loaded", &self.llm.get().map(|l| l.name.clone()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_prefer_pages_then_lines() {
        assert_eq!(location("a.pdf", None, Some(3)), "a.pdf#3");
        assert_eq!(location("a.md", Some((10, 24)), None), "a.md:10-24");
        assert_eq!(location("a.txt", None, None), "a.txt");
    }

    #[test]
    fn cancel_token_is_shared_between_clones() {
        let t = CancelToken::default();
        let u = t.clone();
        assert!(!u.is_cancelled());
        t.cancel();
        assert!(u.is_cancelled());
    }

    #[test]
    fn utf8_stream_holds_back_split_characters() {
        let mut u = Utf8Stream::default();
        let snow = "é☃".as_bytes();
        assert_eq!(u.push(&snow[..1]), None);
        assert_eq!(u.push(&snow[1..3]).as_deref(), Some("é"));
        assert_eq!(u.push(&snow[3..]).as_deref(), Some("☃"));
        assert_eq!(u.push(&[0xff, b'a']).as_deref(), Some("\u{fffd}a"));
        assert_eq!(u.push(&[0xe2]), None);
        assert_eq!(u.finish(), "\u{fffd}");
    }

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn assistant_is_shareable_across_threads() {
        assert_send_sync::<Assistant>();
    }
}
