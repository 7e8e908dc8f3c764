//! sha256 checks of cached model files, remembered beside each file so a 1.5 GB model is
//! not hashed again on every `rag model list`.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Whether the file at `path` has the pinned `sha`. The first check hashes it and, on a
/// match, records the hash with the file's size and mtime beside it
/// ([`verified_record`]); later checks trust the file while its size and mtime still match
/// the record.
pub fn file_matches(path: &Path, sha: &str) -> Result<bool> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(false);
    };
    if !meta.is_file() {
        return Ok(false);
    }
    let record = verified_record(path);
    if let Some(stamp) = stamp(path, sha) {
        if fs::read_to_string(&record).is_ok_and(|r| r.trim() == stamp) {
            return Ok(true);
        }
    }
    if !sha256_file(path)?.eq_ignore_ascii_case(sha) {
        return Ok(false);
    }
    record_verified(path, sha);
    Ok(true)
}

/// Records that `path` (just hashed by the caller) has `sha`. Best effort: where the record
/// cannot be written, the file is hashed again next time.
pub fn record_verified(path: &Path, sha: &str) {
    if let Some(stamp) = stamp(path, sha) {
        let _ = fs::write(verified_record(path), stamp);
    }
}

/// `sha size mtime-nanos` of the file as it is now.
fn stamp(path: &Path, sha: &str) -> Option<String> {
    let meta = fs::metadata(path).ok()?;
    let mtime = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(format!(
        "{} {} {}",
        sha.to_ascii_lowercase(),
        meta.len(),
        mtime.as_nanos()
    ))
}

/// Where [`file_matches`] records a verified file: `<file>.verified`.
pub fn verified_record(path: &Path) -> PathBuf {
    with_suffix(path, ".verified")
}

/// `path` with `suffix` appended to its file name.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verified file is trusted while its size and mtime match the record (changed
    /// bytes under the same stamp are not re-hashed), and hashed again when they change.
    #[test]
    fn a_verified_file_is_hashed_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        fs::write(&path, b"weights v1").unwrap();
        let sha = sha256_file(&path).unwrap();
        assert!(!file_matches(&path, &"0".repeat(64)).unwrap());
        assert!(!verified_record(&path).exists());
        assert!(file_matches(&path, &sha).unwrap());
        assert!(verified_record(&path).exists());
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        let same_size = |bytes: &[u8], t: std::time::SystemTime| {
            fs::write(&path, bytes).unwrap();
            fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        same_size(b"weights v2", mtime);
        assert!(file_matches(&path, &sha).unwrap(), "trusted: not re-hashed");
        // The record names the hash it vouches for.
        assert!(!file_matches(&path, &"0".repeat(64)).unwrap());
        same_size(b"weights v2", mtime + std::time::Duration::from_secs(1));
        assert!(!file_matches(&path, &sha).unwrap(), "re-hashed");
    }

    #[test]
    fn sha256_of_known_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"abc").unwrap();
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(!file_matches(&p, &"0".repeat(64)).unwrap());
    }
}
