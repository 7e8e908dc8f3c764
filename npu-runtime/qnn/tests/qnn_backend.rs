//! The QNN backend against the CPU backend on tiny random-weight models of both supported
//! architectures (llama: adjacent RoPE, tied embeddings; qwen2: halves RoPE, QKV bias,
//! separate LM head), through the same block driver: causal prefill chunks with padding,
//! single-token decode, a tree batch, two blocks (first/last/hidden hand-over), and the
//! context-binary cache.
//!
//! Tolerance: weights are stored as f16 in the GGUF, so both backends use identical
//! weights; the QNN graph computes activations in fp16 (rel. precision ~1e-3 per op).
//! We require every logit within 2e-2 of the CPU logit relative to the largest CPU logit
//! magnitude (plus 2e-3 absolute), and identical argmax when the CPU top-2 margin exceeds
//! that tolerance.

mod common;
use common::qnn_available;
use graphs::gguf::{GgufWriter, MetaValue};
use graphs::quant::GgmlType;
use npu_qnn::{BinaryCache, GraphOptions, QnnBackend, WeightFormat};
use npu_runtime::backend::Backend;
use npu_runtime::backend::CpuBackend;
use npu_runtime::session::{argmax, LoadOptions, Model, Session, SessionOptions};
use std::path::Path;
use std::sync::Arc;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// A tiny model with random f16 weights (std ~ 1/sqrt(fan_in)) written to `path`.
fn tiny_model(path: &Path, arch: &str, seed: u64) {
    let (e, h, kv, ff, v, layers) = (64u64, 4u64, 2u64, 96u64, 48u64, 2u64);
    let hd = e / h;
    let tokens: Vec<MetaValue> = (0..v).map(|i| MetaValue::Str(format!("t{i}"))).collect();
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
            MetaValue::U32(kv as u32),
        )
        .meta(
            &format!("{arch}.feed_forward_length"),
            MetaValue::U32(ff as u32),
        )
        .meta(&format!("{arch}.context_length"), MetaValue::U32(256))
        .meta(
            &format!("{arch}.attention.layer_norm_rms_epsilon"),
            MetaValue::F32(1e-5),
        )
        .meta("tokenizer.ggml.model", MetaValue::Str("gpt2".into()))
        .meta("tokenizer.ggml.tokens", MetaValue::Array(tokens))
        .meta("tokenizer.ggml.merges", MetaValue::Array(vec![]));
    let mut shapes: Vec<(String, Vec<u64>)> = vec![
        ("token_embd.weight".into(), vec![e, v]),
        ("output_norm.weight".into(), vec![e]),
    ];
    if arch == "qwen2" {
        shapes.push(("output.weight".into(), vec![e, v]));
    }
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
            shapes.push((format!("blk.{l}.{n}"), s));
        }
    }
    let mut rng = Rng(seed | 1);
    for (name, shape) in shapes {
        let n: u64 = shape.iter().product();
        if shape.len() == 2 {
            let scale = 1.5 / (shape[0] as f32).sqrt();
            let data: Vec<u8> = (0..n)
                .flat_map(|_| half::f16::from_f32(rng.next() * scale).to_le_bytes())
                .collect();
            w = w.tensor(&name, &shape, GgmlType::F16, data);
        } else {
            let norm = name.contains("norm");
            let data: Vec<u8> = (0..n)
                .flat_map(|_| {
                    let x = rng.next();
                    (if norm { 1.0 + 0.3 * x } else { 0.2 * x }).to_le_bytes()
                })
                .collect();
            w = w.tensor(&name, &shape, GgmlType::F32, data);
        }
    }
    std::fs::write(path, w.to_bytes()).unwrap();
}

