//! The repacked weight matrix every matmul kernel reads.

use crate::kernels::ggml::{kernel_supported, GgmlType};
use crate::kernels::layout::{
    decode_tile_row, dequantize_tile_row, pack_group, Planes, Tile, GROUP,
};
use crate::kernels::pool::ThreadPool;
use crate::kernels::KernelError;
use std::sync::Arc;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A weight matrix of `rows` output features by `cols` input features,
/// repacked from ggml bytes into the kernels' layout (see `layout`).
///
/// Memory: the repacked copy is owned (same size as the GGUF tensor, Q4_K
/// +1.4%); once every matrix is built the caller may drop or `madvise` away
/// the mapped file pages, so steady-state RSS is about one model size.
pub struct QMatrix {
    pub(super) ty: GgmlType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) planes: Planes,
    data: Storage,
}

/// Where a matrix's repacked bytes live.
enum Storage {
    /// Repacked at load.
    Owned(Vec<Line>),
    /// A 64-byte aligned range of a read-only file mapping (a repacked-weights cache,
    /// `weights_cache`): no repacking, and the pages are shared with the page cache.
    Mapped {
        map: Arc<memmap2::Mmap>,
        offset: usize,
        len: usize,
    },
}

impl QMatrix {
    /// Repack a ggml tensor (`rows` rows of `cols` elements, row-major, as in GGUF).
    pub fn from_ggml(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<QMatrix, KernelError> {
        if !kernel_supported(ty) {
            return Err(KernelError::UnsupportedType { ty });
        }
        if rows == 0 || cols == 0 || rows > 1 << 31 || cols > 1 << 31 {
            return Err(KernelError::BadShape { rows, cols });
        }
        let row_bytes = ty.row_bytes(cols).ok_or(KernelError::NotBlockMultiple {
            ty,
            cols,
            block: ty.block_size(),
        })?;
        let expected = row_bytes
            .checked_mul(rows)
            .ok_or(KernelError::BadShape { rows, cols })?;
        if data.len() != expected {
            return Err(KernelError::SizeMismatch {
                ty,
                rows,
                cols,
                got: data.len(),
                expected,
            });
        }
        let planes = Planes::new(ty, cols);
        let gb = planes.group_bytes();
        debug_assert_eq!(gb % 64, 0);
        let n_groups = rows.div_ceil(GROUP);
        let mut m = QMatrix {
            ty,
            rows,
            cols,
            planes,
            data: Storage::Owned(vec![Line([0; 64]); n_groups * gb / 64]),
        };
        let bytes = m.bytes_mut();
        for g in 0..n_groups {
            let r1 = (g * GROUP + GROUP).min(rows);
            let src: Vec<&[u8]> = (g * GROUP..r1)
                .map(|r| &data[r * row_bytes..(r + 1) * row_bytes])
                .collect();
            pack_group(ty, cols, &src, &planes, &mut bytes[g * gb..(g + 1) * gb]);
        }
        Ok(m)
    }

    /// A matrix of `from`'s shape and type `ty` whose repacked group `g` is what
    /// `fill(src, dst)` writes into `dst` (zeroed) from group `g` of `from`, one group
    /// per pool task: for matrices derived from another one at load (the screened LM
    /// head's coarse copy), without a ggml copy.
    pub(crate) fn derived(
        from: &QMatrix,
        ty: GgmlType,
        pool: &ThreadPool,
        fill: &(dyn Fn(&[u8], &mut [u8]) + Sync),
    ) -> Option<QMatrix> {
        let (rows, cols) = (from.rows, from.cols);
        let len = Self::repacked_len(ty, rows, cols).ok()?;
        let planes = Planes::new(ty, cols);
        let gb = planes.group_bytes();
        let mut lines = vec![Line([0; 64]); len / 64];
        pool.for_each_chunk_mut(&mut lines, gb / 64, &|g, chunk| {
            // SAFETY: `Line` is 64 plain bytes with no padding; `chunk` is this
            // group's `gb / 64` lines, borrowed mutably by this task alone.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(chunk.as_mut_ptr().cast::<u8>(), chunk.len() * 64)
            };
            fill(from.group(g), dst);
        });
        Some(QMatrix {
            ty,
            rows,
            cols,
            planes,
            data: Storage::Owned(lines),
        })
    }

