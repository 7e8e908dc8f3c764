//! Sentence embeddings for dense retrieval: all-MiniLM-L6-v2 (English, the default) here,
//! multilingual-e5-small in [`E5Embedder`]; [`load_named`] loads either by its model-cache
//! name, [`choose_embedder`] picks the one an index was built with.
//!
//! Text handling lives here (MiniLM: WordPiece tokenizer from `tokenizer.json`, truncation to
//! the sentence-transformers `max_seq_length` of 256 tokens); the encoder itself runs in the
//! [`rag_embedder`] crate, which also mean-pools and L2-normalises.

use crate::embed_api::{ChunkTokenizer, Embedder};
pub use crate::embed_e5::{E5Embedder, E5_EMBEDDER};
use crate::models::{cache_dir, DEFAULT_EMBEDDER};
use anyhow::{anyhow, bail, Context, Result};
/// The encoder's weight format, part of this module's API ([`MiniLmEmbedder::load_with`]).
pub use rag_embedder::WeightFormat;
use rag_embedder::{BertModel, BertWorkspace};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokenizers::{Tokenizer, TruncationParams};

/// Tokens per text, special tokens included (`max_seq_length` of the model's
/// sentence-transformers config; tokenizer.json itself says 128).
pub const MAX_TOKENS: usize = 256;
/// Padded tokens per encoder call: bounds the workspace (about 40 MB at 4096).
const BATCH_TOKENS: usize = 4096;
const MODEL_ID: &str = "all-MiniLM-L6-v2/mean/l2/max256";
const MODEL_ID_Q8_0: &str = "all-MiniLM-L6-v2/mean/l2/max256/q8_0";
/// Names the WordPiece vocabulary in chunk config strings (the same for f32 and Q8_0).
const TOKENIZER_ID: &str = "minilm-wordpiece";
const FILES: [&str; 3] = ["config.json", "model.safetensors", "tokenizer.json"];

/// all-MiniLM-L6-v2 on the runtime's BERT encoder.
pub struct MiniLmEmbedder {
    tokenizer: Tokenizer,
    model: BertModel,
    /// Planned once; one embedding call at a time uses it (the encoder itself is threaded).
    workspace: Mutex<BertWorkspace>,
    model_id: &'static str,
}

impl MiniLmEmbedder {
    /// `$RAG_MODEL_DIR/minilm-l6-v2`, else `~/.cache/rag/models/minilm-l6-v2`.
    pub fn default_dir() -> PathBuf {
        cache_dir().join(DEFAULT_EMBEDDER)
    }

