//! Bytes -> text. In order: a byte-order mark (UTF-8, UTF-16LE/BE); UTF-16 without a BOM
//! (ASCII-heavy text with every other byte NUL); the charset the document declares (HTML
//! `<meta charset>`, XML `encoding="..."`) unless the file is valid non-ASCII UTF-8; 7-bit
//! ISO-2022-JP (its escape sequences); UTF-8; UTF-8 with a few invalid sequences
//! (replaced by U+FFFD); otherwise the legacy encoding chardetng guesses (Windows-125x,
//! ISO-8859-x, KOI8-R, Shift_JIS, EUC-JP, GBK, Big5, EUC-KR...), or an East Asian one with
//! a few invalid sequences that chardetng alone rules out. Line breaks are decoded
//! like any character, so line numbers counted in the text (LF and CRLF end a line, a lone
//! CR does not, as for `grep -n` and `less`) are the file's lines in every encoding.

use encoding_rs::{Encoding, UTF_16BE, UTF_16LE, UTF_8};

/// Text decoded from a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub text: String,
    pub encoding: &'static Encoding,
    /// Whether a byte-order mark chose the encoding (it is not part of `text`).
    pub bom: bool,
    /// Invalid sequences replaced by U+FFFD.
    pub replaced: usize,
}

/// Where a declared charset may be looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// HTML: `<meta charset>` / `<meta http-equiv content="...; charset=...">`, and an XML
    /// declaration (XHTML).
    Html,
    /// Anything else: only an XML declaration at the very start.
    Xml,
}

/// Bytes of the head searched for a declaration (HTML's prescan looks at 1024; pages with
/// long comments or scripts before the meta tag are common, so more).
const DECLARATION_WINDOW: usize = 4096;
/// Bytes chardetng sees: enough for a confident guess, bounded for large files.
const DETECT_WINDOW: usize = 1 << 20;

/// Decode `bytes` (see the module docs for the order of the rules). Never fails: the
/// caller decides from the result whether it is text (see [`crate::detect`]).
pub fn decode(bytes: Vec<u8>, declared: Declared) -> Decoded {
    if let Some((enc, bom_len)) = Encoding::for_bom(&bytes) {
        return with(enc, &bytes[bom_len..], true);
    }
    if let Some(enc) = utf16_without_bom(&bytes) {
        return with(enc, &bytes, false);
    }
    if let Some(enc) = declared_charset(&bytes, declared) {
        // Valid UTF-8 with multi-byte characters is a file re-saved as UTF-8 without
        // updating its header (legacy text is almost never valid UTF-8 by chance); a 7-bit
        // file (ISO-2022-JP) or one that is not UTF-8 gets what it declares.
        let resaved_as_utf8 = !bytes.is_ascii() && std::str::from_utf8(&bytes).is_ok();
        if enc != UTF_8 && !resaved_as_utf8 {
            return with(enc, &bytes, false);
        }
    }
    let bytes = match String::from_utf8(bytes) {
        Ok(text) if is_iso_2022_jp(&text) => {
            return with(encoding_rs::ISO_2022_JP, text.as_bytes(), false)
        }
        Ok(text) => {
            return Decoded {
                text,
                encoding: UTF_8,
                bom: false,
                replaced: 0,
            }
        }
        Err(e) => e.into_bytes(),
    };
    if mostly_utf8(&bytes) {
        return with(UTF_8, &bytes, false);
    }
    let guess = detect(&bytes);
    if guess.is_single_byte() {
        if let Some(d) = damaged_multibyte(&bytes) {
            return d;
        }
    }
    with(guess, &bytes, false)
}

/// chardetng's guess for `bytes` (UTF-8 excluded: the caller has ruled it out).
fn detect(bytes: &[u8]) -> &'static Encoding {
    let mut det = chardetng::EncodingDetector::new();
    let window = &bytes[..bytes.len().min(DETECT_WINDOW)];
    det.feed(window, window.len() == bytes.len());
    det.guess(None, false)
}

