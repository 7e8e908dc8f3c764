//! Real execution of every schedule on the CPU backend through the session's own graphs
//! (`Session::prefill_planned`, what `rag-bench prefill` runs): the prefill output (logits
//! and KV cache) and the first decode step must be identical whichever schedule runs, and
//! equal to a session's plain prefill without switching.

use npu_runtime::schedule::plan::{Load, Plan};
use npu_runtime::schedule::{Form, Instance, MemoryBudget, ScheduleKind};
use npu_runtime::session::{argmax, LoadOptions, Model, Session, SessionOptions};
use std::path::PathBuf;
use std::sync::Arc;

mod common;

fn model_path() -> Option<PathBuf> {
    common::model_or_skip("smollm2-135m")
}

/// 3 blocks, chunks of 32 tokens (G1), a decode graph of 8 rows (G2).
fn layout(model: &Arc<Model>) -> Session {
    Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: 128,
            prefill_chunk: 32,
            max_verify: 8,
            min_verify: 8,
            blocks: 3,
            ..SessionOptions::default()
        },
    )
    .unwrap()
}

#[test]
fn every_schedule_gives_the_same_prefill_output() {
    let Some(path) = model_path() else { return };
    let model: Arc<Model> = Model::load(&path, &LoadOptions::with_threads(2)).unwrap();
    // 83 tokens = 2 full chunks + 19 (a partial chunk: padded on G1, three G2 runs of 8,
    // 8 and 3).
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..83u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let (n, c) = (3, 3);

    // The reference: a plain prefill with every graph resident, then one decode step.
    let mut plain = layout(&model);
    let ref_logits = plain.prefill(&prompt, 0).unwrap().logits.to_vec();
    let ref_kv = plain.export_kv(prompt.len()).unwrap();
    let ref_decode = plain.decode_step(argmax(&ref_logits)).unwrap().to_vec();
    assert!(ref_logits.iter().all(|x| x.is_finite()) && ref_logits.iter().any(|&x| x != 0.0));

    let mut s = layout(&model);
    let (ideal, logits) = s.prefill_ideal(&prompt).unwrap();
    assert!(ideal.forms.iter().all(|&f| f == Form::G1));
    assert!(
        logits == ref_logits,
        "ideal run differs from Session::prefill"
    );
    assert!(s.export_kv(prompt.len()).unwrap() == ref_kv);

    // Plans from a synthetic instance where switching early pays off, so the schedules
    // really differ in which steps run on G2.
    let inst = Instance::uniform(n, c, 10, 11, 15, 1, 5);
    let mut g2_steps = Vec::new();
    for kind in ScheduleKind::ALL {
        let plan = kind.plan(&inst).unwrap();
        let (rep, logits) = s.prefill_planned(&prompt, &plan, false).unwrap();
        assert!(
            logits == ref_logits,
            "{}: logits differ from the run without switching",
            kind.name()
        );
        assert!(
            s.export_kv(prompt.len()).unwrap() == ref_kv,
            "{}: KV cache differs",
            kind.name()
        );
        assert!(
            s.decode_step(argmax(&logits)).unwrap() == &ref_decode[..],
            "{}: first decode step differs",
            kind.name()
        );
        // One form per block: the forms follow the plan's releases exactly.
        let rel = plan.release_of(n);
        for (step, f) in rep.forms.iter().enumerate() {
            let want = if rel[step % n] <= step {
                Form::G2
            } else {
                Form::G1
            };
            assert_eq!(*f, want, "{} step {step}", kind.name());
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
    let (_, logits) = s.prefill_planned(&prompt, &plan, true).unwrap();
    assert!(logits == ref_logits);
}

#[test]
fn bad_plans_and_prompts_are_errors_and_leave_the_session_usable() {
    let Some(path) = model_path() else { return };
    let model = Model::load(&path, &LoadOptions::with_threads(1)).unwrap();
    let mut s = layout(&model);
    let prompt = [1u32, 2, 3];
    let bad = Plan {
        loads: vec![Load {
            block: 7,
            release: 0,
        }],
    };
    assert!(
        s.prefill_planned(&prompt, &bad, false).is_err(),
        "block out of range"
    );
    assert!(s
        .prefill_planned(&[u32::MAX], &Plan::default(), false)
        .is_err());
    assert!(s.prefill_planned(&[], &Plan::default(), false).is_err());
    assert_eq!(s.n_past(), 0);
    // Still usable: a plain prefill and a decode step on the decode graph work.
    let logits = s.prefill(&prompt, 0).unwrap().logits.to_vec();
    s.decode_step(argmax(&logits)).unwrap();
    assert_eq!(s.n_past(), prompt.len() + 1);
}
