//! `rag generate`: greedy generation from a prompt with a local model (no retrieval).

use anyhow::{Context, Result};
use graphs::chat::ChatMessage;
use graphs::tokenizer::StreamDecoder;
use npu_runtime::backend::Backend;
use npu_runtime::session::{generate_greedy, LoadOptions, Model, Session, SessionOptions};
use npu_runtime::weights_cache::WeightsCache;
use specdec::budget::{CostCurve, DEFAULT_SIZES};
use specdec::curve_cache;
use specdec::{GenConfig, Generator};
use std::cell::Cell;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    /// A .gguf path or a model name from `rag model list`.
    #[arg(short, long, default_value = "smollm2-135m")]
    pub model: String,
    /// The prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Wrap the prompt as a user turn of the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Repack the model's weights on every load instead of keeping them in
    /// `$RAG_MODEL_DIR/repacked` (saves about one model size of disk).
    #[arg(long)]
    pub no_weights_cache: bool,
    /// Keep only the LM head itself, without the screened copy that lets greedy
    /// decoding read ~30% fewer of a Q8_0 head's bytes (saves 0.7x the head's size of
    /// memory).
    #[arg(long)]
    pub plain_lm_head: bool,
    /// KV cache precision: f32 (exact) or f16 (half the cache memory and attention
    /// bytes per token; llama.cpp's default).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    pub kv_cache: String,
    /// Speculative decoding: none (plain greedy steps), pld, sam or sdnpu. The output
    /// is the same token for token; only the speed differs.
    #[arg(long, default_value = "none", value_parser = ["none", "pld", "sam", "sdnpu"])]
    pub spec: String,
    #[command(flatten)]
    pub backend: rag_cli::backend_args::BackendArgs,
}

/// Timings of one generation, whichever way it decoded.
struct Stats {
    prompt_tokens: usize,
    generated: usize,
    prefill_ms: f64,
    decode_ms: f64,
    decode_tok_s: f64,
    /// Speculative decoding: mean tokens per verify step.
    tokens_per_step: Option<f64>,
    /// Progressive graph switching during the prefill.
    switching: Option<npu_runtime::session::SwitchReport>,
}

