//! HTML -> text with html2text; its plain renderer marks headings with `#`, so the
//! Markdown sectioner recovers the heading path. Source line numbers do not survive.

use super::markdown::{sections as md_sections, Flavor};
use super::Section;

const WIDTH: usize = 100;

pub fn sections(bytes: &[u8]) -> Result<Vec<Section>, String> {
    let text = html2text::from_read(bytes, WIDTH).map_err(|e| format!("html: {e}"))?;
    let mut secs = md_sections(&text, Flavor::Markdown);
    for s in &mut secs {
        for l in &mut s.lines {
            l.number = 0;
        }
    }
    Ok(secs)
}
