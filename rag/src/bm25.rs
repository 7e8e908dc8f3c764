//! BM25 over chunks with tantivy. Derived from the SQLite store: every tantivy commit
//! carries the store generation it reflects as its payload, so a writer that finds a
//! mismatch (a crash between the two commits) rebuilds the whole text index from SQLite.
//!
//! Analyzers per language: every chunk is indexed with the English analyzer (`text`,
//! `heading`, `path`), and a chunk in another language with a tantivy stemmer (see
//! [`crate::lang`]) also with that language's analyzer (`text_de`, `heading_de`, ...). A
//! query searches the English fields plus those of its own language, so a chunk taken for
//! the wrong language is still indexed as before, and a query taken for the wrong language
//! still finds what the English fields match.

use crate::bm25_guard::guarded;
use crate::lang;
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Mutex;
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query, QueryParser};
use tantivy::schema::{Field, NumericOptions, Schema, Value, STORED, TEXT};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, SimpleTokenizer, Stemmer, StopWordFilter, TextAnalyzer,
};
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

/// The analyzer of the English fields (no stop words, as before per-language fields).
const TOKENIZER: &str = "en_stem_rag";

/// The fields of one non-English language.
struct LangFields {
    lang: Language,
    text: Field,
    heading: Field,
}

pub struct Bm25 {
    index: Index,
    reader: IndexReader,
    writer: Mutex<Option<IndexWriter>>,
    f_id: Field,
    f_text: Field,
    f_heading: Field,
    f_path: Field,
    /// Every stemmer language but English, in [`lang::STEMMED`] order.
    langs: Vec<LangFields>,
    /// [`Bm25::indexed_languages`] of the searcher generation it was read from: every
    /// hybrid query asks for it, and it changes only when the index does.
    indexed: Mutex<Option<(u64, Vec<Language>)>>,
}

/// What the text index stores per chunk.
pub struct Bm25Doc<'a> {
    pub chunk_id: i64,
    pub text: &'a str,
    pub heading: Option<&'a str>,
    pub path: &'a str,
}

fn text_options(tokenizer: &str) -> tantivy::schema::TextOptions {
    TEXT.set_indexing_options(
        tantivy::schema::TextFieldIndexing::default()
            .set_tokenizer(tokenizer)
            .set_index_option(tantivy::schema::IndexRecordOption::WithFreqsAndPositions),
    )
}

fn other_languages() -> impl Iterator<Item = (Language, &'static str)> {
    lang::STEMMED
        .iter()
        .filter(|s| s.0 != Language::English)
        .map(|s| (s.0, s.2))
}

fn analyzer_name(code: &str) -> String {
    format!("{code}_stem_rag")
}

/// Lower case, the language's stop words where tantivy has a list, its stemmer.
fn analyzer(lang: Language) -> TextAnalyzer {
    let base = TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser);
    match (lang, StopWordFilter::new(lang)) {
        // English keeps its analyzer without stop words: English results stay as they were.
        (Language::English, _) | (_, None) => base.filter(Stemmer::new(lang)).build(),
        (_, Some(stop)) => base.filter(stop).filter(Stemmer::new(lang)).build(),
    }
}

/// `text` lower-cased and without the stop words of `lang` (as is, if tantivy has none).
fn without_stop_words(text: &str, lang: Language) -> String {
    let Some(stop) = StopWordFilter::new(lang) else {
        return text.to_string();
    };
    let mut analyzer = TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(LowerCaser)
        .filter(stop)
        .build();
    let mut out = String::new();
    let mut tokens = analyzer.token_stream(text);
    while tokens.advance() {
        out.push_str(&tokens.token().text);
        out.push(' ');
    }
    out
}

/// A change here changes the schema: an index with another schema is rebuilt on open.
fn schema() -> Schema {
    let mut b = Schema::builder();
    let text_opts = text_options(TOKENIZER);
    b.add_u64_field("chunk_id", NumericOptions::default().set_indexed() | STORED);
    b.add_text_field("text", text_opts.clone());
    b.add_text_field("heading", text_opts.clone());
    b.add_text_field("path", text_opts);
    for (_, code) in other_languages() {
        let opts = text_options(&analyzer_name(code));
        b.add_text_field(&format!("text_{code}"), opts.clone());
        b.add_text_field(&format!("heading_{code}"), opts);
    }
    b.build()
}

