//! The incremental indexer and the query side of the index.
//!
//! Layout of an index directory: `store.sqlite` (source of truth, WAL), `bm25/` (tantivy,
//! derived), `hnsw-<gen>-<vgen>.*` + `dense.json` (HNSW dump, derived). Commit protocol:
//! 1. changed files are parsed and chunked outside any transaction;
//! 2. one SQLite transaction replaces their documents and chunks and bumps `generation`
//!    (this commit is the commit point: a crash before it loses nothing committed, a crash
//!    after it leaves derived indexes behind, never the store);
//! 3. tantivy applies the same change and commits with the generation as its payload;
//! 4. missing embeddings are computed per content hash and committed (bumping
//!    `vectors_generation`); 5. the HNSW graph is reconciled with the store and dumped.
//!
//! A writer that finds the tantivy payload behind the store rebuilds BM25 from SQLite;
//! any process that finds the HNSW dump behind the store rebuilds it from stored vectors.

use crate::ann::{HnswIndex, VectorIndex};
use crate::bm25::{Bm25, Bm25Doc};
use crate::embed_api::Embedder;
use crate::hybrid::{fuse, Fused, Fusion};
use crate::store::{self, ChunkRow, NewChunk, NewDoc};
use anyhow::{bail, Context, Result};
use corpus_tools::walk::{walk, WalkOptions};
use corpus_tools::{
    chunk_doc, parse_isolated_detailed, ChunkOptions, ParseLimits, Skip, SkipReason,
};
use rusqlite::Connection;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, UNIX_EPOCH};
use tantivy::tokenizer::Language;

pub type Chunk = ChunkRow;
/// (chunk id, score), best first.
pub type Ranked = Vec<(i64, f32)>;
pub type TokenCounter = Arc<dyn Fn(&str) -> usize + Send + Sync>;

/// Bump when parsing/chunking changes output for the same bytes: forces re-chunking.
/// 2: words over the chunk size are cut. 3: text encodings are decoded (BOMs, UTF-16,
/// legacy encodings), UTF-8 with a few bad bytes is text.
const PIPELINE_VERSION: u32 = 3;

#[derive(Clone)]
pub struct IndexOptions {
    pub chunk: ChunkOptions,
    pub limits: ParseLimits,
    pub include_hidden: bool,
    /// Texts per embedder call.
    pub embed_batch: usize,
    /// Commit the store (and BM25) after this many new chunks.
    pub commit_every_chunks: usize,
    /// Token counter for chunk sizes; default: corpus-tools' word-piece estimate.
    pub token_counter: Option<TokenCounter>,
}

