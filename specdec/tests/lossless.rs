//! Losslessness: every drafting mode must reproduce greedy decoding token for
//! token on the deterministic mock LM, whatever the budget, prompt or stop point.

use proptest::prelude::*;
use specdec::budget::{CostCurve, DEFAULT_SIZES};
use specdec::drafter::{SamConfig, SamDrafter};
use specdec::mock::MockLm;
use specdec::sam::SuffixAutomaton;
use specdec::{GenConfig, Generator, Metrics, Mode, Sampling, StopReason, TokenDb};
use std::sync::Arc;

fn cheap_curve() -> CostCurve {
    // Verify cost nearly flat in the batch size: speculation pays off.
    CostCurve::affine(10.0, 0.05, &DEFAULT_SIZES)
}

fn cfg(fixed: Option<usize>) -> GenConfig {
    GenConfig {
        fixed_budget: fixed,
        cost_curve: Some(cheap_curve()),
        // The mock verifies in microseconds, growing with the rows: the declared curve,
        // not the measured times, is the cost these tests speculate against.
        fixed_costs: true,
        ..Default::default()
    }
}

/// Prompt with repeated spans so that retrieval drafts are sometimes right.
fn prompt_from(seed: u64, len: usize, vocab: u32) -> Vec<u32> {
    let mut s = seed | 1;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut p: Vec<u32> = Vec::with_capacity(len);
    while p.len() < len {
        if p.len() > 8 && rnd() % 3 == 0 {
            let start = (rnd() as usize) % (p.len() - 4);
            let l = 2 + (rnd() as usize) % 12;
            for i in 0..l {
                if p.len() < len {
                    p.push(p[(start + i) % p.len()]);
                }
            }
        } else {
            p.push((rnd() % vocab as u64) as u32);
        }
    }
    p
}

fn run(gen: &mut Generator, lm: &mut MockLm, prompt: &[u32], max: usize) -> (Vec<u32>, Metrics) {
    lm.reset();
    let mut streamed = Vec::new();
    let (out, m) = gen
        .generate(lm, prompt, max, &mut |t| streamed.push(t))
        .expect("generation failed");
    assert_eq!(
        streamed, out,
        "streamed tokens differ from the returned ones"
    );
    assert_eq!(m.tokens, out.len());
    (out, m)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn every_mode_equals_greedy(
        seed in any::<u64>(),
        vocab in 6u32..400,
        len in 2usize..120,
        max in 0usize..90,
        fixed in prop_oneof![Just(None), (1usize..70).prop_map(Some)],
        eog_permille in prop_oneof![Just(0u64), Just(8), Just(60)],
        chunk in prop_oneof![Just(0usize), 1usize..40],
        window in prop_oneof![Just(usize::MAX), 1usize..100],
    ) {
        let mut lm = MockLm::new(vocab, seed);
        lm.eog_permille = eog_permille;
        // Prompts split for a calibration window at the end must decode the same.
        lm.prefill_chunk = chunk;
        let prompt = prompt_from(seed, len, vocab);
        let want = lm.greedy(&prompt, max);
        // A database holding a neighbour's continuation, for the SAM modes.
        let mut db = TokenDb::new(10_000);
        let mut other = prompt.clone();
        other.extend(lm.greedy(&prompt, max / 2));
        db.add(&other);
        let db = Arc::new(db.build_index());
        for mode in Mode::ALL {
            let c = GenConfig { calib_window: window, ..cfg(fixed) };
            let mut gen = Generator::new(mode, Some(db.clone()), c);
            let (got, m) = run(&mut gen, &mut lm, &prompt, max);
            prop_assert_eq!(&got, &want, "mode {} budget {:?} window {}", mode.name(), fixed, window);
            if got.len() < max {
                prop_assert_eq!(m.stop, StopReason::EndOfGeneration);
            }
        }
        // The calibration variants (off by default) draft differently, never decide.
        for mode in [Mode::SamCal, Mode::Sdnpu] {
            let mut sc = SamConfig::for_mode(mode);
            sc.calib_window = window;
            sc.calib_confidence = true;
            sc.calib_follow_text = true;
            sc.calib_vote_below = 5;
            let c = GenConfig { calib_window: window, ..cfg(fixed) };
            let mut gen = Generator::with_drafter(mode, Box::new(SamDrafter::new(sc, Some(db.clone()))), c);
            let (got, _) = run(&mut gen, &mut lm, &prompt, max);
            prop_assert_eq!(&got, &want, "variants, mode {} budget {:?} window {}", mode.name(), fixed, window);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 30, .. ProptestConfig::default() })]

    /// Sampled speculation equals plain sampled decoding with the same seed, and the
    /// drafts still get accepted where the sampled text copies.
    #[test]
    fn every_mode_equals_plain_sampling(
        seed in any::<u64>(),
        sample_seed in any::<u64>(),
        vocab in 6u32..300,
        len in 2usize..100,
        max in 0usize..80,
        temperature in prop_oneof![Just(0.2f32), Just(0.7), Just(1.0), Just(1.6)],
        top_p in prop_oneof![Just(1.0f32), Just(0.9), Just(0.5)],
        fixed in prop_oneof![Just(None), (1usize..40).prop_map(Some)],
        chunk in prop_oneof![Just(0usize), 1usize..40],
    ) {
        let mut lm = MockLm::new(vocab, seed);
        lm.prefill_chunk = chunk;
        let sampling = Sampling::new(temperature, top_p, sample_seed).unwrap();
        let prompt = prompt_from(seed, len, vocab);
        let want = lm.sample(&prompt, max, &sampling);
        let mut db = TokenDb::new(10_000);
        let mut other = prompt.clone();
        other.extend(lm.sample(&prompt, max / 2, &sampling));
        db.add(&other);
        let db = Arc::new(db.build_index());
        for mode in Mode::ALL {
            lm.reset();
            let mut gen = Generator::new(mode, Some(db.clone()), cfg(fixed));
            let mut streamed = Vec::new();
            let (got, m) = gen
                .generate_sampled(&mut lm, &prompt, max, &sampling, &mut |t| streamed.push(t), &|| false)
                .expect("generation failed");
            prop_assert_eq!(&streamed, &got);
            prop_assert_eq!(&got, &want, "mode {} budget {:?} T {} top_p {}", mode.name(), fixed, temperature, top_p);
            prop_assert_eq!(m.tokens, got.len());
        }
    }
}

