//! The exact solver against brute force over every plan, on hand-made and random instances,
//! including instances built from the paper's 2-Partition reduction.

use npu_schedule::exact::solve;
use npu_schedule::greedy::plan_progressive;
use npu_schedule::{simulate, Instance, Load, Plan};
use proptest::prelude::*;

mod support;
use support::{load_list, Bounds};

/// Minimum makespan over every plan: all loader orders x all non-decreasing releases.
fn brute_force(inst: &Instance) -> u64 {
    let n = inst.n_blocks;
    let steps = inst.n_steps();
    let mut best = u64::MAX;
    let mut order: Vec<usize> = (0..n).collect();
    permute(&mut order, 0, &mut |ord| {
        let mut rel = vec![0usize; n];
        loop {
            let plan = Plan {
                loads: ord
                    .iter()
                    .zip(&rel)
                    .map(|(&block, &release)| Load { block, release })
                    .collect(),
            };
            best = best.min(simulate(inst, &plan).unwrap().makespan());
            // Next non-decreasing sequence in 0..=steps.
            let mut i = n;
            loop {
                if i == 0 {
                    return;
                }
                i -= 1;
                if rel[i] < steps {
                    rel[i] += 1;
                    let v = rel[i];
                    for r in rel.iter_mut().skip(i + 1) {
                        *r = v;
                    }
                    break;
                }
            }
        }
    });
    best
}

fn permute(v: &mut Vec<usize>, k: usize, f: &mut impl FnMut(&[usize])) {
    if k == v.len() {
        f(v);
        return;
    }
    for i in k..v.len() {
        v.swap(k, i);
        permute(v, k + 1, f);
        v.swap(k, i);
    }
}

fn check(inst: &Instance) {
    let sol = solve(inst).unwrap();
    let sim = simulate(inst, &sol.plan).unwrap();
    assert_eq!(
        sim.makespan(),
        sol.makespan,
        "solver's plan does not reproduce its makespan"
    );
    assert_eq!(
        sol.makespan,
        brute_force(inst),
        "solver is not optimal on {inst:?}"
    );
}

#[test]
fn two_blocks_one_chunk_by_hand() {
    // Steps P0, P1 of 10 each (either form), switch 5. Loading P1 during P0 (0-5) and P0
    // during P1 (10-15) hides everything: makespan 20 = ideal prefill.
    let inst = Instance::uniform(2, 1, 10, 10, 5, 0, 1);
    let sol = solve(&inst).unwrap();
    assert_eq!(sol.makespan, 20);
    assert_eq!(sol.plan.loads, load_list(&[(1, 0), (0, 1)]));
    check(&inst);
}

#[test]
fn expensive_g2_favours_late_switching_where_greedy_does_not() {
    // 2 blocks x 2 chunks, G1 10, G2 30, switch 10. Greedy switches P1 at once and P0 after
    // step 0, so three steps run on G2: 10 + 30 + 30 + 30 = 100. Optimal: all prefill on G1
    // except nothing -- P0 switches after its last step (30-40, under P1's step 30-40) and P1
    // after prefill (40-50): makespan 50.
    let inst = Instance::uniform(2, 2, 10, 30, 10, 0, 1);
    let greedy = simulate(&inst, &plan_progressive(&inst))
        .unwrap()
        .makespan();
    assert_eq!(greedy, 100);
    assert_eq!(solve(&inst).unwrap().makespan, 50);
    check(&inst);
}

#[test]
fn loads_longer_than_any_window() {
    // Switch 100 vs steps of 10: nothing hides a switch fully; the optimum overlaps as much as
    // it can and then switches after prefill.
    check(&Instance::uniform(3, 2, 10, 11, 100, 0, 1));
    check(&Instance::uniform(2, 3, 10, 10, 25, 5, 1));
}

fn partition_instance(items: &[u64]) -> (Instance, u64) {
    let inst = support::partition_instance(items);
    let ideal = inst.ideal_prefill();
    (inst, ideal)
}

#[test]
fn partition_yes_instance_hides_every_switch() {
    // {3, 1, 2, 2}: 3+1 = 2+2. Each window is 400; slack from the items' own steps is a few
    // units, far below one scaled item (100).
    let (inst, ideal) = partition_instance(&[3, 1, 2, 2]);
    let sol = solve(&inst).unwrap();
    assert!(
        sol.makespan < ideal + 10,
        "makespan {} vs ideal {ideal}",
        sol.makespan
    );
    check(&inst);
}

#[test]
fn partition_no_instance_cannot_hide_them() {
    // {3, 3, 2}: sum 8, no subset sums to 4, so some switch spills out of the windows by at
    // least one scaled unit (100).
    let (inst, ideal) = partition_instance(&[3, 3, 2]);
    let sol = solve(&inst).unwrap();
    assert!(
        sol.makespan >= ideal + 90,
        "makespan {} vs ideal {ideal}",
        sol.makespan
    );
    check(&inst);
}

#[test]
fn refuses_too_large_and_unsupported_instances() {
    assert!(solve(&Instance::uniform(13, 2, 10, 10, 5, 0, 1)).is_err());
    let mut inst = Instance::uniform(2, 2, 10, 10, 5, 0, 1);
    inst.budget = npu_schedule::MemoryBudget::Bytes(100);
    assert!(solve(&inst).is_err());
}

fn arb_instance(max_blocks: usize, max_chunks: usize) -> impl Strategy<Value = Instance> {
    support::arb_instance(Bounds {
        max_blocks,
        max_chunks,
        g1: 40,
        g2_extra: 30,
        load: 60,
        unload: 10,
        decode_step: 3,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]
    #[test]
    fn solver_matches_brute_force(inst in arb_instance(3, 3)) {
        check(&inst);
    }

    #[test]
    fn solver_matches_brute_force_four_blocks(inst in arb_instance(4, 2)) {
        check(&inst);
    }
}
