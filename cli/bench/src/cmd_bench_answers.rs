//! `rag-bench answers`: end-to-end answer quality and latency of `rag ask` per model on a
//! question set with expected facts (how the default model is chosen).
//!
//! A question counts as answered when, for every expected fact, at least one of its
//! accepted spellings appears in the answer, and none of its forbidden strings does
//! (case-insensitive). Crude but honest: it checks the fact is there, not the prose around
//! it. Questions whose answer is not in the corpus expect one of a list of refusal phrases
//! ("not mentioned", "no information", ...) and may forbid strings a made-up answer would
//! contain (a currency sign for a price).

use crate::scratch_index::{open_assistant, ScratchDir};
use crate::{bench_report, data_files};
use anyhow::{Context, Result};
use rag::assistant::{AskOptions, Sampling};
use rag::select::Selector;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Folder the questions are about (default: the repository's sample corpus, relative
    /// to the current directory).
    #[arg(long, default_value = "examples/sample-corpus")]
    pub corpus: PathBuf,
    /// Questions, JSONL (default: the repository's set, relative to the current directory).
    #[arg(long, default_value = "bench/answers/questions.jsonl")]
    pub questions: PathBuf,
    /// Comma-separated model names or GGUF paths.
    #[arg(
        long,
        default_value = "smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b"
    )]
    pub models: String,
    #[arg(long, default_value_t = 96)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print every answer.
    #[arg(long)]
    pub verbose: bool,
    /// Sample this many answers per question in one batched decode and keep one
    /// (`--select`); 0 (the default) answers greedily, as `rag ask` does by default.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=16))]
    pub samples: u16,
    #[arg(long, default_value = "vote", value_parser = Selector::NAMES)]
    pub select: String,
    /// Temperature of the samples.
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub report: bench_report::ReportArgs,
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Deserialize)]
struct Question {
    id: String,
    question: String,
    /// Facts; each fact is a list of accepted spellings.
    expect: Vec<Vec<String>>,
    /// Strings that make the answer wrong wherever they appear.
    #[serde(default)]
    forbid: Vec<String>,
}

#[derive(serde::Serialize)]
struct ModelResult {
    model: String,
    correct: usize,
    questions: usize,
    ttft_ms_median: f64,
    decode_tok_s_median: f64,
    failed: Vec<String>,
}

