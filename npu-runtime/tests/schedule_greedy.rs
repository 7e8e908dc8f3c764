//! How far the heuristics are from the exact optimum, and the targets on the paper-derived
//! phone profile.

use npu_runtime::schedule::exact::solve;
use npu_runtime::schedule::plan::{plan_async, plan_progressive, plan_progressive_wc, plan_sync};
use npu_runtime::schedule::{simulate, Instance, MemoryBudget, Profile, ScheduleKind};
use proptest::prelude::*;

fn span(inst: &Instance, plan: &npu_runtime::schedule::Plan) -> u64 {
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
    // The work-conserving variant is within 5% of the optimum here; the paper's rule, which
    // starts switching in the first chunk and so runs ~2/3 of the steps on the slower G2,
    // is measured at 5.3% (documented in docs/scheduling.md) -- keep it under 6%.
    assert!(wc.makespan() as f64 <= 1.05 * opt.makespan() as f64);
    assert!(
        prog.makespan() as f64 <= 1.06 * opt.makespan() as f64,
        "{} vs {}",
        prog.makespan(),
        opt.makespan()
    );
    // Sync stalls by the whole switch (7 x 43.794 ms).
    assert_eq!(sync.switch_end - sync.prefill_end, 7 * 43_794_000);
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() % 1_000_000) as f64 / 1e6
    }
}

/// A random instance in the paper's regime: similar blocks (+-10% per step), G2 up to 30%
/// slower than G1 on a chunk, a switch 0.3x-3x a block's step.
fn random_instance(rng: &mut Rng) -> Instance {
    let n = 2 + (rng.next() % 7) as usize;
    let c = 1 + (rng.next() % 4) as usize;
    let base = 5.0 + 35.0 * rng.unit();
    let slow = 1.0 + 0.3 * rng.unit();
    let sw = 0.3 + 2.7 * rng.unit();
    let mut inst = Instance::uniform(n, c, 0, 0, 0, 0, 1000);
    for s in 0..n * c {
        let g = base * (0.9 + 0.2 * rng.unit());
        inst.g1[s] = (g * 1000.0) as u64;
        inst.g2[s] = (g * slow * 1000.0) as u64;
    }
    for b in 0..n {
        inst.load[b] = (base * sw * (0.8 + 0.4 * rng.unit()) * 1000.0) as u64;
    }
    inst
}

/// 200 seeded instances up to 8 blocks x 4 chunks. Measured when written: the paper's rule
/// is within 5% of the optimum on about half of them (worst ~34%); the work-conserving
/// variant on all but about 1% (worst ~7%). The assertions leave a little room.
#[test]
fn heuristics_against_the_optimum_on_random_instances() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut within_paper, mut within_wc, mut worst_paper, mut worst_wc) =
        (0usize, 0usize, 0f64, 0f64);
    let total = 200;
    for _ in 0..total {
        let inst = random_instance(&mut rng);
        let opt = solve(&inst).unwrap().makespan as f64;
        let paper = span(&inst, &plan_progressive(&inst)) as f64 / opt - 1.0;
        let wc = span(&inst, &plan_progressive_wc(&inst).unwrap()) as f64 / opt - 1.0;
        assert!(
            paper >= 0.0 && wc >= 0.0,
            "a heuristic beat the exact solver"
        );
        within_paper += usize::from(paper <= 0.05);
        within_wc += usize::from(wc <= 0.05);
        worst_paper = worst_paper.max(paper);
        worst_wc = worst_wc.max(wc);
    }
    eprintln!(
        "within 5% of optimum: paper rule {within_paper}/{total} (worst {:.1}%), work-conserving {within_wc}/{total} (worst {:.1}%)",
        worst_paper * 100.0,
        worst_wc * 100.0
    );
    assert!(
        within_wc as f64 >= 0.97 * total as f64,
        "work-conserving within 5% on only {within_wc}/{total}"
    );
    assert!(
        worst_wc <= 0.10,
        "work-conserving worst gap {:.1}%",
        worst_wc * 100.0
    );
    assert!(
        within_paper as f64 >= 0.35 * total as f64,
        "paper rule within 5% on only {within_paper}/{total}"
    );
}

fn arb_instance() -> impl Strategy<Value = Instance> {
    (1usize..=5, 1usize..=3).prop_flat_map(|(n, c)| {
        (
            prop::collection::vec(1u64..50, n * c),
            prop::collection::vec(0u64..20, n * c),
            prop::collection::vec(0u64..120, n),
            prop::collection::vec(0u64..10, n),
        )
            .prop_map(move |(g1, extra, load, unload)| {
                let mut inst = Instance::uniform(n, c, 0, 0, 0, 0, 7);
                inst.g2 = g1.iter().zip(&extra).map(|(a, e)| a + e).collect();
                inst.g1 = g1;
                inst.load = load;
                inst.unload = unload;
                inst
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// The optimum bounds every schedule, its plan reproduces its value, and nothing beats
    /// the ideal (all prefill on G1, every switch hidden).
    #[test]
    fn optimum_bounds_every_schedule(inst in arb_instance()) {
        let sol = solve(&inst).unwrap();
        prop_assert_eq!(span(&inst, &sol.plan), sol.makespan);
        prop_assert!(sol.makespan >= inst.ideal_prefill());
        let total_switch: u64 = (0..inst.n_blocks).map(|b| inst.switch_cost(b)).sum();
        prop_assert!(sol.makespan >= total_switch);
        for plan in [plan_sync(&inst), plan_async(&inst), plan_progressive(&inst), plan_progressive_wc(&inst).unwrap()] {
            prop_assert!(span(&inst, &plan) >= sol.makespan);
        }
        // Sync is exactly prefill on G1 plus every switch back to back.
        prop_assert_eq!(span(&inst, &plan_sync(&inst)), inst.ideal_prefill() + total_switch);
    }
}
