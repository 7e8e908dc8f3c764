//! A scheduling problem for one prompt: integer nanosecond costs per (block, chunk) step.
//!
//! Integer time keeps the simulator, the planners and the exact solver exactly consistent
//! (ties are well defined, no float drift between a plan's prediction and its simulation).

use super::error::{Result, ScheduleError};
use super::profile::Profile;

/// How many graph forms may be resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryBudget {
    /// At most one form per block (phone-like): a switch tears G1 down, then loads G2,
    /// and the block cannot compute while it switches.
    OneFormPerBlock,
    /// A byte budget. When both forms of every block fit, a block's G2 loads while its G1
    /// stays resident and usable, and G1 is dropped off the loader's critical path. A budget
    /// smaller than that is treated as one form per block (conservative: per-moment
    /// accounting of partially doubled residency is not modelled).
    Bytes(u64),
}

/// Times are nanoseconds. Step `s` is chunk `s / n_blocks`, block `s % n_blocks`.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    pub n_blocks: usize,
    pub n_chunks: usize,
    /// Compute time of each step on G1 (index `chunk * n_blocks + block`).
    pub g1: Vec<u64>,
    /// Compute time of each step on G2.
    pub g2: Vec<u64>,
    /// Load time of each block's G2 form.
    pub load: Vec<u64>,
    /// Teardown time of each block's G1 form.
    pub unload: Vec<u64>,
    pub mem_g1: Vec<u64>,
    pub mem_g2: Vec<u64>,
    pub decode_step: u64,
    pub budget: MemoryBudget,
    /// False when no switch exists (one form serves both shapes).
    pub switch_needed: bool,
}

/// Milliseconds to integer nanoseconds.
pub fn ms_to_ns(ms: f64) -> u64 {
    (ms * 1.0e6).round().max(0.0) as u64
}

pub fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1.0e6
}

impl Instance {
    /// Builds the problem for a prompt of `prompt_tokens` tokens. The last chunk may be
    /// partial: on G1 it is padded (a full G1 run); on G2 it needs only
    /// `ceil(rest / g2_tokens)` runs, so it is cheaper there.
    pub fn from_profile(
        p: &Profile,
        prompt_tokens: usize,
        budget: MemoryBudget,
    ) -> Result<Instance> {
        p.validate()?;
        if prompt_tokens == 0 {
            return Err(ScheduleError::Profile("prompt has no tokens".into()));
        }
        let n = p.n_blocks();
        let c = p.n_chunks(prompt_tokens);
        let runs_full = p.chunk_tokens / p.g2_tokens;
        let mut g1 = Vec::with_capacity(n * c);
        let mut g2 = Vec::with_capacity(n * c);
        for chunk in 0..c {
            let tokens = (prompt_tokens - chunk * p.chunk_tokens).min(p.chunk_tokens);
            let runs = tokens.div_ceil(p.g2_tokens);
            for b in &p.blocks {
                g1.push(ms_to_ns(b.g1_chunk_ms));
                g2.push(ms_to_ns(b.g2_chunk_ms * runs as f64 / runs_full as f64));
            }
        }
        let inst = Instance {
            n_blocks: n,
            n_chunks: c,
            g1,
            g2,
            load: p.blocks.iter().map(|b| ms_to_ns(b.load_g2_ms)).collect(),
            unload: p.blocks.iter().map(|b| ms_to_ns(b.unload_g1_ms)).collect(),
            mem_g1: p.blocks.iter().map(|b| b.mem_g1_bytes).collect(),
            mem_g2: p.blocks.iter().map(|b| b.mem_g2_bytes).collect(),
            decode_step: ms_to_ns(p.decode_step_ms),
            budget,
            switch_needed: p.switch_needed,
        };
        inst.validate()?;
        Ok(inst)
    }

    /// A uniform instance (same costs for every step), handy for tests and examples.
    #[allow(clippy::too_many_arguments)]
    pub fn uniform(
        n_blocks: usize,
        n_chunks: usize,
        g1: u64,
        g2: u64,
        load: u64,
        unload: u64,
        decode_step: u64,
    ) -> Instance {
        Instance {
            n_blocks,
            n_chunks,
            g1: vec![g1; n_blocks * n_chunks],
            g2: vec![g2; n_blocks * n_chunks],
            load: vec![load; n_blocks],
            unload: vec![unload; n_blocks],
            mem_g1: vec![1; n_blocks],
            mem_g2: vec![1; n_blocks],
            decode_step,
            budget: MemoryBudget::OneFormPerBlock,
            switch_needed: true,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let n = self.n_blocks;
        let steps = n.saturating_mul(self.n_chunks);
        let bad = |m: &str| Err(ScheduleError::Profile(m.to_string()));
        if n == 0 || self.n_chunks == 0 {
            return bad("instance needs at least one block and one chunk");
        }
        if self.g1.len() != steps || self.g2.len() != steps {
            return bad("per-step cost tables have the wrong length");
        }
        if [&self.load, &self.unload, &self.mem_g1, &self.mem_g2]
            .iter()
            .any(|v| v.len() != n)
        {
            return bad("per-block tables have the wrong length");
        }
        if let MemoryBudget::Bytes(b) = self.budget {
            let need: u64 = (0..n).map(|i| self.mem_g1[i].max(self.mem_g2[i])).sum();
            if b < need {
                return Err(ScheduleError::Profile(format!(
                    "memory budget {b} B is below one form per block ({need} B)"
                )));
            }
        }
        Ok(())
    }

    pub fn n_steps(&self) -> usize {
        self.n_blocks * self.n_chunks
    }

    pub fn block_of(&self, step: usize) -> usize {
        step % self.n_blocks
    }

    pub fn chunk_of(&self, step: usize) -> usize {
        step / self.n_blocks
    }

    /// True when both forms of every block fit the budget (see [`MemoryBudget::Bytes`]).
    pub fn double_resident(&self) -> bool {
        match self.budget {
            MemoryBudget::OneFormPerBlock => false,
            MemoryBudget::Bytes(b) => {
                let both: u64 = (0..self.n_blocks)
                    .map(|i| self.mem_g1[i] + self.mem_g2[i])
                    .sum();
                b >= both
            }
        }
    }

    /// Loader occupancy of one switch: teardown of G1 plus load of G2 with one form per
    /// block; the load alone when G1 may stay resident while G2 loads.
    pub fn switch_cost(&self, block: usize) -> u64 {
        if self.double_resident() {
            self.load[block]
        } else {
            self.unload[block] + self.load[block]
        }
    }

    /// Prefill completion with every block on G1 and no switching at all.
    pub fn ideal_prefill(&self) -> u64 {
        self.g1.iter().sum()
    }

    /// Time to first decoded token of the ideal run (G2 already resident, no switch).
    pub fn ideal_ttft(&self) -> u64 {
        self.ideal_prefill() + self.decode_step
    }
}
