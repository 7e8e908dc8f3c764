//! Lowering one block of transformer layers to a QNN graph (fp16 weights and activations).
//!
//! Graph I/O for a block at shape (T tokens, C KV slots), in creation order:
//! - inputs: token ids `i32 [T]` (first block) or hidden `f16 [T, E]`; RoPE `cos`, `sin`
//!   `f16 [T, D/2]` for each row's position; the additive attention mask `f16 [T, C]` over
//!   cache slots; the slot map `i32 [T, C]` (see below); then per layer the past K and V
//!   `f16 [C, Hkv*D]` (the host cache, slot-major, zeros from the first uncommitted slot).
//! - outputs: per layer the new rows' K (after RoPE) and V `f16 [T, Hkv*D]`, which the host
//!   writes into its cache; then logits `f16 [T, vocab]` (last block) or hidden `f16 [T, E]`.
//!
//! Every row attends over its own copy of the C slots ("slot attention"): `Gather` picks,
//! for row r and slot s, either the committed cache row s or the new row j that row r sees
//! at slot s, i.e. its ancestor (or itself) at depth `s - n_past`. Row r therefore sees its
//! context at the very columns, in the very order, that greedy decoding would have written
//! it, whether its ancestors arrive in the same run (a prefill chunk, a token tree in BFS
//! order) or were committed earlier. The HTP's fp16 accumulation then cannot depend on how
//! rows are cut into runs or laid out in a tree (an earlier lowering attended over
//! `[cache | this run's rows]` and did: docs/qnn.md), which is what lets prefill graphs and
//! decode/verify graphs differ in size and keeps speculative verification lossless. The
//! price is a `[T, C, Hkv*D]` copy of K and V per layer.
//!
//! The host owns the KV cache, the mask and the slot map, so one graph serves causal
//! prefill chunks, single-token decode and tree verification alike.
//!
//! Llama GGUF weights rotate adjacent pairs (2i, 2i+1). We permute the rows of Wq/Wk (and
//! their biases) inside each head to the halves layout (i, i + D/2) so RoPE is two slices
//! and a concat; dot products q.k are unchanged, but cached K rows are in the permuted
//! order (the cache of a QNN session is only read by QNN graphs). The attention scale
//! 1/sqrt(D) is folded into Wq and bq.
//!
//! Everything is fp16, the residual stream included. Tried and measured on SmolLM2: an
//! fp32 residual is rejected by this HTP build (fp32 ElementWiseAdd, error 3110), and a
//! compensated (hi, lo) fp16 residual with TwoSum left the logit error unchanged (0.79 vs
//! 0.78 of a 20.5 range), so the drift comes from the fp16 matmuls/attention, not the adds.

use crate::error::QnnResult;
use crate::ffi::Scalar;
use crate::graph::{DType, GraphBuilder, Param, Quant, TensorId, WeightFormat};
use graphs::config::RopeStyle;
use graphs::ir::{BlockSpec, GraphShape};
use half::f16;
use npu_runtime::kernels::QMatrix;
use npu_runtime::model::Model;

/// Mask value for hidden slots: large enough to zero the softmax weight in fp16, small
/// enough that score + mask stays finite.
pub const MASK_HIDDEN: f32 = -30000.0;

/// Bumped whenever the lowering changes, so cached context binaries are rebuilt.
pub const LOWERING_VERSION: u32 = 2;

/// A GGUF weight matrix with the host-side rewrites: rows taken in `order` (all rows when
/// `None`), multiplied by `scale`. Dequantized one row at a time while it is stored.
struct Matrix<'a> {
    m: &'a QMatrix,
    order: Option<&'a [usize]>,
    scale: f32,
}

fn matrix<'a>(m: &'a QMatrix, order: Option<&'a [usize]>, scale: f32) -> Matrix<'a> {
    Matrix { m, order, scale }
}

impl Matrix<'_> {
    fn dims(&self) -> [u32; 2] {
        [self.m.rows() as u32, self.m.cols() as u32]
    }

    /// Calls `f` with each dequantized row (f32, after the rewrites), in order.
    fn for_each_row(&self, mut f: impl FnMut(&[f32])) {
        let mut row = vec![0f32; self.m.cols()];
        for r in 0..self.m.rows() {
            self.m
                .dequantize_row(self.order.map_or(r, |o| o[r]), &mut row);
            row.iter_mut().for_each(|x| *x *= self.scale);
            f(&row);
        }
    }

    fn f16_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.m.rows() * self.m.cols() * 2);
        self.for_each_row(|row| out.extend(f16_bytes(row.iter().copied())));
        out
    }
}

