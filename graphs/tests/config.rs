//! ModelConfig from real files and from synthetic files with one thing wrong.

mod common;

use graphs::config::*;
use graphs::gguf::{GgufFile, GgufWriter, MetaValue};
use graphs::quant::GgmlType;

#[test]
fn smollm2_config() {
    let Some(p) = common::smollm2() else { return };
    let c = ModelConfig::from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    assert_eq!(
        c,
        ModelConfig {
            arch: Arch::Llama,
            n_layer: 30,
            n_embd: 576,
            n_head: 9,
            n_head_kv: 3,
            head_dim: 64,
            n_ff: 1536,
            vocab_size: 49152,
            ctx_len: 8192,
            rope_theta: 100000.0,
            rope_style: RopeStyle::Normal,
            rms_eps: 1e-5,
            has_qkv_bias: false,
            tied_embeddings: true,
        }
    );
}

#[test]
fn qwen05_config() {
    let Some(p) = common::qwen05() else { return };
    let c = ModelConfig::from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    assert_eq!(c.arch, Arch::Qwen2);
    assert_eq!(
        (c.n_layer, c.n_embd, c.n_head, c.n_head_kv),
        (24, 896, 14, 2)
    );
    assert_eq!(
        (c.head_dim, c.n_ff, c.vocab_size, c.ctx_len),
        (64, 4864, 151936, 32768)
    );
    assert_eq!(c.rope_style, RopeStyle::Neox);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rms_eps, 1e-6);
    assert!(c.has_qkv_bias);
    assert!(!c.tied_embeddings);
}

/// A tiny llama-shaped model with zero weights.
fn tiny(arch: &str, skip: Option<&str>, reshape: Option<(&str, Vec<u64>)>) -> GgufFile {
    let (e, h, kv, ff, v, layers) = (64u64, 4u64, 2u64, 96u64, 40u64, 2usize);
    let hd = e / h;
    let mut w = GgufWriter::new()
        .meta("general.architecture", MetaValue::Str(arch.into()))
        .meta(
            &format!("{arch}.block_count"),
            MetaValue::U32(layers as u32),
        )
        .meta(
            &format!("{arch}.embedding_length"),
            MetaValue::U32(e as u32),
        )
        .meta(
            &format!("{arch}.attention.head_count"),
            MetaValue::U32(h as u32),
        )
        .meta(
            &format!("{arch}.attention.head_count_kv"),
            MetaValue::U64(kv),
        )
        .meta(
            &format!("{arch}.feed_forward_length"),
            MetaValue::I32(ff as i32),
        )
        .meta(&format!("{arch}.context_length"), MetaValue::U32(256))
        .meta(
            &format!("{arch}.attention.layer_norm_rms_epsilon"),
            MetaValue::F32(1e-6),
        )
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array((0..v).map(|i| MetaValue::Str(format!("t{i}"))).collect()),
        );
    let mut tensors: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![e, v]),
        ("output_norm.weight".into(), vec![e]),
    ];
    for l in 0..layers {
        for (n, s) in [
            ("attn_norm.weight", vec![e]),
            ("attn_q.weight", vec![e, h * hd]),
            ("attn_k.weight", vec![e, kv * hd]),
            ("attn_v.weight", vec![e, kv * hd]),
            ("attn_output.weight", vec![h * hd, e]),
            ("ffn_norm.weight", vec![e]),
            ("ffn_gate.weight", vec![e, ff]),
            ("ffn_up.weight", vec![e, ff]),
            ("ffn_down.weight", vec![ff, e]),
            ("attn_q.bias", vec![h * hd]),
            ("attn_k.bias", vec![kv * hd]),
            ("attn_v.bias", vec![kv * hd]),
        ] {
            if arch != "qwen2" && n.ends_with("bias") {
                continue;
            }
            tensors.push((layer_tensor_name(l, n), s));
        }
    }
    for (name, mut shape) in tensors {
        if Some(name.as_str()) == skip {
            continue;
        }
        if let Some((n, s)) = &reshape {
            if *n == name {
                shape = s.clone();
            }
        }
        let n: u64 = shape.iter().product();
        let ty = if shape.len() == 2 {
            GgmlType::Q8_0
        } else {
            GgmlType::F32
        };
        let bytes = ty.row_bytes(n as usize).unwrap();
        w = w.tensor(&name, &shape, ty, vec![0; bytes]);
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn synthetic_configs() {
    let c = ModelConfig::from_gguf(&tiny("llama", None, None)).unwrap();
    assert_eq!((c.n_layer, c.head_dim, c.vocab_size), (2, 16, 40));
    assert!(c.tied_embeddings && !c.has_qkv_bias);
    assert_eq!(c.rope_theta, 10_000.0, "default when absent");
    let c = ModelConfig::from_gguf(&tiny("qwen2", None, None)).unwrap();
    assert!(c.has_qkv_bias);
    assert_eq!(c.expected_tensors().len(), 2 + 2 * 12);
}

#[test]
fn config_errors_name_the_problem() {
    let e = ModelConfig::from_gguf(&tiny("gemma3", None, None)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "unsupported architecture 'gemma3' (supported: llama, qwen2)"
    );
    let e = ModelConfig::from_gguf(&tiny("qwen2", Some("blk.1.attn_v.bias"), None)).unwrap_err();
    assert_eq!(e, ConfigError::MissingTensor("blk.1.attn_v.bias".into()));
    let e = ModelConfig::from_gguf(&tiny(
        "llama",
        None,
        Some(("blk.0.ffn_down.weight", vec![64, 96])),
    ))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "tensor 'blk.0.ffn_down.weight' has shape [64, 96], expected [96, 64]"
    );
    let bare = GgufFile::from_bytes(
        GgufWriter::new()
            .meta("general.architecture", MetaValue::Str("llama".into()))
            .to_bytes(),
    )
    .unwrap();
    assert_eq!(
        ModelConfig::from_gguf(&bare).unwrap_err(),
        ConfigError::MissingKey("llama.block_count".into())
    );
    let scaled = GgufFile::from_bytes(
        GgufWriter::new()
            .meta("general.architecture", MetaValue::Str("llama".into()))
            .meta("llama.block_count", MetaValue::U32(1))
            .meta("llama.embedding_length", MetaValue::U32(64))
            .meta("llama.attention.head_count", MetaValue::U32(4))
            .meta("llama.feed_forward_length", MetaValue::U32(64))
            .meta("llama.context_length", MetaValue::U32(64))
            .meta("llama.rope.scaling.type", MetaValue::Str("yarn".into()))
            .to_bytes(),
    )
    .unwrap();
    let e = ModelConfig::from_gguf(&scaled).unwrap_err().to_string();
    assert!(e.contains("rope scaling 'yarn' is unsupported"), "{e}");
    let none = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert_eq!(
        ModelConfig::from_gguf(&none).unwrap_err(),
        ConfigError::NoArchitecture
    );
}

