//! Golden test: our greedy generations and prompt top-5 predictions against llama.cpp
//! (fixtures made by tests/fixtures/golden/make_golden.py from the same GGUF files).
//!
//! Criterion (every model, every prompt; the measurements behind it are in
//! tests/README.md):
//! - prompt positions: llama.cpp's top-1 id is in our top-5 and our top-1 is in its top-5
//!   everywhere; wherever llama.cpp's top-5 are separated by more than `ORDER_EPS`, the
//!   top-5 id sets are equal or differ only by a near-tie at the 5th place: each engine
//!   ranks its own extra ids less than the model's `tie_eps` above the other's (logits read
//!   from the engine's top-10; the fixture stores llama.cpp's); every logit of llama.cpp's
//!   top-5 is within `LOGIT_TOL` of ours.
//! - exact greedy: for the cases in `EXACT_CASES` the 64 free-running greedy tokens must
//!   equal llama.cpp's.
//! - greedy elsewhere, teacher-forced: at each of the 64 steps we feed llama.cpp's token
//!   and compare our argmax with its. A disagreement is allowed only at a near-tie, where
//!   both llama.cpp's top-2 margin and ours (our pick minus its pick) are below the
//!   model's `tie_eps`, and such flips must stay under `MAX_TIE_SHARE` of a model's
//!   steps. `tie_eps` is how far llama.cpp's own logits move when only its batching
//!   changes (tests/fixtures/golden/llama_self.py: the same prompt evaluated as one batch
//!   and one token at a time): a margin below that is not decided by llama.cpp either.
//!   We quantize activations by ggml's rules (kernels/act.rs), but the two engines sum
//!   in different orders, and these small models amplify any rounding difference.

use npu_runtime::session::{argmax, KvPrecision, LoadOptions, Model, Session, SessionOptions};
use serde_json::Value;
use std::path::PathBuf;

const LOGIT_TOL: f32 = 1.0;
const ORDER_EPS: f32 = 1.0;
/// Prompt top-k stored per position by make_golden.py (the criterion checks the top-5).
const FIXTURE_TOPK: usize = 10;
/// Cases whose 64 greedy tokens equal llama.cpp's exactly (model, case id).
const EXACT_CASES: [(&str, &str); 5] = [
    ("qwen2.5-coder-0.5b", "plain_code"),
    ("qwen2.5-coder-0.5b", "plain_facts"),
    ("qwen2.5-coder-0.5b", "chat"),
    ("qwen2.5-coder-1.5b", "plain_code"),
    ("qwen2.5-coder-1.5b", "plain_facts"),
];
/// At most this share of all teacher-forced steps of a model may be near-tie flips.
const MAX_TIE_SHARE: f64 = 0.05;

/// Largest |logit change| of llama.cpp's top-5 between its batch and its one-token-at-a-time
/// evaluation of the fixture prompts (llama_self.py; measured 0.581, 0.248 and 0.380).
fn tie_eps(name: &str) -> f32 {
    match name {
        "smollm2-135m" => 0.58,
        "qwen2.5-coder-0.5b" => 0.25,
        "qwen2.5-coder-1.5b" => 0.38,
        _ => panic!("{name}: no measured tie_eps"),
    }
}

fn model_file(name: &str) -> Option<PathBuf> {
    if std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        return None;
    }
    let dir = rag::models::cache_dir();
    let p = dir.join(format!("{name}.gguf"));
    assert!(
        p.exists(),
        "model {} missing: run scripts/fetch-model.sh {name} (or set RAG_SKIP_MODEL_TESTS=1)",
        p.display()
    );
    Some(p)
}

fn fixture(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/golden/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `(id, logit)` pairs of a fixture row.
fn pairs(v: &Value) -> Vec<(u32, f32)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
        .collect()
}

/// How far, in `mine`'s logits, its own top-5 ids missing from `other`'s top-5 rank above
/// `other`'s top-5 ids missing from its own: the largest such logit difference, or `None`
/// when one of those ids is not even in `mine`'s top-k (so `mine` cannot show a near-tie).
fn fifth_place_gap(mine: &[(u32, f32)], other: &[(u32, f32)]) -> Option<f32> {
    let in_top5 = |row: &[(u32, f32)], id: u32| row[..5].iter().any(|p| p.0 == id);
    let own_extra = mine[..5]
        .iter()
        .filter(|p| !in_top5(other, p.0))
        .map(|p| p.1);
    let highest = own_extra.fold(f32::NEG_INFINITY, f32::max);
    let mut gap = f32::NEG_INFINITY;
    for &(id, _) in other[..5].iter().filter(|p| !in_top5(mine, p.0)) {
        let l = mine.iter().find(|p| p.0 == id)?.1;
        gap = gap.max(highest - l);
    }
    Some(gap)
}

