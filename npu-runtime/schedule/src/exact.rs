//! Exact solver for small instances (the problem is NP-hard, paper appendix A).
//!
//! Dynamic programming over step boundaries. The state before step `k` is the set of
//! blocks whose switch has started, the block whose switch is still in flight (at most
//! one: the loader is serial), the compute-free time `T` and the loader-free time `F`.
//! With one form per block, a step's form depends only on that set, and every later time is
//! a max-plus function of (T, F), so a state with smaller-or-equal (T, F) and the same set
//! and in-flight block dominates: each key keeps a Pareto front.
//!
//! Completeness: for a fixed choice of which steps of each block run on G1 and a fixed
//! loader order, starting each load as early as allowed never hurts (times only move
//! earlier). So loads start either when the loader frees up or at a step boundary. Per step
//! the transitions are: optionally switch the block about to compute first (the step then
//! waits and runs on G2), run the step, and let the loader chain loads of other blocks
//! during it: a set that completes within the step (order irrelevant) plus optionally one
//! that is still in flight when the step ends. Tests compare this with brute force over all
//! plans on small instances.

use super::error::{Result, ScheduleError};
use super::greedy::{plan_progressive, plan_sync};
use super::instance::Instance;
use super::plan::{Load, Plan};
use super::sim::simulate;
use std::collections::HashMap;

/// Largest instances the solver accepts.
pub const MAX_BLOCKS: usize = 12;
pub const MAX_STEPS: usize = 64;
/// Node budget: beyond it the solver gives up with [`ScheduleError::TooLarge`].
pub const MAX_NODES: usize = 3_000_000;

#[derive(Debug, Clone, PartialEq)]
pub struct Solution {
    pub plan: Plan,
    /// `max(prefill completion, switch completion)` in ns.
    pub makespan: u64,
    /// DP nodes created (a measure of the search effort).
    pub nodes: usize,
}

struct Node {
    t: u64,
    f: u64,
    parent: u32,
    /// Boundary this node's transition started from (the release of its added loads).
    release: u32,
    added_at: u32,
    added_len: u8,
}

const ROOT: u32 = u32::MAX;
const NONE: u8 = u8::MAX;

