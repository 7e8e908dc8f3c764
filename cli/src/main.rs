//! `rag`: a thin command-line shell over the library crates. Each subcommand lives in its
//! own module and owns its argument struct; this file only dispatches. The benchmarks are
//! a separate binary, `rag-bench` (cli/bench).

mod assistant_args;
mod cmd_ask;
mod cmd_chat;
mod cmd_generate;
mod cmd_index;
mod cmd_model;
mod cmd_rm;
mod cmd_search;
mod cmd_serve;
mod cmd_status;
mod ctrl_c;
mod sample_args;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rag",
    version,
    about = "Private answers from your own documents, on your own device",
    after_help = rag_cli::exit::HELP
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Index folders of documents (incremental); alone, re-sync the folders indexed before.
    Index(cmd_index::Args),
    /// What the index holds: folders, files, chunks, models, size, last update.
    Status(cmd_status::Args),
    /// Remove files or folders from the index.
    Rm(cmd_rm::Args),
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
    /// Fetch, list and remove models.
    #[command(subcommand)]
    Model(cmd_model::ModelCmd),
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
        Cmd::Status(a) => cmd_status::run(a),
        Cmd::Rm(a) => cmd_rm::run(a),
        Cmd::Search(a) => cmd_search::run(a),
        Cmd::Ask(a) => cmd_ask::run(a),
        Cmd::Chat(a) => cmd_chat::run(a),
        Cmd::Generate(a) => cmd_generate::run(a),
        Cmd::Serve(a) => cmd_serve::run(a),
        Cmd::Model(c) => cmd_model::run(c),
    };
    if let Err(e) = result {
        let code = rag_cli::exit::code_of(&e);
        if code == rag_cli::exit::CANCELLED {
            eprintln!("(cancelled)");
        } else {
            eprintln!("error: {e:#}");
        }
        std::process::exit(code);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every argument of every command says what it does in `--help`.
    #[test]
    fn every_argument_has_help() {
        fn visit(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id != "help" && id != "version" && arg.get_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                visit(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        visit(&Cli::command(), "rag", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
    }
}