    /// Loads `config.json`, `model.safetensors` and `tokenizer.json` from `dir` (f32 weights,
    /// within 1e-6 of the reference implementation).
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_with(dir, WeightFormat::F32)
    }

    /// As [`MiniLmEmbedder::load`] with the dense layers in `format`. `Q8_0` is about 3.7x
    /// faster on CPUs with int8 dot products and has a different [`Embedder::model_id`]
    /// (cosine to the f32 vectors about 0.998).
    pub fn load_with(dir: &Path, format: WeightFormat) -> Result<Self> {
        let missing: Vec<&str> = FILES
            .iter()
            .copied()
            .filter(|f| !dir.join(f).is_file())
            .collect();
        if !missing.is_empty() {
            bail!(
                "embedding model files missing in {}: {}; run `scripts/fetch-model.sh {DEFAULT_EMBEDDER}`",
                dir.display(),
                missing.join(", ")
            );
        }
        let model = BertModel::load_as(dir, format)
            .with_context(|| format!("loading the embedding model from {}", dir.display()))?;
        let path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&path)
            .map_err(|e| anyhow!("{} is not a valid tokenizer.json: {e}", path.display()))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| anyhow!("{}: cannot set truncation: {e}", path.display()))?;
        let vocab = tokenizer.get_vocab_size(true);
        let model_vocab = model.config().vocab_size;
        if vocab > model_vocab {
            bail!(
                "{}: tokenizer has {vocab} tokens but the model's vocabulary has {model_vocab}",
                path.display()
            );
        }
        // Planned for one sequence: a query (`rag search`, `rag ask`) needs no more, and
        // zeroing the buffers of a whole indexing batch (~60 MB) cost ~25 ms of every
        // start-up; the first larger batch grows them once (`BertModel::encode` plans).
        let workspace = Mutex::new(model.workspace(1, MAX_TOKENS));
        let model_id = match format {
            WeightFormat::F32 => MODEL_ID,
            WeightFormat::Q8_0 => MODEL_ID_Q8_0,
        };
        Ok(MiniLmEmbedder {
            tokenizer,
            model,
            workspace,
            model_id,
        })
    }

    /// Loads with the weight format named by `RAG_EMBED_FORMAT` (`q8_0`, the default, or
    /// `f32`); every entry point (CLI, [`crate::assistant::Assistant`]) loads this way, so
    /// an index is never embedded by one format and queried by another.
    pub fn load_configured(dir: &Path) -> Result<Self> {
        Self::load_with(dir, configured_format()?)
    }

    /// Token ids the encoder sees for `text` ([CLS] … [SEP], at most [`MAX_TOKENS`]).
    pub fn token_ids(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Worker threads of the encoder (default: available parallelism).
    pub fn set_threads(&mut self, threads: usize) {
        self.model.set_threads(threads);
    }
}

/// The weight format `RAG_EMBED_FORMAT` asks for: `q8_0` (default) or `f32`. Q8_0 is the
/// default because it embeds faster and measured the same recall as f32 on the retrieval set
/// (BENCHMARKS.md, `retrieval-quality` vs `retrieval-quality-q8_0`). The format is part of
/// [`Embedder::model_id`], so switching it re-embeds an index's chunks.
pub fn configured_format() -> Result<WeightFormat> {
    match std::env::var("RAG_EMBED_FORMAT").ok().as_deref() {
        None | Some("") | Some("q8_0") => Ok(WeightFormat::Q8_0),
        Some("f32") => Ok(WeightFormat::F32),
        Some(other) => bail!("RAG_EMBED_FORMAT={other}: expected f32 or q8_0"),
    }
}

impl Embedder for MiniLmEmbedder {
    fn dim(&self) -> usize {
        self.model.config().hidden_size
    }

    fn model_id(&self) -> &str {
        self.model_id
    }

    fn chunk_tokenizer(&self) -> Option<ChunkTokenizer> {
        // A private copy without truncation: an over-long line must count in full.
        let mut tok = self.tokenizer.clone();
        tok.with_truncation(None).ok()?;
        Some(ChunkTokenizer {
            id: TOKENIZER_ID.to_string(),
            max_text_tokens: MAX_TOKENS - 2, // [CLS] and [SEP]
            count: std::sync::Arc::new(move |text: &str| {
                // WordPiece cannot fail on a &str; were it to, the estimate keeps chunking going.
                tok.encode(text, false)
                    .map(|e| e.len())
                    .unwrap_or_else(|_| corpus_tools::tokens::estimate_tokens(text))
            }),
        })
    }

    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let ids = texts
            .iter()
            .map(|t| self.token_ids(t))
            .collect::<Result<Vec<_>>>()?;
        embed_token_ids(&self.model, &self.workspace, &ids)
    }

    fn name(&self) -> Option<&str> {
        Some(DEFAULT_EMBEDDER)
    }
}