fn f16_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter()
        .flat_map(|x| f16::from_f32(x).to_le_bytes())
        .collect()
}

/// Row permutation of one head for the halves RoPE layout (identity for Neox models).
fn head_perm(d: usize, style: RopeStyle) -> Vec<usize> {
    match style {
        RopeStyle::Neox => (0..d).collect(),
        RopeStyle::Normal => (0..d)
            .map(|j| {
                if j < d / 2 {
                    2 * j
                } else {
                    2 * (j - d / 2) + 1
                }
            })
            .collect(),
    }
}

/// Symmetric s8 for one row (output channel): scale = max |w| / 127, offset 0, values
/// rounded to nearest, appended to `q`. Returns the scale; an all-zero row gets 1 (any
/// positive scale stores zeros exactly).
fn quantize_s8_row(row: &[f32], q: &mut Vec<u8>) -> f32 {
    let max = row.iter().fold(0f32, |a, x| a.max(x.abs()));
    let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
    q.extend(
        row.iter()
            .map(|&x| (x / scale).round().clamp(-127.0, 127.0) as i8 as u8),
    );
    scale
}

/// Row order for Wq/Wk with `n_heads` heads of `d`.
fn qk_order(n_heads: usize, d: usize, style: RopeStyle) -> Vec<usize> {
    let p = head_perm(d, style);
    (0..n_heads * d).map(|r| (r / d) * d + p[r % d]).collect()
}

struct Lower<'g, 'c> {
    g: &'g mut GraphBuilder<'c>,
    weights: WeightFormat,
    head_dim: u32,
}

impl Lower<'_, '_> {
    fn native(&mut self, dims: &[u32]) -> QnnResult<TensorId> {
        self.g.native(DType::F16, dims)
    }

    fn op(
        &mut self,
        op: &str,
        ins: &[TensorId],
        dims: &[u32],
        params: Vec<Param<'_>>,
    ) -> QnnResult<TensorId> {
        let o = self.native(dims)?;
        self.g.node(op, ins, &[o], params)?;
        Ok(o)
    }

    fn binary(&mut self, op: &str, a: TensorId, b: TensorId) -> QnnResult<TensorId> {
        let dims = self.g.dims(a).to_vec();
        self.op(op, &[a, b], &dims, vec![])
    }

    fn reshape(&mut self, x: TensorId, dims: &[u32]) -> QnnResult<TensorId> {
        self.op("Reshape", &[x], dims, vec![])
    }

    fn transpose(&mut self, x: TensorId, perm: &[u32]) -> QnnResult<TensorId> {
        let d = self.g.dims(x).to_vec();
        let out: Vec<u32> = perm.iter().map(|&p| d[p as usize]).collect();
        self.op("Transpose", &[x], &out, vec![Param::u32s("perm", perm)])
    }

    fn concat(&mut self, a: TensorId, b: TensorId, axis: usize) -> QnnResult<TensorId> {
        let mut d = self.g.dims(a).to_vec();
        d[axis] += self.g.dims(b)[axis];
        self.op(
            "Concat",
            &[a, b],
            &d,
            vec![Param::Scalar("axis", Scalar::u32(axis as u32))],
        )
    }

    /// `x[..., lo..hi]` on the last axis.
    fn slice_last(&mut self, x: TensorId, lo: u32, hi: u32) -> QnnResult<TensorId> {
        let d = self.g.dims(x).to_vec();
        let mut ranges: Vec<[i32; 3]> = d.iter().map(|&n| [0, n as i32, 1]).collect();
        let last = d.len() - 1;
        ranges[last] = [lo as i32, hi as i32, 1];
        let mut out = d.clone();
        out[last] = hi - lo;
        self.op(
            "StridedSlice",
            &[x],
            &out,
            vec![Param::ranges("ranges", &ranges)],
        )
    }

