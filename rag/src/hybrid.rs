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
    /// Weighted reciprocal rank fusion whose two weights come from the lists themselves
    /// (see [`adaptive`]).
    Adaptive(Adaptive),
}

/// Parameters of [`adaptive`] fusion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adaptive {
    /// RRF constant.
    pub k: f32,
    /// A list's confidence is how far its score falls from rank 1 to rank `depth`.
    pub depth: usize,
    /// Neither list's weight goes below this (nor above 1 minus it).
    pub min_weight: f32,
}

/// The adaptive fusion's parameters, chosen on `bench/retrieval/tuning.jsonl` only, in a
/// plateau (depth 3 to 10, k 20 to 60, min_weight 0 to 0.2 all beat every fixed fusion
/// there). min_weight 0 and 0.1 tie there and on every evaluation set; 0 is kept because
/// with RRF even a 0.1 weight lets a list that has no standout head reorder the other's
/// top (rag/tests/fusion.rs). docs/retrieval.md has the search and the results.
pub const ADAPTIVE: Adaptive = Adaptive {
    k: 60.0,
    depth: 5,
    min_weight: 0.0,
};

impl Fusion {
    pub fn name(&self) -> String {
        match self {
            Fusion::Rrf { k } => format!("RRF k={k}"),
            Fusion::Convex { alpha } => format!("convex a={alpha}"),
            Fusion::Adaptive(a) => format!(
                "adaptive RRF k={} depth={} min weight={}",
                a.k, a.depth, a.min_weight
            ),
        }
    }
}

pub fn fuse(bm25: &[(i64, f32)], dense: &[(i64, f32)], how: Fusion) -> Vec<Fused> {
    match how {
        Fusion::Rrf { k } => rrf(bm25, dense, k),
        Fusion::Convex { alpha } => convex(bm25, dense, alpha),
        Fusion::Adaptive(a) => adaptive(bm25, dense, a),
    }
}

/// How far a list's score falls from rank 1 to rank `depth`, relative to the top score:
/// a head that stands out from the rest is a list sure of its answer. A list shorter than
/// `depth` gives 0: too few hits to tell a standout from a handful of weak matches (in a
/// small corpus, BM25 matching one common word of the question).
pub fn head_drop(list: &[(i64, f32)], depth: usize) -> f32 {
    let (Some(&(_, top)), Some(&(_, at_depth))) = (list.first(), list.get(depth.max(1) - 1)) else {
        return 0.0;
    };
    if top == 0.0 || !top.is_finite() || !at_depth.is_finite() {
        return 0.0;
    }
    ((top - at_depth) / top.abs()).max(0.0)
}

/// BM25's weight for [`adaptive`] fusion (dense gets 1 minus it): each list's share of
/// the two head drops, so the list whose head stands out more leads; equal drops (or two
/// flat lists) give 0.5, and a list with no drop at all gets no say. Clamped to
/// `[min_weight, 1 - min_weight]`.
pub fn adaptive_bm25_weight(bm25: &[(i64, f32)], dense: &[(i64, f32)], p: Adaptive) -> f32 {
    let b = head_drop(bm25, p.depth);
    let d = head_drop(dense, p.depth);
    let w = if b + d > 0.0 { b / (b + d) } else { 0.5 };
    let lo = p.min_weight.clamp(0.0, 0.5);
    w.clamp(lo, 1.0 - lo)
}

/// Weighted reciprocal rank fusion: score = w / (k + bm25 rank) + (1 - w) / (k + dense
/// rank), with w from [`adaptive_bm25_weight`]. When one list is empty the other's order
/// is returned; when both lists rank the same ids in the same order, so is that order.
pub fn adaptive(bm25: &[(i64, f32)], dense: &[(i64, f32)], p: Adaptive) -> Vec<Fused> {
    if bm25.is_empty() || dense.is_empty() {
        return rrf(bm25, dense, p.k);
    }
    weighted_rrf(bm25, dense, adaptive_bm25_weight(bm25, dense, p), p.k)
}