fn check_model(name: &str) {
    let Some(path) = model_file(name) else { return };
    let model = Model::load(&path, &LoadOptions::with_threads(2)).unwrap();
    let doc = fixture(name);
    let (mut total_ties, mut total_steps) = (0usize, 0usize);
    let tie = tie_eps(name);
    let mut exact_checked = 0;
    for case in doc["cases"].as_array().unwrap() {
        let id = case["id"].as_str().unwrap();
        let prompt = ids(&case["prompt"]);
        let golden = ids(&case["greedy"]);
        let margins: Vec<f32> = case["greedy_margin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap() as f32)
            .collect();
        let mut s = Session::new(
            model.clone(),
            SessionOptions {
                kv_capacity: 512,
                ..SessionOptions::default()
            },
        )
        .unwrap();
        let out = s.prefill(&prompt, FIXTURE_TOPK).unwrap();
        let mut max_diff = 0f32;
        for (pos, (ours, theirs)) in out
            .topk
            .iter()
            .zip(case["prompt_top10"].as_array().unwrap())
            .enumerate()
        {
            let theirs_k = pairs(theirs);
            assert_eq!(theirs_k.len(), FIXTURE_TOPK, "{name}/{id}: fixture top-k");
            assert_eq!(ours.len(), FIXTURE_TOPK);
            let (ours_k, ours, theirs) = (&ours[..], &ours[..5], &theirs_k[..5]);
            let our_ids: Vec<u32> = ours.iter().map(|p| p.0).collect();
            let their_ids: Vec<u32> = theirs.iter().map(|p| p.0).collect();
            assert!(
                our_ids.contains(&their_ids[0]) && their_ids.contains(&our_ids[0]),
                "{name}/{id} pos {pos}: top-1 mismatch ours {ours:?} theirs {theirs:?}"
            );
            let separated = theirs.windows(2).all(|w| w[0].1 - w[1].1 > ORDER_EPS);
            let mut a = our_ids.clone();
            let mut b = their_ids.clone();
            a.sort();
            b.sort();
            if separated && a != b {
                for (who, mine, other) in [
                    ("ours", ours_k, &theirs_k[..]),
                    ("llama.cpp", &theirs_k[..], ours_k),
                ] {
                    let gap = fifth_place_gap(mine, other);
                    assert!(
                        gap.is_some_and(|g| g < tie),
                        "{name}/{id} pos {pos}: top-5 sets differ beyond a 5th-place near-tie \
                         ({who}: gap {gap:?}, tie_eps {tie}); ours {ours_k:?} theirs {theirs_k:?}"
                    );
                    eprintln!(
                        "{name}/{id} pos {pos}: top-5 sets differ at a near-tie, {who} gap {:.4}",
                        gap.unwrap()
                    );
                }
            }
            // Our logit for each of their top-5 ids, from our top-10 when present; otherwise
            // our 10th logit is an upper bound.
            for &(t, l) in theirs {
                let ours_l = ours_k.iter().find(|p| p.0 == t).map(|p| p.1);
                match ours_l {
                    Some(o) => {
                        max_diff = max_diff.max((o - l).abs());
                        assert!(
                            (o - l).abs() <= LOGIT_TOL,
                            "{name}/{id} pos {pos} id {t}: ours {o} theirs {l}"
                        );
                    }
                    None => assert!(
                        l <= ours_k[FIXTURE_TOPK - 1].1 + LOGIT_TOL,
                        "{name}/{id} pos {pos}: id {t} ({l}) missing from ours"
                    ),
                }
            }
        }
        // Teacher forcing: we always feed llama.cpp's token, so every one of the steps is
        // checked even after a near-tie has split the free-running sequences.
        let mut last = out.logits.to_vec();
        let mut exact_prefix = None;
        let mut ties = 0;
        for (step, &g) in golden.iter().enumerate() {
            let tok = argmax(&last);
            if tok != g {
                let ours_margin = last[tok as usize] - last[g as usize];
                assert!(
                    !EXACT_CASES.contains(&(name, id)),
                    "{name}/{id} step {step}: ours {tok} golden {g}: this case must match exactly \
                     (llama.cpp margin {}, ours {ours_margin})",
                    margins[step]
                );
                assert!(
                    margins[step] < tie && ours_margin < tie,
                    "{name}/{id} step {step}: ours {tok} golden {g} (llama.cpp margin {}, ours {ours_margin})",
                    margins[step]
                );
                eprintln!(
                    "{name}/{id} step {step}: near-tie, ours {tok} llama.cpp {g}: margins llama.cpp {:.4} ours {ours_margin:.4}",
                    margins[step]
                );
                ties += 1;
                exact_prefix.get_or_insert(step);
            }
            if step + 1 < golden.len() {
                last.copy_from_slice(s.decode_step(g).unwrap());
            }
        }
        let exact = exact_prefix.unwrap_or(golden.len());
        eprintln!(
            "{name}/{id}: free-running greedy equal for {exact}/{} tokens, {ties} near-tie disagreements under teacher forcing, prompt top-5 max |logit diff| {max_diff:.4}",
            golden.len()
        );
        if EXACT_CASES.contains(&(name, id)) {
            assert_eq!(
                exact, 64,
                "{name}/{id}: fewer than 64 greedy tokens checked"
            );
            exact_checked += 1;
        }
        total_ties += ties;
        total_steps += golden.len();
    }
    eprintln!("{name}: {total_ties} near-tie flips in {total_steps} teacher-forced steps");
    assert_eq!(
        exact_checked,
        EXACT_CASES.iter().filter(|c| c.0 == name).count(),
        "{name}: an exact case is missing from the fixture"
    );
    assert!(
        total_ties as f64 <= MAX_TIE_SHARE * total_steps as f64,
        "{name}: {total_ties} near-tie flips in {total_steps} steps"
    );
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_model("smollm2-135m");
}

#[test]
fn qwen05_matches_llama_cpp() {
    check_model("qwen2.5-coder-0.5b");
}

/// The default model of `rag ask`.
#[test]
fn qwen15_matches_llama_cpp() {
    check_model("qwen2.5-coder-1.5b");
}

/// Against the exact f64 evaluation (tests/fixtures/golden/make_f64_reference.py): every
/// logit of the reference top-5 at every prompt position is within `F64_TOL` of ours, the
/// mean deviation within `F64_MEAN_TOL` and no worse than llama.cpp's, and
/// our top-1 is the reference's wherever its top-2 margin exceeds `2 * F64_TOL`. The same
/// distance for llama.cpp is printed for comparison. With [`FirstPosition::GgmlActs`],
/// position 0 is compared against the f64 evaluation with ggml's activation rounding
/// instead (see there).
const F64_TOL: f32 = 0.85;
/// Mean over all compared logits.
const F64_MEAN_TOL: f64 = 0.2;

#[test]
fn smollm2_prompt_logits_match_exact_f64_reference() {
    check_f64(
        "smollm2-135m",
        F64_TOL,
        F64_MEAN_TOL,
        KvPrecision::F32,
        FirstPosition::Exact,
    );
}

/// Measured: ours max 0.36 / mean 0.070; llama.cpp max 0.32 / mean 0.070.
#[test]
fn qwen05_prompt_logits_match_exact_f64_reference() {
    check_f64(
        "qwen2.5-coder-0.5b",
        0.45,
        0.1,
        KvPrecision::F32,
        FirstPosition::Exact,
    );
}

/// The f16 KV cache (`--kv-cache f16`, llama.cpp's default cache type, which the fixtures'
/// llama.cpp runs used) against the same exact reference. Measured over the reference
/// top-5 (p50 / p99 / max): SmolLM2 ours 0.140 / 0.518 / 0.669 (f32 cache 0.136 / 0.590 /
/// 0.738; llama.cpp 0.142 / 0.708 / 0.746), so the f32 tolerance holds.
#[test]
fn smollm2_prompt_logits_with_f16_cache_match_exact_f64_reference() {
    check_f64(
        "smollm2-135m",
        F64_TOL,
        F64_MEAN_TOL,
        KvPrecision::F16,
        FirstPosition::Exact,
    );
}

/// Qwen 0.5B with the f16 cache: p50 0.051 / p99 0.267 / max 0.525 (f32 cache 0.052 /
/// 0.266 / 0.355; llama.cpp 0.056 / 0.270 / 0.320): the same error as llama.cpp's except
/// for two outliers (0.42 and 0.53 of 365 logits), hence its own max tolerance.
#[test]
fn qwen05_prompt_logits_with_f16_cache_match_exact_f64_reference() {
    check_f64(
        "qwen2.5-coder-0.5b",
        0.6,
        0.1,
        KvPrecision::F16,
        FirstPosition::Exact,
    );
}

/// The default model of `rag ask`, position 0 against the f64 evaluation with ggml's
/// activation rounding (against the exact one both engines are ~6.4 logits off there).
/// Measured: ours max 0.553 / mean 0.072 (position 0: 0.046); llama.cpp max 0.695 / mean
/// 0.080 (position 0: 0.562).
#[test]
fn qwen15_prompt_logits_match_exact_f64_reference() {
    check_f64(
        "qwen2.5-coder-1.5b",
        0.65,
        0.1,
        KvPrecision::F32,
        FirstPosition::GgmlActs,
    );
}

/// The default model with the f16 cache: ours max 0.548 / mean 0.087 (position 0: 0.548).
#[test]
fn qwen15_prompt_logits_with_f16_cache_match_exact_f64_reference() {
    check_f64(
        "qwen2.5-coder-1.5b",
        0.65,
        0.1,
        KvPrecision::F16,
        FirstPosition::GgmlActs,
    );
}

/// The reference for each prompt's position 0.
#[derive(Clone, Copy, PartialEq)]
enum FirstPosition {
    /// The exact f64 reference, as every other position.
    Exact,
    /// `NAME.f64-ggml-acts.pos0.json` (make_f64_reference.py `--ggml-acts
    /// --first-position`): float64 except that every matmul input is rounded to int8 per
    /// block as ggml (and kernels/act.rs) does. At the first token the input of the 1.5B's
    /// `ffn_down` reaches |x| ~1200, one value then sets the rounding step of its 256-value
    /// block, and the rounding moves the position-0 logits by ~6 in both engines; this
    /// reference reproduces llama.cpp's there (tests/README.md). The later positions stay
    /// compared with the exact reference.
    GgmlActs,
}

fn check_f64(
    name: &str,
    tol: f32,
    mean_tol: f64,
    kv_precision: KvPrecision,
    first_position: FirstPosition,
) {
    let Some(path) = model_file(name) else { return };
    let model = Model::load(&path, &LoadOptions::with_threads(2)).unwrap();
    let reference = fixture(&format!("{name}.f64"));
    let first_reference = (first_position == FirstPosition::GgmlActs)
        .then(|| fixture(&format!("{name}.f64-ggml-acts.pos0")));
    let llama = fixture(name);
    let mut first_max = (0f32, 0f32);
    let (mut ours_max, mut llama_max) = (0f32, 0f32);
    let (mut sum, mut count) = (0f64, 0usize);
    let (mut llama_sum, mut llama_count) = (0f64, 0usize);
    for (ci, (case, lcase)) in reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .zip(llama["cases"].as_array().unwrap())
        .enumerate()
    {
        let prompt = ids(&case["prompt"]);
        let mut s = Session::new(
            model.clone(),
            SessionOptions {
                kv_capacity: 512,
                kv_precision,
                ..SessionOptions::default()
            },
        )
        .unwrap();
        // Full rows are needed to read our logit of any reference id: decode step by step
        // (bit-identical to the chunked prefill, see the runtime equivalence tests).
        for (pos, &t) in prompt.iter().enumerate() {
            let row = s.decode_step(t).unwrap();
            let r = match (&first_reference, pos) {
                (Some(first), 0) => {
                    let c = &first["cases"][ci];
                    assert_eq!(c["prompt"][0], case["prompt"][0], "{name}: pos-0 reference");
                    pairs(&c["prompt_top5"][0])
                }
                _ => pairs(&case["prompt_top5"][pos]),
            };
            for &(id, l) in &r {
                let d = (row[id as usize] - l).abs();
                if pos == 0 {
                    first_max.0 = first_max.0.max(d);
                }
                ours_max = ours_max.max(d);
                sum += f64::from(d);
                count += 1;
            }
            if r[0].1 - r[1].1 > 2.0 * tol {
                assert_eq!(
                    argmax(row),
                    r[0].0,
                    "pos {pos}: top-1 differs from the exact reference"
                );
            }
            for &(id, l) in &pairs(&lcase["prompt_top10"][pos])[..5] {
                if let Some(&(_, e)) = r.iter().find(|p| p.0 == id) {
                    if pos == 0 {
                        first_max.1 = first_max.1.max((e - l).abs());
                    }
                    llama_max = llama_max.max((e - l).abs());
                    llama_sum += f64::from((e - l).abs());
                    llama_count += 1;
                }
            }
        }
    }
    let mean = sum / count as f64;
    eprintln!(
        "{name} (KV cache {}): |logit - exact f64| over reference top-5: ours max {ours_max:.4} mean {mean:.4}; llama.cpp max {llama_max:.4} mean {:.4}",
        kv_precision.name(),
        llama_sum / llama_count as f64
    );
    eprintln!(
        "{name}: position 0 (against {} reference): ours max {:.4}, llama.cpp max {:.4}",
        if first_reference.is_some() {
            "the ggml-activation"
        } else {
            "the exact"
        },
        first_max.0,
        first_max.1
    );
    assert!(ours_max <= tol, "{name}: max deviation {ours_max}");
    assert!(mean <= mean_tol, "{name}: mean deviation {mean}");
    // Both engines quantize activations to int8; ours must be no less exact than llama.cpp
    // (measured: ours max 0.74 / mean 0.153 with ggml's activation quantization, 0.61-0.70 /
    // 0.164-0.175 before; llama.cpp max 0.75 / mean 0.176).
    assert!(mean <= 1.1 * llama_sum / llama_count as f64);
}
