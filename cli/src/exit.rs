//! The exit codes of `rag`, for scripts: 0 success, 1 any other failure, and these.
//! An error that should exit with one carries an [`Exit`] (anywhere in its chain).

use std::path::Path;

/// A command line clap (or `rag`) rejects: a bad flag or value, no question.
pub const USAGE: i32 = 2;
/// No index where the command looked (`--index-dir`, `$RAG_INDEX_DIR`, the config file).
pub const MISSING_INDEX: i32 = 3;
/// The model (or the embedding model) is not a file, not a known name, or not fetched.
pub const MISSING_MODEL: i32 = 4;
/// Stopped by Ctrl-C (128 + SIGINT, as shells report a process a signal ended).
pub const CANCELLED: i32 = 130;

/// The text `rag --help` ends with.
pub const HELP: &str =
    "Exit codes: 0 success, 1 failure, 2 usage (bad flag or value, no question), \
3 no index there, 4 model missing (not a file, not a known name, not downloaded), \
130 cancelled (Ctrl-C).";

/// An error with its own exit code.
#[derive(Debug)]
pub struct Exit {
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

fn exit(code: i32, message: String) -> anyhow::Error {
    anyhow::Error::new(Exit { code, message })
}

pub fn usage(message: impl Into<String>) -> anyhow::Error {
    exit(USAGE, message.into())
}

pub fn missing_model(message: impl Into<String>) -> anyhow::Error {
    exit(MISSING_MODEL, message.into())
}

pub fn cancelled() -> anyhow::Error {
    exit(CANCELLED, "cancelled".into())
}

/// Fails with [`MISSING_INDEX`] unless an index exists at `dir`; `hint` is what else the
/// command accepts (e.g. "or pass --corpus DIR").
pub fn require_index(dir: &Path, hint: &str) -> anyhow::Result<()> {
    if dir.join("store.sqlite").is_file() {
        return Ok(());
    }
    let hint = if hint.is_empty() {
        String::new()
    } else {
        format!(" ({hint})")
    };
    Err(exit(
        MISSING_INDEX,
        format!(
            "no index at {}: run `rag index DIR` first{hint}",
            dir.display()
        ),
    ))
}

/// The model a command will load, made present: a file, or a known name or Hub reference
/// that is cached or fetched now. Anything else fails with [`MISSING_MODEL`].
pub fn require_model(name_or_path: &str) -> anyhow::Result<()> {
    if Path::new(name_or_path).exists() {
        return Ok(());
    }
    if !rag::models::is_known(name_or_path) {
        let known: Vec<String> = rag::models::manifest()
            .into_iter()
            .map(|m| m.name)
            .collect();
        return Err(missing_model(format!(
            "model '{name_or_path}' is neither a model file, a Hub reference (hf.co/OWNER/REPO:QUANT) nor a known model name (known: {})",
            known.join(", ")
        )));
    }
    rag::models::ensure(name_or_path)
        .map(|_| ())
        .map_err(|e| missing_model(format!("{e:#}")))
}

/// The exit code of a failed command: its [`Exit`]'s, else 1.
pub fn code_of(e: &anyhow::Error) -> i32 {
    e.chain()
        .find_map(|c| c.downcast_ref::<Exit>())
        .map_or(1, |x| x.code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn the_code_survives_context() {
        let e = Err::<(), _>(missing_model("gone"))
            .context("loading")
            .unwrap_err();
        assert_eq!(code_of(&e), MISSING_MODEL);
        assert_eq!(code_of(&anyhow::anyhow!("other")), 1);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            code_of(&require_index(dir.path(), "").unwrap_err()),
            MISSING_INDEX
        );
        assert_eq!(
            code_of(&require_model("no-such-model-name").unwrap_err()),
            MISSING_MODEL
        );
    }
}
