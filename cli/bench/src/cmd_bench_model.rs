//! `rag-bench model`: prefill and decode throughput and the verify-cost curve of a model
//! on the CPU backend (the same measurements as scripts/peers/llamacpp_bench.py).

use crate::bench_report;
use anyhow::{Context, Result};
use npu_runtime::session::{LoadOptions, Model, Session, SessionOptions};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// A .gguf path or a model name from `rag model list`.
    #[arg(long, default_value = "smollm2-135m")]
    pub model: String,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Repetitions per measurement (the median is reported; the verify curve runs three
    /// times as many rounds, the sizes taking turns).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Tokens per decode-speed measurement.
    #[arg(long, default_value_t = 32)]
    pub decode_tokens: usize,
    #[command(flatten)]
    pub report: bench_report::ReportArgs,
    /// KV cache precision: f32 (exact) or f16 (half the cache memory and attention
    /// bytes per token; llama.cpp's default).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    pub kv_cache: String,
    /// Load the LM head without its screen (`rag generate --plain-lm-head`): greedy
    /// decoding then reads the whole head, as before the screen.
    #[arg(long)]
    pub plain_lm_head: bool,
    /// `cpu`, or `qnn` (per-block timings of the QNN HTP backend; slow in emulation).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "qnn"])]
    pub backend: String,
    /// QNN: KV slots of the graphs.
    #[arg(long, default_value_t = 64)]
    pub qnn_kv: usize,
    /// QNN: tokens per prefill-graph run (the G1 shape).
    #[arg(long, default_value_t = rag::engine::QNN_PREFILL_ROWS)]
    pub qnn_chunk: usize,
    /// QNN: rows of the decode/verify graphs (the G2 shape; divides the chunk).
    #[arg(long, default_value_t = rag::engine::QNN_VERIFY_ROWS)]
    pub qnn_verify: usize,
    /// QNN: number of blocks.
    #[arg(long, default_value_t = 2)]
    pub qnn_blocks: usize,
    /// QNN: compile into a fresh, temporary context cache (measures finalize/serialize).
    #[arg(long)]
    pub qnn_cold: bool,
}

