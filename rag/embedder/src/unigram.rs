//! The XLM-R SentencePiece unigram tokenizer of multilingual-e5, built from the vocabulary
//! and normalisation map stored in the packed model file.
//!
//! Pipeline (as XLM-R's `tokenizer.json` runs it): each character through the file's
//! per-character normalisation map (the NFKC-style folding of SentencePiece's precompiled
//! charsmap: tabs and line breaks to spaces, control characters dropped, full-width forms to
//! ASCII, ...); runs of spaces collapsed to one; a leading `▁` (U+2581) unless the text
//! starts with a space; every space turned into `▁`. The result is segmented by Viterbi over
//! the pieces' log-probabilities; a character no piece covers becomes `<unk>` (scored below
//! every piece, so it is only chosen where nothing else fits).

use super::BertError;
use std::collections::HashMap;

/// SentencePiece's word-boundary marker.
pub const METASPACE: char = '\u{2581}';

/// The special tokens' ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
    pub unk: u32,
}

/// A SentencePiece unigram tokenizer (immutable; share it between threads).
pub struct UnigramTokenizer {
    /// Piece text to id, control pieces excluded (text never produces them).
    ids: HashMap<Box<str>, u32>,
    scores: Vec<f32>,
    specials: SpecialIds,
    /// Score of an unknown character: below every piece.
    unk_score: f32,
    /// Longest piece in bytes: bounds the Viterbi's look-ahead.
    max_piece_bytes: usize,
    /// Character replacements, sorted by character; an empty replacement drops it.
    norm: Vec<(char, Box<[char]>)>,
}

