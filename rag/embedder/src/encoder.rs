//! The encoder graph: embeddings, N transformer layers, mean pooling.

use super::linear::Linear;
use super::linear::MR as ROW_ALIGN;
use super::ops::{add_layer_norm, exp_approx, gelu_in_place, mean_pool_normalize};
use super::packed_e5::PackedE5;
use super::parallel::for_row_chunks;
use super::unigram::UnigramTokenizer;
use super::weights::{self, BertWeights};
use super::{BertConfig, BertError, WeightFormat};
use npu_runtime::kernels::gemm_f32::{gemm_f32, gemm_f32_serial, BOperand, GemmIsa, GemmScratch};
use npu_runtime::kernels::{matmul, MatmulScratch, ThreadPool};
use std::path::Path;

/// Largest padded batch (`batch × longest sequence`) one call may run; bounds the workspace.
pub const MAX_BATCH_TOKENS: usize = 65_536;
/// Rows per SIMD matmul call: keeps the activations a call streams per weight group in cache.
const MATMUL_ROWS: usize = 128;

/// A loaded BERT encoder. Immutable after loading, so one model can serve many threads, each
/// with its own [`BertWorkspace`].
pub struct BertModel {
    cfg: BertConfig,
    w: BertWeights,
    pool: ThreadPool,
}

/// Every intermediate buffer of a forward pass, planned for a batch shape and reused across
/// calls; it grows (once) only if a call exceeds the shape it was planned for.
pub struct BertWorkspace {
    rows_cap: usize,
    hidden: Vec<f32>,
    proj: Vec<f32>,
    qkv: Vec<f32>,
    ctx: Vec<f32>,
    inter: Vec<f32>,
    /// Attention buffers, one per thread.
    attn: Vec<AttnScratch>,
    /// One empty scratch slot per thread for operations that need none.
    unit: Vec<()>,
    matmul: MatmulScratch,
    gemm: GemmScratch,
    lens: Vec<usize>,
    seq: usize,
}

/// One thread's attention buffers: a sequence's `len x len` scores and packed operands.
#[derive(Default)]
struct AttnScratch {
    scores: Vec<f32>,
    pack: Vec<f32>,
}

impl BertWorkspace {
    /// Padded length of the last batch.
    pub fn seq_len(&self) -> usize {
        self.seq
    }

    /// Real token count of each sequence of the last batch.
    pub fn lengths(&self) -> &[usize] {
        &self.lens
    }

    /// Last hidden state of the last batch, `[batch, seq_len, hidden]`; rows past a
    /// sequence's length are padding and hold no meaning.
    pub fn hidden_states(&self, hidden: usize) -> &[f32] {
        &self.hidden[..self.lens.len() * self.seq * hidden]
    }
}

/// [`read_parallel`] where positioned reads are not available: one `read`.
#[cfg(not(unix))]
fn read_parallel(path: &Path, _pool: &ThreadPool) -> std::io::Result<Vec<u8>> {
    std::fs::read(path)
}

/// Reads a whole file with the pool's threads, each reading (and first-touching) its own
/// pieces: a single `read` of the 90 MB checkpoint spent ~40 ms copying and faulting in
/// pages on one core.
#[cfg(unix)]
fn read_parallel(path: &Path, pool: &ThreadPool) -> std::io::Result<Vec<u8>> {
    read_in_pieces(path, pool, 8 << 20)
}

