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
//! [`layout_fingerprint`] (so a layout change in a later build is never fed stale bytes),
//! and each entry's type, shape, length and alignment match what the GGUF says; and only
//! if its data part (every byte after the header) has the checksum the header records
//! (`checksum`: XXH3-64 of 1 MiB pieces, hashed on the loader's thread pool before any
//! matrix is built on the mapping), so a flipped bit in the weights is never used. The
//! check reads the data once more at about memory speed: measured on a quiet 2-core
//! development machine, it adds ~55 ms to a load of a 0.58 GB cache and ~90 ms to one of
//! 1.1 GB; a model's data is read from memory by every forward pass anyway.
//!
//! A cache file of another format version, model file or build is a plain miss; one that
//! is damaged (cut short, a header or data checksum that does not match) is a miss the
//! user is told about (`CacheOutcome`'s notes). Either way the model is repacked and the
//! cache rewritten, never an error. The file is written under a temporary name, synced,
//! then renamed, so a crash or a kill leaves either the old cache or the new one, never a
//! torn file; concurrent loaders each write their own temporary file and the last rename
//! wins (both are complete).
//!
//! Layout (little-endian): magic with the format version; the [`key`] (4 x u64); the data
//! part's length and checksum (u64 each); the entry count (u32); per entry its name
//! (u16 length, UTF-8), type (u32), rows, cols, offset and length (u64 each); an FNV-1a
//! checksum of all that (u64); then the data part: the matrices at `ALIGN`ed offsets,
//! zeros between them, the file ending where the last matrix ends.

pub mod checksum;

use crate::kernels::{layout_fingerprint, GgmlType, QMatrix, ThreadPool};
use graphs::fnv::Fnv1a;
use graphs::gguf::GgufFile;
use std::collections::HashMap;
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{self, Seek, Write};
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
    /// Repacked; the cache file is being written in the background. `damage`: what was
    /// wrong with the damaged cache file this write replaces, if that is why it repacked.
    Writing {
        path: PathBuf,
        damage: Option<String>,
    },
    /// Repacked, and the cache file was (re)written (`damage` as for `Writing`).
    Written {
        path: PathBuf,
        damage: Option<String>,
    },
    /// Repacked; writing the cache failed (the reason), the model is loaded all the same.
    NotWritten(String),
}

impl CacheOutcome {
    /// A line for the user after the answer: why the process still works (`Writing`), or
    /// that a damaged cache file was not used and is being or was replaced.
    pub fn writing_note(&self) -> Option<String> {
        match self {
            CacheOutcome::Written {
                path,
                damage: Some(d),
            } => Some(cache_note(path, Some(d), Tense::Done)),
            CacheOutcome::Writing { path, damage } => {
                Some(cache_note(path, damage.as_deref(), Tense::Running))
            }
            _ => None,
        }
    }

    /// For a load that repacked and so writes the cache: [`Self::writing_note`] while the
    /// background write runs, a line saying it was written once it is done (a short run can
    /// finish after the write: which of the two a caller sees is a race).
    pub fn repacked_note(&self) -> Option<String> {
        match self {
            CacheOutcome::Written { path, damage } => {
                Some(cache_note(path, damage.as_deref(), Tense::Done))
            }
            _ => self.writing_note(),
        }
    }
}

/// Whether the cache write a note speaks of is still running or done.
#[derive(Clone, Copy)]
enum Tense {
    Running,
    Done,
}

/// The one sentence of [`CacheOutcome`]'s notes, in the write's tense.
fn cache_note(path: &Path, damage: Option<&str>, tense: Tense) -> String {
    let path = path.display();
    match (damage, tense) {
        (Some(d), Tense::Running) => format!(
            "the repacked weights in {path} are damaged ({d}): repacked the model instead \
             and rewriting them"
        ),
        (Some(d), Tense::Done) => format!(
            "the repacked weights in {path} were damaged ({d}): repacked the model instead \
             and rewrote them"
        ),
        (None, Tense::Running) => format!(
            "writing the repacked weights to {path} (once per model; later runs load faster)"
        ),
        (None, Tense::Done) => {
            format!("wrote the repacked weights to {path} (once per model; later runs load faster)")
        }
    }
}

/// The last byte is the format version (2: the data part's length and checksum).
const MAGIC: &[u8; 8] = b"RAGRPK\0\x02";
/// Bytes hashed from each end of every tensor's data for the key.
const SAMPLE: usize = 256;

/// More matrices than a cache may hold (a 70B model has ~600).
const MAX_ENTRIES: usize = 1 << 16;

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

