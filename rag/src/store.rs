//! SQLite store: the source of truth for documents, chunks, content hashes, vectors and
//! the index generation. Every write goes through one transaction that also bumps the
//! generation, so the commit of that transaction is the commit point of the whole index;
//! BM25 and HNSW are derived from these tables and reconciled against the generation.

use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use sha2::{Digest, Sha256};
use std::path::Path;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents(
  id INTEGER PRIMARY KEY,
  path TEXT NOT NULL UNIQUE,
  size INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  content_hash TEXT NOT NULL,
  kind TEXT NOT NULL,
  status TEXT NOT NULL,
  config TEXT NOT NULL,
  generation INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS chunks(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  doc_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
  ord INTEGER NOT NULL,
  text TEXT NOT NULL,
  heading TEXT,
  line_start INTEGER,
  line_end INTEGER,
  page INTEGER,
  text_hash TEXT NOT NULL,
  generation INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_id);
CREATE INDEX IF NOT EXISTS chunks_hash ON chunks(text_hash);
CREATE TABLE IF NOT EXISTS vectors(
  text_hash TEXT NOT NULL,
  model_id TEXT NOT NULL,
  vec BLOB NOT NULL,
  PRIMARY KEY(text_hash, model_id));
";

/// Schema changes since [`SCHEMA`], in order: `MIGRATIONS[v]` takes a store whose
/// `PRAGMA user_version` is `v` to `v + 1`. Each only adds, so an index written by an
/// older build opens (and is upgraded in place), and an older build still reads the tables
/// it knows.
const MIGRATIONS: [&str; 1] = [
    // 1: the folders (or files) the index was built from, so `rag index` alone re-syncs them.
    "CREATE TABLE IF NOT EXISTS roots(
       path TEXT PRIMARY KEY,
       added_unix INTEGER NOT NULL,
       synced_unix INTEGER);",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// Status of a document row: indexed, or remembered as skipped (so an unchanged bad file
/// is not parsed again on every run).
pub const STATUS_INDEXED: &str = "indexed";

#[derive(Debug, Clone)]
pub struct DocState {
    pub id: i64,
    pub size: u64,
    pub mtime_ns: i64,
    pub content_hash: String,
    pub config: String,
    pub status: String,
}

#[derive(Debug, Clone)]
pub struct NewChunk {
    pub text: String,
    pub heading: Option<String>,
    pub lines: Option<(u32, u32)>,
    pub page: Option<u32>,
}

impl NewChunk {
    /// The text the embedder sees: the heading path gives a short chunk its context.
    pub fn embed_text(&self) -> String {
        embed_text(self.heading.as_deref(), &self.text)
    }
    pub fn hash(&self) -> String {
        hex_sha256(self.embed_text().as_bytes())
    }
}

pub fn embed_text(heading: Option<&str>, text: &str) -> String {
    match heading {
        Some(h) if !h.is_empty() => format!("{h}\n{text}"),
        _ => text.to_string(),
    }
}

#[derive(Debug, Clone)]
pub struct NewDoc {
    pub path: String,
    pub size: u64,
    pub mtime_ns: i64,
    pub content_hash: String,
    pub kind: String,
    pub status: String,
    pub config: String,
    pub chunks: Vec<NewChunk>,
}

/// A stored chunk with its document path.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChunkRow {
    pub id: i64,
    pub path: String,
    pub ord: u32,
    pub text: String,
    pub heading: Option<String>,
    pub lines: Option<(u32, u32)>,
    pub page: Option<u32>,
    pub text_hash: String,
}

pub fn hex_sha256(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    anyhow::ensure!(
        mode.eq_ignore_ascii_case("wal"),
        "sqlite refused WAL mode ({mode})"
    );
    // NORMAL is durable against process crashes (kill -9) in WAL mode.
    conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;")?;
    conn.execute_batch(SCHEMA).context("creating schema")?;
    migrate(&conn).with_context(|| format!("upgrading the schema of {}", path.display()))?;
    Ok(conn)
}

