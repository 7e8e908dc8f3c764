//! Real execution of a [`Plan`]: the compute steps run on the calling thread, the switches
//! on a background loader thread, with the same release semantics as the simulator.

use super::instance::Instance;
use super::plan::{Form, Plan};
use super::sim::{Event, EventKind, Metrics, Unit};
use super::{Result, ScheduleError};
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// What the scheduler needs from a backend. Calls for different blocks may run
/// concurrently (compute on one thread, load/unload on another), so implementations must be
/// `Sync`. With one form per block the scheduler never computes a block while it switches.
pub trait ScheduleExecutor: Sync {
    /// Resets per-prompt state (KV cache, activations) before a prefill.
    fn begin_prefill(&self) -> Result<()>;
    /// Runs `block` over prefill chunk `chunk` with `form` (G2: the chunk in G2-sized runs).
    /// Its input is `block - 1`'s output for the same chunk (the embeddings for block 0).
    fn compute(&self, block: usize, chunk: usize, form: Form) -> Result<()>;
    /// Makes `form` of `block` resident (called on the loader thread).
    fn load(&self, block: usize, form: Form) -> Result<()>;
    /// Releases `form` of `block`.
    fn unload(&self, block: usize, form: Form) -> Result<()>;
    /// One decode step through all blocks on G2 (the first decoded token).
    fn decode(&self) -> Result<()>;
    /// Resident bytes of `form` of `block`.
    fn form_bytes(&self, block: usize, form: Form) -> u64;
}

/// What a real run did and how long it took.
#[derive(Debug, Clone)]
pub struct ExecReport {
    /// Intervals in ns since the start of prefill.
    pub events: Vec<Event>,
    pub forms: Vec<Form>,
    pub prefill_end: u64,
    pub switch_end: u64,
    /// End of the first decode step.
    pub ttft: u64,
}

impl ExecReport {
    /// Metrics against an ideal TTFT (ns), e.g. from the warm-up profile.
    pub fn metrics(&self, ideal_ttft: u64) -> Metrics {
        let ms = |ns: u64| ns as f64 / 1e6;
        Metrics {
            prefill_ms: ms(self.prefill_end),
            switch_ms: ms(self.switch_end),
            ttft_ms: ms(self.ttft),
            stall_ms: ms(self.switch_end.saturating_sub(self.prefill_end)),
            overhead_pct: if ideal_ttft == 0 {
                0.0
            } else {
                (self.ttft as f64 - ideal_ttft as f64) / ideal_ttft as f64 * 100.0
            },
        }
    }
}

#[derive(Default)]
struct Shared {
    /// Finished compute steps: boundary `k` (release point `k`) is reached when `reached >= k`.
    reached: usize,
    load_done: Vec<bool>,
    abort: Option<String>,
}

