//! Errors of the scheduling layer.

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("invalid profile: {0}")]
    Profile(String),
    #[error("profile I/O error on {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("invalid plan: {0}")]
    Plan(String),
    #[error("instance too large for the exact solver: {0}")]
    TooLarge(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("executor failed: {0}")]
    Executor(String),
}

pub type Result<T> = std::result::Result<T, ScheduleError>;