#[test]
fn sampling_differs_by_seed_and_reuses_drafts() {
    // Copy-heavy text at a low temperature: most sampled tokens are the copies the
    // drafters propose, so steps are fewer than tokens.
    let mut lm = MockLm::new(500, 21);
    lm.copy_pct = 95;
    lm.eog_permille = 0;
    let prompt = prompt_from(5, 300, 500);
    let a = Sampling::new(0.1, 1.0, 1).unwrap();
    let b = Sampling::new(1.0, 1.0, 2).unwrap();
    let c = Sampling::new(1.0, 1.0, 3).unwrap();
    assert_ne!(lm.sample(&prompt, 60, &b), lm.sample(&prompt, 60, &c));
    let want = lm.sample(&prompt, 120, &a);
    lm.reset();
    let mut gen = Generator::new(Mode::Sdnpu, None, cfg(None));
    let (got, m) = gen
        .generate_sampled(&mut lm, &prompt, 120, &a, &mut |_| {}, &|| false)
        .unwrap();
    assert_eq!(got, want);
    assert!(
        m.steps * 2 < got.len(),
        "{} steps for {} tokens",
        m.steps,
        got.len()
    );
}

#[test]
fn eog_inside_an_accepted_draft_stops_there() {
    // The model copies the successor of the last bigram; the prompt holds
    // "5 6 7 EOG 8 2 3", so the self-automaton drafts "7 EOG 8 2 3 ..." after
    // "5 6" and the verifier accepts all of it. Output must stop before EOG.
    let mut lm = MockLm::new(50, 7);
    lm.copy_pct = 100;
    lm.eog_permille = 0;
    let eog = lm.eog;
    let prompt = [9, 5, 6, 7, eog, 8, 2, 3, 4, 9, 5];
    let want = lm.greedy(&prompt, 32);
    assert_eq!(want, vec![6, 7]);
    for mode in [Mode::Sam, Mode::Sdnpu, Mode::Pld] {
        let mut gen = Generator::new(mode, None, cfg(Some(16)));
        let (got, m) = run(&mut gen, &mut lm, &prompt, 32);
        assert_eq!(got, want, "{}", mode.name());
        assert_eq!(m.stop, StopReason::EndOfGeneration);
        // One verify step: "7 EOG 8 ..." were all accepted in it.
        assert_eq!(m.steps, 1, "{}", mode.name());
        assert!(m.step_tokens >= 3, "{}: {}", mode.name(), m.step_tokens);
        // Only "7" is delivered by that step (the first token came from prefill).
        assert_eq!(m.kept_tokens, 1, "{}", mode.name());
        assert_eq!(m.kept_tokens + 1, got.len(), "{}", mode.name());
    }
}

#[test]
fn max_tokens_cuts_inside_an_accepted_draft() {
    let mut lm = MockLm::new(50, 3);
    lm.copy_pct = 100;
    lm.eog_permille = 0;
    let prompt: Vec<u32> = (10..40).chain(10..12).collect();
    for max in 0..8 {
        let want = lm.greedy(&prompt, max);
        let mut gen = Generator::new(Mode::Sdnpu, None, cfg(Some(32)));
        let (got, m) = run(&mut gen, &mut lm, &prompt, max);
        assert_eq!(got, want, "max {max}");
        assert_eq!(got.len(), max);
        if max > 1 {
            // The whole copy was drafted: a single step, which delivered what the
            // cap left after the prefill's token, though it accepted more.
            assert_eq!(m.steps, 1);
            assert_eq!(m.kept_tokens, max - 1);
            assert!(m.step_tokens >= m.kept_tokens);
        }
    }
}

