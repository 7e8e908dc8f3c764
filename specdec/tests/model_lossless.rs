//! On a real model (SmolLM2-135M): every speculation mode must reproduce the
//! runtime's plain greedy decoding (one `decode_step` per token) token for token.
//! Needs the model file; set RAG_SKIP_MODEL_TESTS=1 to skip.

use npu_runtime::session::{generate_greedy, LoadOptions, Model, Session, SessionOptions};
use specdec::budget::{CostCurve, DEFAULT_SIZES};
use specdec::session_target::generate_sampled_plain;
use specdec::{GenConfig, Generator, Mode, Sampling};
use std::path::PathBuf;
use std::sync::Arc;

/// `$RAG_MODEL_DIR/smollm2-135m.gguf`, else the same file in `~/.cache/rag/models`.
fn model() -> Option<Arc<Model>> {
    let dir = std::env::var_os("RAG_MODEL_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rag/models")
        });
    let path = dir.join("smollm2-135m.gguf");
    if !path.is_file() {
        if std::env::var("RAG_SKIP_MODEL_TESTS").is_ok_and(|v| v == "1") {
            return None;
        }
        panic!(
            "{} missing: run scripts/fetch-model.sh smollm2-135m (or set RAG_SKIP_MODEL_TESTS=1)",
            path.display()
        );
    }
    Some(Model::load(&path, &LoadOptions::with_threads(2)).expect("loading smollm2-135m"))
}

/// Prompts as token ids: repeated spans make the model copy, so long drafts get
/// accepted and rejected in the same run (what exercises the acceptance logic).
fn prompts() -> Vec<Vec<u32>> {
    let span: Vec<u32> = (0..40).map(|i| 1000 + (i * 7919) % 20000).collect();
    let mut a = span.clone();
    a.extend(&span);
    a.extend(&span[..10]);
    let mut b: Vec<u32> = (0..60).map(|i| 300 + (i * 104729) % 30000).collect();
    b.extend_from_slice(&b.clone()[5..25]);
    vec![a, b]
}

#[test]
fn every_mode_matches_greedy_on_smollm2() {
    let Some(model) = model() else { return };
    let opts = SessionOptions {
        kv_capacity: 512,
        ..Default::default()
    };
    let max_tokens = 32;
    // A flat-ish curve so the controller speculates; a fixed budget covers the
    // full 64-row graph as well.
    let curve = CostCurve::affine(10.0, 0.05, &DEFAULT_SIZES);
    let mut s = Session::new(model.clone(), opts).unwrap();
    for (pi, prompt) in prompts().iter().enumerate() {
        s.truncate(0).unwrap();
        let mut want = Vec::new();
        generate_greedy(&mut s, prompt, max_tokens, |t| {
            want.push(t);
            true
        })
        .unwrap();
        let runs = [
            (Mode::None, None),
            (Mode::Pld, Some(64)),
            (Mode::Sam, None),
            (Mode::Sdnpu, None),
            (Mode::Sdnpu, Some(64)),
        ];
        for (mode, fixed) in runs {
            {
                s.truncate(0).unwrap();
                let mut gen = Generator::new(
                    mode,
                    None,
                    GenConfig {
                        fixed_budget: fixed,
                        cost_curve: Some(curve.clone()),
                        ..Default::default()
                    },
                );
                let (got, m) = gen
                    .generate(&mut s, prompt, max_tokens, &mut |_| {})
                    .unwrap();
                assert_eq!(
                    got,
                    want,
                    "prompt {pi}, mode {}, budget {fixed:?}: differs from greedy",
                    mode.name()
                );
                if mode != Mode::None && fixed.is_some() && pi == 0 {
                    // The repeated span must have been drafted and accepted.
                    assert!(
                        m.mean_accepted() > 1.5,
                        "{}: {}",
                        mode.name(),
                        m.mean_accepted()
                    );
                }
            }
        }
    }
}

#[test]
fn sampled_speculation_matches_plain_sampling_on_smollm2() {
    let Some(model) = model() else { return };
    let opts = SessionOptions {
        kv_capacity: 512,
        ..Default::default()
    };
    let max_tokens = 32;
    let curve = CostCurve::affine(10.0, 0.05, &DEFAULT_SIZES);
    let mut s = Session::new(model.clone(), opts).unwrap();
    let mut greedy = Vec::new();
    s.truncate(0).unwrap();
    generate_greedy(&mut s, &prompts()[0], max_tokens, |t| {
        greedy.push(t);
        true
    })
    .unwrap();
    let mut differs_from_greedy = false;
    for (pi, prompt) in prompts().iter().enumerate() {
        for (t, p, seed) in [(0.7f32, 1.0f32, 1u64), (1.0, 0.9, 2), (0.3, 0.95, 3)] {
            let sampling = Sampling::new(t, p, seed).unwrap();
            s.truncate(0).unwrap();
            let mut want = Vec::new();
            generate_sampled_plain(&mut s, prompt, max_tokens, &sampling, |t| {
                want.push(t);
                true
            })
            .unwrap();
            differs_from_greedy |= pi == 0 && want != greedy;
            for (mode, fixed) in [
                (Mode::None, None),
                (Mode::Sdnpu, None),
                (Mode::Sdnpu, Some(16)),
            ] {
                s.truncate(0).unwrap();
                let mut gen = Generator::new(
                    mode,
                    None,
                    GenConfig {
                        fixed_budget: fixed,
                        cost_curve: Some(curve.clone()),
                        ..Default::default()
                    },
                );
                let (got, _) = gen
                    .generate_sampled(&mut s, prompt, max_tokens, &sampling, &mut |_| {}, &|| {
                        false
                    })
                    .unwrap();
                assert_eq!(
                    got,
                    want,
                    "prompt {pi}, T {t}, top_p {p}, mode {}, budget {fixed:?}",
                    mode.name()
                );
            }
        }
    }
    assert!(differs_from_greedy, "sampling never left the greedy path");
}

