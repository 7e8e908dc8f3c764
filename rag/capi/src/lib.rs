//! C ABI over [`rag::assistant::Assistant`]: the functions and types of `include/rag.h`.
//!
//! Every entry point catches panics and reports them as errors; the header states who
//! owns each pointer. The header is generated from these files by `build.rs` (cbindgen);
//! `tests/header.rs` fails when the checked-in `include/rag.h` is out of date.

mod ask;
mod chat;
mod guard;
mod handle;
mod search;

pub use ask::*;
pub use chat::*;
pub use guard::*;
pub use handle::*;
pub use search::*;
