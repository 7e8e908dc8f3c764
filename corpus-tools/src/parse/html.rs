//! HTML -> text with html2text; its plain renderer marks headings with `#`, so the
//! Markdown sectioner recovers the heading path. Source line numbers do not survive.

use super::markdown::{sections as md_sections, Flavor};
use super::Section;

const WIDTH: usize = 100;

/// Elements open at once past which a page is not parsed: html5ever's tree builder takes
/// time quadratic in the depth (16k nested `<div>`s ~1 s, 16k `<ul><li>` ~5 s) and
/// html2text recurses over it (200k nested tables overflow a 16 MiB stack, which aborts
/// the process). Real pages nest a few dozen levels.
const MAX_DEPTH: usize = 2000;

pub fn sections(bytes: &[u8]) -> Result<Vec<Section>, String> {
    if open_elements(bytes) > MAX_DEPTH {
        return Err(format!(
            "html: elements nested deeper than {MAX_DEPTH} (unclosed tags?)"
        ));
    }
    let text = html2text::from_read(bytes, WIDTH).map_err(|e| format!("html: {e}"))?;
    let mut secs = md_sections(&text, Flavor::Markdown);
    for s in &mut secs {
        for l in &mut s.lines {
            l.number = 0;
        }
    }
    Ok(secs)
}

/// Elements without content, and elements the parser closes by itself when a sibling
/// starts (`<p>`, `<li>` and table cells are often left open): neither deepens the tree.
const FLAT: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr", "param", "keygen", "frame", "basefont", "bgsound", "p", "li", "dt", "dd", "tr", "td",
    "th", "option", "optgroup", "rb", "rt", "rp", "tbody", "thead", "tfoot", "colgroup", "caption",
    "html", "head", "body",
];

/// Elements whose content is raw text up to their end tag.
const RAW: &[&str] = &["script", "style", "textarea", "title", "xmp", "plaintext"];

/// An upper estimate of the most elements open at once: start tags minus end tags, skipping
/// [`FLAT`] elements, comments, declarations and raw text. Stops counting past
/// [`MAX_DEPTH`].
fn open_elements(b: &[u8]) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut i = 0;
    while let Some(lt) = b[i..].iter().position(|&c| c == b'<') {
        i += lt + 1;
        if b[i..].starts_with(b"!--") {
            i = find(b, i + 3, b"-->").map_or(b.len(), |e| e + 3);
            continue;
        }
        let closing = b.get(i) == Some(&b'/');
        let name_start = i + usize::from(closing);
        let name_len = b[name_start..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric())
            .count();
        if name_len == 0 || !b[name_start].is_ascii_alphabetic() {
            // `<!DOCTYPE`, `<?xml`, or a `<` in text.
            continue;
        }
        let name = b[name_start..name_start + name_len].to_ascii_lowercase();
        let end = tag_end(b, name_start + name_len);
        let self_closing = end > 0 && b.get(end - 1) == Some(&b'/');
        i = (end + 1).min(b.len());
        let name = std::str::from_utf8(&name).unwrap_or("");
        if closing {
            if !FLAT.contains(&name) {
                depth = depth.saturating_sub(1);
            }
            continue;
        }
        if RAW.contains(&name) {
            let close = format!("</{name}");
            i = find_ignore_case(b, i, close.as_bytes()).unwrap_or(b.len());
            continue;
        }
        if !self_closing && !FLAT.contains(&name) {
            depth += 1;
            max = max.max(depth);
            if max > MAX_DEPTH {
                break;
            }
        }
    }
    max
}

/// The `>` closing a tag whose attributes start at `from` (quoted values may hold `>`).
fn tag_end(b: &[u8], from: usize) -> usize {
    let mut quote = None;
    for (k, &c) in b.iter().enumerate().skip(from) {
        match (quote, c) {
            (None, b'"' | b'\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, b'>') => return k,
            _ => {}
        }
    }
    b.len()
}

fn find(b: &[u8], from: usize, pat: &[u8]) -> Option<usize> {
    b.get(from..)?
        .windows(pat.len())
        .position(|w| w == pat)
        .map(|p| p + from)
}

fn find_ignore_case(b: &[u8], from: usize, pat: &[u8]) -> Option<usize> {
    b.get(from..)?
        .windows(pat.len())
        .position(|w| w.eq_ignore_ascii_case(pat))
        .map(|p| p + from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_elements_counts_what_nests() {
        let page = "<!DOCTYPE html><html><head><title><div></title><script>if (a<b) {'<div>'}</script>\
                    </head><body><div class=\"a>b\"><p>one<p>two<ul><li>x<li>y</ul>\
                    <br><img src=x><br/><!-- <div><div> --><table><tr><td>c<td>d</table></div></body></html>";
        // The div with the list in it, then the div with the table.
        assert_eq!(open_elements(page.as_bytes()), 2);
        assert_eq!(open_elements(b"a < b and c<1"), 0);
        let deep = "<div>".repeat(MAX_DEPTH + 1);
        assert!(sections(deep.as_bytes())
            .unwrap_err()
            .contains("nested deeper"));
        let closed = "<div>x</div>".repeat(10 * MAX_DEPTH);
        assert!(sections(closed.as_bytes()).is_ok());
        // Thousands of unclosed paragraphs and list items stay flat.
        let flat = "<ul>".to_string() + &"<li><p>item".repeat(10 * MAX_DEPTH);
        assert!(sections(flat.as_bytes()).is_ok());
    }
}
