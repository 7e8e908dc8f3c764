//! Real execution of every schedule on the CPU backend: the prefill output (logits and KV
//! cache) must be identical whichever schedule runs, and equal to a run without switching.

use npu_runtime::schedule::cpu::CpuExecutor;
use npu_runtime::schedule::exec::{execute, execute_ideal};
use npu_runtime::schedule::{Form, Instance, MemoryBudget, ScheduleKind};
use npu_runtime::session::{LoadOptions, Model, Session, SessionOptions};
use std::path::PathBuf;
use std::sync::Arc;

fn model_path() -> Option<PathBuf> {
    let dir = std::env::var_os("RAG_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rag/models")
        });
    let p = dir.join("smollm2-135m.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        return None;
    }
    panic!(
        "{} is missing: run scripts/fetch-model.sh smollm2-135m (or set RAG_SKIP_MODEL_TESTS=1)",
        p.display()
    );
}

#[test]
fn every_schedule_gives_the_same_prefill_output() {
    let Some(path) = model_path() else { return };
    let model: Arc<Model> = Model::load(&path, &LoadOptions::with_threads(2)).unwrap();
    // 3 blocks, chunks of 32 tokens, G2 runs of 8; 83 tokens = 2 full chunks + 19 (a
    // partial chunk: padded on G1, three G2 runs of 8, 8 and 3).
    let exec = CpuExecutor::new(model.clone(), 3, 32, 8, 128).unwrap();
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..83u32).map(|i| (i * 7919 + 13) % vocab).collect();
    exec.set_prompt(&prompt).unwrap();
    let (n, c) = (exec.n_blocks(), exec.n_chunks());
    assert_eq!(c, 3);

    exec.reset_forms().unwrap();
    exec.load_all().unwrap();
    let ideal = execute_ideal(&exec, n, c).unwrap();
    assert!(ideal.forms.iter().all(|&f| f == Form::G1));
    let (ref_logits, ref_kv) = exec.output();
    let ref_decode = exec.decode_logits();
    assert!(ref_logits.iter().all(|x| x.is_finite()) && ref_logits.iter().any(|&x| x != 0.0));
    // The runtime's own chunked prefill gives the same logits and KV.
    let mut sess = Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: 128,
            prefill_chunk: 32,
            max_verify: 8,
            blocks: 3,
            ..SessionOptions::default()
        },
    )
    .unwrap();
    let sess_logits = sess.prefill(&prompt, 0).unwrap().logits.to_vec();
    assert!(
        sess_logits == ref_logits,
        "executor's prefill differs from Session::prefill"
    );
    let mut sess_kv = Vec::new();
    for layer in 0..sess.kv_cache().n_layer() {
        sess_kv.extend(sess.kv_cache().k_rows(layer, prompt.len()));
        sess_kv.extend(sess.kv_cache().v_rows(layer, prompt.len()));
    }
    assert!(
        sess_kv == ref_kv,
        "executor's KV differs from Session::prefill"
    );

    // Plans from a synthetic instance where switching early pays off, so the schedules
    // really differ in which steps run on G2.
    let inst = Instance::uniform(n, c, 10, 11, 15, 1, 5);
    let mut g2_steps = Vec::new();
    for kind in ScheduleKind::ALL {
        let plan = kind.plan(&inst).unwrap();
        exec.reset_forms().unwrap();
        let rep = execute(&exec, n, c, &plan, false).unwrap();
        let (logits, kv) = exec.output();
        assert!(
            logits == ref_logits,
            "{}: logits differ from the run without switching",
            kind.name()
        );
        assert!(kv == ref_kv, "{}: KV cache differs", kind.name());
        assert!(
            exec.decode_logits() == ref_decode,
            "{}: first decode step differs",
            kind.name()
        );
        // One form per block: the forms follow the plan's releases exactly.
        let rel = plan.release_of(n);
        for (s, f) in rep.forms.iter().enumerate() {
            let want = if rel[s % n] <= s { Form::G2 } else { Form::G1 };
            assert_eq!(*f, want, "{} step {s}", kind.name());
        }
        g2_steps.push(rep.forms.iter().filter(|&&f| f == Form::G2).count());
    }
    assert!(
        g2_steps.iter().any(|&k| k > 0),
        "some schedule must compute on G2: {g2_steps:?}"
    );
    assert!(g2_steps.contains(&0), "sync computes everything on G1");

    // Double residency: G1 keeps computing while G2 loads; same output.
    let inst2 = Instance {
        budget: MemoryBudget::Bytes(u64::MAX),
        ..inst
    };
    let plan = ScheduleKind::Progressive.plan(&inst2).unwrap();
    exec.reset_forms().unwrap();
    execute(&exec, n, c, &plan, true).unwrap();
    assert!(exec.output().0 == ref_logits);
}

#[test]
fn computing_an_unloaded_form_is_an_error() {
    use npu_runtime::schedule::exec::ScheduleExecutor;
    let Some(path) = model_path() else { return };
    let model = Model::load(&path, &LoadOptions::with_threads(1)).unwrap();
    let exec = CpuExecutor::new(model, 2, 16, 8, 64).unwrap();
    exec.set_prompt(&[1, 2, 3]).unwrap();
    exec.reset_forms().unwrap();
    exec.begin_prefill().unwrap();
    assert!(exec.compute(0, 0, Form::G2).is_err(), "G2 is not resident");
    assert!(exec.compute(0, 0, Form::G1).is_ok());
    assert!(exec.compute(0, 5, Form::G1).is_err(), "chunk out of range");
    assert!(exec.set_prompt(&[u32::MAX]).is_err());
}
