//! Rust errors and panics become `ragkit.RagError`; nothing unwinds into the interpreter.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::PyErr;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

create_exception!(
    ragkit,
    RagError,
    PyException,
    "An error of the rag engine; the message is the Rust error with its causes."
);

/// The Rust error with its chain of causes, as the CLI prints it.
pub fn rag_error(e: anyhow::Error) -> PyErr {
    RagError::new_err(format!("{e:#}"))
}

/// A bad argument value (an unknown mode name, ...).
pub fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Runs `f`, turning its error into `RagError` and a panic into `RagError` too (pyo3 would
/// raise `PanicException`, a `BaseException` that `except Exception` does not catch).
/// Safe to call with the interpreter detached: it builds the error lazily.
pub fn guarded<T>(f: impl FnOnce() -> anyhow::Result<T>) -> Result<T, PyErr> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(rag_error(e)),
        Err(payload) => Err(RagError::new_err(format!(
            "internal error (a bug in rag): {}",
            panic_message(&*payload)
        ))),
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "panic"
    }
}
