//! The checksum of a cache file's data part: XXH3-64 of each [`CHUNK`]-byte piece (the last
//! may be shorter), then XXH3-64 of the data's length and those hashes in order.
//!
//! The pieces depend only on the bytes, so the value is the same whether the pieces are
//! hashed on one thread ([`Streaming`], while a cache is written) or on a loader's whole
//! thread pool ([`data_checksum`], before a cache is used). [`CHUNK`] is part of the file
//! format: changing it needs a new format version.

use crate::kernels::ThreadPool;
use std::hash::Hasher;
use twox_hash::XxHash3_64;

/// Bytes per independently hashed piece: small enough to spread a model's data over the
/// pool's threads evenly (a 0.5 GB file is ~500 pieces), large enough that the per-piece
/// work is noise.
pub const CHUNK: usize = 1 << 20;

/// The checksum of `data`, its pieces hashed across `pool`.
pub fn data_checksum(data: &[u8], pool: &ThreadPool) -> u64 {
    let mut sums = vec![0u64; data.len().div_ceil(CHUNK)];
    pool.for_each_chunk_mut(&mut sums, 1, &|i, sum| {
        let piece = &data[i * CHUNK..data.len().min((i + 1) * CHUNK)];
        sum[0] = XxHash3_64::oneshot(piece);
    });
    combine(data.len() as u64, &sums)
}

fn combine(len: u64, sums: &[u64]) -> u64 {
    let mut b = Vec::with_capacity(8 * (sums.len() + 1));
    b.extend_from_slice(&len.to_le_bytes());
    sums.iter()
        .for_each(|s| b.extend_from_slice(&s.to_le_bytes()));
    XxHash3_64::oneshot(&b)
}

/// [`data_checksum`] of bytes that arrive in order, in pieces of any size.
#[derive(Default)]
pub struct Streaming {
    piece: XxHash3_64,
    filled: usize,
    len: u64,
    sums: Vec<u64>,
}

impl Streaming {
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = (CHUNK - self.filled).min(bytes.len());
            self.piece.write(&bytes[..take]);
            self.filled += take;
            self.len += take as u64;
            bytes = &bytes[take..];
            if self.filled == CHUNK {
                self.close_piece();
            }
        }
    }

    pub fn finish(mut self) -> u64 {
        if self.filled > 0 {
            self.close_piece();
        }
        combine(self.len, &self.sums)
    }

    fn close_piece(&mut self) {
        self.sums.push(self.piece.finish());
        self.piece = XxHash3_64::default();
        self.filled = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces are XXH3-64 as specified (its reference value for no input), so a
    /// dependency update that changed the hash would show here, not as rebuilt caches.
    #[test]
    fn pieces_are_xxh3_64() {
        assert_eq!(XxHash3_64::oneshot(b""), 0x2D06_8005_38D3_94C2);
        let mut s = XxHash3_64::default();
        let b: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        s.write(&b[..1234]);
        s.write(&b[1234..]);
        assert_eq!(s.finish(), XxHash3_64::oneshot(&b));
    }
}
