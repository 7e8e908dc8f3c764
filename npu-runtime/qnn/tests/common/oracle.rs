//! A scalar f64 forward pass of a llama/qwen2 model: the exact reference both the CPU
//! backend (int8-quantized activations) and the QNN graphs (fp16) are measured against.
//! Weights are the GGUF tensors dequantized to f32 (`QMatrix::dequantize_row`, ggml's
//! arithmetic); everything after that is f64 with no intermediate rounding. Causal
//! attention over an f64 K/V history of its own (`Oracle` extends a sequence, so greedy
//! generation costs one pass per token; the matrices are dequantized once, ~0.5 GB of f32
//! for SmolLM2): slow but independent of both backends' code paths.

use graphs::config::RopeStyle;
use npu_runtime::kernels::QMatrix;
use npu_runtime::session::Model;

/// A weight matrix dequantized once (`[rows, cols]` f32), so that extending a sequence one
/// token at a time does not dequantize the whole model per token.
struct Dense {
    rows: usize,
    cols: usize,
    w: Vec<f32>,
}

fn dense(m: &QMatrix) -> Dense {
    let (rows, cols) = (m.rows(), m.cols());
    let mut w = vec![0f32; rows * cols];
    for (r, row) in w.chunks_exact_mut(cols).enumerate() {
        m.dequantize_row(r, row);
    }
    Dense { rows, cols, w }
}

/// One layer's matrices: q, k, v, o, gate, up, down.
type LayerMats = [Dense; 7];

/// `x [n, cols] -> [n, rows]` in f64 with the dequantized weight rows.
fn linear(w: &Dense, x: &[f64], n: usize, bias: Option<&[f32]>) -> Vec<f64> {
    let (rows, cols) = (w.rows, w.cols);
    let mut out = vec![0f64; n * rows];
    for r in 0..rows {
        let row = &w.w[r * cols..(r + 1) * cols];
        let b = bias.map_or(0.0, |b| f64::from(b[r]));
        for t in 0..n {
            out[t * rows + r] = b + dot(row, &x[t * cols..(t + 1) * cols]);
        }
    }
    out
}

/// f64 dot product with four partial sums (independent add chains run in parallel; the
/// summation order only matters at f64 rounding level, far below what is measured).
fn dot(w: &[f32], x: &[f64]) -> f64 {
    let mut acc = [0f64; 4];
    let (wc, xc) = (w.chunks_exact(4), x.chunks_exact(4));
    let tail: f64 = wc
        .remainder()
        .iter()
        .zip(xc.remainder())
        .map(|(a, b)| f64::from(*a) * b)
        .sum();
    for (a, b) in wc.zip(xc) {
        for k in 0..4 {
            acc[k] += f64::from(a[k]) * b[k];
        }
    }
    acc.iter().sum::<f64>() + tail
}

fn rms_norm(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let d = w.len();
    let mut out = vec![0f64; x.len()];
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ms = xr.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let s = 1.0 / (ms + f64::from(eps)).sqrt();
        for ((o, v), w) in or.iter_mut().zip(xr).zip(w) {
            *o = v * s * f64::from(*w);
        }
    }
    out
}

/// RoPE in place on `x [n, heads * d]`, row t at position `start + t`.
fn rope(x: &mut [f64], start: usize, heads: usize, d: usize, theta: f32, style: RopeStyle) {
    let n = x.len() / (heads * d);
    for t in 0..n {
        for h in 0..heads {
            let v = &mut x[(t * heads + h) * d..(t * heads + h + 1) * d];
            for i in 0..d / 2 {
                let inv = f64::from(theta).powf(-2.0 * i as f64 / d as f64);
                let (s, c) = ((start + t) as f64 * inv).sin_cos();
                let (a, b) = match style {
                    RopeStyle::Normal => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + d / 2),
                };
                let (x0, x1) = (v[a], v[b]);
                v[a] = x0 * c - x1 * s;
                v[b] = x0 * s + x1 * c;
            }
        }
    }
}

/// Logits `[tokens.len(), vocab]` of a causal forward pass over `tokens` from position 0.
pub fn forward(model: &Model, tokens: &[u32]) -> Vec<f64> {
    Oracle::new(model).extend(tokens)
}

