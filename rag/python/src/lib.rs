//! `ragkit`: the Python module over [`rag::assistant::Assistant`].
//!
//! Every call that reads files, embeds or generates detaches from the interpreter (other
//! Python threads run meanwhile); errors and panics come back as `ragkit.RagError`.
//! The Python-facing documentation is in `ragkit.pyi`.

mod assistant;
mod chat;
mod errors;
mod stream;
mod text_sink;
mod types;

use pyo3::prelude::*;

#[pymodule]
fn ragkit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("RagError", m.py().get_type::<errors::RagError>())?;
    m.add("DEFAULT_MODEL", rag::models::DEFAULT_MODEL)?;
    m.add_class::<assistant::Assistant>()?;
    m.add_class::<chat::Conversation>()?;
    m.add_class::<stream::AskStream>()?;
    m.add_class::<types::Hit>()?;
    m.add_class::<types::Source>()?;
    m.add_class::<types::Timings>()?;
    m.add_class::<types::Speculation>()?;
    m.add_class::<types::Switching>()?;
    m.add_class::<types::Answer>()?;
    m.add_class::<types::Candidate>()?;
    m.add_class::<types::IndexSummary>()?;
    Ok(())
}
