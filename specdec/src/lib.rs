//! Lossless retrieval-based speculative decoding (sd.npu, BRIEF sections 4-5).
//!
//! Draft sources (`drafter`): prompt lookup (`pld`), suffix automata over the
//! context and a persistent token database (`sam`, `tokendb`), prefill-logit
//! calibration (`calibration`) and rejected-token extension (`extension`). Their
//! candidates merge into one token tree per step (`tree`), cut at a budget chosen
//! from the measured verify-cost curve (`budget`), verified in one forward pass
//! of a [`Target`] and accepted greedily (`generate`), so the output equals
//! greedy decoding token for token; sampled decoding (`sampling`) draws each
//! token from a uniform keyed by its index, so it equals plain sampled decoding
//! with the same seed token for token.

pub mod accept_model;
mod atomic_file;
pub mod budget;
pub mod calibration;
pub mod curve_cache;
pub mod drafter;
pub mod extension;
pub mod gap;
pub mod generate;
pub mod metrics;
pub mod mock;
pub mod oracle;
pub mod pld;
pub mod sam;
pub mod sampling;
pub mod session_target;
pub mod target;
pub mod tokendb;
pub mod tree;

pub use budget::CostCurve;
pub use drafter::{Drafter, Mode};
pub use generate::{generate, GenConfig, Generator};
pub use metrics::{Metrics, StopReason};
pub use sampling::Sampling;
pub use target::{PrefillOut, Target};
pub use tokendb::{TokenDb, TokenSource};
pub use tree::{DraftTree, FlatTree};

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("target: {0}")]
    Target(String),
    #[error("token database: {0}")]
    Db(String),
    #[error("configuration: {0}")]
    Config(String),
}
