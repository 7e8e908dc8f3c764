//! Backend-agnostic warm-up profiling through [`ScheduleExecutor`].
//!
//! Each repetition runs one prefill chunk through all blocks on G1 (timing every block),
//! switches every block to G2 (timing teardown and load), runs the same chunk on G2, times
//! one decode step, then switches back to G1. The per-block figure is the median over
//! repetitions, which shrugs off a cold first run.

use super::exec::ScheduleExecutor;
use super::plan::Form;
use super::profile::{BlockProfile, Profile, PROFILE_FORMAT};
use super::{Result, ScheduleError};
use std::time::Instant;

/// Identity and shape of what is being profiled.
#[derive(Debug, Clone)]
pub struct WarmupConfig {
    pub model: String,
    pub backend: String,
    pub machine: String,
    pub chunk_tokens: usize,
    pub g2_tokens: usize,
    /// Layer range label per block.
    pub layers: Vec<String>,
    /// Timed repetitions (at least 1).
    pub reps: usize,
    /// See [`Profile::switch_needed`].
    pub switch_needed: bool,
}

/// Milliseconds, rounded to the microsecond (finer digits are noise and bloat the file).
fn timed(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok((t.elapsed().as_secs_f64() * 1e6).round() / 1e3)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let m = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (m * 1e3).round() / 1e3
}

/// Profiles `exec` (all blocks must be on G1 on entry; they are on G1 again on return).
pub fn warmup_profile<E: ScheduleExecutor>(exec: &E, cfg: &WarmupConfig) -> Result<Profile> {
    let n = cfg.layers.len();
    if n == 0 || cfg.reps == 0 {
        return Err(ScheduleError::Profile(
            "warm-up needs at least one block and one repetition".into(),
        ));
    }
    let mut g1 = vec![Vec::new(); n];
    let mut g2 = vec![Vec::new(); n];
    let mut load = vec![Vec::new(); n];
    let mut unload = vec![Vec::new(); n];
    let mut decode = Vec::new();
    for _ in 0..cfg.reps {
        exec.begin_prefill()?;
        for (b, t) in g1.iter_mut().enumerate() {
            t.push(timed(|| exec.compute(b, 0, Form::G1))?);
        }
        for b in 0..n {
            unload[b].push(timed(|| exec.unload(b, Form::G1))?);
            load[b].push(timed(|| exec.load(b, Form::G2))?);
        }
        exec.begin_prefill()?;
        for (b, t) in g2.iter_mut().enumerate() {
            t.push(timed(|| exec.compute(b, 0, Form::G2))?);
        }
        decode.push(timed(|| exec.decode())?);
        for b in 0..n {
            exec.unload(b, Form::G2)?;
            exec.load(b, Form::G1)?;
        }
    }
    let blocks = (0..n)
        .map(|b| BlockProfile {
            layers: cfg.layers[b].clone(),
            g1_chunk_ms: median(&mut g1[b]),
            g2_chunk_ms: median(&mut g2[b]),
            load_g2_ms: median(&mut load[b]),
            unload_g1_ms: median(&mut unload[b]),
            mem_g1_bytes: exec.form_bytes(b, Form::G1),
            mem_g2_bytes: exec.form_bytes(b, Form::G2),
        })
        .collect();
    let p = Profile {
        format: PROFILE_FORMAT.into(),
        model: cfg.model.clone(),
        backend: cfg.backend.clone(),
        machine: cfg.machine.clone(),
        source: format!("measured by warm-up ({} repetitions, medians)", cfg.reps),
        chunk_tokens: cfg.chunk_tokens,
        g2_tokens: cfg.g2_tokens,
        decode_step_ms: median(&mut decode),
        switch_needed: cfg.switch_needed,
        blocks,
    };
    p.validate()?;
    Ok(p)
}
