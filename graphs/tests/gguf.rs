//! GGUF parsing: real model files, synthetic files covering every metadata type,
//! and precise errors for corrupt input.

mod common;

use graphs::gguf::*;
use graphs::quant::GgmlType;

fn every_meta_type() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("t.u8", MetaValue::U8(200)),
        ("t.i8", MetaValue::I8(-5)),
        ("t.u16", MetaValue::U16(60000)),
        ("t.i16", MetaValue::I16(-30000)),
        ("t.u32", MetaValue::U32(4_000_000_000)),
        ("t.i32", MetaValue::I32(-7)),
        ("t.u64", MetaValue::U64(1 << 40)),
        ("t.i64", MetaValue::I64(-(1 << 40))),
        ("t.f32", MetaValue::F32(1.5)),
        ("t.f64", MetaValue::F64(-2.25)),
        ("t.bool", MetaValue::Bool(true)),
        ("t.str", MetaValue::Str("héllo".into())),
        (
            "t.strs",
            MetaValue::Array(vec![MetaValue::Str("a".into()), MetaValue::Str("".into())]),
        ),
        (
            "t.ints",
            MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(-2)]),
        ),
        (
            "t.floats",
            MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-1.0)]),
        ),
        (
            "t.nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::U8(1), MetaValue::U8(2)]),
                MetaValue::Array(vec![MetaValue::U8(3)]),
            ]),
        ),
        ("t.empty", MetaValue::Array(vec![])),
    ]
}

fn synthetic(alignment: Option<u32>) -> Vec<u8> {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w = w.alignment(a);
    }
    for (k, v) in every_meta_type() {
        w = w.meta(k, v);
    }
    let f32s: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.tensor("a", &[3, 2], GgmlType::F32, f32s)
        .tensor("b", &[32], GgmlType::Q8_0, vec![0; 34])
        .tensor("c", &[1], GgmlType::F16, vec![0, 0x3C])
        .to_bytes()
}

#[test]
fn synthetic_round_trip_all_metadata_types() {
    for align in [None, Some(1), Some(64)] {
        let f = GgufFile::from_bytes(synthetic(align)).unwrap();
        assert_eq!(f.version(), 3);
        for (k, v) in every_meta_type() {
            assert_eq!(f.get(k), Some(&v), "key {k}");
        }
        assert_eq!(f.get_u32("t.u8"), Some(200));
        assert_eq!(f.get_u32("t.u64"), None, "does not fit u32");
        assert_eq!(f.get_u32("t.i8"), None, "negative");
        assert_eq!(f.get_u64("t.u64"), Some(1 << 40));
        assert_eq!(f.get_f32("t.f64"), Some(-2.25));
        assert_eq!(f.get_f32("t.u8"), None);
        assert_eq!(f.get_bool("t.bool"), Some(true));
        assert_eq!(f.get_str("t.str"), Some("héllo"));
        assert_eq!(f.get_str_array("t.strs"), Some(vec!["a", ""]));
        assert_eq!(f.get_str_array("t.ints"), None);
        assert_eq!(f.get_i32_array("t.ints"), Some(vec![1, -2]));
        assert_eq!(f.get_f32_array("t.floats"), Some(vec![0.5, -1.0]));

        let a = f.tensor("a").unwrap();
        assert_eq!(
            (a.dims.clone(), a.ggml_type, a.n_bytes),
            (vec![3, 2], GgmlType::F32, 24)
        );
        assert_eq!((a.row_len(), a.n_rows(), a.n_elements()), (3, 2, 6));
        let data = f.tensor_data(a);
        assert_eq!(f32::from_le_bytes(data[20..24].try_into().unwrap()), 5.0);
        let c = f.tensor("c").unwrap();
        assert_eq!(f.tensor_data(c), &[0, 0x3C]);
        let align = align.unwrap_or(32) as u64;
        for t in f.tensors() {
            assert_eq!(t.offset % align, 0, "{} aligned", t.name);
        }
        assert!(f.tensor("nope").is_none());
    }
}

#[test]
fn open_from_disk_and_version_2() {
    let mut bytes = synthetic(None);
    bytes[4] = 2; // v2 has the same layout as v3 for little-endian files
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, &bytes).unwrap();
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 3);
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let err = GgufFile::open(&empty).unwrap_err();
    assert!(err.to_string().contains("truncated at offset 0"), "{err}");
    let err = GgufFile::open(&dir.path().join("missing.gguf")).unwrap_err();
    assert!(err.to_string().contains("missing.gguf"), "{err}");
}

