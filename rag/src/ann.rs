//! Approximate nearest neighbours behind a trait. `HnswIndex` wraps hnsw_rs; deletions are
//! tombstones filtered at query time, and the indexer rebuilds when too many pile up.
//! `FlatIndex` is the exact reference (tests compare HNSW recall against it).
//!
//! Two guarantees on top of hnsw_rs:
//! - Below [`EXACT_SEARCH_BELOW`] live vectors, `HnswIndex::search` scans every stored
//!   vector instead of walking the graph: exact results, whatever the graph looks like
//!   (an HNSW graph can leave a node unreachable among near-duplicates), at a cost measured
//!   by `rag/examples/ann_latency.rs` (BENCHMARKS.md `ann-latency`).
//! - The graph is built deterministically: insertion is serial, in chunk-id order, and
//!   hnsw_rs (>= 0.3.5) draws node levels from a fixed seed, so building from the same
//!   vectors gives the same graph (`hnsw_builds_are_reproducible`).

use anyhow::{Context, Result};
use hnsw_rs::hnswio::HnswIo;
use hnsw_rs::prelude::{AnnT, Distance, Hnsw};
use std::collections::HashSet;
use std::path::Path;
use std::sync::RwLock;

pub trait VectorIndex: Send + Sync {
    fn dim(&self) -> usize;
    /// Insert vectors (L2-normalized) under their chunk ids.
    fn insert(&self, items: &[(i64, Vec<f32>)]);
    /// Mark an id deleted; it is never returned again.
    fn remove(&self, id: i64);
    /// Up to `k` (id, cosine similarity), best first.
    fn search(&self, query: &[f32], k: usize) -> Vec<(i64, f32)>;
    /// Live (inserted and not removed) ids.
    fn ids(&self) -> HashSet<i64>;
    fn tombstones(&self) -> usize;
}

/// 1 - dot, clamped: hnsw_rs's own DistDot asserts on rounding noise for identical vectors.
#[derive(Default, Clone, Copy)]
pub struct CosineDistance;

impl Distance<f32> for CosineDistance {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        (1.0 - dot(a, b)).max(0.0)
    }
}

/// Dot product with 8 independent partial sums (the compiler keeps them in one vector
/// register; a single running sum would serialize every add).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Live vector counts below which search is an exact scan. Chosen from
/// `rag/examples/ann_latency.rs` (dim 384): see BENCHMARKS.md `ann-latency`.
pub const EXACT_SEARCH_BELOW: usize = 4096;

pub struct HnswIndex {
    hnsw: Hnsw<'static, f32, CosineDistance>,
    dim: usize,
    live: RwLock<HashSet<i64>>,
    dead: RwLock<HashSet<i64>>,
    ef_search: usize,
    exact_below: usize,
}

const MAX_CONN: usize = 16;
const EF_CONSTRUCTION: usize = 200;
const MAX_LAYER: usize = 16;

impl HnswIndex {
    pub fn new(dim: usize, capacity: usize) -> Self {
        HnswIndex {
            hnsw: Hnsw::new(
                MAX_CONN,
                capacity.max(1024),
                MAX_LAYER,
                EF_CONSTRUCTION,
                CosineDistance,
            ),
            dim,
            live: RwLock::new(HashSet::new()),
            dead: RwLock::new(HashSet::new()),
            ef_search: 128,
            exact_below: EXACT_SEARCH_BELOW,
        }
    }

    /// Write the graph and data as `<dir>/<basename>.hnsw.{graph,data}` plus the id lists.
    pub fn save(&self, dir: &Path, basename: &str) -> Result<()> {
        let used = self.hnsw.file_dump(dir, basename).context("dumping hnsw")?;
        anyhow::ensure!(used == basename, "hnsw dump chose another name ({used})");
        // Sorted: the same index always writes the same bytes.
        let sorted = |set: &RwLock<HashSet<i64>>| {
            let mut v: Vec<i64> = set
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .copied()
                .collect();
            v.sort_unstable();
            v
        };
        let (live, dead) = (sorted(&self.live), sorted(&self.dead));
        let ids = serde_json::to_vec(&(live, dead))?;
        std::fs::write(dir.join(format!("{basename}.ids.json")), ids)?;
        Ok(())
    }

