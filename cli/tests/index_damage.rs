//! A damaged index on disk (the SQLite store or the tantivy text index truncated,
//! bit-flipped or overwritten) never makes `rag` panic: a command either still works or
//! fails with an error, which names `rag index --rebuild` when the damage is recognized,
//! and `rag index --rebuild DIR` recovers a working index.
//!
//! Case counts: [`CI_CASES`] random damages in CI (each runs `rag` three times); a long
//! campaign sets `PROPTEST_CASES` (docs/fuzzing.md).

use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const CI_CASES: u32 = 12;

fn config() -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = CI_CASES;
    }
    c
}

fn rag(idx: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rag"))
        .args(args)
        .arg("--no-dense")
        .arg("--index-dir")
        .arg(idx)
        .output()
        .unwrap()
}

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/sample-corpus")
}

fn index(idx: &Path, rebuild: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rag"));
    c.arg("index");
    if rebuild {
        c.arg("--rebuild");
    }
    c.args(["--no-dense", "--index-dir"])
        .arg(idx)
        .arg(corpus())
        .output()
        .unwrap()
}

/// The files of a fresh index: `store.sqlite` and the tantivy files.
fn files(idx: &Path) -> Vec<PathBuf> {
    let mut v = vec![idx.join("store.sqlite")];
    let mut bm25: Vec<PathBuf> = std::fs::read_dir(idx.join("bm25"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.file_name().unwrap().to_string_lossy().ends_with(".lock"))
        .collect();
    bm25.sort();
    v.extend(bm25);
    v
}

#[derive(Debug, Clone)]
enum Damage {
    Truncate(f64),
    Flip(Vec<(f64, u8)>),
    Overwrite(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0.0f64..1.0).prop_map(Damage::Truncate),
        prop::collection::vec((0.0f64..1.0, 1u8..=255), 1..64).prop_map(Damage::Flip),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Damage::Overwrite),
    ]
}

fn apply(path: &Path, d: &Damage) {
    let mut b = std::fs::read(path).unwrap();
    match d {
        Damage::Truncate(p) => b.truncate((p * b.len() as f64) as usize),
        Damage::Flip(flips) => {
            for (p, x) in flips {
                if !b.is_empty() {
                    let i = ((p * b.len() as f64) as usize).min(b.len() - 1);
                    b[i] ^= x;
                }
            }
        }
        Damage::Overwrite(head) => {
            let n = head.len().min(b.len());
            b[..n].copy_from_slice(&head[..n]);
        }
    }
    std::fs::write(path, b).unwrap();
}

/// `out` is a success or a clean failure (never a panic); a recognized damage names the
/// way out.
fn clean(out: &Output, what: &str) -> Result<(), TestCaseError> {
    let err = String::from_utf8_lossy(&out.stderr);
    prop_assert!(!err.contains("panicked"), "{what}: {err}");
    prop_assert_ne!(out.status.code(), Some(101), "{}: {}", what, err);
    if err.contains("is damaged") {
        prop_assert!(err.contains("rag index --rebuild"), "{what}: {err}");
    }
    Ok(())
}

fn finds_the_warranty(idx: &Path) -> bool {
    let out = rag(idx, &["search", "warranty"]);
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("warranty.txt")
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn damaged_index_fails_cleanly_and_rebuild_recovers(
        which in any::<prop::sample::Index>(),
        d in damage(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let idx = dir.path().join("idx");
        prop_assert!(index(&idx, false).status.success());
        let fs = files(&idx);
        let target = which.get(&fs);
        apply(target, &d);
        let what = format!("{} {d:?}", target.display());
        clean(&rag(&idx, &["search", "warranty"]), &what)?;
        clean(&rag(&idx, &["status"]), &what)?;
        let out = index(&idx, true);
        prop_assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        prop_assert!(finds_the_warranty(&idx), "{what}");
    }
}

/// Which file of an index a case damages.
type FileOf = Box<dyn Fn(&Path) -> PathBuf>;

/// The damages a user meets most (a store cut short, another file's bytes over it, a
/// text-index file cut short) and one that made tantivy panic are recognized and named.
#[test]
fn recognized_damage_names_the_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let idx = dir.path().join("idx");
    let cases: Vec<(FileOf, Damage)> = vec![
        (Box::new(|i| i.join("store.sqlite")), Damage::Truncate(0.1)),
        (
            Box::new(|i| i.join("store.sqlite")),
            Damage::Overwrite(b"not a database at all".to_vec()),
        ),
        (
            Box::new(|i| i.join("bm25/meta.json")),
            Damage::Overwrite(b"{garbage".to_vec()),
        ),
        (
            Box::new(|i| {
                files(i)
                    .into_iter()
                    .find(|p| p.extension().is_some_and(|e| e == "term"))
                    .unwrap()
            }),
            Damage::Truncate(0.5),
        ),
        // Made tantivy panic (a slice past the end) before bm25_guard.rs.
        (
            Box::new(|i| {
                files(i)
                    .into_iter()
                    .find(|p| p.extension().is_some_and(|e| e == "fast"))
                    .unwrap()
            }),
            Damage::Overwrite(vec![0, 0, 0, 0, 1]),
        ),
    ];
    for (file, d) in cases {
        assert!(index(&idx, false).status.success());
        let target = file(&idx);
        apply(&target, &d);
        let out = rag(&idx, &["search", "warranty"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{} {d:?}", target.display());
        assert!(
            err.contains("is damaged") && err.contains("rag index --rebuild DIR"),
            "{} {d:?}: {err}",
            target.display()
        );
        // Without folders, the rebuild needs a readable store; named folders always work.
        assert!(index(&idx, true).status.success());
        assert!(finds_the_warranty(&idx));
    }
}
