//! Dense layer `y = x · Wᵀ + b` with the weight repacked at load time into column panels.
//!
//! A panel holds `NR` consecutive output features for every input feature (`[k][NR]`,
//! contiguous), so the micro-kernel streams one panel while `MR` input rows accumulate in a
//! `MR x NR` register tile. The inner loops are plain fixed-width array arithmetic that LLVM
//! vectorises for whatever vector width the build targets; no `unsafe` is needed.
//!
//! Every output element is the sum over `k` in ascending order starting from 0 and the bias is
//! added last, whatever `MR`, row offset or thread split produced it: results are
//! batch-invariant bit for bit.

use npu_runtime::kernels::gemm_f32::{GemmIsa, PackedF32};
use npu_runtime::kernels::{GgmlType, QMatrix};

/// Output features per panel (one 64-byte cache line of f32).
const NR: usize = 16;
/// Input rows per register tile.
pub(crate) const MR: usize = 2;

/// A linear layer ready for [`PackedLinear::forward`].
#[derive(Debug, Clone)]
pub struct PackedLinear {
    n: usize,
    k: usize,
    /// `ceil(n / NR)` panels of `k * NR` floats; features past `n` are zero.
    panels: Vec<f32>,
    bias: Vec<f32>,
}

impl PackedLinear {
    /// Packs a row-major `[n, k]` weight (PyTorch `nn.Linear` layout) and its `[n]` bias.
    ///
    /// Panics if the slice lengths disagree with `n` and `k` (callers validate shapes first).
    pub fn new(weight: &[f32], bias: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(weight.len(), n * k, "weight is not [n, k]");
        assert_eq!(bias.len(), n, "bias is not [n]");
        let n_panels = n.div_ceil(NR);
        let mut panels = vec![0.0f32; n_panels * k * NR];
        for (p, panel) in panels.chunks_exact_mut(k * NR).enumerate() {
            for j in 0..NR.min(n - p * NR) {
                let row = &weight[(p * NR + j) * k..][..k];
                for (kk, &w) in row.iter().enumerate() {
                    panel[kk * NR + j] = w;
                }
            }
        }
        PackedLinear {
            n,
            k,
            panels,
            bias: bias.to_vec(),
        }
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.n
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.k
    }

    /// `y[r] = x[r] · Wᵀ + b` for every row: `x` is `[rows, k]`, `y` is `[rows, n]`.
    pub fn forward(&self, x: &[f32], y: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len() % k.max(1), 0, "x is not [rows, k]");
        let rows = x.len() / k;
        assert_eq!(y.len(), rows * n, "y is not [rows, n]");
        let mut r = 0;
        while r + MR <= rows {
            self.tile::<MR>(&x[r * k..(r + MR) * k], &mut y[r * n..(r + MR) * n]);
            r += MR;
        }
        while r < rows {
            self.tile::<1>(&x[r * k..(r + 1) * k], &mut y[r * n..(r + 1) * n]);
            r += 1;
        }
    }

    /// `M` rows against every panel.
    fn tile<const M: usize>(&self, x: &[f32], y: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        let xs: [&[f32]; M] = std::array::from_fn(|r| &x[r * k..(r + 1) * k]);
        for (p, panel) in self.panels.chunks_exact(k * NR).enumerate() {
            let mut acc = [[0.0f32; NR]; M];
            for (kk, w) in panel.chunks_exact(NR).enumerate() {
                let w: &[f32; NR] = w.try_into().expect("chunk of NR");
                for r in 0..M {
                    let a = xs[r][kk];
                    for j in 0..NR {
                        acc[r][j] += a * w[j];
                    }
                }
            }
            let j0 = p * NR;
            let width = NR.min(n - j0);
            for r in 0..M {
                let out = &mut y[r * n + j0..r * n + j0 + width];
                for ((o, a), b) in out.iter_mut().zip(&acc[r]).zip(&self.bias[j0..]) {
                    *o = a + b;
                }
            }
        }
    }
}

/// A dense layer on the best available path: Q8_0 weights on the runtime's int8 matmul, f32
/// weights on the register-blocked GEMM when this CPU has FMA, otherwise the portable
/// [`PackedLinear`] (the GEMM's scalar path relies on `mul_add`, which is a slow library call
/// on x86 builds without FMA).
pub(crate) enum Linear {
    /// Quantized weights on the runtime's int8 matmul.
    Simd {
        w: QMatrix,
        bias: Vec<f32>,
    },
    /// f32 weights on the register-blocked GEMM ([`npu_runtime::kernels::gemm_f32`]).
    Gemm {
        w: PackedF32,
        bias: Vec<f32>,
    },
    Packed(PackedLinear),
}

/// How the encoder stores its dense-layer weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// The checkpoint's f32 values (reference accuracy).
    #[default]
    F32,
    /// ggml Q8_0 (int8 blocks of 32 with an f16 scale; activations are quantized per token
    /// the same way), run by the runtime's int8 dot-product kernels: several times faster,
    /// slightly less exact.
    Q8_0,
}

/// ggml's reference Q8_0 quantization of row-major `[n, k]` f32 weights (`k` % 32 == 0).
fn quantize_q8_0(weight: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(weight.len() / 32 * 34);
    for block in weight.chunks_exact(32) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(half::f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|v| round_to_i8(v * id) as u8));
    }
    out
}

/// `x.round() as i8` (halves away from zero, as C's `roundf` in ggml) without a call to
/// libm's `roundf` per weight (7% of the embedder's load): in f64 `x ± 0.5` is exact for
/// every f32 `x`, and the saturating cast truncates toward zero.
fn round_to_i8(x: f32) -> i8 {
    let x = f64::from(x);
    (x + 0.5f64.copysign(x)) as i8
}

