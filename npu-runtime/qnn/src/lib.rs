//! QNN HTP backend: our own bindings to Qualcomm's QNN C API, loaded at run time (see
//! docs/qnn.md). On x86-64 the HTP library runs graphs in emulation; on a Snapdragon phone
//! the same calls drive the NPU.

pub mod backend;
pub mod cache;
pub mod error;
pub mod ffi;
pub mod graph;
pub mod library;
pub mod lower;

pub use backend::{QnnBackend, QnnGraph, QnnTimes};
pub use cache::BinaryCache;
pub use error::{QnnError, QnnResult};
pub use graph::{
    Context, DType, Graph, GraphBuilder, GraphOptions, IoTensor, Param, Quant, TensorId,
    WeightFormat,
};
pub use library::{lib_dir, libs_present, runtime, QnnRuntime};

/// Graphs of fewer rows than this compile to less precise HTP code (docs/qnn.md), so a
/// chunk computed on them would differ from the same chunk on a larger graph.
pub const MIN_PRECISE_ROWS: usize = 16;
