//! Property-based fuzzing of `GgufFile::parse`: random bytes, mutated and
//! truncated synthetic files, and mutated/truncated real model headers must give
//! `Ok` or a clean `Err`, never a panic, a hang or a huge allocation. Whenever a
//! mutated image parses, every tensor lies inside it.
//!
//! Case counts: proptest's default (256 per property) in CI; see graphs/README.md
//! for a long run with PROPTEST_CASES.

mod common;

use std::sync::OnceLock;

use graphs::gguf::{GgufFile, GgufWriter, MetaValue};
use graphs::quant::GgmlType;
use proptest::prelude::*;

fn synthetic() -> &'static [u8] {
    static IMG: OnceLock<Vec<u8>> = OnceLock::new();
    IMG.get_or_init(|| {
        let nested = MetaValue::Array(vec![
            MetaValue::Array(vec![
                MetaValue::Str("x".into()),
                MetaValue::Str("yz".into()),
            ]),
            MetaValue::Array(vec![]),
        ]);
        GgufWriter::new()
            .alignment(16)
            .meta("general.architecture", MetaValue::Str("llama".into()))
            .meta("a.u8", MetaValue::U8(1))
            .meta("a.i16", MetaValue::I16(-2))
            .meta("a.u64", MetaValue::U64(3))
            .meta("a.f64", MetaValue::F64(0.5))
            .meta("a.bool", MetaValue::Bool(true))
            .meta("a.nested", nested)
            .meta(
                "a.ints",
                MetaValue::Array((0..8).map(MetaValue::I32).collect()),
            )
            .tensor("t.f32", &[4, 2], GgmlType::F32, vec![1; 32])
            .tensor("t.q8", &[32], GgmlType::Q8_0, vec![2; 34])
            .tensor("t.q4k", &[256, 1], GgmlType::Q4K, vec![3; 144])
            .tensor("t.f16", &[3], GgmlType::F16, vec![4; 6])
            .to_bytes()
    })
}

/// The real SmolLM2 header (metadata + tensor directory, no tensor data) and
/// where its tensor directory starts; the synthetic image when model tests are
/// skipped.
fn real_header() -> &'static (Vec<u8>, usize) {
    static IMG: OnceLock<(Vec<u8>, usize)> = OnceLock::new();
    IMG.get_or_init(|| {
        let (bytes, first) = match common::smollm2() {
            Some(p) => {
                let f = GgufFile::open(&p).unwrap();
                let data_start = f.tensors().iter().map(|t| t.offset).min().unwrap() as usize;
                (
                    f.bytes()[..data_start].to_vec(),
                    f.tensors()[0].name.clone(),
                )
            }
            None => (synthetic().to_vec(), "t.f32".to_string()),
        };
        let mut pat = (first.len() as u64).to_le_bytes().to_vec();
        pat.extend_from_slice(first.as_bytes());
        let dir = bytes
            .windows(pat.len())
            .rposition(|w| w == pat.as_slice())
            .unwrap();
        (bytes, dir)
    })
}

fn check(bytes: &[u8]) {
    if let Ok((_, _, tensors)) = GgufFile::parse(bytes) {
        for t in &tensors {
            assert!(t.offset as usize + t.n_bytes <= bytes.len(), "{}", t.name);
        }
        let f = GgufFile::from_bytes(bytes.to_vec()).unwrap();
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len(), t.n_bytes);
        }
    }
}

/// Apply byte mutations (position as a fraction of the length) and a truncation.
fn mutate(base: &[u8], edits: &[(f64, u8)], keep: f64, focus: usize) -> Vec<u8> {
    let mut b = base.to_vec();
    // concentrate edits on the first `focus` bytes, where counts and types live
    let span = focus.min(b.len()).max(1);
    for &(pos, val) in edits {
        if !b.is_empty() {
            let i = ((pos * span as f64) as usize).min(b.len() - 1);
            b[i] = val;
        }
    }
    let n = ((keep * b.len() as f64) as usize).min(b.len());
    b.truncate(n.max(1));
    b
}

proptest! {
    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes);
    }

    #[test]
    fn random_after_valid_magic(version in 0u32..5, rest in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&rest);
        check(&b);
    }

    #[test]
    fn mutated_synthetic(
        edits in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 0..8),
        keep in prop_oneof![Just(1.0f64), 0.0f64..1.0],
    ) {
        let img = synthetic();
        check(&mutate(img, &edits, keep, img.len()));
    }

    #[test]
    fn mutated_real_header(
        edits in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..6),
        keep in prop_oneof![Just(1.0f64), 0.0f64..1.0],
        focus in prop_oneof![Just(64usize), Just(4096usize), Just(usize::MAX)],
    ) {
        check(&mutate(&real_header().0, &edits, keep, focus));
    }

    #[test]
    fn mutated_tensor_directory(
        edits in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..6),
    ) {
        // mutate only the tensor directory (names, dims, types, offsets)
        let (h, dir) = real_header();
        let span = h.len() - dir;
        let mut b = h.clone();
        for &(pos, val) in &edits {
            b[dir + ((pos * span as f64) as usize).min(span - 1)] = val;
        }
        check(&b);
    }
}

#[test]
fn seeds_parse() {
    assert!(GgufFile::parse(synthetic()).is_ok());
    // the real header alone parses up to its tensor extents, which lie past its end
    if common::smollm2().is_some() {
        let e = GgufFile::parse(&real_header().0).unwrap_err().to_string();
        assert!(e.contains("extends past end of file"), "{e}");
    }
}
