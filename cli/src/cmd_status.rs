//! `rag status`: what the index holds (folders, files, chunks, models), its size on disk
//! and when it last changed. `--json` prints the same as one object (docs/json-schemas.md).

use anyhow::Result;
use rag::{Index, IndexRoot};
use rag_cli::config::Config;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Where the index lives [default: $RAG_INDEX_DIR, the config file's index_dir, or
    /// .rag-index].
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// Model whose presence to report [default: the config file's model, or the library's
    /// default].
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Status {
    index_dir: String,
    /// The config file read, if there is one.
    config_file: Option<String>,
    schema_version: usize,
    folders: Vec<Folder>,
    files: u64,
    skipped_files: u64,
    chunks: u64,
    vectors: u64,
    embedding_model: Option<String>,
    model: ModelState,
    generation: u64,
    updated_unix: Option<i64>,
    disk_bytes: DiskBytes,
}

#[derive(serde::Serialize)]
struct Folder {
    #[serde(flatten)]
    root: IndexRoot,
    exists: bool,
}

#[derive(serde::Serialize)]
struct ModelState {
    name: String,
    present: bool,
}

/// Bytes on disk, by part of the index.
#[derive(serde::Serialize, Default, Debug, PartialEq)]
struct DiskBytes {
    /// `store.sqlite` and its WAL: documents, chunks, vectors.
    store: u64,
    /// The BM25 text index (`bm25/`).
    bm25: u64,
    /// The HNSW graph dump (`hnsw-*`, `dense.json`).
    dense: u64,
    /// Everything else (cached prompt heads, the drafting token database).
    other: u64,
    total: u64,
}

pub fn run(a: Args) -> Result<()> {
    let config = Config::load()?;
    let index_dir = config.index_dir(a.index_dir);
    rag_cli::exit::require_index(&index_dir, "")?;
    let index = Index::open(&index_dir, None)?;
    let stats = index.stats();
    let model = config.model(a.model);
    let status = Status {
        index_dir: index.dir().display().to_string(),
        config_file: Config::path()
            .filter(|p| p.is_file())
            .map(|p| p.display().to_string()),
        schema_version: index.schema_version()?,
        folders: index
            .roots()?
            .into_iter()
            .map(|root| Folder {
                exists: Path::new(&root.path).exists(),
                root,
            })
            .collect(),
        files: stats.documents,
        skipped_files: stats.skipped_documents,
        chunks: stats.chunks,
        vectors: stats.vectors,
        embedding_model: stats.model_id,
        model: ModelState {
            present: rag::models::resolve(&model).is_ok(),
            name: model,
        },
        generation: stats.generation,
        updated_unix: index.updated_unix(),
        disk_bytes: disk_bytes(index.dir()),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", text(&status));
    }
    Ok(())
}

fn text(s: &Status) -> String {
    let mut out = format!("index: {}\n", s.index_dir);
    if let Some(c) = &s.config_file {
        out += &format!("config: {c}\n");
    }
    if s.folders.is_empty() {
        out += "folders: none remembered (`rag index DIR` records them)\n";
    } else {
        out += "folders:\n";
        for f in &s.folders {
            let synced = match f.root.synced_unix {
                Some(t) => format!("synced {}", utc(t)),
                None => "never synced to the end (`rag index` resumes)".into(),
            };
            let gone = if f.exists { "" } else { " (missing on disk)" };
            out += &format!(
                "  {}{gone}: {} files, {} skipped; {synced}\n",
                f.root.path, f.root.documents, f.root.skipped_documents
            );
        }
    }
    out += &format!(
        "files: {} indexed, {} skipped; chunks: {}; vectors: {}",
        s.files, s.skipped_files, s.chunks, s.vectors
    );
    if let Some(m) = &s.embedding_model {
        out += &format!(" ({m})");
    }
    out += "\n";
    let state = if s.model.present {
        "present"
    } else {
        "not downloaded"
    };
    out += &format!("model: {} ({state})\n", s.model.name);
    let d = &s.disk_bytes;
    out += &format!(
        "disk: {} (store {}, bm25 {}, dense {}, other {})\n",
        size(d.total),
        size(d.store),
        size(d.bm25),
        size(d.dense),
        size(d.other)
    );
    let updated = s.updated_unix.map_or_else(|| "never".into(), utc);
    out += &format!("last update: {updated} (generation {})\n", s.generation);
    out
}

/// The index directory's files, by part (symlinks are not followed).
fn disk_bytes(dir: &Path) -> DiskBytes {
    let mut d = DiskBytes::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return d;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let bytes = tree_bytes(&e.path());
        let part = if name.starts_with("store.sqlite") {
            &mut d.store
        } else if name == "bm25" {
            &mut d.bm25
        } else if name.starts_with("hnsw-") || name.starts_with("dense.json") {
            &mut d.dense
        } else {
            &mut d.other
        };
        *part += bytes;
        d.total += bytes;
    }
    d
}

fn tree_bytes(path: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !m.is_dir() {
        return m.len();
    }
    std::fs::read_dir(path)
        .map(|es| es.flatten().map(|e| tree_bytes(&e.path())).sum())
        .unwrap_or(0)
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GB", b as f64 / 1e9),
        b if b >= 1 << 20 => format!("{:.1} MB", b as f64 / 1e6),
        b if b >= 1 << 10 => format!("{:.1} kB", b as f64 / 1e3),
        b => format!("{b} B"),
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` for seconds since the Unix epoch.
fn utc(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06:40 UTC");
    }

    #[test]
    fn disk_bytes_by_part() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("store.sqlite"), [0u8; 100]).unwrap();
        std::fs::write(p.join("store.sqlite-wal"), [0u8; 10]).unwrap();
        std::fs::create_dir_all(p.join("bm25/seg")).unwrap();
        std::fs::write(p.join("bm25/seg/a"), [0u8; 7]).unwrap();
        std::fs::write(p.join("hnsw-3-2.data"), [0u8; 5]).unwrap();
        std::fs::write(p.join("dense.json"), [0u8; 1]).unwrap();
        std::fs::write(p.join("prompt-head.bin"), [0u8; 3]).unwrap();
        let d = disk_bytes(p);
        assert_eq!(
            d,
            DiskBytes {
                store: 110,
                bm25: 7,
                dense: 6,
                other: 3,
                total: 126
            }
        );
    }
}