#[test]
fn calibration_window_split_prefill_matches_greedy_on_smollm2() {
    // Calibrating only the tail splits the prefill at a multiple of the prefill
    // chunk (16 here, so the short prompts do split): the same forward passes,
    // hence the same greedy output.
    let Some(model) = model() else { return };
    let opts = SessionOptions {
        kv_capacity: 512,
        prefill_chunk: 16,
        ..Default::default()
    };
    let curve = CostCurve::affine(10.0, 0.05, &DEFAULT_SIZES);
    let mut s = Session::new(model.clone(), opts).unwrap();
    for (pi, prompt) in prompts().iter().enumerate() {
        assert!(prompt.len() > 16 + 8, "prompt {pi} too short to split");
        s.truncate(0).unwrap();
        let mut want = Vec::new();
        generate_greedy(&mut s, prompt, 24, |t| {
            want.push(t);
            true
        })
        .unwrap();
        s.truncate(0).unwrap();
        let mut gen = Generator::new(
            Mode::Sdnpu,
            None,
            GenConfig {
                cost_curve: Some(curve.clone()),
                calib_window: 8,
                ..Default::default()
            },
        );
        let (got, _) = gen.generate(&mut s, prompt, 24, &mut |_| {}).unwrap();
        assert_eq!(got, want, "prompt {pi}: windowed sdnpu differs from greedy");
    }
}

/// `Session::prefill_topk_from` gives exactly `prefill`'s top-k rows for the range
/// (and none before it) and the same next-token logits.
#[test]
fn blocked_topk_prefill_equals_full_logit_rows() {
    let Some(model) = model() else {
        return;
    };
    let prompt: Vec<u32> = (0..300u32).map(|i| (i * 37 + 11) % 4000 + 100).collect();
    let mut s = Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: 512,
            ..Default::default()
        },
    )
    .unwrap();
    let full = s.prefill(&prompt, 4).unwrap();
    let (want_rows, want_last) = (full.topk.to_vec(), full.logits.to_vec());
    for from in [0usize, 5, 255, 256, 299] {
        s.truncate(0).unwrap();
        let got = s.prefill_topk_from(&prompt, 4, from).unwrap();
        assert_eq!(got.logits, &want_last[..], "from {from}");
        assert_eq!(got.topk.len(), prompt.len());
        for (i, row) in got.topk.iter().enumerate() {
            if i < from {
                assert!(row.is_empty(), "row {i} before {from}");
            } else {
                assert_eq!(row, &want_rows[i], "row {i} from {from}");
            }
        }
    }
}

#[test]
fn every_sample_equals_plain_sampling_under_its_branch_seed() {
    let Some(model) = model() else { return };
    let opts = SessionOptions {
        kv_capacity: 512,
        ..Default::default()
    };
    let max_tokens = 24;
    let mut s = Session::new(model, opts).unwrap();
    for (t, p, seed) in [(0.8f32, 0.95f32, 5u64), (0.0, 1.0, 0)] {
        let sampling = Sampling::new(t, p, seed).unwrap();
        let prompt = &prompts()[1];
        s.truncate(0).unwrap();
        let (samples, stats) = specdec::session_target::generate_samples(
            &mut s,
            prompt,
            6,
            max_tokens,
            &sampling,
            |_, _| true,
        )
        .unwrap();
        assert_eq!(s.n_past(), prompt.len());
        assert_eq!(
            stats.generated,
            samples.iter().map(|o| o.tokens.len()).sum::<usize>()
        );
        for (b, sample) in samples.iter().enumerate() {
            s.truncate(0).unwrap();
            let mut want = Vec::new();
            generate_sampled_plain(&mut s, prompt, max_tokens, &sampling.for_branch(b), |t| {
                want.push(t);
                true
            })
            .unwrap();
            assert_eq!(sample.tokens, want, "T {t} branch {b}");
        }
        let distinct: std::collections::HashSet<_> = samples.iter().map(|o| &o.tokens).collect();
        if sampling.is_greedy() {
            assert_eq!(distinct.len(), 1);
        } else {
            assert!(distinct.len() > 1, "branch seeds gave identical samples");
        }
    }
}
