//! The simulator's timelines against schedules worked out by hand.

use npu_schedule::greedy::{plan_async, plan_progressive, plan_sync};
use npu_schedule::sim::{simulate, EventKind, Unit};
use npu_schedule::{Form, Instance, MemoryBudget, Plan};

mod support;
use support::load_list;

/// Compute intervals as (block, chunk, form, start, end), in timeline order.
fn computes(inst: &Instance, plan: &Plan) -> Vec<(usize, usize, Form, u64, u64)> {
    simulate(inst, plan)
        .unwrap()
        .events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::Compute { block, chunk, form } => Some((block, chunk, form, e.start, e.end)),
            _ => None,
        })
        .collect()
}

/// Load intervals as (block, start, end) in loader order.
fn loads(inst: &Instance, plan: &Plan) -> Vec<(usize, u64, u64)> {
    simulate(inst, plan)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.unit == Unit::Loader)
        .filter_map(|e| match e.kind {
            EventKind::Load { block, .. } => Some((block, e.start, e.end)),
            _ => None,
        })
        .collect()
}

/// 3 blocks x 2 chunks, G1 step 10, G2 step 12, switch (load) 15, no teardown, decode 5.
/// Ideal: prefill 6 x 10 = 60, TTFT 65.
fn small() -> Instance {
    Instance::uniform(3, 2, 10, 12, 15, 0, 5)
}

#[test]
fn sync_loads_everything_after_prefill() {
    // All six steps on G1: 0-10, ..., 50-60. Loads back to back from 60:
    // P0 60-75, P1 75-90, P2 90-105. Stall 45, TTFT 110, overhead 45/65 = 69.2%.
    let inst = small();
    let plan = plan_sync(&inst);
    assert!(computes(&inst, &plan).iter().all(|c| c.2 == Form::G1));
    assert_eq!(computes(&inst, &plan).last().unwrap().4, 60);
    assert_eq!(
        loads(&inst, &plan),
        vec![(0, 60, 75), (1, 75, 90), (2, 90, 105)]
    );
    let r = simulate(&inst, &plan).unwrap();
    assert_eq!((r.prefill_end, r.switch_end), (60, 105));
    let m = r.metrics;
    assert!((m.stall_ms - 45e-6).abs() < 1e-12 && (m.ttft_ms - 110e-6).abs() < 1e-12);
    assert!((m.overhead_pct - 45.0 / 65.0 * 100.0).abs() < 1e-9);
}

#[test]
fn async_loads_each_block_after_its_last_chunk() {
    // Releases 4, 5, 6. Compute all on G1 (each block's last step precedes its release).
    // P0 released when step 4 may start (t=40): 40-55; P1 at t=50 but loader busy: 55-70;
    // P2 at t=60 (after prefill): 70-85. Stall 25, TTFT 90.
    let inst = small();
    let plan = plan_async(&inst);
    assert_eq!(plan.loads, load_list(&[(0, 4), (1, 5), (2, 6)]));
    assert!(computes(&inst, &plan).iter().all(|c| c.2 == Form::G1));
    assert_eq!(
        loads(&inst, &plan),
        vec![(0, 40, 55), (1, 55, 70), (2, 70, 85)]
    );
    let r = simulate(&inst, &plan).unwrap();
    assert_eq!((r.prefill_end, r.switch_end, r.makespan()), (60, 85, 85));
}

#[test]
fn progressive_follows_eq_1_2() {
    // Round 1, pos 0: last unswitched block in compute order is P2 (next step 2); smallest k
    //   with 15 <= 10 + 10 is k=2 -> load P2 released at 0, pos 2.
    // Round 2, pos 2: unswitched P0 (next 3), P1 (next 4) -> P1; steps 2 (P2 on G2: 12) and
    //   3 (P0 on G1: 10) sum 22 >= 15 -> k=2, release 2, pos 4.
    // Round 3, pos 4: P0 has no compute left; steps 4, 5 on G2: 12 + 12 >= 15 -> release 4.
    // Timeline: P2 loads 0-15 while P0 0-10, P1 10-20 run on G1; P1 loads from t=20 (20-35)
    // while P2 runs on G2 20-32 and P0 on G1 32-42; P0 loads 42-57 while P1 (G2) 42-54 and
    // P2 (G2) 54-66 run. Prefill 66, switches done 57: no stall, TTFT 71 (overhead 9.2%).
    let inst = small();
    let plan = plan_progressive(&inst);
    assert_eq!(plan.loads, load_list(&[(2, 0), (1, 2), (0, 4)]));
    use Form::*;
    assert_eq!(
        computes(&inst, &plan),
        vec![
            (0, 0, G1, 0, 10),
            (1, 0, G1, 10, 20),
            (2, 0, G2, 20, 32),
            (0, 1, G1, 32, 42),
            (1, 1, G2, 42, 54),
            (2, 1, G2, 54, 66)
        ]
    );
    assert_eq!(
        loads(&inst, &plan),
        vec![(2, 0, 15), (1, 20, 35), (0, 42, 57)]
    );
    let m = simulate(&inst, &plan).unwrap().metrics;
    assert_eq!(m.stall_ms, 0.0);
    assert!((m.ttft_ms - 71e-6).abs() < 1e-12);
    assert!((m.overhead_pct - 6.0 / 65.0 * 100.0).abs() < 1e-9);
}