    pub fn load(dir: &Path, basename: &str, dim: usize) -> Result<Self> {
        let ids = std::fs::read(dir.join(format!("{basename}.ids.json")))?;
        let (live, dead): (Vec<i64>, Vec<i64>) = serde_json::from_slice(&ids)?;
        // hnsw_rs ties the loaded graph's lifetime to the loader; without a memory map the
        // data is copied out, so the loader (a few paths) is leaked once per load.
        let io: &'static mut HnswIo = Box::leak(Box::new(HnswIo::new(dir, basename)));
        let hnsw = io
            .load_hnsw::<f32, CosineDistance>()
            .map_err(|e| anyhow::anyhow!("loading hnsw: {e}"))?;
        Ok(HnswIndex {
            hnsw,
            dim,
            live: RwLock::new(live.into_iter().collect()),
            dead: RwLock::new(dead.into_iter().collect()),
            ef_search: 128,
            exact_below: EXACT_SEARCH_BELOW,
        })
    }

    /// Search with an exact scan below `n` live vectors (default [`EXACT_SEARCH_BELOW`];
    /// 0 always walks the graph).
    pub fn set_exact_search_below(&mut self, n: usize) {
        self.exact_below = n;
    }

    /// Walk the HNSW graph (approximate), whatever the size.
    pub fn search_graph(&self, query: &[f32], k: usize) -> Vec<(i64, f32)> {
        if query.len() != self.dim || k == 0 {
            return Vec::new();
        }
        let dead = self.dead.read().unwrap_or_else(|e| e.into_inner());
        let fetch = k + dead.len().min(4 * k);
        let ef = self.ef_search.max(2 * fetch);
        let mut out: Vec<(i64, f32)> = self
            .hnsw
            .search(query, fetch, ef)
            .into_iter()
            .map(|n| (n.d_id as i64, 1.0 - n.distance))
            .filter(|(id, _)| !dead.contains(id))
            .collect();
        out.truncate(k);
        out
    }

    /// Score every stored live vector: exact top-k, ties broken by id.
    pub fn search_exact(&self, query: &[f32], k: usize) -> Vec<(i64, f32)> {
        if query.len() != self.dim || k == 0 {
            return Vec::new();
        }
        // Held for the whole scan: no insert runs meanwhile (insert holds it for writing),
        // so hnsw_rs's point iterator never waits on its own writer.
        let live = self.live.read().unwrap_or_else(|e| e.into_inner());
        if self.hnsw.get_nb_point() == 0 {
            return Vec::new(); // hnsw_rs's point iterator needs an entry point
        }
        // Every stored point is live or a tombstone (usually none).
        let dead = self.dead.read().unwrap_or_else(|e| e.into_inner());
        let mut scored: Vec<(i64, f32)> = Vec::with_capacity(live.len());
        for p in self.hnsw.get_point_indexation() {
            let id = p.get_origin_id() as i64;
            if !dead.contains(&id) {
                scored.push((id, dot(query, p.get_v())));
            }
        }
        top_k(scored, k)
    }

    pub fn remove_files(dir: &Path, basename: &str) {
        for ext in ["hnsw.graph", "hnsw.data", "ids.json"] {
            let _ = std::fs::remove_file(dir.join(format!("{basename}.{ext}")));
        }
    }
}

impl VectorIndex for HnswIndex {
    fn dim(&self) -> usize {
        self.dim
    }

