//! Conversations: `Assistant.chat`'s messages from Python, and `ragkit.Conversation`,
//! which keeps the history between questions as `rag chat` does.

use crate::assistant::{ask_options, with_samples, Assistant};
use crate::errors::{guarded, value_error};
use crate::stream::AskStream;
use crate::text_sink::TextSink;
use crate::types::Answer;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMapping, PyString};
use rag::assistant::ChatMessage;
use rag::prompt::{chat_role, CHAT_ROLES};
use std::sync::{Arc, Mutex, PoisonError};

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .qualname()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// One `{"role": ..., "content": ...}` mapping, checked.
fn message(i: usize, m: &Bound<'_, PyAny>) -> PyResult<ChatMessage> {
    let m = m.cast::<PyMapping>().map_err(|_| {
        PyTypeError::new_err(format!(
            "messages[{i}] must be a dict with 'role' and 'content', not {}",
            type_name(m)
        ))
    })?;
    let field = |key: &str| -> PyResult<String> {
        if !m.contains(key)? {
            return Err(value_error(format!("messages[{i}] has no '{key}'")));
        }
        let v = m.get_item(key)?;
        let s = v.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "messages[{i}]['{key}'] must be a str, not {}",
                type_name(&v)
            ))
        })?;
        Ok(s.to_cow()?.into_owned())
    };
    let role = field("role")?;
    let Some(known) = chat_role(&role) else {
        return Err(value_error(format!(
            "messages[{i}] has the unknown role {role:?} (roles: {CHAT_ROLES})"
        )));
    };
    Ok(ChatMessage {
        role: known.into(),
        content: field("content")?,
    })
}

/// A caller's chat as the engine takes it, with clean errors for what it cannot answer.
pub fn messages(messages: &Bound<'_, PyAny>, retrieval: bool) -> PyResult<Vec<ChatMessage>> {
    let not_a_list = || {
        PyTypeError::new_err(format!(
            "messages must be a list of {{'role': ..., 'content': ...}} dicts, not {}",
            type_name(messages)
        ))
    };
    if messages.is_instance_of::<PyString>() || messages.is_instance_of::<PyMapping>() {
        return Err(not_a_list());
    }
    let items = messages.try_iter().map_err(|_| not_a_list())?;
    let mut out = Vec::new();
    for (i, m) in items.enumerate() {
        out.push(message(i, &m?)?);
    }
    check(&out, retrieval)?;
    Ok(out)
}

fn check(messages: &[ChatMessage], retrieval: bool) -> PyResult<()> {
    match messages.last() {
        None => Err(value_error(
            "messages is empty: give at least the user's question",
        )),
        Some(m) if retrieval && m.role != "user" => Err(value_error(format!(
            "with retrieval the last message must be the user's question (it is the \
             search query), not {:?}; pass retrieval=False to answer without sources",
            m.role
        ))),
        Some(_) => Ok(()),
    }
}

fn as_dict<'py>(py: Python<'py>, m: &ChatMessage) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("role", &m.role)?;
    d.set_item("content", &m.content)?;
    Ok(d)
}

/// The history of a conversation: the exchanges that completed, oldest first.
struct History {
    exchanges: Vec<(String, String)>,
    max_exchanges: usize,
}

impl History {
    /// Keeps a finished exchange, dropping the oldest beyond `max_exchanges` (so a long
    /// conversation never outgrows the context). An interrupted answer is not kept.
    fn record(&mut self, question: String, answer: &Answer) {
        if answer.cancelled || self.max_exchanges == 0 {
            return;
        }
        self.exchanges.push((question, answer.answer.clone()));
        let over = self.exchanges.len().saturating_sub(self.max_exchanges);
        self.exchanges.drain(..over);
    }
}

/// A conversation with an `Assistant`: each question is answered with the exchanges so
/// far, so follow-ups may refer to earlier questions.
#[pyclass(frozen, module = "ragkit")]
pub struct Conversation {
    assistant: Py<Assistant>,
    system: Option<String>,
    retrieval: bool,
    history: Arc<Mutex<History>>,
}

impl Conversation {
    /// The system message, the kept exchanges and then `question`.
    fn messages_with(&self, question: &str) -> Vec<ChatMessage> {
        let history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::with_capacity(2 * history.exchanges.len() + 2);
        if let Some(s) = &self.system {
            out.push(ChatMessage::new("system", s));
        }
        for (q, a) in &history.exchanges {
            out.push(ChatMessage::new("user", q));
            out.push(ChatMessage::new("assistant", a));
        }
        out.push(ChatMessage::new("user", question));
        out
    }
}

#[pymethods]
impl Conversation {
    #[new]
    #[pyo3(signature = (assistant, system=None, *, retrieval=true, max_exchanges=4))]
    fn new(
        assistant: Py<Assistant>,
        system: Option<String>,
        retrieval: bool,
        max_exchanges: usize,
    ) -> Self {
        Conversation {
            assistant,
            system,
            retrieval,
            history: Arc::new(Mutex::new(History {
                exchanges: Vec::new(),
                max_exchanges,
            })),
        }
    }

    /// Answer `question` in this conversation and keep the exchange.
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
        let messages = self.messages_with(&question);
        let inner = &self.assistant.get().inner;
        let retrieval = self.retrieval;
        let mut sink = TextSink::new(on_text.as_ref());
        let answer = py
            .detach(|| guarded(|| inner.chat(&messages, retrieval, &opts, &mut |p| sink.push(p))));
        sink.finish()?;
        let answer = Answer::from(answer?);
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(question, &answer);
        Ok(answer)
    }

    /// Like `ask`, but returns at once an iterator over the answer's text pieces; the
    /// exchange is kept once the stream has ended without being cancelled.
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
        let messages = self.messages_with(&question);
        let inner = &self.assistant.get().inner;
        let (events, cancel) = inner.chat_stream(messages, self.retrieval, opts);
        let history = Arc::clone(&self.history);
        let on_done = move |answer: &Answer| {
            history
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(question, answer)
        };
        Ok(AskStream::new(events, cancel).with_on_done(on_done))
    }

    /// Forget the exchanges (the system message stays).
    fn reset(&self) {
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .exchanges
            .clear();
    }

    /// The messages the next question follows: the system message (if any), then each
    /// kept exchange as a user and an assistant message.
    #[getter]
    fn messages<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let mut all = self.messages_with("");
        all.pop();
        all.iter().map(|m| as_dict(py, m)).collect()
    }

    /// The `Assistant` that answers.
    #[getter]
    fn assistant(&self, py: Python<'_>) -> Py<Assistant> {
        self.assistant.clone_ref(py)
    }

    fn __repr__(&self) -> String {
        let kept = self
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .exchanges
            .len();
        format!(
            "Conversation(exchanges={kept}, retrieval={})",
            if self.retrieval { "True" } else { "False" }
        )
    }
}
