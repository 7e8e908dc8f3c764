//! Draft extension with rejected tokens (BRIEF 4.3, Eq. 3).
//!
//! After a verification, the rejected part of a draft branch is not thrown away
//! blindly: the longest run of it on which the draft agreed with the model's own
//! argmax (given the draft prefix) is kept and offered again as extra branches in
//! the following steps, until its lifetime runs out.

/// Eq. 3 on one linear draft. `x = [T, x1..xn]` (T the last accepted token) and
/// `y = [y1..y(n+1)]` with `y[i]` the model's argmax after `x[..=i]`.
/// Returns `(e, g_start, g_end)`, 1-based indices into x: `e` the first mismatch
/// and `[g_start, g_end]` the longest run after e with `x_i == y_i` (first such
/// run on ties), or None when the draft is fully accepted or no run exists.
pub fn reusable_segment(x: &[u32], y: &[u32]) -> Option<(usize, usize, usize)> {
    let n = x.len().checked_sub(1)?;
    if y.len() < n {
        return None;
    }
    // x_i is checked against y_i = y[i-1] (the prediction after x[..i]).
    let agrees = |i: usize| x[i] == y[i - 1];
    let e = (1..=n).find(|&i| !agrees(i))?;
    let mut best: Option<(usize, usize)> = None;
    let mut i = e + 1;
    while i <= n {
        if agrees(i) {
            let start = i;
            while i < n && agrees(i + 1) {
                i += 1;
            }
            if best.is_none_or(|(s, t)| i - start > t - s) {
                best = Some((start, i));
            }
        }
        i += 1;
    }
    best.map(|(s, t)| (e, s, t))
}

/// A kept segment: tokens the model itself produced after `anchor` in a draft context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub anchor: u32,
    pub tokens: Vec<u32>,
    /// Last step at which it may still be drafted.
    pub expires: u64,
}

/// Store of reusable segments with lifetime and a total-length bound.
#[derive(Clone, Debug)]
pub struct ExtensionStore {
    pub segments: Vec<Segment>,
    pub lifetime: u64,
    pub min_len: usize,
    /// Bound on the total number of stored tokens (the step's draft threshold).
    pub max_total: usize,
}

impl ExtensionStore {
    pub fn new(lifetime: u64, min_len: usize, max_total: usize) -> Self {
        ExtensionStore {
            segments: Vec::new(),
            lifetime: lifetime.max(1),
            min_len: min_len.max(1),
            max_total: max_total.max(1),
        }
    }

    pub fn clear(&mut self) {
        self.segments.clear();
    }

    /// Keep `tokens` (found after `anchor`) from step `step` for `lifetime` more steps.
    pub fn keep(&mut self, anchor: u32, tokens: &[u32], step: u64) {
        if tokens.len() < self.min_len {
            return;
        }
        if let Some(s) = self
            .segments
            .iter_mut()
            .find(|s| s.anchor == anchor && s.tokens == tokens)
        {
            s.expires = step + self.lifetime;
            return;
        }
        self.segments.push(Segment {
            anchor,
            tokens: tokens.to_vec(),
            expires: step + self.lifetime,
        });
        // Over the bound: drop the oldest (the first inserted).
        while self.segments.iter().map(|s| s.tokens.len()).sum::<usize>() > self.max_total
            && self.segments.len() > 1
        {
            self.segments.remove(0);
        }
    }