    fn insert(&self, items: &[(i64, Vec<f32>)]) {
        let mut live = self.live.write().unwrap_or_else(|e| e.into_inner());
        let mut fresh: Vec<(&[f32], usize)> = items
            .iter()
            .filter(|(id, v)| v.len() == self.dim && live.insert(*id))
            .map(|(id, v)| (v.as_slice(), *id as usize))
            .collect();
        // Ids are never reused (AUTOINCREMENT), so a re-insert after removal cannot happen;
        // if it did, the id stays dead.
        // Serial and in id order: parallel insertion makes the graph depend on thread timing.
        fresh.sort_by_key(|&(_, id)| id);
        for item in fresh {
            self.hnsw.insert_slice(item);
        }
    }

    fn remove(&self, id: i64) {
        if self
            .live
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
        {
            self.dead
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id);
        }
    }

    fn search(&self, query: &[f32], k: usize) -> Vec<(i64, f32)> {
        let n = self.live.read().unwrap_or_else(|e| e.into_inner()).len();
        if n < self.exact_below {
            self.search_exact(query, k)
        } else {
            self.search_graph(query, k)
        }
    }

    fn ids(&self) -> HashSet<i64> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn tombstones(&self) -> usize {
        self.dead.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Best `k` by score, ties by id (a total order: the same scores give the same list).
fn top_k(mut scored: Vec<(i64, f32)>, k: usize) -> Vec<(i64, f32)> {
    let order = |a: &(i64, f32), b: &(i64, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if scored.len() > k && k > 0 {
        scored.select_nth_unstable_by(k - 1, order);
        scored.truncate(k);
    }
    scored.sort_by(order);
    scored.truncate(k);
    scored
}

/// Exact search by scanning every vector.
pub struct FlatIndex {
    dim: usize,
    rows: RwLock<Vec<(i64, Vec<f32>)>>,
}

impl FlatIndex {
    pub fn new(dim: usize) -> Self {
        FlatIndex {
            dim,
            rows: RwLock::new(Vec::new()),
        }
    }
}

impl VectorIndex for FlatIndex {
    fn dim(&self) -> usize {
        self.dim
    }
    fn insert(&self, items: &[(i64, Vec<f32>)]) {
        let mut rows = self.rows.write().unwrap_or_else(|e| e.into_inner());
        rows.extend(items.iter().filter(|(_, v)| v.len() == self.dim).cloned());
    }
    fn remove(&self, id: i64) {
        self.rows
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(i, _)| *i != id);
    }
    fn search(&self, query: &[f32], k: usize) -> Vec<(i64, f32)> {
        let rows = self.rows.read().unwrap_or_else(|e| e.into_inner());
        top_k(rows.iter().map(|(id, v)| (*id, dot(query, v))).collect(), k)
    }
    fn ids(&self) -> HashSet<i64> {
        self.rows
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(i, _)| *i)
            .collect()
    }
    fn tombstones(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vecs(n: usize, dim: usize, seed: u64) -> Vec<(i64, Vec<f32>)> {
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 10_000) as f32 / 5_000.0 - 1.0
        };
        (0..n)
            .map(|i| {
                let mut v: Vec<f32> = (0..dim).map(|_| next()).collect();
                let n = dot(&v, &v).sqrt();
                v.iter_mut().for_each(|x| *x /= n);
                (i as i64 + 1, v)
            })
            .collect()
    }

    #[test]
    fn dot_matches_an_f64_reference() {
        for (n, seed) in [(0, 1), (1, 2), (7, 3), (8, 4), (13, 5), (384, 6), (385, 7)] {
            let a = rand_vecs(1, n.max(1), seed)[0].1[..n].to_vec();
            let b = rand_vecs(1, n.max(1), seed + 100)[0].1[..n].to_vec();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-5, "n={n}");
        }
    }

    #[test]
    fn hnsw_matches_exact_search_and_honours_tombstones() {
        let data = rand_vecs(2000, 32, 7);
        let mut h = HnswIndex::new(32, 2000);
        h.set_exact_search_below(0); // test the graph itself
        let f = FlatIndex::new(32);
        h.insert(&data);
        f.insert(&data);
        let queries = rand_vecs(50, 32, 99);
        let mut hits = 0;
        for (_, q) in &queries {
            let exact: HashSet<i64> = f.search(q, 10).into_iter().map(|x| x.0).collect();
            hits += h
                .search(q, 10)
                .iter()
                .filter(|x| exact.contains(&x.0))
                .count();
        }
        let recall = hits as f64 / (50.0 * 10.0);
        assert!(recall > 0.9, "hnsw recall@10 vs exact = {recall}");
        // A vector finds itself; after removal it never comes back.
        let (id, v) = &data[123];
        assert_eq!(h.search(v, 1)[0].0, *id);
        h.remove(*id);
        assert!(h.search(v, 20).iter().all(|x| x.0 != *id));
        assert_eq!(h.tombstones(), 1);
        assert_eq!(h.ids().len(), 1999);
    }

    #[test]
    fn hnsw_save_and_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let data = rand_vecs(300, 16, 3);
        let h = HnswIndex::new(16, 300);
        h.insert(&data);
        h.remove(5);
        h.save(dir.path(), "t").unwrap();
        let g = HnswIndex::load(dir.path(), "t", 16).unwrap();
        assert_eq!(g.ids(), h.ids());
        for (id, v) in data.iter().skip(10).take(20) {
            assert_eq!(g.search(v, 1)[0].0, *id);
        }
        assert!(g.search(&data[4].1, 10).iter().all(|x| x.0 != 5));
    }

    /// Near-duplicates like the crash test's title chunks: 20 vectors that differ in one
    /// small component. Below the threshold every one is found first by its own vector,
    /// exactly as the flat reference finds it, tombstones included.
    #[test]
    fn small_indexes_search_exactly() {
        let base = rand_vecs(1, 64, 11)[0].1.clone();
        let mut data = rand_vecs(500, 64, 12);
        for i in 0..20 {
            let mut v = base.clone();
            v[i] += 0.01;
            let n = dot(&v, &v).sqrt();
            v.iter_mut().for_each(|x| *x /= n);
            data.push((1000 + i as i64, v));
        }
        let h = HnswIndex::new(64, data.len());
        let f = FlatIndex::new(64);
        h.insert(&data);
        f.insert(&data);
        h.remove(1003);
        f.remove(1003);
        for (id, v) in &data {
            let got = h.search(v, 5);
            assert_eq!(got, f.search(v, 5), "id {id}");
            if *id != 1003 {
                assert_eq!(got[0].0, *id);
            }
        }
        assert!(HnswIndex::new(64, 1).search(&base, 5).is_empty());
    }

    /// Two graphs built from the same vectors (given in a different order) are the same
    /// graph: every approximate search returns the same list.
    #[test]
    fn hnsw_builds_are_reproducible() {
        let data = rand_vecs(3000, 32, 21);
        let build = |items: &[(i64, Vec<f32>)]| {
            let mut h = HnswIndex::new(32, items.len());
            h.set_exact_search_below(0);
            for batch in items.chunks(700) {
                h.insert(batch);
            }
            h
        };
        let a = build(&data);
        // Same batches by id, other order inside each call: insert sorts by id.
        let mut b_items: Vec<(i64, Vec<f32>)> = Vec::new();
        for batch in data.chunks(700) {
            let mut b = batch.to_vec();
            b.reverse();
            b_items.extend(b);
        }
        let b = build(&b_items);
        for (_, q) in rand_vecs(100, 32, 77) {
            assert_eq!(a.search(&q, 10), b.search(&q, 10));
        }
        let dir = tempfile::tempdir().unwrap();
        a.save(dir.path(), "a").unwrap();
        b.save(dir.path(), "b").unwrap();
        for ext in ["hnsw.graph", "hnsw.data", "ids.json"] {
            let fa = std::fs::read(dir.path().join(format!("a.{ext}"))).unwrap();
            let fb = std::fs::read(dir.path().join(format!("b.{ext}"))).unwrap();
            assert!(fa == fb, "{ext} dumps differ");
        }
    }
}
