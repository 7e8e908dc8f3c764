//! Quantized weight matrices and `out = x · Wᵀ` with run-time ISA dispatch.

use super::act::{quantize_parallel, ActFormat, QuantActs};
use super::ggml::{kernel_supported, GgmlType};
use super::layout::{decode_tile, dequantize_tile_row, pack_group, Planes, Tile, GROUP};
use super::pool::ThreadPool;
use super::simd::{detected, Isa};
use super::{portable, KernelError};

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
    ty: GgmlType,
    rows: usize,
    cols: usize,
    planes: Planes,
    data: Vec<Line>,
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
            data: vec![Line([0; 64]); n_groups * gb / 64],
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

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes with no padding, so the vector's
        // storage is `len * 64` initialised bytes, borrowed immutably with `self`.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<u8>(), self.data.len() * 64) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably with `self`.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.data.as_mut_ptr().cast::<u8>(),
                self.data.len() * 64,
            )
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
        self.data.len() * 64
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
                    decode_tile(ty, &self.planes, group, b, &mut tile);
                    dequantize_tile_row(ty, &tile, i, y);
                }
            }
        }
    }
}

/// What a kernel needs for one call.
pub(crate) struct Kernel<'a> {
    pub ty: GgmlType,
    pub cols: usize,
    pub n_tokens: usize,
    pub planes: Planes,
    data: &'a [u8],
}

impl<'a> Kernel<'a> {
    pub fn group(&self, g: usize) -> &'a [u8] {
        let gb = self.planes.group_bytes();
        &self.data[g * gb..(g + 1) * gb]
    }
}

/// Buffers `matmul` needs (quantized activations), sized once for the
/// largest call so `matmul` never allocates.
pub struct MatmulScratch {
    max_tokens: usize,
    max_cols: usize,
    acts: QuantActs,
}

impl MatmulScratch {
    pub fn new(max_tokens: usize, max_cols: usize) -> Self {
        MatmulScratch {
            max_tokens,
            max_cols,
            acts: QuantActs::new(max_tokens, max_cols),
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

/// `out[n*rows + r] = Σ_k x[n*cols + k] · W[r][k]` for every token `n`, on the
/// ISA chosen by [`detected`].
///
/// Batch-invariant: token `n`'s outputs are bit-identical whatever `n_tokens`,
/// `n`'s position, the pool size and the ISA. Quantized formats quantize each
/// token's activations to int8 blocks of 32 (see `act`); F32/F16 use f32.
pub fn matmul(
    w: &QMatrix,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut MatmulScratch,
    pool: &ThreadPool,
) {
    matmul_with_isa(detected(), w, x, n_tokens, out, scratch, pool)
}

/// [`matmul`] on a given ISA (falls back to portable if this CPU lacks it).
pub fn matmul_with_isa(
    isa: Isa,
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
    if n_tokens == 0 {
        return;
    }
    let isa = if isa.is_supported() {
        isa
    } else {
        Isa::Portable
    };
    let quantized = !matches!(w.ty, GgmlType::F32 | GgmlType::F16);
    if quantized {
        quantize_parallel(
            isa,
            ActFormat::for_weights(w.ty),
            x,
            &mut scratch.acts,
            pool,
        );
    }
    let k = Kernel {
        ty: w.ty,
        cols: w.cols,
        n_tokens,
        planes: w.planes,
        data: w.bytes(),
    };
    let acts = &scratch.acts;
    let n_groups = w.rows.div_ceil(GROUP);
    let rows = w.rows;
    let work = w.rows * w.cols * n_tokens;
    let n_tasks = if work < 1 << 16 {
        1
    } else {
        n_groups.min(4 * pool.n_threads())
    };
    let out_ptr = SendPtr(out.as_mut_ptr());
    let write = move |t: usize, g: usize, acc: &[f32; GROUP]| {
        let r0 = g * GROUP;
        let n = GROUP.min(rows - r0);
        // SAFETY: t < n_tokens and r0 + n <= rows, so the range lies inside
        // `out` (length n_tokens * rows, checked above). Group g belongs to
        // exactly one task and each (t, g) is written once, so writes from
        // different threads never overlap, and `out` is exclusively borrowed
        // for the duration of this call.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(out_ptr.get().add(t * rows + r0), n);
            // A fixed-size copy for full groups (inline vector moves, not a memmove call).
            match <&mut [f32; GROUP]>::try_from(&mut *dst) {
                Ok(full) => *full = *acc,
                Err(_) => dst.copy_from_slice(&acc[..n]),
            }
        }
    };
    pool.parallel_for(n_tasks, &|task| {
        let g0 = task * n_groups / n_tasks;
        let g1 = (task + 1) * n_groups / n_tasks;
        run_isa(isa, &k, acts, x, g0, g1, &write);
    });
}

fn run_isa(
    isa: Isa,
    k: &Kernel,
    acts: &QuantActs,
    x: &[f32],
    g0: usize,
    g1: usize,
    write: &dyn Fn(usize, usize, &[f32; GROUP]),
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `matmul_with_isa` only passes an ISA this CPU supports, and the
        // activations were quantized for this call's tokens and columns.
        Isa::Avx512Vnni => unsafe { super::x86_avx512::run(k, acts, x, g0, g1, write) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for AVX2.
        Isa::Avx2 => unsafe { super::x86_avx2::run(k, acts, x, g0, g1, write) },
        _ => portable::run(k, acts, x, g0, g1, write),
    }
}

/// A raw output pointer shared by pool tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to write disjoint output ranges from pool tasks (see `write`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Scalar oracle: dequantize each row (ggml's reference arithmetic), dot in
/// f64 with the unquantized activations, round once.
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
