//! `rag index DIR...`: build or update the local index (incremental, crash-safe).

use anyhow::Result;
use rag::{Index, IndexOptions, IndexProgress, SkippedFile};
use rag_cli::embedder::load_embedder;
use rag_cli::index_progress::{progress_bar, summary_line, update_bar};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Folders (or files) to index.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// Where the index lives.
    #[arg(long, default_value = ".rag-index")]
    pub index_dir: PathBuf,
    /// BM25 only: do not load the embedding model.
    #[arg(long)]
    pub no_dense: bool,
    /// Maximum tokens per chunk.
    #[arg(long, default_value_t = 200)]
    pub chunk_tokens: usize,
    /// Tokens shared by consecutive chunks.
    #[arg(long, default_value_t = 40)]
    pub overlap: usize,
    /// Skip files larger than this many MiB.
    #[arg(long, default_value_t = 20)]
    pub max_file_mb: u64,
    /// Also index hidden files and directories.
    #[arg(long)]
    pub hidden: bool,
    /// Seconds one file may take to parse; its worker process is then killed.
    #[arg(long, default_value_t = 10.0)]
    pub parse_timeout: f64,
    /// Commit the store and BM25 after this many new chunks.
    #[arg(long, default_value_t = 2000)]
    pub commit_every: usize,
    /// Print the summary as JSON on stdout (skipped files included, as `skipped_files`).
    #[arg(long)]
    pub json: bool,
    /// List every skipped file, not only the first ones.
    #[arg(long, short)]
    pub verbose: bool,
}

pub fn run(a: Args) -> Result<()> {
    let embedder = load_embedder(a.no_dense)?;
    let index = Index::open(&a.index_dir, embedder)?;
    let mut opts = IndexOptions::default();
    opts.chunk.chunk_tokens = a.chunk_tokens;
    opts.chunk.overlap_tokens = a.overlap;
    opts.limits.max_file_bytes = a.max_file_mb << 20;
    opts.include_hidden = a.hidden;
    opts.limits.timeout = std::time::Duration::try_from_secs_f64(a.parse_timeout)
        .map_err(|e| anyhow::anyhow!("--parse-timeout {}: {e}", a.parse_timeout))?;
    opts.commit_every_chunks = a.commit_every.max(1);
    let bar = progress_bar();
    let on_progress = |p: IndexProgress| update_bar(&bar, &p);
    let summary = index.add_paths(&a.dirs, &opts, &on_progress)?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eprintln!("{}", summary_line(&summary, &a.index_dir));
        let limit = if a.verbose { usize::MAX } else { SKIPPED_SHOWN };
        eprint!("{}", skipped_table(&summary.skipped_files, limit));
    }
    Ok(())
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
