//! The schedules by name, and the planner behind each.

use super::error::{Result, ScheduleError};
use super::greedy::{plan_async, plan_progressive, plan_progressive_wc, plan_sync};
use super::instance::Instance;
use super::plan::Plan;
use super::{exact, improve};

/// The schedules the benchmark compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// All prefill on G1, then every block switches (the monolithic stall).
    Sync,
    /// Naive asynchronous: each block switches right after its last chunk.
    Async,
    /// The paper's greedy (Eq. 1-2), started at the first step as in the paper.
    Progressive,
    /// The same rule started at the step that minimises the simulated makespan (a 1-D
    /// search; it switches as late as the loads can still be hidden).
    ProgressiveWc,
    /// `progressive` and `progressive-wc` improved by local search on the simulator
    /// ([`improve`]); never worse than either.
    ProgressiveLs,
    /// Exact optimum (small instances only).
    Optimal,
}

impl ScheduleKind {
    pub const ALL: [ScheduleKind; 6] = [
        ScheduleKind::Sync,
        ScheduleKind::Async,
        ScheduleKind::Progressive,
        ScheduleKind::ProgressiveWc,
        ScheduleKind::ProgressiveLs,
        ScheduleKind::Optimal,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Sync => "sync",
            ScheduleKind::Async => "async",
            ScheduleKind::Progressive => "progressive",
            ScheduleKind::ProgressiveWc => "progressive-wc",
            ScheduleKind::ProgressiveLs => "progressive-ls",
            ScheduleKind::Optimal => "optimal",
        }
    }

    pub fn parse(s: &str) -> Result<ScheduleKind> {
        ScheduleKind::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| {
                ScheduleError::Plan(format!(
                    "unknown schedule {s:?} (known: sync, async, progressive, progressive-wc, progressive-ls, optimal)"
                ))
            })
    }

    /// Builds this kind's plan for an instance.
    pub fn plan(self, inst: &Instance) -> Result<Plan> {
        match self {
            ScheduleKind::Sync => Ok(plan_sync(inst)),
            ScheduleKind::Async => Ok(plan_async(inst)),
            ScheduleKind::Progressive => Ok(plan_progressive(inst)),
            ScheduleKind::ProgressiveWc => plan_progressive_wc(inst),
            ScheduleKind::ProgressiveLs => improve::plan_local_search(inst),
            ScheduleKind::Optimal => exact::solve(inst).map(|s| s.plan),
        }
    }
}
