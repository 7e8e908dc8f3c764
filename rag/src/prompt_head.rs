//! The KV rows of the prompt's constant head (chat template and system message), kept on
//! disk between processes so a new `rag ask` does not prefill them again.
//!
//! A file holds the head's token ids and the session's exported K/V rows
//! (`Session::export_kv`), under a key naming the model file and the engine build (a
//! rebuild may change the arithmetic, so its rows are never reused). Restored rows are
//! exactly what prefilling the head computes (`tests/kv_export.rs` in npu-runtime), and
//! only the part of the head that the next prompt really starts with is kept, so the answer
//! never changes. Anything unexpected (missing file, other key, wrong sizes, bad checksum)
//! means "no head": the prompt is prefilled in full, as without the cache.

use graphs::fnv::Fnv1a;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"RAGKVH1\0";

/// A cached prompt head: its tokens and their K/V rows.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptHead {
    pub tokens: Vec<u32>,
    pub rows: Vec<f32>,
}

/// The head file of a model (by file stem) in `dir`.
pub fn file(dir: &Path, model_stem: &str) -> PathBuf {
    dir.join(format!("khead-{model_stem}.bin"))
}

/// The stored head if `path` holds one under `key` whose rows fit `floats_per_token`.
pub fn load(path: &Path, key: &str, floats_per_token: usize) -> Option<PromptHead> {
    let bytes = std::fs::read(path).ok()?;
    parse(&bytes, key, floats_per_token)
}

fn parse(bytes: &[u8], key: &str, floats_per_token: usize) -> Option<PromptHead> {
    let (body, sum) = bytes.split_at(bytes.len().checked_sub(8)?);
    let mut h = Fnv1a::default();
    h.write(body);
    if h.0.to_le_bytes() != sum {
        return None;
    }
    let mut r = Reader(body);
    if r.take(8)? != MAGIC || r.take_len()? != key.len() || r.take(key.len())? != key.as_bytes() {
        return None;
    }
    let n = r.take_len()?;
    let tokens: Vec<u32> = (0..n)
        .map(|_| Some(u32::from_le_bytes(r.take(4)?.try_into().ok()?)))
        .collect::<Option<_>>()?;
    let floats = r.take_len()?;
    if floats != n.checked_mul(floats_per_token)? || r.0.len() != floats.checked_mul(4)? {
        return None;
    }
    let rows =
        r.0.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
    Some(PromptHead { tokens, rows })
}

/// Writes `head` under `key` (temporary file + rename: a reader never sees half a file).
pub fn store(path: &Path, key: &str, head: &PromptHead) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(32 + key.len() + 4 * (head.tokens.len() + head.rows.len()));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(key.len() as u64).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&(head.tokens.len() as u64).to_le_bytes());
    for t in &head.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(head.rows.len() as u64).to_le_bytes());
    for x in &head.rows {
        out.extend_from_slice(&x.to_le_bytes());
    }
    let mut h = Fnv1a::default();
    h.write(&out);
    out.extend_from_slice(&h.0.to_le_bytes());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &out)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Tokens two sequences share from the start. With `probe` = the same messages but the
/// last one's text replaced, it is the constant head of `prompt`; with the tokens a session
/// holds, the KV it can keep.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(a, b)| a == b).count()
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    /// A u64 length that fits this platform and the bytes left (no huge allocation).
    fn take_len(&mut self) -> Option<usize> {
        let v = u64::from_le_bytes(self.take(8)?.try_into().ok()?);
        let v = usize::try_from(v).ok()?;
        (v <= self.0.len()).then_some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PromptHead {
        PromptHead {
            tokens: vec![7, 8, 9],
            rows: (0..12).map(|i| i as f32 * 0.5 - 1.0).collect(),
        }
    }

    #[test]
    fn round_trip_and_every_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path(), "m");
        store(&path, "key-a", &sample()).unwrap();
        assert_eq!(load(&path, "key-a", 4), Some(sample()));
        assert_eq!(load(&path, "key-b", 4), None, "another model or build");
        assert_eq!(load(&path, "key-a", 5), None, "another row width");
        let bytes = std::fs::read(&path).unwrap();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert_eq!(parse(&b, "key-a", 4), None, "bit flip at {i}");
        }
        for n in 0..bytes.len() {
            assert_eq!(parse(&bytes[..n], "key-a", 4), None, "truncated to {n}");
        }
        assert_eq!(load(&dir.path().join("missing"), "key-a", 4), None);
    }

    #[test]
    fn head_is_the_common_prefix() {
        assert_eq!(common_prefix(&[1, 2, 3, 4], &[1, 2, 9]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[5], &[6]), 0);
    }
}
