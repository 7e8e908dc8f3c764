//! `rag ask "QUESTION"`: retrieve, prompt, stream the answer, cite the sources. The
//! question may come on stdin (`rag ask -`, or a pipe and no question); Ctrl-C stops the
//! answer and exits with the cancelled code.

use crate::assistant_args::AssistantArgs;
use crate::sample_args::SampleArgs;
use anyhow::{Context, Result};
use rag::assistant::{Assistant, CancelToken};
use rag::IndexOptions;
use rag_cli::config::Config;
use rag_cli::exit;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The question; `-` (or none, with stdin a pipe) reads it from stdin.
    pub question: Option<String>,
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
    pub samples: SampleArgs,
    #[command(flatten)]
    pub assistant: AssistantArgs,
}

/// The question: the argument, or stdin for `-` or a piped stdin without one.
fn question(arg: Option<String>) -> Result<String> {
    let stdin = std::io::stdin();
    let from_stdin = match arg.as_deref() {
        Some("-") => true,
        Some(_) => false,
        None if stdin.is_terminal() => {
            return Err(exit::usage(
                "no question: give one (`rag ask \"QUESTION\"`), or pipe it on stdin",
            ))
        }
        None => true,
    };
    if !from_stdin {
        return Ok(arg.unwrap_or_default());
    }
    let mut text = String::new();
    stdin
        .lock()
        .read_to_string(&mut text)
        .context("reading the question from stdin")?;
    let text = text.trim();
    if text.is_empty() {
        return Err(exit::usage("no question: stdin was empty"));
    }
    Ok(text.to_owned())
}

pub fn run(a: Args) -> Result<()> {
    let question = question(a.question)?;
    let settings = a.assistant.settings(&Config::load()?)?;
    let index_dir = &settings.index_dir;
    if a.corpus.is_empty() {
        exit::require_index(index_dir, "or pass --corpus DIR")?;
    }
    let dense = a.assistant.dense();
    a.assistant.require_models(&settings, dense)?;
    // The model load (the largest part of time to first token) overlaps the embedder load,
    // index opening and retrieval.
    let opts = a.assistant.options(&settings, dense)?;
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
    }
    let cancel = CancelToken::default();
    cancel_on_ctrl_c(cancel.clone())?;
    let mut ask = a.assistant.ask_options(&settings, dense, a.max_tokens);
    ask.cancel = Some(cancel);
    a.samples.apply(&mut ask);
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
        .ask(&question, &ask, &mut on_text)
        .context("answering")?;
    if answer.cancelled {
        if !json {
            println!();
        }
        return Err(exit::cancelled());
    }
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
    if let Some(line) = SampleArgs::summary(&ask, &answer) {
        eprintln!("{line}");
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

/// The first Ctrl-C stops the answer at its next token; a second one (e.g. during the
/// model load, before any token) ends the process at once.
fn cancel_on_ctrl_c(cancel: CancelToken) -> Result<()> {
    crate::ctrl_c::on_ctrl_c(move || {
        if cancel.is_cancelled() {
            std::process::exit(exit::CANCELLED);
        }
        cancel.cancel();
    })
}