fn err_of(bytes: &[u8]) -> String {
    GgufFile::parse(bytes).unwrap_err().to_string()
}

#[test]
fn clear_errors() {
    let good = synthetic(None);
    assert!(err_of(b"GGML\x03\0\0\0").contains("bad magic"));
    assert!(err_of(b"GGUF\x01\0\0\0").contains("version 1"));
    assert!(err_of(b"GGUF\0\0\0\x03").contains("big-endian"));
    assert!(err_of(&good[..3]).contains("truncated at offset 0"));
    let e = err_of(&good[..30]);
    assert!(
        e.contains("truncated") || e.contains("impossible for a file of 30 bytes"),
        "{e}"
    );
    let e = err_of(&good[..300]);
    assert!(e.contains("truncated at offset"), "{e}");

    // huge tensor count
    let mut b = good.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_of(&b).contains("tensor count"), "{}", err_of(&b));
    // huge metadata count
    let mut b = good.clone();
    b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(
        err_of(&b).contains("metadata key/value count"),
        "{}",
        err_of(&b)
    );

    // tensor data cut off
    let e = err_of(&good[..good.len() - 1]);
    assert!(e.contains("tensor 'c' extends past end of file"), "{e}");

    // unknown ggml type
    let b = GgufWriter::new()
        .tensor("w", &[32], GgmlType::F32, vec![0; 128])
        .to_bytes();
    let pos = find_tensor_type_field(&b, "w");
    let mut bad = b.clone();
    bad[pos..pos + 4].copy_from_slice(&16u32.to_le_bytes());
    let e = err_of(&bad);
    assert!(
        e.contains("unknown ggml type 16 (iq2_xxs) for tensor 'w'"),
        "{e}"
    );

    // row not a multiple of the block size
    let b = GgufWriter::new()
        .tensor("q", &[16], GgmlType::Q8_0, vec![0; 34])
        .to_bytes();
    assert!(err_of(&b).contains("tensor 'q' has bad shape"));

    // overflowing element count
    let b = GgufWriter::new()
        .tensor("big", &[u64::MAX / 2, 4], GgmlType::F32, vec![])
        .to_bytes();
    assert!(err_of(&b).contains("overflows"), "{}", err_of(&b));

    // misaligned offset
    let b = GgufWriter::new()
        .tensor("x", &[1], GgmlType::F32, vec![0; 4])
        .tensor("y", &[1], GgmlType::F32, vec![0; 4])
        .to_bytes();
    let pos = find_tensor_type_field(&b, "y") + 4;
    let mut bad = b.clone();
    bad[pos..pos + 8].copy_from_slice(&4u64.to_le_bytes());
    assert!(err_of(&bad).contains("not a multiple of the alignment 32"));

    // bad alignment value
    let b = GgufWriter::new().alignment(3).to_bytes();
    assert!(err_of(&b).contains("power of two"));

    // duplicates
    let b = GgufWriter::new()
        .meta("k", MetaValue::U8(1))
        .meta("k", MetaValue::U8(2))
        .to_bytes();
    assert!(err_of(&b).contains("duplicate metadata key 'k'"));
    let b = GgufWriter::new()
        .tensor("t", &[1], GgmlType::F32, vec![0; 4])
        .tensor("t", &[1], GgmlType::F32, vec![0; 4])
        .to_bytes();
    assert!(err_of(&b).contains("duplicate tensor name 't'"));

    // too many dims
    let b = GgufWriter::new()
        .tensor("t5", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4])
        .to_bytes();
    assert!(err_of(&b).contains("5 dimensions"));

    // deep nesting
    let mut v = MetaValue::U8(0);
    for _ in 0..20 {
        v = MetaValue::Array(vec![v]);
    }
    let b = GgufWriter::new().meta("deep", v).to_bytes();
    assert!(err_of(&b).contains("nested deeper"));

    // invalid UTF-8 key and unknown value type
    let mut b = GgufWriter::new().meta("ab", MetaValue::U8(1)).to_bytes();
    b[24 + 8] = 0xFF;
    assert!(err_of(&b).contains("UTF-8"));
    let mut b = GgufWriter::new().meta("ab", MetaValue::U8(1)).to_bytes();
    b[24 + 8 + 2..24 + 8 + 6].copy_from_slice(&13u32.to_le_bytes());
    assert!(err_of(&b).contains("unknown metadata value type 13 for key 'ab'"));
}