/// Open the tantivy index in `dir`, or create it. One with another schema (an older
/// build's) is derived data: it is removed and created anew, empty, for the caller to
/// rebuild from the store (its payload no longer names a generation).
fn open_or_recreate(dir: &Path) -> Result<Index> {
    let open = |dir: &Path| -> Result<Index> {
        let mmap =
            tantivy::directory::MmapDirectory::open(dir).context("opening tantivy directory")?;
        Ok(Index::open_or_create(mmap, schema())?)
    };
    let existing = {
        let mmap =
            tantivy::directory::MmapDirectory::open(dir).context("opening tantivy directory")?;
        if Index::exists(&mmap)? {
            Some(guarded("opening tantivy index", || Ok(Index::open(mmap)?))?)
        } else {
            None
        }
    };
    if let Some(index) = existing {
        if index.schema() == schema() {
            return Ok(index);
        }
        drop(index);
        tracing::info!(
            "the text index at {} has another layout (an older build's): recreating it",
            dir.display()
        );
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("removing the old text index {}", dir.display()))?;
        std::fs::create_dir_all(dir)?;
    }
    open(dir).context("opening tantivy index")
}

impl Bm25 {
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let index = open_or_recreate(dir)?;
        index
            .tokenizers()
            .register(TOKENIZER, analyzer(Language::English));
        for (lang, code) in other_languages() {
            index
                .tokenizers()
                .register(&analyzer_name(code), analyzer(lang));
        }
        let reader = guarded("opening tantivy reader", || {
            index
                .reader_builder()
                .reload_policy(ReloadPolicy::Manual)
                .try_into()
                .context("opening tantivy reader")
        })?;
        let s = index.schema();
        let mut langs = Vec::new();
        for (lang, code) in other_languages() {
            langs.push(LangFields {
                lang,
                text: s.get_field(&format!("text_{code}"))?,
                heading: s.get_field(&format!("heading_{code}"))?,
            });
        }
        Ok(Bm25 {
            langs,
            f_id: s.get_field("chunk_id")?,
            f_text: s.get_field("text")?,
            f_heading: s.get_field("heading")?,
            f_path: s.get_field("path")?,
            index,
            reader,
            writer: Mutex::new(None),
            indexed: Mutex::new(None),
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
            let detected = lang::detect_chunk(&crate::store::embed_text(doc.heading, doc.text));
            if let Some(lf) = self.fields_of(detected) {
                d.add_text(lf.text, doc.text);
                if let Some(h) = doc.heading {
                    d.add_text(lf.heading, h);
                }
            }
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

    /// The fields of a non-English language (`None` for English).
    fn fields_of(&self, lang: Language) -> Option<&LangFields> {
        self.langs.iter().find(|l| l.lang == lang)
    }

    /// The languages (other than English) some chunk is indexed in.
    fn indexed_languages(&self, searcher: &tantivy::Searcher) -> Vec<Language> {
        let generation = searcher.generation().generation_id();
        let mut cache = self.indexed.lock().unwrap_or_else(|e| e.into_inner());
        match &*cache {
            Some((g, langs)) if *g == generation => langs.clone(),
            _ => {
                let langs = self.scan_indexed_languages(searcher);
                *cache = Some((generation, langs.clone()));
                langs
            }
        }
    }

    fn scan_indexed_languages(&self, searcher: &tantivy::Searcher) -> Vec<Language> {
        self.langs
            .iter()
            .filter(|l| {
                searcher.segment_readers().iter().any(|r| {
                    r.inverted_index(l.text)
                        .is_ok_and(|inv| inv.terms().num_terms() > 0)
                })
            })
            .map(|l| l.lang)
            .collect()
    }

    pub fn num_docs(&self) -> Result<u64> {
        guarded("counting the text index", || {
            self.reader.reload()?;
            Ok(self.reader.searcher().num_docs())
        })
    }

    /// Top `k` chunk ids with BM25 scores. Query syntax is neutralised: user text is a bag
    /// of words (OR), with heading and file-name matches boosted. The words are looked up
    /// in the English fields and, for a query in another stemmer language, in that
    /// language's fields too (a chunk matching in both scores both; the English fields
    /// then get the words without that language's stop words).
    pub fn search(&self, query: &str, k: usize) -> Result<Vec<(i64, f32)>> {
        guarded("searching the text index", || {
            self.search_unguarded(query, k)
        })
    }

    /// The language a query is searched in: [`lang::detect_query`] over English and the
    /// languages some chunk is indexed in, as [`Bm25::search`] picks its fields. It reads
    /// the index as the last search saw it (no reload: that would cost ten times the rest),
    /// so ask it right after searching for the same query.
    pub fn query_language(&self, query: &str) -> Result<Language> {
        guarded("reading the text index's languages", || {
            let indexed = self.indexed_languages(&self.reader.searcher());
            Ok(lang::detect_query(&bag_of_words(query), &indexed))
        })
    }

    fn search_unguarded(&self, query: &str, k: usize) -> Result<Vec<(i64, f32)>> {
        self.reader.reload()?;
        let searcher = self.reader.searcher();
        let cleaned = bag_of_words(query);
        if cleaned.trim().is_empty() {
            return Ok(Vec::new());
        }
        let mut english =
            QueryParser::for_index(&self.index, vec![self.f_text, self.f_heading, self.f_path]);
        english.set_field_boost(self.f_heading, 1.5);
        english.set_field_boost(self.f_path, 1.5);
        let indexed = self.indexed_languages(&searcher);
        let q: Box<dyn Query> = match self.fields_of(lang::detect_query(&cleaned, &indexed)) {
            None => english.parse_query_lenient(&cleaned).0,
            Some(lf) => {
                let mut own = QueryParser::for_index(&self.index, vec![lf.text, lf.heading]);
                own.set_field_boost(lf.heading, 1.5);
                let mut parts = vec![(Occur::Should, own.parse_query_lenient(&cleaned).0)];
                // The English fields keep every word, so the query's own stop words ("die",
                // "und", "les") would score there, most in a corpus mixing languages.
                let content = without_stop_words(&cleaned, lf.lang);
                if !content.trim().is_empty() {
                    parts.push((Occur::Should, english.parse_query_lenient(&content).0));
                }
                Box::new(BooleanQuery::new(parts))
            }
        };
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

/// The query with every character but letters, digits and whitespace turned into a space:
/// user text is a bag of words, never query syntax.
fn bag_of_words(query: &str) -> String {
    query
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c.is_whitespace() {
                c
            } else {
                ' '
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(b: &Bm25, field: Field) -> u64 {
        b.reader.reload().unwrap();
        let searcher = b.reader.searcher();
        searcher
            .segment_readers()
            .iter()
            .map(|r| r.inverted_index(field).unwrap().terms().num_terms() as u64)
            .sum()
    }

    #[test]
    fn only_non_english_chunks_fill_a_language_field() {
        let dir = tempfile::tempdir().unwrap();
        let b = Bm25::open(dir.path()).unwrap();
        b.begin_write().unwrap();
        let english = "The battery charges in four hours. Store batteries at room \
                       temperature over the winter and check them every three months.";
        b.add(&Bm25Doc {
            chunk_id: 1,
            text: english,
            heading: Some("Battery"),
            path: "en/battery.md",
        })
        .unwrap();
        b.commit(1).unwrap();
        for l in &b.langs {
            assert_eq!(terms(&b, l.text), 0, "{:?}", l.lang);
            assert_eq!(terms(&b, l.heading), 0, "{:?}", l.lang);
        }
        let german = "Der Akku des Fahrrads lässt sich am Rahmen oder ausgebaut laden. \
                      Lagern Sie ihn im Winter bei Zimmertemperatur.";
        b.add(&Bm25Doc {
            chunk_id: 2,
            text: german,
            heading: Some("Akku laden"),
            path: "de/akku.md",
        })
        .unwrap();
        b.commit(2).unwrap();
        b.end_write().unwrap();
        let de = b.fields_of(Language::German).unwrap();
        assert!(terms(&b, de.text) > 0);
        assert!(terms(&b, de.heading) > 0);
        let fr = b.fields_of(Language::French).unwrap();
        assert_eq!(terms(&b, fr.text), 0);
        // No word of the query is in either chunk as it is: "Fahrräder" and "Fahrrads"
        // share the German stem "fahrrad" (the English stemmer keeps both apart).
        let hits = b.search("Wo parkt man mehrere Fahrräder?", 5).unwrap();
        assert_eq!(hits.first().map(|h| h.0), Some(2), "{hits:?}");
    }
}
