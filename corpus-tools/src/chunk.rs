//! Token-aware chunking with overlap. Chunks never cross a section (heading or page)
//! boundary; each keeps its line range or page and its heading path.

use crate::parse::ParsedDoc;

#[derive(Debug, Clone)]
pub struct ChunkOptions {
    /// Upper bound on tokens per chunk (as counted by the caller's counter).
    pub chunk_tokens: usize,
    /// Tokens repeated from the end of one chunk at the start of the next.
    pub overlap_tokens: usize,
}

/// Default chunk size. With the embedder's WordPiece counter, 220 tokens is the size chunks had
/// when they were bounded by 200 *estimated* tokens (real counts are 1.09x the estimate on the
/// retrieval corpus); cutting to 200 real tokens lost retrieval quality (hybrid MRR 0.858 ->
/// 0.807, 220: 0.850; benchmarks/runs/2026-11-23-retrieval-quality-chunk-sizes-and-heldout.md).
pub const DEFAULT_CHUNK_TOKENS: usize = 220;

impl Default for ChunkOptions {
    fn default() -> Self {
        ChunkOptions {
            chunk_tokens: DEFAULT_CHUNK_TOKENS,
            overlap_tokens: 40,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChunkSpec {
    pub text: String,
    /// First and last source line (1-based, inclusive), when the format has lines.
    pub lines: Option<(u32, u32)>,
    pub page: Option<u32>,
    /// Heading path joined with " > ".
    pub heading: Option<String>,
}

/// One unit the packer moves around: a line, or a word-window of an over-long line.
struct Piece {
    line: u32,
    text: String,
    tokens: usize,
}

pub fn chunk_doc(
    doc: &ParsedDoc,
    opts: &ChunkOptions,
    count: &dyn Fn(&str) -> usize,
) -> Vec<ChunkSpec> {
    let max = opts.chunk_tokens.max(8);
    let overlap = opts.overlap_tokens.min(max / 2);
    let mut out = Vec::new();
    for section in &doc.sections {
        let pieces = pieces_of(
            section.lines.iter().map(|l| (l.number, l.text.as_str())),
            max,
            count,
        );
        let heading = (!section.heading.is_empty()).then(|| section.heading.join(" > "));
        let mut start = 0;
        while start < pieces.len() {
            let mut end = start;
            let mut sum = 0;
            while end < pieces.len() && (end == start || sum + pieces[end].tokens <= max) {
                sum += pieces[end].tokens;
                end += 1;
            }
            if let Some(c) = make_chunk(
                &pieces[start..end],
                doc.has_line_numbers,
                section.page,
                &heading,
            ) {
                out.push(c);
            }
            if end >= pieces.len() {
                break;
            }
            // Step back over trailing pieces worth at most `overlap` tokens, always advancing.
            let mut next = end;
            let mut back = 0;
            while next > start + 1 && back + pieces[next - 1].tokens <= overlap {
                back += pieces[next - 1].tokens;
                next -= 1;
            }
            start = next;
        }
    }
    out
}

fn pieces_of<'a>(
    lines: impl Iterator<Item = (u32, &'a str)>,
    max: usize,
    count: &dyn Fn(&str) -> usize,
) -> Vec<Piece> {
    let mut out = Vec::new();
    for (line, text) in lines {
        let tokens = count(text);
        if tokens <= max {
            out.push(Piece {
                line,
                text: text.to_string(),
                tokens,
            });
            continue;
        }
        // An over-long line (minified code, a paragraph without newlines): cut by words.
        let mut buf = String::new();
        let mut buf_tokens = 0;
        for (word, t) in text
            .split_whitespace()
            .flat_map(|w| split_word(w, max, count))
        {
            if buf_tokens + t > max && !buf.is_empty() {
                out.push(Piece {
                    line,
                    text: std::mem::take(&mut buf),
                    tokens: buf_tokens,
                });
                buf_tokens = 0;
            }
            if !buf.is_empty() {
                buf.push(' ');
            }
            buf.push_str(&word);
            buf_tokens += t;
        }
        if !buf.is_empty() {
            out.push(Piece {
                line,
                text: buf,
                tokens: buf_tokens,
            });
        }
    }
    out
}

/// A word, or for a word over `max` tokens on its own (a Markdown table rule, a long
/// hash run), parts of it that fit: cut at character boundaries, each part checked.
fn split_word(word: &str, max: usize, count: &dyn Fn(&str) -> usize) -> Vec<(String, usize)> {
    let t = count(word).max(1);
    if t <= max {
        return vec![(word.to_string(), t)];
    }
    let chars: Vec<char> = word.chars().collect();
    let mut out = Vec::new();
    let mut start = 0;
    while start < chars.len() {
        // Proportional first guess, halved until the part fits (one char always does,
        // unless a single character is over `max`, which no counter does for max >= 8).
        let mut len = (chars.len() * max / t).clamp(1, chars.len() - start);
        loop {
            let part: String = chars[start..start + len].iter().collect();
            let n = count(&part).max(1);
            if n <= max || len == 1 {
                out.push((part, n));
                break;
            }
            len /= 2;
        }
        start += len;
    }
    out
}

fn make_chunk(
    pieces: &[Piece],
    numbered: bool,
    page: Option<u32>,
    heading: &Option<String>,
) -> Option<ChunkSpec> {
    let first = pieces.iter().position(|p| !p.text.trim().is_empty())?;
    let last = pieces.iter().rposition(|p| !p.text.trim().is_empty())?;
    let body = &pieces[first..=last];
    let text = body
        .iter()
        .map(|p| p.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    Some(ChunkSpec {
        text,
        lines: numbered.then(|| (body[0].line, body[body.len() - 1].line)),
        page,
        heading: heading.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::DocKind;
    use crate::parse::parse_bytes;
    use crate::tokens::estimate_tokens;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn sizes_overlap_and_line_ranges() {
        let text: String = (1..=100)
            .map(|i| format!("w{i}a w{i}b w{i}c w{i}d w{i}e\n"))
            .collect();
        let doc = parse_bytes(DocKind::Text, text.as_bytes()).unwrap();
        let opts = ChunkOptions {
            chunk_tokens: 50,
            overlap_tokens: 10,
        };
        let chunks = chunk_doc(&doc, &opts, &words);
        assert!(chunks.len() > 10);
        for c in &chunks {
            assert!(words(&c.text) <= 50, "chunk too big");
            let (a, b) = c.lines.unwrap();
            assert_eq!(b - a + 1, c.text.lines().count() as u32);
            assert!(c.text.starts_with(&format!("w{a}a")));
        }
        for w in chunks.windows(2) {
            let (_, prev_end) = w[0].lines.unwrap();
            let (next_start, _) = w[1].lines.unwrap();
            assert_eq!(prev_end - next_start + 1, 2, "two 5-word lines of overlap");
        }
        assert_eq!(chunks.first().unwrap().lines.unwrap().0, 1);
        assert_eq!(chunks.last().unwrap().lines.unwrap().1, 100);
    }

    #[test]
    fn long_lines_are_split_and_headings_kept() {
        let long = "word ".repeat(1000);
        let md = format!("# Top\n## Sub\n{long}\n");
        let doc = parse_bytes(DocKind::Markdown, md.as_bytes()).unwrap();
        let chunks = chunk_doc(&doc, &ChunkOptions::default(), &estimate_tokens);
        assert!(chunks.len() >= 5);
        assert!(chunks
            .iter()
            .all(|c| estimate_tokens(&c.text) <= DEFAULT_CHUNK_TOKENS));
        assert_eq!(chunks.last().unwrap().heading.as_deref(), Some("Top > Sub"));
        assert_eq!(chunks.last().unwrap().lines, Some((3, 3)));
    }

    #[test]
    fn a_word_over_the_limit_is_cut_into_parts_that_fit() {
        // A Markdown table rule: one "word" of punctuation, one token per character.
        let rule = format!("|{}|", "-".repeat(700));
        let doc = parse_bytes(DocKind::Markdown, format!("# T\n{rule}\n").as_bytes()).unwrap();
        let opts = ChunkOptions {
            chunk_tokens: 100,
            overlap_tokens: 10,
        };
        let chunks = chunk_doc(&doc, &opts, &estimate_tokens);
        assert!(chunks.len() >= 7);
        assert!(chunks.iter().all(|c| estimate_tokens(&c.text) <= 100));
        let dashes: usize = chunks.iter().map(|c| c.text.matches('-').count()).sum();
        assert!(dashes >= 700, "no character lost");
    }

    #[test]
    fn every_nonblank_line_is_covered() {
        // Property: no text is lost by chunking, for assorted sizes.
        for (size, ov) in [(8, 0), (20, 5), (64, 30), (500, 40)] {
            let text: String = (0..57)
                .map(|i| format!("{} line{i}\n", "x ".repeat(i % 13)))
                .collect();
            let doc = parse_bytes(DocKind::Text, text.as_bytes()).unwrap();
            let chunks = chunk_doc(
                &doc,
                &ChunkOptions {
                    chunk_tokens: size,
                    overlap_tokens: ov,
                },
                &words,
            );
            for i in 0..57 {
                let needle = format!("line{i}");
                assert!(
                    chunks
                        .iter()
                        .any(|c| c.text.split_whitespace().any(|w| w == needle)),
                    "lost {needle} at {size}/{ov}"
                );
            }
        }
    }
}
