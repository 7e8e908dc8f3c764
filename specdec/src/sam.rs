//! Suffix automaton over token ids (SAM-Decoding's draft index).
//!
//! Append-only (pitfall 5): tokens are only ever added at the end, so a match
//! state stays valid while the automaton grows. Every state remembers the end
//! position of its first occurrence, which is where a draft continues from.

/// Token id that separates documents in a shared text; never matched, never drafted.
pub const SEPARATOR: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct State {
    len: u32,
    link: i32,
    /// End index (inclusive) of the first occurrence of this state's strings.
    first_end: u32,
    /// Transitions sorted by token id; states have few out-edges in practice.
    next: Vec<(u32, u32)>,
}

impl State {
    fn get(&self, tok: u32) -> Option<u32> {
        self.next
            .binary_search_by_key(&tok, |e| e.0)
            .ok()
            .map(|i| self.next[i].1)
    }
    fn set(&mut self, tok: u32, to: u32) {
        match self.next.binary_search_by_key(&tok, |e| e.0) {
            Ok(i) => self.next[i].1 = to,
            Err(i) => self.next.insert(i, (tok, to)),
        }
    }
}

/// Suffix automaton of one growing token text.
#[derive(Clone, Debug)]
pub struct SuffixAutomaton {
    states: Vec<State>,
    last: u32,
    text: Vec<u32>,
}

/// Position of a match: the longest suffix of the query that occurs in the text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatchState {
    pub state: u32,
    pub len: u32,
}

impl Default for SuffixAutomaton {
    fn default() -> Self {
        Self::new()
    }
}

impl SuffixAutomaton {
    pub fn new() -> Self {
        SuffixAutomaton {
            states: vec![State {
                len: 0,
                link: -1,
                first_end: 0,
                next: Vec::new(),
            }],
            last: 0,
            text: Vec::new(),
        }
    }

    pub fn text(&self) -> &[u32] {
        &self.text
    }

    pub fn len(&self) -> usize {
        self.text.len()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    pub fn clear(&mut self) {
        *self = Self::new();
    }

    pub fn extend(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.push(t);
        }
    }

    /// Standard online construction (Blumer et al.), amortised O(1) per token.
    pub fn push(&mut self, tok: u32) {
        let pos = self.text.len() as u32;
        self.text.push(tok);
        let cur = self.states.len() as u32;
        self.states.push(State {
            len: self.states[self.last as usize].len + 1,
            link: 0,
            first_end: pos,
            next: Vec::new(),
        });
        let mut p = self.last as i32;
        while p >= 0 && self.states[p as usize].get(tok).is_none() {
            self.states[p as usize].set(tok, cur);
            p = self.states[p as usize].link;
        }
        if p >= 0 {
            let q = self.states[p as usize].get(tok).unwrap_or(0);
            if self.states[p as usize].len + 1 == self.states[q as usize].len {
                self.states[cur as usize].link = q as i32;
            } else {
                let clone = self.states.len() as u32;
                let mut st = self.states[q as usize].clone();
                st.len = self.states[p as usize].len + 1;
                self.states.push(st);
                while p >= 0 && self.states[p as usize].get(tok) == Some(q) {
                    self.states[p as usize].set(tok, clone);
                    p = self.states[p as usize].link;
                }
                self.states[q as usize].link = clone as i32;
                self.states[cur as usize].link = clone as i32;
            }
        }
        self.last = cur;
    }

    /// Advance a match by one query token: afterwards `m` is the longest suffix of
    /// the query (so far) that occurs in the text.
    pub fn advance(&self, m: &mut MatchState, tok: u32) {
        if tok == SEPARATOR {
            *m = MatchState::default();
            return;
        }
        loop {
            if let Some(n) = self.states[m.state as usize].get(tok) {
                m.state = n;
                m.len += 1;
                return;
            }
            let link = self.states[m.state as usize].link;
            if link < 0 {
                *m = MatchState::default();
                return;
            }
            m.state = link as u32;
            m.len = self.states[m.state as usize].len;
        }
    }

    /// Match a whole query from scratch.
    pub fn match_query(&self, query: &[u32]) -> MatchState {
        let mut m = MatchState::default();
        for &t in query {
            self.advance(&mut m, t);
        }
        m
    }

    /// End index of the first occurrence of the matched suffix.
    pub fn first_end(&self, m: MatchState) -> Option<usize> {
        (m.len > 0).then(|| self.states[m.state as usize].first_end as usize)
    }

    /// The longest suffix of the text itself that also occurs earlier, and the
    /// end of its first occurrence (which then lies before the text end).
    pub fn self_match(&self) -> Option<(usize, usize)> {
        let link = self.states[self.last as usize].link;
        if link <= 0 {
            return None;
        }
        let s = &self.states[link as usize];
        Some((s.len as usize, s.first_end as usize))
    }