/// What [`open`] found.
pub enum Lookup {
    /// A cache file for this model and build, intact.
    Hit(Cached),
    /// No cache file, or one of another format version, model file or build.
    Miss,
    /// A cache file for this model that is damaged (what is wrong).
    Damaged(&'static str),
}

/// Why a cache image is not used (see [`Lookup`]).
#[derive(Debug, PartialEq, Eq)]
enum Reject {
    Miss,
    Damaged(&'static str),
}

/// Opens the cache for `gguf` in `dir` if it exists, was made for `key` (the model file's
/// [`key`], module docs) and its data part has the recorded checksum (hashed on `pool`).
pub fn open(dir: &Path, gguf: &Path, key: CacheKey, pool: &ThreadPool) -> Lookup {
    let Ok(file) = File::open(cache_path(dir, gguf)) else {
        return Lookup::Miss;
    };
    // SAFETY: a read-only mapping of a file this program writes only under a temporary
    // name, renamed into place once complete: the mapped inode is never modified (a later
    // rename replaces the directory entry, not this file). As for the GGUF mapping, a
    // file truncated by someone else while mapped would fault, not corrupt memory.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return Lookup::Miss;
    };
    match check(&map, key.0, pool) {
        Ok(entries) => Lookup::Hit(Cached {
            map: Arc::new(map),
            entries,
        }),
        Err(Reject::Miss) => Lookup::Miss,
        Err(Reject::Damaged(what)) => Lookup::Damaged(what),
    }
}

/// The directory of a cache image made for `key` whose header and data are intact.
fn check(b: &[u8], key: [u64; 4], pool: &ThreadPool) -> Result<HashMap<String, Entry>, Reject> {
    let h = parse(b, key)?;
    if checksum::data_checksum(&b[h.data_start..], pool) != h.data_sum {
        return Err(Reject::Damaged("its data does not match its checksum"));
    }
    Ok(h.entries)
}

/// A cache image's header.
#[derive(Debug)]
struct Header {
    entries: HashMap<String, Entry>,
    /// Where the data part starts (the header's end).
    data_start: usize,
    data_sum: u64,
}

/// Reads the header of a cache image if it is intact, made for `key` and `b` has exactly
/// the length it records (the data checksum is [`check`]'s).
fn parse(b: &[u8], key: [u64; 4]) -> Result<Header, Reject> {
    const CUT: Reject = Reject::Damaged("the file is cut short");
    let mut r = Reader { b, at: 0 };
    match r.take(MAGIC.len()) {
        None => return Err(CUT),
        Some(m) if m != MAGIC => return Err(Reject::Miss),
        Some(_) => {}
    }
    let mut file_key = [0u64; 4];
    for k in &mut file_key {
        *k = r.u64().ok_or(CUT)?;
    }
    let data_len = r.u64().ok_or(CUT)?;
    let data_sum = r.u64().ok_or(CUT)?;
    let n = r.u32().ok_or(CUT)? as usize;
    // Far more matrices than any model has: a damaged count, not read on (each entry
    // read would be kept until the header checksum fails).
    if n > MAX_ENTRIES {
        return Err(Reject::Damaged("its header does not match its checksum"));
    }
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let len = r.u16().ok_or(CUT)? as usize;
        let name = r.take(len).ok_or(CUT)?;
        let e = Entry {
            ty: r.u32().ok_or(CUT)?,
            rows: r.u64().ok_or(CUT)?,
            cols: r.u64().ok_or(CUT)?,
            offset: r.u64().ok_or(CUT)?,
            len: r.u64().ok_or(CUT)?,
        };
        entries.push((name, e));
    }
    let mut h = Fnv1a::default();
    h.write(&b[..r.at]);
    if r.u64().ok_or(CUT)? != h.0 {
        return Err(Reject::Damaged("its header does not match its checksum"));
    }
    // An intact header made for another model file or build: stale, not damaged.
    if file_key != key {
        return Err(Reject::Miss);
    }
    let data_start = r.at;
    match (data_start as u64).checked_add(data_len) {
        Some(end) if end == b.len() as u64 => {}
        Some(end) if end < b.len() as u64 => {
            return Err(Reject::Damaged("the file is longer than its header says"))
        }
        _ => return Err(CUT),
    }
    const BAD: Reject = Reject::Damaged("its directory is inconsistent");
    let mut directory = HashMap::with_capacity(entries.len());
    for (name, e) in entries {
        let name = std::str::from_utf8(name).map_err(|_| BAD)?;
        let end = e.offset.checked_add(e.len);
        if !e.offset.is_multiple_of(ALIGN)
            || e.offset < data_start as u64
            || end.is_none_or(|end| end > b.len() as u64)
        {
            return Err(BAD);
        }
        directory.insert(name.to_string(), e);
    }
    Ok(Header {
        entries: directory,
        data_start,
        data_sum,
    })
}