/// Greedy (`--spec none`: one decode step per token) or speculative generation on a
/// session of any backend. The verify-cost curve comes from the cache, or is profiled
/// once (before the prompt) and cached.
fn decode<B: Backend + Send>(
    session: &mut Session<B>,
    args: &Args,
    prompt: &[u32],
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Stats>
where
    B::Graph: Send,
{
    let mode = specdec::Mode::parse(&args.spec).map_err(|e| anyhow::anyhow!("--spec: {e}"))?;
    if mode == specdec::Mode::None {
        let s = generate_greedy(session, prompt, args.max_tokens, on_token)?;
        return Ok(Stats {
            prompt_tokens: s.prompt_tokens,
            generated: s.generated,
            prefill_ms: s.prefill_ms,
            decode_ms: s.decode_ms,
            decode_tok_s: s.decode_tok_s,
            tokens_per_step: None,
            switching: session.switch_report().cloned(),
        });
    }
    let model = session.model().clone();
    let backend = rag::engine::Engine::profile_tag(session);
    let file = curve_cache::backend_cache_file(
        &npu_runtime::schedule::profile::cache_dir(),
        model.path(),
        model.threads(),
        &backend,
    );
    let key = curve_cache::CurveKey::current(model.path(), model.threads())?.on_backend(&backend);
    let (curve, source) = curve_cache::get_or_profile(&file, &key, false, || {
        CostCurve::profile(session, prompt[0], &DEFAULT_SIZES, 3)
    })?;
    if !args.json {
        eprintln!("[verify cost curve: {source}]");
    }
    let cfg = GenConfig {
        cost_curve: Some(curve),
        max_budget: GenConfig::default()
            .max_budget
            .min(session.options().max_verify),
        ..GenConfig::default()
    };
    let mut generator = Generator::new(mode, None, cfg);
    let stopped = Cell::new(false);
    let mut emit = |t: u32| {
        if !stopped.get() && !on_token(t) {
            stopped.set(true);
        }
    };
    let (tokens, m) =
        generator.generate_until(session, prompt, args.max_tokens, &mut emit, &|| {
            stopped.get()
        })?;
    Ok(Stats {
        prompt_tokens: prompt.len(),
        generated: tokens.len(),
        prefill_ms: m.prefill_ms,
        decode_ms: m.decode_ms,
        decode_tok_s: m.decode_tok_s(),
        tokens_per_step: Some(m.mean_accepted()),
        switching: session.switch_report().cloned(),
    })
}

/// A session on the QNN HTP backend with `args`' shapes, sized for `needed` KV slots.
fn qnn_session(
    args: &Args,
    model: &std::sync::Arc<Model>,
    needed: usize,
) -> Result<Session<npu_qnn::QnnBackend>> {
    let kv = args.backend.qnn_kv;
    anyhow::ensure!(
        needed <= kv,
        "prompt + --max-tokens + one verify batch need {needed} KV slots, more than --qnn-kv {kv}"
    );
    let rag::engine::BackendChoice::Qnn(shapes) = args.backend.choice()? else {
        anyhow::bail!("not the QNN backend");
    };
    let precision = rag_cli::kv_precision(&args.kv_cache)?;
    let t0 = std::time::Instant::now();
    let s = rag::engine::qnn_session(model, &shapes, kv, precision, args.backend.budget_mb()?)?;
    eprintln!(
        "[qnn: {} graphs compiled or loaded from the context cache, ready in {:.1} s]",
        s.graphs().count(),
        t0.elapsed().as_secs_f64()
    );
    Ok(s)
}

pub fn run(args: Args) -> Result<()> {
    let path = rag::models::ensure(&args.model)?;
    let model = Model::load(
        &path,
        &LoadOptions {
            threads: args.threads,
            weights_cache: if args.no_weights_cache {
                WeightsCache::Off
            } else {
                WeightsCache::Dir(rag::models::weights_cache_dir())
            },
            plain_lm_head: args.plain_lm_head,
        },
    )
    .with_context(|| format!("loading {}", path.display()))?;
    let tok = model.tokenizer();
    let prompt = if args.chat {
        model
            .chat_template()
            .encode_chat(tok, &[ChatMessage::new("user", &args.prompt)], true)?
    } else {
        let mut ids = tok.encode(&args.prompt, false)?;
        if let (true, Some(bos)) = (tok.add_bos(), tok.bos_id()) {
            ids.insert(0, bos);
        }
        ids
    };
    if prompt.is_empty() {
        anyhow::bail!("the prompt encodes to no tokens");
    }
    let ctx = model.config().ctx_len;
    if prompt.len() >= ctx {
        anyhow::bail!(
            "prompt of {} tokens does not fit the model's context of {ctx} tokens",
            prompt.len()
        );
    }
    let mut ids = Vec::new();
    let mut stream = StreamDecoder::new();
    let mut piece = String::new();
    let mut stdout = std::io::stdout().lock();
    let on_token = |t| {
        ids.push(t);
        if !args.json {
            piece.clear();
            stream.push(tok, t, &mut piece);
            // A closed stdout (e.g. piped into `head`) stops generation.
            return write!(stdout, "{piece}")
                .and_then(|_| stdout.flush())
                .is_ok();
        }
        true
    };
    let stats = if args.backend.backend == "qnn" {
        let verify = args.backend.qnn_verify_rows;
        let mut session = qnn_session(&args, &model, prompt.len() + args.max_tokens + verify)?;
        decode(&mut session, &args, &prompt, on_token)?
    } else {
        let d = SessionOptions::default();
        let opts = SessionOptions {
            kv_capacity: (prompt.len() + args.max_tokens + d.max_verify + 1).min(ctx),
            kv_precision: rag_cli::kv_precision(&args.kv_cache)?,
            ..d
        };
        let mut session = rag::engine::cpu_session(&model, opts, args.backend.budget_mb()?)?;
        decode(&mut session, &args, &prompt, on_token)?
    };
    if args.json {
        let text = tok.decode(&ids)?;
        let obj = serde_json::json!({
            "tokens": ids,
            "text": text,
            "prompt_tokens": stats.prompt_tokens,
            "prefill_ms": stats.prefill_ms,
            "decode_ms": stats.decode_ms,
            "decode_tok_s": stats.decode_tok_s,
            "backend": args.backend.backend,
            "spec": args.spec,
            "tokens_per_step": stats.tokens_per_step,
            "switching": stats.switching,
        });
        writeln!(stdout, "{obj}")?;
    } else {
        piece.clear();
        stream.finish(&mut piece);
        writeln!(stdout, "{piece}")?;
        let per_step = stats
            .tokens_per_step
            .map_or(String::new(), |t| format!(", {t:.2} tokens per step"));
        eprintln!(
            "[{} prompt tokens, prefill {:.1} ms; {} tokens, {:.1} tok/s decode{per_step}]",
            stats.prompt_tokens, stats.prefill_ms, stats.generated, stats.decode_tok_s
        );
    }
    // A first run repacked the model: say so, and let the cache write finish so the next
    // run maps it.
    if let Some(note) = model.weights_cache().repacked_note() {
        eprintln!("({note})");
    }
    model.wait_weights_cache();
    Ok(())
}