#[test]
fn context_window_is_respected() {
    let mut lm = MockLm::new(30, 11);
    lm.eog_permille = 0;
    let prompt = prompt_from(5, 40, 30);
    lm.ctx_limit = 60;
    let want = lm.greedy(&prompt, 100);
    let mut gen = Generator::new(Mode::Sdnpu, None, cfg(Some(64)));
    let (got, m) = run(&mut gen, &mut lm, &prompt, 100);
    assert_eq!(m.stop, StopReason::ContextFull);
    // Every committed position was used; the output is a greedy prefix.
    assert_eq!(got[..], want[..got.len()]);
    assert!(got.len() >= 20);
}

#[test]
fn speculation_cuts_steps_on_copy_heavy_text() {
    let mut lm = MockLm::new(500, 21);
    lm.copy_pct = 95;
    lm.eog_permille = 0;
    let prompt = prompt_from(99, 300, 500);
    let want = lm.greedy(&prompt, 200);
    let mut none = Generator::new(Mode::None, None, cfg(None));
    let (_, base) = run(&mut none, &mut lm, &prompt, 200);
    assert_eq!(base.steps, 199);
    assert_eq!(base.verified_rows, base.steps);
    for mode in [Mode::Pld, Mode::Sam, Mode::Sdnpu] {
        let mut gen = Generator::new(mode, None, cfg(None));
        // Warm the controller's acceptance estimate, then measure.
        run(&mut gen, &mut lm, &prompt, 200);
        let (got, m) = run(&mut gen, &mut lm, &prompt, 200);
        assert_eq!(got, want);
        assert!(
            m.mean_accepted() > 1.5,
            "{}: {} tokens per step",
            mode.name(),
            m.mean_accepted()
        );
        assert_eq!(m.valid_rows + m.wasted_rows, m.verified_rows);
    }
}

#[test]
fn expensive_verification_keeps_budget_at_one() {
    // Each extra row costs as much as a whole step: drafts rarely pay, so the
    // controller should almost always verify the root alone.
    let mut lm = MockLm::new(500, 4);
    lm.copy_pct = 30;
    lm.eog_permille = 0;
    let prompt = prompt_from(1234, 200, 500);
    let curve = CostCurve::affine(0.0, 10.0, &DEFAULT_SIZES);
    let mut gen = Generator::new(
        Mode::Sdnpu,
        None,
        GenConfig {
            cost_curve: Some(curve),
            ..Default::default()
        },
    );
    run(&mut gen, &mut lm, &prompt, 150);
    let (got, m) = run(&mut gen, &mut lm, &prompt, 150);
    assert_eq!(got, lm.greedy(&prompt, 150));
    assert!(m.mean_budget() < 1.3, "mean budget {}", m.mean_budget());
}

#[test]
fn database_drafts_are_used() {
    let mut lm = MockLm::new(1000, 8);
    lm.copy_pct = 0; // nothing to copy in the prompt: only the database knows
    lm.eog_permille = 0;
    let prompt = prompt_from(3, 20, 1000);
    let cont = lm.greedy(&prompt, 60);
    let mut db = TokenDb::new(1000);
    let mut doc = prompt[prompt.len() - 6..].to_vec();
    doc.extend(&cont);
    db.add(&doc);
    let db: Arc<SuffixAutomaton> = Arc::new(db.build_index());
    let mut with_db = Generator::new(Mode::Sam, Some(db), cfg(Some(16)));
    let (got, m) = run(&mut with_db, &mut lm, &prompt, 60);
    assert_eq!(got, cont);
    assert!(m.mean_accepted() > 5.0, "{}", m.mean_accepted());
    let mut no_db = Generator::new(Mode::Sam, None, cfg(Some(16)));
    let (_, m2) = run(&mut no_db, &mut lm, &prompt, 60);
    assert!(m2.steps > m.steps);
}

#[test]
fn provisional_budget_defers_profiling_until_asked() {
    let mut lm = MockLm::new(500, 21);
    lm.copy_pct = 95;
    lm.eog_permille = 0;
    let prompt = prompt_from(7, 200, 500);
    let mut gen = Generator::new(
        Mode::Sdnpu,
        None,
        GenConfig {
            provisional_budget: Some(4),
            ..Default::default()
        },
    );
    let (got, m) = run(&mut gen, &mut lm, &prompt, 120);
    assert_eq!(got, lm.greedy(&prompt, 120));
    assert_eq!(m.profile_ms, 0.0, "profiled before answering");
    assert!(gen.cost_curve().is_none());
    assert!(
        m.verified_rows <= 4 * m.steps,
        "budget above the provisional 4"
    );
    assert!(
        m.mean_accepted() > 1.5,
        "{} tokens per step",
        m.mean_accepted()
    );
    // Profiled when asked, once; the next generation runs on the controller.
    assert!(gen.profile_curve(&mut lm, got[0]).unwrap() >= 0.0);
    let sizes = gen
        .cost_curve()
        .expect("a curve after profiling")
        .sizes
        .len();
    assert!(sizes > 1);
    assert_eq!(gen.profile_curve(&mut lm, got[0]).unwrap(), 0.0);
    let (again, m) = run(&mut gen, &mut lm, &prompt, 120);
    assert_eq!(again, got);
    assert_eq!(m.profile_ms, 0.0);
}