/// The header of a cache holding `entries` (name, entry) made for `key`, whose data part
/// has `data_len` bytes with checksum `data_sum`.
fn encode_header(
    key: [u64; 4],
    data_len: u64,
    data_sum: u64,
    entries: &[(&str, Entry)],
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(MAGIC);
    for v in key.into_iter().chain([data_len, data_sum]) {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (name, e) in entries {
        b.extend_from_slice(&(name.len() as u16).to_le_bytes());
        b.extend_from_slice(name.as_bytes());
        b.extend_from_slice(&e.ty.to_le_bytes());
        for v in [e.rows, e.cols, e.offset, e.len] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    let mut h = Fnv1a::default();
    h.write(&b);
    b.extend_from_slice(&h.0.to_le_bytes());
    b
}

/// The header's length for entries with these names.
fn header_len<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    let fixed = MAGIC.len() + 6 * 8 + 4 + 8;
    fixed + names.map(|n| 2 + n.len() + 4 + 4 * 8).sum::<usize>()
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
    if mats.len() > MAX_ENTRIES || mats.iter().any(|(n, _)| n.len() > u16::MAX as usize) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many matrices or a tensor name too long",
        ));
    }
    let data_start = header_len(mats.iter().map(|(n, _)| n.as_str())) as u64;
    let mut offset = data_start;
    let mut entries = Vec::with_capacity(mats.len());
    for (name, m) in mats {
        offset = offset.next_multiple_of(ALIGN);
        let e = Entry {
            ty: m.ggml_type().to_u32(),
            rows: m.rows() as u64,
            cols: m.cols() as u64,
            offset,
            len: m.size_bytes() as u64,
        };
        offset += e.len;
        entries.push((name.as_str(), e));
    }
    let data_len = offset - data_start;

    let tmp = path.with_extension(format!(
        "rpk.tmp.{}.{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    let written = (|| -> io::Result<()> {
        let mut out = File::create(&tmp)?;
        // The data checksum is known once the data is written: a placeholder header
        // first, the real one over it at the end.
        out.write_all(&encode_header(key.0, data_len, 0, &entries))?;
        let mut sum = checksum::Streaming::default();
        let mut put = |bytes: &[u8]| -> io::Result<()> {
            // Hashed and written piece by piece, while each is in the CPU's cache.
            for piece in bytes.chunks(checksum::CHUNK) {
                sum.update(piece);
                out.write_all(piece)?;
            }
            Ok(())
        };
        let zeros = vec![0u8; ALIGN as usize];
        let mut at = data_start;
        for ((_, m), (_, e)) in mats.iter().zip(&entries) {
            put(&zeros[..(e.offset - at) as usize])?;
            put(m.repacked_bytes())?;
            at = e.offset + e.len;
        }
        out.seek(io::SeekFrom::Start(0))?;
        out.write_all(&encode_header(key.0, data_len, sum.finish(), &entries))?;
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
    /// already done; a cache hit, no cache or a failed write get none. A damaged cache
    /// file is named in the note after an answer too, even once rewritten.
    #[test]
    fn notes_cover_a_finished_write_and_a_damaged_cache() {
        let path = PathBuf::from("/c/repacked/m.rpk");
        let writing = CacheOutcome::Writing {
            path: path.clone(),
            damage: None,
        };
        let written = CacheOutcome::Written {
            path: path.clone(),
            damage: None,
        };
        let note = writing.repacked_note().unwrap();
        assert!(note.starts_with("writing the repacked weights to /c/repacked/m.rpk"));
        let note = written.repacked_note().unwrap();
        assert!(note.starts_with("wrote the repacked weights to /c/repacked/m.rpk"));
        assert_eq!(written.writing_note(), None);
        for none in [
            CacheOutcome::Off,
            CacheOutcome::Hit(path.clone()),
            CacheOutcome::NotWritten("x".into()),
        ] {
            assert_eq!(none.repacked_note(), None, "{none:?}");
        }
        let damage = Some("its data does not match its checksum".to_string());
        let writing = CacheOutcome::Writing {
            path: path.clone(),
            damage: damage.clone(),
        };
        let written = CacheOutcome::Written { path, damage };
        let want = "the repacked weights in /c/repacked/m.rpk are damaged (its data does not \
                    match its checksum): repacked the model instead and rewriting them";
        assert_eq!(writing.writing_note().as_deref(), Some(want));
        assert_eq!(writing.repacked_note().as_deref(), Some(want));
        let want = "the repacked weights in /c/repacked/m.rpk were damaged (its data does \
                    not match its checksum): repacked the model instead and rewrote them";
        assert_eq!(written.writing_note().as_deref(), Some(want));
        assert_eq!(written.repacked_note().as_deref(), Some(want));
    }

    /// The header of [`image`] without its checksum.
    const HEADER: usize = 8 + 6 * 8 + 4 + 2 + 3 + 4 + 4 * 8;

    /// A cache image of one 64-byte matrix "abc" at `ALIGN`, and its key.
    fn image() -> (Vec<u8>, [u64; 4]) {
        let key = [1u64, 2, 3, 4];
        let entry = Entry {
            ty: 8,
            rows: 16,
            cols: 32,
            offset: ALIGN,
            len: 64,
        };
        let start = header_len(["abc"].into_iter());
        assert_eq!(start, HEADER + 8);
        let mut data = vec![0u8; ALIGN as usize + 64 - start];
        let n = data.len();
        for (i, x) in data[n - 64..].iter_mut().enumerate() {
            *x = i as u8 + 1;
        }
        let sum = checksum::data_checksum(&data, &ThreadPool::new(1));
        let mut b = encode_header(key, n as u64, sum, &[("abc", entry)]);
        assert_eq!(b.len(), start);
        b.extend_from_slice(&data);
        (b, key)
    }

    fn pool() -> ThreadPool {
        ThreadPool::new(2)
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
        let e = check(&b, key, &pool()).unwrap();
        assert_eq!(e["abc"].offset, ALIGN);
        assert_eq!(
            parse(&b, [1, 2, 3, 5]).unwrap_err(),
            Reject::Miss,
            "another layout fingerprint"
        );
        assert_eq!(
            parse(&b[..ALIGN as usize + 63], key).unwrap_err(),
            Reject::Damaged("the file is cut short")
        );
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(
            parse(&longer, key).unwrap_err(),
            Reject::Damaged("the file is longer than its header says")
        );
    }

    /// A cache of another format version (the previous one had no data checksum) is a
    /// plain miss, rebuilt without a word about damage.
    #[test]
    fn other_format_versions_are_a_plain_miss() {
        let (b, key) = image();
        for version in [1u8, 3] {
            let mut d = b.clone();
            d[7] = version;
            assert_eq!(parse(&d, key).unwrap_err(), Reject::Miss, "v{version}");
        }
    }

    /// Every truncation and every single-byte change of the header is rejected, and
    /// random bytes never panic.
    #[test]
    fn damaged_headers_are_rejected() {
        let (b, key) = image();
        for cut in 0..b.len() {
            assert!(parse(&b[..cut], key).is_err(), "cut at {cut}");
        }
        for i in 0..HEADER + 8 {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert!(parse(&d, key).is_err(), "byte {i} changed");
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
            assert!(parse(&junk, key).is_err());
        }
    }

    /// A change of any byte of the data part (matrix or padding) fails the data checksum;
    /// the header alone does not notice it.
    #[test]
    fn every_data_byte_is_checked() {
        let (b, key) = image();
        let pool = pool();
        for i in HEADER + 8..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x01;
            assert!(parse(&d, key).is_ok(), "byte {i}: the header is intact");
            assert_eq!(
                check(&d, key, &pool).unwrap_err(),
                Reject::Damaged("its data does not match its checksum"),
                "byte {i} changed"
            );
        }
    }

    proptest::proptest! {
        /// Truncated, bit-flipped and extended images (also with a recomputed header
        /// checksum, which reaches the entry checks) never panic, and whatever passes lies
        /// inside the image's data part and on the alignment. Counts: proptest's default,
        /// or `PROPTEST_CASES` (docs/fuzzing.md).
        #[test]
        fn damaged_images_never_panic(
            edits in proptest::collection::vec((0.0f64..1.0, 1u8..=255), 0..6),
            keep in 0.0f64..1.0,
            extra in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            reseal in proptest::prelude::any::<bool>(),
        ) {
            let (mut b, key) = image();
            for (pos, x) in edits {
                b[(pos * HEADER as f64) as usize] ^= x;
            }
            if reseal {
                let mut h = Fnv1a::default();
                h.write(&b[..HEADER]);
                b[HEADER..HEADER + 8].copy_from_slice(&h.0.to_le_bytes());
            }
            b.truncate(((keep * b.len() as f64) as usize).max(HEADER + 8).min(b.len()));
            b.extend_from_slice(&extra);
            if let Ok(entries) = check(&b, key, &ThreadPool::new(1)) {
                for e in entries.values() {
                    proptest::prop_assert!(e.offset.is_multiple_of(ALIGN));
                    proptest::prop_assert!(e.offset >= (HEADER + 8) as u64);
                    proptest::prop_assert!(e.offset + e.len <= b.len() as u64);
                }
            }
        }
    }
}
