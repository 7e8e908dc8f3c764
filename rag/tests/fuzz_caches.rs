//! Property-based fuzzing of the on-disk caches the assistant reads at start-up: the
//! speculative decoding token database, the verify-cost curve cache and the drafting state
//! learned beside it, the prompt-head KV cache and the warm-up profile. Truncated, bit-flipped, wrong-magic or wrong-version
//! files (and, for the checksummed formats, mutated bodies with a recomputed checksum, which
//! reach the parsing behind the checksum) must give a clean "no cache"/error, never a
//! panic or a huge allocation; a file that still loads holds what its format allows.
//!
//! Case counts: [`CI_CASES`] per property in CI; a long campaign sets `PROPTEST_CASES`
//! (docs/fuzzing.md). The repacked-weights cache is fuzzed in npu-runtime.

use graphs::fnv::Fnv1a;
use npu_runtime::schedule::Profile;
use proptest::prelude::*;
use rag::prompt_head::{self, PromptHead};
use specdec::budget::CostCurve;
use specdec::curve_cache::{self, CurveKey};
use specdec::tokendb::TokenDb;
use std::path::Path;

const CI_CASES: u32 = 256;

fn config() -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = CI_CASES;
    }
    c
}

#[derive(Debug, Clone)]
enum Damage {
    Truncate(f64),
    Flip(f64, u8),
    Insert(f64, Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0.0f64..1.0).prop_map(Damage::Truncate),
        (0.0f64..1.0, 1u8..=255).prop_map(|(p, x)| Damage::Flip(p, x)),
        (0.0f64..1.0, prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(p, b)| Damage::Insert(p, b)),
    ]
}

fn apply(mut b: Vec<u8>, ds: &[Damage]) -> Vec<u8> {
    let at = |p: f64, len: usize| ((p * len as f64) as usize).min(len);
    for d in ds {
        match d {
            Damage::Truncate(p) => b.truncate(at(*p, b.len())),
            Damage::Flip(p, x) if !b.is_empty() => {
                let i = at(*p, b.len() - 1);
                b[i] ^= x;
            }
            Damage::Flip(..) => {}
            Damage::Insert(p, ins) => {
                let i = at(*p, b.len());
                b.splice(i..i, ins.iter().copied());
            }
        }
    }
    b
}

/// Replaces the trailing 8-byte FNV-1a checksum of `b` by the checksum of the rest, so a
/// mutation reaches the parser behind the checksum.
fn reseal(mut b: Vec<u8>) -> Vec<u8> {
    if b.len() >= 8 {
        let n = b.len() - 8;
        let mut h = Fnv1a::default();
        h.write(&b[..n]);
        b[n..].copy_from_slice(&h.0.to_le_bytes());
    }
    b
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn token_db_image() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let mut db = TokenDb::new(1000);
    db.add(&[1, 2, 3, 4, 5]);
    db.add(&[9, 8, 7]);
    db.add(&[u32::MAX - 1, 0, 42]);
    let p = dir.path().join("tokendb.bin");
    db.save(&p).unwrap();
    std::fs::read(p).unwrap()
}

fn head_image() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = prompt_head::file(dir.path(), "m");
    let head = PromptHead {
        tokens: vec![1, 2, 3],
        rows: (0..12).map(|i| i as f32).collect(),
    };
    prompt_head::store(&p, "key", &head).unwrap();
    std::fs::read(p).unwrap()
}

fn curve_key() -> CurveKey {
    CurveKey {
        model_fingerprint: "123-00ff".into(),
        threads: 2,
        machine: "test machine".into(),
        engine: "specdec test".into(),
    }
}

fn curve_image() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("verify-m-t2.json");
    let curve = CostCurve::new(vec![1, 2, 4, 8], vec![10.0, 10.5, 11.0, 14.0]).unwrap();
    curve_cache::store(&p, &curve_key(), &curve).unwrap();
    std::fs::read(p).unwrap()
}

fn fresh_generator() -> specdec::Generator {
    let curve = CostCurve::new(vec![1, 2, 4, 8], vec![10.0, 10.5, 11.0, 14.0]).unwrap();
    specdec::Generator::new(
        specdec::Mode::Sdnpu,
        None,
        specdec::GenConfig {
            cost_curve: Some(curve),
            ..Default::default()
        },
    )
}

fn learned_image() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("verify-m-t2.learned.json");
    curve_cache::store_learned(&p, &curve_key(), &fresh_generator().learned()).unwrap();
    std::fs::read(p).unwrap()
}