impl Linear {
    /// `weight` is row-major `[n, k]`, `bias` is `[n]`.
    pub fn new(weight: &[f32], bias: &[f32], n: usize, k: usize, format: WeightFormat) -> Self {
        if format == WeightFormat::Q8_0 && k.is_multiple_of(32) {
            if let Ok(w) = QMatrix::from_ggml(GgmlType::Q8_0, n, k, &quantize_q8_0(weight)) {
                return Linear::Simd {
                    w,
                    bias: bias.to_vec(),
                };
            }
        }
        if GemmIsa::detect() != GemmIsa::Scalar {
            return Linear::Gemm {
                w: PackedF32::new(weight, n, k),
                bias: bias.to_vec(),
            };
        }
        Linear::Packed(PackedLinear::new(weight, bias, n, k))
    }

    pub fn out_features(&self) -> usize {
        match self {
            Linear::Simd { w, .. } => w.rows(),
            Linear::Gemm { w, .. } => w.n(),
            Linear::Packed(p) => p.out_features(),
        }
    }

    pub fn in_features(&self) -> usize {
        match self {
            Linear::Simd { w, .. } => w.cols(),
            Linear::Gemm { w, .. } => w.k(),
            Linear::Packed(p) => p.in_features(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_to_i8_equals_round_then_cast() {
        let mut vals: Vec<f32> = vec![f32::NAN, f32::INFINITY, -f32::INFINITY, 0.0, -0.0];
        for k in -260..=260 {
            let h = k as f32 * 0.5;
            // Halves, and the floats either side of them.
            vals.extend([h, h.next_down(), h.next_up()]);
        }
        let mut seed = 99u64;
        for _ in 0..100_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            vals.push(((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 300.0);
        }
        for v in vals {
            assert_eq!(super::round_to_i8(v), v.round() as i8, "{v}");
        }
    }

    use super::*;

    /// `len` values in [-1, 1) from a 64-bit LCG whose state starts one step past `seed`.
    fn values(seed: u64, len: usize) -> Vec<f32> {
        let next = |s: u64| {
            s.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407)
        };
        let mut s = next(seed);
        (0..len)
            .map(|_| {
                s = next(s);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Scalar reference with the same summation order (k ascending, bias last).
    fn reference(w: &[f32], b: &[f32], x: &[f32], n: usize, k: usize) -> Vec<f32> {
        let rows = x.len() / k;
        let mut y = vec![0.0; rows * n];
        for r in 0..rows {
            for j in 0..n {
                let mut s = 0.0f32;
                for kk in 0..k {
                    s += x[r * k + kk] * w[j * k + kk];
                }
                y[r * n + j] = s + b[j];
            }
        }
        y
    }

    #[test]
    fn matches_scalar_reference_bit_for_bit() {
        for (i, &(rows, n, k)) in [
            (1, 1, 1),
            (3, 5, 7),
            (4, 16, 16),
            (9, 33, 40),
            (13, 384, 96),
            (7, 40, 1),
        ]
        .iter()
        .enumerate()
        {
            let w = values(i as u64 * 3 + 1, n * k);
            let b = values(i as u64 * 3 + 2, n);
            let x = values(i as u64 * 3 + 3, rows * k);
            let lin = PackedLinear::new(&w, &b, n, k);
            let mut y = vec![f32::NAN; rows * n];
            lin.forward(&x, &mut y);
            assert_eq!(y, reference(&w, &b, &x, n, k), "rows {rows} n {n} k {k}");
        }
    }

    #[test]
    fn row_result_does_not_depend_on_batch() {
        let (n, k) = (48, 24);
        let lin = PackedLinear::new(&values(1, n * k), &values(2, n), n, k);
        let x = values(3, 11 * k);
        let mut all = vec![0.0; 11 * n];
        lin.forward(&x, &mut all);
        for r in 0..11 {
            let mut one = vec![0.0; n];
            lin.forward(&x[r * k..(r + 1) * k], &mut one);
            assert_eq!(one, all[r * n..(r + 1) * n]);
        }
    }

    #[test]
    fn dispatched_linear_agrees_with_reference() {
        use npu_runtime::kernels::{matmul, MatmulScratch, ThreadPool};
        let (rows, n, k) = (37, 48, 40);
        let (w, b, x) = (values(7, n * k), values(8, n), values(9, rows * k));
        let lin = Linear::new(&w, &b, n, k, WeightFormat::F32);
        assert_eq!((lin.out_features(), lin.in_features()), (n, k));
        let mut y = vec![0.0; rows * n];
        match &lin {
            Linear::Gemm { w, bias } => {
                use npu_runtime::kernels::gemm_f32::{gemm_f32, GemmScratch};
                let pool = ThreadPool::new(2);
                let scratch = GemmScratch::new(2, k);
                gemm_f32(w, Some(bias), &x, rows, &mut y, &scratch, &pool);
            }
            Linear::Simd { w, bias } => {
                let pool = ThreadPool::new(2);
                matmul(w, &x, rows, &mut y, &mut MatmulScratch::new(rows, k), &pool);
                for row in y.chunks_exact_mut(n) {
                    row.iter_mut().zip(bias).for_each(|(o, b)| *o += b);
                }
            }
            Linear::Packed(p) => p.forward(&x, &mut y),
        }
        for (got, want) in y.iter().zip(reference(&w, &b, &x, n, k)) {
            assert!(
                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
    }
}
