//! PDF -> one section per page (page numbers are what citations point to). A page without
//! extractable text (a scan, a drawing) stays as a section with no lines: a document of
//! only such pages is reported as having no text layer.

use super::container::MAX_UNCOMPRESSED_BYTES;
use super::{Line, Section};
use lopdf::{Document, Object, ObjectId, Stream};
use std::io::Read;

pub fn sections(bytes: &[u8]) -> Result<Vec<Section>, String> {
    let doc = Document::load_mem(bytes).map_err(|e| format!("pdf: {e}"))?;
    let pages = doc.get_pages();
    check_content_size(&doc, pages.values().copied())?;
    let mut out = Vec::new();
    for &page in pages.keys() {
        // A page whose text cannot be extracted counts as a page without text; the rest of
        // the file still counts.
        let text = if too_complex(&doc, pages[&page]) {
            String::new()
        } else {
            doc.extract_text(&[page]).unwrap_or_default()
        };
        let mut lines: Vec<Line> = text
            .lines()
            .map(|l| Line {
                number: 0,
                text: l.trim_end().to_string(),
            })
            .collect();
        if lines.iter().all(|l| l.text.trim().is_empty()) {
            lines.clear();
        }
        out.push(Section {
            heading: Vec::new(),
            page: Some(page),
            lines,
        });
    }
    Ok(out)
}

/// lopdf parses content streams recursively: arrays, dictionaries and strings nested past
/// this depth are not read (200k nested `[` overflow even a 16 MiB stack, which aborts the
/// process). Real content nests a few levels.
const MAX_CONTENT_NESTING: usize = 256;

/// lopdf holds a page's content as operations of several hundred bytes each (200k `q`
/// operators, 400 KB of content, take ~110 MB): a page with more tokens than this is read
/// as a page without text. A dense page of text has a few thousand; pages past this are
/// drawings.
const MAX_PAGE_TOKENS: usize = 100_000;

/// Whether `page`'s content nests arrays, dictionaries or parenthesized strings deeper than
/// [`MAX_CONTENT_NESTING`] or has more than [`MAX_PAGE_TOKENS`] tokens (its size is already
/// bounded by [`check_content_size`]).
fn too_complex(doc: &Document, page: ObjectId) -> bool {
    let Ok(content) = doc.get_page_content(page) else {
        return false;
    };
    let (mut depth, mut parens, mut tokens) = (0usize, 0usize, 0usize);
    let mut in_token = false;
    let mut bytes = content.iter().copied().peekable();
    while let Some(b) = bytes.next() {
        if parens > 0 {
            match b {
                b'\\' => {
                    bytes.next();
                }
                b'(' => parens += 1,
                b')' => parens -= 1,
                _ => {}
            }
        } else {
            let starts = !b.is_ascii_whitespace() && !in_token;
            in_token = !b.is_ascii_whitespace();
            tokens += usize::from(starts);
            match b {
                b'(' => parens = 1,
                b'%' => while bytes.next_if(|&c| c != b'\n' && c != b'\r').is_some() {},
                b'[' => depth += 1,
                b']' => depth = depth.saturating_sub(1),
                b'<' if bytes.next_if_eq(&b'<').is_some() => depth += 1,
                b'>' if bytes.next_if_eq(&b'>').is_some() => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if depth + parens > MAX_CONTENT_NESTING || tokens > MAX_PAGE_TOKENS {
            return true;
        }
    }
    false
}

/// Text extraction inflates every page's content streams in memory (and parses them into
/// operations, several times their size), so a small deflate or LZW bomb would take
/// gigabytes. The pages' content, counted as each page reads it, may inflate to this
/// much in total, like the contents of an Office or EPUB container.
const MAX_CONTENT_BYTES: u64 = MAX_UNCOMPRESSED_BYTES;

fn check_content_size(doc: &Document, pages: impl Iterator<Item = ObjectId>) -> Result<(), String> {
    let mut left = MAX_CONTENT_BYTES;
    for page in pages {
        for id in doc.get_page_contents(page) {
            let Ok(stream) = doc.get_object(id).and_then(Object::as_stream) else {
                continue;
            };
            let n = decoded_len(stream, left).unwrap_or(u64::MAX);
            left = left.checked_sub(n).ok_or_else(|| {
                format!(
                    "pdf: page content inflates past the {} MiB limit",
                    MAX_CONTENT_BYTES >> 20
                )
            })?;
        }
    }
    Ok(())
}

/// The length of `stream` decoded as lopdf decodes it, or `None` once it passes `cap`.
/// Only the last filter's output is counted without being kept.
fn decoded_len(stream: &Stream, cap: u64) -> Option<u64> {
    let Ok(filters) = stream.filters() else {
        // lopdf then uses the raw bytes.
        return Some(stream.content.len() as u64);
    };
    let mut data = stream.content.clone();
    let mut len = data.len() as u64;
    for (i, filter) in filters.iter().enumerate() {
        let keep = i + 1 < filters.len();
        let mut out = Vec::new();
        len = match *filter {
            b"FlateDecode" => {
                // Like lopdf, a damaged stream keeps what inflated before the damage.
                let mut z = flate2::read::ZlibDecoder::new(data.as_slice()).take(cap + 1);
                if keep {
                    let _ = z.read_to_end(&mut out);
                    out.len() as u64
                } else {
                    count(&mut z)
                }
            }
            b"LZWDecode" => lzw_capped(&data, cap, keep.then_some(&mut out))?,
            // At most 4 bytes per input character (`z` stands for 4 zero bytes): bounded.
            b"ASCII85Decode" => {
                let mut single = stream.clone();
                single.dict.set("Filter", "ASCII85Decode");
                single.dict.remove(b"DecodeParms");
                single.content = data;
                out = single.decompressed_content().ok()?;
                out.len() as u64
            }
            // lopdf fails on other filters and then uses the raw bytes.
            _ => return Some(stream.content.len() as u64),
        };
        if len > cap {
            return None;
        }
        data = out;
    }
    Some(len)
}

/// Bytes read until the end or the first error (what lopdf keeps of a damaged stream).
fn count(r: &mut impl Read) -> u64 {
    let mut buf = [0u8; 1 << 14];
    let mut n = 0u64;
    while let Ok(k) = r.read(&mut buf) {
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    n
}

/// LZW as lopdf decodes it (MSB first, the TIFF size switch unless `EarlyChange 0`, which
/// changes the output little): its length, or `None` once past `cap`; the output is
/// appended to `keep` if given.
fn lzw_capped(input: &[u8], cap: u64, mut keep: Option<&mut Vec<u8>>) -> Option<u64> {
    let mut dec = weezl::decode::Decoder::with_tiff_size_switch(weezl::BitOrder::Msb, 8);
    let mut buf = [0u8; 1 << 14];
    let mut rest = input;
    let mut n = 0u64;
    loop {
        let r = dec.decode_bytes(rest, &mut buf);
        n += r.consumed_out as u64;
        if let Some(out) = keep.as_deref_mut() {
            out.extend_from_slice(&buf[..r.consumed_out]);
        }
        rest = &rest[r.consumed_in..];
        if n > cap {
            return None;
        }
        match r.status {
            Ok(weezl::LzwStatus::Ok) if r.consumed_in + r.consumed_out > 0 => {}
            _ => return Some(n),
        }
    }
}
