//! PDF -> one section per page (page numbers are what citations point to).

use super::{Line, Section};

pub fn sections(bytes: &[u8]) -> Result<Vec<Section>, String> {
    let doc = lopdf::Document::load_mem(bytes).map_err(|e| format!("pdf: {e}"))?;
    let mut out = Vec::new();
    for (&page, _) in doc.get_pages().iter() {
        // A page whose text cannot be extracted is left out; the rest of the file still counts.
        let Ok(text) = doc.extract_text(&[page]) else {
            continue;
        };
        let lines: Vec<Line> = text
            .lines()
            .map(|l| Line {
                number: 0,
                text: l.trim_end().to_string(),
            })
            .collect();
        if lines.iter().any(|l| !l.text.trim().is_empty()) {
            out.push(Section {
                heading: Vec::new(),
                page: Some(page),
                lines,
            });
        }
    }
    Ok(out)
}