/// Apply the migrations the store lacks, in one transaction (two processes opening an old
/// index at once: the second finds it upgraded).
fn migrate(conn: &Connection) -> Result<()> {
    if schema_version(conn)? >= SCHEMA_VERSION {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let r = (|| {
        let from = schema_version(conn)?;
        for m in MIGRATIONS.iter().skip(from) {
            conn.execute_batch(m)?;
        }
        conn.execute_batch(&format!("PRAGMA user_version={SCHEMA_VERSION}"))?;
        Ok(())
    })();
    match r {
        Ok(()) => conn.execute_batch("COMMIT")?,
        Err(_) => {
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
    r
}

/// The schema version of an open store (`PRAGMA user_version`).
pub fn schema_version(conn: &Connection) -> Result<usize> {
    Ok(conn
        .query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))?
        .max(0) as usize)
}

pub fn meta_get(conn: &Connection, key: &str) -> Result<Option<String>> {
    Ok(conn
        .query_row("SELECT value FROM meta WHERE key=?1", [key], |r| r.get(0))
        .optional()?)
}

pub fn meta_set(conn: &Connection, key: &str, value: &str) -> Result<()> {
    conn.execute(
        "INSERT INTO meta(key,value) VALUES(?1,?2) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
        params![key, value],
    )?;
    Ok(())
}

pub fn generation(conn: &Connection) -> Result<u64> {
    Ok(meta_get(conn, "generation")?
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// Increment and return the generation; call inside the write transaction.
pub fn bump_generation(tx: &Transaction) -> Result<u64> {
    let g = generation(tx)? + 1;
    meta_set(tx, "generation", &g.to_string())?;
    meta_set(tx, "updated_unix", &unix_now().to_string())?;
    Ok(g)
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A folder (or file) the index was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootRow {
    pub path: String,
    pub added_unix: i64,
    /// When a run over it last finished; `None` while the first one has not.
    pub synced_unix: Option<i64>,
}

/// Remember `paths` (canonical) as roots; already known ones keep their times. A path
/// inside a known root adds nothing (a re-sync of that root covers it), and known roots
/// inside a new one give way to it, so each file is under one root.
pub fn add_roots(conn: &Connection, paths: &[String]) -> Result<()> {
    let now = unix_now();
    for p in paths {
        let known = roots(conn)?;
        if known.iter().any(|r| Path::new(p).starts_with(&r.path)) {
            continue;
        }
        for r in known.iter().filter(|r| Path::new(&r.path).starts_with(p)) {
            conn.execute("DELETE FROM roots WHERE path=?1", [&r.path])?;
        }
        conn.execute(
            "INSERT INTO roots(path, added_unix) VALUES(?1, ?2)",
            params![p, now],
        )?;
    }
    Ok(())
}

/// Record that a run over `paths` finished now.
pub fn mark_roots_synced(conn: &Connection, paths: &[String]) -> Result<()> {
    let now = unix_now();
    let mut st = conn.prepare_cached("UPDATE roots SET synced_unix=?2 WHERE path=?1")?;
    for p in paths {
        st.execute(params![p, now])?;
    }
    Ok(())
}

/// Every remembered root, by path.
pub fn roots(conn: &Connection) -> Result<Vec<RootRow>> {
    let mut st = conn.prepare("SELECT path, added_unix, synced_unix FROM roots ORDER BY path")?;
    let rows = st.query_map([], |r| {
        Ok(RootRow {
            path: r.get(0)?,
            added_unix: r.get(1)?,
            synced_unix: r.get(2)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Forget a root.
pub fn forget_root(tx: &Transaction, path: &str) -> Result<()> {
    tx.execute("DELETE FROM roots WHERE path=?1", [path])?;
    Ok(())
}

/// Every document's path and status.
pub fn doc_statuses(conn: &Connection) -> Result<Vec<(String, String)>> {
    let mut st = conn.prepare("SELECT path, status FROM documents")?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub fn doc_state(conn: &Connection, path: &str) -> Result<Option<DocState>> {
    Ok(conn
        .query_row(
            "SELECT id,size,mtime_ns,content_hash,config,status FROM documents WHERE path=?1",
            [path],
            |r| {
                Ok(DocState {
                    id: r.get(0)?,
                    size: r.get::<_, i64>(1)? as u64,
                    mtime_ns: r.get(2)?,
                    content_hash: r.get(3)?,
                    config: r.get(4)?,
                    status: r.get(5)?,
                })
            },
        )
        .optional()?)
}

/// All document paths (indexed or skipped).
pub fn doc_paths(conn: &Connection) -> Result<Vec<String>> {
    let mut st = conn.prepare("SELECT path FROM documents")?;
    let rows = st.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

fn chunk_ids_of(conn: &Connection, doc_id: i64) -> Result<Vec<i64>> {
    let mut st = conn.prepare("SELECT id FROM chunks WHERE doc_id=?1")?;
    let rows = st.query_map([doc_id], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Update only the stat fields of an unchanged document (content hash equal).
pub fn touch_doc(tx: &Transaction, id: i64, size: u64, mtime_ns: i64) -> Result<()> {
    tx.execute(
        "UPDATE documents SET size=?2, mtime_ns=?3 WHERE id=?1",
        params![id, size as i64, mtime_ns],
    )?;
    Ok(())
}

/// Replace a document and its chunks. Returns (removed chunk ids, added chunk ids).
pub fn replace_doc(tx: &Transaction, doc: &NewDoc, gen: u64) -> Result<(Vec<i64>, Vec<i64>)> {
    let removed = match doc_state(tx, &doc.path)? {
        Some(old) => {
            let ids = chunk_ids_of(tx, old.id)?;
            tx.execute("DELETE FROM chunks WHERE doc_id=?1", [old.id])?;
            tx.execute(
                "UPDATE documents SET size=?2,mtime_ns=?3,content_hash=?4,kind=?5,status=?6,config=?7,generation=?8 WHERE id=?1",
                params![old.id, doc.size as i64, doc.mtime_ns, doc.content_hash, doc.kind, doc.status, doc.config, gen as i64],
            )?;
            ids
        }
        None => {
            tx.execute(
                "INSERT INTO documents(path,size,mtime_ns,content_hash,kind,status,config,generation) VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
                params![doc.path, doc.size as i64, doc.mtime_ns, doc.content_hash, doc.kind, doc.status, doc.config, gen as i64],
            )?;
            Vec::new()
        }
    };
    let doc_id: i64 = tx.query_row("SELECT id FROM documents WHERE path=?1", [&doc.path], |r| {
        r.get(0)
    })?;
    let mut added = Vec::with_capacity(doc.chunks.len());
    let mut st = tx.prepare_cached(
        "INSERT INTO chunks(doc_id,ord,text,heading,line_start,line_end,page,text_hash,generation) VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)",
    )?;
    for (ord, c) in doc.chunks.iter().enumerate() {
        st.execute(params![
            doc_id,
            ord as i64,
            c.text,
            c.heading,
            c.lines.map(|l| l.0),
            c.lines.map(|l| l.1),
            c.page,
            c.hash(),
            gen as i64
        ])?;
        added.push(tx.last_insert_rowid());
    }
    Ok((removed, added))
}

/// Delete a document (and its chunks). Returns the removed chunk ids.
pub fn delete_doc(tx: &Transaction, path: &str) -> Result<Option<Vec<i64>>> {
    let Some(old) = doc_state(tx, path)? else {
        return Ok(None);
    };
    let ids = chunk_ids_of(tx, old.id)?;
    tx.execute("DELETE FROM chunks WHERE doc_id=?1", [old.id])?;
    tx.execute("DELETE FROM documents WHERE id=?1", [old.id])?;
    Ok(Some(ids))
}

fn row_to_chunk(r: &rusqlite::Row) -> rusqlite::Result<ChunkRow> {
    let ls: Option<u32> = r.get(5)?;
    let le: Option<u32> = r.get(6)?;
    Ok(ChunkRow {
        id: r.get(0)?,
        path: r.get(1)?,
        ord: r.get(2)?,
        text: r.get(3)?,
        heading: r.get(4)?,
        lines: ls.zip(le),
        page: r.get(7)?,
        text_hash: r.get(8)?,
    })
}

const CHUNK_COLS: &str =
    "c.id, d.path, c.ord, c.text, c.heading, c.line_start, c.line_end, c.page, c.text_hash FROM chunks c JOIN documents d ON d.id=c.doc_id";

pub fn chunk_by_id(conn: &Connection, id: i64) -> Result<Option<ChunkRow>> {
    let sql = format!("SELECT {CHUNK_COLS} WHERE c.id=?1");
    Ok(conn.query_row(&sql, [id], row_to_chunk).optional()?)
}

/// Visit every chunk in id order.
pub fn for_each_chunk(conn: &Connection, f: &mut dyn FnMut(ChunkRow) -> Result<()>) -> Result<()> {
    let sql = format!("SELECT {CHUNK_COLS} ORDER BY c.id");
    let mut st = conn.prepare(&sql)?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        f(row_to_chunk(r)?)?;
    }
    Ok(())
}

pub fn count(conn: &Connection, sql: &str) -> Result<u64> {
    Ok(conn.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64)
}

/// Up to `limit` distinct chunk contents that have no vector for `model_id` yet.
pub fn missing_vectors(
    conn: &Connection,
    model_id: &str,
    limit: usize,
) -> Result<Vec<(String, String)>> {
    let mut st = conn.prepare_cached(
        "SELECT c.text_hash, c.heading, c.text FROM chunks c
         WHERE NOT EXISTS (SELECT 1 FROM vectors v WHERE v.text_hash=c.text_hash AND v.model_id=?1)
         GROUP BY c.text_hash LIMIT ?2",
    )?;
    let rows = st.query_map(params![model_id, limit as i64], |r| {
        let h: String = r.get(0)?;
        let heading: Option<String> = r.get(1)?;
        let text: String = r.get(2)?;
        Ok((h, embed_text(heading.as_deref(), &text)))
    })?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub fn insert_vectors(
    tx: &Transaction,
    model_id: &str,
    items: &[(String, Vec<f32>)],
) -> Result<()> {
    let mut st = tx.prepare_cached(
        "INSERT OR REPLACE INTO vectors(text_hash,model_id,vec) VALUES(?1,?2,?3)",
    )?;
    for (h, v) in items {
        st.execute(params![h, model_id, vec_to_blob(v)])?;
    }
    Ok(())
}

/// Drop vectors no chunk uses any more (and, given the current model, other models').
pub fn gc_vectors(tx: &Transaction, model_id: Option<&str>) -> Result<usize> {
    let orphans = tx.execute(
        "DELETE FROM vectors WHERE text_hash NOT IN (SELECT text_hash FROM chunks)",
        [],
    )?;
    let other = match model_id {
        Some(m) => tx.execute("DELETE FROM vectors WHERE model_id<>?1", [m])?,
        None => 0,
    };
    Ok(orphans + other)
}

/// Visit (chunk id, vector) for every chunk that has a vector for `model_id`.
pub fn for_each_vector(
    conn: &Connection,
    model_id: &str,
    f: &mut dyn FnMut(i64, Vec<f32>),
) -> Result<()> {
    let mut st = conn.prepare(
        "SELECT c.id, v.vec FROM chunks c JOIN vectors v ON v.text_hash=c.text_hash AND v.model_id=?1 ORDER BY c.id",
    )?;
    let mut rows = st.query([model_id])?;
    while let Some(r) = rows.next()? {
        let blob: Vec<u8> = r.get(1)?;
        f(r.get(0)?, blob_to_vec(&blob));
    }
    Ok(())
}

pub fn vec_to_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn blob_to_vec(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A digest of the index content independent of ids and timing: every chunk's path,
/// position, location and hash, sorted. Two runs over the same files must agree.
pub fn fingerprint(conn: &Connection) -> Result<String> {
    let mut st = conn.prepare(
        "SELECT d.path, c.ord, c.line_start, c.line_end, c.page, c.text_hash FROM chunks c JOIN documents d ON d.id=c.doc_id ORDER BY d.path, c.ord",
    )?;
    let mut rows = st.query([])?;
    let mut h = Sha256::new();
    while let Some(r) = rows.next()? {
        let path: String = r.get(0)?;
        let ord: i64 = r.get(1)?;
        let ls: Option<i64> = r.get(2)?;
        let le: Option<i64> = r.get(3)?;
        let pg: Option<i64> = r.get(4)?;
        let hash: String = r.get(5)?;
        h.update(format!("{path}\t{ord}\t{ls:?}\t{le:?}\t{pg:?}\t{hash}\n").as_bytes());
    }
    let docs = count(conn, "SELECT COUNT(*) FROM documents")?;
    h.update(format!("docs={docs}").as_bytes());
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store written before the migrations (user_version 0, no `roots`) opens with its
    /// documents intact and is upgraded: `roots` works and the version is current.
    #[test]
    fn an_index_from_before_the_migrations_opens_and_is_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite");
        {
            let old = Connection::open(&path).unwrap();
            old.execute_batch(SCHEMA).unwrap();
            old.execute(
                "INSERT INTO documents(path,size,mtime_ns,content_hash,kind,status,config,generation) \
                 VALUES('/docs/a.md',1,2,'h','markdown','indexed','c',1)",
                [],
            )
            .unwrap();
            meta_set(&old, "generation", "1").unwrap();
            assert_eq!(schema_version(&old).unwrap(), 0);
        }
        let conn = open(&path).unwrap();
        assert_eq!(schema_version(&conn).unwrap(), SCHEMA_VERSION);
        assert_eq!(doc_paths(&conn).unwrap(), vec!["/docs/a.md".to_string()]);
        assert_eq!(generation(&conn).unwrap(), 1);
        assert!(roots(&conn).unwrap().is_empty());
        add_roots(&conn, &["/docs".into()]).unwrap();
        add_roots(&conn, &["/docs".into()]).unwrap();
        mark_roots_synced(&conn, &["/docs".into()]).unwrap();
        let r = roots(&conn).unwrap();
        assert_eq!(r.len(), 1);
        assert!(r[0].synced_unix.is_some());
        drop(conn);
        // Opening again (already current) changes nothing.
        let conn = open(&path).unwrap();
        assert_eq!(roots(&conn).unwrap(), r);
    }

    /// Each path is under one root: a nested one adds nothing, an enclosing one replaces
    /// the roots inside it.
    #[test]
    fn roots_do_not_nest() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir.path().join("store.sqlite")).unwrap();
        let paths = |c: &Connection| -> Vec<String> {
            roots(c).unwrap().into_iter().map(|r| r.path).collect()
        };
        add_roots(&conn, &["/d/a".into(), "/d/b/x.md".into(), "/dx".into()]).unwrap();
        assert_eq!(paths(&conn), ["/d/a", "/d/b/x.md", "/dx"]);
        add_roots(&conn, &["/d".into()]).unwrap();
        assert_eq!(paths(&conn), ["/d", "/dx"]);
        add_roots(&conn, &["/d/a/deeper".into(), "/d".into()]).unwrap();
        assert_eq!(paths(&conn), ["/d", "/dx"]);
    }
}