/// Offset of the u32 type field of tensor `name` in a writer image.
fn find_tensor_type_field(b: &[u8], name: &str) -> usize {
    let mut pat = (name.len() as u64).to_le_bytes().to_vec();
    pat.extend_from_slice(name.as_bytes());
    let at = b
        .windows(pat.len())
        .rposition(|w| w == pat.as_slice())
        .unwrap();
    let n_dims_at = at + pat.len();
    let n_dims = u32::from_le_bytes(b[n_dims_at..n_dims_at + 4].try_into().unwrap()) as usize;
    n_dims_at + 4 + 8 * n_dims
}

#[test]
fn real_smollm2() {
    let Some(p) = common::smollm2() else { return };
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.get_str("general.architecture"), Some("llama"));
    assert_eq!(f.get_u32("llama.block_count"), Some(30));
    assert_eq!(f.get_str("tokenizer.ggml.pre"), Some("smollm"));
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(f.tensors().len(), 272);
    let e = f.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (e.dims.clone(), e.ggml_type),
        (vec![576, 49152], GgmlType::Q8_0)
    );
    assert_eq!(
        f.tensor("blk.0.ffn_down.weight").unwrap().ggml_type,
        GgmlType::Q4_1
    );
    assert_eq!(f.tensor_data(e).len(), 49152 * 576 / 32 * 34);
}

#[test]
fn real_qwen05() {
    let Some(p) = common::qwen05() else { return };
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.get_str("general.architecture"), Some("qwen2"));
    assert_eq!(f.tensors().len(), 291);
    let mut types: Vec<GgmlType> = f.tensors().iter().map(|t| t.ggml_type).collect();
    types.sort_by_key(|t| t.to_u32());
    types.dedup();
    assert_eq!(
        types,
        vec![
            GgmlType::F32,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q6K
        ]
    );
    assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id"), Some(151645));
}

/// Every tensor of the real files dequantizes to finite values (catches layout
/// mistakes that produce NaN/inf from garbage scale bytes), and the magnitudes are
/// plausible for trained weights.
#[test]
fn real_tensors_dequantize_finite() {
    for p in [common::smollm2(), common::qwen05()].into_iter().flatten() {
        let f = GgufFile::open(&p).unwrap();
        for t in f.tensors() {
            let row = t.row_len();
            let rb = t.ggml_type.row_bytes(row).unwrap();
            let data = f.tensor_data(t);
            let mut y = vec![0f32; row];
            // first, middle and last row keep the test fast
            let n = t.n_rows();
            for r in [0, n / 2, n - 1] {
                graphs::quant::dequantize_row(t.ggml_type, &data[r * rb..(r + 1) * rb], &mut y)
                    .unwrap();
                let amax = y.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert!(
                    y.iter().all(|v| v.is_finite()) && amax < 1e4,
                    "{} row {r}: amax {amax}",
                    t.name
                );
            }
        }
    }
}

/// A mapped file's tensor pages, released after use, read back the same bytes, and the
/// other tensors and the metadata are untouched; in-memory images ignore the call.
#[test]
fn released_tensor_pages_read_back_unchanged() {
    // Several pages per tensor, so whole pages are actually released.
    let big: Vec<u8> = (0..5 * 4096 * 4).map(|i| (i * 7 % 251) as u8).collect();
    let other: Vec<u8> = (0..3 * 4096 * 4).map(|i| (i * 13 % 241) as u8).collect();
    let bytes = GgufWriter::new()
        .meta("t.str", MetaValue::Str("kept".into()))
        .tensor("big", &[big.len() as u64 / 4], GgmlType::F32, big.clone())
        .tensor(
            "other",
            &[other.len() as u64 / 4],
            GgmlType::F32,
            other.clone(),
        )
        .to_bytes();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensor("big").unwrap().clone();
    assert_eq!(f.tensor_data(&t), &big[..]);
    f.release_tensor_pages(&t);
    f.release_tensor_pages(&t); // twice is fine
    assert_eq!(f.tensor_data(&t), &big[..]);
    let o = f.tensor("other").unwrap();
    assert_eq!(f.tensor_data(o), &other[..]);
    assert_eq!(f.bytes(), &bytes[..]);

    let mem = GgufFile::from_bytes(bytes.clone()).unwrap();
    let t = mem.tensor("big").unwrap().clone();
    mem.release_tensor_pages(&t);
    assert_eq!(mem.tensor_data(&t), &big[..]);
}
