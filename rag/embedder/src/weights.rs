//! Reads a BERT checkpoint (`model.safetensors`) into f32 buffers, checking every tensor's
//! presence, type and shape against the config before anything is sized from it.

use super::{linear::Linear, BertConfig, BertError, WeightFormat};
use npu_runtime::kernels::ThreadPool;
use safetensors::{Dtype, SafeTensors};
use std::sync::Mutex;

pub(crate) struct LayerWeights {
    /// Query, key and value projections fused into one `[3·hidden, hidden]` layer.
    pub qkv: Linear,
    pub attn_out: Linear,
    pub attn_ln: (Vec<f32>, Vec<f32>),
    pub intermediate: Linear,
    pub output: Linear,
    pub out_ln: (Vec<f32>, Vec<f32>),
}

pub(crate) struct BertWeights {
    pub word: WordTable,
    pub position: Vec<f32>,
    pub token_type: Vec<f32>,
    pub emb_ln: (Vec<f32>, Vec<f32>),
    pub layers: Vec<LayerWeights>,
}

/// The word-embedding table: f32 rows, or Q4_0 rows dequantised one token at a time (a
/// 250k-token table is 54 MB in Q4_0 and would be 384 MB in f32).
pub(crate) enum WordTable {
    F32(Vec<f32>),
    /// Row-major Q4_0 blocks, `hidden / 32` blocks per row (see [`crate::q4`]).
    Q4_0(Vec<u8>),
}

impl WordTable {
    /// Writes row `id` (of width `out.len()`) into `out`.
    pub fn row_into(&self, id: usize, out: &mut [f32]) {
        let h = out.len();
        match self {
            WordTable::F32(w) => out.copy_from_slice(&w[id * h..][..h]),
            WordTable::Q4_0(q) => {
                let row = crate::q4::row_bytes(h);
                crate::q4::dequantize(&q[id * row..][..row], out);
            }
        }
    }
}

struct Reader<'a> {
    st: SafeTensors<'a>,
    prefix: &'static str,
    format: WeightFormat,
}

impl Reader<'_> {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, BertError> {
        let full = format!("{}{name}", self.prefix);
        let t = self
            .st
            .tensor(&full)
            .map_err(|_| BertError::Weights(format!("tensor {full} missing")))?;
        if t.shape() != shape {
            return Err(BertError::Weights(format!(
                "tensor {full} has shape {:?}, config implies {shape:?}",
                t.shape()
            )));
        }
        let data = t.data();
        let out: Vec<f32> = match t.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(BertError::Weights(format!(
                    "tensor {full} has dtype {other:?}, expected F32, F16 or BF16"
                )))
            }
        };
        if out.len() != shape.iter().product::<usize>() {
            return Err(BertError::Weights(format!(
                "tensor {full} data has the wrong length"
            )));
        }
        Ok(out)
    }

    fn linear(&self, name: &str, n: usize, k: usize) -> Result<Linear, BertError> {
        let w = self.get(&format!("{name}.weight"), &[n, k])?;
        let b = self.get(&format!("{name}.bias"), &[n])?;
        Ok(Linear::new(&w, &b, n, k, self.format))
    }

    fn norm(&self, name: &str, n: usize) -> Result<(Vec<f32>, Vec<f32>), BertError> {
        Ok((
            self.get(&format!("{name}.weight"), &[n])?,
            self.get(&format!("{name}.bias"), &[n])?,
        ))
    }
}

/// Reads and converts every tensor; the layers (and, as one more task, the embeddings) are
/// converted on `pool`'s threads, each into its own slot, and errors are reported in a
/// fixed order (layers 0.., then the embeddings), whatever the thread count.
pub(crate) fn load(
    cfg: &BertConfig,
    bytes: &[u8],
    format: WeightFormat,
    pool: &ThreadPool,
) -> Result<BertWeights, BertError> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| BertError::Weights(format!("not a valid safetensors file: {e}")))?;
    // Task heads (BertForMaskedLM, ...) nest the encoder under "bert.".
    let prefix = if st.tensor("bert.embeddings.word_embeddings.weight").is_ok() {
        "bert."
    } else {
        ""
    };
    let r = Reader { st, prefix, format };
    let n_layers = cfg.num_hidden_layers;
    let layer_slots: Vec<Mutex<Option<Result<LayerWeights, BertError>>>> =
        (0..n_layers).map(|_| Mutex::new(None)).collect();
    let embeddings = Mutex::new(None);
    // Largest first: the embeddings (a 30522-row table), then the layers in order.
    pool.parallel_for_in_order(n_layers + 1, &|task| match task {
        0 => *lock(&embeddings) = Some(r.embeddings(cfg)),
        l => *lock(&layer_slots[l - 1]) = Some(r.layer(cfg, l - 1)),
    });
    let layers = layer_slots
        .into_iter()
        .map(|s| into_inner(s).expect("every layer task ran"))
        .collect::<Result<Vec<_>, _>>()?;
    let (word, position, token_type, emb_ln) =
        into_inner(embeddings).expect("the embeddings task ran")?;
    Ok(BertWeights {
        word: WordTable::F32(word),
        position,
        token_type,
        emb_ln,
        layers,
    })
}

type Embeddings = (Vec<f32>, Vec<f32>, Vec<f32>, (Vec<f32>, Vec<f32>));

impl Reader<'_> {
    fn layer(&self, cfg: &BertConfig, l: usize) -> Result<LayerWeights, BertError> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let p = format!("encoder.layer.{l}.");
        let mut w = Vec::with_capacity(3 * h * h);
        let mut b = Vec::with_capacity(3 * h);
        for part in ["query", "key", "value"] {
            w.extend(self.get(&format!("{p}attention.self.{part}.weight"), &[h, h])?);
            b.extend(self.get(&format!("{p}attention.self.{part}.bias"), &[h])?);
        }
        Ok(LayerWeights {
            qkv: Linear::new(&w, &b, 3 * h, h, self.format),
            attn_out: self.linear(&format!("{p}attention.output.dense"), h, h)?,
            attn_ln: self.norm(&format!("{p}attention.output.LayerNorm"), h)?,
            intermediate: self.linear(&format!("{p}intermediate.dense"), i, h)?,
            output: self.linear(&format!("{p}output.dense"), h, i)?,
            out_ln: self.norm(&format!("{p}output.LayerNorm"), h)?,
        })
    }

    fn embeddings(&self, cfg: &BertConfig) -> Result<Embeddings, BertError> {
        let h = cfg.hidden_size;
        Ok((
            self.get("embeddings.word_embeddings.weight", &[cfg.vocab_size, h])?,
            self.get(
                "embeddings.position_embeddings.weight",
                &[cfg.max_position_embeddings, h],
            )?,
            self.get(
                "embeddings.token_type_embeddings.weight",
                &[cfg.type_vocab_size, h],
            )?,
            self.norm("embeddings.LayerNorm", h)?,
        ))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn into_inner<T>(m: Mutex<T>) -> T {
    m.into_inner().unwrap_or_else(|e| e.into_inner())
}
