//! Choosing one answer among several samples (test-time scaling): majority vote over
//! normalized answers, or the model's own confidence (mean log-probability per token).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// How [`select`] picks among samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Selector {
    /// The answer most samples agree on (after [`normalize`], or the caller's
    /// [`VoteKey`]); ties go to the group holding the most confident sample.
    #[default]
    Vote,
    /// The sample with the highest mean log-probability per token.
    Logprob,
    /// The sample the model itself judges best: asked after each distinct answer whether
    /// it is correct, the one with the highest log-odds of "Yes" over "No"
    /// ([`Candidate::verify`], scored by the assistant; one short prefill per answer).
    Verify,
}

impl Selector {
    pub const NAMES: [&'static str; 3] = ["vote", "logprob", "verify"];

    pub fn parse(s: &str) -> Option<Selector> {
        match s {
            "vote" => Some(Selector::Vote),
            "logprob" => Some(Selector::Logprob),
            "verify" => Some(Selector::Verify),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Selector::Vote => "vote",
            Selector::Logprob => "logprob",
            Selector::Verify => "verify",
        }
    }
}

/// What a vote compares: a caller's reading of an answer (a UI agent's parsed action);
/// `None` abstains (an answer that does not parse).
#[derive(Clone)]
pub struct VoteKey(pub Arc<KeyFn>);

/// A vote key's function: the answer's key, or `None` to abstain.
pub type KeyFn = dyn Fn(&str) -> Option<String> + Send + Sync;

impl fmt::Debug for VoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("VoteKey(..)")
    }
}

/// One sampled answer as [`select`] sees it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Candidate {
    pub text: String,
    /// Mean log-probability per generated token under the model (natural log).
    pub mean_logprob: f64,
    /// Samples whose vote key equals this one's (itself included; 0 when it abstained).
    pub votes: usize,
    /// Tokens generated for it.
    pub tokens: usize,
    /// The model's log-odds of "Yes" over "No" when asked whether this answer is correct
    /// (with [`Selector::Verify`] only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<f64>,
}

/// The vote key of plain text answers: lower case, citation marks (`[2]`) dropped, runs of
/// anything but letters and digits collapsed to one space, trimmed. "The warranty lasts 2
/// years [1]." and "the warranty lasts 2 years" agree.
pub fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut gap = false;
    while let Some(c) = chars.next() {
        if c == '[' {
            let rest: String = chars.clone().take_while(|&d| d != ']').collect();
            let closed = chars.clone().nth(rest.chars().count()) == Some(']');
            let numbers = rest
                .chars()
                .all(|d| d.is_ascii_digit() || d == ',' || d == ' ');
            if closed && !rest.is_empty() && numbers {
                for _ in 0..=rest.chars().count() {
                    chars.next();
                }
                gap = true;
                continue;
            }
        }
        if c.is_alphanumeric() {
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.extend(c.to_lowercase());
        } else {
            gap = true;
        }
    }
    out
}

