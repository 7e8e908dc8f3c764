//! The `on_text` callback of `ask` / `ask_with_context`, called from detached generation.

use pyo3::prelude::*;
use pyo3::types::PyBool;

/// Feeds each piece of text to an optional Python callable. Generation stops when the
/// callable returns `False`, raises, or the user presses Ctrl-C (pending signals are
/// checked at every piece); the exception is kept for [`TextSink::finish`].
pub struct TextSink<'a> {
    callback: Option<&'a Py<PyAny>>,
    failure: Option<PyErr>,
}

impl<'a> TextSink<'a> {
    pub fn new(callback: Option<&'a Py<PyAny>>) -> Self {
        TextSink {
            callback,
            failure: None,
        }
    }

    /// Called by the generator for every piece; `false` stops generation.
    pub fn push(&mut self, piece: &str) -> bool {
        if self.failure.is_some() {
            return false;
        }
        Python::attach(|py| {
            if let Err(e) = py.check_signals() {
                self.failure = Some(e);
                return false;
            }
            let Some(callback) = self.callback else {
                return true;
            };
            match callback.call1(py, (piece,)) {
                Ok(ret) => {
                    let ret = ret.bind(py);
                    // Only an explicit False stops: a callback that returns nothing (None)
                    // just consumes the text.
                    let is_false =
                        ret.is_instance_of::<PyBool>() && matches!(ret.is_truthy(), Ok(false));
                    !is_false
                }
                Err(e) => {
                    self.failure = Some(e);
                    false
                }
            }
        })
    }

    /// The callback's exception (or KeyboardInterrupt), if one stopped generation.
    pub fn finish(self) -> PyResult<()> {
        match self.failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
