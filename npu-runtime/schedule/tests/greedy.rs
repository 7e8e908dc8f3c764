//! How far the heuristics are from the exact optimum, and the targets on the paper-derived
//! phone profile.

use npu_schedule::exact::solve;
use npu_schedule::greedy::{plan_async, plan_progressive, plan_progressive_wc, plan_sync};
use npu_schedule::{simulate, Instance, MemoryBudget, Profile, ScheduleKind};
use proptest::prelude::*;

mod support;
use support::{
    arb_instance, load_list, paper_regime_instance, seeded_instance, Rng, GREEDY_BOUNDS,
};

fn span(inst: &Instance, plan: &npu_schedule::Plan) -> u64 {
    simulate(inst, plan).unwrap().makespan()
}

#[test]
fn paper_profile_1k_targets() {
    let p = Profile::paper_phone();
    let inst = Instance::from_profile(&p, 1024, MemoryBudget::OneFormPerBlock).unwrap();
    assert_eq!((inst.n_blocks, inst.n_chunks), (7, 4));
    let ideal_ttft = inst.ideal_ttft() as f64;
    let m = |k: ScheduleKind| simulate(&inst, &k.plan(&inst).unwrap()).unwrap();
    let prog = m(ScheduleKind::Progressive);
    // Target: progressive stall <= 5% of the ideal TTFT with a 1K prompt.
    assert!(
        (prog.switch_end.saturating_sub(prog.prefill_end)) as f64 <= 0.05 * ideal_ttft,
        "progressive stalls {:?}",
        prog.metrics
    );
    let opt = m(ScheduleKind::Optimal);
    let wc = m(ScheduleKind::ProgressiveWc);
    let sync = m(ScheduleKind::Sync);
    let asy = m(ScheduleKind::Async);
    assert!(opt.makespan() <= wc.makespan() && opt.makespan() <= prog.makespan());
    assert!(prog.makespan() < asy.makespan() && asy.makespan() < sync.makespan());
    // The 5% target holds for `progressive-ls` and for `progressive-wc` (what `choose`
    // predicts layouts with) on the profile the targets are stated for. The paper's rule is
    // not held to it (5.28% here, docs/scheduling.md); its bound is tested where it can be
    // derived, in `paper_rule_hides_every_switch_that_fits_under_one_step`.
    assert!(wc.makespan() as f64 <= 1.05 * opt.makespan() as f64);
    let ls = m(ScheduleKind::ProgressiveLs);
    assert!(
        opt.makespan() <= ls.makespan() && ls.makespan() as f64 <= 1.05 * opt.makespan() as f64
    );
    // Sync stalls by the whole switch (7 x 43.794 ms).
    assert_eq!(sync.switch_end - sync.prefill_end, 7 * 43_794_000);
}

/// 200 seeded instances up to 8 blocks x 4 chunks: `progressive-ls` within 5% of the
/// optimum on every one (the project's target), no heuristic below the optimum. How often
/// the paper's rule and `progressive-wc` are within 5% is printed, not asserted: neither
/// promises it (docs/scheduling.md has the measured figures; their provable bounds are
/// asserted in the proptests below).
#[test]
fn heuristics_against_the_optimum_on_random_instances() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut within_paper, mut within_wc, mut worst_paper, mut worst_wc, mut worst_ls) =
        (0usize, 0usize, 0f64, 0f64, 0f64);
    let total = 200;
    for _ in 0..total {
        let inst = paper_regime_instance(&mut rng);
        let opt = solve(&inst).unwrap().makespan as f64;
        let paper = span(&inst, &plan_progressive(&inst)) as f64 / opt - 1.0;
        let wc = span(&inst, &plan_progressive_wc(&inst).unwrap()) as f64 / opt - 1.0;
        let ls = span(&inst, &ScheduleKind::ProgressiveLs.plan(&inst).unwrap()) as f64 / opt - 1.0;
        assert!(
            paper >= 0.0 && wc >= 0.0 && ls >= 0.0,
            "a heuristic beat the exact solver"
        );
        // The target: within 5% of the optimum on every instance.
        assert!(
            ls <= 0.05,
            "progressive-ls {:.2}% over the optimum on {inst:?}",
            ls * 100.0
        );
        worst_ls = worst_ls.max(ls);
        within_paper += usize::from(paper <= 0.05);
        within_wc += usize::from(wc <= 0.05);
        worst_paper = worst_paper.max(paper);
        worst_wc = worst_wc.max(wc);
    }
    eprintln!(
        "within 5% of optimum: paper rule {within_paper}/{total} (worst {:.1}%), work-conserving {within_wc}/{total} (worst {:.1}%), local search {total}/{total} (worst {:.2}%)",
        worst_paper * 100.0,
        worst_wc * 100.0,
        worst_ls * 100.0
    );
}

