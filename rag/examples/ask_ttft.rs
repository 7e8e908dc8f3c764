//! Time to first token of one `rag ask`-style question in a fresh process, split into its
//! phases, with the model loaded lazily (after retrieval) or preloaded (overlapping the
//! embedder load, index opening and retrieval, as `rag ask` does).
//!
//!     cargo run --release -p rag --example ask_ttft -- INDEX_DIR "QUESTION" [--preload]
//!         [--model M] [--max-tokens N] [--no-weights-cache] [--no-prompt-head-cache]
//!
//! Prints one JSON line: wall milliseconds from the start of `main` to the end of
//! `Assistant::open` (embedder load, index open), to the first answer text (`ttft_ms`), the
//! answer's own timings (retrieval, prefill), and the process CPU time (all threads) at
//! those two points, which on a shared machine says more than wall time.

use anyhow::{Context, Result};
use npu_runtime::weights_cache::WeightsCache;
use rag::assistant::{AskOptions, Assistant, AssistantOptions};
use std::time::Instant;

/// User + system CPU time of this process (all threads) in milliseconds, from
/// /proc/self/stat (fields 14 and 15, in clock ticks of 1/100 s on Linux).
fn cpu_ms() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces; fields after it follow its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks * 10.0)
}

fn main() -> Result<()> {
    let t0 = Instant::now();
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let mut args = std::env::args().skip(1);
    let index_dir = args
        .next()
        .context("usage: ask_ttft INDEX_DIR QUESTION [--preload]")?;
    let question = args
        .next()
        .context("usage: ask_ttft INDEX_DIR QUESTION [--preload]")?;
    let mut opts = AssistantOptions::new(&index_dir);
    let mut max_tokens = 8;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--preload" => opts.preload_model = true,
            "--no-weights-cache" => opts.weights_cache = WeightsCache::Off,
            "--no-prompt-head-cache" => opts.prompt_head_cache = false,
            "--model" => opts.model = args.next().context("--model M")?,
            "--max-tokens" => max_tokens = args.next().context("--max-tokens N")?.parse()?,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    anyhow::ensure!(
        std::path::Path::new(&index_dir)
            .join("store.sqlite")
            .is_file(),
        "no index at {index_dir}: run `rag index DIR --index-dir {index_dir}` first"
    );
    let preload = opts.preload_model;
    let opts_cache = opts.weights_cache.clone();
    let assistant = Assistant::open(opts)?;
    let open_ms = ms(t0);
    let open_cpu = cpu_ms();
    let mut first: Option<(f64, Option<f64>)> = None;
    let ask = AskOptions {
        max_tokens,
        ..AskOptions::default()
    };
    let answer = assistant.ask(&question, &ask, &mut |_| {
        if first.is_none() {
            first = Some((ms(t0), cpu_ms()));
        }
        true
    })?;
    let (ttft_ms, ttft_cpu) = first.context("the model produced no text")?;
    let cached = !matches!(opts_cache, WeightsCache::Off);
    assistant.finish_background_work(|_| {});
    println!(
        "{}",
        serde_json::json!({
            "preload": preload,
            "weights_cache": cached,
            "open_ms": open_ms,
            "open_cpu_ms": open_cpu,
            "retrieve_ms": answer.timings.retrieve_ms,
            "prefill_ms": answer.timings.prefill_ms,
            // From the start of `ask`: retrieval, waiting for or loading the model, prefill.
            "ask_first_token_ms": answer.timings.first_token_ms,
            "prompt_tokens": answer.prompt_tokens,
            "reused_prompt_tokens": answer.reused_prompt_tokens,
            "ttft_ms": ttft_ms,
            "ttft_cpu_ms": ttft_cpu,
        })
    );
    Ok(())
}
