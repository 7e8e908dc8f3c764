//! `rag ask "QUESTION"`: retrieve, prompt, stream the answer, cite the sources.

use crate::assistant_args::AssistantArgs;
use anyhow::{Context, Result};
use rag::assistant::Assistant;
use rag::IndexOptions;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    pub question: String,
    /// Index (incrementally) these folders before answering.
    #[arg(long)]
    pub corpus: Vec<PathBuf>,
    /// Answer tokens at most.
    #[arg(long, default_value_t = rag::assistant::DEFAULT_MAX_TOKENS)]
    pub max_tokens: usize,
    /// Print one JSON object (answer, sources, timings) instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub assistant: AssistantArgs,
}

pub fn run(a: Args) -> Result<()> {
    let dense = a.assistant.dense();
    // The model load (the largest part of time to first token) overlaps the embedder load,
    // index opening and retrieval.
    let opts = a.assistant.options(dense)?;
    let index_dir = &a.assistant.index_dir;
    let assistant = Assistant::open(opts)?;
    if !a.corpus.is_empty() {
        let bar = rag_cli::index_progress::progress_bar();
        let on_progress = |p: rag::IndexProgress| rag_cli::index_progress::update_bar(&bar, &p);
        let summary = assistant.add_paths(&a.corpus, &IndexOptions::default(), &on_progress)?;
        bar.finish_and_clear();
        eprintln!(
            "{}",
            rag_cli::index_progress::summary_line(&summary, index_dir)
        );
    } else {
        anyhow::ensure!(
            index_dir.join("store.sqlite").is_file(),
            "no index at {}: run `rag index DIR` first (or pass --corpus DIR)",
            index_dir.display()
        );
    }
    let ask = a.assistant.ask_options(dense, a.max_tokens);
    let stdout = std::io::stdout();
    let json = a.json;
    let mut on_text = |piece: &str| {
        if json {
            return true;
        }
        let mut out = stdout.lock();
        // A closed pipe (e.g. `| head`) just stops the answer.
        out.write_all(piece.as_bytes())
            .and_then(|_| out.flush())
            .is_ok()
    };
    let answer = assistant
        .ask(&a.question, &ask, &mut on_text)
        .context("answering")?;
    // A first run repacked the model: let the cache write finish so the next run maps it.
    assistant.finish_background_work(|what| eprintln!("({what})"));
    if json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(());
    }
    let mut out = stdout.lock();
    writeln!(out)?;
    if !answer.sources.is_empty() {
        writeln!(out, "\nSources:")?;
        for s in &answer.sources {
            writeln!(out, "[{}] {}", s.number, s.location())?;
        }
    }
    eprintln!(
        "({} tokens on {}, retrieve {:.0} ms, prefill {:.0} ms, first token {:.0} ms, decode {:.1} tok/s, {} mean accepted {:.2})",
        answer.tokens_generated,
        a.assistant.backend.backend,
        answer.timings.retrieve_ms,
        answer.timings.prefill_ms,
        answer.timings.first_token_ms,
        answer.timings.decode_tok_s,
        answer.speculation.mode,
        answer.speculation.mean_accepted
    );
    Ok(())
}
