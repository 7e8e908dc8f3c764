//! Hybrid search with an English-only embedder gives a question in another language BM25's
//! order: that model's vector of such a question is noise, and the adaptive fusion would
//! otherwise follow it whenever BM25's list is too short to show a standout head.

use rag::{Embedder, Index, IndexOptions, SearchMode};
use std::sync::Arc;

/// A stand-in embedder that is sure of a wrong answer: texts that mention the chain
/// ("Kette") and the German brake question share one direction, everything else another.
/// So dense search puts `kette.txt` first, with a standout head, for the brake question.
struct SureAndWrong {
    multilingual: bool,
}

impl Embedder for SureAndWrong {
    fn dim(&self) -> usize {
        2
    }
    fn model_id(&self) -> &str {
        "test-sure-and-wrong"
    }
    fn embed_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<Vec<f32>>> {
        Ok(texts
            .iter()
            .map(|t| {
                if t.contains("Kette") || t.contains("Bremsen ein") {
                    vec![1.0, 0.0]
                } else {
                    vec![0.0, 1.0]
                }
            })
            .collect())
    }
    fn multilingual(&self) -> bool {
        self.multilingual
    }
}

const DOCS: &[(&str, &str)] = &[
    ("bremse.txt", "Die Bremsen am Fahrrad einstellen: Den Bremszug am Hebel nachspannen, bis die Bremsbeläge sauber an der Felge greifen und das Rad beim Ziehen sicher stoppt."),
    ("kette.txt", "Die Kette pflegen: Nach jeder Fahrt im Regen die Kette mit einem Lappen reinigen, trocknen lassen und danach mit wenig Öl schmieren, damit sie nicht rostet."),
    ("licht.txt", "Das Licht am Fahrrad prüfen: Vor der Fahrt in der Dunkelheit kontrollieren, ob Scheinwerfer und Rücklicht leuchten, und die Kabel am Dynamo auf Brüche untersuchen."),
    ("tea.txt", "Brewing green tea: let boiling water cool for a few minutes before pouring it over the leaves, and steep them for no longer than two minutes so the tea does not turn bitter."),
    ("garden.txt", "Watering the garden: water early in the morning so less evaporates, soak the soil deeply once or twice a week instead of a little every day, and keep the leaves dry."),
];

fn top_file(multilingual: bool) -> String {
    let corpus = tempfile::tempdir().unwrap();
    for (name, text) in DOCS {
        std::fs::write(corpus.path().join(name), text).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let idx = Index::open(dir.path(), Some(Arc::new(SureAndWrong { multilingual }))).unwrap();
    idx.add_paths(
        &[corpus.path().to_path_buf()],
        &IndexOptions::default(),
        &|_| {},
    )
    .unwrap();
    let q = "Wie stelle ich die Bremsen ein?";
    // The fixture must separate the two lists for the test to mean anything.
    let bm25 = idx.search(q, 5, SearchMode::Bm25).unwrap();
    let dense = idx.search(q, 5, SearchMode::Dense).unwrap();
    assert!(bm25[0].path.ends_with("bremse.txt"), "{:?}", bm25[0].path);
    assert!(dense[0].path.ends_with("kette.txt"), "{:?}", dense[0].path);
    let hybrid = idx.search(q, 5, SearchMode::Hybrid).unwrap();
    let files: Vec<&str> = hybrid.iter().map(|h| h.path.as_str()).collect();
    eprintln!("multilingual={multilingual}: hybrid {files:?}");
    // Every chunk is still reachable: dense-only hits follow BM25's.
    assert_eq!(hybrid.len(), DOCS.len().min(5));
    hybrid[0].path.rsplit('/').next().unwrap().to_string()
}

#[test]
fn an_english_only_embedder_gets_no_say_on_a_german_question() {
    assert_eq!(top_file(false), "bremse.txt");
}

#[test]
fn a_multilingual_embedder_keeps_its_say() {
    // The same lists fused by the adaptive rule alone: BM25's list is too short to show a
    // standout head, so the dense list leads. This is what the language rule changes.
    assert_eq!(top_file(true), "kette.txt");
}