/// The exact model's greedy continuation of `prompt`: `steps` tokens, each the argmax of
/// the logits after the previous one, with those logits (`steps` rows of `vocab`).
pub fn greedy(model: &Model, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f64>>) {
    let mut o = Oracle::new(model);
    let vocab = model.vocab_size();
    let mut logits = o.extend(prompt);
    let (mut tokens, mut rows) = (Vec::with_capacity(steps), Vec::with_capacity(steps));
    for s in 0..steps {
        let last = logits[logits.len() - vocab..].to_vec();
        let t = (0..vocab).fold(0, |b, i| if last[i] > last[b] { i } else { b }) as u32;
        tokens.push(t);
        rows.push(last);
        if s + 1 < steps {
            logits = o.extend(&[t]);
        }
    }
    (tokens, rows)
}

/// A sequence being extended: per layer the f64 K (after RoPE) and V of every position.
pub struct Oracle<'m> {
    model: &'m Model,
    mats: Vec<LayerMats>,
    lm_head: Dense,
    k: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
    len: usize,
}

impl<'m> Oracle<'m> {
    pub fn new(model: &'m Model) -> Self {
        let n = model.config().n_layer;
        let w = model.weights();
        let mats = w
            .layers
            .iter()
            .map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down].map(dense))
            .collect();
        Oracle {
            model,
            mats,
            lm_head: dense(w.lm_head()),
            k: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
            len: 0,
        }
    }

    /// Appends `tokens` at positions `len..`; logits `[tokens.len(), vocab]`.
    pub fn extend(&mut self, tokens: &[u32]) -> Vec<f64> {
        let c = self.model.config();
        let w = self.model.weights();
        let (n, e, d) = (tokens.len(), c.n_embd, c.head_dim);
        let (nh, nkv) = (c.n_head, c.n_head_kv);
        let (group, start) = (nh / nkv, self.len);
        let mut row = vec![0f32; e];
        let mut x = Vec::with_capacity(n * e);
        for &t in tokens {
            w.token_embd.dequantize_row(t as usize, &mut row);
            x.extend(row.iter().map(|&v| f64::from(v)));
        }
        let scale = 1.0 / (d as f64).sqrt();
        let mut p = vec![0f64; start + n];
        for (li, lw) in w.layers.iter().enumerate() {
            let xn = rms_norm(&x, &lw.attn_norm, c.rms_eps);
            let [wq, wk, wv, wo, w_gate, w_up, w_down] = &self.mats[li];
            let mut q = linear(wq, &xn, n, lw.bq.as_deref());
            let mut k_new = linear(wk, &xn, n, lw.bk.as_deref());
            rope(&mut q, start, nh, d, c.rope_theta, c.rope_style);
            rope(&mut k_new, start, nkv, d, c.rope_theta, c.rope_style);
            self.k[li].extend(k_new);
            self.v[li].extend(linear(wv, &xn, n, lw.bv.as_deref()));
            let (k, v) = (&self.k[li], &self.v[li]);
            let mut att = vec![0f64; n * nh * d];
            for t in 0..n {
                let pos = start + t;
                for h in 0..nh {
                    let kh = h / group;
                    let qv = &q[(t * nh + h) * d..(t * nh + h + 1) * d];
                    for (j, pj) in p.iter_mut().enumerate().take(pos + 1) {
                        let kv = &k[(j * nkv + kh) * d..(j * nkv + kh + 1) * d];
                        *pj = qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>() * scale;
                    }
                    let m = p[..=pos].iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                    let z: f64 = p[..=pos]
                        .iter_mut()
                        .map(|s| {
                            *s = (*s - m).exp();
                            *s
                        })
                        .sum();
                    let o = &mut att[(t * nh + h) * d..(t * nh + h + 1) * d];
                    for (j, pj) in p.iter().enumerate().take(pos + 1) {
                        let vv = &v[(j * nkv + kh) * d..(j * nkv + kh + 1) * d];
                        for (oi, vi) in o.iter_mut().zip(vv) {
                            *oi += pj / z * vi;
                        }
                    }
                }
            }
            let o = linear(wo, &att, n, None);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let xn = rms_norm(&x, &lw.ffn_norm, c.rms_eps);
            let gate = linear(w_gate, &xn, n, None);
            let up = linear(w_up, &xn, n, None);
            let m: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let down = linear(w_down, &m, n, None);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
        self.len += n;
        let xf = rms_norm(&x, &w.output_norm, c.rms_eps);
        linear(&self.lm_head, &xf, n, None)
    }
}
