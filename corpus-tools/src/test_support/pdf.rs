//! Small PDFs written with lopdf: one line of text per page, or pages that only show an
//! image (a scan).

use lopdf::content::{Content, Operation};
use lopdf::{dictionary, Dictionary, Document, Object, Stream};
use std::path::Path;

/// Writes a PDF with one line of text per page (Courier), for page-citation tests.
pub fn write_pdf(path: &Path, pages: &[&str]) -> std::io::Result<()> {
    let mut doc = Document::with_version("1.5");
    let font_id = doc
        .add_object(dictionary! {"Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Courier"});
    let mut contents = Vec::new();
    for text in pages {
        let content = Content {
            operations: vec![
                Operation::new("BT", vec![]),
                Operation::new("Tf", vec!["F1".into(), 12.into()]),
                Operation::new("Td", vec![50.into(), 700.into()]),
                Operation::new("Tj", vec![Object::string_literal(*text)]),
                Operation::new("ET", vec![]),
            ],
        };
        contents.push(content.encode().map_err(std::io::Error::other)?);
    }
    save_pages(
        doc,
        dictionary! {"Font" => dictionary! {"F1" => font_id}},
        contents,
        path,
    )
}

/// A PDF whose `pages` pages each show an image and hold no text (what a scanner makes).
pub fn write_scanned_pdf(path: &Path, pages: usize) -> std::io::Result<()> {
    let mut doc = Document::with_version("1.5");
    // An 8x8 grey image.
    let image = Stream::new(
        dictionary! {
            "Type" => "XObject", "Subtype" => "Image", "Width" => 8, "Height" => 8,
            "ColorSpace" => "DeviceGray", "BitsPerComponent" => 8,
        },
        vec![0x80; 64],
    );
    let image_id = doc.add_object(image);
    let contents = vec![b"q 500 0 0 700 50 50 cm /Im1 Do Q".to_vec(); pages];
    save_pages(
        doc,
        dictionary! {"XObject" => dictionary! {"Im1" => image_id}},
        contents,
        path,
    )
}

/// Adds one A4 page per content stream (all sharing `resources`), the page tree and the
/// catalog to `doc`, and saves it to `path`.
fn save_pages(
    mut doc: Document,
    resources: Dictionary,
    contents: Vec<Vec<u8>>,
    path: &Path,
) -> std::io::Result<()> {
    let pages_id = doc.new_object_id();
    let resources_id = doc.add_object(resources);
    let mut kids = Vec::new();
    for content in contents {
        let content_id = doc.add_object(Stream::new(dictionary! {}, content));
        let page_id = doc.add_object(dictionary! {
            "Type" => "Page", "Parent" => pages_id, "Contents" => content_id,
        });
        kids.push(page_id.into());
    }
    let count = kids.len() as i64;
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages", "Kids" => kids, "Count" => count,
            "Resources" => resources_id, "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
        }),
    );
    let catalog_id = doc.add_object(dictionary! {"Type" => "Catalog", "Pages" => pages_id});
    doc.trailer.set("Root", catalog_id);
    doc.save(path)?;
    Ok(())
}