/// Sentence embeddings of token-id sequences (special tokens in place), in input order, in
/// encoder calls of at most [`BATCH_TOKENS`] padded tokens.
pub(crate) fn embed_token_ids(
    model: &BertModel,
    workspace: &Mutex<BertWorkspace>,
    ids: &[Vec<u32>],
) -> Result<Vec<Vec<f32>>> {
    // Longest first, so each encoder call pads to nearly its real lengths.
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
    let dim = model.config().hidden_size;
    let mut out = vec![Vec::new(); ids.len()];
    let mut ws = workspace
        .lock()
        .map_err(|_| anyhow!("embedding workspace poisoned by an earlier panic"))?;
    let mut flat = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let longest = ids[order[start]].len().max(1);
        let n = (BATCH_TOKENS / longest).clamp(1, order.len() - start);
        let group = &order[start..start + n];
        let batch: Vec<&[u32]> = group.iter().map(|&i| ids[i].as_slice()).collect();
        flat.resize(n * dim, 0.0);
        model.sentence_embeddings(&mut ws, &batch, &mut flat)?;
        for (&i, v) in group.iter().zip(flat.chunks_exact(dim)) {
            out[i] = v.to_vec();
        }
        start += n;
    }
    Ok(out)
}

/// The embedders an index can be built with, by model-cache name
/// (`scripts/fetch-model.sh NAME`): all-MiniLM-L6-v2 (English, the default) and
/// multilingual-e5-small.
pub const EMBEDDERS: [&str; 2] = [DEFAULT_EMBEDDER, E5_EMBEDDER];

/// Loads the embedder `name` (one of [`EMBEDDERS`]) from the model cache in the weight format
/// `RAG_EMBED_FORMAT` asks for ([`configured_format`]). A model that is not cached is an
/// error naming the command that fetches it.
pub fn load_named(name: &str) -> Result<Arc<dyn Embedder>> {
    load_named_with(name, configured_format()?)
}

/// [`load_named`] with the dense layers in `format`.
pub fn load_named_with(name: &str, format: WeightFormat) -> Result<Arc<dyn Embedder>> {
    match name {
        DEFAULT_EMBEDDER => Ok(Arc::new(MiniLmEmbedder::load_with(
            &MiniLmEmbedder::default_dir(),
            format,
        )?)),
        E5_EMBEDDER => Ok(Arc::new(E5Embedder::load_with(
            &E5Embedder::default_path(),
            format,
        )?)),
        other => bail!(
            "unknown embedder '{other}': expected one of {}",
            EMBEDDERS.join(", ")
        ),
    }
}

