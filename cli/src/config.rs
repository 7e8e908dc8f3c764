//! Defaults for the flags people set once: the model, the index directory, top-k, threads
//! and the speculative-decoding mode; and the document loader commands of `rag index`. Each setting comes from, first to last: its flag,
//! the environment (`RAG_INDEX_DIR`), the config file, the built-in default.
//!
//! The config file is TOML: `$RAG_CONFIG` if set (it must exist), else
//! `$XDG_CONFIG_HOME/rag/config.toml`, else `~/.config/rag/config.toml` (either may be
//! absent). Unknown keys are errors, so a typo does not silently fall back to a default.

use anyhow::{Context, Result};
use corpus_tools::Loaders;
use std::path::{Path, PathBuf};

/// Where `rag` keeps the index when nothing says otherwise (relative: one per project).
pub const DEFAULT_INDEX_DIR: &str = ".rag-index";

/// The settings of a config file; a missing key falls through to the built-in default.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Model name, Hub reference (`hf.co/OWNER/REPO:QUANT`) or GGUF path (`--model`).
    pub model: Option<String>,
    /// `--index-dir`; a leading `~/` is the home directory.
    pub index_dir: Option<PathBuf>,
    /// Passages per question (`--top-k`).
    pub top_k: Option<usize>,
    /// Compute threads, 0 = all cores (`--threads`).
    pub threads: Option<usize>,
    /// Speculative decoding mode (`--spec`); its place in the file, to name the line
    /// of a bad value.
    pub spec: Option<toml::Spanned<String>>,
    /// `[loaders]`: extension = command that prints a file's text, with the file's path
    /// as `$1` (e.g. `pdf = "pdftotext -layout $1 -"`); it replaces the built-in parser
    /// for that extension when indexing.
    pub loaders: Option<toml::Spanned<std::collections::BTreeMap<String, String>>>,
}

impl Config {
    /// The config file `rag` reads: `$RAG_CONFIG`, or the user's, if present.
    pub fn path() -> Option<PathBuf> {
        if let Some(p) = env_path("RAG_CONFIG") {
            return Some(p);
        }
        let base = env_path("XDG_CONFIG_HOME")
            .filter(|p| p.is_absolute())
            .or_else(|| env_path("HOME").map(|h| h.join(".config")))?;
        Some(base.join("rag").join("config.toml"))
    }

