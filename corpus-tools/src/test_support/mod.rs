//! Fixtures shared by the tests of corpus-tools and of the crates above it (not API).

mod documents;
mod encodings;
mod pdf;

pub use documents::{docx_bytes, epub_bytes, odt_bytes, zip_bytes, Block};
pub use encodings::{binary_files, encoding_corpus, write_encoding_corpus, EncodedFile};
pub use pdf::{write_pdf, write_scanned_pdf};