/// The embedder for the index at `index_dir`: `requested` if named (`rag index --embedder`;
/// a different one than the index's re-embeds it when indexing), else the one the index was
/// embedded with ([`crate::Index::stored_embedder`]), else the default.
pub fn choose_embedder(index_dir: &Path, requested: Option<&str>) -> Result<String> {
    if let Some(name) = requested {
        if !EMBEDDERS.contains(&name) {
            bail!(
                "unknown embedder '{name}': expected one of {}",
                EMBEDDERS.join(", ")
            );
        }
        return Ok(name.to_string());
    }
    // An unreadable store (damaged: `rag index --rebuild` must still start) falls back to the
    // default; opening the index reports the damage itself.
    Ok(crate::Index::stored_embedder(index_dir)
        .ok()
        .flatten()
        .unwrap_or_else(|| DEFAULT_EMBEDDER.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_dir() -> Option<PathBuf> {
        let dir = MiniLmEmbedder::default_dir();
        if dir.join("model.safetensors").is_file() {
            return Some(dir);
        }
        if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
            return None;
        }
        panic!(
            "{} missing: run `scripts/fetch-model.sh minilm-l6-v2` (or set RAG_SKIP_MODEL_TESTS=1)",
            dir.display()
        );
    }

    struct Case {
        text: String,
        ids: Vec<u32>,
        embedding: Vec<f32>,
    }

    fn golden() -> Vec<Case> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/embedder/tests/fixtures/minilm_golden.json"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v["sentences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| Case {
                text: s["text"].as_str().unwrap().to_string(),
                ids: s["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_u64().unwrap() as u32)
                    .collect(),
                embedding: s["embedding"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_f64().unwrap() as f32)
                    .collect(),
            })
            .collect()
    }

    fn cosine_and_max_diff(a: &[f32], b: &[f32]) -> (f64, f32) {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        (dot / (na * nb), diff)
    }

    #[test]
    fn text_to_embedding_matches_independent_reference() {
        let Some(dir) = model_dir() else { return };
        let e = MiniLmEmbedder::load(&dir).unwrap();
        assert_eq!(e.dim(), 384);
        let cases = golden();
        for c in &cases {
            assert_eq!(
                e.token_ids(&c.text).unwrap(),
                c.ids,
                "tokens of {:?}",
                c.text
            );
        }
        let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
        let got = e.embed_batch(&texts).unwrap();
        for (c, v) in cases.iter().zip(&got) {
            let (cos, diff) = cosine_and_max_diff(v, &c.embedding);
            assert!(
                cos > 0.9999 && diff < 1e-4,
                "{:?}: cos {cos} diff {diff}",
                c.text
            );
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5);
        }
        // One at a time gives the same vectors as the padded, reordered batch.
        for (t, v) in texts.iter().zip(&got) {
            assert_eq!(&e.embed_batch(&[t]).unwrap()[0], v, "{t:?}");
        }
    }

    #[test]
    fn q8_0_embedder_is_close_and_has_its_own_id() {
        let Some(dir) = model_dir() else { return };
        let e = MiniLmEmbedder::load_with(&dir, WeightFormat::Q8_0).unwrap();
        assert_ne!(e.model_id(), MODEL_ID);
        let cases = golden();
        let texts: Vec<&str> = cases.iter().map(|c| c.text.as_str()).collect();
        for (c, v) in cases.iter().zip(e.embed_batch(&texts).unwrap()) {
            let (cos, _) = cosine_and_max_diff(&v, &c.embedding);
            assert!(cos > 0.997, "{:?}: cos {cos}", c.text);
        }
    }

    #[test]
    fn long_and_odd_texts_do_not_panic() {
        let Some(dir) = model_dir() else { return };
        let e = MiniLmEmbedder::load(&dir).unwrap();
        let long = "retrieval ".repeat(5000);
        assert_eq!(e.token_ids(&long).unwrap().len(), MAX_TOKENS);
        let odd = ["", " \n\t ", "\u{0}\u{7}", "🚀🚀🚀", &long];
        let v = e.embed_batch(&odd).unwrap();
        assert_eq!(v.len(), odd.len());
        assert!(v
            .iter()
            .all(|x| x.len() == 384 && x.iter().all(|f| f.is_finite())));
        assert!(e.embed_batch(&[]).unwrap().is_empty());
        // Truncation keeps the head: a long text embeds like its first 254 word pieces.
        let head = "retrieval ".repeat(MAX_TOKENS - 2);
        assert_eq!(e.embed_batch(&[&head]).unwrap()[0], v[4]);
    }

    #[test]
    fn load_errors_are_clear() {
        let tmp = tempfile::tempdir().unwrap();
        let err = MiniLmEmbedder::load(tmp.path()).err().unwrap().to_string();
        assert!(err.contains("scripts/fetch-model.sh minilm-l6-v2"), "{err}");
        let Some(dir) = model_dir() else { return };
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(dir.join(f), tmp.path().join(f)).unwrap();
        }
        std::fs::write(tmp.path().join("tokenizer.json"), "{ not json").unwrap();
        let err = MiniLmEmbedder::load(tmp.path()).err().unwrap().to_string();
        assert!(err.contains("tokenizer.json"), "{err}");
        let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
        std::fs::write(
            tmp.path().join("config.json"),
            config.replace("\"hidden_size\": 384", "\"hidden_size\": 768"),
        )
        .unwrap();
        std::fs::copy(
            dir.join("tokenizer.json"),
            tmp.path().join("tokenizer.json"),
        )
        .unwrap();
        let err = format!("{:#}", MiniLmEmbedder::load(tmp.path()).err().unwrap());
        assert!(err.contains("shape"), "{err}");
    }
}
