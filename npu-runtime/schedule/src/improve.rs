//! `progressive-ls`: the greedy's plans improved by local search on the simulator.
//!
//! The paper's rule (and our work-conserving variant) decide each switch once, looking
//! only at the next few steps. Where they lose to the optimum the plan is usually a few
//! moves away from it: a switch released one step too early (its block then runs one more
//! chunk on the slower G2), two blocks loaded in the wrong order, or a whole tail of
//! switches that should move later together. This planner starts from the plans of
//! `progressive`, `progressive-wc`, `sync` and `async`, and from each applies the best
//! strictly improving move, evaluated by the same simulator that scores every schedule,
//! until none improves:
//!
//! - *relocate*: take one block's switch out and put it back at any position of the loader
//!   order with any release the neighbouring releases allow;
//! - *swap*: exchange the blocks of two switches (releases stay);
//! - *shift*: move the releases of every switch from position `p` on (or up to `p`) by the
//!   same number of steps, clamped to keep them in order and in range.
//!
//! One pass looks at O(n·(steps + n)) plans of n blocks and `steps` steps, each simulated
//! in O(steps + n); at most `n·(steps + 1)` passes run per start, so the planner is
//! polynomial (in practice a few passes). It is never worse than `progressive` or
//! `progressive-wc`: their plans are starting points and moves only ever improve.

use super::error::Result;
use super::greedy::{plan_async, plan_progressive, plan_progressive_wc, plan_sync};
use super::instance::Instance;
use super::plan::{Load, Plan};
use super::sim::makespan_of_valid;

/// The best plan found from every starting plan (see the module docs).
pub fn plan_local_search(inst: &Instance) -> Result<Plan> {
    if !inst.switch_needed {
        return Ok(Plan::default());
    }
    inst.validate()?;
    let starts = [
        plan_progressive(inst),
        plan_progressive_wc(inst)?,
        plan_sync(inst),
        plan_async(inst),
    ];
    let mut best: Option<(u64, Plan)> = None;
    for start in starts {
        let (span, plan) = improve(inst, start)?;
        if best.as_ref().is_none_or(|(b, _)| span < *b) {
            best = Some((span, plan));
        }
    }
    Ok(best.map(|(_, p)| p).unwrap_or_default())
}

/// Local search from `plan` until no move improves it; returns (makespan, plan).
pub fn improve(inst: &Instance, plan: Plan) -> Result<(u64, Plan)> {
    plan.validate(inst)?;
    let mut cur = plan;
    let mut cur_span = makespan_of_valid(inst, &cur);
    if cur.loads.is_empty() {
        return Ok((cur_span, cur));
    }
    let passes = inst.n_blocks * (inst.n_steps() + 1);
    let mut trial = cur.clone();
    for _ in 0..passes {
        let mut best: Option<(u64, Plan)> = None;
        for_each_neighbour(inst, &cur, &mut trial, &mut |cand: &Plan| {
            let span = makespan_of_valid(inst, cand);
            if span < best.as_ref().map_or(cur_span, |(b, _)| *b) {
                best = Some((span, cand.clone()));
            }
        });
        match best {
            Some((span, plan)) => {
                cur = plan;
                cur_span = span;
            }
            None => break,
        }
    }
    Ok((cur_span, cur))
}

/// Calls `f` on every plan one move away from `cur` (see the module docs). `trial` is
/// scratch space; every plan passed to `f` is valid.
fn for_each_neighbour(inst: &Instance, cur: &Plan, trial: &mut Plan, f: &mut impl FnMut(&Plan)) {
    let n = cur.loads.len();
    let steps = inst.n_steps();
    // Relocate one switch.
    for i in 0..n {
        let moved = cur.loads[i].block;
        let rest: Vec<Load> = cur
            .loads
            .iter()
            .enumerate()
            .filter(|&(k, _)| k != i)
            .map(|(_, l)| *l)
            .collect();
        for p in 0..=rest.len() {
            let lo = if p > 0 { rest[p - 1].release } else { 0 };
            let hi = rest.get(p).map_or(steps, |l| l.release);
            for r in lo..=hi {
                if p == i && r == cur.loads[i].release {
                    continue;
                }
                trial.loads.clear();
                trial.loads.extend_from_slice(&rest[..p]);
                trial.loads.push(Load {
                    block: moved,
                    release: r,
                });
                trial.loads.extend_from_slice(&rest[p..]);
                f(trial);
            }
        }
    }
    // Swap the blocks of two switches.
    for i in 0..n {
        for j in i + 1..n {
            trial.loads.clone_from(&cur.loads);
            let (a, b) = (trial.loads[i].block, trial.loads[j].block);
            trial.loads[i].block = b;
            trial.loads[j].block = a;
            f(trial);
        }
    }
    // Shift a tail (positions p..) or a head (..=p) of the releases together.
    for p in 0..n {
        let lo = if p > 0 { cur.loads[p - 1].release } else { 0 };
        let hi = cur.loads.get(p + 1).map_or(steps, |l| l.release);
        for delta in -(steps as i64)..=steps as i64 {
            if delta == 0 {
                continue;
            }
            let shift = |r: usize, lo: usize, hi: usize| {
                (r as i64 + delta).clamp(lo as i64, hi as i64) as usize
            };
            trial.loads.clone_from(&cur.loads);
            for l in &mut trial.loads[p..] {
                l.release = shift(l.release, lo, steps);
            }
            if trial.loads != cur.loads {
                f(trial);
            }
            if p + 1 < n {
                trial.loads.clone_from(&cur.loads);
                for l in &mut trial.loads[..=p] {
                    l.release = shift(l.release, 0, hi);
                }
                if trial.loads != cur.loads {
                    f(trial);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::simulate;

    fn lcg(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *seed >> 33
    }

    fn random_instance(seed: &mut u64) -> Instance {
        let n = 1 + (lcg(seed) % 5) as usize;
        let c = 1 + (lcg(seed) % 3) as usize;
        let mut inst = Instance::uniform(n, c, 0, 0, 0, 0, 3);
        for s in 0..n * c {
            inst.g1[s] = 1 + lcg(seed) % 40;
            inst.g2[s] = inst.g1[s] + lcg(seed) % 30;
        }
        for b in 0..n {
            inst.load[b] = lcg(seed) % 60;
            inst.unload[b] = lcg(seed) % 10;
        }
        inst
    }

    #[test]
    fn every_neighbour_is_a_valid_plan_and_moves_only_improve() {
        let mut seed = 7;
        for _ in 0..100 {
            let inst = random_instance(&mut seed);
            let start = plan_progressive(&inst);
            let mut trial = start.clone();
            let mut count = 0;
            for_each_neighbour(&inst, &start, &mut trial, &mut |p: &Plan| {
                assert!(p.validate(&inst).is_ok(), "{p:?} on {inst:?}");
                count += 1;
            });
            assert!(inst.n_blocks == 1 || count > 0);
            let before = simulate(&inst, &start).unwrap().makespan();
            let (span, plan) = improve(&inst, start).unwrap();
            assert!(span <= before);
            assert_eq!(simulate(&inst, &plan).unwrap().makespan(), span);
        }
    }

    #[test]
    fn no_switch_needed_gives_the_empty_plan() {
        let mut inst = Instance::uniform(3, 2, 10, 12, 5, 0, 1);
        inst.switch_needed = false;
        assert_eq!(plan_local_search(&inst).unwrap(), Plan::default());
    }
}
