//! BM25 analyzers per language: a German or French chunk is found by another inflection
//! of its words, which the English stemmer does not map to the same stem; English
//! documents rank as before; a corpus mixing languages answers each in its own.

use rag::{Index, IndexOptions, SearchMode};
use std::path::Path;

fn no_progress(_: rag::IndexProgress) {}

fn write(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

fn build(files: &[(&str, &str)]) -> (tempfile::TempDir, tempfile::TempDir, Index) {
    let corpus = tempfile::tempdir().unwrap();
    let idx_dir = tempfile::tempdir().unwrap();
    write(corpus.path(), files);
    let idx = Index::open(idx_dir.path(), None).unwrap();
    idx.add_paths(
        &[corpus.path().to_path_buf()],
        &IndexOptions::default(),
        &no_progress,
    )
    .unwrap();
    (corpus, idx_dir, idx)
}

fn top_path(idx: &Index, query: &str) -> String {
    let hits = idx.search(query, 3, SearchMode::Bm25).unwrap();
    assert!(!hits.is_empty(), "no hit for {query:?}");
    hits[0].path.clone()
}

/// Function words of the questions below appear in every distractor, so only the stemmed
/// content words can single out the right document.
const GERMAN: [(&str, &str); 4] = [
    (
        "de/verschleiss.md",
        "# Verschleiß\n\nEine abgenutzte Bremse und eine gelängte Kette sind beim \
         Fachhändler zu tauschen, bevor die nächste Tour beginnt.\n",
    ),
    (
        "de/akku.md",
        "# Akku\n\nWann sollte ich den Akku laden? Ich lade ihn, wenn die Anzeige blinkt \
         und die Tour lang wird.\n",
    ),
    (
        "de/licht.md",
        "# Licht\n\nWann sollte ich das Licht einschalten? Ich schalte es ein, wenn die \
         Sonne untergeht und es dunkel wird.\n",
    ),
    (
        "de/reifen.md",
        "# Reifen\n\nWann sollte ich den Luftdruck prüfen? Ich prüfe ihn, wenn die Reifen \
         weich wirken und die Strecke holprig ist.\n",
    ),
];

#[test]
fn a_german_chunk_is_found_by_other_inflections() {
    let (_c, _i, idx) = build(&GERMAN);
    // "Bremsen", "Ketten": the German stemmer gives "brems", "kett" as for "Bremse",
    // "Kette"; the English one leaves "bremsen", "ketten".
    let top = top_path(&idx, "Wann sollte ich die Bremsen und Ketten wechseln?");
    assert!(top.ends_with("de/verschleiss.md"), "{top}");
}

const FRENCH: [(&str, &str); 4] = [
    (
        "fr/voyants.md",
        "# Voyants\n\nUn signal lumineux indique que le chauffage de l'appareil est en \
         marche.\n",
    ),
    (
        "fr/piles.md",
        "# Piles\n\nQue faire quand l'écran de l'appareil reste éteint ? Il faut \
         remplacer les piles de l'appareil.\n",
    ),
    (
        "fr/wifi.md",
        "# Wi-Fi\n\nQue faire quand l'appareil perd le réseau ? Il faut rapprocher la box \
         de l'appareil.\n",
    ),
    (
        "fr/mode.md",
        "# Absence\n\nQue faire quand vous partez ? Il faut indiquer à l'appareil la date de \
         votre retour.\n",
    ),
];

#[test]
fn a_french_chunk_is_found_by_other_inflections() {
    let (_c, _i, idx) = build(&FRENCH);
    // "signaux" and "signal" share the French stem "signal"; English keeps "signaux".
    let top = top_path(&idx, "Que veulent dire les signaux de l'appareil ?");
    assert!(top.ends_with("fr/voyants.md"), "{top}");
}

const ENGLISH: [(&str, &str); 3] = [
    (
        "en/battery.md",
        "# Battery\n\nThe battery charges in four hours. Store batteries at room \
         temperature over the winter.\n",
    ),
    (
        "en/chain.md",
        "# Chain\n\nOil the chain every 300 kilometres and after riding in the rain.\n",
    ),
    (
        "en/brakes.md",
        "# Brakes\n\nReplace the brake pads when they are thinner than one millimetre.\n",
    ),
];

#[test]
fn english_documents_rank_as_with_the_english_analyzer() {
    let (_c, _i, idx) = build(&ENGLISH);
    assert!(top_path(&idx, "How long does charging the batteries take?").ends_with("en/battery.md"));
    assert!(top_path(&idx, "How often should chains be oiled?").ends_with("en/chain.md"));
    assert!(top_path(&idx, "When do I replace braking pads?").ends_with("en/brakes.md"));
}

#[test]
fn a_mixed_corpus_answers_each_language_in_its_own() {
    let mut files: Vec<(&str, &str)> = Vec::new();
    files.extend(GERMAN);
    files.extend(FRENCH);
    files.extend(ENGLISH);
    let (_c, _i, idx) = build(&files);
    let top = top_path(&idx, "Wann sollte ich die Bremsen und Ketten wechseln?");
    assert!(top.ends_with("de/verschleiss.md"), "{top}");
    let top = top_path(&idx, "Que veulent dire les signaux de l'appareil ?");
    assert!(top.ends_with("fr/voyants.md"), "{top}");
    let top = top_path(&idx, "How often should chains be oiled?");
    assert!(top.ends_with("en/chain.md"), "{top}");
    assert_eq!(idx.stats().bm25_docs, idx.stats().chunks);
}

/// The text index of the single-analyzer layout: the English fields only.
fn old_layout_schema() -> tantivy::schema::Schema {
    use tantivy::schema::{IndexRecordOption, NumericOptions, TextFieldIndexing, STORED, TEXT};
    let mut b = tantivy::schema::Schema::builder();
    let text = TEXT.set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer("en_stem_rag")
            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
    );
    b.add_u64_field("chunk_id", NumericOptions::default().set_indexed() | STORED);
    b.add_text_field("text", text.clone());
    b.add_text_field("heading", text.clone());
    b.add_text_field("path", text);
    b.build()
}

#[test]
fn a_text_index_of_the_old_layout_is_rebuilt_on_open() {
    let (_c, idx_dir, idx) = build(&GERMAN);
    let (chunks, generation) = (idx.stats().chunks, idx.generation());
    drop(idx);
    // An index written before per-language fields, committed at the store's generation
    // (empty: what matters is that it is not kept as it is).
    let bm25 = idx_dir.path().join("bm25");
    std::fs::remove_dir_all(&bm25).unwrap();
    std::fs::create_dir_all(&bm25).unwrap();
    let old = tantivy::Index::create_in_dir(&bm25, old_layout_schema()).unwrap();
    let mut w: tantivy::IndexWriter = old.writer_with_num_threads(1, 20 << 20).unwrap();
    let mut commit = w.prepare_commit().unwrap();
    commit.set_payload(&generation.to_string());
    commit.commit().unwrap();
    drop(w);
    drop(old);

    let idx = Index::open(idx_dir.path(), None).unwrap();
    assert_eq!(idx.stats().bm25_docs, chunks);
    let top = top_path(&idx, "Wann sollte ich die Bremsen und Ketten wechseln?");
    assert!(top.ends_with("de/verschleiss.md"), "{top}");
}