/// Executes `plan` for a prompt of `n_chunks` chunks. Blocks start on G1 (resident);
/// afterwards every block is on G2. `double_resident`: G2 loads while G1 stays usable
/// (G1 forms are released after the decode step).
pub fn execute<E: ScheduleExecutor>(
    exec: &E,
    n_blocks: usize,
    n_chunks: usize,
    plan: &Plan,
    double_resident: bool,
) -> Result<ExecReport> {
    let shape = Instance {
        budget: if double_resident {
            super::MemoryBudget::Bytes(u64::MAX)
        } else {
            super::MemoryBudget::OneFormPerBlock
        },
        ..Instance::uniform(n_blocks, n_chunks, 0, 0, 0, 0, 0)
    };
    plan.validate(&shape)?;
    let steps = n_blocks * n_chunks;
    let release = plan.release_of(n_blocks);
    let shared = Mutex::new(Shared {
        load_done: vec![false; n_blocks],
        ..Default::default()
    });
    let cv = Condvar::new();
    exec.begin_prefill()?;
    let t0 = Instant::now();
    let ns = |t: Instant| t.duration_since(t0).as_nanos() as u64;
    let fail = |msg: String| {
        let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
        g.abort.get_or_insert(msg);
        cv.notify_all();
    };

    let (compute_out, loader_out) = std::thread::scope(|scope| {
        let loader = scope.spawn(|| -> Result<Vec<Event>> {
            let mut events = Vec::with_capacity(2 * plan.loads.len());
            for l in &plan.loads {
                {
                    let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
                    while g.reached < l.release && g.abort.is_none() {
                        g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                    if let Some(m) = &g.abort {
                        return Err(ScheduleError::Executor(format!("aborted: {m}")));
                    }
                }
                let mut step = |kind: EventKind, f: &dyn Fn() -> Result<()>| -> Result<()> {
                    let s = Instant::now();
                    f()?;
                    events.push(Event {
                        unit: Unit::Loader,
                        kind,
                        start: ns(s),
                        end: ns(Instant::now()),
                    });
                    Ok(())
                };
                let j = l.block;
                let r = if double_resident {
                    step(
                        EventKind::Load {
                            block: j,
                            form: Form::G2,
                        },
                        &|| exec.load(j, Form::G2),
                    )
                } else {
                    step(
                        EventKind::Unload {
                            block: j,
                            form: Form::G1,
                        },
                        &|| exec.unload(j, Form::G1),
                    )
                    .and_then(|_| {
                        step(
                            EventKind::Load {
                                block: j,
                                form: Form::G2,
                            },
                            &|| exec.load(j, Form::G2),
                        )
                    })
                };
                if let Err(e) = r {
                    fail(e.to_string());
                    return Err(e);
                }
                let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
                g.load_done[j] = true;
                cv.notify_all();
            }
            Ok(events)
        });

        let compute = || -> Result<(Vec<Event>, Vec<Form>, u64)> {
            let mut events = Vec::with_capacity(steps);
            let mut forms = Vec::with_capacity(steps);
            for s in 0..steps {
                let b = s % n_blocks;
                let form = if release[b] > s {
                    Form::G1
                } else {
                    let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
                    if double_resident && !g.load_done[b] {
                        Form::G1
                    } else {
                        while !g.load_done[b] && g.abort.is_none() {
                            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
                        }
                        if let Some(m) = &g.abort {
                            return Err(ScheduleError::Executor(format!("aborted: {m}")));
                        }
                        Form::G2
                    }
                };
                let start = Instant::now();
                exec.compute(b, s / n_blocks, form)?;
                events.push(Event {
                    unit: Unit::Compute,
                    kind: EventKind::Compute {
                        block: b,
                        chunk: s / n_blocks,
                        form,
                    },
                    start: ns(start),
                    end: ns(Instant::now()),
                });
                forms.push(form);
                let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
                g.reached = s + 1;
                cv.notify_all();
            }
            Ok((events, forms, ns(Instant::now())))
        };
        let c = compute();
        if let Err(e) = &c {
            fail(e.to_string());
        }
        let l = loader
            .join()
            .unwrap_or_else(|_| Err(ScheduleError::Executor("loader thread panicked".into())));
        (c, l)
    });
    let (mut events, forms, prefill_end) = compute_out?;
    let loader_events = loader_out?;
    let switch_end = loader_events.iter().map(|e| e.end).max().unwrap_or(0);
    events.extend(loader_events);
    events.sort_by_key(|e| (e.start, e.end));
    exec.decode()?;
    let ttft = ns(Instant::now());
    if double_resident {
        for l in &plan.loads {
            exec.unload(l.block, Form::G1)?;
        }
    }
    Ok(ExecReport {
        events,
        forms,
        prefill_end,
        switch_end,
        ttft,
    })
}

/// The ideal run for comparison: every G2 form is already resident (the caller loads them),
/// prefill runs entirely on G1, then one decode step. Nothing switches.
pub fn execute_ideal<E: ScheduleExecutor>(
    exec: &E,
    n_blocks: usize,
    n_chunks: usize,
) -> Result<ExecReport> {
    exec.begin_prefill()?;
    let t0 = Instant::now();
    let ns = |t: Instant| t.duration_since(t0).as_nanos() as u64;
    let mut events = Vec::with_capacity(n_blocks * n_chunks);
    for s in 0..n_blocks * n_chunks {
        let (block, chunk) = (s % n_blocks, s / n_blocks);
        let start = Instant::now();
        exec.compute(block, chunk, Form::G1)?;
        events.push(Event {
            unit: Unit::Compute,
            kind: EventKind::Compute {
                block,
                chunk,
                form: Form::G1,
            },
            start: ns(start),
            end: ns(Instant::now()),
        });
    }
    let prefill_end = ns(Instant::now());
    exec.decode()?;
    let ttft = ns(Instant::now());
    Ok(ExecReport {
        events,
        forms: vec![Form::G1; n_blocks * n_chunks],
        prefill_end,
        switch_end: 0,
        ttft,
    })
}
