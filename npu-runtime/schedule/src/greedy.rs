//! The one-pass planners: `sync`, `async`, the paper's greedy (`progressive`) and its
//! work-conserving variant (`progressive-wc`). See [`crate::plan`] for what a plan means.

use super::error::Result;
use super::instance::Instance;
use super::plan::{Load, Plan};
use super::sim::{simulate, EventKind, Unit};

fn empty_if_no_switch(inst: &Instance) -> Option<Plan> {
    (!inst.switch_needed).then(Plan::default)
}

/// Synchronous: every block switches after prefill, in block order.
pub fn plan_sync(inst: &Instance) -> Plan {
    if let Some(p) = empty_if_no_switch(inst) {
        return p;
    }
    let end = inst.n_steps();
    Plan {
        loads: (0..inst.n_blocks)
            .map(|block| Load {
                block,
                release: end,
            })
            .collect(),
    }
}

/// Naive asynchronous: block `b` switches right after its step in the last chunk.
pub fn plan_async(inst: &Instance) -> Plan {
    if let Some(p) = empty_if_no_switch(inst) {
        return p;
    }
    let last_chunk = (inst.n_chunks - 1) * inst.n_blocks;
    Plan {
        loads: (0..inst.n_blocks)
            .map(|block| Load {
                block,
                release: last_chunk + block + 1,
            })
            .collect(),
    }
}

/// The paper's greedy (Eq. 1-2). Round by round from the first step: `Pi` is the next
/// step to compute and `Pj` the not-yet-switched block whose next compute lies furthest
/// ahead (the "last" block in compute order from `Pi`; a block with no compute left counts
/// as furthest). Pick the smallest `k >= 1` with
/// `switch(Pj) <= sum_{l<k} compute(P_{i+l}; current form)`, release `Pj`'s load at `Pi`
/// and advance by `k` steps. If even all steps before `Pj`'s next compute (or before the end
/// of prefill) cannot hide it, load it anyway and take the remaining wait. Blocks still
/// unswitched at the end of prefill switch afterwards.
pub fn plan_progressive(inst: &Instance) -> Plan {
    plan_progressive_from(inst, 0)
}

/// A work-conserving variant of the greedy, started at the best step. The loader is kept
/// busy: when a load ends, the next one is queued at once (released at the step in flight),
/// choosing the not-yet-switched block whose switch delays least, estimated from the
/// simulated timeline: idle loader time plus how late the switch ends after that block's
/// next step starts (or after prefill ends). Ties go to the block needed furthest ahead (the
/// paper's "last block"). The first switch is released at the start step that minimises
/// the simulated makespan (a 1-D search; ties go to the later start, which runs more steps
/// on the faster G1).
pub fn plan_progressive_wc(inst: &Instance) -> Result<Plan> {
    if let Some(p) = empty_if_no_switch(inst) {
        return Ok(p);
    }
    let mut best: Option<(u64, Plan)> = None;
    for start in (0..=inst.n_steps()).rev() {
        let plan = plan_work_conserving_from(inst, start, true)?;
        let span = simulate(inst, &plan)?.makespan();
        if best.as_ref().is_none_or(|(b, _)| span < *b) {
            best = Some((span, plan));
        }
    }
    Ok(best.map(|(_, p)| p).unwrap_or_default())
}

/// Completes a partial plan with the missing blocks switching after prefill.
fn completed(inst: &Instance, loads: &[Load]) -> Plan {
    let mut plan = Plan {
        loads: loads.to_vec(),
    };
    let have = plan.release_of(inst.n_blocks);
    for (block, r) in have.iter().enumerate() {
        if *r == usize::MAX {
            plan.loads.push(Load {
                block,
                release: inst.n_steps(),
            });
        }
    }
    plan
}

/// A candidate switch: (sort key, block, release step).
type Candidate = ((u64, usize, usize), usize, usize);