/// East Asian multi-byte encodings, tried when chardetng fell back to a single-byte one.
const MULTIBYTE: [&Encoding; 5] = [
    encoding_rs::SHIFT_JIS,
    encoding_rs::EUC_JP,
    encoding_rs::GBK,
    encoding_rs::BIG5,
    encoding_rs::EUC_KR,
];

/// chardetng rules out an encoding at its first invalid sequence, so a GBK or Shift_JIS
/// file with one bad byte is guessed as Windows-1252 and decoded to mojibake. Here: an
/// East Asian encoding in which the file has a few invalid sequences (at most 2% of its
/// characters) is taken when chardetng, shown the file without those sequences, picks it.
fn damaged_multibyte(bytes: &[u8]) -> Option<Decoded> {
    MULTIBYTE.into_iter().find_map(|enc| {
        let d = with(enc, bytes, false);
        let non_ascii = d.text.chars().filter(|c| !c.is_ascii()).count();
        if d.replaced == 0 || d.replaced * 50 > non_ascii {
            return None;
        }
        let text = d.text.replace(char::REPLACEMENT_CHARACTER, "");
        let (clean, _, _) = enc.encode(&text);
        (detect(&clean) == enc).then_some(d)
    })
}

/// 7-bit Japanese mail and news text: ASCII with the escape sequences that switch to
/// JIS X 0208 (`ESC $ B`, `ESC $ @`).
fn is_iso_2022_jp(text: &str) -> bool {
    text.is_ascii() && (text.contains("\x1b$B") || text.contains("\x1b$@"))
}

fn with(enc: &'static Encoding, bytes: &[u8], bom: bool) -> Decoded {
    let (text, replaced) = decode_counting(enc, bytes);
    Decoded {
        text,
        encoding: enc,
        bom,
        replaced,
    }
}

/// Decode without BOM handling, counting replacements (encoding_rs only says whether any).
fn decode_counting(enc: &'static Encoding, bytes: &[u8]) -> (String, usize) {
    let (text, had_errors) = enc.decode_without_bom_handling(bytes);
    let text = text.into_owned();
    let replaced = if had_errors {
        // U+FFFD already in the source is counted too: close enough for a share.
        text.matches(char::REPLACEMENT_CHARACTER).count()
    } else {
        0
    };
    (text, replaced)
}

/// UTF-16 without a BOM, recognised from text that is mostly ASCII: in the first 8 KiB,
/// at least 40% of the 16-bit units have their high byte NUL and (almost) none their low
/// byte. Non-Latin UTF-16 without a BOM is not recognised (no reliable signal).
fn utf16_without_bom(bytes: &[u8]) -> Option<&'static Encoding> {
    let sample = &bytes[..bytes.len().min(8192) & !1];
    let units = sample.len() / 2;
    if units < 8 {
        return None;
    }
    let (mut even_nul, mut odd_nul) = (0usize, 0usize);
    for pair in sample.chunks_exact(2) {
        even_nul += (pair[0] == 0) as usize;
        odd_nul += (pair[1] == 0) as usize;
    }
    let many = |n: usize| n * 10 >= units * 4;
    let few = |n: usize| n * 100 <= units;
    if many(odd_nul) && few(even_nul) {
        Some(UTF_16LE)
    } else if many(even_nul) && few(odd_nul) {
        Some(UTF_16BE)
    } else {
        None
    }
}

/// Valid UTF-8 with a few invalid sequences: at least four valid multi-byte characters per
/// invalid sequence. Legacy 8-bit text almost never forms valid multi-byte UTF-8 by chance
/// (an accented letter is followed by ASCII), so it fails this test and goes to detection.
fn mostly_utf8(bytes: &[u8]) -> bool {
    let (mut valid_multi, mut invalid) = (0usize, 0usize);
    for chunk in bytes.utf8_chunks() {
        valid_multi += chunk.valid().chars().filter(|c| !c.is_ascii()).count();
        invalid += !chunk.invalid().is_empty() as usize;
    }
    valid_multi > 0 && valid_multi >= 4 * invalid
}