    fn rms_norm(&mut self, x: TensorId, w: &[f32], eps: f32) -> QnnResult<TensorId> {
        let dims = self.g.dims(x).to_vec();
        let gamma = self
            .g
            .constant(DType::F16, &[w.len() as u32], f16_bytes(w.iter().copied()))?;
        self.op(
            "RmsNorm",
            &[x, gamma],
            &dims,
            vec![
                Param::Scalar("epsilon", Scalar::f32(eps)),
                Param::u32s("axes", &[dims.len() as u32 - 1]),
            ],
        )
    }

    /// A weight matrix as a static tensor `[rows, cols]` in the block's weight format.
    fn weight(&mut self, m: Matrix<'_>) -> QnnResult<TensorId> {
        let dims = m.dims();
        match self.weights {
            WeightFormat::F16 => self.g.constant(DType::F16, &dims, m.f16_bytes()),
            WeightFormat::S8PerChannel => {
                let mut q = Vec::with_capacity(dims[0] as usize * dims[1] as usize);
                let mut scale_offsets = Vec::with_capacity(dims[0] as usize);
                m.for_each_row(|row| scale_offsets.push((quantize_s8_row(row, &mut q), 0)));
                let quant = Quant::PerAxis {
                    axis: 0,
                    scale_offsets,
                };
                self.g.constant_quantized(DType::S8, &dims, q, &quant)
            }
        }
    }

    /// `x [T, in] -> [T, out]` with weights `[out, in]` and an optional fp16 bias.
    fn linear(
        &mut self,
        x: TensorId,
        w: Matrix<'_>,
        bias: Option<Vec<u8>>,
        dst: Option<TensorId>,
    ) -> QnnResult<TensorId> {
        let t = self.g.dims(x)[0];
        let out = w.dims()[0];
        let wt = self.weight(w)?;
        let mut ins = vec![x, wt];
        if let Some(b) = bias {
            ins.push(self.g.constant(DType::F16, &[out], b)?);
        }
        let o = match dst {
            Some(o) => o,
            None => self.native(&[t, out])?,
        };
        self.g.node("FullyConnected", &ins, &[o], vec![])?;
        Ok(o)
    }

    /// RoPE in the halves layout on `x [T, heads, D]` with `cos`/`sin [T, 1, D/2]`.
    fn rope(&mut self, x: TensorId, cos: TensorId, sin: TensorId) -> QnnResult<TensorId> {
        let d = self.g.dims(x)[2];
        let x1 = self.slice_last(x, 0, d / 2)?;
        let x2 = self.slice_last(x, d / 2, d)?;
        let a = self.binary("ElementWiseMultiply", x1, cos)?;
        let b = self.binary("ElementWiseMultiply", x2, sin)?;
        let lo = self.binary("ElementWiseSubtract", a, b)?;
        let c = self.binary("ElementWiseMultiply", x2, cos)?;
        let e = self.binary("ElementWiseMultiply", x1, sin)?;
        let hi = self.binary("ElementWiseAdd", c, e)?;
        self.concat(lo, hi, 2)
    }

    /// Row r's view of the cache: `out[r, s] = [past; new][slot_map[r, s]]` for past
    /// `[C, Hkv*D]` and this run's rows `new [T, Hkv*D]`, as `[T * Hkv, C, D]` (one batch
    /// per row and KV head, the layout the attention matmuls take).
    fn slot_rows(&mut self, past: TensorId, new: TensorId, map: TensorId) -> QnnResult<TensorId> {
        let [t, cap] = [self.g.dims(map)[0], self.g.dims(map)[1]];
        let kv_dim = self.g.dims(past)[1];
        let new2 = self.reshape(new, &[t, kv_dim])?;
        let all = self.concat(past, new2, 0)?;
        let rows = self.op(
            "Gather",
            &[all, map],
            &[t, cap, kv_dim],
            vec![Param::Scalar("axis", Scalar::i32(0))],
        )?;
        let d = self.head_dim;
        let heads = kv_dim / d;
        let r4 = self.reshape(rows, &[t, cap, heads, d])?;
        let tr = self.transpose(r4, &[0, 2, 1, 3])?;
        self.reshape(tr, &[t * heads, cap, d])
    }
}