/// Reciprocal rank fusion with BM25 weight `w` and dense weight `1 - w`. With `w = 1`
/// the order is BM25's, and chunks only dense search found follow it in dense order.
pub fn weighted_rrf(bm25: &[(i64, f32)], dense: &[(i64, f32)], w: f32, k: f32) -> Vec<Fused> {
    let mut out = rrf(bm25, dense, k);
    for f in &mut out {
        let b = f.bm25_rank.map_or(0.0, |r| w / (k + r as f32));
        let d = f.dense_rank.map_or(0.0, |r| (1.0 - w) / (k + r as f32));
        f.score = b + d;
    }
    sort_fused(&mut out);
    out
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

    fn ids(f: &[Fused]) -> Vec<i64> {
        f.iter().map(|x| x.id).collect()
    }

    #[test]
    fn adaptive_equals_both_lists_when_they_agree() {
        let bm25 = [
            (1, 30.0),
            (2, 12.0),
            (3, 11.0),
            (4, 10.5),
            (5, 10.0),
            (6, 9.0),
        ];
        let dense = [
            (1, 0.61),
            (2, 0.60),
            (3, 0.59),
            (4, 0.58),
            (5, 0.57),
            (6, 0.5),
        ];
        let f = adaptive(&bm25, &dense, ADAPTIVE);
        assert_eq!(ids(&f), vec![1, 2, 3, 4, 5, 6]);
        // Equal ranks in both lists: the weights sum to 1, so the score is plain 1/(k+r).
        assert!((f[0].score - 1.0 / 61.0).abs() < 1e-7);
        assert_eq!((f[2].bm25_rank, f[2].dense_rank), (Some(3), Some(3)));
    }

    #[test]
    fn adaptive_with_one_empty_list_returns_the_other() {
        let list = [(7, 0.9), (8, 0.8), (9, 0.1)];
        assert_eq!(ids(&adaptive(&list, &[], ADAPTIVE)), vec![7, 8, 9]);
        assert_eq!(ids(&adaptive(&[], &list, ADAPTIVE)), vec![7, 8, 9]);
        assert!(adaptive(&[], &[], ADAPTIVE).is_empty());
        let f = adaptive(&[], &list, ADAPTIVE);
        assert!(f
            .iter()
            .all(|x| x.bm25_rank.is_none() && x.dense_rank.is_some()));
    }

    type List5 = [(i64, f32); 5];

    /// BM25 with one standout hit, dense flat.
    fn peaked_bm25_flat_dense() -> (List5, List5) {
        (
            [(1, 40.0), (2, 12.0), (3, 11.0), (4, 10.0), (5, 9.0)],
            [(5, 0.52), (4, 0.515), (3, 0.51), (2, 0.505), (1, 0.50)],
        )
    }

    #[test]
    fn the_list_whose_head_stands_out_leads() {
        let (b, d) = peaked_bm25_flat_dense();
        let w = adaptive_bm25_weight(&b, &d, ADAPTIVE);
        assert!(w > 0.9, "{w}");
        assert_eq!(adaptive(&b, &d, ADAPTIVE)[0].id, 1);
        // Swap roles: a flat BM25 list and a dense list with a clear winner.
        let b2 = [(5, 10.0), (4, 9.9), (3, 9.8), (2, 9.7), (1, 9.6)];
        let d2 = [(1, 0.9), (2, 0.5), (3, 0.45), (4, 0.4), (5, 0.35)];
        let w2 = adaptive_bm25_weight(&b2, &d2, ADAPTIVE);
        assert!(w2 < 0.1, "{w2}");
        assert_eq!(adaptive(&b2, &d2, ADAPTIVE)[0].id, 1);
        // Plain RRF cannot tell these apart: both lists' firsts tie.
        assert_eq!(rrf(&b2, &d2, RRF_K)[0].score, rrf(&b2, &d2, RRF_K)[1].score);
    }

    #[test]
    fn weights_are_clamped_and_flat_lists_weigh_equally() {
        let (b, _) = peaked_bm25_flat_dense();
        let flat = [(9, 0.5), (8, 0.5), (7, 0.5), (6, 0.5), (5, 0.5)];
        // Dense has no drop at all: BM25 gets everything, and the fused order is BM25's.
        assert_eq!(adaptive_bm25_weight(&b, &flat, ADAPTIVE), 1.0);
        assert_eq!(adaptive_bm25_weight(&flat, &b, ADAPTIVE), 0.0);
        assert_eq!(
            ids(&adaptive(&b, &flat, ADAPTIVE)),
            vec![1, 2, 3, 4, 5, 9, 8, 7, 6]
        );
        assert!((adaptive_bm25_weight(&flat, &flat, ADAPTIVE) - 0.5).abs() < 1e-6);
        // A BM25 list shorter than `depth` has no say against a full dense list.
        let few = [(9, 30.0), (1, 2.0)];
        assert_eq!(adaptive_bm25_weight(&few, &b, ADAPTIVE), 0.0);
        assert_eq!(ids(&adaptive(&few, &b, ADAPTIVE)), vec![1, 2, 3, 4, 5, 9]);
        let clamped = Adaptive {
            min_weight: 0.1,
            ..ADAPTIVE
        };
        assert!((adaptive_bm25_weight(&b, &flat, clamped) - 0.9).abs() < 1e-6);
        assert!((adaptive_bm25_weight(&flat, &b, clamped) - 0.1).abs() < 1e-6);
    }

    #[test]
    fn head_drop_handles_short_zero_and_non_finite_lists() {
        assert_eq!(head_drop(&[], 5), 0.0);
        // Fewer than `depth` hits: no evidence of a standout head.
        assert_eq!(head_drop(&[(1, 4.0), (2, 3.0)], 5), 0.0);
        assert_eq!(head_drop(&[(1, 0.0), (2, 0.0)], 2), 0.0);
        assert_eq!(head_drop(&[(1, f32::NAN), (2, 1.0)], 2), 0.0);
        assert!((head_drop(&[(1, 10.0), (2, 8.0), (3, 5.0)], 3) - 0.5).abs() < 1e-6);
        assert!((head_drop(&[(1, 10.0), (2, 8.0), (3, 5.0)], 2) - 0.2).abs() < 1e-6);
    }

    #[test]
    fn fuse_dispatches_to_adaptive() {
        let (b, d) = peaked_bm25_flat_dense();
        assert_eq!(
            fuse(&b, &d, Fusion::Adaptive(ADAPTIVE)),
            adaptive(&b, &d, ADAPTIVE)
        );
        assert!(Fusion::Adaptive(ADAPTIVE).name().starts_with("adaptive"));
    }
}