#[test]
fn a_step_waits_for_its_own_switch() {
    // 2 blocks x 1 chunk, G1 10, G2 20, switch = teardown 3 + load 7.
    // Plan: P1 released at 0 and P0 at 0 (queued behind it). P1 switches 0-3 (teardown)
    // 3-10 (load) while P0 would start at 0 -- but P0's load is released at 0 too, so P0
    // waits for its own switch: loader P0 10-13-20, P0 computes on G2 20-40, P1 on G2 40-60.
    let inst = Instance::uniform(2, 1, 10, 20, 7, 3, 1);
    let plan = Plan {
        loads: load_list(&[(1, 0), (0, 0)]),
    };
    let r = simulate(&inst, &plan).unwrap();
    use Form::*;
    assert_eq!(
        computes(&inst, &plan),
        vec![(0, 0, G2, 20, 40), (1, 0, G2, 40, 60)]
    );
    let loader: Vec<_> = r
        .events
        .iter()
        .filter(|e| e.unit == Unit::Loader)
        .map(|e| (e.start, e.end))
        .collect();
    assert_eq!(loader, vec![(0, 3), (3, 10), (10, 13), (13, 20)]);
    assert_eq!((r.prefill_end, r.switch_end), (60, 20));
}

#[test]
fn double_residency_computes_on_g1_during_the_load() {
    // Budget holds both forms of both blocks: P0's G2 loads 0-15 (no teardown on the loader)
    // while P0 still computes on G1 0-10; P1 (released at 0 too) loads 15-30 while P1 runs
    // on G1 10-20. Chunk 2: P0 on G2 20-32, P1 on G2 32-44. With one form per block the same
    // plan makes P0 wait for its switch: P0 G2 15-27, P1 waits to 30, 30-42, 42-54, 54-66.
    let mut inst = Instance::uniform(2, 2, 10, 12, 15, 0, 5);
    inst.budget = MemoryBudget::Bytes(4);
    let plan = Plan {
        loads: load_list(&[(0, 0), (1, 0)]),
    };
    use Form::*;
    assert_eq!(
        computes(&inst, &plan),
        vec![
            (0, 0, G1, 0, 10),
            (1, 0, G1, 10, 20),
            (0, 1, G2, 20, 32),
            (1, 1, G2, 32, 44)
        ]
    );
    let r = simulate(&inst, &plan).unwrap();
    assert_eq!(r.peak_mem, 3, "one block doubled at a time");
    inst.budget = MemoryBudget::OneFormPerBlock;
    assert_eq!(
        computes(&inst, &plan),
        vec![
            (0, 0, G2, 15, 27),
            (1, 0, G2, 30, 42),
            (0, 1, G2, 42, 54),
            (1, 1, G2, 54, 66)
        ]
    );
    // A byte budget below both forms of every block behaves as one form per block.
    inst.budget = MemoryBudget::Bytes(3);
    assert_eq!(computes(&inst, &plan)[0], (0, 0, G2, 15, 27));
    inst.budget = MemoryBudget::Bytes(1);
    assert!(
        simulate(&inst, &plan).is_err(),
        "budget below one form per block is refused"
    );
}

#[test]
fn partial_last_chunk_is_cheaper_on_g2() {
    // 300 tokens in chunks of 256 with G2 runs of 64: the second chunk has 44 tokens, one
    // G2 run (a quarter of a full chunk on G2) but a full padded G1 run.
    let mut p = npu_schedule::Profile::paper_phone();
    p.blocks.truncate(2);
    let inst = Instance::from_profile(&p, 300, MemoryBudget::OneFormPerBlock).unwrap();
    assert_eq!(inst.n_chunks, 2);
    assert_eq!(inst.g1[2], inst.g1[0]);
    assert_eq!(inst.g2[2], (29.824e6f64 / 4.0).round() as u64);
}

#[test]
fn invalid_plans_are_rejected() {
    let inst = small();
    let bad = [
        Plan {
            loads: load_list(&[(0, 0)]),
        },
        Plan {
            loads: load_list(&[(0, 0), (0, 1), (2, 1)]),
        },
        Plan {
            loads: load_list(&[(0, 3), (1, 1), (2, 4)]),
        },
        Plan {
            loads: load_list(&[(0, 0), (1, 1), (7, 1)]),
        },
        Plan {
            loads: load_list(&[(0, 0), (1, 1), (2, 7)]),
        },
    ];
    for p in &bad {
        assert!(simulate(&inst, p).is_err(), "{p:?} accepted");
    }
}

#[test]
fn no_switch_needed_means_the_ideal() {
    let mut inst = small();
    inst.switch_needed = false;
    for plan in [plan_sync(&inst), plan_async(&inst), plan_progressive(&inst)] {
        assert!(plan.loads.is_empty());
        let m = simulate(&inst, &plan).unwrap().metrics;
        assert_eq!((m.stall_ms, m.overhead_pct), (0.0, 0.0));
    }
}
