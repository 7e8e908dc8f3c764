//! The packed e5 reader on small synthetic files: a valid one loads and embeds; truncated
//! and corrupted ones give `BertError`s, never a panic.

use rag_embedder::{BertError, BertModel, WeightFormat};

const H: usize = 32;
const FF: usize = 64;
const VOCAB: usize = 8;
const POSITIONS: usize = 8;
const PIECES: [&str; 8] = ["<s>", "<pad>", "</s>", "<unk>", "▁", "a", "b", "▁ab"];

/// Field offsets inside [`tiny_file`]'s header, for targeted corruption.
const VERSION_AT: usize = 4;
const HIDDEN_AT: usize = 8;
const BLOCK_AT: usize = 40;
const PIECE_COUNT_AT: usize = 44;
const OFFSETS_AT: usize = 72;

/// Deterministic Q4_0 blocks for `n` weights: small scales, varied nibbles.
fn q4(n: usize, seed: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for b in 0..n / 32 {
        out.extend(half::f16::from_f32(0.02 + 0.001 * (b % 7) as f32).to_le_bytes());
        out.extend((0..16).map(|j| (j as u8).wrapping_mul(7).wrapping_add(seed + b as u8)));
    }
    out
}

fn f32s(n: usize, base: f32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (base + 0.01 * (i % 5) as f32).to_le_bytes())
        .collect()
}

/// A complete one-layer file (hidden 32, 2 heads, FFN 64, 8 pieces, 8 positions).
fn tiny_file() -> Vec<u8> {
    let mut tensors: Vec<(String, u8, usize, Vec<u8>)> = vec![
        ("emb.word".into(), 1, VOCAB * H, q4(VOCAB * H, 1)),
        ("emb.pos".into(), 0, POSITIONS * H, f32s(POSITIONS * H, 0.0)),
        ("emb.type".into(), 0, 2 * H, f32s(2 * H, 0.0)),
        ("emb.ln.w".into(), 0, H, f32s(H, 1.0)),
        ("emb.ln.b".into(), 0, H, f32s(H, 0.0)),
    ];
    for (name, n, k) in [
        ("q", H, H),
        ("k", H, H),
        ("v", H, H),
        ("ao", H, H),
        ("fi", FF, H),
        ("fo", H, FF),
    ] {
        tensors.push((
            format!("l0.{name}.w"),
            1,
            n * k,
            q4(n * k, name.len() as u8),
        ));
        tensors.push((format!("l0.{name}.b"), 0, n, f32s(n, 0.0)));
    }
    for name in ["aln", "oln"] {
        tensors.push((format!("l0.{name}.w"), 0, H, f32s(H, 1.0)));
        tensors.push((format!("l0.{name}.b"), 0, H, f32s(H, 0.0)));
    }
    let mut f = Vec::new();
    f.extend(b"E5S1");
    f.extend(1u32.to_le_bytes());
    for v in [H, 1, 2, FF, VOCAB, POSITIONS, 2] {
        f.extend((v as i32).to_le_bytes());
    }
    f.extend(1e-5f32.to_le_bytes());
    f.extend(32i32.to_le_bytes());
    // Vocabulary: bos 0, eos 2, pad 1, unk 3.
    for v in [PIECES.len(), 0, 2, 1, 3] {
        f.extend((v as i32).to_le_bytes());
    }
    let text: String = PIECES.concat();
    f.extend((text.len() as u64).to_le_bytes());
    let mut off = 0u32;
    f.extend(off.to_le_bytes());
    for p in PIECES {
        off += p.len() as u32;
        f.extend(off.to_le_bytes());
    }
    for (i, _) in PIECES.iter().enumerate() {
        let score = if i < 4 { 0.0f32 } else { -(i as f32) };
        f.extend(score.to_le_bytes());
    }
    f.extend(text.as_bytes());
    // Normalisation: tab -> space, BEL dropped.
    let mut norm = Vec::new();
    norm.extend(9u32.to_le_bytes());
    norm.push(1);
    norm.extend(32u32.to_le_bytes());
    norm.extend(7u32.to_le_bytes());
    norm.push(0);
    f.extend(2i32.to_le_bytes());
    f.extend((norm.len() as u32).to_le_bytes());
    f.extend(norm);
    // Directory, then the data in order.
    f.extend((tensors.len() as i32).to_le_bytes());
    let dir_len: usize = tensors.iter().map(|t| 2 + t.0.len() + 1 + 4 + 8 + 8).sum();
    let mut data_at = (f.len() + dir_len) as u64;
    for (name, dtype, n, data) in &tensors {
        f.extend((name.len() as u16).to_le_bytes());
        f.extend(name.as_bytes());
        f.push(*dtype);
        f.extend((*n as u32).to_le_bytes());
        f.extend(data_at.to_le_bytes());
        f.extend((data.len() as u64).to_le_bytes());
        data_at += data.len() as u64;
    }
    for t in &tensors {
        f.extend(&t.3);
    }
    f
}