    /// Read the config file; none (when not named by `$RAG_CONFIG`) is an empty config.
    pub fn load() -> Result<Config> {
        let Some(path) = Config::path() else {
            return Ok(Config::default());
        };
        let named = env_path("RAG_CONFIG").is_some();
        match std::fs::read_to_string(&path) {
            Ok(text) => Config::parse(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => Ok(Config::default()),
            Err(e) => Err(e).with_context(|| format!("reading config file {}", path.display())),
        }
    }

    /// Parse `text` (the contents of `path`); errors name the file and the line.
    pub fn parse(text: &str, path: &Path) -> Result<Config> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| format!(", line {}", line_of(text, s.start)))
                .unwrap_or_default();
            anyhow::anyhow!(
                "config file {}{at}: {}",
                path.display(),
                e.message().trim_end()
            )
        })?;
        if let Some(spec) = &config.spec {
            specdec::Mode::parse(spec.get_ref()).map_err(|e| {
                let line = line_of(text, spec.span().start);
                anyhow::anyhow!("config file {}, line {line}: spec: {e}", path.display())
            })?;
        }
        if let Some(l) = &config.loaders {
            let line = line_of(text, l.span().start);
            Loaders::new(l.get_ref().clone()).map_err(|e| {
                anyhow::anyhow!("config file {}, line {line}: loaders: {e}", path.display())
            })?;
        }
        Ok(config)
    }

    /// The `[loaders]` table (checked when the file was read).
    pub fn loaders(&self) -> Loaders {
        self.loaders
            .as_ref()
            .and_then(|l| Loaders::new(l.get_ref().clone()).ok())
            .unwrap_or_default()
    }

    /// `--index-dir`, else `$RAG_INDEX_DIR`, else the config's, else `.rag-index`.
    pub fn index_dir(&self, flag: Option<PathBuf>) -> PathBuf {
        flag.or_else(|| env_path("RAG_INDEX_DIR"))
            .or_else(|| self.index_dir.as_deref().map(expand_home))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_INDEX_DIR))
    }

    /// `--model`, else the config's, else the library's default.
    pub fn model(&self, flag: Option<String>) -> String {
        flag.or_else(|| self.model.clone())
            .unwrap_or_else(|| rag::models::DEFAULT_MODEL.to_owned())
    }

    pub fn top_k(&self, flag: Option<usize>) -> usize {
        flag.or(self.top_k).unwrap_or(rag::assistant::DEFAULT_TOP_K)
    }

    pub fn threads(&self, flag: Option<usize>) -> usize {
        flag.or(self.threads).unwrap_or(0)
    }

    pub fn spec(&self, flag: Option<&str>) -> Result<specdec::Mode> {
        match (flag, &self.spec) {
            (Some(s), _) => specdec::Mode::parse(s).map_err(|e| anyhow::anyhow!("--spec: {e}")),
            (None, Some(s)) => {
                specdec::Mode::parse(s.get_ref()).map_err(|e| anyhow::anyhow!("config spec: {e}"))
            }
            (None, None) => Ok(rag::assistant::DEFAULT_SPEC),
        }
    }
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// A non-empty environment variable as a path.
fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `~/x` is `$HOME/x`; anything else is as written.
fn expand_home(p: &Path) -> PathBuf {
    match (p.strip_prefix("~"), env_path("HOME")) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config> {
        Config::parse(text, Path::new("/etc/rag.toml"))
    }

    #[test]
    fn reads_every_key() {
        let c = parse(
            "# defaults\nmodel = \"smollm2-135m\"\nindex_dir = \"/data/idx\"\ntop_k = 3\nthreads = 2\nspec = \"pld\"\n",
        )
        .unwrap();
        assert_eq!(c.model(None), "smollm2-135m");
        assert_eq!(c.model(Some("x.gguf".into())), "x.gguf");
        assert_eq!(c.top_k(None), 3);
        assert_eq!(c.top_k(Some(7)), 7);
        assert_eq!(c.threads(None), 2);
        assert_eq!(c.spec(None).unwrap(), specdec::Mode::Pld);
        assert_eq!(c.spec(Some("none")).unwrap(), specdec::Mode::None);
        assert_eq!(c.index_dir(Some("flag".into())), PathBuf::from("flag"));
    }

    #[test]
    fn reads_the_loaders_table() {
        let c = parse("top_k = 2\n[loaders]\npdf = \"pdftotext $1 -\"\n\".Note\" = \"cat $1\"\n")
            .unwrap();
        let l = c.loaders();
        assert_eq!(l.for_path(Path::new("a.PDF")), Some("pdftotext $1 -"));
        assert_eq!(l.for_path(Path::new("b.note")), Some("cat $1"));
        assert!(parse("").unwrap().loaders().is_empty());
    }

    #[test]
    fn empty_is_the_builtin_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c.model(None), rag::models::DEFAULT_MODEL);
        assert_eq!(c.top_k(None), rag::assistant::DEFAULT_TOP_K);
        assert_eq!(c.threads(None), 0);
        assert_eq!(c.spec(None).unwrap(), rag::assistant::DEFAULT_SPEC);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        for (text, line, what) in [
            ("model = \"a\"\ntop_k = \"five\"\n", 2, "invalid type"),
            ("model = \"a\"\n\nmodle = \"b\"\n", 3, "unknown field"),
            ("top_k = 3\nthreads = -1\n", 2, "-1"),
            ("model = \"a\"\nspec = \"warp\"\n", 2, "spec"),
            ("top_k = 3\n[loaders]\n\".\" = \"cat $1\"\n", 2, "loaders"),
            ("[loaders]\npdf = \" \"\n", 1, "empty command"),
            ("model = \n", 1, ""),
        ] {
            let e = format!("{:#}", parse(text).unwrap_err());
            assert!(
                e.starts_with(&format!("config file /etc/rag.toml, line {line}: ")),
                "{text:?}: {e}"
            );
            assert!(e.contains(what), "{text:?}: {e}");
        }
    }

    #[test]
    fn home_is_expanded() {
        let home = env_path("HOME").unwrap_or_default();
        assert_eq!(expand_home(Path::new("~/idx")), home.join("idx"));
        assert_eq!(expand_home(Path::new("idx")), PathBuf::from("idx"));
    }
}