fn assert_logits_close(qnn: &[f32], cpu: &[f32], vocab: usize, what: &str) {
    assert_eq!(qnn.len(), cpu.len());
    for (r, (q, c)) in qnn.chunks(vocab).zip(cpu.chunks(vocab)).enumerate() {
        let scale = c.iter().fold(0f32, |m, x| m.max(x.abs()));
        let tol = 2e-2 * scale + 2e-3;
        let worst = q
            .iter()
            .zip(c)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        if std::env::var_os("QNN_TEST_VERBOSE").is_some() {
            eprintln!("{what} row {r}: max diff {worst:.2e} (tol {tol:.2e})");
        }
        assert!(
            worst <= tol,
            "{what} row {r}: max |qnn - cpu| = {worst} > {tol}"
        );
        let mut sorted = c.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 2.0 * tol {
            assert_eq!(argmax(q), argmax(c), "{what} row {r}: argmax differs");
        }
    }
}

/// A session of `blocks` blocks on `backend`: prefill chunks of `chunk` rows, decode and
/// verify graphs of 1..=`chunk` rows, `cap` KV slots.
fn session<B: Backend>(
    backend: B,
    model: &Arc<Model>,
    blocks: usize,
    chunk: usize,
    cap: usize,
) -> npu_runtime::error::Result<Session<B>> {
    let opts = SessionOptions {
        kv_capacity: cap,
        prefill_chunk: chunk,
        max_verify: chunk,
        min_verify: 1,
        blocks,
        ..SessionOptions::default()
    };
    Session::with_backend(backend, model.clone(), opts)
}

/// The CPU reference: the same 2-block session on the CPU backend.
fn cpu_runner(model: &Arc<Model>, chunk: usize, cap: usize) -> Session<CpuBackend> {
    session(CpuBackend::new(model.clone(), cap), model, 2, chunk, cap).unwrap()
}

fn compare_arch(arch: &str, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{arch}.gguf"));
    tiny_model(&path, arch, seed);
    let model = Model::load(&path, &LoadOptions::with_threads(1)).unwrap();
    let vocab = model.vocab_size();
    let (chunk, cap) = (4, 16);
    let cache = BinaryCache::new(dir.path().join("ctx"));
    let qb = QnnBackend::new(model.clone(), cap, Some(cache.clone())).unwrap();
    let mut q = session(qb, &model, 2, chunk, cap).unwrap();
    let mut c = cpu_runner(&model, chunk, cap);
    // 6 prompt tokens: one full chunk and one padded chunk.
    let prompt = [3u32, 17, 5, 40, 22, 9];
    let lq = q.prefill(&prompt, 0).unwrap().logits.to_vec();
    let lc = c.prefill(&prompt, 0).unwrap().logits.to_vec();
    assert_logits_close(&lq, &lc, vocab, &format!("{arch} prefill"));
    let mut tok = argmax(&lc);
    for step in 0..4 {
        let lq = q.decode_step(tok).unwrap().to_vec();
        let lc = c.decode_step(tok).unwrap().to_vec();
        assert_logits_close(&lq, &lc, vocab, &format!("{arch} decode {step}"));
        tok = argmax(&lc);
    }
    // A tree batch: two children of the context, one grandchild, one padding row.
    let (tt, parents) = ([7u32, 11, 13], [-1i32, -1, 0]);
    let lq = q.forward_tree(&tt, &parents).unwrap().to_vec();
    let lc = c.forward_tree(&tt, &parents).unwrap().to_vec();
    assert_logits_close(&lq, &lc, vocab, &format!("{arch} tree"));
    // Every graph was compiled (cache miss) into the cache; a second backend loads them.
    assert!(q
        .graphs()
        .all(|g| !g.times().cache_hit && g.times().binary_bytes > 0));
    let qb2 = QnnBackend::new(model.clone(), cap, Some(cache)).unwrap();
    let mut q2 = session(qb2, &model, 2, chunk, cap).unwrap();
    assert!(q2.graphs().all(|g| g.times().cache_hit));
    let l2 = q2.prefill(&prompt, 0).unwrap().logits.to_vec();
    let lq = {
        let mut q3 = session(
            QnnBackend::new(model.clone(), cap, None).unwrap(),
            &model,
            2,
            chunk,
            cap,
        )
        .unwrap();
        q3.prefill(&prompt, 0).unwrap().logits.to_vec()
    };
    assert_eq!(
        l2, lq,
        "a cached binary computes exactly what a fresh compile does"
    );
}