/// A learned state that loads is restored whole or refused whole, and what a generator
/// holds after it is a valid state.
fn check_learned(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "verify-m-t2.learned.json", bytes);
    if let Ok(l) = curve_cache::load_learned(&p, &curve_key()) {
        let mut g = fresh_generator();
        let before = g.learned();
        if g.restore_learned(&l).is_err() {
            assert!(g.learned() == before);
        }
        let a = g.learned().accept;
        assert!(a
            .hits
            .iter()
            .zip(&a.trials)
            .all(|(h, n)| h.is_finite() && n.is_finite()));
    }
}

/// A loaded token database is what the file says, bounded by what the file holds.
fn check_token_db(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "tokendb.bin", bytes);
    for bound in [None, Some(4)] {
        if let Ok(db) = TokenDb::load(&p, bound) {
            assert!(db.total_tokens() * 4 <= bytes.len());
            assert!(db.num_docs() <= db.total_tokens().max(bytes.len() / 4));
            if let Some(b) = bound {
                assert!(db.total_tokens() <= b);
            }
            let _ = db.build_index();
        }
    }
}

fn check_head(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "khead-m.bin", bytes);
    for floats in [0, 1, 4, usize::MAX] {
        if let Some(h) = prompt_head::load(&p, "key", floats) {
            assert_eq!(h.rows.len(), h.tokens.len() * floats);
            assert!(h.rows.len() * 4 <= bytes.len());
        }
    }
}

fn check_curve(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "verify-m-t2.json", bytes);
    if let Ok(c) = curve_cache::load(&p, &curve_key()) {
        // What loads is a valid curve: it rebuilds from its own points.
        CostCurve::new(c.sizes.clone(), c.ms.clone()).unwrap();
    }
}

fn check_profile(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "profile.json", bytes);
    if let Ok(prof) = Profile::load(&p) {
        prof.validate().unwrap();
        assert!(prof.n_chunks(4096) >= 1);
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn token_db_damaged(ds in prop::collection::vec(damage(), 1..5), sealed in any::<bool>()) {
        let b = apply(token_db_image(), &ds);
        check_token_db(&if sealed { reseal(b) } else { b });
    }

    #[test]
    fn prompt_head_damaged(ds in prop::collection::vec(damage(), 1..5), sealed in any::<bool>()) {
        let b = apply(head_image(), &ds);
        check_head(&if sealed { reseal(b) } else { b });
    }

    #[test]
    fn curve_cache_damaged(ds in prop::collection::vec(damage(), 1..5)) {
        check_curve(&apply(curve_image(), &ds));
    }

    #[test]
    fn learned_state_damaged(ds in prop::collection::vec(damage(), 1..5)) {
        check_learned(&apply(learned_image(), &ds));
    }

    #[test]
    fn profile_damaged(ds in prop::collection::vec(damage(), 1..5)) {
        let text = Profile::paper_phone().to_json().into_bytes();
        check_profile(&apply(text, &ds));
    }

    #[test]
    fn random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check_token_db(&bytes);
        check_token_db(&reseal(bytes.clone()));
        check_head(&bytes);
        check_head(&reseal(bytes.clone()));
        check_curve(&bytes);
        check_learned(&bytes);
        check_profile(&bytes);
    }
}

/// The seeds load, a wrong magic or version does not, and huge declared counts behind a
/// valid checksum are refused without allocating them.
#[test]
fn seeds_load_and_wrong_magic_or_counts_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let db = token_db_image();
    let p = write(dir.path(), "t.bin", &db);
    assert_eq!(TokenDb::load(&p, None).unwrap().total_tokens(), 11);
    let mut other = db.clone();
    other[7] = b'2'; // "SDTOKDB2": another version
    let p = write(dir.path(), "t.bin", &reseal(other));
    assert!(TokenDb::load(&p, None).is_err());
    let mut huge = db.clone();
    huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // document count
    let p = write(dir.path(), "t.bin", &reseal(huge));
    assert!(TokenDb::load(&p, None).is_err());

    let head = head_image();
    let p = write(dir.path(), "h.bin", &head);
    assert!(prompt_head::load(&p, "key", 4).is_some());
    let mut wrong = head.clone();
    wrong[6] = b'2'; // "RAGKVH2"
    let p = write(dir.path(), "h.bin", &reseal(wrong));
    assert!(prompt_head::load(&p, "key", 4).is_none());

    let p = write(dir.path(), "c.json", &curve_image());
    assert!(curve_cache::load(&p, &curve_key()).is_ok());
    let p = write(
        dir.path(),
        "prof.json",
        Profile::paper_phone().to_json().as_bytes(),
    );
    assert!(Profile::load(&p).is_ok());
    let other = Profile::paper_phone()
        .to_json()
        .replace("rag-prefill-profile/1", "rag-prefill-profile/2");
    let p = write(dir.path(), "prof.json", other.as_bytes());
    assert!(Profile::load(&p).is_err());
}
