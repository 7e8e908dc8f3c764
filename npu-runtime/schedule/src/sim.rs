//! Discrete-event simulator: executes a [`Plan`] against an [`Instance`].
//!
//! Two resources: the compute unit runs steps in chunk-major order; the loader runs the
//! plan's switches one after another. Load `k` starts at `max(loader free, moment step
//! release_k could start)`. A step whose block has a load released at or before it runs on
//! G2 after that load ends (one form per block); with double residency it runs on G1 while
//! the load is still in flight and needs no wait.

use super::error::Result;
use super::instance::{ns_to_ms, Instance};
use super::plan::{Form, Plan};
use serde::Serialize;

/// Which resource an event occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Unit {
    Compute,
    Loader,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventKind {
    Compute {
        block: usize,
        chunk: usize,
        form: Form,
    },
    Unload {
        block: usize,
        form: Form,
    },
    Load {
        block: usize,
        form: Form,
    },
}

/// One interval on the timeline (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Event {
    pub unit: Unit,
    pub kind: EventKind,
    pub start: u64,
    pub end: u64,
}

/// What a schedule costs, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Metrics {
    /// Prefill completion.
    pub prefill_ms: f64,
    /// Switch completion (all blocks on G2); 0 if nothing switches.
    pub switch_ms: f64,
    /// First decoded token: after prefill and all switches, plus one decode step.
    pub ttft_ms: f64,
    /// Time decode waited for loads after prefill ended.
    pub stall_ms: f64,
    /// TTFT over the ideal run's TTFT (no switch needed), in percent.
    pub overhead_pct: f64,
}

impl Metrics {
    /// Metrics from raw completion times (ns) and the instance's ideal.
    pub fn from_times(inst: &Instance, prefill_end: u64, switch_end: u64) -> Metrics {
        let done = prefill_end.max(switch_end);
        let ttft = done + inst.decode_step;
        let ideal = inst.ideal_ttft();
        Metrics {
            prefill_ms: ns_to_ms(prefill_end),
            switch_ms: ns_to_ms(switch_end),
            ttft_ms: ns_to_ms(ttft),
            stall_ms: ns_to_ms(switch_end.saturating_sub(prefill_end)),
            overhead_pct: if ideal == 0 {
                0.0
            } else {
                (ttft as f64 - ideal as f64) / ideal as f64 * 100.0
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimResult {
    pub events: Vec<Event>,
    /// Form each step ran on, by step index.
    pub forms: Vec<Form>,
    pub prefill_end: u64,
    pub switch_end: u64,
    /// Peak resident bytes of graph forms.
    pub peak_mem: u64,
    pub metrics: Metrics,
}

impl SimResult {
    /// `max(prefill completion, switch completion)`: the objective the planners minimise.
    pub fn makespan(&self) -> u64 {
        self.prefill_end.max(self.switch_end)
    }
}

/// Runs `plan` on `inst`. Fails only on an invalid plan.
pub fn simulate(inst: &Instance, plan: &Plan) -> Result<SimResult> {
    inst.validate()?;
    plan.validate(inst)?;
    Ok(run(inst, plan, true))
}

/// `max(prefill completion, switch completion)` of a plan already known to be valid for
/// `inst`, without recording the timeline: the same code path as [`simulate`], for
/// planners that evaluate many candidate plans.
pub(crate) fn makespan_of_valid(inst: &Instance, plan: &Plan) -> u64 {
    debug_assert!(plan.validate(inst).is_ok());
    run(inst, plan, false).makespan()
}

/// The simulator proper; `record` keeps the events (and forms) of the timeline.
fn run(inst: &Instance, plan: &Plan, record: bool) -> SimResult {
    let n = inst.n_blocks;
    let steps = inst.n_steps();
    let double = inst.double_resident();
    let release = plan.release_of(n);
    let mut load_done = vec![0u64; n];
    let mut events = Vec::with_capacity(if record {
        steps + 2 * plan.loads.len()
    } else {
        0
    });
    let mut forms = Vec::with_capacity(if record { steps } else { 0 });
    let mut mem: u64 = inst.mem_g1.iter().sum();
    let mut peak_mem = mem;
    let mut loader_free = 0u64;
    let mut switch_end = 0u64;
    let mut next = 0usize;
    let mut t = 0u64;
    for s in 0..=steps {
        // Loads released at this step start once the loader is free and step s could start.
        while next < plan.loads.len() && plan.loads[next].release <= s {
            let j = plan.loads[next].block;
            let start = loader_free.max(t);
            // With one form per block the G1 form is torn down before the load (G2 then
            // counts in its place); with double residency both are held during the load.
            let load_start = if double {
                peak_mem = peak_mem.max(mem + inst.mem_g2[j]);
                start
            } else {
                let mid = start + inst.unload[j];
                let unload = EventKind::Unload {
                    block: j,
                    form: Form::G1,
                };
                push(&mut events, record, loader(unload, start, mid));
                peak_mem = peak_mem.max(mem - inst.mem_g1[j] + inst.mem_g2[j]);
                mid
            };
            let end = load_start + inst.load[j];
            let load = EventKind::Load {
                block: j,
                form: Form::G2,
            };
            push(&mut events, record, loader(load, load_start, end));
            mem = mem - inst.mem_g1[j] + inst.mem_g2[j];
            load_done[j] = end;
            loader_free = end;
            switch_end = switch_end.max(end);
            next += 1;
        }
        if s == steps {
            break;
        }
        let b = inst.block_of(s);
        // G1 before the release; with double residency also while the load is in flight.
        let (start, form) = if release[b] > s || (double && t < load_done[b]) {
            (t, Form::G1)
        } else {
            (t.max(load_done[b]), Form::G2)
        };
        let dur = if form == Form::G1 {
            inst.g1[s]
        } else {
            inst.g2[s]
        };
        push(
            &mut events,
            record,
            Event {
                unit: Unit::Compute,
                kind: EventKind::Compute {
                    block: b,
                    chunk: inst.chunk_of(s),
                    form,
                },
                start,
                end: start + dur,
            },
        );
        if record {
            forms.push(form);
        }
        t = start + dur;
    }
    let prefill_end = t;
    SimResult {
        events,
        forms,
        prefill_end,
        switch_end,
        peak_mem,
        metrics: Metrics::from_times(inst, prefill_end, switch_end),
    }
}

fn push(events: &mut Vec<Event>, record: bool, e: Event) {
    if record {
        events.push(e);
    }
}

fn loader(kind: EventKind, start: u64, end: u64) -> Event {
    Event {
        unit: Unit::Loader,
        kind,
        start,
        end,
    }
}

/// A compact text rendering of a timeline (one line per event), for docs and debugging.
pub fn render(events: &[Event]) -> String {
    let mut out = String::new();
    for e in events {
        let what = match e.kind {
            EventKind::Compute { block, chunk, form } => {
                format!("compute P{block} chunk {chunk} on {form:?}")
            }
            EventKind::Unload { block, form } => format!("unload  P{block} {form:?}"),
            EventKind::Load { block, form } => format!("load    P{block} {form:?}"),
        };
        out.push_str(&format!(
            "{:>10.3} {:>10.3}  {what}\n",
            ns_to_ms(e.start),
            ns_to_ms(e.end)
        ));
    }
    out
}
