//! Persistent token database: corpus chunks and finished conversations, the
//! second draft source of SAM-Decoding. Bounded (oldest documents are dropped
//! first), saved atomically (temp file + rename), validated on load.

use crate::sam::{SuffixAutomaton, SEPARATOR};
use crate::SpecError;
use std::collections::VecDeque;
use std::path::Path;

/// Anything that can feed token sequences into the database (rag implements it
/// for tokenized corpus chunks and finished conversations).
pub trait TokenSource {
    fn for_each_sequence(&self, f: &mut dyn FnMut(&[u32]));
}

impl TokenSource for [Vec<u32>] {
    fn for_each_sequence(&self, f: &mut dyn FnMut(&[u32])) {
        for s in self {
            f(s);
        }
    }
}

impl TokenSource for TokenDb {
    fn for_each_sequence(&self, f: &mut dyn FnMut(&[u32])) {
        for d in &self.docs {
            f(d);
        }
    }
}

const MAGIC: &[u8; 8] = b"SDTOKDB1";
/// Default bound: 256 Ki tokens (1 MiB on disk; the automaton over it needs
/// roughly 60-100 MB at most, less for natural text).
pub const DEFAULT_MAX_TOKENS: usize = 256 * 1024;

#[derive(Clone, Debug)]
pub struct TokenDb {
    docs: VecDeque<Vec<u32>>,
    total: usize,
    max_tokens: usize,
}

impl TokenDb {
    pub fn new(max_tokens: usize) -> Self {
        TokenDb {
            docs: VecDeque::new(),
            total: 0,
            max_tokens: max_tokens.max(1),
        }
    }

    pub fn total_tokens(&self) -> usize {
        self.total
    }

    pub fn num_docs(&self) -> usize {
        self.docs.len()
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Add one document; a document longer than the bound keeps its tail.
    /// Separator ids inside it are dropped (they would break document boundaries).
    pub fn add(&mut self, tokens: &[u32]) {
        let mut doc: Vec<u32> = tokens.iter().copied().filter(|&t| t != SEPARATOR).collect();
        if doc.is_empty() {
            return;
        }
        if doc.len() > self.max_tokens {
            doc.drain(..doc.len() - self.max_tokens);
        }
        self.total += doc.len();
        self.docs.push_back(doc);
        while self.total > self.max_tokens {
            if let Some(d) = self.docs.pop_front() {
                self.total -= d.len();
            }
        }
    }

    pub fn ingest<S: TokenSource + ?Sized>(&mut self, src: &S) {
        src.for_each_sequence(&mut |s| self.add(s));
    }

    /// Suffix automaton over all documents, separated by `SEPARATOR`.
    pub fn build_index(&self) -> SuffixAutomaton {
        let mut sam = SuffixAutomaton::new();
        for d in &self.docs {
            sam.extend(d);
            sam.push(SEPARATOR);
        }
        sam
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(24 + 4 * (self.total + self.docs.len()));
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&(self.max_tokens as u64).to_le_bytes());
        b.extend_from_slice(&(self.docs.len() as u64).to_le_bytes());
        for d in &self.docs {
            b.extend_from_slice(&(d.len() as u32).to_le_bytes());
            for &t in d {
                b.extend_from_slice(&t.to_le_bytes());
            }
        }
        let h = graphs::fnv::Fnv1a::hash(&b);
        b.extend_from_slice(&h.to_le_bytes());
        b
    }

    /// Write atomically: a crash leaves either the old or the new file.
    pub fn save(&self, path: &Path) -> Result<(), SpecError> {
        crate::atomic_file::write_replacing(path, &self.encode())
            .map_err(|e| SpecError::Db(format!("writing {}: {e}", path.display())))
    }

    /// Load a saved database; `max_tokens` (if given) re-bounds it.
    pub fn load(path: &Path, max_tokens: Option<usize>) -> Result<Self, SpecError> {
        let bytes = std::fs::read(path)
            .map_err(|e| SpecError::Db(format!("reading {}: {e}", path.display())))?;
        let mut db = Self::decode(&bytes).map_err(|m| {
            SpecError::Db(format!("{}: corrupt token database: {m}", path.display()))
        })?;
        if let Some(m) = max_tokens {
            db.max_tokens = m.max(1);
            while db.total > db.max_tokens {
                if let Some(d) = db.docs.pop_front() {
                    db.total -= d.len();
                }
            }
        }
        Ok(db)
    }

