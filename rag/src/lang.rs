//! The language of a chunk or a query, to choose its BM25 analyzer: whatlang's trigram
//! detector limited to the languages tantivy has a stemmer for. Short text counts as
//! English, the analyzer every chunk is indexed and every query searched with anyway.

use std::sync::OnceLock;
use tantivy::tokenizer::Language;
use whatlang::{Detector, Lang};

/// Every language with a tantivy stemmer: the stemmer, whatlang's name for it, and the
/// suffix of its BM25 fields and analyzer (ISO 639-1).
pub const STEMMED: [(Language, Lang, &str); 18] = [
    (Language::Arabic, Lang::Ara, "ar"),
    (Language::Danish, Lang::Dan, "da"),
    (Language::Dutch, Lang::Nld, "nl"),
    (Language::English, Lang::Eng, "en"),
    (Language::Finnish, Lang::Fin, "fi"),
    (Language::French, Lang::Fra, "fr"),
    (Language::German, Lang::Deu, "de"),
    (Language::Greek, Lang::Ell, "el"),
    (Language::Hungarian, Lang::Hun, "hu"),
    (Language::Italian, Lang::Ita, "it"),
    (Language::Norwegian, Lang::Nob, "no"),
    (Language::Portuguese, Lang::Por, "pt"),
    (Language::Romanian, Lang::Ron, "ro"),
    (Language::Russian, Lang::Rus, "ru"),
    (Language::Spanish, Lang::Spa, "es"),
    (Language::Swedish, Lang::Swe, "sv"),
    (Language::Tamil, Lang::Tam, "ta"),
    (Language::Turkish, Lang::Tur, "tr"),
];

/// Fewer letters than this are too few to tell languages apart (a heading, a code line).
const MIN_LETTERS: usize = 12;

/// Only the first this many bytes (about a chunk) are looked at: enough to decide, and
/// detection time stays bounded for long texts.
const MAX_BYTES: usize = 2048;

/// Below this whatlang confidence a chunk counts as English (whatlang calls 0.9
/// "reliable"). Chunks of a paragraph or more clear it easily; text that does not is
/// mostly names, numbers or code.
const CHUNK_CONFIDENCE: f64 = 0.5;

fn detector() -> &'static Detector {
    static D: OnceLock<Detector> = OnceLock::new();
    D.get_or_init(|| Detector::with_allowlist(STEMMED.iter().map(|s| s.1).collect()))
}

/// The language of a chunk among [`STEMMED`], English when unsure.
pub fn detect_chunk(text: &str) -> Language {
    detect(text, CHUNK_CONFIDENCE)
}

/// The language of a query: whatlang's best guess, however unsure, among English and
/// `indexed` (the languages some chunk is in). A question of five words rarely reaches
/// the confidence of a chunk (a third of the German and French questions in
/// `bench/retrieval/multilingual.jsonl` score under 0.5), and limiting the choice to the
/// corpus's languages keeps English questions English in an English corpus (unlimited,
/// 18 of the 124 English questions in `bench/retrieval/` were taken for another language).
pub fn detect_query(text: &str, indexed: &[Language]) -> Language {
    if indexed.iter().all(|l| *l == Language::English) || too_short(text) {
        return Language::English;
    }
    let allow = STEMMED
        .iter()
        .filter(|s| s.0 == Language::English || indexed.contains(&s.0))
        .map(|s| s.1)
        .collect();
    guess(&Detector::with_allowlist(allow), text, 0.0)
}

fn too_short(text: &str) -> bool {
    text.chars().filter(|c| c.is_alphabetic()).count() < MIN_LETTERS
}

fn detect(text: &str, min_confidence: f64) -> Language {
    if too_short(text) {
        return Language::English;
    }
    guess(detector(), text, min_confidence)
}

fn guess(detector: &Detector, text: &str, min_confidence: f64) -> Language {
    let mut end = text.len().min(MAX_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match detector.detect(&text[..end]) {
        Some(info) if info.confidence() >= min_confidence => STEMMED
            .iter()
            .find(|s| s.1 == info.lang())
            .map_or(Language::English, |s| s.0),
        _ => Language::English,
    }
}

/// The field and analyzer suffix of a stemmer language (`de` for German).
pub fn code(lang: Language) -> &'static str {
    STEMMED.iter().find(|s| s.0 == lang).map_or("en", |s| s.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_paragraphs_and_questions() {
        let de = "Der Akku des Fahrrads lässt sich am Rahmen oder ausgebaut laden. Lagern \
                  Sie ihn im Winter bei Zimmertemperatur.";
        assert_eq!(detect_chunk(de), Language::German);
        let fr = "Le thermostat est alimenté par trois piles alcalines. Une icône apparaît \
                  lorsqu'il faut remplacer les piles.";
        assert_eq!(detect_chunk(fr), Language::French);
        let en = "The battery charges in four hours. Store it at room temperature.";
        assert_eq!(detect_chunk(en), Language::English);
        // Unsure (whatlang's confidence 0.44), still German for a query.
        let q = "Warum quietscht die Scheibenbremse?";
        let de_fr = [Language::German, Language::French];
        assert_eq!(detect_query(q, &de_fr), Language::German);
        assert_eq!(detect_chunk(q), Language::English);
        // Taken for German among all languages; English in a corpus without other languages.
        let q = "When do zstd's long tests run?";
        assert_eq!(detect_chunk(q), Language::English);
        assert_eq!(detect_query(q, &[Language::German]), Language::German);
        assert_eq!(detect_query(q, &[]), Language::English);
    }

    #[test]
    fn short_or_odd_text_is_english() {
        assert_eq!(
            detect_query("Akkus", &[Language::German]),
            Language::English
        );
        assert_eq!(detect_query("", &[Language::German]), Language::English);
        assert_eq!(detect_chunk("fn main() { 1 + 2 }"), Language::English);
        // A multi-byte character at the cut does not panic.
        let long = "ä".repeat(MAX_BYTES);
        let _ = detect_chunk(&long);
    }

    #[test]
    fn every_stemmer_language_has_a_distinct_code() {
        let mut codes: Vec<&str> = STEMMED.iter().map(|s| s.2).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), STEMMED.len());
        assert_eq!(code(Language::German), "de");
    }
}