/// The prefill-shape and the decode-shape graphs of a QNN session, block order.
fn forms<G>(sets: Vec<(usize, &mut [G])>, chunk: usize, verify: usize) -> (&mut [G], &mut [G]) {
    let (mut pre, mut dec) = (None, None);
    for (t, g) in sets {
        if t == chunk {
            pre = Some(g);
        } else if t == verify {
            dec = Some(g);
        }
    }
    (pre.unwrap_or_default(), dec.unwrap_or_default())
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

/// Per-block QNN timings (compile, finalize, serialize, load, free, execute at both
/// shapes), a scheduler profile from them, and the report section `qnn`.
fn run_qnn(args: &Args, model: &Arc<Model>, name: &str) -> Result<()> {
    use npu_qnn::{BinaryCache, QnnBackend};
    use npu_runtime::backend::Backend;
    use npu_runtime::schedule::profile::{self, BlockProfile, Profile, PROFILE_FORMAT};
    let cold = std::env::temp_dir().join(format!("rag-qnn-cold-{}", std::process::id()));
    let cache_dir = if args.qnn_cold {
        cold.clone()
    } else {
        BinaryCache::default_dir()
    };
    if args.qnn_kv == 0 || args.qnn_kv > model.config().ctx_len {
        anyhow::bail!(
            "--qnn-kv must be in 1..={} (the model's context length)",
            model.config().ctx_len
        );
    }
    let backend = QnnBackend::new(
        model.clone(),
        args.qnn_kv,
        Some(BinaryCache::new(cache_dir)),
    )?;
    let (chunk, verify) = (args.qnn_chunk, args.qnn_verify);
    anyhow::ensure!(
        verify < chunk && chunk.is_multiple_of(verify),
        "--qnn-chunk {chunk} must be a larger multiple of --qnn-verify {verify}"
    );
    let shapes = rag::engine::QnnShapes {
        prefill_rows: chunk,
        verify_rows: verify,
        blocks: args.qnn_blocks,
        cache_dir: None,
    };
    let opts = rag::engine::qnn_session_options(
        &shapes,
        args.qnn_kv,
        npu_runtime::session::KvPrecision::F32,
    )?;
    let t0 = Instant::now();
    let r = Session::with_backend(backend, model.clone(), opts);
    if args.qnn_cold {
        let _ = std::fs::remove_dir_all(&cold);
    }
    let mut r = r?;
    let setup_s = t0.elapsed().as_secs_f64();
    let toks = bench_tokens(chunk + 1, model.vocab_size());
    let nb = args.qnn_blocks.min(model.config().n_layer).max(1);
    let (mut g1, mut g2) = (vec![Vec::new(); nb], vec![Vec::new(); nb]);
    r.prefill(&toks[..chunk], 0)?; // warm-up
    for _ in 0..args.reps.max(1) {
        r.truncate(0)?;
        r.prefill(&toks[..chunk], 0)?;
        r.decode_step(toks[chunk])?;
        let (b, sets) = r.graphs_mut();
        let (pre, dec) = forms(sets, chunk, verify);
        for i in 0..nb {
            g1[i].push(b.stats(&pre[i]).last_execute.as_secs_f64() * 1e3);
            g2[i].push(b.stats(&dec[i]).last_execute.as_secs_f64() * 1e3);
        }
    }
    // Free and load every graph once more to time the switch.
    let (b, sets) = r.graphs_mut();
    let (pre, dec) = forms(sets, chunk, verify);
    for g in pre.iter_mut().chain(dec.iter_mut()) {
        b.unload(g);
        b.load(g)?;
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let mut body = format!(
        "Model `{name}`, QNN HTP backend (x86-64 emulator from the onnxruntime-qnn wheel, \
         QNN build {}), fp16 weights and activations, {nb} blocks, G1 = {} tokens, \
         G2 = {verify} tokens (a decode step: 1 valid row), {} KV slots; execute times are \
         medians of {} runs. Machine shared \
         with other jobs (loaded). Compile = build + finalize + serialize on a context-cache \
         miss, else reading the cached binary; all graphs ready in {setup_s:.1} s.\n\n\
         | block | layers | shape | compile ms | finalize ms | serialize ms | cached | binary MB | load ms | free ms | execute ms |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        npu_qnn::runtime()?.build_id(),
        args.qnn_chunk,
        args.qnn_kv,
        args.reps.max(1)
    );
    let mut blocks = Vec::new();
    let (mut sum1, mut sum2) = (0.0, 0.0);
    for i in 0..nb {
        let (e1, e2) = (median(g1[i].clone()), median(g2[i].clone()));
        sum1 += e1;
        sum2 += e2;
        for (g, e, shape) in [(&pre[i], e1, chunk), (&dec[i], e2, verify)] {
            let t = g.times();
            let l = &b.block(g).layers;
            body.push_str(&format!(
                "| {i} | {}-{} | T={shape} | {:.0} | {:.0} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {e:.1} |\n",
                l.start,
                l.end - 1,
                ms(b.stats(g).compile),
                ms(t.finalize),
                ms(t.serialize),
                if t.cache_hit { "yes" } else { "no" },
                t.binary_bytes as f64 / 1e6,
                ms(t.load),
                ms(t.free),
            ));
        }
        let l = &b.block(&pre[i]).layers;
        blocks.push(BlockProfile {
            layers: format!("{}-{}", l.start, l.end - 1),
            g1_chunk_ms: e1,
            g2_chunk_ms: e2 * (chunk / verify) as f64,
            load_g2_ms: ms(dec[i].times().load),
            unload_g1_ms: ms(pre[i].times().free),
            mem_g1_bytes: pre[i].times().binary_bytes as u64,
            mem_g2_bytes: dec[i].times().binary_bytes as u64,
        });
    }
    body.push_str(&format!(
        "\nWhole model from the block sums: prefill {:.2} tok/s (G1), decode {:.2} tok/s (G2).\n",
        chunk as f64 / (sum1 / 1e3),
        1.0 / (sum2 / 1e3)
    ));
    let machine = npu_runtime::schedule::machine_id();
    let prof = Profile {
        format: PROFILE_FORMAT.into(),
        model: name.into(),
        backend: "qnn-htp".into(),
        machine: machine.clone(),
        source: format!("measured by rag-bench model --backend qnn on {machine} (HTP emulator)"),
        chunk_tokens: chunk,
        g2_tokens: verify,
        decode_step_ms: sum2,
        switch_needed: true,
        blocks,
    };
    prof.validate()?;
    let path = profile::cache_path(
        &profile::cache_dir(),
        name,
        "qnn-htp",
        &machine,
        args.qnn_chunk,
    );
    prof.save(&path)?;
    body.push_str(&format!(
        "\nScheduler profile written to `{}`.\n",
        path.display()
    ));
    if let Some(path) = &args.report.file {
        bench_report::write_section_in(
            path,
            "qnn",
            &format!("rag-bench model --backend qnn: {name}"),
            &body,
        )?;
    }
    if args.json {
        println!("{}", prof.to_json());
    } else {
        println!("{body}");
    }
    Ok(())
}

const VERIFY_SIZES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
const DEPTH: usize = 1000;

/// Timed rounds of the verify curve for `--reps`: its forwards are short next to the
/// decode rows (~0.3 s a round for the 0.5B), so it can afford three times as many.
pub(crate) fn verify_rounds(reps: usize) -> usize {
    3 * reps.max(1)
}

fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut xs = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        xs.push(t.elapsed().as_secs_f64() * 1e3);
    }
    xs.sort_by(|a, b| a.total_cmp(b));
    Ok(xs[xs.len() / 2])
}