    /// Load if present, else an empty database.
    pub fn open(path: &Path, max_tokens: usize) -> Result<Self, SpecError> {
        if path.exists() {
            Self::load(path, Some(max_tokens))
        } else {
            Ok(Self::new(max_tokens))
        }
    }

    fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() < 32 || &b[..8] != MAGIC {
            return Err("bad magic or truncated header".into());
        }
        let (body, tail) = b.split_at(b.len() - 8);
        let want = u64::from_le_bytes(tail.try_into().map_err(|_| "checksum")?);
        if graphs::fnv::Fnv1a::hash(body) != want {
            return Err("checksum mismatch".into());
        }
        let u64_at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().unwrap_or([0; 8]));
        let max_tokens = u64_at(8) as usize;
        let ndocs = u64_at(16);
        let mut off = 24;
        let mut db = TokenDb::new(max_tokens);
        for _ in 0..ndocs {
            if off + 4 > body.len() {
                return Err("document table truncated".into());
            }
            let n = u32::from_le_bytes(body[off..off + 4].try_into().unwrap_or([0; 4])) as usize;
            off += 4;
            let end = n
                .checked_mul(4)
                .and_then(|l| off.checked_add(l))
                .filter(|&e| e <= body.len())
                .ok_or("document length past end of file")?;
            let doc: Vec<u32> = body[off..end]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            off = end;
            db.total += doc.len();
            db.docs.push_back(doc);
        }
        if off != body.len() {
            return Err("trailing bytes".into());
        }
        Ok(db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_is_a_token_source_of_its_documents_in_order() {
        let mut a = TokenDb::new(100);
        a.add(&[1, 2, 3]);
        a.add(&[4]);
        let mut b = TokenDb::new(100);
        b.add(&[9, 9]);
        let mut merged = TokenDb::new(100);
        merged.ingest(&a);
        merged.ingest(&b);
        let mut seen = Vec::new();
        merged.for_each_sequence(&mut |d| seen.push(d.to_vec()));
        assert_eq!(seen, vec![vec![1, 2, 3], vec![4], vec![9, 9]]);
        assert_eq!(merged.total_tokens(), 6);
    }

    #[test]
    fn bounded_ring_drops_oldest() {
        let mut db = TokenDb::new(10);
        db.add(&[1, 2, 3, 4]);
        db.add(&[5, 6, 7, 8]);
        db.add(&[9, 10, 11]);
        assert_eq!(db.total_tokens(), 7);
        assert_eq!(db.num_docs(), 2);
        db.add(&(0..25).collect::<Vec<u32>>());
        assert_eq!(db.total_tokens(), 10);
        assert_eq!(db.num_docs(), 1);
    }

    #[test]
    fn save_load_roundtrip_and_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.db");
        let mut db = TokenDb::new(100);
        let docs = vec![vec![1u32, 2, 3, 4], vec![7, 8, 1, 2, 9]];
        db.ingest(docs.as_slice());
        db.save(&path).unwrap();
        let back = TokenDb::load(&path, None).unwrap();
        assert_eq!(back.total_tokens(), 9);
        let sam = back.build_index();
        let m = sam.match_query(&[5, 1, 2]);
        assert_eq!(m.len, 2);
        assert_eq!(sam.continuation(sam.first_end(m).unwrap(), 5), &[3, 4]);
        // Grows across restarts.
        let mut again = TokenDb::open(&path, 100).unwrap();
        again.add(&[42, 43]);
        again.save(&path).unwrap();
        assert_eq!(TokenDb::load(&path, None).unwrap().num_docs(), 3);
    }

    #[test]
    fn corrupt_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.db");
        let mut db = TokenDb::new(100);
        db.add(&[1, 2, 3]);
        db.save(&path).unwrap();
        let good = std::fs::read(&path).unwrap();
        for cut in [0, 5, 20, good.len() - 1] {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert!(TokenDb::load(&path, None).is_err(), "cut {cut}");
        }
        let mut flipped = good.clone();
        flipped[30] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        let err = TokenDb::load(&path, None).unwrap_err().to_string();
        assert!(err.contains("corrupt"), "{err}");
        assert!(TokenDb::load(&dir.path().join("missing"), None).is_err());
    }
}
