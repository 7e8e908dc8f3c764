//! Transformer weights (llama, qwen2) loaded from GGUF into kernel matrices.
//!
//! GGUF stores a linear layer as `dims = [cols (input), rows (output)]`, row-major by output
//! feature, which is exactly the `QMatrix` layout. Norm weights and biases become f32.

use crate::error::{Result, RuntimeError};
use crate::kernels::screen::ArgmaxScreen;
use crate::kernels::{kernel_supported, QMatrix, ThreadPool};
use crate::weights_cache::Cached;
use graphs::config::{layer_tensor_name, ModelConfig};
use graphs::gguf::{GgufFile, TensorInfo};
use graphs::quant::GgmlType;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The cache name of the LM head screen's coarse copy (no GGUF tensor has a name
/// without a `.weight`/`.bias` suffix like this one).
pub const SCREEN_COARSE: &str = "lm_head.screen_coarse";

pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    /// qwen2 only.
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub wo: QMatrix,
    pub ffn_norm: Vec<f32>,
    pub w_gate: QMatrix,
    pub w_up: QMatrix,
    pub w_down: QMatrix,
}

pub struct ModelWeights {
    /// `vocab` rows of `n_embd`; also the LM head when embeddings are tied.
    pub token_embd: QMatrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `None` when tied to `token_embd`.
    pub output: Option<QMatrix>,
    /// The LM head's screen for argmax-only calls (`kernels::screen`): Q8_0 heads
    /// only, unless loading asked for a plain head.
    pub lm_screen: Option<ArgmaxScreen>,
}

impl ModelWeights {
    /// Repacks every tensor on `pool`'s threads: each layer and each vocabulary matrix is
    /// one task, the two large vocabulary matrices first. Loading is mostly repacking and
    /// first-touch page faults, both of which scale with cores; the result does not depend
    /// on the thread count (every task writes its own matrices), and errors are reported
    /// in a fixed order (token_embd, output, layers 0..).
    ///
    /// Matrices that `cached` holds (a repacked-weights cache made for this file, see
    /// `weights_cache`) are mapped from it instead of repacked; the returned flag says
    /// whether every matrix came from there.
    pub fn load(
        f: &GgufFile,
        cfg: &ModelConfig,
        pool: &ThreadPool,
        cached: Option<&Cached>,
    ) -> Result<(Self, bool)> {
        let src = Source {
            f,
            cached,
            repacked: AtomicBool::new(false),
        };
        let vocab: [Slot<QMatrix>; 2] = Default::default();
        let layer_slots: Vec<Slot<LayerWeights>> =
            (0..cfg.n_layer).map(|_| Mutex::new(None)).collect();
        pool.parallel_for_in_order(2 + cfg.n_layer, &|j| match j {
            0 => put(&vocab[0], src.matrix("token_embd.weight")),
            1 if cfg.tied_embeddings => {}
            1 => put(&vocab[1], src.matrix("output.weight")),
            l => put(&layer_slots[l - 2], load_layer(&src, cfg, l - 2)),
        });
        let [embd_slot, output_slot] = vocab;
        let token_embd = take(embd_slot).expect("the token_embd task ran")?;
        let output = take(output_slot).transpose()?;
        let layers = layer_slots
            .into_iter()
            .map(|slot| take(slot).expect("every layer task ran"))
            .collect::<Result<Vec<_>>>()?;
        let w = ModelWeights {
            token_embd,
            layers,
            output_norm: vector(f, "output_norm.weight")?,
            output,
            lm_screen: None,
        };
        w.check_shapes(cfg)?;
        let all_cached = cached.is_some() && !src.repacked.into_inner();
        Ok((w, all_cached))
    }

    /// Every matrix with its GGUF tensor name (what a repacked-weights cache stores),
    /// and the LM head screen's coarse copy as [`SCREEN_COARSE`].
    pub fn named_matrices(&self) -> Vec<(String, &QMatrix)> {
        let mut v = vec![("token_embd.weight".to_string(), &self.token_embd)];
        if let Some(o) = &self.output {
            v.push(("output.weight".to_string(), o));
        }
        if let Some(s) = &self.lm_screen {
            v.push((SCREEN_COARSE.to_string(), s.coarse()));
        }
        for (l, w) in self.layers.iter().enumerate() {
            let named = [
                ("attn_q.weight", &w.wq),
                ("attn_k.weight", &w.wk),
                ("attn_v.weight", &w.wv),
                ("attn_output.weight", &w.wo),
                ("ffn_gate.weight", &w.w_gate),
                ("ffn_up.weight", &w.w_up),
                ("ffn_down.weight", &w.w_down),
            ];
            v.extend(named.map(|(n, m)| (layer_tensor_name(l, n), m)));
        }
        v
    }

    pub fn lm_head(&self) -> &QMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Bytes of weight data held (for memory reports).
    pub fn bytes(&self) -> usize {
        let q = |m: &QMatrix| m.rows() * m.ggml_type().row_bytes(m.cols()).unwrap_or(0);
        let mut n = q(&self.token_embd) + self.output.as_ref().map_or(0, q);
        n += self.lm_screen.as_ref().map_or(0, ArgmaxScreen::size_bytes);
        for l in &self.layers {
            n += q(&l.wq) + q(&l.wk) + q(&l.wv) + q(&l.wo);
            n += q(&l.w_gate) + q(&l.w_up) + q(&l.w_down);
        }
        n
    }