/// Deterministic token ids in [1000, min(vocab, 30000)) (as the llama.cpp peer script).
fn bench_tokens(n: usize, vocab: usize) -> Vec<u32> {
    let hi = vocab.min(30_000) as u64;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (1000 + x % (hi - 1000)) as u32
        })
        .collect()
}

/// The bundled sample corpus, in a fixed order: natural text for greedy decoding.
const BENCH_TEXT: [&str; 6] = [
    include_str!("../../../examples/sample-corpus/guide/getting-started.md"),
    include_str!("../../../examples/sample-corpus/faq.html"),
    include_str!("../../../examples/sample-corpus/specs.txt"),
    include_str!("../../../examples/sample-corpus/guide/troubleshooting.md"),
    include_str!("../../../examples/sample-corpus/api/client.py"),
    include_str!("../../../examples/sample-corpus/guide/maintenance.md"),
];

/// [`BENCH_TEXT`] tokenized: at least `DEPTH + 1` tokens.
fn bench_text_tokens(model: &Model) -> Result<Vec<u32>> {
    let text = BENCH_TEXT.join("\n\n");
    let toks = model.tokenizer().encode(&text, false)?;
    anyhow::ensure!(
        toks.len() > DEPTH,
        "the bench text is {} tokens, {} needed",
        toks.len(),
        DEPTH + 1
    );
    Ok(toks)
}

pub(crate) fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn session(model: &Arc<Model>, kv_cache: &str) -> Result<Session> {
    Ok(Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: 2048,
            kv_precision: rag_cli::kv_precision(kv_cache)?,
            ..SessionOptions::default()
        },
    )?)
}

