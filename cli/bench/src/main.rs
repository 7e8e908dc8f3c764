//! `rag-bench`: the project's benchmarks, kept out of the user's `rag` binary (as llama.cpp
//! keeps `llama-bench` apart). Each benchmark lives in its own module and owns its argument
//! struct; this file only dispatches. Results print to stdout; `--report FILE` also writes
//! them as a section of a Markdown file.

mod bandwidth;
mod bench_report;
mod cmd_bench_answers;
mod cmd_bench_conversations;
mod cmd_bench_e2e;
mod cmd_bench_model;
mod cmd_bench_peer;
mod cmd_bench_prefill;
mod cmd_bench_retrieval;
mod cmd_bench_specdec;
mod data_files;
mod scratch_index;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rag-bench",
    version,
    about = "Benchmarks of the rag engine: speed, retrieval and answer quality"
)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCmd,
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
    /// Whole answers of `rag ask` against llama.cpp on the same prompts (TTFT, answer time).
    E2e(cmd_bench_e2e::Args),
    /// Follow-up questions: search-query strategies on two-turn conversations.
    Conversations(cmd_bench_conversations::Args),
}

fn main() {
    // Indexing benchmarks parse in worker processes that re-run this binary and stop here.
    corpus_tools::worker::init_or_serve();
    let filter = tracing_subscriber::EnvFilter::try_from_env("RAG_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,lopdf=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().cmd {
        BenchCmd::Model(a) => cmd_bench_model::run(a),
        BenchCmd::VsLlamacpp(a) => cmd_bench_peer::run(a),
        BenchCmd::Specdec(a) => cmd_bench_specdec::run(a),
        BenchCmd::Prefill(a) => cmd_bench_prefill::run(a),
        BenchCmd::Retrieval(a) => cmd_bench_retrieval::run(a),
        BenchCmd::Answers(a) => cmd_bench_answers::run(a),
        BenchCmd::E2e(a) => cmd_bench_e2e::run(a),
        BenchCmd::Conversations(a) => cmd_bench_conversations::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