impl Default for IndexOptions {
    fn default() -> Self {
        IndexOptions {
            chunk: ChunkOptions::default(),
            limits: ParseLimits::default(),
            include_hidden: false,
            embed_batch: 32,
            commit_every_chunks: 2000,
            token_counter: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Scan,
    Parse,
    Embed,
    Finish,
}

#[derive(Debug, Clone)]
pub struct IndexProgress {
    pub phase: Phase,
    pub done: u64,
    pub total: u64,
    pub current: Option<String>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct IndexSummary {
    pub files_seen: u64,
    /// New or changed files parsed this run.
    pub files_indexed: u64,
    pub files_unchanged: u64,
    pub files_removed: u64,
    /// Files that produced no chunks, per reason (unsupported, binary, too-large, timeout,
    /// ...): skipped this run, or skipped by an earlier run and unchanged since (they are
    /// not re-read, and not counted in `files_unchanged`).
    pub skipped: BTreeMap<String, u64>,
    /// Every file counted in `skipped`, with its reason and what exactly (`detail`; for a
    /// limit a flag of `rag index` changes, the flag), in walk order.
    pub skipped_files: Vec<SkippedFile>,
    pub walk_errors: u64,
    pub chunks_added: u64,
    pub chunks_removed: u64,
    pub chunks_total: u64,
    pub chunks_embedded: u64,
    pub generation: u64,
    pub elapsed: Duration,
}

/// A file that produced no chunks.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SkippedFile {
    pub path: String,
    /// `unsupported`, `binary`, `too-large`, `timeout`... (see [`SkipReason::as_str`]).
    pub reason: String,
    /// What exactly, e.g. `PNG image`, `NUL bytes`, `25165824 bytes, over 20 MiB
    /// (--max-file-mb)`; may be empty.
    pub detail: String,
}

/// The stored status of a skipped file: `skipped:<reason>:<detail>`.
fn skipped_status(skip: &Skip) -> String {
    format!("skipped:{}:{}", skip.reason.as_str(), skip.detail)
}

/// Record a skip of this run or, for an unchanged file, of an earlier one.
fn count_skip(summary: &mut IndexSummary, path: &str, reason: &str, detail: &str) {
    *summary.skipped.entry(reason.to_string()).or_default() += 1;
    summary.skipped_files.push(SkippedFile {
        path: path.to_string(),
        reason: reason.to_string(),
        detail: detail.to_string(),
    });
}

/// An unchanged file counts as unchanged, or under its skip reason if it was skipped.
fn count_unchanged(summary: &mut IndexSummary, path: &str, status: &str) {
    match status.strip_prefix("skipped:") {
        Some(rest) => {
            let (reason, detail) = rest.split_once(':').unwrap_or((rest, ""));
            count_skip(summary, path, reason, detail);
        }
        None => summary.files_unchanged += 1,
    }
}

/// Whether a stored document was processed under the current configuration. A file that
/// timed out carries its time limit (`/timeout-ms=N`) and is tried again when the limit
/// has grown since.
fn same_config(stored: &str, config: &str, timeout: Duration) -> bool {
    stored == config
        || stored
            .strip_prefix(config)
            .and_then(|r| r.strip_prefix(TIMEOUT_TAG))
            .and_then(|ms| ms.parse::<u128>().ok())
            .is_some_and(|ms| timeout.as_millis() <= ms)
}

const TIMEOUT_TAG: &str = "/timeout-ms=";

/// The flag of `rag index` that moves a limit, named in the skip detail where one applies.
/// `read_size`: the file's size, when the skip happened while reading it.
fn with_flag_hint(mut skip: Skip, limits: &ParseLimits, read_size: Option<u64>) -> Skip {
    let mib = |n: u64| n as f64 / (1u64 << 20) as f64;
    let hint = match (&skip.reason, read_size) {
        (SkipReason::Timeout, _) => format!(
            "parsing took over {} s (--parse-timeout)",
            limits.timeout.as_secs_f64()
        ),
        (SkipReason::TooLarge, Some(size)) => format!(
            "{:.1} MiB, over the {:.0} MiB limit (--max-file-mb)",
            mib(size),
            mib(limits.max_file_bytes)
        ),
        // A compressed file expanding past the file cap (when it is the smaller cap).
        (SkipReason::TooLarge, None)
            if skip.detail.starts_with("decompresses")
                && limits.max_file_bytes as usize <= limits.max_text_bytes =>
        {
            format!("{} (--max-file-mb)", skip.detail)
        }
        _ => return skip,
    };
    skip.detail = hint;
    skip
}

impl IndexSummary {
    pub fn skipped_total(&self) -> u64 {
        self.skipped.values().sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMode {
    Bm25,
    Dense,
    Hybrid,
}

impl SearchMode {
    /// The name `FromStr` reads (`bm25`, `dense`, `hybrid`).
    pub fn name(self) -> &'static str {
        match self {
            SearchMode::Bm25 => "bm25",
            SearchMode::Dense => "dense",
            SearchMode::Hybrid => "hybrid",
        }
    }
}

impl std::fmt::Display for SearchMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SearchMode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bm25" => Ok(SearchMode::Bm25),
            "dense" => Ok(SearchMode::Dense),
            "hybrid" => Ok(SearchMode::Hybrid),
            _ => bail!("unknown search mode '{s}' (bm25, dense, hybrid)"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Hit {
    pub chunk_id: i64,
    pub path: String,
    pub lines: Option<(u32, u32)>,
    pub page: Option<u32>,
    pub heading: Option<String>,
    pub text: String,
    pub score: f32,
    pub bm25_rank: Option<usize>,
    pub dense_rank: Option<usize>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct IndexStats {
    pub documents: u64,
    pub skipped_documents: u64,
    pub chunks: u64,
    pub vectors: u64,
    pub bm25_docs: u64,
    pub dense_vectors: u64,
    pub generation: u64,
    pub model_id: Option<String>,
}

/// A folder (or file) the index was built from: `rag index` with no folders re-syncs these.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IndexRoot {
    /// Canonical path, as the documents under it are stored.
    pub path: String,
    /// Indexed documents under it.
    pub documents: u64,
    /// Documents under it remembered as skipped (unsupported, binary, too large...).
    pub skipped_documents: u64,
    /// When it was first indexed (seconds since the Unix epoch).
    pub added_unix: i64,
    /// When a run over it last finished; `None` if none has yet (interrupted).
    pub synced_unix: Option<i64>,
}

/// Which store state a dense graph reflects.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct DenseKey {
    generation: u64,
    vectors_generation: u64,
    model_id: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct DenseSidecar {
    key: DenseKey,
    dim: usize,
    basename: String,
}

struct DenseState {
    index: HnswIndex,
    key: DenseKey,
}

pub struct Index {
    dir: PathBuf,
    db: Mutex<Connection>,
    bm25: Bm25,
    dense: RwLock<Option<DenseState>>,
    embedder: Option<Arc<dyn Embedder>>,
}

const SIDECAR: &str = "dense.json";

impl Index {
    /// Open or create the index at `dir`. Without an embedder, only BM25 works.
    pub fn open(dir: &Path, embedder: Option<Arc<dyn Embedder>>) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating index dir {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        let damaged = |e: anyhow::Error| {
            if crate::index_files::is_damaged(&e) {
                let hint = crate::index_files::REBUILD_HINT;
                e.context(format!("the index at {} is damaged: {hint}", dir.display()))
            } else {
                e
            }
        };
        let conn = store::open(&dir.join("store.sqlite")).map_err(damaged)?;
        let bm25 = Bm25::open(&dir.join("bm25")).map_err(damaged)?;
        let idx = Index {
            dir: dir.clone(),
            db: Mutex::new(conn),
            bm25,
            dense: RwLock::new(None),
            embedder,
        };
        idx.rebuild_uncommitted_bm25().map_err(damaged)?;
        idx.load_dense()?;
        Ok(idx)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn embedder(&self) -> Option<&Arc<dyn Embedder>> {
        self.embedder.as_ref()
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn generation(&self) -> u64 {
        store::generation(&self.db()).unwrap_or(0)
    }

    fn current_dense_key(&self, conn: &Connection) -> Result<Option<DenseKey>> {
        let Some(e) = &self.embedder else {
            return Ok(None);
        };
        Ok(Some(DenseKey {
            generation: store::generation(conn)?,
            vectors_generation: store::meta_get(conn, "vectors_generation")?
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            model_id: e.model_id().to_string(),
        }))
    }

    fn read_sidecar(&self) -> Option<DenseSidecar> {
        let bytes = std::fs::read(self.dir.join(SIDECAR)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Load the HNSW dump if it reflects the store; otherwise build the graph in memory
    /// from the stored vectors (a crashed or still-running writer left it behind).
    fn load_dense(&self) -> Result<()> {
        let Some(emb) = &self.embedder else {
            return Ok(());
        };
        let key = {
            let conn = self.db();
            self.current_dense_key(&conn)?
        };
        let Some(key) = key else { return Ok(()) };
        if let Some(sc) = self.read_sidecar() {
            if sc.key == key && sc.dim == emb.dim() {
                if let Ok(index) = HnswIndex::load(&self.dir, &sc.basename, sc.dim) {
                    *self.dense.write().unwrap_or_else(|e| e.into_inner()) =
                        Some(DenseState { index, key });
                    return Ok(());
                }
            }
        }
        let index = self.build_dense_from_store(&key.model_id, emb.dim())?;
        *self.dense.write().unwrap_or_else(|e| e.into_inner()) =
            index.map(|index| DenseState { index, key });
        Ok(())
    }

    fn build_dense_from_store(&self, model_id: &str, dim: usize) -> Result<Option<HnswIndex>> {
        let conn = self.db();
        let n = store::count(&conn, "SELECT COUNT(*) FROM vectors")? as usize;
        if n == 0 {
            return Ok(None);
        }
        let index = HnswIndex::new(dim, n);
        let mut batch = Vec::with_capacity(4096);
        store::for_each_vector(&conn, model_id, &mut |id, v| {
            batch.push((id, v));
            if batch.len() == 4096 {
                index.insert(&batch);
                batch.clear();
            }
        })?;
        index.insert(&batch);
        Ok(Some(index))
    }

    /// In a long-lived reader: pick up a newer dump written by another process.
    fn refresh_dense(&self) {
        let Ok(Some(key)) = self.current_dense_key(&self.db()) else {
            return;
        };
        let stale = match &*self.dense.read().unwrap_or_else(|e| e.into_inner()) {
            Some(d) => d.key != key,
            None => true,
        };
        if !stale {
            return;
        }
        if let Some(sc) = self.read_sidecar() {
            if sc.key == key {
                if let Ok(index) = HnswIndex::load(&self.dir, &sc.basename, sc.dim) {
                    *self.dense.write().unwrap_or_else(|e| e.into_inner()) =
                        Some(DenseState { index, key });
                }
            }
        }
        // Otherwise keep the older graph: hits on chunks deleted since are dropped when
        // they are looked up in the store.
    }

    /// Index (or re-index) files under `paths`. Unchanged files cost a stat; changed ones
    /// are re-parsed and only their new content is embedded; files gone from the roots are
    /// removed. Safe to kill at any moment: re-running converges to the same index.
    pub fn add_paths(
        &self,
        paths: &[PathBuf],
        opts: &IndexOptions,
        progress: &dyn Fn(IndexProgress),
    ) -> Result<IndexSummary> {
        let t0 = Instant::now();
        self.bm25.begin_write()?;
        let r = self.add_paths_locked(paths, opts, progress, t0);
        let end = self.bm25.end_write();
        let mut summary = r?;
        end?;
        summary.elapsed = t0.elapsed();
        Ok(summary)
    }

    /// The token counter, effective chunk options and config string of a run. With an
    /// embedder that has a tokenizer, chunks are counted in its tokens and capped at its
    /// window (recorded in the config, so an index chunked by the estimate re-chunks once);
    /// without one, corpus-tools' estimate.
    fn chunking(&self, opts: &IndexOptions) -> (TokenCounter, ChunkOptions, String) {
        let mut chunk = opts.chunk.clone();
        let mut tokenizer_tag = String::new();
        let counter: TokenCounter = match (&opts.token_counter, &self.embedder) {
            (Some(c), _) => c.clone(),
            (None, Some(emb)) => match emb.chunk_tokenizer() {
                Some(t) => {
                    chunk.chunk_tokens = chunk.chunk_tokens.min(t.max_text_tokens);
                    tokenizer_tag = format!("/t{}", t.id);
                    t.count
                }
                None => Arc::new(corpus_tools::tokens::estimate_tokens),
            },
            (None, None) => Arc::new(corpus_tools::tokens::estimate_tokens),
        };
        let config = format!(
            "v{PIPELINE_VERSION}/c{}/o{}/m{}{tokenizer_tag}",
            chunk.chunk_tokens, chunk.overlap_tokens, opts.limits.max_file_bytes
        );
        (counter, chunk, config)
    }

    fn add_paths_locked(
        &self,
        paths: &[PathBuf],
        opts: &IndexOptions,
        progress: &dyn Fn(IndexProgress),
        t0: Instant,
    ) -> Result<IndexSummary> {
        let _ = t0;
        self.reconcile_bm25()?;
        let mut summary = IndexSummary::default();
        let mut roots = Vec::new();
        for p in paths {
            roots.push(p.canonicalize().with_context(|| {
                format!("cannot index {}: no such file or directory", p.display())
            })?);
        }
        // Remembered before the walk, so an interrupted first run is resumed by a re-sync.
        let root_names: Vec<String> = roots
            .iter()
            .map(|r| r.to_string_lossy().into_owned())
            .collect();
        store::add_roots(&self.db(), &root_names)?;
        let (counter, chunk_opts, config) = self.chunking(opts);
        progress(IndexProgress {
            phase: Phase::Scan,
            done: 0,
            total: 0,
            current: None,
        });
        let walk_opts = WalkOptions {
            include_hidden: opts.include_hidden,
            exclude: vec![self.dir.clone()],
        };
        let (files, errors) = walk(&roots, &walk_opts);
        summary.walk_errors = errors.len() as u64;
        summary.files_seen = files.len() as u64;

        let mut seen: HashSet<String> = HashSet::with_capacity(files.len());
        let mut pending: Vec<NewDoc> = Vec::new();
        let mut pending_chunks = 0usize;
        let mut touches: Vec<(i64, u64, i64)> = Vec::new();
        let total = files.len() as u64;
        for (i, file) in files.iter().enumerate() {
            let path = file.to_string_lossy().into_owned();
            progress(IndexProgress {
                phase: Phase::Parse,
                done: i as u64,
                total,
                current: Some(path.clone()),
            });
            seen.insert(path.clone());
            let (size, mtime_ns) = match std::fs::metadata(file) {
                Ok(m) => (m.len(), mtime_ns(&m)),
                Err(_) => (0, 0),
            };
            // A file read through a loader command is re-read when that command changes.
            let config = match opts.limits.loaders.for_path(file) {
                Some(cmd) => format!("{config}/l{}", &store::hex_sha256(cmd.as_bytes())[..16]),
                None => config.clone(),
            };
            let old = store::doc_state(&self.db(), &path)?;
            if let Some(o) = &old {
                if o.size == size
                    && o.mtime_ns == mtime_ns
                    && same_config(&o.config, &config, opts.limits.timeout)
                {
                    count_unchanged(&mut summary, &path, &o.status);
                    continue;
                }
            }
            let mut doc = NewDoc {
                path,
                size,
                mtime_ns,
                content_hash: String::new(),
                kind: String::new(),
                status: store::STATUS_INDEXED.to_string(),
                config: config.clone(),
                chunks: Vec::new(),
            };
            match corpus_tools::load::read_file(file, opts.limits.max_file_bytes) {
                Err(skip) => {
                    let skip = with_flag_hint(skip, &opts.limits, Some(size));
                    count_skip(&mut summary, &doc.path, skip.reason.as_str(), &skip.detail);
                    doc.status = skipped_status(&skip);
                }
                Ok(bytes) => {
                    doc.content_hash = store::hex_sha256(&bytes);
                    if let Some(o) = &old {
                        if o.content_hash == doc.content_hash
                            && same_config(&o.config, &config, opts.limits.timeout)
                        {
                            touches.push((o.id, size, mtime_ns));
                            count_unchanged(&mut summary, &doc.path, &o.status);
                            continue;
                        }
                    }
                    match parse_isolated_detailed(file, bytes, &opts.limits) {
                        Ok(parsed) => {
                            doc.kind = parsed.kind.as_str().to_string();
                            doc.chunks = chunk_doc(&parsed, &chunk_opts, &*counter)
                                .into_iter()
                                .map(|c| NewChunk {
                                    text: c.text,
                                    heading: c.heading,
                                    lines: c.lines,
                                    page: c.page,
                                })
                                .collect();
                            summary.files_indexed += 1;
                        }
                        Err(skip) => {
                            if skip.reason == SkipReason::Timeout {
                                doc.config = format!(
                                    "{config}{TIMEOUT_TAG}{}",
                                    opts.limits.timeout.as_millis()
                                );
                            }
                            let skip = with_flag_hint(skip, &opts.limits, None);
                            count_skip(&mut summary, &doc.path, skip.reason.as_str(), &skip.detail);
                            doc.status = skipped_status(&skip);
                        }
                    }
                }
            }
            pending_chunks += doc.chunks.len();
            pending.push(doc);
            if pending_chunks >= opts.commit_every_chunks || pending.len() >= 500 {
                self.commit_docs(std::mem::take(&mut pending), &[], &mut summary)?;
                pending_chunks = 0;
            }
        }
        // Files under the indexed roots that are gone (or now ignored) leave the index.
        let gone: Vec<String> = store::doc_paths(&self.db())?
            .into_iter()
            .filter(|p| !seen.contains(p) && roots.iter().any(|r| Path::new(p).starts_with(r)))
            .collect();
        summary.files_removed = gone.len() as u64;
        if !pending.is_empty() || !gone.is_empty() {
            self.commit_docs(pending, &gone, &mut summary)?;
        }
        if !touches.is_empty() {
            // Stat-only refresh: content is unchanged, so no new generation.
            let mut conn = self.db();
            let tx = conn.transaction()?;
            for (id, size, mtime) in &touches {
                store::touch_doc(&tx, *id, *size, *mtime)?;
            }
            tx.commit()?;
        }
        if let Some(emb) = self.embedder.clone() {
            summary.chunks_embedded = self.embed_missing(&*emb, opts, progress)?;
            progress(IndexProgress {
                phase: Phase::Finish,
                done: 0,
                total: 0,
                current: None,
            });
            self.reconcile_dense(&*emb)?;
        } else {
            let mut conn = self.db();
            let tx = conn.transaction()?;
            store::gc_vectors(&tx, None)?;
            tx.commit()?;
        }
        let conn = self.db();
        store::mark_roots_synced(&conn, &root_names)?;
        summary.chunks_total = store::count(&conn, "SELECT COUNT(*) FROM chunks")?;
        summary.generation = store::generation(&conn)?;
        Ok(summary)
    }

    /// The commit point: one transaction for the store, then BM25 with the same generation.
    fn commit_docs(
        &self,
        docs: Vec<NewDoc>,
        gone: &[String],
        summary: &mut IndexSummary,
    ) -> Result<()> {
        let mut removed_all = Vec::new();
        let mut added_all: Vec<(i64, usize, usize)> = Vec::new();
        let gen;
        {
            let mut conn = self.db();
            let tx = conn.transaction()?;
            gen = store::bump_generation(&tx)?;
            for (di, d) in docs.iter().enumerate() {
                let (removed, added) = store::replace_doc(&tx, d, gen)?;
                removed_all.extend(removed);
                added_all.extend(added.into_iter().enumerate().map(|(ci, id)| (id, di, ci)));
            }
            for p in gone {
                if let Some(removed) = store::delete_doc(&tx, p)? {
                    removed_all.extend(removed);
                }
            }
            tx.commit()?;
        }
        self.bm25.delete(&removed_all)?;
        for (id, di, ci) in &added_all {
            let c = &docs[*di].chunks[*ci];
            self.bm25.add(&Bm25Doc {
                chunk_id: *id,
                text: &c.text,
                heading: c.heading.as_deref(),
                path: &docs[*di].path,
            })?;
        }
        self.bm25.commit(gen)?;
        if let Some(d) = &*self.dense.read().unwrap_or_else(|e| e.into_inner()) {
            for id in &removed_all {
                d.index.remove(*id);
            }
        }
        summary.chunks_added += added_all.len() as u64;
        summary.chunks_removed += removed_all.len() as u64;
        Ok(())
    }

    /// A text index that never committed over a store with documents (recreated for a new
    /// layout by [`Bm25::open`], or removed by hand) is rebuilt on open, so that a reader
    /// does not search an empty one. If a writer holds its lock, that writer rebuilds it.
    fn rebuild_uncommitted_bm25(&self) -> Result<()> {
        if self.bm25.committed_generation()?.is_some() || self.generation() == 0 {
            return Ok(());
        }
        if self.bm25.begin_write().is_err() {
            return Ok(());
        }
        let r = self.reconcile_bm25();
        let end = self.bm25.end_write();
        r?;
        end
    }

    /// Rebuild the text index from the store when its commit is not the store's latest.
    fn reconcile_bm25(&self) -> Result<()> {
        let gen = store::generation(&self.db())?;
        if self.bm25.committed_generation()? == Some(gen) {
            return Ok(());
        }
        tracing::info!("bm25 index behind the store (generation {gen}): rebuilding");
        self.bm25.delete_all()?;
        let conn = self.db();
        store::for_each_chunk(&conn, &mut |c| {
            self.bm25.add(&Bm25Doc {
                chunk_id: c.id,
                text: &c.text,
                heading: c.heading.as_deref(),
                path: &c.path,
            })
        })?;
        drop(conn);
        self.bm25.commit(gen)
    }

    /// Embed every chunk content that has no vector for the current model.
    fn embed_missing(
        &self,
        emb: &dyn Embedder,
        opts: &IndexOptions,
        progress: &dyn Fn(IndexProgress),
    ) -> Result<u64> {
        let model = emb.model_id().to_string();
        let total = {
            let conn = self.db();
            conn.query_row(
                "SELECT COUNT(DISTINCT c.text_hash) FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM vectors v WHERE v.text_hash=c.text_hash AND v.model_id=?1)",
                [&model],
                |r| r.get::<_, i64>(0),
            )? as u64
        };
        let mut done = 0u64;
        progress(IndexProgress {
            phase: Phase::Embed,
            done,
            total,
            current: None,
        });
        let batch = opts.embed_batch.max(1);
        loop {
            let todo = store::missing_vectors(&self.db(), &model, batch * 8)?;
            if todo.is_empty() {
                break;
            }
            let mut out = Vec::with_capacity(todo.len());
            for group in todo.chunks(batch) {
                let texts: Vec<&str> = group.iter().map(|(_, t)| t.as_str()).collect();
                let vecs = emb.embed_batch(&texts).context("embedding chunks")?;
                anyhow::ensure!(
                    vecs.len() == texts.len(),
                    "embedder returned {} vectors for {} texts",
                    vecs.len(),
                    texts.len()
                );
                for ((h, _), v) in group.iter().zip(vecs) {
                    anyhow::ensure!(
                        v.len() == emb.dim(),
                        "embedder returned a {}-d vector, expected {}",
                        v.len(),
                        emb.dim()
                    );
                    anyhow::ensure!(
                        v.iter().all(|x| x.is_finite()),
                        "embedder returned a non-finite vector"
                    );
                    out.push((h.clone(), v));
                }
                done += group.len() as u64;
                progress(IndexProgress {
                    phase: Phase::Embed,
                    done,
                    total,
                    current: None,
                });
            }
            let mut conn = self.db();
            let tx = conn.transaction()?;
            store::insert_vectors(&tx, &model, &out)?;
            bump_meta(&tx, "vectors_generation")?;
            store::meta_set(&tx, "model_id", &model)?;
            tx.commit()?;
        }
        let mut conn = self.db();
        let tx = conn.transaction()?;
        if store::gc_vectors(&tx, Some(&model))? > 0 {
            bump_meta(&tx, "vectors_generation")?;
        }
        // Which embedder to load for this index from now on (`Index::stored_embedder`).
        match emb.name() {
            Some(name) => store::meta_set(&tx, "embedder", name)?,
            None => {
                tx.execute("DELETE FROM meta WHERE key='embedder'", [])?;
            }
        }
        tx.commit()?;
        Ok(done)
    }

    /// Bring the HNSW graph in line with the store (tombstones for deleted chunks, inserts
    /// for new ones, full rebuild when tombstones pile up) and dump it.
    fn reconcile_dense(&self, emb: &dyn Embedder) -> Result<()> {
        let key = self.current_dense_key(&self.db())?.context("no embedder")?;
        if let Some(sc) = self.read_sidecar() {
            let loaded = self
                .dense
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|d| d.key.clone());
            if sc.key == key && loaded.as_ref() == Some(&key) {
                return Ok(());
            }
        }
        let desired: HashSet<i64> = {
            let conn = self.db();
            let mut st = conn.prepare("SELECT c.id FROM chunks c JOIN vectors v ON v.text_hash=c.text_hash AND v.model_id=?1")?;
            let ids = st
                .query_map([&key.model_id], |r| r.get(0))?
                .collect::<rusqlite::Result<HashSet<i64>>>()?;
            ids
        };
        let mut guard = self.dense.write().unwrap_or_else(|e| e.into_inner());
        let reuse = match guard.take() {
            Some(d) if d.key.model_id == key.model_id && d.index.dim() == emb.dim() => {
                let live = d.index.ids();
                let stale: Vec<i64> = live.difference(&desired).copied().collect();
                if (d.index.tombstones() + stale.len()) * 5 > desired.len().max(1) {
                    None
                } else {
                    for id in stale {
                        d.index.remove(id);
                    }
                    let missing: HashSet<i64> = desired.difference(&live).copied().collect();
                    if !missing.is_empty() {
                        let mut batch = Vec::new();
                        store::for_each_vector(&self.db(), &key.model_id, &mut |id, v| {
                            if missing.contains(&id) {
                                batch.push((id, v));
                            }
                        })?;
                        d.index.insert(&batch);
                    }
                    Some(d.index)
                }
            }
            _ => None,
        };
        let index = match reuse {
            Some(i) => Some(i),
            None => self.build_dense_from_store(&key.model_id, emb.dim())?,
        };
        let Some(index) = index else {
            let _ = std::fs::remove_file(self.dir.join(SIDECAR));
            return Ok(());
        };
        let basename = format!("hnsw-{}-{}", key.generation, key.vectors_generation);
        index.save(&self.dir, &basename)?;
        let old = self.read_sidecar();
        let sc = DenseSidecar {
            key: key.clone(),
            dim: emb.dim(),
            basename: basename.clone(),
        };
        let tmp = self.dir.join(format!("{SIDECAR}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(&sc)?)?;
        std::fs::rename(&tmp, self.dir.join(SIDECAR))?;
        if let Some(old) = old {
            if old.basename != basename {
                HnswIndex::remove_files(&self.dir, &old.basename);
            }
        }
        *guard = Some(DenseState { index, key });
        Ok(())
    }

    /// Remove a file, or every file under a directory, from the index, and forget the
    /// roots at or under it (a re-sync does not bring them back). The path need not exist
    /// any more. Returns the number of documents removed.
    pub fn remove_path(&self, path: &Path) -> Result<usize> {
        let p = indexed_form(path);
        self.bm25.begin_write()?;
        let r = (|| {
            self.reconcile_bm25()?;
            {
                let mut conn = self.db();
                let tx = conn.transaction()?;
                for root in store::roots(&tx)? {
                    if Path::new(&root.path).starts_with(&p) {
                        store::forget_root(&tx, &root.path)?;
                    }
                }
                tx.commit()?;
            }
            let gone: Vec<String> = store::doc_paths(&self.db())?
                .into_iter()
                .filter(|d| Path::new(d).starts_with(&p))
                .collect();
            if !gone.is_empty() {
                self.commit_docs(Vec::new(), &gone, &mut IndexSummary::default())?;
                if let Some(emb) = self.embedder.clone() {
                    self.reconcile_dense(&*emb)?;
                }
            }
            Ok(gone.len())
        })();
        self.bm25.end_write()?;
        r
    }

    /// Ranked chunks for `query`. Hybrid fuses BM25 and dense with the default fusion
    /// (see [`DEFAULT_FUSION`]); without an embedder it degrades to BM25.
    pub fn search(&self, query: &str, k: usize, mode: SearchMode) -> Result<Vec<Hit>> {
        self.search_with(query, k, mode, DEFAULT_FUSION)
    }

    pub fn search_with(
        &self,
        query: &str,
        k: usize,
        mode: SearchMode,
        fusion: Fusion,
    ) -> Result<Vec<Hit>> {
        if mode == SearchMode::Dense && self.embedder.is_none() {
            bail!("dense search needs the embedding model (this index was opened without one)");
        }
        let (bm25, dense) = self.candidates(query, k.max(CANDIDATES), mode)?;
        let fused: Vec<Fused> = match mode {
            SearchMode::Bm25 => single(&bm25, true),
            SearchMode::Dense => single(&dense, false),
            SearchMode::Hybrid => self.fuse(query, &bm25, &dense, fusion)?,
        };
        self.hits(&fused, k)
    }

    /// Hybrid ranking of the two candidate lists of `query`. With the adaptive fusion, a
    /// question in another language than English gets BM25's order when the embedder reads
    /// English only: that model's vector of such a question is noise, not a weaker signal
    /// (`bench/retrieval/multilingual.jsonl`, docs/retrieval.md). Chunks only dense search
    /// found then follow BM25's, in dense order. Call it after [`Index::candidates`] for the
    /// same query: the language is read from the text index as that search saw it.
    pub fn fuse(
        &self,
        query: &str,
        bm25: &[(i64, f32)],
        dense: &[(i64, f32)],
        fusion: Fusion,
    ) -> Result<Vec<Fused>> {
        if let Fusion::Adaptive(a) = fusion {
            let english_only = self.embedder.as_ref().is_some_and(|e| !e.multilingual());
            if english_only
                && !bm25.is_empty()
                && self.bm25.query_language(query)? != Language::English
            {
                return Ok(crate::hybrid::weighted_rrf(bm25, dense, 1.0, a.k));
            }
        }
        Ok(fuse(bm25, dense, fusion))
    }

    /// The two candidate lists (chunk id, score), best first, before fusion.
    pub fn candidates(
        &self,
        query: &str,
        pool: usize,
        mode: SearchMode,
    ) -> Result<(Ranked, Ranked)> {
        let bm25 = if mode != SearchMode::Dense {
            self.bm25.search(query, pool)?
        } else {
            Vec::new()
        };
        let dense = if mode != SearchMode::Bm25 {
            self.dense_search(query, pool)?
        } else {
            Vec::new()
        };
        Ok((bm25, dense))
    }

    /// Resolve fused candidates to hits, skipping chunks gone from the store (derived
    /// indexes may lag it), until `k` are found.
    pub fn hits(&self, fused: &[Fused], k: usize) -> Result<Vec<Hit>> {
        let conn = self.db();
        let mut hits = Vec::with_capacity(k);
        for f in fused {
            if hits.len() >= k {
                break;
            }
            let Some(c) = store::chunk_by_id(&conn, f.id)? else {
                continue;
            };
            hits.push(Hit {
                chunk_id: c.id,
                path: c.path,
                lines: c.lines,
                page: c.page,
                heading: c.heading,
                text: c.text,
                score: f.score,
                bm25_rank: f.bm25_rank,
                dense_rank: f.dense_rank,
            });
        }
        Ok(hits)
    }

    fn dense_search(&self, query: &str, k: usize) -> Result<Vec<(i64, f32)>> {
        let Some(emb) = &self.embedder else {
            return Ok(Vec::new());
        };
        self.ensure_vectors_match(emb.as_ref())?;
        self.refresh_dense();
        let guard = self.dense.read().unwrap_or_else(|e| e.into_inner());
        let Some(d) = &*guard else {
            return Ok(Vec::new());
        };
        let q = emb.embed_query(query)?;
        Ok(d.index.search(&q, k))
    }

    /// Fails if the stored vectors were made by another model than `emb`: no query vector of
    /// `emb` may be compared with them, and quietly returning no dense hits would hide that.
    fn ensure_vectors_match(&self, emb: &dyn Embedder) -> Result<()> {
        let conn = self.db();
        let Some(stored) = store::meta_get(&conn, "model_id")? else {
            return Ok(());
        };
        if stored == emb.model_id() {
            return Ok(());
        }
        let vectors: i64 = conn.query_row(
            "SELECT COUNT(*) FROM vectors WHERE model_id=?1",
            [&stored],
            |r| r.get(0),
        )?;
        if vectors == 0 {
            return Ok(());
        }
        let by = store::meta_get(&conn, "embedder")?
            .map(|n| format!(" (embedder {n})"))
            .unwrap_or_default();
        bail!(
            "the index at {} was embedded by {stored}{by}, not by {}: search it with the \
             embedder and weight format (RAG_EMBED_FORMAT) it was built with (name no \
             --embedder to use the stored one), or re-embed it with `rag index --embedder NAME`",
            self.dir.display(),
            emb.model_id()
        )
    }

    /// The embedder (model-cache name, e.g. `multilingual-e5-small`) whose vectors the index
    /// at `dir` holds, as recorded when they were stored; `None` for an index without one
    /// (new, BM25-only, or embedded before the name was recorded: MiniLM).
    pub fn stored_embedder(dir: &Path) -> Result<Option<String>> {
        let path = dir.join("store.sqlite");
        if !path.is_file() {
            return Ok(None);
        }
        store::meta_get(&store::open(&path)?, "embedder")
    }

    pub fn chunk(&self, id: i64) -> Result<Option<Chunk>> {
        store::chunk_by_id(&self.db(), id)
    }

    /// Visit every chunk's id and text (e.g. to build the speculative-decoding token
    /// database). Holds the store lock for the duration.
    pub fn for_each_chunk_text(&self, f: &mut dyn FnMut(i64, &str)) -> Result<()> {
        store::for_each_chunk(&self.db(), &mut |c| {
            f(c.id, &c.text);
            Ok(())
        })
    }

    /// Content digest of the committed index (paths, chunk positions and hashes).
    pub fn fingerprint(&self) -> Result<String> {
        store::fingerprint(&self.db())
    }

    /// The folders (or files) this index was built from, with how many of its documents
    /// each holds.
    pub fn roots(&self) -> Result<Vec<IndexRoot>> {
        let conn = self.db();
        let docs = store::doc_statuses(&conn)?;
        store::roots(&conn)?
            .into_iter()
            .map(|r| {
                let under: Vec<&(String, String)> = docs
                    .iter()
                    .filter(|(d, _)| Path::new(d).starts_with(&r.path))
                    .collect();
                let indexed = under
                    .iter()
                    .filter(|(_, st)| st == store::STATUS_INDEXED)
                    .count() as u64;
                Ok(IndexRoot {
                    documents: indexed,
                    skipped_documents: under.len() as u64 - indexed,
                    path: r.path,
                    added_unix: r.added_unix,
                    synced_unix: r.synced_unix,
                })
            })
            .collect()
    }

    /// The schema version of the store (`store::SCHEMA_VERSION` once opened by this build).
    pub fn schema_version(&self) -> Result<usize> {
        store::schema_version(&self.db())
    }

    /// When the indexed content last changed (seconds since the Unix epoch), if the store
    /// records it.
    pub fn updated_unix(&self) -> Option<i64> {
        store::meta_get(&self.db(), "updated_unix")
            .ok()
            .flatten()
            .and_then(|v| v.parse().ok())
    }

    pub fn stats(&self) -> IndexStats {
        let conn = self.db();
        let c = |sql: &str| store::count(&conn, sql).unwrap_or(0);
        let model_id = store::meta_get(&conn, "model_id").ok().flatten();
        IndexStats {
            documents: c("SELECT COUNT(*) FROM documents WHERE status='indexed'"),
            skipped_documents: c("SELECT COUNT(*) FROM documents WHERE status<>'indexed'"),
            chunks: c("SELECT COUNT(*) FROM chunks"),
            vectors: c("SELECT COUNT(*) FROM vectors"),
            bm25_docs: self.bm25.num_docs().unwrap_or(0),
            dense_vectors: self
                .dense
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map(|d| d.index.ids().len() as u64)
                .unwrap_or(0),
            generation: store::generation(&conn).unwrap_or(0),
            model_id,
        }
    }
}

/// Candidates taken from each list before fusion.
pub const CANDIDATES: usize = 50;

/// The fusion `search` uses for hybrid mode: adaptive weighted RRF, whose list weights
/// follow how sure each list is of its head (`hybrid::adaptive`). Chosen on a tuning set of
/// its own; on the three evaluation sets it is the only fusion measured whose MRR and
/// recall@5 are at least the best single method's on every set (docs/retrieval.md,
/// BENCHMARKS.md).
pub const DEFAULT_FUSION: Fusion = Fusion::Adaptive(crate::hybrid::ADAPTIVE);

fn single(list: &[(i64, f32)], is_bm25: bool) -> Vec<Fused> {
    list.iter()
        .enumerate()
        .map(|(i, (id, s))| Fused {
            id: *id,
            score: *s,
            bm25_rank: is_bm25.then_some(i + 1),
            dense_rank: (!is_bm25).then_some(i + 1),
        })
        .collect()
}

fn bump_meta(tx: &rusqlite::Transaction, key: &str) -> Result<u64> {
    let v = store::meta_get(tx, key)?
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    store::meta_set(tx, key, &v.to_string())?;
    Ok(v)
}

/// `path` as the index stores paths under it: canonical, or, for a path that no longer
/// exists, its canonical parent joined with its name (else made absolute).
fn indexed_form(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (abs.parent().map(Path::canonicalize), abs.file_name()) {
        (Some(Ok(parent)), Some(name)) => parent.join(name),
        _ => abs,
    }
}

fn mtime_ns(m: &std::fs::Metadata) -> i64 {
    m.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
