//! `rag index DIR...`: build or update the local index (incremental, crash-safe). The
//! index remembers the folders; `rag index` alone re-syncs every one of them.

use anyhow::Result;
use rag::{Index, IndexOptions, IndexProgress, SkippedFile};
use rag_cli::config::Config;
use rag_cli::embedder::load_embedder;
use rag_cli::exit;
use rag_cli::index_progress::{progress_bar, summary_line, update_bar};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Folders (or files) to index [default: every folder the index was built from].
    pub dirs: Vec<PathBuf>,
    /// Where the index lives [default: $RAG_INDEX_DIR, the config file's index_dir, or
    /// .rag-index].
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// BM25 only: do not load the embedding model.
    #[arg(long)]
    pub no_dense: bool,
    /// Embedding model: minilm-l6-v2 (English) or multilingual-e5-small [default: the one
    /// the index was built with, else minilm-l6-v2]. The index remembers it, so searching
    /// and asking need no flag; naming another one re-embeds every chunk.
    #[arg(long, value_name = "NAME")]
    pub embedder: Option<String>,
    /// Maximum tokens per chunk. The library's default, so `rag ask --corpus` and
    /// `rag serve --corpus` find the chunks of this index current.
    #[arg(long, default_value_t = IndexOptions::default().chunk.chunk_tokens)]
    pub chunk_tokens: usize,
    /// Tokens shared by consecutive chunks.
    #[arg(long, default_value_t = IndexOptions::default().chunk.overlap_tokens)]
    pub overlap: usize,
    /// Skip files larger than this many MiB.
    #[arg(long, default_value_t = IndexOptions::default().limits.max_file_bytes >> 20)]
    pub max_file_mb: u64,
    /// Also index hidden files and directories.
    #[arg(long)]
    pub hidden: bool,
    /// Seconds one file may take to parse; its worker process is then killed.
    #[arg(long, default_value_t = IndexOptions::default().limits.timeout.as_secs_f64())]
    pub parse_timeout: f64,
    /// Commit the store and BM25 after this many new chunks.
    #[arg(long, default_value_t = IndexOptions::default().commit_every_chunks)]
    pub commit_every: usize,
    /// Print the summary as JSON on stdout (skipped files included, as `skipped_files`).
    #[arg(long)]
    pub json: bool,
    /// List every skipped file, not only the first ones.
    #[arg(long, short)]
    pub verbose: bool,
    /// Start over: remove the index (store, text and vector indexes) and index the folders
    /// again, those named or else those it remembers. What a damaged index needs.
    #[arg(long)]
    pub rebuild: bool,
}

/// The indexing options these flags describe.
fn index_options(a: &Args) -> Result<IndexOptions> {
    let mut opts = IndexOptions::default();
    opts.chunk.chunk_tokens = a.chunk_tokens;
    opts.chunk.overlap_tokens = a.overlap;
    opts.limits.max_file_bytes = a
        .max_file_mb
        .checked_mul(1 << 20)
        .ok_or_else(|| anyhow::anyhow!("--max-file-mb {}: too large", a.max_file_mb))?;
    opts.include_hidden = a.hidden;
    opts.limits.timeout = std::time::Duration::try_from_secs_f64(a.parse_timeout)
        .map_err(|e| anyhow::anyhow!("--parse-timeout {}: {e}", a.parse_timeout))?;
    opts.commit_every_chunks = a.commit_every.max(1);
    Ok(opts)
}

pub fn run(a: Args) -> Result<()> {
    let mut opts = index_options(&a)?;
    let config = Config::load()?;
    opts.limits.loaders = config.loaders();
    let index_dir = config.index_dir(a.index_dir.clone());
    let resync = a.dirs.is_empty();
    if resync {
        exit::require_index(&index_dir, "")?;
    }
    let embedder = load_embedder(a.no_dense, &index_dir, a.embedder.as_deref())?;
    let rebuilt = if a.rebuild {
        Some(remove_for_rebuild(&index_dir, &a.dirs)?)
    } else {
        None
    };
    let index = Index::open(&index_dir, embedder)?;
    let dirs = match rebuilt {
        Some(dirs) => dirs,
        None if resync => remembered_folders(&index)?,
        None => a.dirs.clone(),
    };
    let bar = progress_bar();
    let on_progress = |p: IndexProgress| update_bar(&bar, &p);
    let summary = index.add_paths(&dirs, &opts, &on_progress)?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eprintln!("{}", summary_line(&summary, &index_dir));
        let limit = if a.verbose { usize::MAX } else { SKIPPED_SHOWN };
        eprint!("{}", skipped_table(&summary.skipped_files, limit));
    }
    Ok(())
}

