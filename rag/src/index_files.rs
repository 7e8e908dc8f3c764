//! The files of an index directory as a whole: telling a damaged index from other errors,
//! and removing everything derived from the documents for `rag index --rebuild`.

use std::path::Path;

/// What a user is told to do with a damaged index.
pub const REBUILD_HINT: &str = "rebuild it from the documents with `rag index --rebuild DIR...`";

/// Whether opening an index failed because its files are damaged (SQLite's "malformed" or
/// "not a database", tantivy's corruption errors), not for want of permission or space.
pub fn is_damaged(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        if let Some(rusqlite::Error::SqliteFailure(f, _)) = c.downcast_ref::<rusqlite::Error>() {
            return matches!(
                f.code,
                rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase
            );
        }
        if let Some(t) = c.downcast_ref::<tantivy::TantivyError>() {
            return match t {
                tantivy::TantivyError::DataCorruption(_) => true,
                // A file cut short or overwritten fails its footer check as an I/O error.
                other => other.to_string().to_ascii_lowercase().contains("corrupt"),
            };
        }
        false
    })
}

/// Removes the store and everything derived from it (text index, vector dumps, the
/// drafting token databases and their generation stamps) from `dir`; conversations
/// (`convdb-*`) and prompt-head caches (`khead-*`, keyed by model and build) stay.
/// Returns how many entries were removed.
pub fn remove_index_files(dir: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let derived = name.starts_with("store.sqlite")
            || name == "bm25"
            || name == "dense.json"
            || name.starts_with("hnsw-")
            || name.starts_with("tokendb-");
        if !derived {
            continue;
        }
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(e.path())?;
        } else {
            std::fs::remove_file(e.path())?;
        }
        n += 1;
    }
    Ok(n)
}