/// Instances where every switch fits under any single step: 2-5 blocks x 2-3 chunks, G2 up
/// to `g2_extra` slower than G1 on each step, and each block's unload + load at most the
/// cheapest G1 step.
fn one_step_switch_instance(g2_extra: u64) -> impl Strategy<Value = Instance> {
    (2usize..=5, 2usize..=3).prop_flat_map(move |(n, c)| {
        (
            prop::collection::vec(10u64..50, n * c),
            prop::collection::vec(0u64..=g2_extra, n * c),
            prop::collection::vec((0u64..=1000, 0u64..=1000), n),
        )
            .prop_map(move |(g1, extra, shares)| {
                let cheapest = *g1.iter().min().unwrap();
                let mut inst = Instance::uniform(n, c, 0, 0, 0, 0, 7);
                inst.g2 = g1.iter().zip(&extra).map(|(a, e)| a + e).collect();
                inst.g1 = g1;
                for (b, (total, unload)) in shares.into_iter().enumerate() {
                    let switch = cheapest * total / 1000;
                    inst.unload[b] = switch * unload / 1000;
                    inst.load[b] = switch - inst.unload[b];
                }
                inst
            })
    })
}
proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// The optimum bounds every schedule, its plan reproduces its value, and nothing beats
    /// the ideal (all prefill on G1, every switch hidden).
    #[test]
    fn optimum_bounds_every_schedule(inst in arb_instance(GREEDY_BOUNDS)) {
        let sol = solve(&inst).unwrap();
        prop_assert_eq!(span(&inst, &sol.plan), sol.makespan);
        prop_assert!(sol.makespan >= inst.ideal_prefill());
        let total_switch: u64 = (0..inst.n_blocks).map(|b| inst.switch_cost(b)).sum();
        prop_assert!(sol.makespan >= total_switch);
        for plan in [plan_sync(&inst), plan_async(&inst), plan_progressive(&inst), plan_progressive_wc(&inst).unwrap(), ScheduleKind::ProgressiveLs.plan(&inst).unwrap()] {
            prop_assert!(span(&inst, &plan) >= sol.makespan);
        }
        // Sync is exactly prefill on G1 plus every switch back to back.
        prop_assert_eq!(span(&inst, &plan_sync(&inst)), inst.ideal_prefill() + total_switch);
    }

    /// The paper's rule when every switch costs at most the cheapest step (and there are
    /// at least 2 blocks and 2 chunks). Why it then never stalls: each round picks the
    /// unswitched block whose next step lies furthest ahead, which is at least one step
    /// away (with two or more unswitched blocks only one can be next; the last one, if it
    /// is next, computes first and is decided one step later). The round's first step
    /// covers the switch, so `k = 1`: the load is released at the step `pos`, starts when
    /// that step starts (the block's earlier steps have ended, and the previous load ended
    /// within the previous round's one step), and ends before step `pos + 1` starts, so
    /// before the block's next step. A round switches one block per step (at most one
    /// round skips a step), so all `n` switches end within the first `n + 1 <= 2n` steps,
    /// inside prefill. Hence compute never waits and nothing switches after prefill: the
    /// makespan is exactly the steps' compute, each on the form its block has at that step.
    /// Since the optimum is at least all of prefill on G1, the paper's rule is within the
    /// worst G2/G1 step ratio of the optimum, and optimal when G2 costs what G1 does.
    #[test]
    fn paper_rule_hides_every_switch_that_fits_under_one_step(
        inst in one_step_switch_instance(20)
    ) {
        let plan = plan_progressive(&inst);
        let sim = simulate(&inst, &plan).unwrap();
        let release = plan.release_of(inst.n_blocks);
        let compute: u64 = (0..inst.n_steps())
            .map(|s| if s >= release[inst.block_of(s)] { inst.g2[s] } else { inst.g1[s] })
            .sum();
        prop_assert_eq!(sim.prefill_end, compute);
        prop_assert!(sim.switch_end <= sim.prefill_end);
        prop_assert!(release.iter().all(|&r| r <= inst.n_blocks + 1));
        let opt = solve(&inst).unwrap().makespan;
        let ratio = (0..inst.n_steps())
            .map(|s| inst.g2[s] as f64 / inst.g1[s] as f64)
            .fold(1.0, f64::max);
        prop_assert!(opt <= sim.makespan());
        prop_assert!(sim.makespan() as f64 <= ratio * opt as f64 + 1e-6);
    }

    /// The case above with G2 as cheap as G1: nothing is lost by switching early, so the
    /// paper's rule reaches the ideal (all prefill on G1, every switch hidden), which is
    /// the optimum.
    #[test]
    fn paper_rule_is_optimal_when_switches_fit_under_a_step_and_g2_costs_nothing_more(
        inst in one_step_switch_instance(0)
    ) {
        let prog = span(&inst, &plan_progressive(&inst));
        prop_assert_eq!(prog, inst.ideal_prefill());
        prop_assert_eq!(solve(&inst).unwrap().makespan, prog);
    }

    /// Any valid plan keeps the compute unit or the loader busy until its end: compute
    /// only waits for its own block's load, which by then is released and waits for
    /// nothing but the loader. So every schedule's makespan is at most all steps on their
    /// dearer form plus every switch back to back (at most (G2/G1 + 1) x the optimum).
    #[test]
    fn no_schedule_leaves_both_units_idle(inst in arb_instance(GREEDY_BOUNDS)) {
        let bound: u64 = (0..inst.n_steps()).map(|s| inst.g1[s].max(inst.g2[s])).sum::<u64>()
            + (0..inst.n_blocks).map(|b| inst.switch_cost(b)).sum::<u64>();
        for plan in [plan_async(&inst), plan_progressive(&inst), plan_progressive_wc(&inst).unwrap(), ScheduleKind::ProgressiveLs.plan(&inst).unwrap()] {
            prop_assert!(span(&inst, &plan) <= bound, "{:?}", plan);
        }
    }
}

