//! all-MiniLM-L6-v2 through our BERT encoder against golden embeddings from an
//! independent float64 NumPy implementation (tests/fixtures/make_minilm_golden.py).

use rag_embedder::{BertModel, BertWorkspace, WeightFormat};
use std::path::PathBuf;

fn model_dir() -> Option<PathBuf> {
    let root = std::env::var_os("RAG_MODEL_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rag/models")))
        .expect("neither RAG_MODEL_DIR nor HOME is set");
    let dir = root.join("minilm-l6-v2");
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!(
            "skipping: {} missing and RAG_SKIP_MODEL_TESTS=1",
            dir.display()
        );
        return None;
    }
    panic!(
        "{} missing: run `scripts/fetch-model.sh minilm-l6-v2` (or set RAG_SKIP_MODEL_TESTS=1)",
        dir.display()
    );
}

struct Golden {
    ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
}

fn golden() -> Golden {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/minilm_golden.json"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let sentences = v["sentences"].as_array().unwrap();
    let nums = |x: &serde_json::Value| -> Vec<f64> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_f64().unwrap())
            .collect()
    };
    Golden {
        ids: sentences
            .iter()
            .map(|s| nums(&s["ids"]).iter().map(|&n| n as u32).collect())
            .collect(),
        embeddings: sentences
            .iter()
            .map(|s| nums(&s["embedding"]).iter().map(|&n| n as f32).collect())
            .collect(),
    }
}

fn embed(model: &BertModel, ws: &mut BertWorkspace, batch: &[&[u32]]) -> Vec<Vec<f32>> {
    let h = model.config().hidden_size;
    let mut out = vec![0.0; batch.len() * h];
    model.sentence_embeddings(ws, batch, &mut out).unwrap();
    out.chunks_exact(h).map(|c| c.to_vec()).collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let dot: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| *a as f64 * *b as f64)
        .sum();
    let na: f64 = got.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
    let cos = dot / (na * nb);
    let max_diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(cos > 0.9999, "{what}: cosine {cos}");
    assert!(max_diff < 1e-4, "{what}: max abs diff {max_diff}");
}

#[test]
fn matches_golden_embeddings_one_by_one_and_batched() {
    let Some(dir) = model_dir() else { return };
    let mut model = BertModel::load(&dir).unwrap();
    model.set_threads(2);
    let g = golden();
    let mut ws = model.workspace(g.ids.len(), 256);
    let singles: Vec<Vec<f32>> = g
        .ids
        .iter()
        .map(|ids| embed(&model, &mut ws, &[ids]).remove(0))
        .collect();
    for (i, (got, want)) in singles.iter().zip(&g.embeddings).enumerate() {
        assert_close(got, want, &format!("sentence {i} alone"));
    }
    // All sentences in one padded batch (lengths 2..256): padding must not leak, and each
    // row's reduction order is batch-invariant, so the bits are identical.
    let batch: Vec<&[u32]> = g.ids.iter().map(|v| v.as_slice()).collect();
    let batched = embed(&model, &mut ws, &batch);
    assert_eq!(batched, singles, "batched result differs from one-by-one");
    // Thread count does not change results either.
    model.set_threads(1);
    let mut ws1 = model.workspace(1, 16);
    assert_eq!(
        embed(&model, &mut ws1, &batch),
        singles,
        "1 thread differs from 2"
    );
}

#[test]
fn rejects_bad_input_without_panicking() {
    let Some(dir) = model_dir() else { return };
    let model = BertModel::load(&dir).unwrap();
    let mut ws = model.workspace(1, 8);
    let mut out = vec![0.0; 384];
    let too_long = vec![1000u32; 513];
    assert!(model
        .sentence_embeddings(&mut ws, &[&too_long], &mut out)
        .is_err());
    assert!(model
        .sentence_embeddings(&mut ws, &[&[]], &mut out)
        .is_err());
    assert!(model
        .sentence_embeddings(&mut ws, &[&[101, 30522, 102]], &mut out)
        .is_err());
    assert!(model
        .sentence_embeddings(&mut ws, &[&[101, 102]], &mut out[..10])
        .is_err());
    // The full position table is usable.
    let max = vec![1000u32; 512];
    model
        .sentence_embeddings(&mut ws, &[&max], &mut out)
        .unwrap();
    assert!(out.iter().all(|v| v.is_finite()));
    // Empty batch is fine.
    model.sentence_embeddings(&mut ws, &[], &mut []).unwrap();
}

#[test]
fn corrupt_model_files_give_errors() {
    let Some(dir) = model_dir() else { return };
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(BertModel::from_bytes(&config, b"not safetensors", WeightFormat::F32).is_err());
    let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
    let wrong = config.replace("\"intermediate_size\": 1536", "\"intermediate_size\": 1024");
    assert_ne!(wrong, config);
    let err = BertModel::from_bytes(&wrong, &weights, WeightFormat::F32)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("shape"), "{err}");
    let tmp = tempfile::tempdir().unwrap();
    let err = BertModel::load(tmp.path()).err().unwrap().to_string();
    assert!(err.contains("config.json"), "{err}");
}

#[test]
fn q8_0_weights_stay_close_and_batch_invariant() {
    let Some(dir) = model_dir() else { return };
    let mut model = BertModel::load_as(&dir, WeightFormat::Q8_0).unwrap();
    model.set_threads(2);
    let g = golden();
    let mut ws = model.workspace(g.ids.len(), 256);
    let singles: Vec<Vec<f32>> = g
        .ids
        .iter()
        .map(|ids| embed(&model, &mut ws, &[ids]).remove(0))
        .collect();
    for (i, (got, want)) in singles.iter().zip(&g.embeddings).enumerate() {
        // int8 weights and activations: measured worst cosine 0.9985 on this fixture.
        let cos: f32 = got.iter().zip(want).map(|(a, b)| a * b).sum();
        assert!(cos > 0.997, "sentence {i}: cosine {cos}");
    }
    let batch: Vec<&[u32]> = g.ids.iter().map(|v| v.as_slice()).collect();
    assert_eq!(embed(&model, &mut ws, &batch), singles);
}
