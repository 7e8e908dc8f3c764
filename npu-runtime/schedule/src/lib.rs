//! Progressive graph scheduling (sd.npu section 4.2, appendix A).
//!
//! A model is split into `N` blocks; a prompt into `C` prefill chunks. Every block has a
//! prefill-shaped form (G1) and a decode-shaped form (G2). Prefill runs the (block, chunk)
//! steps in chunk-major order on one compute unit; a background loader switches blocks from
//! G1 to G2, one at a time. Running G2 repeatedly over sub-chunks gives the same result as
//! one G1 run over the chunk, so a block may switch before prefill ends.
//!
//! - [`profile`]: per-block costs measured by warm-up profiling (or derived from a paper),
//!   stored as JSON and cached per model, backend and machine.
//! - [`instance`]: a profile turned into an exact integer-time problem for one prompt.
//! - [`plan`]: a schedule (which block loads, in which order, released at which step).
//! - [`greedy`]: the one-pass planners `sync`, `async`, `progressive` (the paper's greedy)
//!   and `progressive-wc`.
//! - [`improve`]: `progressive-ls`, the greedy's plans improved by local search.
//! - [`exact`]: the exact solver for small instances (the problem is NP-hard).
//! - [`sim`]: the discrete-event simulator that executes a plan against an instance.
//! - [`kind`]: the schedules by name (`sync` ... `progressive-ls`, `optimal`) and the
//!   planner behind each.
//!
//! Pure planning: nothing here runs a model. The runtime (`npu_runtime::schedule`) adds
//! the real executor with its loader thread and warm-up profiling.
//! - [`choose`]: the number of blocks and the chunk size, chosen from a profile by
//!   predicting every candidate layout with the planner and the simulator.

pub mod choose;
mod error;
pub mod exact;
pub mod greedy;
pub mod improve;
pub mod instance;
pub mod kind;
pub mod plan;
pub mod profile;
pub mod sim;

pub use error::{Result, ScheduleError};
pub use instance::{Instance, MemoryBudget};
pub use kind::ScheduleKind;
pub use plan::{Form, Load, Plan};
pub use profile::{BlockProfile, Profile};
pub use sim::{simulate, Metrics, SimResult};