/// Builds the block graph into `g` (not finalized), with its weight matrices in `weights`.
pub fn build_block(
    g: &mut GraphBuilder<'_>,
    model: &Model,
    block: &BlockSpec,
    shape: GraphShape,
    weights: WeightFormat,
) -> QnnResult<()> {
    let c = model.config();
    let w = model.weights();
    let (t, cap) = (shape.tokens as u32, shape.kv_capacity as u32);
    let (e, d) = (c.n_embd as u32, c.head_dim as u32);
    let (nh, nkv) = (c.n_head as u32, c.n_head_kv as u32);
    let group = nh / nkv;
    let kv_dim = nkv * d;
    let mut l = Lower {
        g,
        weights,
        head_dim: d,
    };

    // Inputs.
    let mut x = if block.first {
        let ids = l.g.input(DType::I32, &[t])?;
        let table = matrix(&w.token_embd, None, 1.0);
        let embd = l.g.constant(DType::F16, &table.dims(), table.f16_bytes())?;
        l.op(
            "Gather",
            &[embd, ids],
            &[t, e],
            vec![Param::Scalar("axis", Scalar::i32(0))],
        )?
    } else {
        l.g.input(DType::F16, &[t, e])?
    };
    let cos_in = l.g.input(DType::F16, &[t, d / 2])?;
    let sin_in = l.g.input(DType::F16, &[t, d / 2])?;
    let mask = l.g.input(DType::F16, &[t, cap])?;
    let slot_map = l.g.input(DType::I32, &[t, cap])?;
    let mut past = Vec::new();
    for _ in block.layers.clone() {
        let k = l.g.input(DType::F16, &[cap, kv_dim])?;
        let v = l.g.input(DType::F16, &[cap, kv_dim])?;
        past.push((k, v));
    }
    // Outputs, created up front so their order is fixed.
    let mut new_kv = Vec::new();
    for _ in block.layers.clone() {
        let k = l.g.output(DType::F16, &[t, kv_dim])?;
        let v = l.g.output(DType::F16, &[t, kv_dim])?;
        new_kv.push((k, v));
    }
    let out = if block.last {
        l.g.output(DType::F16, &[t, c.vocab_size as u32])?
    } else {
        l.g.output(DType::F16, &[t, e])?
    };

    let cos = l.reshape(cos_in, &[t, 1, d / 2])?;
    let mask3 = l.reshape(mask, &[t, 1, cap])?;
    let sin = l.reshape(sin_in, &[t, 1, d / 2])?;
    let q_order = qk_order(c.n_head, c.head_dim, c.rope_style);
    let k_order = qk_order(c.n_head_kv, c.head_dim, c.rope_style);
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    let n_layers = block.layers.len();

    for (li, layer) in block.layers.clone().enumerate() {
        let lw = &w.layers[layer];
        let xn = l.rms_norm(x, &lw.attn_norm, c.rms_eps)?;
        let bias = |b: &Option<Vec<f32>>, order: Option<&[usize]>, s: f32| {
            b.as_ref()
                .map(|b| f16_bytes((0..b.len()).map(|i| b[order.map_or(i, |o| o[i])] * s)))
        };
        let q = l.linear(
            xn,
            matrix(&lw.wq, Some(&q_order), scale),
            bias(&lw.bq, Some(&q_order), scale),
            None,
        )?;
        let k = l.linear(
            xn,
            matrix(&lw.wk, Some(&k_order), 1.0),
            bias(&lw.bk, Some(&k_order), 1.0),
            None,
        )?;
        let v = l.linear(xn, matrix(&lw.wv, None, 1.0), bias(&lw.bv, None, 1.0), None)?;
        let q3 = l.reshape(q, &[t, nh, d])?;
        let k3 = l.reshape(k, &[t, nkv, d])?;
        let q_rot = l.rope(q3, cos, sin)?;
        let k_rot = l.rope(k3, cos, sin)?;
        // New K/V rows for the host cache.
        let (k_out, v_out) = new_kv[li];
        l.g.node("Reshape", &[k_rot], &[k_out], vec![])?;
        l.g.node("Reshape", &[v], &[v_out], vec![])?;
        // Each row's own view of the C slots: past rows and this run's rows, gathered.
        let (kp, vp) = past[li];
        let k_new = l.reshape(k_rot, &[t, kv_dim])?;
        let k_rows = l.slot_rows(kp, k_new, slot_map)?; // [T * Hkv, C, D]
        let v_rows = l.slot_rows(vp, v, slot_map)?;
        let q_b = l.reshape(q_rot, &[t * nkv, group, d])?;
        let s = l.op(
            "MatMul",
            &[q_b, k_rows],
            &[t * nkv, group, cap],
            vec![
                Param::Scalar("transpose_in0", Scalar::bool8(false)),
                Param::Scalar("transpose_in1", Scalar::bool8(true)),
            ],
        )?;
        let s_h = l.reshape(s, &[t, nh, cap])?;
        let s_m = l.binary("ElementWiseAdd", s_h, mask3)?;
        let p = l.op(
            "Softmax",
            &[s_m],
            &[t, nh, cap],
            vec![Param::Scalar("axis", Scalar::u32(2))],
        )?;
        let p_b = l.reshape(p, &[t * nkv, group, cap])?;
        let a = l.op(
            "MatMul",
            &[p_b, v_rows],
            &[t * nkv, group, d],
            vec![
                Param::Scalar("transpose_in0", Scalar::bool8(false)),
                Param::Scalar("transpose_in1", Scalar::bool8(false)),
            ],
        )?;
        let a2 = l.reshape(a, &[t, nh * d])?;
        let o = l.linear(a2, matrix(&lw.wo, None, 1.0), None, None)?;
        let x1 = l.binary("ElementWiseAdd", x, o)?;
        // SwiGLU MLP.
        let xn2 = l.rms_norm(x1, &lw.ffn_norm, c.rms_eps)?;
        let gate = l.linear(xn2, matrix(&lw.w_gate, None, 1.0), None, None)?;
        let up = l.linear(xn2, matrix(&lw.w_up, None, 1.0), None, None)?;
        let sg = l.op("Sigmoid", &[gate], &[t, c.n_ff as u32], vec![])?;
        let silu = l.binary("ElementWiseMultiply", gate, sg)?;
        let m = l.binary("ElementWiseMultiply", silu, up)?;
        let down = l.linear(m, matrix(&lw.w_down, None, 1.0), None, None)?;
        let last_layer = li + 1 == n_layers;
        x = if last_layer && !block.last {
            l.g.node("ElementWiseAdd", &[x1, down], &[out], vec![])?;
            out
        } else {
            l.binary("ElementWiseAdd", x1, down)?
        };
    }
    if block.last {
        let xf = l.rms_norm(x, &w.output_norm, c.rms_eps)?;
        l.linear(xf, matrix(w.lm_head(), None, 1.0), None, Some(out))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_permutation_maps_adjacent_pairs() {
        // Adjacent pair (2i, 2i+1) lands at (i, i + d/2).
        let p = head_perm(8, RopeStyle::Normal);
        assert_eq!(p, vec![0, 2, 4, 6, 1, 3, 5, 7]);
        assert_eq!(head_perm(4, RopeStyle::Neox), vec![0, 1, 2, 3]);
        let o = qk_order(2, 4, RopeStyle::Normal);
        assert_eq!(o, vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }

    #[test]
    fn s8_rows_are_symmetric_per_row_and_within_half_a_step() {
        let data = [0.5, -1.27, 0.01, 0.0, 0.0, 0.0, 3.0, 2.0, -0.4];
        let mut q = Vec::new();
        let so: Vec<f32> = data.chunks(3).map(|r| quantize_s8_row(r, &mut q)).collect();
        assert_eq!(so, vec![1.27 / 127.0, 1.0, 3.0 / 127.0]);
        // The largest |w| of a row maps to +-127, zeros stay zero.
        assert_eq!(q[1] as i8, -127);
        assert_eq!(&q[3..6], &[0, 0, 0]);
        assert_eq!(q[6] as i8, 127);
        for (i, (&b, &w)) in q.iter().zip(&data).enumerate() {
            let s = so[i / 3];
            assert!(
                (f32::from(b as i8) * s - w).abs() <= s / 2.0 * 1.0001,
                "{i}"
            );
        }
        // Random rows: every value within half a step of its row's scale.
        let mut x = 0x2545_f491_u32;
        let row: Vec<f32> = (0..256)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32 - 0.5) * 0.2
            })
            .collect();
        q.clear();
        let s = quantize_s8_row(&row, &mut q);
        for (&b, &w) in q.iter().zip(&row) {
            assert!((f32::from(b as i8) * s - w).abs() <= s / 2.0 * 1.0001);
        }
    }
}
