//! GGUF reader (versions 2 and 3): metadata, tensor directory and zero-copy
//! tensor data over a memory map.
//!
//! The parser is pure (`GgufFile::parse`) and treats its input as hostile:
//! every read is bounds-checked, every size uses checked arithmetic, counts are
//! bounded by the bytes that could possibly encode them before anything is
//! allocated, and array nesting is limited. Tensor extents are validated against
//! the file length at open, so `tensor_data` cannot fail afterwards.

mod parse;
mod writer;

use std::collections::BTreeMap;
use std::path::Path;

use crate::quant::GgmlType;

pub use writer::GgufWriter;

/// "GGUF" as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
pub const MAX_DIMS: u32 = 4;
/// Deepest array-of-array nesting accepted (real files use one level).
pub const MAX_ARRAY_DEPTH: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("not a GGUF file: bad magic {0:#010x} (expected \"GGUF\")")]
    BadMagic(u32),
    #[error("GGUF version {0} is not supported (only 2 and 3; version 1 is obsolete)")]
    UnsupportedVersion(u32),
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("file truncated at offset {offset}: needed {needed} more bytes for {what}")]
    Truncated {
        offset: usize,
        needed: usize,
        what: String,
    },
    #[error("{what} count {count} at offset {offset} is impossible for a file of {len} bytes")]
    AbsurdCount {
        what: String,
        count: u64,
        offset: usize,
        len: usize,
    },
    #[error("string at offset {offset} is not valid UTF-8 ({what})")]
    BadUtf8 { offset: usize, what: String },
    #[error("unknown metadata value type {ty} for key '{key}'")]
    BadValueType { key: String, ty: u32 },
    #[error("metadata key '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH} levels")]
    TooDeep { key: String },
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    #[error("general.alignment must be a non-zero power of two, got {0}")]
    BadAlignment(u64),
    #[error("tensor '{name}' has {n_dims} dimensions (at most {MAX_DIMS} allowed)")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("unknown ggml type {ty} ({type_name}) for tensor '{name}'")]
    UnknownType {
        name: String,
        ty: u32,
        type_name: &'static str,
    },
    #[error("tensor '{name}' has bad shape {dims:?}: {why}")]
    BadShape {
        name: String,
        dims: Vec<u64>,
        why: String,
    },
    #[error("tensor '{name}' offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor '{name}' extends past end of file ({start}+{size} > {len})")]
    PastEnd {
        name: String,
        start: u64,
        size: u64,
        len: u64,
    },
}

/// A metadata value. Arrays may nest.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// Any integer type whose value is representable as u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type whose value is representable as i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF value type id (`gguf_type`).
    pub fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::Str(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous row length.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Absolute byte offset in the file.
    pub offset: u64,
    pub n_bytes: usize,
}

impl TensorInfo {
    /// Total number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Elements per row (`dims[0]`).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }

    /// Number of rows (product of the outer dimensions).
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An opened GGUF file. Tensor data is borrowed from the memory map (zero copy).
pub struct GgufFile {
    data: Backing,
    version: u32,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("len", &self.data.bytes().len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only. Another process truncating or rewriting the
        // model file while it is mapped is outside what we can defend against
        // (the same contract as every mmap-based model loader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_backing(Backing::Mmap(map))
    }

    /// Parse a GGUF image held in memory (tests, synthetic models).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(data: Backing) -> Result<Self, GgufError> {
        let (version, metadata, tensors) = Self::parse(data.bytes())?;
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            data,
            version,
            metadata,
            tensors,
            by_name,
        })
    }

    /// Pure parser: header, metadata and tensor directory of a complete GGUF
    /// image, with every tensor's extent validated against `bytes.len()`.
    #[allow(clippy::type_complexity)]
    pub fn parse(
        bytes: &[u8],
    ) -> Result<(u32, BTreeMap<String, MetaValue>, Vec<TensorInfo>), GgufError> {
        parse::parse(bytes)
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any integer type whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        u32::try_from(self.get(key)?.as_u64()?).ok()
    }

    /// Any integer type whose value fits in u64.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// f32 or f64.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f64().map(|v| v as f32)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            MetaValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// An array whose every element is a string.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| v.as_str())
            .collect()
    }

    /// An array whose every element is an integer that fits in i32.
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| i32::try_from(v.as_i64()?).ok())
            .collect()
    }

    /// An array whose every element is f32 or f64.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect()
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor from this file (validated at open, so in bounds).
    /// Panics only if `t` comes from a different file and lies outside this one.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = t.offset as usize;
        &self.data.bytes()[start..start + t.n_bytes]
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// Unmaps the whole pages of `t`'s data from this process (`MADV_DONTNEED`) once a
    /// caller has copied what it needs: the process's RSS falls, while the kernel keeps the
    /// pages in its page cache, so the next process that opens the model (the next `rag
    /// ask`) maps them without reading the disk again. (`MADV_PAGEOUT`, used before, also
    /// evicted them from the page cache: every run re-read the whole file.) Contents never
    /// change: the map is read-only and file-backed, so a later access faults the same bytes
    /// back in. Nothing happens for in-memory images or where the advice is unsupported.
    pub fn release_tensor_pages(&self, t: &TensorInfo) {
        #[cfg(unix)]
        if let Backing::Mmap(map) = &self.data {
            let page = 4096;
            let start = (t.offset as usize).next_multiple_of(page);
            let end = (t.offset as usize + t.n_bytes) / page * page;
            if end > start && end <= map.len() {
                // SAFETY: the range lies inside the map, whose pages are page-aligned from
                // offset 0 (file offset 0), so `start` is a page boundary of the mapping. The
                // map is a read-only shared mapping of the file: `MADV_DONTNEED` drops page
                // table entries only, and any later read re-faults the file's unchanged bytes,
                // so no borrowed slice ever observes different contents. Errors are ignored.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
        #[cfg(not(unix))]
        let _ = t;
    }
}
