//! Fusing the BM25 and dense rankings.

/// One fused candidate; ranks are 1-based positions in each input list.
#[derive(Debug, Clone, PartialEq)]
pub struct Fused {
    pub id: i64,
    pub score: f32,
    pub bm25_rank: Option<usize>,
    pub dense_rank: Option<usize>,
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
                out.push(Fused { id: *id, score: 0.0, bm25_rank: None, dense_rank: None });
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
    let best = |f: &Fused| f.bm25_rank.unwrap_or(usize::MAX).min(f.dense_rank.unwrap_or(usize::MAX));
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(best(a).cmp(&best(b))).then(a.id.cmp(&b.id)));
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
    fn one_empty_list_keeps_the_other_order() {
        let bm25 = [(5, 3.0), (6, 2.0), (7, 1.0)];
        let ids: Vec<i64> = rrf(&bm25, &[], RRF_K).iter().map(|x| x.id).collect();
        assert_eq!(ids, vec![5, 6, 7]);
    }
}