impl UnigramTokenizer {
    /// Builds the tokenizer from pieces and their scores (log-probabilities, by id), the
    /// special ids, and the normalisation map.
    pub fn new(
        pieces: Vec<String>,
        scores: Vec<f32>,
        specials: SpecialIds,
        mut norm: Vec<(char, Vec<char>)>,
    ) -> Result<Self, BertError> {
        let bad = |m: String| Err(BertError::Weights(format!("tokenizer: {m}")));
        if pieces.is_empty() || pieces.len() != scores.len() || pieces.len() > u32::MAX as usize {
            return bad(format!(
                "{} pieces with {} scores",
                pieces.len(),
                scores.len()
            ));
        }
        let n = pieces.len() as u32;
        let SpecialIds { bos, eos, pad, unk } = specials;
        if [bos, eos, pad, unk].iter().any(|&id| id >= n) {
            return bad(format!("a special id is outside the {n} pieces"));
        }
        if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
            return bad(format!("piece {i} has a non-finite score"));
        }
        let min = scores.iter().copied().fold(f32::INFINITY, f32::min);
        let mut ids = HashMap::with_capacity(pieces.len());
        let mut max_piece_bytes = 1;
        for (id, piece) in pieces.into_iter().enumerate() {
            let id = id as u32;
            // Control pieces (<s>, </s>, <pad>, <unk>, <mask>) are never matched in text.
            let control = [bos, eos, pad, unk].contains(&id) || piece == "<mask>";
            if control || piece.is_empty() {
                continue;
            }
            max_piece_bytes = max_piece_bytes.max(piece.len());
            // The first of two equal pieces wins, as a lookup in id order would.
            ids.entry(piece.into_boxed_str()).or_insert(id);
        }
        norm.sort_by_key(|(c, _)| *c);
        if norm.windows(2).any(|w| w[0].0 == w[1].0) {
            return bad("the normalisation map lists a character twice".into());
        }
        Ok(UnigramTokenizer {
            ids,
            scores,
            specials,
            unk_score: min - 10.0,
            max_piece_bytes,
            norm: norm
                .into_iter()
                .map(|(c, r)| (c, r.into_boxed_slice()))
                .collect(),
        })
    }

    pub fn specials(&self) -> SpecialIds {
        self.specials
    }

    /// Number of pieces (ids run from 0 to this, exclusive).
    pub fn vocab_size(&self) -> usize {
        self.scores.len()
    }

    /// The normalised text the segmentation runs on (with `▁` for word boundaries).
    pub fn normalize(&self, text: &str) -> String {
        let mut chars: Vec<char> = Vec::with_capacity(text.len() + 1);
        for c in text.chars() {
            match self.norm.binary_search_by_key(&c, |(k, _)| *k) {
                Ok(i) => chars.extend_from_slice(&self.norm[i].1),
                Err(_) => chars.push(c),
            }
        }
        chars.dedup_by(|b, a| *a == ' ' && *b == ' ');
        let mut out = String::with_capacity(chars.len() * 3 + 3);
        if chars.first() != Some(&' ') {
            out.push(METASPACE);
        }
        out.extend(chars.iter().map(|&c| if c == ' ' { METASPACE } else { c }));
        out
    }

    /// Token ids of `text` without special tokens, not truncated.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.segment(&self.normalize(text))
    }

    /// `<s>`, the first `max_len - 2` ids of `text`, `</s>`: the model's input for `text`
    /// (`max_len` is the model's window, at least 2).
    pub fn encode_with_specials(&self, text: &str, max_len: usize) -> Vec<u32> {
        let mut ids = self.encode(text);
        ids.truncate(max_len.saturating_sub(2));
        ids.insert(0, self.specials.bos);
        ids.push(self.specials.eos);
        ids
    }

    /// Viterbi over the pieces: the segmentation of `s` with the highest total score.
    /// Ties keep the first candidate found (shorter end positions first, then longer
    /// pieces from earlier starts), so the result is deterministic.
    fn segment(&self, s: &str) -> Vec<u32> {
        // Byte offset of every character start, plus the end.
        let bounds: Vec<usize> = s
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(s.len()))
            .collect();
        let n = bounds.len() - 1;
        // Best score ending at each character boundary, and the (piece, start) that got it;
        // `None` as the piece stands for an unknown character.
        let mut best = vec![f32::NEG_INFINITY; n + 1];
        let mut back: Vec<(Option<u32>, usize)> = vec![(None, 0); n + 1];
        best[0] = 0.0;
        for i in 0..n {
            if best[i] == f32::NEG_INFINITY {
                continue;
            }
            let start = bounds[i];
            for e in i + 1..=n {
                if bounds[e] - start > self.max_piece_bytes {
                    break;
                }
                if let Some(&id) = self.ids.get(&s[start..bounds[e]]) {
                    let score = best[i] + self.scores[id as usize];
                    if score > best[e] {
                        best[e] = score;
                        back[e] = (Some(id), i);
                    }
                }
            }
            let unk = best[i] + self.unk_score;
            if unk > best[i + 1] {
                best[i + 1] = unk;
                back[i + 1] = (None, i);
            }
        }
        let mut ids = Vec::new();
        let mut e = n;
        while e > 0 {
            let (id, start) = back[e];
            ids.push(id.unwrap_or(self.specials.unk));
            e = start;
        }
        ids.reverse();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECIALS: SpecialIds = SpecialIds {
        bos: 0,
        pad: 1,
        eos: 2,
        unk: 3,
    };

    /// A toy vocabulary: specials, then (piece, score).
    fn toy(pieces: &[(&str, f32)], norm: Vec<(char, Vec<char>)>) -> UnigramTokenizer {
        let mut p: Vec<String> = ["<s>", "<pad>", "</s>", "<unk>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut sc = vec![0.0; 4];
        for (piece, score) in pieces {
            p.push(piece.to_string());
            sc.push(*score);
        }
        UnigramTokenizer::new(p, sc, SPECIALS, norm).unwrap()
    }

    #[test]
    fn normalisation_adds_the_metaspace_and_collapses_spaces() {
        let t = toy(
            &[("a", -1.0)],
            vec![('\t', vec![' ']), ('\u{7}', vec![]), ('Ａ', vec!['A'])],
        );
        assert_eq!(t.normalize("a b"), "▁a▁b");
        assert_eq!(t.normalize("a \t  b"), "▁a▁b");
        assert_eq!(
            t.normalize(" a"),
            "▁a",
            "a leading space becomes the marker"
        );
        assert_eq!(t.normalize("a "), "▁a▁", "a trailing space is kept");
        assert_eq!(t.normalize("x\u{7}Ａ"), "▁xA");
        assert_eq!(t.normalize(""), "▁");
    }

    #[test]
    fn viterbi_picks_the_most_probable_segmentation() {
        // "▁hello" as one piece (-3) beats "▁he" + "llo" (-2 + -2).
        let t = toy(
            &[
                ("▁hello", -3.0),
                ("▁he", -2.0),
                ("llo", -2.0),
                ("▁", -1.0),
                ("h", -4.0),
                ("e", -4.0),
                ("l", -4.0),
                ("o", -4.0),
                ("▁world", -5.0),
            ],
            vec![],
        );
        let id = |p: &str| *t.ids.get(p).unwrap();
        assert_eq!(t.encode("hello world"), vec![id("▁hello"), id("▁world")]);
        // "▁hello"+"llo" (-5) beats "▁he"+"llo"+"llo" (-6).
        assert_eq!(t.encode("hellollo"), vec![id("▁hello"), id("llo")]);
        // Without a whole-word piece the best split wins: "▁he"+"llo" (-4) over
        // "▁"+"h"+"e"+"l"+"l"+"o" (-21).
        let t = toy(
            &[
                ("▁he", -2.0),
                ("llo", -2.0),
                ("▁", -1.0),
                ("h", -4.0),
                ("e", -4.0),
                ("l", -4.0),
                ("o", -4.0),
            ],
            vec![],
        );
        let id = |p: &str| *t.ids.get(p).unwrap();
        assert_eq!(t.encode("hello"), vec![id("▁he"), id("llo")]);
    }

    #[test]
    fn unknown_characters_become_unk_one_each() {
        let t = toy(&[("▁", -1.0), ("a", -2.0)], vec![]);
        assert_eq!(t.encode("a☃☃a"), vec![4, 5, 3, 3, 5]);
    }

    #[test]
    fn control_pieces_are_never_matched_in_text() {
        let t = toy(
            &[("▁", -1.0), ("<", -2.0), ("s", -2.0), (">", -2.0)],
            vec![],
        );
        let ids = t.encode("<s>");
        assert!(!ids.contains(&0), "{ids:?}");
        assert_eq!(ids.len(), 4);
    }

    #[test]
    fn specials_wrap_and_truncation_keeps_the_head() {
        let t = toy(&[("▁", -1.0), ("a", -2.0), ("▁a", -1.5)], vec![]);
        let ids = t.encode_with_specials(&"a ".repeat(100), 10);
        assert_eq!(ids.len(), 10);
        assert_eq!((ids[0], ids[9]), (0, 2));
        assert!(ids[1..9].iter().all(|&i| i == 6));
        assert_eq!(t.encode_with_specials("a", 512), vec![0, 6, 2]);
    }

    #[test]
    fn malformed_vocabularies_are_errors() {
        let p = || vec!["<s>".to_string(), "a".into()];
        let sp = SpecialIds {
            bos: 0,
            eos: 0,
            pad: 0,
            unk: 5,
        };
        assert!(UnigramTokenizer::new(p(), vec![0.0, -1.0], sp, vec![]).is_err());
        assert!(UnigramTokenizer::new(p(), vec![0.0], SPECIALS, vec![]).is_err());
        let ok = SpecialIds {
            bos: 0,
            eos: 0,
            pad: 0,
            unk: 0,
        };
        assert!(UnigramTokenizer::new(p(), vec![0.0, f32::NAN], ok, vec![]).is_err());
        let twice = vec![('x', vec![]), ('x', vec!['y'])];
        assert!(UnigramTokenizer::new(p(), vec![0.0, -1.0], ok, twice).is_err());
        assert!(UnigramTokenizer::new(p(), vec![0.0, -1.0], ok, vec![]).is_ok());
    }
}
