//! An index built with multilingual-e5-small remembers it: opened again without naming an
//! embedder it is searched with e5, and opened with another embedder its dense search is an
//! error, never a comparison of two models' vectors.

use rag::embed::{choose_embedder, load_named_with, WeightFormat, E5_EMBEDDER};
use rag::models::DEFAULT_EMBEDDER;
use rag::{Index, IndexOptions, SearchMode};

fn models_present() -> bool {
    let ok = rag::embed::E5Embedder::default_path().is_file()
        && rag::embed::MiniLmEmbedder::default_dir()
            .join("model.safetensors")
            .is_file();
    if ok || std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        return ok;
    }
    panic!(
        "run `scripts/fetch-model.sh {E5_EMBEDDER} {DEFAULT_EMBEDDER}` (or set RAG_SKIP_MODEL_TESTS=1)"
    );
}

const DOCS: &[(&str, &str)] = &[
    ("bahn.txt", "Der Zug nach München fährt heute von Gleis sieben ab, mit zwanzig Minuten Verspätung wegen eines Stellwerkschadens."),
    ("cuisine.txt", "Pour réussir une pâte à crêpes, laissez-la reposer une heure au réfrigérateur avant la cuisson."),
    ("huerto.txt", "Los tomates necesitan riego regular y al menos seis horas de sol directo cada día."),
    ("tea.txt", "Green tea should be brewed with water just below boiling, for no more than three minutes."),
];

#[test]
fn an_e5_index_is_searched_with_e5_without_naming_it() {
    if !models_present() {
        return;
    }
    let docs = tempfile::tempdir().unwrap();
    for (name, text) in DOCS {
        std::fs::write(docs.path().join(name), text).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let idx_dir = dir.path().join("idx");
    // A new index defaults to MiniLM; naming e5 picks e5.
    assert_eq!(choose_embedder(&idx_dir, None).unwrap(), DEFAULT_EMBEDDER);
    let name = choose_embedder(&idx_dir, Some(E5_EMBEDDER)).unwrap();
    let e5 = load_named_with(&name, WeightFormat::Q8_0).unwrap();
    {
        let index = Index::open(&idx_dir, Some(e5.clone())).unwrap();
        index
            .add_paths(
                &[docs.path().to_path_buf()],
                &IndexOptions::default(),
                &|_| {},
            )
            .unwrap();
    }
    // Reopened without a name: the stored one is e5.
    assert_eq!(
        Index::stored_embedder(&idx_dir).unwrap().as_deref(),
        Some(E5_EMBEDDER)
    );
    let name = choose_embedder(&idx_dir, None).unwrap();
    assert_eq!(name, E5_EMBEDDER);
    let index = Index::open(
        &idx_dir,
        Some(load_named_with(&name, WeightFormat::Q8_0).unwrap()),
    )
    .unwrap();
    assert_eq!(index.stats().model_id.as_deref(), Some(e5.model_id()));
    // A German question with no word in common with the Spanish text finds it (and a
    // French one the French text): cross-lingual dense retrieval.
    for (q, want) in [
        ("Wie oft muss man Tomaten gießen?", "huerto.txt"),
        ("Wann fährt der Zug ab?", "bahn.txt"),
        ("How long should crêpe batter rest?", "cuisine.txt"),
    ] {
        let hits = index.search(q, 1, SearchMode::Dense).unwrap();
        assert!(hits[0].path.ends_with(want), "{q}: {:?}", hits[0].path);
    }
    drop(index);
    // The same index opened with MiniLM: dense search says which model embedded it.
    let minilm = load_named_with(DEFAULT_EMBEDDER, WeightFormat::Q8_0).unwrap();
    let index = Index::open(&idx_dir, Some(minilm)).unwrap();
    let err = index
        .search("Zug", 3, SearchMode::Dense)
        .expect_err("a mismatch is an error")
        .to_string();
    assert!(
        err.contains("embedded by") && err.contains(E5_EMBEDDER),
        "{err}"
    );
    assert!(index.search("Zug", 3, SearchMode::Hybrid).is_err());
    assert!(!index.search("Zug", 3, SearchMode::Bm25).unwrap().is_empty());
}
