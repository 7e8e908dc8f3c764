//! BM25 over chunks with tantivy. Derived from the SQLite store: every tantivy commit
//! carries the store generation it reflects as its payload, so a writer that finds a
//! mismatch (a crash between the two commits) rebuilds the whole text index from SQLite.

use crate::bm25_guard::guarded;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Mutex;
use tantivy::collector::TopDocs;
use tantivy::query::QueryParser;
use tantivy::schema::{Field, NumericOptions, Schema, Value, STORED, TEXT};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, TextAnalyzer,
};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

const TOKENIZER: &str = "en_stem_rag";

pub struct Bm25 {
    index: Index,
    reader: IndexReader,
    writer: Mutex<Option<IndexWriter>>,
    f_id: Field,
    f_text: Field,
    f_heading: Field,
    f_path: Field,
}

/// What the text index stores per chunk.
pub struct Bm25Doc<'a> {
    pub chunk_id: i64,
    pub text: &'a str,
    pub heading: Option<&'a str>,
    pub path: &'a str,
}

fn schema() -> Schema {
    let mut b = Schema::builder();
    let text_opts = TEXT.set_indexing_options(
        tantivy::schema::TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER)
            .set_index_option(tantivy::schema::IndexRecordOption::WithFreqsAndPositions),
    );
    b.add_u64_field("chunk_id", NumericOptions::default().set_indexed() | STORED);
    b.add_text_field("text", text_opts.clone());
    b.add_text_field("heading", text_opts.clone());
    b.add_text_field("path", text_opts);
    b.build()
}

impl Bm25 {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mmap =
            tantivy::directory::MmapDirectory::open(dir).context("opening tantivy directory")?;
        let index = Index::open_or_create(mmap, schema()).context("opening tantivy index")?;
        let analyzer = TextAnalyzer::builder(SimpleTokenizer::default())
            .filter(RemoveLongFilter::limit(40))
            .filter(LowerCaser)
            .filter(Stemmer::new(Language::English))
            .build();
        index.tokenizers().register(TOKENIZER, analyzer);
        let reader = guarded("opening tantivy reader", || {
            index
                .reader_builder()
                .reload_policy(ReloadPolicy::Manual)
                .try_into()
                .context("opening tantivy reader")
        })?;
        let s = index.schema();
        Ok(Bm25 {
            f_id: s.get_field("chunk_id")?,
            f_text: s.get_field("text")?,
            f_heading: s.get_field("heading")?,
            f_path: s.get_field("path")?,
            index,
            reader,
            writer: Mutex::new(None),
        })
    }

    /// Take the (cross-process) tantivy writer lock. Fails if another indexer holds it.
    pub fn begin_write(&self) -> Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            let writer = self.index.writer_with_num_threads(1, 64 << 20).context(
                "another `rag index` seems to be running on this index (tantivy writer lock)",
            )?;
            *w = Some(writer);
        }
        Ok(())
    }

    /// Release the writer (and its lock).
    pub fn end_write(&self) -> Result<()> {
        let w = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = w {
            w.wait_merging_threads().ok();
        }
        Ok(())
    }

    fn with_writer<T>(&self, f: impl FnOnce(&mut IndexWriter) -> Result<T>) -> Result<T> {
        let mut g = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let w = g.as_mut().context("bm25: begin_write not called")?;
        f(w)
    }

    /// Store generation the committed text index reflects.
    pub fn committed_generation(&self) -> Result<Option<u64>> {
        Ok(self
            .index
            .load_metas()?
            .payload
            .and_then(|p| p.parse().ok()))
    }

    pub fn delete(&self, ids: &[i64]) -> Result<()> {
        self.with_writer(|w| {
            for &id in ids {
                w.delete_term(Term::from_field_u64(self.f_id, id as u64));
            }
            Ok(())
        })
    }

    pub fn delete_all(&self) -> Result<()> {
        self.with_writer(|w| {
            w.delete_all_documents()?;
            Ok(())
        })
    }

    pub fn add(&self, doc: &Bm25Doc) -> Result<()> {
        self.with_writer(|w| {
            let mut d = TantivyDocument::default();
            d.add_u64(self.f_id, doc.chunk_id as u64);
            d.add_text(self.f_text, doc.text);
            if let Some(h) = doc.heading {
                d.add_text(self.f_heading, h);
            }
            d.add_text(self.f_path, doc.path);
            w.add_document(d)?;
            Ok(())
        })
    }

    /// Commit pending changes, recording the store generation they reflect.
    pub fn commit(&self, generation: u64) -> Result<()> {
        self.with_writer(|w| {
            let mut p = w.prepare_commit()?;
            p.set_payload(&generation.to_string());
            p.commit()?;
            Ok(())
        })
    }

    pub fn num_docs(&self) -> Result<u64> {
        guarded("counting the text index", || {
            self.reader.reload()?;
            Ok(self.reader.searcher().num_docs())
        })
    }

    /// Top `k` chunk ids with BM25 scores. Query syntax is neutralised: user text is a bag
    /// of words (OR), with heading and file-name matches boosted.
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<(i64, f32)>> {
        guarded("searching the text index", || {
            self.search_unguarded(query, k)
        })
    }

    fn search_unguarded(&self, query: &str, k: usize) -> Result<Vec<(i64, f32)>> {
        self.reader.reload()?;
        let searcher = self.reader.searcher();
        let cleaned: String = query
            .chars()
            .map(|c| {
                if c.is_alphanumeric() || c.is_whitespace() {
                    c
                } else {
                    ' '
                }
            })
            .collect();
        if cleaned.trim().is_empty() {
            return Ok(Vec::new());
        }
        let mut qp =
            QueryParser::for_index(&self.index, vec![self.f_text, self.f_heading, self.f_path]);
        qp.set_field_boost(self.f_heading, 1.5);
        qp.set_field_boost(self.f_path, 1.5);
        let (q, _errors) = qp.parse_query_lenient(&cleaned);
        let top = searcher.search(&q, &TopDocs::with_limit(k.max(1)))?;
        let mut out = Vec::with_capacity(top.len());
        for (score, addr) in top {
            let d: TantivyDocument = searcher.doc(addr)?;
            if let Some(id) = d.get_first(self.f_id).and_then(|v| v.as_u64()) {
                out.push((id as i64, score));
            }
        }
        Ok(out)
    }
}
