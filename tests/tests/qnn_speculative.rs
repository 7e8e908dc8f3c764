//! Speculative decoding on the QNN HTP graphs (the emulator here) is lossless: `sdnpu`
//! drafts token trees, verifies them in the 16-row decode/verify graphs and commits the
//! accepted path, and its output equals plain greedy decoding on the same backend (one
//! decode step per token) token for token. SmolLM2-135M, 2 blocks, prefill graphs of 64
//! rows, verify graphs of 16, 256 KV slots; compiled graphs are kept in the context cache
//! (`RAG_QNN_CONTEXT_DIR`, else next to the QNN libraries) and shared with the CLI test of
//! `rag ask --backend qnn`, which uses the same shapes.

use npu_runtime::qnn::{BinaryCache, QnnBackend};
use npu_runtime::session::{generate_greedy, KvPrecision, LoadOptions, Model, Session};
use rag::engine::{qnn_session_options, QnnShapes};
use specdec::budget::CostCurve;
use specdec::{GenConfig, Generator, Mode};
use std::sync::Arc;

/// Whether the QNN libraries and SmolLM2 are there; without them the test fails with the
/// fetch command unless the matching `RAG_SKIP_*` variable is 1.
fn ready() -> Option<Arc<Model>> {
    if let Err(e) = npu_runtime::qnn::runtime() {
        if std::env::var("RAG_SKIP_QNN_TESTS").as_deref() == Ok("1") {
            eprintln!("skipping: {e}");
            return None;
        }
        panic!("{e} (set RAG_SKIP_QNN_TESTS=1 to skip QNN tests)");
    }
    let path = match npu_runtime::model_path::resolve("smollm2-135m") {
        Ok(p) => p,
        Err(e) if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") => {
            eprintln!("skipping: {e}");
            return None;
        }
        Err(e) => panic!("{e}"),
    };
    Some(Model::load(&path, &LoadOptions::default()).unwrap())
}

fn qnn_session(model: &Arc<Model>) -> Session<QnnBackend> {
    let shapes = QnnShapes {
        prefill_rows: 64,
        verify_rows: 16,
        blocks: 2,
        cache_dir: Some(BinaryCache::default_dir()),
    };
    let kv = 256;
    let backend = QnnBackend::new(
        model.clone(),
        kv,
        shapes.cache_dir.clone().map(BinaryCache::new),
    )
    .unwrap();
    let opts = qnn_session_options(&shapes, kv, KvPrecision::F32).unwrap();
    Session::with_backend(backend, model.clone(), opts).unwrap()
}

/// Prompts whose continuations repeat their own text, so drafts get accepted and whole
/// trees are verified (a check that accepted nothing would prove nothing).
const PROMPTS: [&str; 2] = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of France is Paris. The capital of Germany is",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(",
];
const TOKENS: usize = 16;

#[test]
fn qnn_sdnpu_equals_qnn_greedy_token_for_token() {
    let Some(model) = ready() else { return };
    let mut session = qnn_session(&model);
    // A flat curve, as the 16-row graph's cost is the same for every batch it holds:
    // the controller may verify up to 16 rows per step.
    let curve = CostCurve::new(vec![1, 2, 4, 8, 16], vec![1.0; 5]).unwrap();
    let mut accepted_more_than_one = false;
    for text in PROMPTS {
        let mut prompt = vec![model.tokenizer().bos_id().unwrap_or(0)];
        prompt.extend(model.tokenizer().encode(text, false).unwrap());
        session.truncate(0).unwrap();
        let mut greedy = Vec::new();
        generate_greedy(&mut session, &prompt, TOKENS, |t| {
            greedy.push(t);
            true
        })
        .unwrap();
        session.truncate(0).unwrap();
        let cfg = GenConfig {
            cost_curve: Some(curve.clone()),
            max_budget: 16,
            ..GenConfig::default()
        };
        let mut generator = Generator::new(Mode::Sdnpu, None, cfg);
        let (spec, m) = generator
            .generate(&mut session, &prompt, TOKENS, &mut |_| {})
            .unwrap();
        eprintln!(
            "{text:?}\n  greedy {greedy:?}\n  sdnpu  {spec:?}: {} steps, {:.2} tokens per step, mean batch {:.1}",
            m.steps,
            m.mean_accepted(),
            m.mean_budget()
        );
        assert_eq!(
            spec, greedy,
            "{text:?}: speculative output differs from greedy"
        );
        accepted_more_than_one |= m.mean_accepted() > 1.0 && m.mean_budget() > 1.0;
    }
    assert!(
        accepted_more_than_one,
        "no prompt accepted a draft: the check above compared plain steps only"
    );
}
