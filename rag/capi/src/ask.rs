//! Answers: `rag_ask`, `rag_ask_with_context`, the streaming callback and cancellation
//! (shared with `rag_chat`).

use crate::guard::{arg, contain, free_c_string, owned_c_string};
use crate::handle::{handle, RagAssistant};
use rag::assistant::{Answer, AskOptions, Sampling};
use rag::select::Selector;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI32, Ordering};

/// Per-question knobs; start from `rag_ask_options_default()`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RagAskOptions {
    /// Passages retrieved for the prompt (`rag_ask`; `rag_chat` with retrieval).
    pub top_k: usize,
    /// Token budget of the numbered sources in the prompt (as `top_k`).
    pub context_tokens: usize,
    /// Most tokens generated.
    pub max_tokens: usize,
    /// 0: greedy decoding. In (0, 2]: sampled at this temperature, reproducibly for a
    /// given `seed` (speculation does not change a sampled answer).
    pub temperature: f32,
    /// Nucleus of the sampling, in (0, 1].
    pub top_p: f32,
    pub seed: u64,
    /// Answers sampled together in one batched decode (1 to 16), of which `select` keeps
    /// one; 1 is a single answer. With more than one the text arrives in one piece.
    pub samples: u32,
    /// Which sample is kept: `RAG_SELECT_VOTE` (the answer most samples agree on),
    /// `RAG_SELECT_LOGPROB` (the most confident) or `RAG_SELECT_VERIFY` (the one the
    /// model judges correct when asked after each).
    pub select: u32,
}

/// `RagAskOptions::select`: the majority answer.
pub const RAG_SELECT_VOTE: u32 = 0;
/// `RagAskOptions::select`: the highest mean log-probability per token.
pub const RAG_SELECT_LOGPROB: u32 = 1;
/// `RagAskOptions::select`: the answer the model itself judges correct.
pub const RAG_SELECT_VERIFY: u32 = 2;
/// Most `RagAskOptions::samples`.
pub const RAG_MAX_SAMPLES: u32 = 16;

/// The defaults: 5 passages, 1024 source tokens, 256 generated tokens, greedy (top-p 1,
/// seed 0), one answer.
#[no_mangle]
pub extern "C" fn rag_ask_options_default() -> RagAskOptions {
    let d = AskOptions::default();
    RagAskOptions {
        top_k: d.top_k,
        context_tokens: d.context_tokens,
        max_tokens: d.max_tokens,
        temperature: d.sampling.temperature,
        top_p: d.sampling.top_p,
        seed: d.sampling.seed,
        samples: 1,
        select: RAG_SELECT_VOTE,
    }
}

/// Receives each piece of the answer as it is generated: `len` bytes of UTF-8 at `piece`
/// (NUL-terminated too; valid only during the call). Return true to go on, false to stop.
/// Called on the thread that called `rag_ask` (or `rag_ask_with_context`, `rag_chat`).
pub type RagTextCallback =
    Option<unsafe extern "C" fn(piece: *const c_char, len: usize, user_data: *mut c_void) -> bool>;

/// A passage that was put in the prompt. Its strings belong to the answer.
#[repr(C)]
pub struct RagSource {
    /// The number the answer cites it by ([1] is the first).
    pub number: u32,
    pub path: *mut c_char,
    /// First and last line; both 0 for PDF pages and HTML.
    pub line_first: u32,
    pub line_last: u32,
    /// PDF page; 0 otherwise.
    pub page: u32,
    pub chunk_id: i64,
    pub score: f32,
}

/// A finished answer; free it with `rag_answer_free`.
#[repr(C)]
pub struct RagAnswer {
    /// The generated text, trimmed.
    pub text: *mut c_char,
    /// The passages put in the prompt, in citation order (none for `rag_ask_with_context`
    /// and for `rag_chat` without retrieval).
    pub sources: *mut RagSource,
    pub n_sources: usize,
    pub tokens_generated: usize,
    pub prompt_tokens: usize,
    /// Stopped early: the callback returned false or the cancel flag was set.
    pub cancelled: bool,
    pub retrieve_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub decode_tok_s: f64,
    /// From the call to the first piece of text (includes loading the model on first use).
    pub first_token_ms: f64,
}

/// Hands each piece to the C callback, stopping when it says so or the flag is set.
pub(crate) struct Stream {
    callback: RagTextCallback,
    user_data: *mut c_void,
    cancel: *const i32,
    buf: Vec<u8>,
}

impl Stream {
    pub(crate) fn new(
        callback: RagTextCallback,
        user_data: *mut c_void,
        cancel: *const i32,
    ) -> Self {
        Stream {
            callback,
            user_data,
            cancel,
            buf: Vec::new(),
        }
    }

    fn cancelled(&self) -> bool {
        if self.cancel.is_null() {
            return false;
        }
        // SAFETY: not NULL; the caller's flag is a 4-byte aligned int32 that lives for the
        // call and is only written atomically (the header's contract).
        unsafe { AtomicI32::from_ptr(self.cancel.cast_mut()) }.load(Ordering::SeqCst) != 0
    }

    pub(crate) fn push(&mut self, piece: &str) -> bool {
        if self.cancelled() {
            return false;
        }
        let Some(cb) = self.callback else {
            return true;
        };
        self.buf.clear();
        self.buf.extend_from_slice(piece.as_bytes());
        self.buf.push(0);
        // SAFETY: a callback the caller supplied, given a NUL-terminated buffer that lives
        // for the call and the caller's own user_data.
        let go_on = unsafe { cb(self.buf.as_ptr().cast(), piece.len(), self.user_data) };
        go_on && !self.cancelled()
    }
}

