//! Fusing the BM25 and dense rankings.

/// One fused candidate; ranks are 1-based positions in each input list.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    pub id: i64,
    pub score: f32,
    pub bm25_rank: Option<usize>,
    pub dense_rank: Option<usize>,
}

/// How BM25 and dense rankings are combined.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fusion {
    /// Reciprocal rank fusion with constant `k`.
    Rrf { k: f32 },
    /// `alpha * bm25 + (1 - alpha) * dense` on min-max normalised scores (0 when absent).
    Convex { alpha: f32 },
}

impl Fusion {
    pub fn name(&self) -> String {
        match self {
            Fusion::Rrf { k } => format!("RRF k={k}"),
            Fusion::Convex { alpha } => format!("convex a={alpha}"),
        }
    }
}

pub fn fuse(bm25: &[(i64, f32)], dense: &[(i64, f32)], how: Fusion) -> Vec<Fused> {
    match how {
        Fusion::Rrf { k } => rrf(bm25, dense, k),
        Fusion::Convex { alpha } => convex(bm25, dense, alpha),
    }
}

fn min_max(list: &[(i64, f32)]) -> impl Fn(f32) -> f32 {
    let lo = list.iter().map(|x| x.1).fold(f32::INFINITY, f32::min);
    let hi = list.iter().map(|x| x.1).fold(f32::NEG_INFINITY, f32::max);
    move |s| if hi > lo { (s - lo) / (hi - lo) } else { 1.0 }
}

/// Convex combination of min-max normalised scores over each list's candidates.
pub fn convex(bm25: &[(i64, f32)], dense: &[(i64, f32)], alpha: f32) -> Vec<Fused> {
    let nb = min_max(bm25);
    let nd = min_max(dense);
    let mut out = rrf(bm25, dense, RRF_K);
    for f in &mut out {
        let b = f.bm25_rank.map(|r| nb(bm25[r - 1].1)).unwrap_or(0.0);
        let d = f.dense_rank.map(|r| nd(dense[r - 1].1)).unwrap_or(0.0);
        f.score = alpha * b + (1.0 - alpha) * d;
    }
    sort_fused(&mut out);
    out
}

/// Best score first; ties break by the better single rank, then by id (deterministic).
fn sort_fused(out: &mut [Fused]) {
    let best = |f: &Fused| {
        f.bm25_rank
            .unwrap_or(usize::MAX)
            .min(f.dense_rank.unwrap_or(usize::MAX))
    };
    out.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(best(a).cmp(&best(b)))
            .then(a.id.cmp(&b.id))
    });
}

/// Default RRF constant (Cormack et al.): damps the head so one list cannot dominate.
pub const RRF_K: f32 = 60.0;

/// Reciprocal rank fusion: score = sum over lists of 1 / (k + rank). Ties break by the
/// better single rank, then by id, so results are deterministic.
pub fn rrf(bm25: &[(i64, f32)], dense: &[(i64, f32)], k: f32) -> Vec<Fused> {
    let mut out: Vec<Fused> = Vec::with_capacity(bm25.len() + dense.len());
    let mut pos = std::collections::HashMap::new();
    for (list, is_bm25) in [(bm25, true), (dense, false)] {
        for (i, (id, _)) in list.iter().enumerate() {
            let rank = i + 1;
            let idx = *pos.entry(*id).or_insert_with(|| {
                out.push(Fused {
                    id: *id,
                    score: 0.0,
                    bm25_rank: None,
                    dense_rank: None,
                });
                out.len() - 1
            });
            let f = &mut out[idx];
            if is_bm25 {
                if f.bm25_rank.is_some() {
                    continue; // duplicate id in one list: keep its best rank
                }
                f.bm25_rank = Some(rank);
            } else {
                if f.dense_rank.is_some() {
                    continue;
                }
                f.dense_rank = Some(rank);
            }
            f.score += 1.0 / (k + rank as f32);
        }
    }
    sort_fused(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_wins_and_ranks_are_kept() {
        let bm25 = [(1, 9.0), (2, 5.0), (3, 1.0)];
        let dense = [(2, 0.9), (3, 0.8), (4, 0.1)];
        let f = rrf(&bm25, &dense, RRF_K);
        assert_eq!(f[0].id, 2); // found by both lists beats first in one
        assert_eq!(f[0].bm25_rank, Some(2));
        assert_eq!(f[0].dense_rank, Some(1));
        let ids: Vec<i64> = f.iter().map(|x| x.id).collect();
        assert_eq!(ids, vec![2, 3, 1, 4]);
        assert_eq!(f[3].bm25_rank, None);
        let expected = 1.0 / 62.0 + 1.0 / 61.0;
        assert!((f[0].score - expected).abs() < 1e-7);
    }

    #[test]
    fn convex_normalises_and_weights() {
        let bm25 = [(1, 20.0), (2, 10.0), (3, 0.0)];
        let dense = [(3, 0.9), (2, 0.5), (4, 0.1)];
        let f = convex(&bm25, &dense, 0.5);
        // 1: 0.5*1 + 0 = 0.5; 2: 0.5*0.5 + 0.5*0.5 = 0.5; 3: 0 + 0.5*1 = 0.5; 4: 0.
        assert!(f[..3].iter().all(|x| (x.score - 0.5).abs() < 1e-6));
        assert_eq!(f[3].id, 4);
        assert_eq!(convex(&bm25, &dense, 1.0)[0].id, 1);
        assert_eq!(convex(&bm25, &dense, 0.0)[0].id, 3);
    }

    #[test]
    fn one_empty_list_keeps_the_other_order() {
        let bm25 = [(5, 3.0), (6, 2.0), (7, 1.0)];
        let ids: Vec<i64> = rrf(&bm25, &[], RRF_K).iter().map(|x| x.id).collect();
        assert_eq!(ids, vec![5, 6, 7]);
    }
}
