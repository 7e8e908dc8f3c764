//! The argmax-only LM head on real models: `Session::forward_tree_argmax` gives, for
//! every row of a verify batch, the `argmax` of the logits `forward_tree` returns,
//! `matmul_argmax` on a real LM head equals the argmax of the full product on every ISA,
//! and so does the screened head (`kernels::screen`), which greedy decoding of real text
//! takes (`Session::decode_step_argmax`).

use npu_runtime::kernels::matmul::{matmul_argmax_with_isa, ARGMAX_MAX_TOKENS};
use npu_runtime::kernels::screen::{
    screened_argmax, ArgmaxScreen, ScreenScratch, SCREEN_MAX_TOKENS,
};
use npu_runtime::kernels::{matmul_with_isa, Isa, MatmulScratch, ThreadPool};
use npu_runtime::session::{argmax, LoadOptions, Model, Session, SessionOptions};
use std::sync::Arc;

mod common;
use common::rand_vec;

/// A model from the cache; a missing one fails with the fetch command, unless
/// RAG_SKIP_MODEL_TESTS=1 asks to skip (then `None`).
fn model(name: &str) -> Option<Arc<Model>> {
    common::model_or_skip(name).map(|p| Model::load(&p, &LoadOptions::with_threads(2)).unwrap())
}

fn check_session(m: &Arc<Model>) {
    let mut s = Session::new(
        m.clone(),
        SessionOptions {
            kv_capacity: 256,
            ..SessionOptions::default()
        },
    )
    .unwrap();
    let v = m.vocab_size();
    let toks: Vec<u32> = (0..120u32).map(|i| 200 + (i * 7919) % 9000).collect();
    s.prefill(&toks[..60], 0).unwrap();
    let chain = |n: usize| (0..n as i32).map(|i| i - 1).collect::<Vec<i32>>();
    let trees: Vec<Vec<i32>> = vec![
        chain(1),
        chain(2),
        vec![-1, 0, 0],
        chain(4),
        chain(8),
        chain(16),
        vec![-1, 0, 0, 1, 1, 2, -1, 6, 3],
        chain(40),
    ];
    let mut got = Vec::new();
    for parents in &trees {
        let n = parents.len();
        let batch = &toks[60..60 + n];
        let want: Vec<u32> = s
            .forward_tree(batch, parents)
            .unwrap()
            .chunks_exact(v)
            .map(argmax)
            .collect();
        s.forward_tree_argmax(batch, parents, &mut got).unwrap();
        assert_eq!(got, want, "{} tree {parents:?}", m.path().display());
        // The argmax call leaves a batch that can be committed like forward_tree's.
        s.commit(&[0]).unwrap();
    }
}

fn check_lm_head_every_isa(m: &Arc<Model>) {
    let lm = m.weights().lm_head();
    let pool = ThreadPool::new(2);
    let cols = lm.cols();
    for n in [1usize, 7] {
        // Normed hidden rows are O(1) with a few large features.
        let mut x = rand_vec(n * cols, 17 + n as u64);
        for (i, v) in x.iter_mut().enumerate() {
            *v *= if i % 97 == 3 { 12.0 } else { 2.0 };
        }
        let mut scratch = MatmulScratch::new(n.min(ARGMAX_MAX_TOKENS), cols);
        for isa in Isa::available() {
            let mut full = vec![0f32; n * lm.rows()];
            matmul_with_isa(isa, lm, &x, n, &mut full, &mut scratch, &pool);
            let want: Vec<u32> = full.chunks_exact(lm.rows()).map(argmax).collect();
            let mut got = vec![u32::MAX; n];
            matmul_argmax_with_isa(isa, lm, &x, n, &mut got, &mut scratch, &pool);
            assert_eq!(got, want, "{} {isa:?} n={n}", m.path().display());
        }
    }
}

/// Greedy decoding of real text: `decode_step_argmax` (the screened head) returns, step
/// by step, the `argmax` of the logits `decode_step` returns in a twin session.
fn check_greedy_text(m: &Arc<Model>) {
    let opts = SessionOptions {
        kv_capacity: 512,
        ..SessionOptions::default()
    };
    let (mut a, mut b) = (
        Session::new(m.clone(), opts.clone()).unwrap(),
        Session::new(m.clone(), opts).unwrap(),
    );
    let prompts = [
        "def quicksort(arr):",
        "The three primary colors of light are",
        "Q: How do I reset the router to factory settings?\nA:",
    ];
    for p in prompts {
        let toks = m.tokenizer().encode(p, false).unwrap();
        a.truncate(0).unwrap();
        b.truncate(0).unwrap();
        let mut tok = argmax(a.prefill(&toks, 0).unwrap().logits);
        assert_eq!(tok, argmax(b.prefill(&toks, 0).unwrap().logits));
        for step in 0..48 {
            let want = argmax(b.decode_step(tok).unwrap());
            let got = a.decode_step_argmax(tok).unwrap();
            assert_eq!(got, want, "{} {p:?} step {step}", m.path().display());
            tok = got;
        }
    }
}

/// The screened head on the real LM head, every ISA, 1..=4 tokens: peaked inputs (a
/// row's own weights plus noise, as a confident next token looks) are screened, flat
/// ones fall back; both give `matmul_argmax`'s ids.
fn check_screen_every_isa(m: &Arc<Model>) {
    let lm = m.weights().lm_head();
    let pool = ThreadPool::new(2);
    // Small heads get no screen at load; build one to test it all the same.
    let built;
    let screen = match &m.weights().lm_screen {
        Some(s) => s,
        None => {
            built = ArgmaxScreen::build(lm, &pool).expect("a Q8_0 head can be screened");
            &built
        }
    };
    let cols = lm.cols();
    let mut s = ScreenScratch::new(screen);
    let mut mm = MatmulScratch::new(SCREEN_MAX_TOKENS, cols);
    let mut row = vec![0f32; cols];
    let mut screened = 0;
    for n in 1..=SCREEN_MAX_TOKENS {
        for peaked in [true, false] {
            let mut x = rand_vec(n * cols, 5 + n as u64);
            if peaked {
                for (t, xt) in x.chunks_exact_mut(cols).enumerate() {
                    lm.dequantize_row(1000 + 3001 * t, &mut row);
                    for (v, w) in xt.iter_mut().zip(&row) {
                        *v = 0.2 * *v + 400.0 * w;
                    }
                }
            }
            for isa in Isa::available() {
                let mut want = vec![0u32; n];
                matmul_argmax_with_isa(isa, lm, &x, n, &mut want, &mut mm, &pool);
                let mut got = vec![u32::MAX; n];
                let st = screened_argmax(isa, screen, lm, &x, n, &mut got, &mut s, &pool);
                assert_eq!(got, want, "{} {isa:?} n={n} {peaked}", m.path().display());
                screened += usize::from(!st.fallback);
            }
        }
    }
    assert!(screened > 0, "no call was screened");
}

#[test]
fn smollm2_verify_argmax_equals_argmax_of_logits() {
    if let Some(m) = model("smollm2-135m") {
        check_session(&m);
        check_lm_head_every_isa(&m);
        check_greedy_text(&m);
        check_screen_every_isa(&m);
    }
}

#[test]
fn qwen05_verify_argmax_equals_argmax_of_logits() {
    if let Some(m) = model("qwen2.5-coder-0.5b") {
        assert!(
            m.weights().lm_screen.is_some(),
            "the 0.5B's head gets a screen"
        );
        check_session(&m);
        check_lm_head_every_isa(&m);
        check_greedy_text(&m);
        check_screen_every_isa(&m);
    }
}
