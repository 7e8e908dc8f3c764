//! `rag`: a thin command-line shell over the library crates. Each subcommand lives in its
//! own module and owns its argument struct; this file only dispatches.

mod backend_args;
mod bench_report;
mod cmd_ask;
mod cmd_bench_answers;
mod cmd_bench_conversations;
mod cmd_bench_model;
mod cmd_bench_peer;
mod cmd_bench_prefill;
mod cmd_bench_retrieval;
mod cmd_bench_specdec;
mod cmd_chat;
mod cmd_generate;
mod cmd_index;
mod cmd_model;
mod cmd_search;
mod cmd_serve;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rag",
    version,
    about = "Private answers from your own documents, on your own device"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Index folders of documents (incremental).
    Index(cmd_index::Args),
    /// Show the ranked passages for a query.
    Search(cmd_search::Args),
    /// Answer a question from the index with a local LLM, citing sources.
    Ask(cmd_ask::Args),
    /// A conversation over the index: follow-up questions, /sources, /reset.
    Chat(cmd_chat::Args),
    /// Generate text from a prompt (no retrieval).
    Generate(cmd_generate::Args),
    /// Serve an OpenAI-compatible HTTP API (chat with retrieval, embeddings, search).
    Serve(cmd_serve::Args),
    /// Fetch and list models.
    #[command(subcommand)]
    Model(cmd_model::ModelCmd),
    /// Benchmarks (results also go to BENCHMARKS.md).
    #[command(subcommand)]
    Bench(BenchCmd),
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Prefill/decode throughput and the verify-cost curve of a model.
    Model(cmd_bench_model::Args),
    /// Our CPU engine and llama.cpp side by side on the same GGUF (ratios, floors).
    #[command(name = "vs-llamacpp")]
    VsLlamacpp(cmd_bench_peer::Args),
    /// Speculative decoding modes on Spec-Bench / DroidTask prompts.
    Specdec(cmd_bench_specdec::Args),
    /// Prefill graph-switch schedules (sync, async, progressive, optimal).
    Prefill(cmd_bench_prefill::Args),
    /// Retrieval quality (recall@k, MRR) and latency.
    Retrieval(cmd_bench_retrieval::Args),
    /// End-to-end answer quality per model on the sample corpus.
    Answers(cmd_bench_answers::Args),
    /// Follow-up questions: search-query strategies on two-turn conversations.
    Conversations(cmd_bench_conversations::Args),
}

fn main() {
    // Parse workers (killable parser isolation) re-run this binary and stop here.
    corpus_tools::worker::init_or_serve();
    // lopdf logs WARN for common, harmless PDF quirks; a failing PDF is reported by us.
    let filter = tracing_subscriber::EnvFilter::try_from_env("RAG_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,lopdf=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Index(a) => cmd_index::run(a),
        Cmd::Search(a) => cmd_search::run(a),
        Cmd::Ask(a) => cmd_ask::run(a),
        Cmd::Chat(a) => cmd_chat::run(a),
        Cmd::Generate(a) => cmd_generate::run(a),
        Cmd::Serve(a) => cmd_serve::run(a),
        Cmd::Model(c) => cmd_model::run(c),
        Cmd::Bench(BenchCmd::Model(a)) => cmd_bench_model::run(a),
        Cmd::Bench(BenchCmd::VsLlamacpp(a)) => cmd_bench_peer::run(a),
        Cmd::Bench(BenchCmd::Specdec(a)) => cmd_bench_specdec::run(a),
        Cmd::Bench(BenchCmd::Prefill(a)) => cmd_bench_prefill::run(a),
        Cmd::Bench(BenchCmd::Retrieval(a)) => cmd_bench_retrieval::run(a),
        Cmd::Bench(BenchCmd::Answers(a)) => cmd_bench_answers::run(a),
        Cmd::Bench(BenchCmd::Conversations(a)) => cmd_bench_conversations::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// `--kv-cache` (clap has already limited it to f32 / f16).
fn kv_precision(s: &str) -> anyhow::Result<npu_runtime::session::KvPrecision> {
    npu_runtime::session::KvPrecision::parse(s)
        .ok_or_else(|| anyhow::anyhow!("--kv-cache {s}: expected f32 or f16"))
}
