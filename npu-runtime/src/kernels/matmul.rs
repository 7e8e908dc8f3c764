//! Quantized weight matrices and `out = x · Wᵀ`.

use super::ggml::{decode_block, f16_at, Block32, GgmlType};
use super::pool::ThreadPool;
use super::KernelError;

/// A weight matrix of `rows` output features by `cols` input features, in a
/// ggml format, owned by this value.
pub struct QMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    data: Vec<u8>,
}

impl QMatrix {
    /// Copy a ggml tensor (`rows` rows of `cols` elements, row-major, as in GGUF).
    pub fn from_ggml(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<QMatrix, KernelError> {
        if rows == 0 || cols == 0 || rows > u32::MAX as usize || cols > u32::MAX as usize {
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
        Ok(QMatrix {
            ty,
            rows,
            cols,
            row_bytes,
            data: data.to_vec(),
        })
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

    /// Dequantize row `r` into `out` (`cols` values), e.g. for embedding lookup.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} out of range ({} rows)", self.rows);
        assert_eq!(out.len(), self.cols, "dequantize_row: output length");
        let src = &self.data[r * self.row_bytes..(r + 1) * self.row_bytes];
        match self.ty {
            GgmlType::F32 => {
                for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            GgmlType::F16 => {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = f16_at(src, 2 * i);
                }
            }
            ty => {
                let mut blocks = [Block32::default(); 8];
                let per = ty.block_size() / 32;
                for (b, y) in src
                    .chunks_exact(ty.type_size())
                    .zip(out.chunks_exact_mut(ty.block_size()))
                {
                    decode_block(ty, b, &mut blocks[..per]);
                    for (blk, y) in blocks[..per].iter().zip(y.chunks_exact_mut(32)) {
                        blk.dequantize(ty, y);
                    }
                }
            }
        }
    }
}

/// Buffers `matmul` needs, sized once for the largest call.
pub struct MatmulScratch {
    max_tokens: usize,
    max_cols: usize,
}

impl MatmulScratch {
    pub fn new(max_tokens: usize, max_cols: usize) -> Self {
        MatmulScratch {
            max_tokens,
            max_cols,
        }
    }
}

fn check_args(w: &QMatrix, x: &[f32], n_tokens: usize, out: &[f32]) {
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul: x must be n_tokens x cols"
    );
    assert_eq!(
        out.len(),
        n_tokens * w.rows,
        "matmul: out must be n_tokens x rows"
    );
}

/// `out[n*rows + r] = Σ_k x[n*cols + k] · W[r][k]` for every token `n`.
/// Batch-invariant: token `n`'s outputs do not depend on `n_tokens`, on `n`'s
/// position, on the pool size or on the ISA.
pub fn matmul(
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    check_args(w, x, n_tokens, out);
    assert!(
        n_tokens <= scratch.max_tokens && w.cols <= scratch.max_cols,
        "matmul: scratch planned for {}x{}, call needs {}x{}",
        scratch.max_tokens,
        scratch.max_cols,
        n_tokens,
        w.cols
    );
    // Interim scalar path: per row, dequantize and take a sequential f32 dot
    // with each token. Rows are split across threads; each writes its own outputs.
    const ROWS_PER_TASK: usize = 16;
    let n_tasks = w.rows.div_ceil(ROWS_PER_TASK);
    let out_ptr = SendPtr(out.as_mut_ptr());
    pool.parallel_for(n_tasks, &|task| {
        let mut row = [0f32; 32];
        let r0 = task * ROWS_PER_TASK;
        for r in r0..(r0 + ROWS_PER_TASK).min(w.rows) {
            for n in 0..n_tokens {
                let xr = &x[n * w.cols..(n + 1) * w.cols];
                let mut acc = 0f32;
                let mut k = 0;
                while k < w.cols {
                    let len = 32.min(w.cols - k);
                    dequantize_range(w, r, k, &mut row[..len]);
                    for (a, b) in row[..len].iter().zip(&xr[k..k + len]) {
                        acc = a.mul_add(*b, acc);
                    }
                    k += len;
                }
                // SAFETY: index n*rows + r is in bounds (checked lengths) and each
                // (n, r) is written by exactly one task (tasks own disjoint rows).
                unsafe { *out_ptr.get().add(n * w.rows + r) = acc };
            }
        }
    });
}

/// A raw pointer that may cross threads; users guarantee disjoint writes.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to write disjoint output elements from pool tasks.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Dequantize elements `k .. k + out.len()` of row `r` (interim helper).
fn dequantize_range(w: &QMatrix, r: usize, k: usize, out: &mut [f32]) {
    let bs = w.ty.block_size();
    let src = &w.data[r * w.row_bytes..(r + 1) * w.row_bytes];
    match w.ty {
        GgmlType::F32 => {
            for (i, o) in out.iter_mut().enumerate() {
                let p = 4 * (k + i);
                *o = f32::from_le_bytes([src[p], src[p + 1], src[p + 2], src[p + 3]]);
            }
        }
        GgmlType::F16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = f16_at(src, 2 * (k + i));
            }
        }
        ty => {
            let b = k / bs;
            let mut blocks = [Block32::default(); 8];
            let per = bs / 32;
            decode_block(
                ty,
                &src[b * ty.type_size()..(b + 1) * ty.type_size()],
                &mut blocks[..per],
            );
            blocks[(k % bs) / 32].dequantize(ty, out);
        }
    }
}

/// Scalar oracle: dequantize each row, dot in f64, round once.
pub fn matmul_reference(w: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    check_args(w, x, n_tokens, out);
    let mut row = vec![0f32; w.cols];
    for r in 0..w.rows {
        w.dequantize_row(r, &mut row);
        for n in 0..n_tokens {
            let xr = &x[n * w.cols..(n + 1) * w.cols];
            let s: f64 = row.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            out[n * w.rows + r] = s as f32;
        }
    }
}