/// The encoding a document names for itself, if encoding_rs knows the label. UTF-16 named
/// inside an ASCII-compatible document means UTF-8 (as browsers do).
fn declared_charset(bytes: &[u8], declared: Declared) -> Option<&'static Encoding> {
    let head = &bytes[..bytes.len().min(DECLARATION_WINDOW)];
    let label = xml_declaration(head).or_else(|| match declared {
        Declared::Html => meta_charset(head),
        Declared::Xml => None,
    })?;
    Encoding::for_label(label).map(Encoding::output_encoding)
}

/// `<?xml version="1.0" encoding="Shift_JIS"?>` at the very start.
fn xml_declaration(head: &[u8]) -> Option<&[u8]> {
    let rest = head.strip_prefix(b"<?xml")?;
    let end = find(rest, b"?>")?;
    attribute_value(&rest[..end], b"encoding")
}

/// `<meta charset="x">` or `<meta http-equiv="Content-Type" content="text/html; charset=x">`.
fn meta_charset(head: &[u8]) -> Option<&[u8]> {
    let lower = head.to_ascii_lowercase();
    let mut at = 0;
    while let Some(i) = find(&lower[at..], b"<meta") {
        let start = at + i + 5;
        let end = find(&lower[start..], b">").map_or(lower.len(), |e| start + e);
        if let Some(j) = find(&lower[start..end], b"charset") {
            let v = start + j + b"charset".len();
            if let Some(label) = value_after_equals(&head[v..end]) {
                return Some(label);
            }
        }
        at = end;
    }
    None
}

/// The value of `name=...` in a tag's text (quoted or not).
fn attribute_value<'a>(tag: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let i = find(&tag.to_ascii_lowercase(), name)?;
    value_after_equals(&tag[i + name.len()..])
}

