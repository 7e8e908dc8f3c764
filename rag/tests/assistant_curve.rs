//! The Assistant caches its verify-cost curve, and after every answer what its drafting
//! learned, through `specdec::curve_cache` (own test binary: it points `RAG_PROFILE_DIR`
//! at a temporary directory for the whole process).

use rag::assistant::AskOptions;
use rag::SearchMode;
use specdec::curve_cache::{self, CurveKey};

mod sample_assistant;
use sample_assistant::sample_assistant;

#[test]
fn the_first_question_caches_the_curve_under_the_shared_key() {
    let Ok(model) = rag::models::resolve("smollm2-135m") else {
        assert!(
            std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() == Ok("1"),
            "smollm2-135m is missing: run scripts/fetch-model.sh smollm2-135m"
        );
        return;
    };
    let profiles = tempfile::tempdir().unwrap();
    // Set before any thread of ours reads the environment.
    std::env::set_var("RAG_PROFILE_DIR", profiles.path());
    let file = curve_cache::cache_file(profiles.path(), &model, 2);
    // A curve left by another engine build must not be used, and is replaced.
    let mut stale = CurveKey::current(&model, 2).unwrap();
    stale.engine = "an older build".into();
    let old = specdec::CostCurve::affine(1.0, 1.0, &specdec::budget::DEFAULT_SIZES);
    curve_cache::store(&file, &stale, &old).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let a = sample_assistant(dir.path());
    let ask = AskOptions {
        max_tokens: 8,
        mode: SearchMode::Bm25,
        ..AskOptions::default()
    };
    a.ask("How do I pair the console?", &ask, &mut |_| true)
        .unwrap();
    let key = CurveKey::current(&model, 2).unwrap();
    let curve = curve_cache::load(&file, &key).expect("curve cached under the current key");
    assert_ne!(curve, old, "the stale curve was used");
    assert!(curve_cache::load(&file, &stale).is_err());

    // What drafting learned is kept for the next process under the same key...
    let learned_file = curve_cache::learned_file(&file);
    let mut learned = curve_cache::load_learned(&learned_file, &key).expect("learned state kept");
    // ... and the next process starts from it: a count no step of ours touches (the last
    // acceptance key) survives its answer only if it was restored.
    let last = learned.accept.trials.len() - 1;
    learned.accept.trials[last] = 1000.0;
    learned.accept.hits[last] = 250.0;
    curve_cache::store_learned(&learned_file, &key, &learned).unwrap();
    let b = sample_assistant(dir.path());
    b.ask("How do I pair the console?", &ask, &mut |_| true)
        .unwrap();
    let after = curve_cache::load_learned(&learned_file, &key).unwrap();
    assert_eq!(
        (after.accept.trials[last], after.accept.hits[last]),
        (1000.0, 250.0)
    );
    // A file that does not parse only means starting unlearned; it is then replaced.
    std::fs::write(&learned_file, "not json").unwrap();
    let c = sample_assistant(dir.path());
    c.ask("How do I pair the console?", &ask, &mut |_| true)
        .unwrap();
    assert!(curve_cache::load_learned(&learned_file, &key).is_ok());
}
