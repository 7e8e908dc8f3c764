//! Progressive prefill-to-decode switching inside `Session` (the production path): under a
//! residency budget that holds one form per block, every schedule gives the same prompt
//! logits, top-k rows and greedy continuation as a session with every graph resident, and
//! so do follow-up prompts (short ones on the decode graphs, long ones after the prefill
//! graphs come back). SmolLM2-135M on the CPU backend.

use npu_runtime::schedule::ScheduleKind;
use npu_runtime::session::{
    argmax, LoadOptions, Model, Session, SessionOptions, SwitchReport, Switching,
};
use std::sync::Arc;

mod common;

fn model() -> Option<Arc<Model>> {
    common::model_or_skip("smollm2-135m")
        .map(|p| Model::load(&p, &LoadOptions::with_threads(2)).unwrap())
}

/// 3 blocks, prefill chunks of 32 rows, decode/verify graphs of 1..=8 rows.
fn session(model: &Arc<Model>) -> Session {
    Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: 256,
            prefill_chunk: 32,
            max_verify: 8,
            blocks: 3,
            ..SessionOptions::default()
        },
    )
    .unwrap()
}

fn prompt(model: &Model, n: usize, seed: u32) -> Vec<u32> {
    let vocab = model.vocab_size() as u32;
    (0..n as u32)
        .map(|i| (i.wrapping_mul(7919) + 13 + seed * 31) % vocab)
        .collect()
}

/// What a prefill plus `steps` greedy tokens leave: last logits, top-k rows, tokens.
type Outcome = (Vec<f32>, Vec<Vec<(u32, f32)>>, Vec<u32>);

fn run(s: &mut Session, tokens: &[u32], steps: usize) -> Outcome {
    let out = s.prefill(tokens, 3).unwrap();
    let logits = out.logits.to_vec();
    let topk = out.topk.to_vec();
    let mut t = argmax(&logits);
    let mut gen = vec![t];
    for _ in 1..steps {
        t = argmax(s.decode_step(t).unwrap());
        gen.push(t);
    }
    (logits, topk, gen)
}

fn one_form_budget(s: &Session) -> u64 {
    s.form_bytes().iter().map(|(a, b)| *a.max(b)).sum()
}

#[test]
fn every_schedule_switches_without_changing_a_bit() {
    let Some(model) = model() else { return };
    let mut reference = session(&model);
    // 83 tokens: two full chunks and a partial one (padded on G1, runs of 8, 8, 3 on G2).
    let long = prompt(&model, 83, 0);
    let want = run(&mut reference, &long, 6);

    let mut s = session(&model);
    assert!(s.has_two_forms());
    let profile = s.profile_forms("smollm2-135m", "test", 1).unwrap();
    assert_eq!(profile.n_blocks(), 3);
    assert_eq!(s.n_past(), 0, "warm-up leaves the context empty");
    let mut on_decode_graphs = 0;
    for kind in [
        ScheduleKind::Sync,
        ScheduleKind::Async,
        ScheduleKind::Progressive,
        ScheduleKind::ProgressiveLs,
    ] {
        s.enable_switching(Some(Switching {
            kind,
            budget_bytes: one_form_budget(&s),
            profile: profile.clone(),
        }))
        .unwrap();
        s.truncate(0).unwrap();
        let got = run(&mut s, &long, 6);
        assert!(
            got == want,
            "{}: output differs from the resident run",
            kind.name()
        );
        let r: &SwitchReport = s.switch_report().unwrap();
        assert_eq!(r.schedule, kind.name());
        assert_eq!(r.switches, 3, "{}: every block switches once", kind.name());
        assert!(r.prefill_ms > 0.0 && r.switch_ms >= 0.0 && r.stall_ms >= 0.0);
        on_decode_graphs += r.decode_graph_steps;
    }
    assert!(
        on_decode_graphs > 0,
        "no schedule computed a chunk on the decode graphs: the G2 path went untested"
    );
}

#[test]
fn follow_ups_run_on_the_decode_graphs_or_after_a_reset() {
    let Some(model) = model() else { return };
    let first = prompt(&model, 40, 1);
    let short = prompt(&model, 12, 2);
    let long = prompt(&model, 70, 3);
    let mut reference = session(&model);
    let want: Vec<Outcome> = [&first, &short, &long]
        .iter()
        .map(|p| run(&mut reference, p, 4))
        .collect();

    let mut s = session(&model);
    let profile = s.profile_forms("smollm2-135m", "test", 1).unwrap();
    s.enable_switching(Some(Switching {
        kind: ScheduleKind::ProgressiveLs,
        budget_bytes: one_form_budget(&s),
        profile,
    }))
    .unwrap();
    let mut schedules = Vec::new();
    for (p, want) in [&first, &short, &long].iter().zip(&want) {
        let got = run(&mut s, p, 4);
        assert!(&got == want, "follow-up of {} tokens differs", p.len());
        schedules.push(s.switch_report().unwrap().clone());
    }
    assert_eq!(schedules[0].schedule, "progressive-ls");
    assert_eq!(schedules[1].schedule, "decode-graphs");
    assert_eq!(schedules[1].switches, 0);
    assert_eq!(
        schedules[1].decode_graph_steps, 3,
        "one chunk, three blocks"
    );
    assert_eq!(schedules[2].schedule, "progressive-ls");
    assert!(schedules[2].reset_ms >= 0.0);
}

#[test]
fn budgets_decide_whether_anything_switches() {
    let Some(model) = model() else { return };
    let mut s = session(&model);
    let profile = s.profile_forms("smollm2-135m", "test", 1).unwrap();
    let one = one_form_budget(&s);
    let both: u64 = s.form_bytes().iter().map(|(a, b)| a + b).sum();
    assert!(both > one);
    let with = |budget_bytes| Switching {
        kind: ScheduleKind::ProgressiveLs,
        budget_bytes,
        profile: profile.clone(),
    };
    let err = s.enable_switching(Some(with(one - 1))).unwrap_err();
    assert!(err.to_string().contains("cannot hold one form"), "{err}");
    s.enable_switching(Some(with(both))).unwrap();
    let p = prompt(&model, 50, 4);
    run(&mut s, &p, 2);
    assert_eq!(s.switch_report().unwrap().schedule, "all-resident");
    // A profile of another layout is refused.
    let mut other = profile.clone();
    other.chunk_tokens = 64;
    assert!(s.profile_fits(&profile) && !s.profile_fits(&other));
    let mut fewer = profile.clone();
    fewer.blocks.pop();
    assert!(!s.profile_fits(&fewer));
    assert!(s
        .enable_switching(Some(Switching {
            profile: other,
            ..with(one)
        }))
        .is_err());
    // A session whose prefill chunk is also a decode graph has nothing to switch.
    let mut same = Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: 128,
            prefill_chunk: 8,
            max_verify: 8,
            blocks: 2,
            ..SessionOptions::default()
        },
    )
    .unwrap();
    assert!(!same.has_two_forms());
    assert!(same.profile_forms("m", "x", 1).is_err());
}
