//! A generator restored from another's learned state (what `rag ask` keeps between
//! processes) starts where that one stopped, still decodes greedily token for token, and
//! refuses state learned for other budgets without changing.

use specdec::budget::{CostCurve, DEFAULT_SIZES};
use specdec::mock::MockLm;
use specdec::{GenConfig, Generator, Mode};

fn cfg() -> GenConfig {
    GenConfig {
        cost_curve: Some(CostCurve::affine(10.0, 0.05, &DEFAULT_SIZES)),
        ..Default::default()
    }
}

/// A prompt that repeats its own spans, so that drafts are sometimes right.
fn prompt(seed: u32) -> Vec<u32> {
    let base: Vec<u32> = (0..40).map(|i| (i * 7 + seed) % 50).collect();
    base.iter()
        .chain(&base[5..30])
        .chain(&base[..20])
        .copied()
        .collect()
}

fn answer(gen: &mut Generator, lm: &mut MockLm, p: &[u32]) -> Vec<u32> {
    lm.reset();
    gen.generate(lm, p, 48, &mut |_| {}).expect("generation").0
}

#[test]
fn a_restored_generator_starts_from_the_learned_state_and_stays_lossless() {
    let mut lm = MockLm::new(50, 7);
    let mut warm = Generator::new(Mode::Sdnpu, None, cfg());
    for s in 0..4 {
        answer(&mut warm, &mut lm, &prompt(s));
    }
    let learned = warm.learned();
    assert!(learned.budget.is_some());
    // Every verify was timed: at least the single-row steps have times to carry over.
    let costs = &learned.budget.as_ref().unwrap().costs;
    assert!(!costs[0].is_empty(), "{costs:?}");
    assert!(costs.iter().flatten().all(|&ms| ms > 0.0));
    assert!(learned != Generator::new(Mode::Sdnpu, None, cfg()).learned());

    let mut restored = Generator::new(Mode::Sdnpu, None, cfg());
    restored.restore_learned(&learned).unwrap();
    assert!(restored.learned() == learned);
    // Through JSON, as the assistant stores it (decimal text: equal to ~1e-12).
    let text = serde_json::to_string(&learned).unwrap();
    let mut from_json = Generator::new(Mode::Sdnpu, None, cfg());
    from_json
        .restore_learned(&serde_json::from_str(&text).unwrap())
        .unwrap();
    let (a, b) = (from_json.learned(), learned.clone());
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * (1.0 + y.abs());
    let (ba, bb) = (a.budget.unwrap(), b.budget.unwrap());
    assert_eq!(ba.sizes, bb.sizes);
    for (ra, rb) in ba
        .est_sum
        .iter()
        .chain(&ba.acc_sum)
        .zip(bb.est_sum.iter().chain(&bb.acc_sum))
    {
        assert!(ra.iter().zip(rb).all(|(&x, &y)| close(x, y)));
    }
    assert_eq!(ba.costs.len(), bb.costs.len());
    for (wa, wb) in ba.costs.iter().zip(&bb.costs) {
        assert_eq!(wa.len(), wb.len());
        assert!(wa.iter().zip(wb).all(|(&x, &y)| close(x, y)));
    }
    assert!(a.accept == b.accept);

    let p = prompt(9);
    let mut greedy = Generator::new(Mode::None, None, cfg());
    let want = answer(&mut greedy, &mut lm, &p);
    assert_eq!(answer(&mut restored, &mut lm, &p), want);
}

#[test]
fn state_learned_for_other_budgets_is_refused_and_changes_nothing() {
    let mut lm = MockLm::new(50, 3);
    let mut other = Generator::new(
        Mode::Sdnpu,
        None,
        GenConfig {
            max_budget: 8,
            ..cfg()
        },
    );
    answer(&mut other, &mut lm, &prompt(1));
    let mut gen = Generator::new(Mode::Sdnpu, None, cfg());
    answer(&mut gen, &mut lm, &prompt(2));
    let before = gen.learned();
    assert!(gen.restore_learned(&other.learned()).is_err());
    assert!(gen.learned() == before);

    let mut bad = before.clone();
    bad.accept.trials.truncate(3);
    assert!(gen.restore_learned(&bad).is_err());
    assert!(gen.learned() == before);
}