#[test]
fn tiny_llama_matches_cpu() {
    if qnn_available() {
        compare_arch("llama", 11);
    }
}

#[test]
fn tiny_qwen2_matches_cpu() {
    if qnn_available() {
        compare_arch("qwen2", 23);
    }
}

/// s8 per-channel weights (`WeightFormat::S8PerChannel`) on the tiny qwen2 model (QKV
/// biases stay fp16 next to s8 weights): the graphs compile under their own cache key (a
/// cache holding the fp16 binaries is a miss), are smaller, and the logits stay within
/// `S8_TINY_TOL` of the CPU's (measured: max |s8 - cpu| 0.022 of logits up to 2.02, 1.1 %;
/// binaries 110,592 B per block vs 135,168 / 143,360 B with fp16 weights).
#[test]
fn tiny_qwen2_s8_weights_have_their_own_cache_entries_and_stay_close() {
    if !qnn_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("qwen2.gguf");
    tiny_model(&path, "qwen2", 23);
    let model = Model::load(&path, &LoadOptions::with_threads(1)).unwrap();
    let (chunk, cap) = (4, 16);
    let cache = BinaryCache::new(dir.path().join("ctx"));
    let f16 = session(
        QnnBackend::new(model.clone(), cap, Some(cache.clone())).unwrap(),
        &model,
        2,
        chunk,
        cap,
    )
    .unwrap();
    let s8_backend = QnnBackend::new(model.clone(), cap, Some(cache))
        .unwrap()
        .with_graph_options(GraphOptions {
            weights: WeightFormat::S8PerChannel,
            ..GraphOptions::default()
        });
    let mut s8 = session(s8_backend, &model, 2, chunk, cap).unwrap();
    for (a, b) in f16.graphs().zip(s8.graphs()) {
        let (a, b) = (a.times(), b.times());
        eprintln!(
            "binary: fp16 {} bytes, s8 {} bytes",
            a.binary_bytes, b.binary_bytes
        );
        assert!(!b.cache_hit, "s8 graphs must not load the fp16 binaries");
        assert!(b.binary_bytes < a.binary_bytes);
    }
    let mut c = cpu_runner(&model, chunk, cap);
    let prompt = [3u32, 17, 5, 40, 22, 9];
    let lq = s8.prefill(&prompt, 0).unwrap().logits.to_vec();
    let lc = c.prefill(&prompt, 0).unwrap().logits.to_vec();
    let scale = lc.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = lq
        .iter()
        .zip(&lc)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!("s8 vs cpu: max diff {worst:.4} of {scale:.3}");
    assert!(worst <= S8_TINY_TOL * scale, "{worst} of {scale}");
}

/// Max |s8 QNN logit - CPU logit| on the tiny model, as a fraction of the largest |CPU logit|.
const S8_TINY_TOL: f32 = 0.02;

#[test]
fn bad_shapes_are_errors() {
    if !qnn_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    tiny_model(&path, "llama", 5);
    let model = Model::load(&path, &LoadOptions::with_threads(1)).unwrap();
    let qb = QnnBackend::new(model.clone(), 8, None).unwrap();
    use graphs::ir::{BlockSpec, GraphShape};
    use npu_runtime::backend::Backend;
    assert!(qb
        .compile(&BlockSpec::whole(2), GraphShape::new(1, 16))
        .is_err());
    assert!(qb
        .compile(
            &BlockSpec {
                layers: 0..3,
                first: true,
                last: true
            },
            GraphShape::new(1, 8)
        )
        .is_err());
    let mut r = session(qb, &model, 1, 2, 8).unwrap();
    assert!(r.prefill(&[1; 9], 0).is_err(), "beyond the KV capacity");
    assert!(r.prefill(&[48], 0).is_err(), "token outside the vocabulary");
}
