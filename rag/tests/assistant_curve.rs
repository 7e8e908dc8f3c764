//! The Assistant caches its verify-cost curve through `specdec::curve_cache` (own test
//! binary: it points `RAG_PROFILE_DIR` at a temporary directory for the whole process).

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
}
