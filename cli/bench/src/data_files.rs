//! The benchmarks' data files. Their defaults are paths relative to the current directory
//! (the repository's `bench/` and `examples/` folders, `../shared/data/` beside it), shown
//! by `--help`; a missing one is an error naming its flag, never an empty run.

use anyhow::{bail, Result};
use std::path::Path;

/// `path`, the value of `flag`, exists; else an error saying where it was looked for.
pub fn require(path: &Path, flag: &str) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    let base = match std::env::current_dir() {
        Ok(dir) if path.is_relative() => format!(" (relative to {})", dir.display()),
        _ => String::new(),
    };
    bail!(
        "{flag} {}: not found{base}; pass {flag} with the path of the data",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_names_its_flag_and_where_it_was_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        assert!(require(dir.path(), "--corpus").is_ok());
        let missing = dir.path().join("questions.jsonl");
        let e = require(&missing, "--questions").unwrap_err().to_string();
        assert!(
            e.starts_with("--questions ") && e.contains("not found"),
            "{e}"
        );
        let e = require(Path::new("no/such/file.jsonl"), "--dataset")
            .unwrap_err()
            .to_string();
        assert!(e.contains("(relative to "), "{e}");
    }
}