/// One decision of the work-conserving rule: the candidate switches `(key, block,
/// release)`, best first, or none when the rest can only switch after prefill.
fn wc_candidates(inst: &Instance, loads: &[Load], pos: usize) -> Result<Vec<Candidate>> {
    let n = inst.n_blocks;
    let steps = inst.n_steps();
    let sim = simulate(inst, &completed(inst, loads))?;
    // boundary[s]: when step s starts; boundary[steps]: prefill end.
    let mut boundary: Vec<u64> = sim
        .events
        .iter()
        .filter(|e| e.unit == Unit::Compute)
        .map(|e| e.start)
        .collect();
    boundary.push(sim.prefill_end);
    let loader_free = loads.last().map_or(0, |last| {
        sim.events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Load { block, .. } if block == last.block))
            .map(|e| e.end)
            .next_back()
            .unwrap_or(0)
    });
    let p = (pos..=steps)
        .take_while(|&s| boundary[s] <= loader_free)
        .last()
        .unwrap_or(pos);
    let switched = completed(inst, loads).release_of(n);
    let mut out = Vec::new();
    for (j, &rel) in switched.iter().enumerate() {
        if loads.iter().any(|l| l.block == j) || rel == usize::MAX {
            continue;
        }
        // Queue now (at the step in flight), or -- if that step is j's own, or to leave the
        // loader idle briefly -- at the next boundary.
        let own = p < steps && inst.block_of(p) == j;
        for r in [p + usize::from(own), p + 1 + usize::from(own)] {
            if r >= steps {
                continue;
            }
            let next = (r..steps).find(|&s| inst.block_of(s) == j).unwrap_or(steps);
            let begin = loader_free.max(boundary[r]);
            let finish = begin + inst.switch_cost(j);
            let delay = (begin - loader_free) + finish.saturating_sub(boundary[next]);
            // Least delay, then the block needed furthest ahead, then the higher index.
            out.push(((delay, steps - next, n - j), j, r));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The work-conserving rule from `start` (see [`plan_progressive_wc`]). With `rollout`,
/// each decision tries every candidate, completes the plan with the plain rule and keeps
/// the candidate whose completion simulates best.
pub fn plan_work_conserving_from(inst: &Instance, start: usize, rollout: bool) -> Result<Plan> {
    let mut loads: Vec<Load> = Vec::with_capacity(inst.n_blocks);
    let mut pos = start.min(inst.n_steps());
    loop {
        let cands = wc_candidates(inst, &loads, pos)?;
        let Some(&(_, j0, r0)) = cands.first() else {
            break;
        };
        let (j, r) = if rollout && cands.len() > 1 {
            let mut best = (u64::MAX, j0, r0);
            for &(_, j, r) in &cands {
                let mut trial = loads.clone();
                trial.push(Load {
                    block: j,
                    release: r,
                });
                let rest = plan_work_conserving_rest(inst, trial, r)?;
                let span = simulate(inst, &rest)?.makespan();
                if span < best.0 {
                    best = (span, j, r);
                }
            }
            (best.1, best.2)
        } else {
            (j0, r0)
        };
        loads.push(Load {
            block: j,
            release: r,
        });
        pos = r;
    }
    Ok(completed(inst, &loads))
}

fn plan_work_conserving_rest(
    inst: &Instance,
    mut loads: Vec<Load>,
    mut pos: usize,
) -> Result<Plan> {
    while let Some(&(_, j, r)) = wc_candidates(inst, &loads, pos)?.first() {
        loads.push(Load {
            block: j,
            release: r,
        });
        pos = r;
    }
    Ok(completed(inst, &loads))
}

/// The greedy rule with its first round at step `start` (no switch before it).
pub fn plan_progressive_from(inst: &Instance, start: usize) -> Plan {
    if let Some(p) = empty_if_no_switch(inst) {
        return p;
    }
    let n = inst.n_blocks;
    let steps = inst.n_steps();
    let mut switched = vec![false; n];
    let mut left = n;
    let mut loads = Vec::with_capacity(n);
    let mut pos = start.min(steps);
    while left > 0 && pos < steps {
        // Next step (at or after `pos`) of block `b`, or `steps` if none remains.
        let next_of = |b: usize| {
            let first = pos + (b + n - pos % n) % n;
            first.min(steps)
        };
        let j = (0..n)
            .filter(|&b| !switched[b])
            .max_by_key(|&b| (next_of(b), b))
            .expect("left > 0");
        let limit = next_of(j) - pos;
        if limit == 0 {
            // Pj is the block about to compute: let it compute, decide again after it.
            pos += 1;
            continue;
        }
        let cost = inst.switch_cost(j);
        let mut acc = 0u64;
        let mut k = limit;
        for l in 0..limit {
            let s = pos + l;
            let b = inst.block_of(s);
            acc += if switched[b] { inst.g2[s] } else { inst.g1[s] };
            if acc >= cost {
                k = l + 1;
                break;
            }
        }
        loads.push(Load {
            block: j,
            release: pos,
        });
        switched[j] = true;
        left -= 1;
        pos += k;
    }
    for (block, done) in switched.iter().enumerate() {
        if !done {
            loads.push(Load {
                block,
                release: steps,
            });
        }
    }
    Plan { loads }
}
