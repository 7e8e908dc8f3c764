//! `rag generate`: greedy generation from a prompt with a local model (no retrieval).

use anyhow::{Context, Result};
use graphs::chat::ChatMessage;
use graphs::tokenizer::StreamDecoder;
use npu_runtime::session::{generate_greedy, LoadOptions, Model, Session, SessionOptions};
use npu_runtime::weights_cache::WeightsCache;
use std::io::Write;

#[derive(clap::Args)]
pub struct Args {
    /// A .gguf path or a model name from `rag model list`.
    #[arg(long, default_value = "smollm2-135m")]
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
    /// Where the block graphs run: `cpu`, or `qnn` (Qualcomm HTP; on x86-64 the emulator
    /// from `scripts/fetch-model.sh qnn-htp`, slow).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "qnn"])]
    pub backend: String,
    /// QNN: KV slots of the compiled graphs (a fixed shape, so compiled graphs are reused
    /// from the context cache across prompts); prompt + max_tokens must fit.
    #[arg(long, default_value_t = 128)]
    pub qnn_kv: usize,
    /// QNN: tokens per prefill-graph run.
    #[arg(long, default_value_t = 8)]
    pub qnn_chunk: usize,
    /// QNN: number of blocks (graphs per shape) the layers are split into.
    #[arg(long, default_value_t = 2)]
    pub qnn_blocks: usize,
}

/// Greedy generation on the QNN backend through the block driver.
fn generate_qnn(
    args: &Args,
    model: &std::sync::Arc<Model>,
    prompt: &[u32],
    on_token: impl FnMut(u32) -> bool,
) -> Result<npu_runtime::session::GenerationStats> {
    use npu_runtime::qnn::{generate_greedy, BinaryCache, BlockRunner, QnnBackend};
    use npu_runtime::session::StopReason;
    if prompt.len() + args.max_tokens > args.qnn_kv {
        anyhow::bail!(
            "prompt ({} tokens) + --max-tokens {} exceed --qnn-kv {}",
            prompt.len(),
            args.max_tokens,
            args.qnn_kv
        );
    }
    let backend = QnnBackend::new(
        model.clone(),
        args.qnn_kv,
        Some(BinaryCache::new(BinaryCache::default_dir())),
    )?;
    let t0 = std::time::Instant::now();
    let mut r = BlockRunner::new(
        backend,
        model.clone(),
        args.qnn_blocks,
        args.qnn_chunk,
        args.qnn_kv,
    )?;
    eprintln!(
        "[qnn: {} graphs compiled or loaded from the context cache in {:.1} s]",
        r.graphs().count(),
        t0.elapsed().as_secs_f64()
    );
    let s = generate_greedy(&mut r, prompt, args.max_tokens, on_token)?;
    Ok(npu_runtime::session::GenerationStats {
        prompt_tokens: s.prompt_tokens,
        generated: s.generated,
        prefill_ms: s.prefill_ms,
        decode_ms: s.decode_ms,
        decode_tok_s: if s.decode_ms > 0.0 {
            s.decode_steps as f64 / (s.decode_ms / 1e3)
        } else {
            0.0
        },
        // The driver stops early only at an end-of-generation token or a closed stdout.
        stop: if s.generated >= args.max_tokens {
            StopReason::MaxTokens
        } else {
            StopReason::EndOfGeneration
        },
    })
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
                WeightsCache::default_dir()
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
    let stats = if args.backend == "qnn" {
        generate_qnn(&args, &model, &prompt, on_token)?
    } else {
        let kv_capacity = (prompt.len() + args.max_tokens + 1).min(ctx);
        let mut session = Session::new(
            model.clone(),
            SessionOptions {
                kv_capacity,
                kv_precision: crate::kv_precision(&args.kv_cache)?,
                ..SessionOptions::default()
            },
        )?;
        generate_greedy(&mut session, &prompt, args.max_tokens, on_token)?
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
        });
        writeln!(stdout, "{obj}")?;
    } else {
        piece.clear();
        stream.finish(&mut piece);
        writeln!(stdout, "{piece}")?;
        eprintln!(
            "[{} prompt tokens, prefill {:.1} ms; {} tokens, {:.1} tok/s decode]",
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
