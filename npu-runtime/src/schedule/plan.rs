//! Schedules and the planners that produce them.
//!
//! A [`Plan`] lists the G2 loads in loader order. Load `k` is *released* at compute step
//! `release` (`0..=n_steps`; `n_steps` means "after prefill"): it is ordered before that
//! step, so it starts no earlier than the moment step `release` could start, and every step
//! of its block from `release` on runs on G2 (waiting for the load if needed). Steps of the
//! block before `release` run on G1 and have ended before the load starts, so a block never
//! computes while its own switch is in flight. Releases must not decrease along the loader
//! order (a later-queued load cannot be needed earlier); each block loads exactly once.

use super::instance::Instance;
use super::{Result, ScheduleError};

/// A graph form of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Form {
    /// Prefill-shaped graph.
    G1,
    /// Decode/verify-shaped graph.
    G2,
}

/// One switch of one block to G2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub block: usize,
    pub release: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    pub loads: Vec<Load>,
}

/// The schedules the benchmark compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// All prefill on G1, then every block switches (the monolithic stall).
    Sync,
    /// Naive asynchronous: each block switches right after its last chunk.
    Async,
    /// The paper's greedy (Eq. 1-2).
    Progressive,
    /// Exact optimum (small instances only).
    Optimal,
}

impl ScheduleKind {
    pub const ALL: [ScheduleKind; 4] = [
        ScheduleKind::Sync,
        ScheduleKind::Async,
        ScheduleKind::Progressive,
        ScheduleKind::Optimal,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Sync => "sync",
            ScheduleKind::Async => "async",
            ScheduleKind::Progressive => "progressive",
            ScheduleKind::Optimal => "optimal",
        }
    }

    pub fn parse(s: &str) -> Result<ScheduleKind> {
        ScheduleKind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| {
                ScheduleError::Plan(format!(
                    "unknown schedule {s:?} (known: sync, async, progressive, optimal)"
                ))
            })
    }

    /// Builds this kind's plan for an instance.
    pub fn plan(self, inst: &Instance) -> Result<Plan> {
        match self {
            ScheduleKind::Sync => Ok(plan_sync(inst)),
            ScheduleKind::Async => Ok(plan_async(inst)),
            ScheduleKind::Progressive => Ok(plan_progressive(inst)),
            ScheduleKind::Optimal => super::exact::solve(inst).map(|s| s.plan),
        }
    }
}

impl Plan {
    /// Checks the plan against an instance: each block once, releases in range and
    /// non-decreasing. With `switch_needed == false` the only valid plan is empty.
    pub fn validate(&self, inst: &Instance) -> Result<()> {
        let bad = |m: String| Err(ScheduleError::Plan(m));
        if !inst.switch_needed {
            if !self.loads.is_empty() {
                return bad("this backend needs no switch, the plan must be empty".into());
            }
            return Ok(());
        }
        if self.loads.len() != inst.n_blocks {
            return bad(format!(
                "{} loads for {} blocks",
                self.loads.len(),
                inst.n_blocks
            ));
        }
        let mut seen = vec![false; inst.n_blocks];
        let mut last = 0;
        for (k, l) in self.loads.iter().enumerate() {
            if l.block >= inst.n_blocks {
                return bad(format!("load {k}: block {} out of range", l.block));
            }
            if std::mem::replace(&mut seen[l.block], true) {
                return bad(format!("block {} loads twice", l.block));
            }
            if l.release > inst.n_steps() {
                return bad(format!("load {k}: release {} after prefill end", l.release));
            }
            if l.release < last {
                return bad(format!(
                    "load {k}: release {} before the previous load's {last}",
                    l.release
                ));
            }
            last = l.release;
        }
        Ok(())
    }

    /// Release step of each block's load (`usize::MAX` if the block never loads).
    pub fn release_of(&self, n_blocks: usize) -> Vec<usize> {
        let mut r = vec![usize::MAX; n_blocks];
        for l in &self.loads {
            if l.block < n_blocks {
                r[l.block] = l.release;
            }
        }
        r
    }
}

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
    if let Some(p) = empty_if_no_switch(inst) {
        return p;
    }
    let n = inst.n_blocks;
    let steps = inst.n_steps();
    let mut switched = vec![false; n];
    let mut left = n;
    let mut loads = Vec::with_capacity(n);
    let mut pos = 0usize;
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