/// [`read_parallel`] with `piece` bytes per task.
#[cfg(unix)]
fn read_in_pieces(path: &Path, pool: &ThreadPool, piece: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    let len = usize::try_from(file.metadata()?.len())
        .map_err(|_| std::io::Error::other("file too large"))?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(len)
        .map_err(|_| std::io::Error::other("file too large to read into memory"))?;
    bytes.resize(len, 0);
    let failed = std::sync::Mutex::new(None);
    pool.for_each_chunk_mut(&mut bytes, piece, &|i, dst| {
        if let Err(e) = file.read_exact_at(dst, (i * piece) as u64) {
            failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(bytes),
    }
}

impl BertModel {
    /// Loads `config.json` and `model.safetensors` from `dir` with f32 weights.
    pub fn load(dir: &Path) -> Result<Self, BertError> {
        Self::load_as(dir, WeightFormat::F32)
    }

    /// Loads `config.json` and `model.safetensors` from `dir`, storing the dense layers in
    /// `format`.
    pub fn load_as(dir: &Path, format: WeightFormat) -> Result<Self, BertError> {
        let io = |path: std::path::PathBuf| move |source| BertError::Io { path, source };
        let path = dir.join("config.json");
        let config = std::fs::read(&path).map_err(io(path))?;
        let config = std::str::from_utf8(&config)
            .map_err(|_| BertError::Config("config.json is not UTF-8".into()))?;
        let pool = ThreadPool::with_available_parallelism();
        let path = dir.join("model.safetensors");
        let bytes = read_parallel(&path, &pool).map_err(io(path))?;
        Self::build(config, &bytes, format, pool)
    }

    /// Builds a model from `config.json` text and the bytes of a safetensors checkpoint.
    pub fn from_bytes(
        config_json: &str,
        safetensors: &[u8],
        format: WeightFormat,
    ) -> Result<Self, BertError> {
        let pool = ThreadPool::with_available_parallelism();
        Self::build(config_json, safetensors, format, pool)
    }

    /// Loads a packed multilingual-e5 file (`e5-small-q4.bin`, format `E5S1`): the encoder
    /// with its dense layers dequantised from Q4_0 into `format`, and the tokenizer stored in
    /// the same file.
    pub fn load_packed_e5(
        path: &Path,
        format: WeightFormat,
    ) -> Result<(Self, UnigramTokenizer), BertError> {
        let pool = ThreadPool::with_available_parallelism();
        let bytes = read_parallel(path, &pool).map_err(|source| BertError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::build_packed_e5(&bytes, format, pool)
    }

    /// [`BertModel::load_packed_e5`] from the file's bytes.
    pub fn packed_e5_from_bytes(
        bytes: &[u8],
        format: WeightFormat,
    ) -> Result<(Self, UnigramTokenizer), BertError> {
        Self::build_packed_e5(bytes, format, ThreadPool::with_available_parallelism())
    }

    fn build_packed_e5(
        bytes: &[u8],
        format: WeightFormat,
        pool: ThreadPool,
    ) -> Result<(Self, UnigramTokenizer), BertError> {
        let file = PackedE5::parse(bytes)?;
        let w = file.weights(format, &pool)?;
        let model = BertModel {
            cfg: file.config,
            w,
            pool,
        };
        Ok((model, file.tokenizer))
    }

    fn build(
        config_json: &str,
        safetensors: &[u8],
        format: WeightFormat,
        pool: ThreadPool,
    ) -> Result<Self, BertError> {
        let cfg = BertConfig::from_json(config_json)?;
        let w = weights::load(&cfg, safetensors, format, &pool)?;
        Ok(BertModel { cfg, w, pool })
    }

    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// Worker threads per forward pass (default: available parallelism).
    pub fn set_threads(&mut self, threads: usize) {
        if threads.max(1) != self.pool.n_threads() {
            self.pool = ThreadPool::new(threads);
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// A workspace planned for batches of up to `batch` sequences of `seq` tokens.
    pub fn workspace(&self, batch: usize, seq: usize) -> BertWorkspace {
        let mut ws = BertWorkspace {
            rows_cap: 0,
            hidden: Vec::new(),
            proj: Vec::new(),
            qkv: Vec::new(),
            ctx: Vec::new(),
            inter: Vec::new(),
            attn: Vec::new(),
            unit: Vec::new(),
            matmul: MatmulScratch::new(MATMUL_ROWS, self.max_in_features()),
            gemm: GemmScratch::new(self.pool.n_threads(), self.max_in_features()),
            lens: Vec::with_capacity(batch),
            seq: 0,
        };
        self.plan(
            &mut ws,
            batch * seq.min(self.cfg.max_position_embeddings),
            seq,
        );
        ws
    }

    fn plan(&self, ws: &mut BertWorkspace, rows: usize, seq: usize) {
        let (h, i) = (self.cfg.hidden_size, self.cfg.intermediate_size);
        if rows > ws.rows_cap {
            ws.rows_cap = rows;
            ws.hidden.resize(rows * h, 0.0);
            ws.proj.resize(rows * h, 0.0);
            ws.qkv.resize(rows * 3 * h, 0.0);
            ws.ctx.resize(rows * h, 0.0);
            ws.inter.resize(rows * i, 0.0);
        }
        let threads = self.pool.n_threads();
        if !ws.gemm.fits(threads, self.max_in_features()) {
            ws.gemm = GemmScratch::new(threads, self.max_in_features());
        }
        ws.unit.resize(threads, ());
        ws.attn.resize_with(threads, AttnScratch::default);
        for a in &mut ws.attn {
            if a.scores.len() < seq * seq {
                a.scores.resize(seq * seq, 0.0);
            }
        }
    }

    /// Runs the encoder on a batch of token-id sequences (special tokens included). The last
    /// hidden state is left in `ws` ([`BertWorkspace::hidden_states`]).
    pub fn encode(&self, ws: &mut BertWorkspace, batch: &[&[u32]]) -> Result<(), BertError> {
        let cfg = &self.cfg;
        for (b, ids) in batch.iter().enumerate() {
            if ids.is_empty() {
                return Err(BertError::InvalidInput(format!("sequence {b} is empty")));
            }
            if ids.len() > cfg.max_position_embeddings {
                return Err(BertError::InvalidInput(format!(
                    "sequence {b} has {} tokens, the model's limit is {}",
                    ids.len(),
                    cfg.max_position_embeddings
                )));
            }
            if let Some(&bad) = ids.iter().find(|&&id| id as usize >= cfg.vocab_size) {
                return Err(BertError::InvalidInput(format!(
                    "sequence {b}: token id {bad} outside the vocabulary of {}",
                    cfg.vocab_size
                )));
            }
        }
        let seq = batch.iter().map(|s| s.len()).max().unwrap_or(0);
        let rows = batch.len() * seq;
        if rows > MAX_BATCH_TOKENS {
            return Err(BertError::InvalidInput(format!(
                "padded batch of {} x {seq} tokens exceeds {MAX_BATCH_TOKENS}: split it",
                batch.len()
            )));
        }
        self.plan(ws, rows, seq);
        ws.seq = seq;
        ws.lens.clear();
        ws.lens.extend(batch.iter().map(|s| s.len()));
        if rows == 0 {
            return Ok(());
        }
        self.embed_tokens(ws, batch, rows);
        for layer in 0..cfg.num_hidden_layers {
            self.layer(ws, layer, rows);
        }
        Ok(())
    }

    /// Mean-pooled, L2-normalised sentence embeddings (`[batch, hidden]` into `out`), the
    /// sentence-transformers pipeline of all-MiniLM-L6-v2.
    pub fn sentence_embeddings(
        &self,
        ws: &mut BertWorkspace,
        batch: &[&[u32]],
        out: &mut [f32],
    ) -> Result<(), BertError> {
        let h = self.cfg.hidden_size;
        if out.len() != batch.len() * h {
            return Err(BertError::InvalidInput(format!(
                "output holds {} floats, batch needs {}",
                out.len(),
                batch.len() * h
            )));
        }
        self.encode(ws, batch)?;
        let seq = ws.seq;
        for ((o, &len), b) in out.chunks_exact_mut(h).zip(&ws.lens).zip(0..) {
            let rows = &ws.hidden[b * seq * h..(b * seq + len) * h];
            mean_pool_normalize(rows, h, o);
        }
        Ok(())
    }

    fn max_in_features(&self) -> usize {
        self.cfg.hidden_size.max(self.cfg.intermediate_size)
    }

    fn embed_tokens(&self, ws: &mut BertWorkspace, batch: &[&[u32]], rows: usize) {
        let h = self.cfg.hidden_size;
        let eps = self.cfg.layer_norm_eps as f32;
        let w = &self.w;
        let seq = ws.seq;
        for_row_chunks(
            &self.pool,
            &mut ws.hidden[..rows * h],
            h,
            1,
            &mut ws.unit,
            |first, chunk, _| {
                for (r, row) in chunk.chunks_exact_mut(h).enumerate() {
                    let (b, t) = ((first + r) / seq, (first + r) % seq);
                    let Some(&id) = batch[b].get(t) else {
                        row.fill(0.0); // padding
                        continue;
                    };
                    w.word.row_into(id as usize, row);
                    let pos = &w.position[t * h..][..h];
                    let ty = &w.token_type[..h];
                    for ((o, p), y) in row.iter_mut().zip(pos).zip(ty) {
                        *o = *o + p + y;
                    }
                    add_layer_norm(row, None, &w.emb_ln.0, &w.emb_ln.1, eps);
                }
            },
        );
    }

    fn layer(&self, ws: &mut BertWorkspace, l: usize, rows: usize) {
        let (h, i) = (self.cfg.hidden_size, self.cfg.intermediate_size);
        let eps = self.cfg.layer_norm_eps as f32;
        let lw = &self.w.layers[l];
        let ws = &mut *ws;

        let x = &ws.hidden[..rows * h];
        self.linear(
            &lw.qkv,
            x,
            &mut ws.qkv[..rows * 3 * h],
            ws.unit.as_mut_slice(),
            &mut ws.matmul,
            &ws.gemm,
            |_, _| {},
        );
        self.attention(ws, rows);
        let hidden = &ws.hidden[..rows * h];
        let post_attn = |first: usize, out: &mut [f32]| {
            for (r, row) in out.chunks_exact_mut(h).enumerate() {
                let res = &hidden[(first + r) * h..][..h];
                add_layer_norm(row, Some(res), &lw.attn_ln.0, &lw.attn_ln.1, eps);
            }
        };
        self.linear(
            &lw.attn_out,
            &ws.ctx[..rows * h],
            &mut ws.proj[..rows * h],
            &mut ws.unit,
            &mut ws.matmul,
            &ws.gemm,
            post_attn,
        );
        std::mem::swap(&mut ws.hidden, &mut ws.proj);
        let x = &ws.hidden[..rows * h];
        self.linear(
            &lw.intermediate,
            x,
            &mut ws.inter[..rows * i],
            &mut ws.unit,
            &mut ws.matmul,
            &ws.gemm,
            |_, out| gelu_in_place(out),
        );
        let hidden = &ws.hidden[..rows * h];
        let post_ffn = |first: usize, out: &mut [f32]| {
            for (r, row) in out.chunks_exact_mut(h).enumerate() {
                let res = &hidden[(first + r) * h..][..h];
                add_layer_norm(row, Some(res), &lw.out_ln.0, &lw.out_ln.1, eps);
            }
        };
        self.linear(
            &lw.output,
            &ws.inter[..rows * i],
            &mut ws.proj[..rows * h],
            &mut ws.unit,
            &mut ws.matmul,
            &ws.gemm,
            post_ffn,
        );
        std::mem::swap(&mut ws.hidden, &mut ws.proj);
    }

    /// `y = lin(x)` (bias included) split over the pool, then `epilogue(first_row, y_rows)`
    /// on each task's rows.
    #[allow(clippy::too_many_arguments)] // disjoint workspace fields, borrowed separately
    fn linear(
        &self,
        lin: &Linear,
        x: &[f32],
        y: &mut [f32],
        unit: &mut [()],
        scratch: &mut MatmulScratch,
        gemm: &GemmScratch,
        epilogue: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        let (n, k) = (lin.out_features(), lin.in_features());
        let pool = &self.pool;
        match lin {
            Linear::Packed(p) => for_row_chunks(pool, y, n, ROW_ALIGN, unit, |first, out, _| {
                let rows = out.len() / n;
                p.forward(&x[first * k..(first + rows) * k], out);
                epilogue(first, out);
            }),
            Linear::Gemm { w, bias } => {
                let rows = x.len() / k;
                gemm_f32(w, Some(bias), x, rows, y, gemm, pool);
                for_row_chunks(pool, y, n, 1, unit, |first, out, _| epilogue(first, out));
            }
            Linear::Simd { w, bias } => {
                // The kernel parallelises over output features; bias and epilogue over rows.
                for (xb, yb) in x.chunks(MATMUL_ROWS * k).zip(y.chunks_mut(MATMUL_ROWS * n)) {
                    matmul(w, xb, xb.len() / k, yb, scratch, pool);
                }
                for_row_chunks(pool, y, n, 1, unit, |first, out, _| {
                    for row in out.chunks_exact_mut(n) {
                        for (o, b) in row.iter_mut().zip(bias) {
                            *o += b;
                        }
                    }
                    epilogue(first, out);
                });
            }
        }
    }

    /// Scaled dot-product attention, per sequence and head as two small GEMMs
    /// (`S = Q·Kᵀ` over the real keys only, row softmax, `O = P·V`), sequences split over the
    /// pool. Depends only on each sequence's own tokens, never on the padding or the batch.
    fn attention(&self, ws: &mut BertWorkspace, rows: usize) {
        let h = self.cfg.hidden_size;
        let hd = self.cfg.head_dim();
        let seq = ws.seq;
        let scale = 1.0 / (hd as f32).sqrt();
        let isa = GemmIsa::detect();
        let (qkv, lens) = (&ws.qkv[..rows * 3 * h], &ws.lens);
        for_row_chunks(
            &self.pool,
            &mut ws.ctx[..rows * h],
            h,
            seq,
            &mut ws.attn,
            |first, chunk, sc| {
                for (s, out) in chunk.chunks_exact_mut(seq * h).enumerate() {
                    let b = first / seq + s;
                    let len = lens[b];
                    out[len * h..].fill(0.0); // padded queries: never read
                    let base = &qkv[b * seq * 3 * h..];
                    let scores = &mut sc.scores[..len * len];
                    for head in 0..self.cfg.num_attention_heads {
                        let col = head * hd;
                        let keys = BOperand::Rows {
                            b: &base[h + col..],
                            ld: 3 * h,
                        };
                        let q = &base[col..];
                        gemm_f32_serial(
                            isa,
                            q,
                            3 * h,
                            len,
                            keys,
                            len,
                            hd,
                            scores,
                            len,
                            &mut sc.pack,
                        );
                        for row in scores.chunks_exact_mut(len) {
                            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                            for v in row.iter_mut() {
                                *v = exp_approx((*v - max) * scale);
                            }
                            let inv = 1.0 / row.iter().sum::<f32>();
                            row.iter_mut().for_each(|v| *v *= inv);
                        }
                        let values = BOperand::Cols {
                            b: &base[2 * h + col..],
                            ld: 3 * h,
                        };
                        gemm_f32_serial(
                            isa,
                            scores,
                            len,
                            len,
                            values,
                            hd,
                            len,
                            &mut out[col..],
                            h,
                            &mut sc.pack,
                        );
                    }
                }
            },
        );
    }
}

#[cfg(all(test, unix))]
mod read_tests {
    use super::*;

    #[test]
    fn pieces_read_on_the_pool_equal_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        for len in [0usize, 1, 63, 64, 65, 1000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            std::fs::write(&path, &data).unwrap();
            for threads in [1, 3] {
                let got = read_in_pieces(&path, &ThreadPool::new(threads), 64).unwrap();
                assert_eq!(got, data, "len {len}, {threads} threads");
            }
        }
        assert!(read_parallel(&dir.path().join("missing"), &ThreadPool::new(2)).is_err());
    }
}