/// `  =  "value"` / `='value'` / `=value` -> value.
fn value_after_equals(s: &[u8]) -> Option<&[u8]> {
    let s = s.trim_ascii_start().strip_prefix(b"=")?.trim_ascii_start();
    let (s, stop): (&[u8], &[u8]) = match s.first() {
        Some(b'"') => (&s[1..], b"\""),
        Some(b'\'') => (&s[1..], b"'"),
        _ => (s, b" \t\r\n;>\"'/"),
    };
    let end = s.iter().position(|b| stop.contains(b)).unwrap_or(s.len());
    let v = s[..end].trim_ascii();
    (!v.is_empty()).then_some(v)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(bytes: &[u8]) -> Decoded {
        decode(bytes.to_vec(), Declared::Xml)
    }

    #[test]
    fn boms_win_and_are_removed() {
        let d = dec(b"\xEF\xBB\xBF# Titre \xC3\xA9t\xC3\xA9\n");
        assert_eq!(
            (d.text.as_str(), d.encoding, d.bom),
            ("# Titre été\n", UTF_8, true)
        );
        let utf16le: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain(
                "ligne 1\r\nétat\n"
                    .encode_utf16()
                    .flat_map(u16::to_le_bytes),
            )
            .collect();
        let d = dec(&utf16le);
        assert_eq!(
            (d.text.as_str(), d.encoding),
            ("ligne 1\r\nétat\n", UTF_16LE)
        );
        let utf16be: Vec<u8> = [0xFE, 0xFF]
            .into_iter()
            .chain("日本語".encode_utf16().flat_map(u16::to_be_bytes))
            .collect();
        assert_eq!(dec(&utf16be).text, "日本語");
    }

    #[test]
    fn utf16_without_bom_is_recognised_from_ascii_text() {
        let text = "plain words, and a café\n";
        let le: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let be: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
        assert_eq!(
            (dec(&le).text.as_str(), dec(&le).encoding),
            (text, UTF_16LE)
        );
        assert_eq!(
            (dec(&be).text.as_str(), dec(&be).encoding),
            (text, UTF_16BE)
        );
        // A NUL here and there is not UTF-16.
        assert_eq!(utf16_without_bom(b"abc\0defghijklmnopqrstuvwxyz"), None);
    }

    #[test]
    fn utf8_with_a_few_bad_bytes_stays_utf8() {
        let mut b = "Déjà vu, à côté, très élevé, naïve.\n".as_bytes().to_vec();
        b.extend_from_slice(b"stray \xFF byte\n");
        let d = dec(&b);
        assert_eq!(d.encoding, UTF_8);
        assert_eq!(d.replaced, 1);
        assert!(d.text.contains("très élevé") && d.text.contains("stray \u{FFFD} byte"));
    }

    #[test]
    fn legacy_encodings_are_detected() {
        for (enc, text) in [
            (
                encoding_rs::WINDOWS_1252,
                "Le château était très élevé, où l'été déçoit à côté.",
            ),
            (
                encoding_rs::KOI8_R,
                "Съешь же ещё этих мягких французских булок, да выпей чаю. Широкая электрификация южных губерний.",
            ),
            (
                encoding_rs::SHIFT_JIS,
                "日本語の文章です。これは文字コードの判定を確かめるための例文です。",
            ),
            (
                encoding_rs::GBK,
                "这是一个中文文本，用来检验字符编码的自动识别是否正确。我们的索引应该能够找到它。",
            ),
        ] {
            let (bytes, _, unmappable) = enc.encode(text);
            assert!(!unmappable);
            let d = dec(&bytes);
            assert_eq!(d.text, text, "{}", enc.name());
            assert_eq!(d.replaced, 0);
        }
    }

    #[test]
    fn declarations_are_honoured() {
        let (body, _, _) = encoding_rs::WINDOWS_1251.encode("Привет");
        let mut html = b"<html><head><META http-equiv=\"Content-Type\" content=\"text/html; charset=windows-1251\"></head><body>".to_vec();
        html.extend_from_slice(&body);
        let d = decode(html, Declared::Html);
        assert_eq!(d.encoding, encoding_rs::WINDOWS_1251);
        assert!(d.text.contains("Привет"));
        let (body, _, _) = encoding_rs::ISO_8859_2.encode("Zażółć");
        let mut html = b"<meta charset='iso-8859-2'><p>".to_vec();
        html.extend_from_slice(&body);
        assert!(decode(html, Declared::Html).text.contains("Zażółć"));
        let (body, _, _) = encoding_rs::EUC_JP.encode("東京");
        let mut xml = b"<?xml version=\"1.0\" encoding=\"EUC-JP\"?>\n<a>".to_vec();
        xml.extend_from_slice(&body);
        assert!(dec(&xml).text.contains("東京"));
        // A declaration contradicted by valid UTF-8 (re-saved file): UTF-8; a 7-bit
        // encoding is honoured even though its bytes are valid UTF-8.
        let d = decode(
            "<meta charset=\"shift_jis\"><p>café".as_bytes().to_vec(),
            Declared::Html,
        );
        assert_eq!((d.encoding, d.text.ends_with("café")), (UTF_8, true));
        let (body, _, _) = encoding_rs::ISO_2022_JP.encode("東京");
        let mut html = b"<meta charset=iso-2022-jp><p>".to_vec();
        html.extend_from_slice(&body);
        assert!(decode(html, Declared::Html).text.ends_with("東京"));
        // `<meta charset>` is HTML's, not plain text's.
        let (body, _, _) = encoding_rs::WINDOWS_1251.encode("Привет");
        let mut txt = b"<meta charset=windows-1251> ".to_vec();
        txt.extend_from_slice(&body);
        assert_eq!(meta_charset(&txt), Some(&b"windows-1251"[..]));
        assert_eq!(declared_charset(&txt, Declared::Xml), None);
    }
}
