//! gzip-compressed documents (`ls.1.gz`, `changelog.Debian.gz`, `README.md.gz`): decompressed
//! under a size cap, then classified by the name without `.gz`. Archives (`.tar.gz`, `.tgz`)
//! stay unsupported: their inner name ends in `.tar`.

use crate::detect::{Skip, SkipReason};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Whether `path` names a gzip file and `bytes` starts with the gzip magic.
pub fn is_gzip_doc(path: &Path, bytes: &[u8]) -> bool {
    let gz_ext = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    gz_ext && bytes.starts_with(&[0x1f, 0x8b])
}

/// The name the decompressed content is classified by: `path` without its `.gz`.
pub fn inner_name(path: &Path) -> PathBuf {
    path.with_extension("")
}

/// Decompress every gzip member of `bytes` into at most `max_bytes` bytes; more is
/// [`SkipReason::TooLarge`] (a small bomb cannot expand without bound), a corrupt stream is
/// [`SkipReason::ParseError`].
pub fn gunzip_capped(bytes: &[u8], max_bytes: usize) -> Result<Vec<u8>, Skip> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(max_bytes as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Skip::new(SkipReason::ParseError, format!("gzip: {e}")))?;
    if out.len() > max_bytes {
        return Err(Skip::new(
            SkipReason::TooLarge,
            format!("decompresses to over {} MiB", max_bytes >> 20),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn round_trip_and_multi_member() {
        let mut two = gzip(b"first ");
        two.extend(gzip(b"second"));
        assert_eq!(gunzip_capped(&two, 100).unwrap(), b"first second");
        assert_eq!(gunzip_capped(&gzip(b""), 0).unwrap(), b"");
    }

    #[test]
    fn bombs_and_corruption_are_skips() {
        let bomb = gzip(&vec![0u8; 4 << 20]);
        assert!(bomb.len() < 64 << 10);
        assert_eq!(
            gunzip_capped(&bomb, 1 << 20).unwrap_err().reason,
            SkipReason::TooLarge
        );
        let mut bad = gzip(b"some text that is long enough to be compressed");
        let n = bad.len();
        bad[12..n - 8].iter_mut().for_each(|b| *b ^= 0x5a);
        assert_eq!(
            gunzip_capped(&bad, 1 << 20).unwrap_err().reason,
            SkipReason::ParseError
        );
        let truncated = &gzip(b"hello world hello world")[..15];
        assert_eq!(
            gunzip_capped(truncated, 1 << 20).unwrap_err().reason,
            SkipReason::ParseError
        );
    }

    #[test]
    fn names() {
        assert!(is_gzip_doc(Path::new("ls.1.gz"), &[0x1f, 0x8b, 8]));
        assert!(!is_gzip_doc(Path::new("ls.1.gz"), b"plain"));
        assert!(!is_gzip_doc(Path::new("ls.1"), &[0x1f, 0x8b, 8]));
        assert_eq!(inner_name(Path::new("a/ls.1.gz")), Path::new("a/ls.1"));
        assert_eq!(inner_name(Path::new("a/x.tar.gz")), Path::new("a/x.tar"));
    }
}