/// Removes the index at `index_dir` and returns the folders to index again: `dirs`, or else
/// the ones the index remembers (which needs its store to be readable).
fn remove_for_rebuild(index_dir: &Path, dirs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let dirs = if dirs.is_empty() {
        let old = Index::open(index_dir, None).map_err(|e| {
            exit::usage(format!(
                "{e:#}\nthe folders it was built from cannot be read: name them \
                 (`rag index --rebuild DIR...`)"
            ))
        })?;
        remembered_folders(&old)?
    } else {
        dirs.to_vec()
    };
    if index_dir.exists() {
        rag::index_files::remove_index_files(index_dir)?;
    }
    Ok(dirs)
}

/// The folders the index was built from that still exist. A missing one (an unmounted
/// drive, a moved folder) is left alone, files and all, with a note on how to forget it.
fn remembered_folders(index: &Index) -> Result<Vec<PathBuf>> {
    let roots = index.roots()?;
    if roots.is_empty() {
        return Err(exit::usage(format!(
            "the index at {} remembers no folders: name them (`rag index DIR...`)",
            index.dir().display()
        )));
    }
    let (present, gone): (Vec<_>, Vec<_>) =
        roots.into_iter().partition(|r| Path::new(&r.path).exists());
    for r in &gone {
        eprintln!(
            "note: {} is gone: its {} file(s) stay in the index (`rag rm {}` removes them)",
            r.path, r.documents, r.path
        );
    }
    anyhow::ensure!(
        !present.is_empty(),
        "none of the folders the index was built from exists"
    );
    Ok(present.into_iter().map(|r| PathBuf::from(r.path)).collect())
}

/// Skipped files listed without `--verbose`.
const SKIPPED_SHOWN: usize = 10;

/// Reasons in the order the table lists them: the ones a flag or a fix can change first,
/// the expected ones (images, archives) last.
const REASON_ORDER: [&str; 9] = [
    "timeout",
    "too-large",
    "crashed",
    "panic",
    "parse-error",
    "unreadable",
    "binary",
    "empty",
    "unsupported",
];

/// The skipped files as a table (reason, path, detail), at most `limit` rows, then how
/// many more there are. Empty when nothing was skipped.
pub fn skipped_table(files: &[SkippedFile], limit: usize) -> String {
    if files.is_empty() {
        return String::new();
    }
    let rank = |r: &str| REASON_ORDER.iter().position(|x| *x == r).unwrap_or(0);
    let mut rows: Vec<&SkippedFile> = files.iter().collect();
    rows.sort_by(|a, b| (rank(&a.reason), &a.path).cmp(&(rank(&b.reason), &b.path)));
    let shown = &rows[..rows.len().min(limit)];
    let width = shown.iter().map(|f| f.reason.len()).max().unwrap_or(0);
    let path_width = shown
        .iter()
        .map(|f| f.path.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = format!("skipped files ({}):\n", files.len());
    for f in shown {
        let line = format!(
            "  {:width$}  {:path_width$}  {}",
            f.reason, f.path, f.detail
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if rows.len() > shown.len() {
        out.push_str(&format!(
            "  ... and {} more (--verbose lists all, --json gives them as skipped_files)\n",
            rows.len() - shown.len()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    /// `rag ask --corpus` and `rag serve --corpus` index with `IndexOptions::default()`: a
    /// `rag index` default that differs would make them re-chunk and re-embed everything.
    #[test]
    fn defaults_are_the_librarys() {
        let a = Wrap::parse_from(["rag", "docs"]).args;
        let got = index_options(&a).unwrap();
        let lib = IndexOptions::default();
        assert_eq!(got.chunk.chunk_tokens, lib.chunk.chunk_tokens);
        assert_eq!(got.chunk.overlap_tokens, lib.chunk.overlap_tokens);
        assert_eq!(got.limits.max_file_bytes, lib.limits.max_file_bytes);
        assert_eq!(got.limits.timeout, lib.limits.timeout);
        assert_eq!(got.include_hidden, lib.include_hidden);
        assert_eq!(got.commit_every_chunks, lib.commit_every_chunks);
    }

    #[test]
    fn out_of_range_flags_are_errors() {
        let a = Wrap::parse_from(["rag", "docs", "--max-file-mb", "18446744073709551615"]).args;
        assert!(index_options(&a).is_err());
        let a = Wrap::parse_from(["rag", "docs", "--parse-timeout=-1"]).args;
        assert!(index_options(&a).is_err());
    }
}