fn is_correct(answer: &str, expect: &[Vec<String>], forbid: &[String]) -> bool {
    let a = answer.to_lowercase();
    expect
        .iter()
        .all(|alts| alts.iter().any(|s| a.contains(&s.to_lowercase())))
        && !forbid.iter().any(|s| a.contains(&s.to_lowercase()))
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(a: Args) -> Result<()> {
    data_files::require(&a.corpus, "--corpus")?;
    data_files::require(&a.questions, "--questions")?;
    let text = std::fs::read_to_string(&a.questions)
        .with_context(|| format!("reading {}", a.questions.display()))?;
    let questions: Vec<Question> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{}:{}", a.questions.display(), i + 1))
        })
        .collect::<Result<_>>()?;
    let load_start = crate::cmd_bench_retrieval::load_average();
    let index_dir = ScratchDir::new("rag-bench-answers-")?;
    let mut results = Vec::new();
    for (mi, model) in a
        .models
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .enumerate()
    {
        let corpus = (mi == 0).then_some(a.corpus.as_path());
        let assistant = open_assistant(&index_dir, model, a.threads, corpus)?;
        let mut ask = AskOptions {
            max_tokens: a.max_tokens,
            ..AskOptions::default()
        };
        if a.samples > 0 {
            ask.sampling = Sampling::new(a.temperature, 0.95, a.seed)?;
            ask.samples = a.samples.into();
            ask.select = Selector::parse(&a.select).unwrap_or_default();
        }
        let (mut correct, mut ttft, mut tok_s, mut failed) =
            (0, Vec::new(), Vec::new(), Vec::new());
        for q in &questions {
            let t = Instant::now();
            let answer = assistant.ask(&q.question, &ask, &mut |_| true)?;
            let ok = is_correct(&answer.answer, &q.expect, &q.forbid);
            if a.verbose {
                eprintln!(
                    "[{model}] {} {}: {}",
                    if ok { "OK " } else { "BAD" },
                    q.id,
                    answer.answer.replace('\n', " ")
                );
            }
            correct += usize::from(ok);
            if !ok {
                failed.push(q.id.clone());
            }
            ttft.push(
                answer
                    .timings
                    .first_token_ms
                    .min(t.elapsed().as_secs_f64() * 1e3),
            );
            tok_s.push(answer.timings.decode_tok_s);
        }
        results.push(ModelResult {
            model: model.to_owned(),
            correct,
            questions: questions.len(),
            ttft_ms_median: median(ttft),
            decode_tok_s_median: median(tok_s),
            failed,
        });
    }
    let decoding = if a.samples > 0 {
        format!(
            "{} samples at temperature {}, top-p 0.95, seed {}, kept by {}",
            a.samples, a.temperature, a.seed, a.select
        )
    } else {
        "greedy decoding".to_owned()
    };
    let mut table = format!(
        "Answer quality of `rag ask` on the bundled sample corpus (a question is correct when every expected fact appears in the answer, in one of its listed spellings, and no forbidden string does; questions not answerable from the corpus expect a refusal phrase; {decoding}, default prompt and retrieval). TTFT includes retrieval and prefill (and, with samples, every sample); the first question also includes model loading.\n\n| model | correct | median TTFT ms | median decode tok/s | failed |\n|---|---|---|---|---|\n",
    );
    for r in &results {
        writeln!(
            table,
            "| {} | {}/{} | {:.0} | {:.1} | {} |",
            r.model,
            r.correct,
            r.questions,
            r.ttft_ms_median,
            r.decode_tok_s_median,
            r.failed.join(", ")
        )?;
    }
    // The default model is chosen on what `rag ask` does by default.
    let choice = choose_default(&results).filter(|_| a.samples == 0);
    if let Some(best) = choice {
        let verdict = if best.model == rag::models::DEFAULT_MODEL {
            "which is `rag::models::DEFAULT_MODEL`".to_owned()
        } else {
            format!(
                "but `rag::models::DEFAULT_MODEL` is {}: update it",
                rag::models::DEFAULT_MODEL
            )
        };
        writeln!(
            table,
            "\nChoice rule: the most correct answers; among equals, the lowest median TTFT. Chosen: **{}** ({}/{}), {verdict}.",
            best.model, best.correct, best.questions
        )?;
        let tied: Vec<&str> = results
            .iter()
            .filter(|r| r.correct == best.correct)
            .map(|r| r.model.as_str())
            .collect();
        if tied.len() > 1 {
            writeln!(
                table,
                "{} tie at the top: this question set cannot tell them apart, so the choice among them rests on TTFT alone.",
                tied.join(" and ")
            )?;
        }
    }
    let load = |l: Option<f64>| l.map_or("?".to_owned(), |v| format!("{v:.1}"));
    writeln!(
        table,
        "\nLoad average (1 min) at start / end: {} / {} (TTFT and tok/s depend on it; the correct counts do not: greedy decoding).",
        load(load_start),
        load(crate::cmd_bench_retrieval::load_average())
    )?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        print!("{table}");
    }
    if let Some(path) = &a.report.file {
        let (id, title) = if a.samples > 0 {
            (
                "answers-samples",
                "Answer quality on the sample corpus, sampled answers",
            )
        } else {
            (
                "answers",
                "Answer quality on the sample corpus (default model choice)",
            )
        };
        bench_report::write_section_in(path, id, title, &table)?;
    }
    Ok(())
}

/// The default model: the most correct answers, then the lowest median TTFT.
fn choose_default(results: &[ModelResult]) -> Option<&ModelResult> {
    results.iter().min_by(|a, b| {
        b.correct
            .cmp(&a.correct)
            .then(a.ttft_ms_median.total_cmp(&b.ttft_ms_median))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(model: &str, correct: usize, ttft: f64) -> ModelResult {
        ModelResult {
            model: model.into(),
            correct,
            questions: 12,
            ttft_ms_median: ttft,
            decode_tok_s_median: 0.0,
            failed: Vec::new(),
        }
    }

    #[test]
    fn default_is_most_correct_then_fastest() {
        let r = [
            result("a", 4, 100.0),
            result("b", 12, 900.0),
            result("c", 12, 800.0),
        ];
        assert_eq!(choose_default(&r).unwrap().model, "c");
        let r = [result("a", 11, 100.0), result("b", 12, 900.0)];
        assert_eq!(choose_default(&r).unwrap().model, "b");
        assert!(choose_default(&[]).is_none());
    }

    #[test]
    fn every_fact_needs_one_spelling() {
        let expect = vec![
            vec!["3 years".to_owned(), "three years".to_owned()],
            vec!["PAIR".to_owned()],
        ];
        assert!(is_correct("Hold pair for Three Years", &expect, &[]));
        assert!(!is_correct("three years", &expect, &[]));
        assert!(!is_correct("pair", &expect, &[]));
        let decline = vec![vec!["not mentioned".to_owned()]];
        let forbid = vec!["$".to_owned()];
        assert!(is_correct("The price is not mentioned.", &decline, &forbid));
        assert!(!is_correct(
            "It costs $99 (not mentioned in the manual).",
            &decline,
            &forbid
        ));
    }
}