fn load(bytes: &[u8]) -> Result<(), BertError> {
    BertModel::packed_e5_from_bytes(bytes, WeightFormat::F32).map(|_| ())
}

fn err(bytes: &[u8]) -> String {
    load(bytes).expect_err("expected an error").to_string()
}

#[test]
fn a_valid_file_loads_tokenizes_and_embeds() {
    let (model, tok) = BertModel::packed_e5_from_bytes(&tiny_file(), WeightFormat::F32).unwrap();
    assert_eq!(model.config().layer_norm_eps as f32, 1e-5);
    assert_eq!(model.config().num_hidden_layers, 1);
    // "ab\ta" -> "▁ab▁a": the tab maps to a space.
    let ids = tok.encode_with_specials("ab\ta", POSITIONS);
    assert_eq!(ids, vec![0, 7, 4, 5, 2]);
    let mut ws = model.workspace(1, ids.len());
    let mut out = vec![0f32; H];
    model
        .sentence_embeddings(&mut ws, &[&ids], &mut out)
        .unwrap();
    let norm: f32 = out.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{out:?}");
    // Q8_0 loads from the same file too.
    BertModel::packed_e5_from_bytes(&tiny_file(), WeightFormat::Q8_0).unwrap();
}

#[test]
fn every_truncation_is_an_error() {
    let f = tiny_file();
    for len in 0..f.len() {
        let e = err(&f[..len]);
        assert!(
            e.contains("truncated") || e.contains("magic"),
            "length {len}: {e}"
        );
    }
}

#[test]
fn corrupt_fields_are_errors_with_a_reason() {
    let f = tiny_file();
    let with = |at: usize, bytes: &[u8]| {
        let mut g = f.clone();
        g[at..at + bytes.len()].copy_from_slice(bytes);
        g
    };
    assert!(err(&with(0, b"GGUF")).contains("magic"));
    assert!(err(&with(VERSION_AT, &2u32.to_le_bytes())).contains("version"));
    assert!(err(&with(HIDDEN_AT, &(-1i32).to_le_bytes())).contains("negative"));
    assert!(err(&with(HIDDEN_AT, &33i32.to_le_bytes())).contains("config"));
    assert!(err(&with(HIDDEN_AT, &48i32.to_le_bytes())).contains("multiples of 32"));
    assert!(err(&with(BLOCK_AT, &16i32.to_le_bytes())).contains("block"));
    assert!(err(&with(PIECE_COUNT_AT, &9i32.to_le_bytes())).contains("pieces"));
    // Second offset beyond the piece text.
    assert!(err(&with(OFFSETS_AT + 4, &999u32.to_le_bytes())).contains("piece 0"));
    // A piece's bytes not UTF-8: the first byte of "▁" (piece 4) replaced.
    let text_at = OFFSETS_AT + 4 * (PIECES.len() + 1) + 4 * PIECES.len();
    let at = text_at + PIECES[..4].concat().len();
    assert!(err(&with(at, &[0xFF])).contains("UTF-8"));
    // A tensor with another type or size than the config implies.
    let dir = f.windows(8).position(|w| w == b"emb.word").unwrap();
    assert!(err(&with(dir + 8, &[0])).contains("emb.word"));
    assert!(err(&with(dir + 8, &[9])).contains("unknown type"));
    assert!(err(&with(dir - 2, &[7, 0])).contains("emb.wor"));
    // A renamed tensor is missing, a repeated one is listed twice.
    assert!(err(&with(dir, b"emb.wXrd")).contains("emb.word missing"));
    let lnb = f.windows(8).position(|w| w == b"emb.ln.b").unwrap();
    assert!(err(&with(lnb, b"emb.ln.w")).contains("listed twice"));
}

#[test]
fn no_single_byte_flip_of_the_header_and_directory_panics() {
    let f = tiny_file();
    let data_start = f.windows(8).position(|w| w == b"l0.oln.b").unwrap() + 8 + 21;
    for at in 0..data_start {
        for x in [0xFF, 0x80, 0x01] {
            let mut g = f.clone();
            g[at] ^= x;
            let _ = load(&g);
        }
    }
}
