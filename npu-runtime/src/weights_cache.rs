//! An on-disk cache of repacked weights (benchmarks/runs/kernels-worklog.md#item-45).
//!
//! Loading a model repacks every matrix into the kernels' layout (`kernels::layout`),
//! which costs most of a load: reading the GGUF, the repack itself and the kernel zeroing
//! a fresh anonymous copy. After a load that repacked, the repacked bytes are written to
//! `<dir>/<gguf stem>-<path hash>.rpk`; the next load maps that file and builds every
//! matrix on its pages (`QMatrix::from_mapped`): no repack, no copy, and the pages are
//! shared with the page cache.
//!
//! A cache is used only if its header matches the model file exactly: the GGUF's size,
//! modification time, tensor directory and a sample of every tensor's bytes, and
//! [`layout_fingerprint`] (so a layout change
//! in a later build is never fed stale bytes), and each entry's type, shape, length and
//! alignment match what the GGUF says. Anything else (missing, truncated, foreign or
//! corrupt header) means "no cache": the model is repacked and the cache rewritten. The
//! file is written under a temporary name, synced, then renamed, so a crash or a kill
//! leaves either the old cache or the new one, never a torn file; concurrent loaders each
//! write their own temporary file and the last rename wins (both are complete).

use crate::kernels::{layout_fingerprint, GgmlType, QMatrix};
use graphs::fnv::Fnv1a;
use graphs::gguf::GgufFile;
use std::collections::HashMap;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where (or whether) repacked weights are cached across loads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum WeightsCache {
    /// Always repack (nothing is written).
    #[default]
    Off,
    /// Cache files live in this directory (created if missing).
    Dir(PathBuf),
}

/// What a load did with the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    Off,
    /// Every matrix came from the cache file.
    Hit(PathBuf),
    /// Repacked; the cache file is being written in the background.
    Writing(PathBuf),
    /// Repacked, and the cache file was (re)written.
    Written(PathBuf),
    /// Repacked; writing the cache failed (the reason), the model is loaded all the same.
    NotWritten(String),
}

impl CacheOutcome {
    /// For `Writing`: a line telling a user why the process still works after its answer.
    pub fn writing_note(&self) -> Option<String> {
        match self {
            CacheOutcome::Writing(p) => Some(format!(
                "writing the repacked weights to {} (once per model; later runs load faster)",
                p.display()
            )),
            _ => None,
        }
    }

    /// For a load that repacked and so writes the cache: [`Self::writing_note`] while the
    /// background write runs, a line saying it was written once it is done (a short run can
    /// finish after the write: which of the two a caller sees is a race).
    pub fn repacked_note(&self) -> Option<String> {
        match self {
            CacheOutcome::Written(p) => Some(format!(
                "wrote the repacked weights to {} (once per model; later runs load faster)",
                p.display()
            )),
            _ => self.writing_note(),
        }
    }
}

const MAGIC: &[u8; 8] = b"RAGRPK\0\x01";
/// Bytes hashed from each end of every tensor's data for the key.
const SAMPLE: usize = 256;

/// Matrices start at page boundaries (so each is 64-byte aligned for the kernels).
const ALIGN: u64 = 4096;

/// One matrix in a cache file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    ty: u32,
    rows: u64,
    cols: u64,
    offset: u64,
    len: u64,
}

/// A cache file that matches the model: its mapping and directory.
pub struct Cached {
    map: Arc<memmap2::Mmap>,
    entries: HashMap<String, Entry>,
}

impl Cached {
    /// The matrix `name` if the cache holds it with this type and shape.
    pub fn matrix(&self, name: &str, ty: GgmlType, rows: usize, cols: usize) -> Option<QMatrix> {
        let e = self.entries.get(name)?;
        if e.ty != ty.to_u32() || e.rows != rows as u64 || e.cols != cols as u64 {
            return None;
        }
        let m = QMatrix::from_mapped(ty, rows, cols, self.map.clone(), e.offset as usize).ok()?;
        (m.size_bytes() as u64 == e.len).then_some(m)
    }
}

/// Cache files in `dir` and their total size in bytes (for `rag model list`).
pub fn usage(dir: &Path) -> (usize, u64) {
    let Ok(list) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    list.flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "rpk"))
        .filter_map(|e| e.metadata().ok())
        .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
}

/// The cache file for the model at `gguf` in `dir`: one per model path (a hash of the
/// canonical path keeps two models with one file name apart).
pub fn cache_path(dir: &Path, gguf: &Path) -> PathBuf {
    let canonical = std::fs::canonicalize(gguf).unwrap_or_else(|_| gguf.to_path_buf());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    canonical.hash(&mut h);
    let stem = gguf
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    dir.join(format!("{stem}-{:016x}.rpk", h.finish()))
}