pub(crate) fn answer_to_c(a: Answer) -> *mut RagAnswer {
    let sources: Box<[RagSource]> = a
        .sources
        .iter()
        .map(|s| RagSource {
            number: s.number as u32,
            path: owned_c_string(&s.path),
            line_first: s.lines.map_or(0, |l| l.0),
            line_last: s.lines.map_or(0, |l| l.1),
            page: s.page.unwrap_or(0),
            chunk_id: s.chunk_id,
            score: s.score,
        })
        .collect();
    let n_sources = sources.len();
    Box::into_raw(Box::new(RagAnswer {
        text: owned_c_string(&a.answer),
        sources: Box::into_raw(sources).cast::<RagSource>(),
        n_sources,
        tokens_generated: a.tokens_generated,
        prompt_tokens: a.prompt_tokens,
        cancelled: a.cancelled,
        retrieve_ms: a.timings.retrieve_ms,
        prefill_ms: a.timings.prefill_ms,
        decode_ms: a.timings.decode_ms,
        decode_tok_s: a.timings.decode_tok_s,
        first_token_ms: a.timings.first_token_ms,
    }))
}

pub(crate) fn ask_options(opts: *const RagAskOptions) -> anyhow::Result<AskOptions> {
    // SAFETY: NULL or a valid options struct (the caller's contract).
    let o = unsafe { opts.as_ref() }
        .copied()
        .unwrap_or_else(|| rag_ask_options_default());
    anyhow::ensure!(
        o.temperature <= 2.0,
        "temperature {} is over 2",
        o.temperature
    );
    anyhow::ensure!(
        (1..=RAG_MAX_SAMPLES).contains(&o.samples),
        "samples {} is not between 1 and {RAG_MAX_SAMPLES}",
        o.samples
    );
    let select = match o.select {
        RAG_SELECT_VOTE => Selector::Vote,
        RAG_SELECT_LOGPROB => Selector::Logprob,
        RAG_SELECT_VERIFY => Selector::Verify,
        other => anyhow::bail!("select {other} is not RAG_SELECT_VOTE, _LOGPROB or _VERIFY"),
    };
    Ok(AskOptions {
        top_k: o.top_k,
        context_tokens: o.context_tokens,
        max_tokens: o.max_tokens,
        sampling: Sampling::new(o.temperature, o.top_p, o.seed)?,
        samples: o.samples as usize,
        select,
        ..AskOptions::default()
    })
}

/// Retrieves passages for `question`, prompts the model with them as numbered sources and
/// generates the answer, streaming it to `on_text` (may be NULL). Generation stops at the
/// next piece of text once `on_text` returns false or `*cancel` (may be NULL) is nonzero;
/// set the flag from any thread with an atomic store (C11 `atomic_store`).
///
/// Returns the answer to free with `rag_answer_free`, or NULL with `*error` set.
///
/// # Safety
/// `question` is a NUL-terminated string; `opts` is NULL or valid; `cancel` is NULL or an
/// aligned int32 living for the call; `error` as in `rag_open`.
#[no_mangle]
pub unsafe extern "C" fn rag_ask(
    assistant: *const RagAssistant,
    question: *const c_char,
    opts: *const RagAskOptions,
    on_text: RagTextCallback,
    user_data: *mut c_void,
    cancel: *const i32,
    error: *mut *mut c_char,
) -> *mut RagAnswer {
    contain(error, std::ptr::null_mut(), || {
        let a = handle(assistant)?;
        let question = arg(question, "question")?;
        let mut stream = Stream::new(on_text, user_data, cancel);
        let answer = a.ask(question, &ask_options(opts)?, &mut |p| stream.push(p))?;
        Ok(answer_to_c(answer))
    })
}

/// Like `rag_ask`, over caller-supplied `context` (a UI agent's screen) instead of retrieved
/// passages; `system` (may be NULL) replaces the system message. The context is data: it
/// is tokenized without special tokens.
///
/// # Safety
/// As `rag_ask`; `context` is a NUL-terminated string, `system` too unless NULL.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // a C signature
pub unsafe extern "C" fn rag_ask_with_context(
    assistant: *const RagAssistant,
    question: *const c_char,
    context: *const c_char,
    system: *const c_char,
    opts: *const RagAskOptions,
    on_text: RagTextCallback,
    user_data: *mut c_void,
    cancel: *const i32,
    error: *mut *mut c_char,
) -> *mut RagAnswer {
    contain(error, std::ptr::null_mut(), || {
        let a = handle(assistant)?;
        let question = arg(question, "question")?;
        let context = arg(context, "context")?;
        let system = if system.is_null() {
            None
        } else {
            Some(arg(system, "system")?)
        };
        let mut stream = Stream::new(on_text, user_data, cancel);
        let answer =
            a.ask_with_context(question, context, system, &ask_options(opts)?, &mut |p| {
                stream.push(p)
            })?;
        Ok(answer_to_c(answer))
    })
}

/// Frees an answer and all its strings. NULL is ignored.
///
/// # Safety
/// `answer` is NULL or an answer from `rag_ask`, `rag_ask_with_context` or `rag_chat` not
/// yet freed.
#[no_mangle]
pub unsafe extern "C" fn rag_answer_free(answer: *mut RagAnswer) {
    if answer.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: from `Box::into_raw` in `answer_to_c`, freed once (the caller's contract);
        // the sources were a boxed slice of exactly `n_sources`.
        let a = unsafe { Box::from_raw(answer) };
        free_c_string(a.text);
        let sources =
            unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(a.sources, a.n_sources)) };
        for s in sources.iter() {
            free_c_string(s.path);
        }
    }));
}
