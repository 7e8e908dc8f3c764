//! corpus-tools: turn folders of user documents into chunks. Pure: it walks, parses and
//! chunks, and stores nothing; deciding what changed is the indexer's job (`rag`).
//!
//! Flow: [`walk::walk`] lists files (respecting `.gitignore` and hidden files) ->
//! [`load::read_file`] reads one under a size cap -> [`isolate::parse_isolated`] detects the
//! kind, decodes the text ([`decode`]) and parses it in a killable worker process ([`worker`], when the binary opts in)
//! or on its own thread (panic- and time-limited) into [`ParsedDoc`] (or runs the user's
//! [`loader`] command for the file's extension)
//! sections -> [`chunk::chunk_doc`] cuts token-bounded, overlapping chunks that keep their
//! line range or page and heading path.

pub mod chunk;
pub mod decode;
pub mod detect;
mod direct;
pub mod gz;
pub mod isolate;
pub mod load;
pub mod loader;
pub mod parse;
#[doc(hidden)]
pub mod test_support;
pub mod tokens;
pub mod walk;
pub mod worker;

pub use chunk::{chunk_doc, ChunkOptions, ChunkSpec};
pub use detect::{DocKind, Skip, SkipReason};
pub use direct::ParseLimits;
pub use isolate::{parse_isolated, parse_isolated_detailed};
pub use loader::Loaders;
pub use parse::{Line, ParsedDoc, Section};