    /// Drop expired segments before drafting for `step`.
    pub fn expire(&mut self, step: u64) {
        self.segments.retain(|s| s.expires >= step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Token ids standing for the BRIEF / paper example:
    // draft  "Clinton 's security detail has arrived at Des Moines"
    // model  "Clinton arrived at Des Moines" (predictions given each draft prefix).
    const CLINTON: u32 = 1;
    const S: u32 = 2;
    const SECURITY: u32 = 3;
    const DETAIL: u32 = 4;
    const HAS: u32 = 5;
    const ARRIVED: u32 = 6;
    const AT: u32 = 7;
    const DES: u32 = 8;
    const MOINES: u32 = 9;
    const DOT: u32 = 10;
    const IN: u32 = 11;

    #[test]
    fn paper_example_keeps_arrived_at_des_moines() {
        let x = [CLINTON, S, SECURITY, DETAIL, HAS, ARRIVED, AT, DES, MOINES];
        // After "Clinton" the model says "arrived" (mismatch with "'s" at e=1); in
        // the draft context it then predicts: after 's -> "team", after security ->
        // "detail" (agree), after detail -> "is", after has -> "arrived" (agree),
        // after arrived -> "at", after at -> "Des", after Des -> "Moines" (agree),
        // after Moines -> ".".
        let y = [ARRIVED, 99, DETAIL, 98, ARRIVED, AT, DES, MOINES, DOT];
        let (e, g, h) = reusable_segment(&x, &y).unwrap();
        assert_eq!(e, 1);
        assert_eq!((g, h), (5, 8));
        assert_eq!(&x[g..=h], &[ARRIVED, AT, DES, MOINES]);
        // The anchor is the draft token before the segment.
        assert_eq!(x[g - 1], HAS);
    }

    #[test]
    fn fully_accepted_draft_has_nothing_to_reuse() {
        let x = [1, 2, 3];
        let y = [2, 3, 4];
        assert_eq!(reusable_segment(&x, &y), None);
    }

    #[test]
    fn no_agreeing_tail_gives_none() {
        let x = [1, 2, 3, 4];
        let y = [9, 9, 9, 9];
        assert_eq!(reusable_segment(&x, &y), None);
    }

    #[test]
    fn first_longest_run_wins_ties() {
        // e = 1; runs at [3,4] and [6,7] of equal length: the first one.
        let x = [0, 1, 2, 3, 4, 5, 6, 7];
        let y = [9, 9, 3, 4, 9, 6, 7, 9];
        assert_eq!(reusable_segment(&x, &y), Some((1, 3, 4)));
        // Mismatch only at the last position: nothing after it.
        let x = [0, 1, 2];
        let y = [1, 9, 9];
        assert_eq!(reusable_segment(&x, &y), None);
    }

    #[test]
    fn matches_brute_force_definition() {
        // Exhaustive over small alphabets: compare with the literal argmax of Eq. 3.
        let mut rng = 12345u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..2000 {
            let n = (next() % 8) as usize;
            let x: Vec<u32> = (0..=n).map(|_| (next() % 3) as u32).collect();
            let y: Vec<u32> = (0..=n).map(|_| (next() % 3) as u32).collect();
            let ok = |i: usize| x[i] == y[i - 1];
            let e = (1..=n).find(|&i| !ok(i));
            let mut best: Option<(usize, usize)> = None;
            if let Some(e) = e {
                for g in e + 1..=n {
                    for h in g..=n {
                        if (g..=h).all(ok) && best.is_none_or(|(a, b)| h - g > b - a) {
                            best = Some((g, h));
                        }
                    }
                }
            }
            let got = reusable_segment(&x, &y);
            assert_eq!(got.map(|(_, g, h)| (g, h)), best, "x={x:?} y={y:?}");
            if let Some((ge, _, _)) = got {
                assert_eq!(Some(ge), e);
            }
        }
    }

    #[test]
    fn store_lifetime_and_bound() {
        let mut st = ExtensionStore::new(2, 2, 6);
        st.keep(AT, &[DES, MOINES], 10);
        st.keep(AT, &[IN], 10); // too short
        assert_eq!(st.segments.len(), 1);
        st.expire(12);
        assert_eq!(st.segments.len(), 1); // kept for at least one step
        st.expire(13);
        assert!(st.segments.is_empty());
        st.keep(1, &[2, 3, 4], 0);
        st.keep(5, &[6, 7, 8], 0);
        st.keep(9, &[10, 11], 0); // total 8 > 6: oldest dropped
        assert_eq!(st.segments.len(), 2);
        assert_eq!(st.segments[0].anchor, 5);
    }
}