/// Fills in each candidate's votes and returns the index of the chosen one. An empty
/// answer never wins a vote over a non-empty one; if every sample abstains, the vote falls
/// back to the log-probability. Ties go to the lowest index.
pub fn select(cands: &mut [Candidate], selector: Selector, key: Option<&VoteKey>) -> usize {
    let keys: Vec<Option<String>> = cands
        .iter()
        .map(|c| match key {
            Some(k) => (k.0)(&c.text),
            None => Some(normalize(&c.text)).filter(|k| !k.is_empty()),
        })
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for k in keys.iter().flatten() {
        *counts.entry(k.as_str()).or_default() += 1;
    }
    for (c, k) in cands.iter_mut().zip(&keys) {
        c.votes = k.as_deref().map_or(0, |k| counts[k]);
    }
    let most_confident = |of: &dyn Fn(usize) -> bool| {
        (0..cands.len())
            .filter(|&i| of(i))
            .fold(None, |best: Option<usize>, i| match best {
                Some(b) if cands[b].mean_logprob >= cands[i].mean_logprob => Some(b),
                _ => Some(i),
            })
    };
    let by_logprob = || most_confident(&|_| true).unwrap_or(0);
    match selector {
        Selector::Logprob => by_logprob(),
        Selector::Verify => {
            let best = cands
                .iter()
                .filter_map(|c| c.verify)
                .fold(f64::NEG_INFINITY, f64::max);
            if best == f64::NEG_INFINITY {
                return by_logprob();
            }
            // Among the best judged, the most confident.
            most_confident(&|i| cands[i].verify == Some(best)).unwrap_or(0)
        }
        Selector::Vote => {
            let top = cands.iter().map(|c| c.votes).max().unwrap_or(0);
            if top == 0 {
                return by_logprob();
            }
            // Among the largest groups, the most confident member of any of them.
            most_confident(&|i| cands[i].votes == top).unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(items: &[(&str, f64)]) -> Vec<Candidate> {
        items
            .iter()
            .map(|&(t, lp)| Candidate {
                text: t.into(),
                mean_logprob: lp,
                votes: 0,
                tokens: 1,
                verify: None,
            })
            .collect()
    }

    #[test]
    fn normalize_ignores_case_punctuation_and_citations() {
        assert_eq!(
            normalize("The warranty lasts 2 years [1]."),
            normalize("the warranty  lasts 2 years")
        );
        assert_eq!(normalize("  Tap(12) "), "tap 12");
        assert_eq!(normalize("See [1, 3] and [x]"), "see and x");
        assert_eq!(normalize("Größe"), "größe");
        assert_eq!(normalize("..."), "");
        assert_eq!(normalize("a [12"), "a 12");
    }

    #[test]
    fn the_majority_wins_even_against_a_more_confident_outlier() {
        let mut c = cands(&[
            ("Paris.", -0.9),
            ("Lyon", -0.1),
            ("paris", -0.5),
            ("PARIS!", -0.7),
        ]);
        assert_eq!(select(&mut c, Selector::Vote, None), 2);
        assert_eq!(c.iter().map(|c| c.votes).collect::<Vec<_>>(), [3, 1, 3, 3]);
        assert_eq!(select(&mut c, Selector::Logprob, None), 1);
    }

    #[test]
    fn ties_go_to_the_most_confident_group_then_the_lowest_index() {
        let mut c = cands(&[("a", -0.9), ("b", -0.2), ("a", -0.8), ("b", -0.95)]);
        assert_eq!(select(&mut c, Selector::Vote, None), 1);
        let mut c = cands(&[("a", -0.5), ("b", -0.5)]);
        assert_eq!(select(&mut c, Selector::Vote, None), 0);
        assert_eq!(select(&mut c, Selector::Logprob, None), 0);
    }

    #[test]
    fn empty_answers_and_abstentions_do_not_win() {
        let mut c = cands(&[("", -0.1), ("", -0.1), ("yes", -2.0)]);
        assert_eq!(select(&mut c, Selector::Vote, None), 2);
        // A key that rejects everything falls back to the log-probability.
        let none = VoteKey(Arc::new(|_: &str| None));
        let mut c = cands(&[("x", -0.3), ("y", -0.2)]);
        assert_eq!(select(&mut c, Selector::Vote, Some(&none)), 1);
        assert!(c.iter().all(|c| c.votes == 0));
    }

    #[test]
    fn a_caller_key_decides_what_agrees() {
        let first_word = VoteKey(Arc::new(|t: &str| {
            t.split_whitespace().next().map(str::to_owned)
        }));
        let mut c = cands(&[("tap 3 now", -0.9), ("swipe", -0.1), ("tap 3", -0.5)]);
        assert_eq!(select(&mut c, Selector::Vote, Some(&first_word)), 2);
    }

    #[test]
    fn verify_keeps_the_best_judged_answer_else_the_most_confident() {
        let mut c = cands(&[("a", -0.1), ("b", -0.9), ("c", -0.5), ("d", -0.2)]);
        for (c, v) in c.iter_mut().zip([Some(-1.0), Some(2.0), Some(2.0), None]) {
            c.verify = v;
        }
        assert_eq!(select(&mut c, Selector::Verify, None), 2);
        c.iter_mut().for_each(|c| c.verify = None);
        assert_eq!(select(&mut c, Selector::Verify, None), 0);
    }

    #[test]
    fn names_round_trip() {
        for n in Selector::NAMES {
            assert_eq!(Selector::parse(n).unwrap().name(), n);
        }
        assert!(Selector::parse("best").is_none());
    }
}
