//! Errors of the runtime. Bad input (too long prompts, bad tree batches, corrupt models)
//! becomes one of these, never a panic.

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The model file could not be found, read or understood.
    #[error("model: {0}")]
    Model(String),
    /// A request that does not fit the session (tokens beyond the KV capacity, ...).
    #[error("capacity: {0}")]
    Capacity(String),
    /// Malformed call arguments (bad parent indices, unknown token ids, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A backend failed to compile, load or execute a graph.
    #[error("backend: {0}")]
    Backend(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, RuntimeError>;
