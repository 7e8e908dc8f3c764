//! Approximate nearest neighbours behind a trait. `HnswIndex` wraps hnsw_rs; deletions are
//! tombstones filtered at query time, and the indexer rebuilds when too many pile up.
//! `FlatIndex` is the exact reference (tests compare HNSW recall against it).

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

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

pub struct HnswIndex {
    hnsw: Hnsw<'static, f32, CosineDistance>,
    dim: usize,
    live: RwLock<HashSet<i64>>,
    dead: RwLock<HashSet<i64>>,
    ef_search: usize,
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
        }
    }

    /// Write the graph and data as `<dir>/<basename>.hnsw.{graph,data}` plus the id lists.
    pub fn save(&self, dir: &Path, basename: &str) -> Result<()> {
        let used = self.hnsw.file_dump(dir, basename).context("dumping hnsw")?;
        anyhow::ensure!(used == basename, "hnsw dump chose another name ({used})");
        let live: Vec<i64> = self
            .live
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        let dead: Vec<i64> = self
            .dead
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
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
        })
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
        let fresh: Vec<(&[f32], usize)> = items
            .iter()
            .filter(|(id, v)| v.len() == self.dim && live.insert(*id))
            .map(|(id, v)| (v.as_slice(), *id as usize))
            .collect();
        // Ids are never reused (AUTOINCREMENT), so a re-insert after removal cannot happen;
        // if it did, the id stays dead.
        if !fresh.is_empty() {
            self.hnsw.parallel_insert_slice(&fresh);
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

    fn ids(&self) -> HashSet<i64> {
        self.live.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn tombstones(&self) -> usize {
        self.dead.read().unwrap_or_else(|e| e.into_inner()).len()
    }
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
        let mut scored: Vec<(i64, f32)> = rows.iter().map(|(id, v)| (*id, dot(query, v))).collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.truncate(k);
        scored
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
    fn hnsw_matches_exact_search_and_honours_tombstones() {
        let data = rand_vecs(2000, 32, 7);
        let h = HnswIndex::new(32, 2000);
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
}
