//! Listing the files under the roots, the way a developer expects: `.gitignore`,
//! `.ignore` and hidden files are respected (even outside a git repository).

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Default)]
pub struct WalkOptions {
    /// Also walk hidden files and directories.
    pub include_hidden: bool,
    /// Paths never to descend into (e.g. the index directory itself).
    pub exclude: Vec<PathBuf>,
}

/// All regular files under `roots` (a root may itself be a file), sorted, deduplicated.
/// Unreadable directory entries are reported as errors, not fatal.
pub fn walk(roots: &[PathBuf], opts: &WalkOptions) -> (Vec<PathBuf>, Vec<String>) {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for root in roots {
        let mut builder = ignore::WalkBuilder::new(root);
        builder
            .hidden(!opts.include_hidden)
            .git_ignore(true)
            .git_global(false)
            .git_exclude(true)
            .ignore(true)
            .parents(true)
            .require_git(false)
            .follow_links(false);
        let exclude = opts.exclude.clone();
        builder.filter_entry(move |e| !exclude.iter().any(|x| is_under(e.path(), x)));
        for entry in builder.build() {
            match entry {
                Ok(e) => {
                    if e.file_type().is_some_and(|t| t.is_file()) {
                        files.push(e.into_path());
                    }
                }
                Err(err) => errors.push(err.to_string()),
            }
        }
    }
    files.sort();
    files.dedup();
    (files, errors)
}

fn is_under(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir)
}
