//! How indexing shows itself on stderr: the progress bar (only on a terminal) and the
//! one-line summary.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rag::{IndexProgress, IndexSummary, Phase};
use std::io::IsTerminal;
use std::path::Path;

pub fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix:>7} [{bar:30}] {pos}/{len} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

pub fn update_bar(bar: &ProgressBar, p: &IndexProgress) {
    let prefix = match p.phase {
        Phase::Scan => "scan",
        Phase::Parse => "parse",
        Phase::Embed => "embed",
        Phase::Finish => "finish",
    };
    bar.set_prefix(prefix);
    bar.set_length(p.total);
    bar.set_position(p.done);
    if let Some(c) = &p.current {
        bar.set_message(c.clone());
    } else {
        bar.set_message("");
    }
}

pub fn summary_line(s: &IndexSummary, index_dir: &Path) -> String {
    let secs = s.elapsed.as_secs_f64();
    let skipped = if s.skipped.is_empty() {
        "0 skipped".to_string()
    } else {
        let parts: Vec<String> = s.skipped.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!("{} skipped ({})", s.skipped_total(), parts.join(", "))
    };
    let rate = if secs > 0.0 {
        s.chunks_added as f64 / secs
    } else {
        0.0
    };
    format!(
        "indexed {} files: {} new/changed, {} unchanged, {} removed, {skipped}; chunks: {} total (+{} -{}), {} embedded; {:.2} s ({:.1} chunks/s) -> {}",
        s.files_seen,
        s.files_indexed,
        s.files_unchanged,
        s.files_removed,
        s.chunks_total,
        s.chunks_added,
        s.chunks_removed,
        s.chunks_embedded,
        secs,
        rate,
        index_dir.display()
    )
}
