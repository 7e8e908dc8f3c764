//! What a schedule is: a [`Plan`] lists the G2 loads in loader order.
//!
//! Load `k` is *released* at compute step `release` (`0..=n_steps`; `n_steps` means "after
//! prefill"): it is ordered before that step, so it starts no earlier than the moment step
//! `release` could start, and every step of its block from `release` on runs on G2 (waiting
//! for the load if needed). Steps of the block before `release` run on G1 and have ended
//! before the load starts, so a block never computes while its own switch is in flight.
//! Releases must not decrease along the loader order (a later-queued load cannot be needed
//! earlier); each block loads exactly once.

use super::error::{Result, ScheduleError};
use super::instance::Instance;
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
