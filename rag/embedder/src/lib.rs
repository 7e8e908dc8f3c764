//! BERT-family sentence encoder (all-MiniLM-L6-v2, multilingual-e5-small and kin) on the
//! runtime's kernels.
//!
//! The encoder is a static-shape graph like the LLM graphs: a batch of token-id sequences is
//! padded to the batch's longest sequence, an attention mask keeps the padding from ever
//! touching a real token, and every intermediate lives in a [`BertWorkspace`] planned once and
//! reused across calls. Text handling (tokenizer, truncation policy) is the caller's job: the
//! encoder takes token ids, with the special tokens already in place.
//!
//! Every output element is reduced in a fixed order that does not depend on the batch it was
//! computed in, so embedding a text alone or inside a padded batch gives identical bits.

mod config;
mod encoder;
mod linear;
mod ops;
mod packed_e5;
mod parallel;
mod q4;
mod unigram;
mod weights;

pub use config::BertConfig;
pub use encoder::{BertModel, BertWorkspace};
pub use linear::{PackedLinear, WeightFormat};
pub use ops::{erf_approx, exp_approx};
pub use unigram::{SpecialIds, UnigramTokenizer, METASPACE};

/// Why a BERT model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum BertError {
    /// config.json, model.safetensors or the packed e5 file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// config.json is not a BERT configuration we can run.
    #[error("config: {0}")]
    Config(String),
    /// The weights file (or the vocabulary packed with them) is corrupt or truncated, misses
    /// a tensor or has a tensor of the wrong shape/type.
    #[error("weights: {0}")]
    Weights(String),
    /// The call's token ids cannot be encoded (empty sequence, id outside the vocabulary,
    /// sequence longer than the position table).
    #[error("invalid input: {0}")]
    InvalidInput(String),
}
