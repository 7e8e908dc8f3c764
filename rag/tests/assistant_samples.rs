//! Several sampled answers in one batched decode, one kept by a selector; stop sequences.
//! On a real (small) model through the embeddable API.

use rag::assistant::{AskOptions, Sampling};
use rag::select::{Selector, VoteKey};
use rag::SearchMode;
use std::sync::Arc;

mod sample_assistant;
use sample_assistant::sample_assistant;

fn model_available() -> bool {
    let present = rag::models::resolve("smollm2-135m").is_ok();
    if !present && std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() != Ok("1") {
        panic!("smollm2-135m is missing: run scripts/fetch-model.sh smollm2-135m");
    }
    present
}

fn opts(samples: usize, seed: u64) -> AskOptions {
    AskOptions {
        max_tokens: 16,
        mode: SearchMode::Bm25,
        sampling: Sampling::new(0.9, 0.95, seed).unwrap(),
        samples,
        ..AskOptions::default()
    }
}

const Q: &str = "How do I do a factory reset of the Kestrel K2 console?";

#[test]
fn each_sample_is_the_single_answer_under_its_branch_seed_and_one_is_kept() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = sample_assistant(dir.path());
    let mut pieces = Vec::new();
    let many = a
        .ask(Q, &opts(5, 21), &mut |p| {
            pieces.push(p.to_owned());
            true
        })
        .unwrap();
    assert_eq!(many.candidates.len(), 5);
    // The kept answer arrives in one piece and is one of the samples, with the most votes.
    assert_eq!(pieces.concat().trim(), many.answer);
    let top = many.candidates.iter().map(|c| c.votes).max().unwrap();
    assert!(many
        .candidates
        .iter()
        .any(|c| c.text == many.answer && c.votes == top));
    let distinct: std::collections::HashSet<_> = many.candidates.iter().map(|c| &c.text).collect();
    assert!(
        distinct.len() > 1,
        "samples all equal: {:?}",
        many.candidates
    );
    for (b, c) in many.candidates.iter().enumerate() {
        let mut one = opts(1, 21);
        one.sampling = one.sampling.for_branch(b);
        let single = a.ask(Q, &one, &mut |_| true).unwrap();
        assert_eq!(single.answer, c.text, "sample {b}");
        assert!(single.candidates.is_empty());
    }
    // By confidence: the sample with the highest mean log-probability.
    let mut by_lp = opts(5, 21);
    by_lp.select = Selector::Logprob;
    let conf = a.ask(Q, &by_lp, &mut |_| true).unwrap();
    let best = conf
        .candidates
        .iter()
        .map(|c| c.mean_logprob)
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(conf
        .candidates
        .iter()
        .any(|c| c.text == conf.answer && c.mean_logprob == best));
    // A caller's key: every sample agrees on its length class, so the most confident wins.
    let mut keyed = opts(5, 21);
    keyed.vote_key = Some(VoteKey(Arc::new(|_: &str| Some("same".into()))));
    let k = a.ask(Q, &keyed, &mut |_| true).unwrap();
    assert!(k.candidates.iter().all(|c| c.votes == 5));
    assert_eq!(k.answer, conf.answer);
}

#[test]
fn stop_sequences_end_every_answer_before_them() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = sample_assistant(dir.path());
    let greedy = AskOptions {
        max_tokens: 24,
        mode: SearchMode::Bm25,
        ..AskOptions::default()
    };
    let full = a.ask(Q, &greedy, &mut |_| true).unwrap();
    // Stop at the second word of the greedy answer.
    let word = full
        .answer
        .split_whitespace()
        .nth(1)
        .expect("a greedy answer of two words")
        .to_owned();
    let mut stopped = greedy.clone();
    stopped.stop = vec![word.clone()];
    let mut streamed = String::new();
    let cut = a
        .ask(Q, &stopped, &mut |p| {
            streamed.push_str(p);
            true
        })
        .unwrap();
    let want = full.answer[..full.answer.find(&word).unwrap()].trim();
    assert_eq!(cut.answer, want);
    assert!(!streamed.contains(&word), "{streamed:?}");
    assert!(cut.tokens_generated < full.tokens_generated);
    assert!(!cut.cancelled, "a stop sequence is not a cancellation");
    // Samples stop the same way, each on its own.
    let mut many = opts(3, 4);
    many.stop = vec![" ".into()];
    let m = a.ask(Q, &many, &mut |_| true).unwrap();
    assert!(
        m.candidates.iter().all(|c| !c.text.contains(' ')),
        "{:?}",
        m.candidates
    );
}

#[test]
fn verify_keeps_the_answer_the_model_judges_best_and_leaves_the_session_sound() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = sample_assistant(dir.path());
    let greedy = AskOptions {
        max_tokens: 12,
        mode: SearchMode::Bm25,
        ..AskOptions::default()
    };
    let before = a.ask(Q, &greedy, &mut |_| true).unwrap();
    let mut v = opts(4, 9);
    v.select = Selector::Verify;
    let judged = a.ask(Q, &v, &mut |_| true).unwrap();
    let scores: Vec<f64> = judged
        .candidates
        .iter()
        .map(|c| c.verify.expect("every sample scored"))
        .collect();
    let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    assert!(judged
        .candidates
        .iter()
        .any(|c| c.text == judged.answer && c.verify == Some(best)));
    // One score per distinct answer.
    for x in &judged.candidates {
        for y in judged.candidates.iter().filter(|y| y.text == x.text) {
            assert_eq!(x.verify, y.verify);
        }
    }
    // The same samples as without verification: only the choice differs.
    let voted = a.ask(Q, &opts(4, 9), &mut |_| true).unwrap();
    let texts = |a: &rag::assistant::Answer| -> Vec<String> {
        a.candidates.iter().map(|c| c.text.clone()).collect()
    };
    assert_eq!(texts(&judged), texts(&voted));
    // The KV the verification prompts wrote is not taken for the next question's.
    let after = a.ask(Q, &greedy, &mut |_| true).unwrap();
    assert_eq!(after.answer, before.answer);
}