/// `progressive-ls` against hand-computed timelines. 2 blocks x 2 chunks, G1 10, G2 30,
/// switch 10: the paper's rule runs three steps on G2 (makespan 100). The optimum keeps
/// every step on G1: P0 switches after its last step (30-40, under P1's step 30-40) and P1
/// after prefill (40-50), makespan 50; no other plan reaches 50 (P0 cannot start before its
/// step 20-30 ends without moving that step to G2).
#[test]
fn local_search_timeline_expensive_g2() {
    use npu_schedule::sim::{Event, EventKind, Unit};
    use npu_schedule::Form;
    let inst = Instance::uniform(2, 2, 10, 30, 10, 0, 1);
    assert_eq!(span(&inst, &plan_progressive(&inst)), 100);
    let plan = ScheduleKind::ProgressiveLs.plan(&inst).unwrap();
    assert_eq!(plan.loads, load_list(&[(0, 3), (1, 4)]));
    let sim = simulate(&inst, &plan).unwrap();
    let compute = |block, chunk, start| Event {
        unit: Unit::Compute,
        kind: EventKind::Compute {
            block,
            chunk,
            form: Form::G1,
        },
        start,
        end: start + 10,
    };
    let switch = |block, start: u64| {
        [
            Event {
                unit: Unit::Loader,
                kind: EventKind::Unload {
                    block,
                    form: Form::G1,
                },
                start,
                end: start,
            },
            Event {
                unit: Unit::Loader,
                kind: EventKind::Load {
                    block,
                    form: Form::G2,
                },
                start,
                end: start + 10,
            },
        ]
    };
    let mut want = vec![compute(0, 0, 0), compute(1, 0, 10), compute(0, 1, 20)];
    want.extend(switch(0, 30));
    want.push(compute(1, 1, 30));
    want.extend(switch(1, 40));
    assert_eq!(sim.events, want);
    assert_eq!((sim.prefill_end, sim.switch_end), (40, 50));
}