/// The 1.5B model is not fetched by CI; run with `--ignored` after
/// `scripts/fetch-model.sh qwen2.5-coder-1.5b`.
#[test]
#[ignore = "needs qwen2.5-coder-1.5b.gguf (scripts/fetch-model.sh qwen2.5-coder-1.5b)"]
fn qwen15_config_tensors_and_tokenizer() {
    let Some(p) = common::model("qwen2.5-coder-1.5b.gguf", "qwen2.5-coder-1.5b") else {
        return;
    };
    let f = GgufFile::open(&p).unwrap();
    let c = ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(
        (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv),
        (Arch::Qwen2, 28, 1536, 12, 2)
    );
    assert_eq!((c.head_dim, c.n_ff, c.vocab_size), (128, 8960, 151936));
    assert!(c.has_qkv_bias && !c.tied_embeddings);
    let mut types: Vec<GgmlType> = f.tensors().iter().map(|t| t.ggml_type).collect();
    types.sort_by_key(|t| t.to_u32());
    types.dedup();
    assert_eq!(types, vec![GgmlType::F32, GgmlType::Q4K, GgmlType::Q6K]);
    for t in f.tensors() {
        let rb = t.ggml_type.row_bytes(t.row_len()).unwrap();
        let mut y = vec![0f32; t.row_len()];
        graphs::quant::dequantize_row(t.ggml_type, &f.tensor_data(t)[..rb], &mut y).unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "{}", t.name);
    }
    let tok = graphs::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.encode("Hello world", false).unwrap(), vec![9707, 1879]);
    assert_eq!(graphs::chat::ChatTemplate::from_gguf(&f).warning(), None);
}
