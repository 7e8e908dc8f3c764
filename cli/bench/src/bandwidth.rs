//! The machine's memory read bandwidth, as the best of several read patterns: the ceiling
//! a decode step's bytes are measured against (`rag-bench vs-llamacpp`).
//!
//! One pattern under-reads on some hosts (a single 512 MiB sum read 42 GB/s minutes before
//! the 1.5B decoded at ~54 GB/s of weights), so the probe tries every thread count up to
//! the run's, one or two interleaved streams per thread, and 4 KiB or transparent huge
//! pages, each the best of three passes over 1 GiB (far beyond any last-level cache).

use memmap2::{Advice, MmapMut};
use std::time::Instant;

const BYTES: usize = 1 << 30;
const PASSES: usize = 3;

/// One read pattern and what it reached.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub gbs: f64,
    pub threads: usize,
    pub streams: usize,
    pub huge_pages: bool,
}

impl Reading {
    pub fn describe(&self) -> String {
        format!(
            "{} thread(s), {} stream(s) each, {} pages",
            self.threads,
            self.streams,
            if self.huge_pages { "huge" } else { "4 KiB" }
        )
    }
}

/// The best pattern over `1..=threads` threads.
pub fn best_read(threads: usize) -> Reading {
    let mut best = Reading {
        gbs: 0.0,
        threads: 1,
        streams: 1,
        huge_pages: false,
    };
    for huge_pages in [false, true] {
        let Some(buf) = buffer(huge_pages) else {
            continue;
        };
        for t in 1..=threads.max(1) {
            for streams in [1, 2] {
                let gbs = read_gbs(&buf, t, streams);
                if gbs > best.gbs {
                    best = Reading {
                        gbs,
                        threads: t,
                        streams,
                        huge_pages,
                    };
                }
            }
        }
    }
    best
}

/// A touched 1 GiB anonymous mapping (huge pages advised when asked; `None` if the
/// mapping fails).
fn buffer(huge_pages: bool) -> Option<MmapMut> {
    let mut m = MmapMut::map_anon(BYTES).ok()?;
    if huge_pages && m.advise(Advice::HugePage).is_err() {
        return None;
    }
    // Touch every page with non-zero data so reads hit memory, not the shared zero page.
    for (i, chunk) in m.chunks_mut(4096).enumerate() {
        chunk.fill(i as u8 | 1);
    }
    Some(m)
}

/// GB/s of one pass over `bytes` split over `threads` threads, each reading `streams`
/// interleaved sequential streams of its share; best of [`PASSES`].
fn read_gbs(bytes: &[u8], threads: usize, streams: usize) -> f64 {
    let share = bytes.len().div_ceil(threads).next_multiple_of(64 * streams);
    let mut best = 0.0f64;
    for _ in 0..PASSES {
        let t = Instant::now();
        let total: u64 = std::thread::scope(|sc| {
            let handles: Vec<_> = bytes
                .chunks(share)
                .map(|c| sc.spawn(move || sum_streams(c, streams)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        std::hint::black_box(total);
        best = best.max(bytes.len() as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// Sums `c` as 64-byte lines, reading `streams` equal parts of it side by side (line i of
/// every part, then line i + 1, ...), so the prefetchers see that many sequential streams.
fn sum_streams(c: &[u8], streams: usize) -> u64 {
    let part = (c.len() / 64 / streams) * 64;
    let mut acc = [0u64; 8];
    if part > 0 {
        let parts: Vec<&[u8]> = (0..streams).map(|s| &c[s * part..(s + 1) * part]).collect();
        for line in (0..part).step_by(64) {
            for p in &parts {
                add_line(&mut acc, &p[line..line + 64]);
            }
        }
    }
    // The bytes past the whole lines of every part (a few at most).
    let tail = c[part * streams..]
        .iter()
        .fold(0u64, |a, &b| a.wrapping_add(u64::from(b)));
    acc.iter().fold(tail, |a, x| a.wrapping_add(*x))
}

/// Adds one 64-byte line into eight independent accumulators (bound by loads, not by an
/// add chain).
#[inline(always)]
fn add_line(acc: &mut [u64; 8], line: &[u8]) {
    for (a, w) in acc.iter_mut().zip(line.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        *a = a.wrapping_add(u64::from_ne_bytes(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain_sum(c: &[u8]) -> u64 {
        let mut s = 0u64;
        let mut it = c.chunks_exact(8);
        for w in &mut it {
            s = s.wrapping_add(u64::from_ne_bytes(w.try_into().unwrap()));
        }
        it.remainder()
            .iter()
            .fold(s, |a, &b| a.wrapping_add(u64::from(b)))
    }

    #[test]
    fn every_stream_count_reads_every_byte_once() {
        // 36 lines: whole lines per stream for 1 to 4 streams.
        let bytes: Vec<u8> = (0..64 * 36).map(|i| (i * 7 + 3) as u8).collect();
        let want = plain_sum(&bytes);
        for streams in 1..=4 {
            assert_eq!(sum_streams(&bytes, streams), want, "{streams} streams");
        }
        // Lengths that are not whole lines per stream: the remainder is read once, as bytes.
        let odd = &bytes[..64 * 5];
        let tail_as_bytes = |c: &[u8], whole: usize| {
            let lines: u64 = plain_sum(&c[..whole]);
            c[whole..]
                .iter()
                .fold(lines, |a, &b| a.wrapping_add(u64::from(b)))
        };
        assert_eq!(sum_streams(odd, 2), tail_as_bytes(odd, 64 * 4));
        assert_eq!(sum_streams(&bytes[..10], 1), tail_as_bytes(&bytes[..10], 0));
    }
}