/// What a cache must have been made from: the GGUF's size, modification time (ns since
/// the epoch), a hash of its tensor directory and of both ends of every tensor's data, and
/// the layout fingerprint.
pub fn key(gguf: &Path, f: &GgufFile) -> io::Result<CacheKey> {
    let meta = std::fs::metadata(gguf)?;
    let mtime = meta
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut h = Fnv1a::default();
    for t in f.tensors() {
        h.write(t.name.as_bytes());
        h.write_u64(t.ggml_type.to_u32() as u64);
        t.dims.iter().for_each(|&d| h.write_u64(d));
        h.write_u64(t.offset);
        h.write_u64(t.n_bytes as u64);
        // The first and last bytes of the data too: a different file with the same layout
        // and a preserved modification time (a copy with `cp -p`) still misses.
        let data = f.tensor_data(t);
        h.write(&data[..data.len().min(SAMPLE)]);
        h.write(&data[data.len().saturating_sub(SAMPLE)..]);
    }
    Ok(CacheKey([meta.len(), mtime, h.0, layout_fingerprint()]))
}

/// What a cache file must have been made from (see [`key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheKey([u64; 4]);

/// Opens the cache for `gguf` in `dir` if it exists and was made for `key` (the model
/// file's [`key`], module docs); `None` otherwise.
pub fn open(dir: &Path, gguf: &Path, key: CacheKey) -> Option<Cached> {
    let file = File::open(cache_path(dir, gguf)).ok()?;
    // SAFETY: a read-only mapping of a file this program writes only under a temporary
    // name, renamed into place once complete: the mapped inode is never modified (a later
    // rename replaces the directory entry, not this file). As for the GGUF mapping, a
    // file truncated by someone else while mapped would fault, not corrupt memory.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let entries = parse(&map, key.0)?;
    Some(Cached {
        map: Arc::new(map),
        entries,
    })
}

/// Reads the directory of a cache image if its header is intact and made for `key`.
fn parse(b: &[u8], key: [u64; 4]) -> Option<HashMap<String, Entry>> {
    let mut r = Reader { b, at: 0 };
    if r.take(8)? != MAGIC {
        return None;
    }
    for k in key {
        if r.u64()? != k {
            return None;
        }
    }
    let n = r.u32()? as usize;
    let mut entries = HashMap::with_capacity(n.min(4096));
    for _ in 0..n {
        let len = r.u16()? as usize;
        let name = std::str::from_utf8(r.take(len)?).ok()?.to_string();
        let e = Entry {
            ty: r.u32()?,
            rows: r.u64()?,
            cols: r.u64()?,
            offset: r.u64()?,
            len: r.u64()?,
        };
        let end = e.offset.checked_add(e.len)?;
        if !e.offset.is_multiple_of(ALIGN) || end > b.len() as u64 {
            return None;
        }
        entries.insert(name, e);
    }
    let header_end = r.at;
    let mut h = Fnv1a::default();
    h.write(&b[..header_end]);
    (r.u64()? == h.0).then_some(entries)
}