/// The paper profile with a 256-token prompt (7 blocks x 1 chunk; G1 27.113 ms, G2 29.824
/// ms, switch 43.794 ms). The switches (7 x 43.794 = 306.558 ms) outlast prefill (189.8 ms),
/// so the makespan is at least 306.558 ms, reached when the loader never idles (e.g. P6 switches
/// at 0 (its one step then runs on G2 at the end), every other block right after its G1
/// step, back to back). The paper's rule idles the loader between its rounds and is 10.2%
/// over that bound; `progressive-ls` reaches it, and so does the exact solver.
#[test]
fn local_search_reaches_the_loader_bound_on_the_paper_profile_at_256() {
    use npu_schedule::sim::{EventKind, Unit};
    let inst = Instance::from_profile(&Profile::paper_phone(), 256, MemoryBudget::OneFormPerBlock)
        .unwrap();
    assert_eq!((inst.n_blocks, inst.n_chunks), (7, 1));
    let bound = 7 * 43_794_000;
    assert_eq!(solve(&inst).unwrap().makespan, bound);
    let paper = span(&inst, &plan_progressive(&inst));
    assert!(paper as f64 > 1.10 * bound as f64, "paper rule {paper}");
    let sim = simulate(&inst, &ScheduleKind::ProgressiveLs.plan(&inst).unwrap()).unwrap();
    assert_eq!(sim.makespan(), bound);
    // The loader runs from 0 without a gap, and no block computes while it switches.
    let loads: Vec<_> = sim
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Load { .. }))
        .collect();
    assert_eq!(loads.first().unwrap().start, 0);
    assert!(loads.windows(2).all(|w| w[0].end == w[1].start));
    for e in sim.events.iter().filter(|e| e.unit == Unit::Compute) {
        let EventKind::Compute { block, .. } = e.kind else {
            unreachable!()
        };
        let l = loads
            .iter()
            .find(|l| matches!(l.kind, EventKind::Load { block: b, .. } if b == block))
            .unwrap();
        assert!(e.end <= l.start || e.start >= l.end, "{e:?} overlaps {l:?}");
    }
}

/// `progressive-ls` within 5% of the exact optimum (the project's target) on the 1000
/// instances of the stated set's "S1d arb" family (docs/scheduling.md; the same seed as
/// `gap.rs`): the proptests' distribution, 1-5 blocks x 1-3 chunks, switches from free to
/// several steps long, unlike the paper-regime family above. The target is measured, not
/// a theorem (the problem is NP-hard and the search stops at a local optimum): other seeds
/// of this distribution hold about one instance in 1000 over 5% (5.45% and 6.34% seen).
/// On this set a regression of the search, the simulator or the solver fails here. The
/// family must hold instances where the paper's rule is more than 5% off, or the
/// comparison would show nothing.
#[test]
fn local_search_within_five_percent_of_the_optimum_on_the_stated_arb_set() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut paper_over = 0;
    for _ in 0..1000 {
        let inst = seeded_instance(&mut rng, GREEDY_BOUNDS);
        let opt = solve(&inst).unwrap().makespan;
        let ls = span(&inst, &ScheduleKind::ProgressiveLs.plan(&inst).unwrap());
        assert!(
            ls >= opt,
            "progressive-ls {ls} beat the optimum {opt} on {inst:?}"
        );
        assert!(
            ls as f64 <= 1.05 * opt as f64,
            "progressive-ls {ls} vs optimum {opt} on {inst:?}"
        );
        paper_over += usize::from(span(&inst, &plan_progressive(&inst)) as f64 > 1.05 * opt as f64);
    }
    assert!(
        paper_over > 0,
        "no instance where the paper's rule is over 5%"
    );
}
