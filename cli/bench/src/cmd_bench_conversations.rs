//! `rag-bench conversations`: follow-up questions. Each conversation of the set has two user
//! turns; the second cannot be answered without the first ("How long does it take?").
//! The first turn is asked as `rag ask` does; the second is answered with the model's first
//! answer in the history, by several ways of choosing the search query, against the plain
//! single-question path (the second question alone, as `rag ask` would get it):
//!
//! - `single`: `ask(second)`: no history at all;
//! - `last`: the history in the prompt, the search on the second question only;
//! - `joined`: the history in the prompt, the search on the first and second questions
//!   ([`rag::prompt::search_query`], what `Assistant::chat` and `rag serve` use);
//! - `rewrite`: the model first rewrites the second question into a standalone one (one
//!   more generation), which is then asked alone. With the one-instruction prompt used
//!   here, Qwen2.5-Coder 0.5B and 1.5B mostly answer the question instead of rewriting it
//!   (`--verbose` shows the rewrites), which is what this strategy costs on small models.
//!
//! A turn's sources are right when one of the expected files is among the cited sources;
//! its answer is correct when every expected fact appears (as in `rag-bench answers`).

use crate::scratch_index::{open_assistant, ScratchDir};
use crate::{bench_report, data_files};
use anyhow::{Context, Result};
use graphs::chat::ChatMessage;
use rag::assistant::{Answer, AskOptions};
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Folder the conversations are about (default: the repository's sample corpus,
    /// relative to the current directory).
    #[arg(long, default_value = "examples/sample-corpus")]
    pub corpus: PathBuf,
    /// Conversations, JSONL (default: the repository's set, relative to the current
    /// directory).
    #[arg(long, default_value = "bench/conversations/two_turn.jsonl")]
    pub conversations: PathBuf,
    /// Model name or GGUF path.
    #[arg(long, default_value = rag::models::DEFAULT_MODEL)]
    pub model: String,
    #[arg(long, default_value_t = 96)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print every second-turn answer.
    #[arg(long)]
    pub verbose: bool,
    #[command(flatten)]
    pub report: bench_report::ReportArgs,
}

#[derive(serde::Deserialize)]
struct Conversation {
    id: String,
    /// The user's two questions.
    turns: [String; 2],
    /// Files (relative to the corpus) any of which answers the second question.
    sources: Vec<String>,
    /// Facts of the second answer; each a list of accepted spellings.
    expect: Vec<Vec<String>>,
}

const STRATEGIES: [&str; 4] = ["single", "last", "joined", "rewrite"];

const REWRITE_INSTRUCTION: &str = "Rewrite the user's last question so that it can be \
understood without the conversation: replace words like it, they, that and its with what \
they refer to. Reply with the rewritten question only.";

#[derive(Default, Clone)]
struct Tally {
    sources_right: usize,
    /// The first cited source (the best hit) is an expected file.
    top_right: usize,
    correct: usize,
    failed: Vec<String>,
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: content.into(),
    }
}

fn is_correct(answer: &str, expect: &[Vec<String>]) -> bool {
    let a = answer.to_lowercase();
    expect
        .iter()
        .all(|alts| alts.iter().any(|s| a.contains(&s.to_lowercase())))
}