    /// Match state of `self_match` (the longest repeated suffix of the text).
    pub fn match_state_of_self(&self) -> MatchState {
        let link = self.states[self.last as usize].link;
        if link <= 0 {
            return MatchState::default();
        }
        MatchState {
            state: link as u32,
            len: self.states[link as usize].len,
        }
    }

    /// Shorter matches along the suffix-link chain: (match length, first end) pairs,
    /// longest first, each with a different first occurrence. Gives extra branches.
    pub fn link_chain(&self, m: MatchState, out: &mut Vec<(usize, usize)>, max: usize) {
        out.clear();
        if m.len == 0 {
            return;
        }
        let mut s = m.state as i32;
        let mut len = m.len as usize;
        while s > 0 && out.len() < max {
            let st = &self.states[s as usize];
            let fe = st.first_end as usize;
            if out.iter().all(|&(_, e)| e != fe) {
                out.push((len, fe));
            }
            s = st.link;
            if s > 0 {
                len = self.states[s as usize].len as usize;
            }
        }
    }

    /// Continuation of the text after `end` (exclusive of `end`), stopping at a separator.
    pub fn continuation(&self, end: usize, max: usize) -> &[u32] {
        let start = (end + 1).min(self.text.len());
        let stop = (start + max).min(self.text.len());
        let slice = &self.text[start..stop];
        match slice.iter().position(|&t| t == SEPARATOR) {
            Some(i) => &slice[..i],
            None => slice,
        }
    }

    /// Rough heap footprint, for the size bound of the database automaton.
    pub fn heap_bytes(&self) -> usize {
        self.states
            .iter()
            .map(|s| std::mem::size_of::<State>() + s.next.capacity() * 8)
            .sum::<usize>()
            + self.text.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Brute force: longest suffix of `q` occurring in `t`, and its first end.
    fn brute_match(t: &[u32], q: &[u32]) -> (usize, Option<usize>) {
        for l in (1..=q.len()).rev() {
            let suf = &q[q.len() - l..];
            if suf.contains(&SEPARATOR) {
                continue;
            }
            if let Some(s) = t.windows(l).position(|w| w == suf) {
                return (l, Some(s + l - 1));
            }
        }
        (0, None)
    }

    proptest! {
        #[test]
        fn longest_suffix_matches_brute_force(
            t in proptest::collection::vec(0u32..4, 0..60),
            q in proptest::collection::vec(0u32..4, 0..20),
        ) {
            let mut sam = SuffixAutomaton::new();
            sam.extend(&t);
            let m = sam.match_query(&q);
            let (bl, be) = brute_match(&t, &q);
            prop_assert_eq!(m.len as usize, bl);
            prop_assert_eq!(sam.first_end(m), be);
        }

        #[test]
        fn incremental_growth_keeps_matches_correct(
            t in proptest::collection::vec(0u32..3, 1..80),
        ) {
            // Build incrementally and check self_match after every push.
            let mut sam = SuffixAutomaton::new();
            for i in 0..t.len() {
                sam.push(t[i]);
                let text = &t[..=i];
                // brute: longest suffix with an earlier (not the last) occurrence
                let mut best = None;
                for l in (1..=i).rev() {
                    let suf = &text[text.len() - l..];
                    if let Some(s) = text[..text.len() - 1].windows(l).position(|w| w == suf) {
                        best = Some((l, s + l - 1));
                        break;
                    }
                }
                prop_assert_eq!(sam.self_match(), best);
            }
        }
    }

    #[test]
    fn continuation_stops_at_separator() {
        let mut sam = SuffixAutomaton::new();
        sam.extend(&[1, 2, 3, SEPARATOR, 4, 5]);
        let m = sam.match_query(&[9, 1, 2]);
        assert_eq!(m.len, 2);
        assert_eq!(sam.continuation(sam.first_end(m).unwrap(), 10), &[3]);
        // A separator in the query resets the match.
        let m = sam.match_query(&[3, SEPARATOR]);
        assert_eq!(m.len, 0);
    }

    #[test]
    fn link_chain_lists_distinct_occurrences() {
        let mut sam = SuffixAutomaton::new();
        sam.extend(&[5, 1, 2, 7, 1, 2, 8, 0, 1, 2]);
        let m = sam.match_query(&[0, 1, 2]);
        assert_eq!(m.len, 3);
        let mut out = Vec::new();
        sam.link_chain(m, &mut out, 4);
        assert_eq!(out[0], (3, 9));
        assert!(out.iter().any(|&(l, e)| l == 2 && e == 2));
    }
}
