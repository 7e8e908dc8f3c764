//! PDF -> one section per page (page numbers are what citations point to). A page without
//! extractable text (a scan, a drawing) stays as a section with no lines: a document of
//! only such pages is reported as having no text layer.

use super::{Line, Section};

pub fn sections(bytes: &[u8]) -> Result<Vec<Section>, String> {
    let doc = lopdf::Document::load_mem(bytes).map_err(|e| format!("pdf: {e}"))?;
    let mut out = Vec::new();
    for (&page, _) in doc.get_pages().iter() {
        // A page whose text cannot be extracted counts as a page without text; the rest of
        // the file still counts.
        let text = doc.extract_text(&[page]).unwrap_or_default();
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
