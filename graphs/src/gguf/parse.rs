//! The bounds-checked GGUF parser.

use std::collections::BTreeMap;

use super::{GgufError, MetaValue, TensorInfo};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
use crate::quant::{unsupported_type_name, GgmlType};

/// Smallest possible encodings, used to reject counts before allocating.
const MIN_KV_BYTES: usize = 8 + 4 + 1; // key length, value type, 1-byte value
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8; // name length, n_dims, type, offset

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                offset: self.pos,
                needed: n - self.remaining(),
                what: what(),
            });
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must be encodable in the remaining bytes at `min_each` bytes
    /// per item (so a corrupt count can never trigger a huge allocation).
    fn count(&mut self, min_each: usize, what: &dyn Fn() -> String) -> Result<usize, GgufError> {
        let offset = self.pos;
        let n = self.u64(what)?;
        let max = (self.remaining() / min_each.max(1)) as u64;
        if n > max {
            return Err(GgufError::AbsurdCount {
                what: what(),
                count: n,
                offset,
                len: self.b.len(),
            });
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let n = self.count(1, what)?;
        let offset = self.pos;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::BadUtf8 {
            offset,
            what: what(),
        })
    }
}

/// Smallest encoding of one value of GGUF type `ty` (for array count checks).
fn min_value_bytes(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

fn value(c: &mut Cursor, ty: u32, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
    let what = || format!("value of '{key}'");
    Ok(match ty {
        0 => MetaValue::U8(c.array::<1>(&what)?[0]),
        1 => MetaValue::I8(c.array::<1>(&what)?[0] as i8),
        2 => MetaValue::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => MetaValue::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => MetaValue::U32(c.u32(&what)?),
        5 => MetaValue::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => MetaValue::F32(f32::from_le_bytes(c.array(&what)?)),
        7 => MetaValue::Bool(c.array::<1>(&what)?[0] != 0),
        8 => MetaValue::Str(c.string(&what)?),
        9 => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::TooDeep { key: key.into() });
            }
            let elem_ty = c.u32(&what)?;
            if elem_ty > 12 {
                return Err(GgufError::BadValueType {
                    key: key.into(),
                    ty: elem_ty,
                });
            }
            let n = c.count(min_value_bytes(elem_ty), &|| {
                format!("array length of '{key}'")
            })?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(value(c, elem_ty, key, depth + 1)?);
            }
            MetaValue::Array(items)
        }
        10 => MetaValue::U64(c.u64(&what)?),
        11 => MetaValue::I64(i64::from_le_bytes(c.array(&what)?)),
        12 => MetaValue::F64(f64::from_le_bytes(c.array(&what)?)),
        _ => {
            return Err(GgufError::BadValueType {
                key: key.into(),
                ty,
            })
        }
    })
}

struct RawTensor {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    rel_offset: u64,
}

#[allow(clippy::type_complexity)]
pub(super) fn parse(
    bytes: &[u8],
) -> Result<(u32, BTreeMap<String, MetaValue>, Vec<TensorInfo>), GgufError> {
    let mut c = Cursor { b: bytes, pos: 0 };
    let magic = c.u32(&|| "magic".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic));
    }
    let version = c.u32(&|| "version".into())?;
    if version & 0xFFFF == 0 && version != 0 {
        return Err(GgufError::BigEndian);
    }
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors_raw = c.u64(&|| "tensor count".into())?;
    let n_kv = c.count(MIN_KV_BYTES, &|| "metadata key/value".into())?;
    // Tensor infos come after the metadata; check the bound now against what is left.
    if n_tensors_raw > (c.remaining() / MIN_TENSOR_INFO_BYTES) as u64 {
        return Err(GgufError::AbsurdCount {
            what: "tensor".into(),
            count: n_tensors_raw,
            offset: 8,
            len: bytes.len(),
        });
    }
    let n_tensors = n_tensors_raw as usize;

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let ty = c.u32(&|| format!("value type of '{key}'"))?;
        let v = value(&mut c, ty, &key, 0)?;
        if metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        metadata.insert(key, v);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let a = v.as_u64().unwrap_or(0);
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::BadAlignment(a));
            }
            a
        }
    };

    if n_tensors > c.remaining() / MIN_TENSOR_INFO_BYTES {
        return Err(GgufError::AbsurdCount {
            what: "tensor".into(),
            count: n_tensors as u64,
            offset: c.pos,
            len: bytes.len(),
        });
    }
    let mut raw = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let n_dims = c.u32(&|| format!("dimension count of tensor '{name}'"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims { name, n_dims });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&|| format!("dimensions of tensor '{name}'"))?);
        }
        let ty = c.u32(&|| format!("type of tensor '{name}'"))?;
        let rel_offset = c.u64(&|| format!("offset of tensor '{name}'"))?;
        raw.push(RawTensor {
            name,
            dims,
            ty,
            rel_offset,
        });
    }

    // Tensor data starts at the next multiple of the alignment.
    let header_end = c.pos as u64;
    let data_start = header_end
        .checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
        .ok_or(GgufError::BadAlignment(alignment))?;
    let file_len = bytes.len() as u64;

    let mut seen = std::collections::HashSet::with_capacity(raw.len());
    let mut tensors = Vec::with_capacity(raw.len());
    for r in raw {
        if !seen.insert(r.name.clone()) {
            return Err(GgufError::DuplicateTensor(r.name));
        }
        tensors.push(tensor_info(r, alignment, data_start, file_len)?);
    }
    Ok((version, metadata, tensors))
}

fn tensor_info(
    r: RawTensor,
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<TensorInfo, GgufError> {
    let RawTensor {
        name,
        dims,
        ty,
        rel_offset,
    } = r;
    let ggml_type = match GgmlType::from_u32(ty) {
        Some(t) => t,
        None => {
            return Err(GgufError::UnknownType {
                name,
                ty,
                type_name: unsupported_type_name(ty),
            })
        }
    };
    let bad = |why: String| GgufError::BadShape {
        name: name.clone(),
        dims: dims.clone(),
        why,
    };
    let row = dims.first().copied().unwrap_or(1);
    if row % ggml_type.block_size() as u64 != 0 {
        return Err(bad(format!(
            "row length {row} is not a multiple of the {} block size {}",
            ggml_type.name(),
            ggml_type.block_size()
        )));
    }
    let mut n_elems: u64 = 1;
    for &d in &dims {
        n_elems = n_elems
            .checked_mul(d)
            .ok_or_else(|| bad("element count overflows".into()))?;
    }
    let size = (n_elems / ggml_type.block_size() as u64)
        .checked_mul(ggml_type.type_size() as u64)
        .ok_or_else(|| bad("byte size overflows".into()))?;
    if rel_offset % alignment != 0 {
        return Err(GgufError::Misaligned {
            name,
            offset: rel_offset,
            alignment,
        });
    }
    let past_end = |start: u64| GgufError::PastEnd {
        name: name.clone(),
        start,
        size,
        len: file_len,
    };
    let start = data_start
        .checked_add(rel_offset)
        .ok_or_else(|| past_end(u64::MAX))?;
    let end = start.checked_add(size).ok_or_else(|| past_end(start))?;
    if end > file_len {
        return Err(past_end(start));
    }
    // end <= file_len, which is a usize, so both fit.
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset: start,
        n_bytes: size as usize,
    })
}
