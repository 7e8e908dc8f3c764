//! Every encoding of the shared corpus decodes to its text, with the word on its line, and
//! binaries stay skipped as binary.

use corpus_tools::test_support::{binary_files, encoding_corpus};
use corpus_tools::{chunk_doc, parse_isolated_detailed, ChunkOptions, ParseLimits, SkipReason};
use std::path::Path;

#[test]
fn every_encoding_decodes_with_its_words_on_their_lines() {
    let limits = ParseLimits::default();
    let small = ChunkOptions {
        chunk_tokens: 24,
        overlap_tokens: 0,
    };
    let corpus = encoding_corpus();
    assert!(corpus.len() >= 20);
    for (f, bytes) in corpus {
        let what = format!("{} ({}, bom {})", f.name, f.encoding, f.bom);
        let doc = parse_isolated_detailed(Path::new(&f.name), bytes, &limits)
            .unwrap_or_else(|e| panic!("{what}: skipped {e:?}"));
        let lines: Vec<_> = doc.sections.iter().flat_map(|s| &s.lines).collect();
        let replaced: usize = lines
            .iter()
            .map(|l| l.text.matches('\u{FFFD}').count())
            .sum();
        assert_eq!(replaced, f.corrupt, "{what}: replacement characters");
        let with_word: Vec<_> = lines.iter().filter(|l| l.text.contains(f.word)).collect();
        assert_eq!(with_word.len(), 1, "{what}: {lines:#?}");
        match f.line {
            Some(n) => {
                assert!(doc.has_line_numbers, "{what}");
                assert_eq!(with_word[0].number, n, "{what}: {:?}", with_word[0]);
                // Every line is there, numbered in order: the line breaks decoded right.
                let numbers: Vec<u32> = lines.iter().map(|l| l.number).collect();
                assert_eq!(
                    numbers,
                    (1..=numbers.len() as u32).collect::<Vec<_>>(),
                    "{what}"
                );
                let chunks = chunk_doc(&doc, &small, &corpus_tools::tokens::estimate_tokens);
                assert!(chunks.len() > 1, "{what}: one chunk proves nothing");
                let c = chunks.iter().find(|c| c.text.contains(f.word)).unwrap();
                let (a, b) = c.lines.unwrap();
                assert!(
                    a <= n && n <= b && b - a < numbers.len() as u32 - 1,
                    "{what}: {a}-{b}"
                );
            }
            None => assert!(!doc.has_line_numbers, "{what}"),
        }
    }
}

#[test]
fn real_binaries_stay_binary() {
    for (name, bytes, detail) in binary_files() {
        let skip = parse_isolated_detailed(Path::new(name), bytes, &ParseLimits::default())
            .expect_err(name);
        assert_eq!(skip.reason, SkipReason::Binary, "{name}: {skip:?}");
        if detail.is_empty() {
            assert!(
                skip.detail.contains("control characters"),
                "{name}: {skip:?}"
            );
        } else {
            assert_eq!(skip.detail, detail, "{name}");
        }
    }
}