/// Writes the cache for `gguf` (made from `key`) in `dir` holding `mats` (name, matrix);
/// returns its path.
pub fn store(
    dir: &Path,
    gguf: &Path,
    key: CacheKey,
    mats: &[(String, &QMatrix)],
) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = cache_path(dir, gguf);
    remove_stale_temporaries(&path);
    let mut header = Vec::new();
    header.extend_from_slice(MAGIC);
    for k in key.0 {
        header.extend_from_slice(&k.to_le_bytes());
    }
    header.extend_from_slice(&(mats.len() as u32).to_le_bytes());
    let entry_bytes: usize = mats.iter().map(|(n, _)| 2 + n.len() + 4 + 4 * 8).sum();
    let mut offset = (header.len() + entry_bytes + 8) as u64;
    let mut offsets = Vec::with_capacity(mats.len());
    for (name, m) in mats {
        let name_len = u16::try_from(name.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "tensor name too long"))?;
        offset = offset.next_multiple_of(ALIGN);
        offsets.push(offset);
        header.extend_from_slice(&name_len.to_le_bytes());
        header.extend_from_slice(name.as_bytes());
        header.extend_from_slice(&m.ggml_type().to_u32().to_le_bytes());
        for v in [
            m.rows() as u64,
            m.cols() as u64,
            offset,
            m.size_bytes() as u64,
        ] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        offset += m.size_bytes() as u64;
    }
    let mut h = Fnv1a::default();
    h.write(&header);
    header.extend_from_slice(&h.0.to_le_bytes());

    let tmp = path.with_extension(format!(
        "rpk.tmp.{}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    let written = (|| -> io::Result<()> {
        let mut out = File::create(&tmp)?;
        out.write_all(&header)?;
        let mut at = header.len() as u64;
        let zeros = vec![0u8; ALIGN as usize];
        for ((_, m), &off) in mats.iter().zip(&offsets) {
            out.write_all(&zeros[..(off - at) as usize])?;
            out.write_all(m.repacked_bytes())?;
            at = off + m.size_bytes() as u64;
        }
        out.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map(|()| path)
}

/// Deletes temporary files of `path` left by writers that died (no change for 10 minutes;
/// a live writer appends continuously and finishes in seconds).
fn remove_stale_temporaries(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!("{}.tmp.", name.to_string_lossy());
    let Ok(list) = std::fs::read_dir(dir) else {
        return;
    };
    for e in list.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 600);
        if old && e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Bounds-checked little-endian reads (a bad header gives `None`, never a panic).
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A load that repacked gets a note whether its background write is still running or
    /// already done; a cache hit, no cache or a failed write get none.
    #[test]
    fn repacked_note_covers_a_write_finished_before_the_run() {
        let p = PathBuf::from("/c/repacked/m.rpk");
        let writing = CacheOutcome::Writing(p.clone()).repacked_note().unwrap();
        assert!(writing.starts_with("writing the repacked weights to /c/repacked/m.rpk"));
        let written = CacheOutcome::Written(p.clone()).repacked_note().unwrap();
        assert!(written.starts_with("wrote the repacked weights to /c/repacked/m.rpk"));
        assert_eq!(CacheOutcome::Written(p.clone()).writing_note(), None);
        for none in [
            CacheOutcome::Off,
            CacheOutcome::Hit(p),
            CacheOutcome::NotWritten("x".into()),
        ] {
            assert_eq!(none.repacked_note(), None, "{none:?}");
        }
    }

    fn image() -> (Vec<u8>, [u64; 4]) {
        let key = [1u64, 2, 3, 4];
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        key.iter()
            .for_each(|k| b.extend_from_slice(&k.to_le_bytes()));
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&3u16.to_le_bytes());
        b.extend_from_slice(b"abc");
        b.extend_from_slice(&8u32.to_le_bytes());
        for v in [16u64, 32, ALIGN, 64] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let mut h = Fnv1a::default();
        h.write(&b);
        b.extend_from_slice(&h.0.to_le_bytes());
        b.resize(ALIGN as usize + 64, 0);
        (b, key)
    }

    #[test]
    fn usage_counts_cache_files_only() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a-1.rpk"), [0u8; 10]).unwrap();
        std::fs::write(d.path().join("b-2.rpk"), [0u8; 5]).unwrap();
        std::fs::write(d.path().join("b-2.rpk.tmp.1.2"), [0u8; 7]).unwrap();
        assert_eq!(usage(d.path()), (2, 15));
        assert_eq!(usage(&d.path().join("missing")), (0, 0));
    }

    #[test]
    fn header_round_trips_and_rejects_other_keys() {
        let (b, key) = image();
        let e = parse(&b, key).unwrap();
        assert_eq!(e["abc"].offset, ALIGN);
        assert!(
            parse(&b, [1, 2, 3, 5]).is_none(),
            "another layout fingerprint"
        );
        assert!(
            parse(&b[..ALIGN as usize + 63], key).is_none(),
            "data cut short"
        );
    }

    /// Every truncation and every single-byte change of the header is rejected, and
    /// random bytes never panic.
    #[test]
    fn damaged_headers_are_rejected() {
        let (b, key) = image();
        let header_len = 8 + 32 + 4 + 2 + 3 + 4 + 32 + 8;
        for cut in 0..header_len {
            assert!(parse(&b[..cut], key).is_none(), "cut at {cut}");
        }
        for i in 0..header_len {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(parse(&d, key).is_none(), "byte {i} changed");
        }
        let mut x = 7u64;
        for _ in 0..2000 {
            let junk: Vec<u8> = (0..200)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert!(parse(&junk, key).is_none());
        }
    }

    proptest::proptest! {
        /// Truncated, bit-flipped and extended images (also with a recomputed header
        /// checksum, which reaches the entry parsing) never panic, and whatever parses lies
        /// inside the image and on the alignment. Counts: proptest's default, or
        /// `PROPTEST_CASES` (docs/fuzzing.md).
        #[test]
        fn damaged_images_never_panic(
            edits in proptest::collection::vec((0.0f64..1.0, 1u8..=255), 0..6),
            keep in 0.0f64..1.0,
            extra in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            reseal in proptest::prelude::any::<bool>(),
        ) {
            let (mut b, key) = image();
            let header = 8 + 32 + 4 + 2 + 3 + 4 + 32;
            for (pos, x) in edits {
                b[(pos * header as f64) as usize] ^= x;
            }
            if reseal {
                let mut h = Fnv1a::default();
                h.write(&b[..header]);
                b[header..header + 8].copy_from_slice(&h.0.to_le_bytes());
            }
            b.truncate(((keep * b.len() as f64) as usize).max(header + 8).min(b.len()));
            b.extend_from_slice(&extra);
            if let Some(entries) = parse(&b, key) {
                for e in entries.values() {
                    proptest::prop_assert!(e.offset.is_multiple_of(ALIGN));
                    proptest::prop_assert!(e.offset + e.len <= b.len() as u64);
                }
            }
        }
    }
}