    fn check_shapes(&self, cfg: &ModelConfig) -> Result<()> {
        let q_dim = cfg.n_head * cfg.head_dim;
        let kv_dim = cfg.n_head_kv * cfg.head_dim;
        let (e, ff) = (cfg.n_embd, cfg.n_ff);
        let want = |name: &str, m: &QMatrix, rows: usize, cols: usize| -> Result<()> {
            if m.rows() != rows || m.cols() != cols {
                return Err(RuntimeError::Model(format!(
                    "{name}: shape {}x{}, expected {rows}x{cols}",
                    m.rows(),
                    m.cols()
                )));
            }
            Ok(())
        };
        want("token_embd", &self.token_embd, cfg.vocab_size, e)?;
        want("lm_head", self.lm_head(), cfg.vocab_size, e)?;
        for l in &self.layers {
            want("attn_q", &l.wq, q_dim, e)?;
            want("attn_k", &l.wk, kv_dim, e)?;
            want("attn_v", &l.wv, kv_dim, e)?;
            want("attn_output", &l.wo, e, q_dim)?;
            want("ffn_gate", &l.w_gate, ff, e)?;
            want("ffn_up", &l.w_up, ff, e)?;
            want("ffn_down", &l.w_down, e, ff)?;
            let lens = [
                (l.attn_norm.len(), e),
                (l.ffn_norm.len(), e),
                (l.bq.as_ref().map_or(q_dim, Vec::len), q_dim),
                (l.bk.as_ref().map_or(kv_dim, Vec::len), kv_dim),
                (l.bv.as_ref().map_or(kv_dim, Vec::len), kv_dim),
            ];
            if lens.iter().any(|(a, b)| a != b) {
                return Err(RuntimeError::Model("norm or bias length mismatch".into()));
            }
        }
        if self.output_norm.len() != e {
            return Err(RuntimeError::Model("output_norm length mismatch".into()));
        }
        Ok(())
    }
}

/// One loading task's result, written by the pool thread that ran it.
type Slot<T> = Mutex<Option<Result<T>>>;

fn put<T>(slot: &Slot<T>, v: Result<T>) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
}

fn take<T>(slot: Slot<T>) -> Option<Result<T>> {
    slot.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn load_layer(src: &Source, cfg: &ModelConfig, l: usize) -> Result<LayerWeights> {
    let m = |n: &str| src.matrix(&layer_tensor_name(l, n));
    let v = |n: &str| vector(src.f, &layer_tensor_name(l, n));
    let bias = |n: &str| -> Result<Option<Vec<f32>>> {
        if cfg.has_qkv_bias {
            v(n).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(LayerWeights {
        attn_norm: v("attn_norm.weight")?,
        wq: m("attn_q.weight")?,
        wk: m("attn_k.weight")?,
        wv: m("attn_v.weight")?,
        bq: bias("attn_q.bias")?,
        bk: bias("attn_k.bias")?,
        bv: bias("attn_v.bias")?,
        wo: m("attn_output.weight")?,
        ffn_norm: v("ffn_norm.weight")?,
        w_gate: m("ffn_gate.weight")?,
        w_up: m("ffn_up.weight")?,
        w_down: m("ffn_down.weight")?,
    })
}

fn info<'a>(f: &'a GgufFile, name: &str) -> Result<&'a TensorInfo> {
    f.tensor(name)
        .ok_or_else(|| RuntimeError::Model(format!("missing tensor '{name}'")))
}

/// Where matrices come from: the cache when it has them, else the GGUF (repacked).
struct Source<'a> {
    f: &'a GgufFile,
    cached: Option<&'a Cached>,
    /// Set when some matrix had to be repacked.
    repacked: AtomicBool,
}

impl Source<'_> {
    fn matrix(&self, name: &str) -> Result<QMatrix> {
        let f = self.f;
        let t = info(f, name)?;
        if t.dims.len() != 2 {
            return Err(RuntimeError::Model(format!(
                "{name}: expected 2 dimensions, got {:?}",
                t.dims
            )));
        }
        let ty = t.ggml_type;
        if !kernel_supported(ty) {
            return Err(RuntimeError::Model(format!(
                "{name}: tensor type {ty:?} is not supported by the CPU kernels"
            )));
        }
        if let Some(m) = self
            .cached
            .and_then(|c| c.matrix(name, ty, t.n_rows(), t.row_len()))
        {
            return Ok(m);
        }
        self.repacked.store(true, Ordering::Relaxed);
        repack(f, t)
    }
}

fn repack(f: &GgufFile, t: &TensorInfo) -> Result<QMatrix> {
    let (name, ty) = (&t.name, t.ggml_type);
    let data = f.tensor_data(t);
    let m = QMatrix::from_ggml(ty, t.n_rows(), t.row_len(), data)
        .map_err(|e| RuntimeError::Model(format!("{name}: {e}")))?;
    // The repacked copy is all we use from now on: unmap the file's pages so peak RSS
    // stays near one model size instead of mapped file + repacked copy (they stay in
    // the page cache for the next process).
    f.release_tensor_pages(t);
    Ok(m)
}

fn vector(f: &GgufFile, name: &str) -> Result<Vec<f32>> {
    let t = info(f, name)?;
    let n = t.n_elements() as usize;
    let ty = t.ggml_type;
    if !matches!(ty, GgmlType::F32 | GgmlType::F16) {
        return Err(RuntimeError::Model(format!(
            "{name}: expected an f32/f16 vector, got {ty:?}"
        )));
    }
    let m = QMatrix::from_ggml(ty, 1, n, f.tensor_data(t))
        .map_err(|e| RuntimeError::Model(format!("{name}: {e}")))?;
    let mut out = vec![0.0; n];
    m.dequantize_row(0, &mut out);
    Ok(out)
}