/// Solves `inst` exactly (one form per block).
pub fn solve(inst: &Instance) -> Result<Solution> {
    inst.validate()?;
    if !inst.switch_needed {
        let sim = simulate(inst, &Plan::default())?;
        return Ok(Solution {
            plan: Plan::default(),
            makespan: sim.makespan(),
            nodes: 0,
        });
    }
    if inst.double_resident() {
        return Err(ScheduleError::Unsupported(
            "the exact solver models one form per block; with both forms resident a step's form depends on timing".into(),
        ));
    }
    let n = inst.n_blocks;
    let steps = inst.n_steps();
    if n > MAX_BLOCKS || steps > MAX_STEPS {
        return Err(ScheduleError::TooLarge(format!(
            "{n} blocks x {} chunks (limits: {MAX_BLOCKS} blocks, {MAX_STEPS} steps)",
            inst.n_chunks
        )));
    }
    let cost: Vec<u64> = (0..n).map(|b| inst.switch_cost(b)).collect();
    // Upper bound from the greedy prunes states that cannot beat it.
    let ub = simulate(inst, &plan_progressive(inst))?
        .makespan()
        .min(simulate(inst, &plan_sync(inst))?.makespan());
    // Least compute left from each boundary (either form).
    let mut rest = vec![0u64; steps + 1];
    for s in (0..steps).rev() {
        rest[s] = rest[s + 1] + inst.g1[s].min(inst.g2[s]);
    }
    let full: u32 = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
    let load_left = |mask: u32| -> u64 {
        (0..n)
            .filter(|&b| mask & (1 << b) == 0)
            .map(|b| cost[b])
            .sum()
    };

    let mut nodes: Vec<Node> = vec![Node {
        t: 0,
        f: 0,
        parent: ROOT,
        release: 0,
        added_at: 0,
        added_len: 0,
    }];
    let mut pool: Vec<u8> = Vec::new();
    let mut layer: HashMap<(u32, u8), Vec<u32>> = HashMap::new();
    layer.insert((0, NONE), vec![0]);

    for k in 0..steps {
        let b = inst.block_of(k);
        let bit = 1u32 << b;
        let mut next: HashMap<(u32, u8), Vec<u32>> = HashMap::new();
        let mut keys: Vec<_> = layer.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            let (mask, inflight) = key;
            for &id in &layer[&key] {
                let (t, f) = (nodes[id as usize].t, nodes[id as usize].f);
                for switch_first in [false, true] {
                    if switch_first && mask & bit != 0 {
                        continue;
                    }
                    let (mask1, f1, cstart) = if switch_first {
                        let done = f.max(t) + cost[b];
                        (mask | bit, done, done)
                    } else if inflight == b as u8 {
                        (mask, f, t.max(f))
                    } else {
                        (mask, f, t)
                    };
                    let dur = if mask1 & bit != 0 {
                        inst.g2[k]
                    } else {
                        inst.g1[k]
                    };
                    let end = cstart + dur;
                    let first: &[u8] = if switch_first { &[b as u8] } else { &[] };
                    let base_inflight = if f1 > end { inflight } else { NONE };
                    let mut emit = |mask2: u32,
                                    infl: u8,
                                    f2: u64,
                                    extra: &[u8],
                                    nodes: &mut Vec<Node>,
                                    pool: &mut Vec<u8>| {
                        let f2 = f2.max(end);
                        let lb = (end + rest[k + 1]).max(f2 + load_left(mask2));
                        if lb > ub {
                            return;
                        }
                        let front = next.entry((mask2, infl)).or_default();
                        if front
                            .iter()
                            .any(|&o| nodes[o as usize].t <= end && nodes[o as usize].f <= f2)
                        {
                            return;
                        }
                        front.retain(|&o| {
                            !(end <= nodes[o as usize].t && f2 <= nodes[o as usize].f)
                        });
                        let added_at = pool.len() as u32;
                        pool.extend_from_slice(first);
                        pool.extend_from_slice(extra);
                        nodes.push(Node {
                            t: end,
                            f: f2,
                            parent: id,
                            release: k as u32,
                            added_at,
                            added_len: (first.len() + extra.len()) as u8,
                        });
                        front.push((nodes.len() - 1) as u32);
                    };
                    emit(mask1, base_inflight, f1, &[], &mut nodes, &mut pool);
                    let l0 = f1.max(cstart);
                    if l0 >= end {
                        continue;
                    }
                    let cands: Vec<usize> = (0..n)
                        .filter(|&x| x != b && mask1 & (1 << x) == 0)
                        .collect();
                    // Subsets D completing within the step, plus optionally one load x in flight at its end.
                    let m = cands.len();
                    for sub in 0u32..(1u32 << m) {
                        let mut sum = 0u64;
                        let mut dmask = 0u32;
                        let mut list: Vec<u8> = Vec::new();
                        for (i, &x) in cands.iter().enumerate() {
                            if sub & (1 << i) != 0 {
                                sum += cost[x];
                                dmask |= 1 << x;
                                list.push(x as u8);
                            }
                        }
                        if l0 + sum > end {
                            continue;
                        }
                        if sub != 0 {
                            emit(mask1 | dmask, NONE, l0 + sum, &list, &mut nodes, &mut pool);
                        }
                        let st = l0 + sum;
                        if st >= end {
                            continue;
                        }
                        for &x in &cands {
                            if dmask & (1 << x) == 0 && st + cost[x] > end {
                                list.push(x as u8);
                                emit(
                                    mask1 | dmask | (1 << x),
                                    x as u8,
                                    st + cost[x],
                                    &list,
                                    &mut nodes,
                                    &mut pool,
                                );
                                list.pop();
                            }
                        }
                    }
                    if nodes.len() > MAX_NODES {
                        return Err(ScheduleError::TooLarge(format!(
                            "more than {MAX_NODES} search states at step {k} of {steps}"
                        )));
                    }
                }
            }
        }
        layer = next;
    }
    // After prefill: the remaining blocks switch back to back (order is irrelevant).
    let mut best: Option<(u64, u32)> = None;
    for (&(mask, _), ids) in &layer {
        for &id in ids {
            let nd = &nodes[id as usize];
            let left = load_left(mask);
            let sw = if mask == full {
                nd.f
            } else {
                nd.f.max(nd.t) + left
            };
            let span = nd.t.max(sw);
            if best.is_none_or(|(bs, bid)| (span, id) < (bs, bid)) {
                best = Some((span, id));
            }
        }
    }
    let (makespan, mut id) =
        best.ok_or_else(|| ScheduleError::Plan("exact solver found no schedule".into()))?;
    let final_mask = {
        let mut m = 0u32;
        let mut at = id;
        while at != ROOT {
            let nd = &nodes[at as usize];
            for &x in &pool[nd.added_at as usize..nd.added_at as usize + nd.added_len as usize] {
                m |= 1 << x;
            }
            at = nd.parent;
        }
        m
    };
    let mut rev: Vec<Vec<Load>> = Vec::new();
    while id != ROOT {
        let nd = &nodes[id as usize];
        let adds = &pool[nd.added_at as usize..nd.added_at as usize + nd.added_len as usize];
        rev.push(
            adds.iter()
                .map(|&x| Load {
                    block: x as usize,
                    release: nd.release as usize,
                })
                .collect(),
        );
        id = nd.parent;
    }
    let mut loads: Vec<Load> = rev.into_iter().rev().flatten().collect();
    for block in 0..n {
        if final_mask & (1 << block) == 0 {
            loads.push(Load {
                block,
                release: steps,
            });
        }
    }
    let plan = Plan { loads };
    let nodes_made = nodes.len();
    Ok(Solution {
        plan,
        makespan,
        nodes: nodes_made,
    })
}