pub fn run(args: Args) -> Result<()> {
    let path = rag::models::ensure(&args.model)?;
    let load = LoadOptions {
        plain_lm_head: args.plain_lm_head,
        ..LoadOptions::with_threads(args.threads)
    };
    let model = Model::load(&path, &load).with_context(|| format!("loading {}", path.display()))?;
    if args.backend == "qnn" {
        let name = path
            .file_name()
            .map_or_else(|| args.model.clone(), |f| f.to_string_lossy().into_owned());
        return run_qnn(&args, &model, &name);
    }
    if model.config().ctx_len < 2048 {
        anyhow::bail!("the benchmark needs a context of 2048 tokens");
    }
    let toks = bench_tokens(1200, model.vocab_size());
    let mut s = session(&model, &args.kv_cache)?;

    let mut prefill = serde_json::Map::new();
    s.prefill(&toks[..8], 0)?; // warm-up
    for t in [128usize, 512] {
        let ms = median_ms(args.reps, || {
            s.truncate(0)?;
            s.prefill(&toks[..t], 0)?;
            Ok(())
        })?;
        prefill.insert(t.to_string(), (t as f64 / (ms / 1e3)).into());
    }

    let mut decode = serde_json::Map::new();
    for depth in [0usize, DEPTH] {
        s.truncate(0)?;
        s.prefill(&toks[..depth + 1], 0)?;
        // Every repetition decodes the same tokens from the same depth (rolled back first),
        // and the median is kept: one stall of a shared machine cannot set the figure.
        let ms = median_ms(args.reps, || {
            s.truncate(depth + 1)?;
            for i in 0..args.decode_tokens {
                s.decode_step(toks[depth + 1 + i])?;
            }
            Ok(())
        })?;
        decode.insert(
            depth.to_string(),
            (args.decode_tokens as f64 / (ms / 1e3)).into(),
        );
    }

    // Greedy decoding as `rag ask` runs it: real text as context, the model's own
    // argmax fed back, the argmax-only (screened) LM head.
    let text = bench_text_tokens(&model)?;
    let mut greedy = serde_json::Map::new();
    for depth in [0usize, DEPTH] {
        s.truncate(0)?;
        let first = npu_runtime::session::argmax(s.prefill(&text[..depth + 1], 0)?.logits);
        let ms = median_ms(args.reps, || {
            s.truncate(depth + 1)?;
            let mut tok = first;
            for _ in 0..args.decode_tokens {
                tok = s.decode_step_argmax(tok)?;
            }
            Ok(())
        })?;
        greedy.insert(
            depth.to_string(),
            (args.decode_tokens as f64 / (ms / 1e3)).into(),
        );
    }

    s.truncate(0)?;
    s.prefill(&toks[..DEPTH], 0)?;
    // The sizes take turns, one forward each per round, so a phase of the shared host
    // (its memory bandwidth swings by 2x within minutes) lands on every size alike and
    // not on N=1 alone, the denominator of every ratio.
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); VERIFY_SIZES.len()];
    let mut ids = Vec::with_capacity(VERIFY_SIZES[VERIFY_SIZES.len() - 1]);
    for round in 0..=verify_rounds(args.reps) {
        for (n, ts) in VERIFY_SIZES.into_iter().zip(&mut times) {
            let batch = &toks[DEPTH..DEPTH + n];
            let parents: Vec<i32> = (0..n as i32).map(|i| i - 1).collect();
            // Timed as speculative decoding runs it: the argmax-only LM head.
            let t = Instant::now();
            s.forward_tree_argmax(batch, &parents, &mut ids)?;
            if round > 0 {
                // (Round 0 warms up.)
                ts.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let mut verify = serde_json::Map::new();
    let mut rows = Vec::new();
    let mut one = 0.0;
    for (n, mut ts) in VERIFY_SIZES.into_iter().zip(times) {
        ts.sort_by(f64::total_cmp);
        let ms = ts[ts.len() / 2];
        if n == 1 {
            one = ms;
        }
        verify.insert(n.to_string(), ms.into());
        rows.push((n, ms, ms / one));
    }
    let rss = peak_rss_mb();
    let isa = format!("{:?}", npu_runtime::kernels::detected());
    let name = path
        .file_name()
        .map_or_else(|| args.model.clone(), |f| f.to_string_lossy().into_owned());
    let out = serde_json::json!({
        "model": name,
        "threads": model.threads(),
        "prefill_tok_s": prefill,
        "decode_tok_s": decode,
        "greedy_text_tok_s": greedy,
        "verify_ms": verify,
        "peak_rss_mb": rss,
        "isa": isa,
    });
    let f = |m: &serde_json::Map<String, serde_json::Value>, k: &str| {
        m.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0)
    };
    let mut body = format!(
        "Model `{name}`, {} threads, ISA {isa}, CPU backend, KV cache {}, median of {} runs.\n\n\
         | prefill T=128 | prefill T=512 | decode @0 | decode @{DEPTH} | greedy on text @0 | greedy on text @{DEPTH} | peak RSS |\n\
         |---|---|---|---|---|---|---|\n\
         | {:.1} tok/s | {:.1} tok/s | {:.1} tok/s | {:.1} tok/s | {:.1} tok/s | {:.1} tok/s | {rss:.0} MB |\n\n\
         Decode feeds fixed pseudo-random tokens and computes all logits; greedy on text \
         continues the sample corpus with the model's own argmax, as `rag ask` does.\n\n\
         Verify cost at depth {DEPTH} (one forward of N new tokens, the argmax of each row):\n\n\
         | N | ms | ratio to N=1 |\n|---|---|---|\n",
        model.threads(),
        args.kv_cache,
        args.reps,
        f(&prefill, "128"),
        f(&prefill, "512"),
        f(&decode, "0"),
        f(&decode, &DEPTH.to_string()),
        f(&greedy, "0"),
        f(&greedy, &DEPTH.to_string()),
    );
    for (n, ms, r) in rows {
        body.push_str(&format!("| {n} | {ms:.2} | {r:.2} |\n"));
    }
    if let Some(path) = &args.report.file {
        // The default run (this CPU's best kernels, f32 cache) keeps the section it always
        // had; a tier forced with `RAG_ISA` or another cache gets its own.
        let mut key = format!("model:{name}");
        let mut title = format!("rag-bench model: {name}");
        let best = npu_runtime::kernels::Isa::available()[0];
        let tier = npu_runtime::kernels::detected();
        if tier != best {
            key.push_str(&format!(":{}", tier.name()));
            title.push_str(&format!(", {} kernels", tier.name()));
        }
        if args.kv_cache != "f32" {
            key.push_str(&format!(":kv-{}", args.kv_cache));
            title.push_str(&format!(", KV cache {}", args.kv_cache));
        }
        bench_report::write_section_in(path, &key, &title, &body)?;
    }
    if args.json {
        println!("{out}");
    } else {
        println!("{body}");
    }
    Ok(())
}
