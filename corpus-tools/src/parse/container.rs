//! Zip containers of DOCX, ODT and EPUB: reading named parts under a budget. The parsers
//! never extract anything to disk; entry names are only looked up, and names a document
//! points to (EPUB hrefs) are resolved inside the archive or refused.

use std::io::{Cursor, Read};
use zip::result::ZipError;
use zip::ZipArchive;

/// Uncompressed bytes one document may read in total: a zip bomb stops here.
pub const MAX_UNCOMPRESSED_BYTES: u64 = 64 << 20;
/// Entries one container may hold.
pub const MAX_ENTRIES: usize = 10_000;

pub struct Container<'a> {
    archive: ZipArchive<Cursor<&'a [u8]>>,
    /// Uncompressed bytes still allowed.
    budget: u64,
}

impl<'a> Container<'a> {
    /// Open `bytes` as a zip; `what` names the format in errors (`docx`, `epub`...).
    pub fn open(bytes: &'a [u8], what: &str) -> Result<Self, String> {
        if !bytes.starts_with(b"PK") {
            return Err(format!("{what}: not a zip container"));
        }
        let archive = ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| format!("{what}: not a readable zip container ({e})"))?;
        if archive.len() > MAX_ENTRIES {
            return Err(format!(
                "{what}: {} entries in the container, over the {MAX_ENTRIES} entry limit",
                archive.len()
            ));
        }
        Ok(Container {
            archive,
            budget: MAX_UNCOMPRESSED_BYTES,
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.archive.file_names()
    }

    /// The uncompressed bytes of entry `name`; `None` when there is no such entry. An
    /// encrypted entry, an unsupported compression, a corrupt stream or a read past the
    /// budget is an error.
    pub fn read(&mut self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let entry = match self.archive.by_name(name) {
            Ok(e) => e,
            Err(ZipError::FileNotFound) => return Ok(None),
            // ZipCrypto and AES entries alike: no password is ever given.
            Err(ZipError::UnsupportedArchive(ZipError::PASSWORD_REQUIRED)) => {
                return Err(format!("{name}: encrypted (password-protected)"))
            }
            Err(e) => return Err(format!("{name}: {e}")),
        };
        // The declared size may lie; the budget is enforced on what actually comes out.
        let mut out = Vec::with_capacity(entry.size().min(self.budget).min(1 << 20) as usize);
        entry
            .take(self.budget + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("{name}: {e}"))?;
        if out.len() as u64 > self.budget {
            return Err(format!(
                "over {} MiB uncompressed (zip bomb?), at {name}",
                MAX_UNCOMPRESSED_BYTES >> 20
            ));
        }
        self.budget -= out.len() as u64;
        Ok(Some(out))
    }

    /// [`Container::read`] as text (UTF-8, or UTF-16 with a byte-order mark).
    pub fn read_text(&mut self, name: &str) -> Result<Option<String>, String> {
        Ok(self.read(name)?.map(|b| xml_text(&b)))
    }

    /// [`Container::read_text`] of a part the format cannot do without.
    pub fn require_text(&mut self, name: &str, what: &str) -> Result<String, String> {
        self.read_text(name)?
            .ok_or_else(|| format!("{what}: missing part {name}"))
    }
}

/// XML bytes as text: UTF-16 when a byte-order mark says so, else UTF-8 (invalid sequences
/// replaced). These formats allow no other encodings.
pub fn xml_text(bytes: &[u8]) -> String {
    match encoding_rs::Encoding::for_bom(bytes) {
        Some((enc, bom)) => enc
            .decode_without_bom_handling(&bytes[bom..])
            .0
            .into_owned(),
        None => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// The directory part of an entry name, with its trailing `/` (empty at the root).
pub fn dir_of(name: &str) -> &str {
    name.rfind('/').map_or("", |i| &name[..=i])
}

/// Resolve `href` (relative to the directory `base`, percent-encoded, maybe with a
/// `#fragment`) to an entry name. `None` for absolute URLs, and for paths that leave the
/// archive (`../../etc/passwd`).
pub fn resolve(base: &str, href: &str) -> Option<String> {
    let href = href.split('#').next().unwrap_or_default();
    if href.is_empty() || href.contains(':') || href.starts_with("//") {
        return None;
    }
    let href = percent_decode(href)?;
    let mut parts: Vec<&str> = if href.starts_with('/') {
        Vec::new()
    } else {
        base.split('/').filter(|p| !p.is_empty()).collect()
    };
    for p in href.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let s = String::from_utf8(out).ok()?;
    (!s.contains('\0')).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hrefs_resolve_inside_the_archive_only() {
        assert_eq!(
            resolve("OEBPS/", "text/ch1.xhtml#p3").as_deref(),
            Some("OEBPS/text/ch1.xhtml")
        );
        assert_eq!(
            resolve("OEBPS/text/", "../img/a%20b.png").as_deref(),
            Some("OEBPS/img/a b.png")
        );
        assert_eq!(resolve("", "/root.xhtml").as_deref(), Some("root.xhtml"));
        assert_eq!(resolve("OEBPS/", "../../etc/passwd"), None);
        assert_eq!(resolve("", "../x"), None);
        assert_eq!(resolve("OEBPS/", "http://example.com/x.html"), None);
        assert_eq!(resolve("OEBPS/", "%zz"), None);
        assert_eq!(resolve("OEBPS/", "a%00b"), None);
        assert_eq!(resolve("OEBPS/", "#only-fragment"), None);
        assert_eq!(dir_of("OEBPS/content.opf"), "OEBPS/");
        assert_eq!(dir_of("content.opf"), "");
    }

    #[test]
    fn utf16_parts_are_decoded() {
        let utf16: Vec<u8> = [0xFF, 0xFE]
            .into_iter()
            .chain("<a>é</a>".encode_utf16().flat_map(u16::to_le_bytes))
            .collect();
        assert_eq!(xml_text(&utf16), "<a>é</a>");
        assert_eq!(xml_text(b"<a>x</a>"), "<a>x</a>");
    }
}
