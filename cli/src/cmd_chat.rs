//! `rag chat`: a conversation over the index in the terminal. Each question is answered
//! with the conversation so far (follow-ups are searched with the previous question:
//! `Assistant::chat`); `/sources` lists the last answer's sources, `/reset` starts over,
//! Ctrl-C stops the answer being written (not the conversation), Ctrl-D or `/quit` ends.

use crate::assistant_args::AssistantArgs;
use crate::sample_args::SampleArgs;
use anyhow::Result;
use graphs::chat::ChatMessage;
use rag::assistant::{AskOptions, Assistant, CancelToken, Source};
use rag_cli::config::Config;
use rag_cli::exit;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::{Arc, Mutex};

/// Exchanges (question and answer) kept in the prompt: older ones are dropped so a long
/// conversation never outgrows the context.
const KEPT_EXCHANGES: usize = 4;

#[derive(clap::Args)]
pub struct Args {
    /// Answer without retrieval (a plain conversation with the model).
    #[arg(long)]
    pub no_retrieval: bool,
    /// Tokens per answer at most.
    #[arg(long, default_value_t = rag::assistant::DEFAULT_MAX_TOKENS)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub samples: SampleArgs,
    #[command(flatten)]
    pub assistant: AssistantArgs,
}

const HELP: &str = "Ask a question; follow-ups may refer to earlier ones.\n\
/sources  the sources of the last answer\n\
/reset    forget the conversation\n\
/quit     end (or Ctrl-D); Ctrl-C stops an answer";

pub fn run(a: Args) -> Result<()> {
    let retrieve = !a.no_retrieval;
    let settings = a.assistant.settings(&Config::load()?)?;
    if retrieve {
        exit::require_index(&settings.index_dir, "or pass --no-retrieval")?;
    }
    let dense = retrieve && a.assistant.dense();
    a.assistant.require_models(&settings, dense)?;
    let assistant = Assistant::open(a.assistant.options(&settings, dense)?)?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("rag chat ({}): /help for commands", settings.model);
    }
    let answering: Arc<Mutex<Option<CancelToken>>> = Arc::default();
    stop_answers_on_ctrl_c(Arc::clone(&answering))?;

    let mut history: Vec<ChatMessage> = Vec::new();
    let mut last_sources: Option<Vec<Source>> = None;
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut line = String::new();
    loop {
        if interactive {
            eprint!("> ");
        }
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let input = line.trim();
        match input {
            "" => continue,
            "/quit" | "/exit" => break,
            "/help" => {
                println!("{HELP}");
                continue;
            }
            "/reset" => {
                history.clear();
                last_sources = None;
                println!("(conversation cleared)");
                continue;
            }
            "/sources" => {
                match &last_sources {
                    None => println!("(no answer yet)"),
                    Some(s) if s.is_empty() => println!("(the last answer had no sources)"),
                    Some(sources) => {
                        for s in sources {
                            println!("[{}] {}", s.number, s.location());
                        }
                    }
                }
                continue;
            }
            cmd if cmd.starts_with('/') => {
                println!("unknown command {cmd}: /help lists them");
                continue;
            }
            _ => {}
        }
        let cancel = CancelToken::default();
        *answering.lock().unwrap_or_else(|e| e.into_inner()) = Some(cancel.clone());
        let mut ask = AskOptions {
            cancel: Some(cancel.clone()),
            ..a.assistant.ask_options(&settings, dense, a.max_tokens)
        };
        a.samples.apply(&mut ask);
        let mut messages = history.clone();
        messages.push(ChatMessage {
            role: "user".into(),
            content: input.to_owned(),
        });
        let mut on_text = |piece: &str| {
            let mut out = stdout.lock();
            out.write_all(piece.as_bytes())
                .and_then(|_| out.flush())
                .is_ok()
        };
        let result = assistant.chat(&messages, retrieve, &ask, &mut on_text);
        *answering.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let answer = match result {
            Ok(answer) => answer,
            Err(e) => {
                println!();
                eprintln!("error: {e:#}");
                continue;
            }
        };
        println!();
        if let Some(line) = SampleArgs::summary(&ask, &answer) {
            eprintln!("{line}");
        }
        if answer.cancelled {
            // The conversation goes on without the interrupted exchange.
            println!("(stopped)");
            continue;
        }
        messages.push(ChatMessage {
            role: "assistant".into(),
            content: answer.answer.clone(),
        });
        let drop = messages.len().saturating_sub(2 * KEPT_EXCHANGES);
        history = messages.split_off(drop);
        last_sources = Some(answer.sources);
    }
    assistant.finish_background_work(|what| eprintln!("({what})"));
    Ok(())
}

/// Ctrl-C cancels the answer being written; with none, it ends the program as usual.
fn stop_answers_on_ctrl_c(answering: Arc<Mutex<Option<CancelToken>>>) -> Result<()> {
    crate::ctrl_c::on_ctrl_c(move || {
        match answering.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(cancel) => cancel.cancel(),
            None => std::process::exit(exit::CANCELLED),
        }
    })
}
