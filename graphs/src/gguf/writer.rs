//! A small GGUF v3 writer, for tests and synthetic models (e.g. tiny random
//! models that exercise the runtime without a real model file).

use super::{MetaValue, DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::quant::GgmlType;

/// Builds a GGUF image in memory. Tensor data must already be encoded in the
/// tensor's type (see `quant::quantize_row_ref`).
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    alignment: Option<u64>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `general.alignment` (written as u32) and aligns tensor data to it.
    pub fn alignment(mut self, alignment: u32) -> Self {
        self.alignment = Some(alignment as u64);
        self.metadata
            .push(("general.alignment".into(), MetaValue::U32(alignment)));
        self
    }

    pub fn meta(mut self, key: &str, value: MetaValue) -> Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Adds a tensor; `dims` in ggml order (`dims[0]` = row length).
    pub fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }

    /// Serializes the image. Does not validate: tests use it to build bad files.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment.unwrap_or(DEFAULT_ALIGNMENT).max(1);
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            write_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for (name, dims, ty, data) in &self.tensors {
            write_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_u32().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(align) * align;
        }
        let data_start = (out.len() as u64).div_ceil(align) * align;
        out.resize(data_start as usize, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::Str(s) => write_str(out, s),
        MetaValue::Array(items) => {
            // An empty array is written as an array of u8.
            let elem_ty = items.first().map_or(0, MetaValue::type_id);
            out.extend_from_slice(&elem_ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                write_value(out, it);
            }
        }
    }
}