    /// Group `g`'s repacked bytes.
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let gb = self.planes.group_bytes();
        &self.bytes()[g * gb..(g + 1) * gb]
    }

    /// A matrix whose repacked bytes (as [`QMatrix::repacked_bytes`] returned them for the
    /// same type and shape) are `len` bytes at `offset` of `map`. Checks the length and the
    /// 64-byte alignment the kernels' loads assume; the contents are the caller's to vouch
    /// for (`weights_cache` checksums them).
    pub fn from_mapped(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        map: Arc<memmap2::Mmap>,
        offset: usize,
    ) -> Result<QMatrix, KernelError> {
        let len = Self::repacked_len(ty, rows, cols)?;
        let aligned = (map.as_ptr() as usize + offset).is_multiple_of(64);
        if !aligned || offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(KernelError::SizeMismatch {
                ty,
                rows,
                cols,
                got: map.len().saturating_sub(offset),
                expected: len,
            });
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            planes: Planes::new(ty, cols),
            data: Storage::Mapped { map, offset, len },
        })
    }

    /// Bytes of the repacked form of a `rows x cols` matrix of type `ty`.
    pub fn repacked_len(ty: GgmlType, rows: usize, cols: usize) -> Result<usize, KernelError> {
        if !kernel_supported(ty) {
            return Err(KernelError::UnsupportedType { ty });
        }
        if rows == 0 || cols == 0 || rows > 1 << 31 || cols > 1 << 31 {
            return Err(KernelError::BadShape { rows, cols });
        }
        if ty.row_bytes(cols).is_none() {
            return Err(KernelError::NotBlockMultiple {
                ty,
                cols,
                block: ty.block_size(),
            });
        }
        Ok(rows.div_ceil(GROUP) * Planes::new(ty, cols).group_bytes())
    }

    /// The repacked bytes (what a repacked-weights cache stores).
    pub fn repacked_bytes(&self) -> &[u8] {
        self.bytes()
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match &self.data {
            // SAFETY: `Line` is 64 plain bytes with no padding, so the vector's
            // storage is `len * 64` initialised bytes, borrowed immutably with `self`.
            Storage::Owned(v) => unsafe {
                std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 64)
            },
            Storage::Mapped { map, offset, len } => &map[*offset..*offset + *len],
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.data {
            // SAFETY: as in `bytes`, borrowed mutably with `self`.
            Storage::Owned(v) => unsafe {
                std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 64)
            },
            Storage::Mapped { .. } => unreachable!("mapped matrices are never written"),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    /// Bytes of the repacked weights.
    pub fn size_bytes(&self) -> usize {
        self.bytes().len()
    }

    /// Dequantize row `r` into `out` (`cols` values), e.g. for embedding lookup;
    /// bit-identical to ggml's reference dequantization.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} out of range ({} rows)", self.rows);
        assert_eq!(out.len(), self.cols, "dequantize_row: output length");
        let gb = self.planes.group_bytes();
        let group = &self.bytes()[(r / GROUP) * gb..(r / GROUP + 1) * gb];
        let i = r % GROUP;
        match self.ty {
            GgmlType::F32 => {
                for (k, o) in out.iter_mut().enumerate() {
                    let p = (k * GROUP + i) * 4;
                    *o = f32::from_le_bytes([group[p], group[p + 1], group[p + 2], group[p + 3]]);
                }
            }
            GgmlType::F16 => {
                for (k, o) in out.iter_mut().enumerate() {
                    let p = (k * GROUP + i) * 2;
                    *o = half::f16::from_le_bytes([group[p], group[p + 1]]).to_f32();
                }
            }
            ty => {
                let mut tile = Tile::default();
                for (b, y) in out.chunks_exact_mut(32).enumerate() {
                    decode_tile_row(ty, &self.planes, group, b, i, &mut tile);
                    dequantize_tile_row(ty, &tile, i, y);
                }
            }
        }
    }
}
