//! The iterator of `Assistant.ask_stream` and `chat_stream` over the engine's channel of
//! [`AskEvent`]s.

use crate::errors::RagError;
use crate::types::Answer;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use rag::assistant::{AskEvent, CancelToken};
use std::sync::{Mutex, OnceLock, PoisonError};
use tokio::sync::mpsc::UnboundedReceiver;

/// An answer being generated: iterate for the text pieces as they come.
///
/// Leaving the loop early (`break`, an exception) cancels generation once the stream is
/// no longer referenced; `cancel()` or a `with` block cancel at once whatever holds a
/// reference. After the last piece, `answer` holds the full `Answer` (sources, timings).
#[pyclass(frozen, module = "ragkit")]
pub struct AskStream {
    events: Mutex<UnboundedReceiver<AskEvent>>,
    cancel: CancelToken,
    answer: OnceLock<Answer>,
    /// Called with the answer when the stream ends with one (a conversation keeps it).
    on_done: Mutex<Option<OnDone>>,
}

type OnDone = Box<dyn FnOnce(&Answer) + Send>;

impl AskStream {
    pub fn new(events: UnboundedReceiver<AskEvent>, cancel: CancelToken) -> Self {
        AskStream {
            events: Mutex::new(events),
            cancel,
            answer: OnceLock::new(),
            on_done: Mutex::new(None),
        }
    }

    /// Calls `f` with the answer once the stream has delivered it.
    pub fn with_on_done(self, f: impl FnOnce(&Answer) + Send + 'static) -> Self {
        *self.on_done.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(f));
        self
    }
}

#[pymethods]
impl AskStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next piece of text; StopIteration after the last one, RagError if generation
    /// failed.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        if self.answer.get().is_some() {
            return Ok(None);
        }
        // Never block on the lock with the interpreter attached: a reader waiting for text
        // holds it while detached, and would need the interpreter back to finish.
        let mut events = self
            .events
            .try_lock()
            .map_err(|_| PyRuntimeError::new_err("this stream is being read by another thread"))?;
        let receiver: &mut UnboundedReceiver<AskEvent> = &mut events;
        let event = py.detach(|| receiver.blocking_recv());
        match event {
            Some(AskEvent::Text(piece)) => Ok(Some(piece)),
            Some(AskEvent::Done(answer)) => {
                let answer = self.answer.get_or_init(|| Answer::from(*answer));
                let on_done = self
                    .on_done
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                if let Some(f) = on_done {
                    f(answer);
                }
                Ok(None)
            }
            Some(AskEvent::Error(message)) => Err(RagError::new_err(message)),
            None => Err(RagError::new_err(
                "generation stopped without an answer (the generating thread ended)",
            )),
        }
    }

    /// Stop generating at the next token (the final answer then has `cancelled=True`).
    fn cancel(&self) {
        self.cancel.cancel();
    }

    /// The full answer once the iteration has ended, else None.
    #[getter]
    fn answer(&self) -> Option<Answer> {
        self.answer.get().cloned()
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Leaving the `with` block cancels whatever is still being generated.
    fn __exit__(
        &self,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.cancel.cancel();
        false
    }
}

impl Drop for AskStream {
    fn drop(&mut self) {
        // Nobody can read the rest: stop generating (dropping the channel would too, but
        // only at the next piece of text, which a long prefill may delay).
        if self.answer.get().is_none() {
            self.cancel.cancel();
        }
    }
}