pub fn run(a: Args) -> Result<()> {
    data_files::require(&a.corpus, "--corpus")?;
    data_files::require(&a.conversations, "--conversations")?;
    let text = std::fs::read_to_string(&a.conversations)
        .with_context(|| format!("reading {}", a.conversations.display()))?;
    let conversations: Vec<Conversation> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{}:{}", a.conversations.display(), i + 1))
        })
        .collect::<Result<_>>()?;
    let load_start = crate::cmd_bench_retrieval::load_average();
    let index_dir = ScratchDir::new("rag-bench-conv-")?;
    let result = run_in(&a, &conversations, &index_dir);
    let tallies = result?;

    let mut table = format!(
        "Follow-up questions on the sample corpus: {} two-turn conversations \
         (`{}`) whose second question needs the first; model `{}`, greedy, `rag ask`'s \
         retrieval (hybrid, 4 sources). The first turn is asked as `rag ask` does and its \
         answer kept in the history. `single`: the second question alone (the plain \
         single-question path); `last`: history in the prompt, search on the second question; \
         `joined`: history in the prompt, search on both questions (`rag serve`'s chat); \
         `rewrite`: the model rewrites the second question into a standalone one, which is \
         asked alone. Sources right: an expected file is cited; correct: every expected fact \
         is in the answer; top source right: source [1] is an expected file.\n\n| strategy | sources right | top source right | correct | failed (correct) |\n|---|---|---|---|---|\n",
        conversations.len(),
        a.conversations.display(),
        a.model
    );
    for (name, t) in STRATEGIES.iter().zip(&tallies) {
        writeln!(
            table,
            "| {name} | {}/{} | {}/{} | {}/{} | {} |",
            t.sources_right,
            conversations.len(),
            t.top_right,
            conversations.len(),
            t.correct,
            conversations.len(),
            t.failed.join(", ")
        )?;
    }
    let load = |l: Option<f64>| l.map_or("?".to_owned(), |v| format!("{v:.1}"));
    writeln!(
        table,
        "\nLoad average (1 min) at start / end: {} / {} (the counts do not depend on it: greedy decoding).",
        load(load_start),
        load(crate::cmd_bench_retrieval::load_average())
    )?;
    print!("{table}");
    if let Some(path) = &a.report.file {
        bench_report::write_section_in(
            path,
            &format!("conversations-{}", a.model),
            &format!("Follow-up questions ({})", a.model),
            &table,
        )?;
    }
    Ok(())
}

fn run_in(a: &Args, conversations: &[Conversation], index_dir: &ScratchDir) -> Result<Vec<Tally>> {
    let assistant = open_assistant(index_dir, &a.model, a.threads, Some(&a.corpus))?;
    let ask = AskOptions {
        max_tokens: a.max_tokens,
        ..AskOptions::default()
    };
    let corpus = std::fs::canonicalize(&a.corpus).unwrap_or_else(|_| a.corpus.clone());
    let expected = |path: &str, c: &Conversation| {
        c.sources
            .iter()
            .any(|want| std::path::Path::new(path) == corpus.join(want))
    };
    let sources_right =
        |answer: &Answer, c: &Conversation| answer.sources.iter().any(|s| expected(&s.path, c));
    let top_right = |answer: &Answer, c: &Conversation| {
        answer.sources.first().is_some_and(|s| expected(&s.path, c))
    };
    let mut tallies = vec![Tally::default(); STRATEGIES.len()];
    for c in conversations {
        let [first, second] = &c.turns;
        let answer1 = assistant.chat(&[msg("user", first)], true, &ask, &mut |_| true)?;
        let history = [
            msg("user", first),
            msg("assistant", &answer1.answer),
            msg("user", second),
        ];
        for (si, name) in STRATEGIES.iter().enumerate() {
            let (answer, note) = match *name {
                "single" => (assistant.ask(second, &ask, &mut |_| true)?, String::new()),
                "last" => (
                    assistant.chat_with_query(&history, Some(second), &ask, &mut |_| true)?,
                    String::new(),
                ),
                "joined" => (
                    assistant.chat(&history, true, &ask, &mut |_| true)?,
                    String::new(),
                ),
                _ => {
                    let mut asked = history.to_vec();
                    asked.insert(0, msg("system", REWRITE_INSTRUCTION));
                    let rewrite = AskOptions {
                        max_tokens: 48,
                        ..ask.clone()
                    };
                    let standalone = assistant.chat(&asked, false, &rewrite, &mut |_| true)?;
                    let q = standalone.answer.lines().next().unwrap_or("").trim();
                    let q = if q.is_empty() { second.as_str() } else { q };
                    (
                        assistant.ask(q, &ask, &mut |_| true)?,
                        format!(" (rewritten: {q})"),
                    )
                }
            };
            let right = sources_right(&answer, c);
            let ok = is_correct(&answer.answer, &c.expect);
            let t = &mut tallies[si];
            t.sources_right += usize::from(right);
            t.top_right += usize::from(top_right(&answer, c));
            t.correct += usize::from(ok);
            if !ok {
                t.failed.push(c.id.clone());
            }
            if a.verbose {
                eprintln!(
                    "[{name}] {} {} {}{note}: {}",
                    if right { "src" } else { "---" },
                    if ok { "OK " } else { "BAD" },
                    c.id,
                    answer.answer.replace('\n', " ")
                );
            }
        }
    }
    Ok(tallies)
}
