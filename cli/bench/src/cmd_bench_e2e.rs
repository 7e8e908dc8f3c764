//! `rag-bench e2e`: what a user waits for, side by side with llama.cpp. For every question
//! of the answer sets, the prompt `rag ask` builds (same retrieval, sources and chat
//! template) is answered by our engine through [`Assistant::ask`] with its defaults
//! (speculative decoding on) and by llama.cpp through llama-cpp-python
//! (`scripts/peers/llamacpp_e2e.py`, a worker process) from the same prompt token ids,
//! greedy, with the same token limit and thread count. The engines take turns on each
//! question (ours first on even questions, llama.cpp first on odd ones), so load on this
//! shared machine falls on both alike.
//!
//! Times are from the prompt's token ids to the first and to the last answer token: for
//! ours that is `ask` minus its retrieval (reported on its own), for llama.cpp the worker's
//! `Llama.generate`. Each engine keeps the previous prompt's common prefix in its KV cache
//! (ours its prompt-prefix reuse, llama-cpp-python its prefix match). Peak RSS is each
//! process's high-water mark: ours includes the embedder and the index.

use crate::scratch_index::{open_assistant, open_assistant_with, ScratchDir};
use crate::{bench_report, data_files};
use anyhow::{bail, Context, Result};
use rag::assistant::{AskOptions, Assistant};
use serde::Serialize;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// A model name from `rag model list` or a .gguf path (fetched on first use).
    #[arg(long, default_value = rag::models::DEFAULT_MODEL)]
    pub model: String,
    /// Python interpreter of a virtualenv with llama-cpp-python installed.
    #[arg(long)]
    pub python: PathBuf,
    /// Folder the questions are about.
    #[arg(long, default_value = "examples/sample-corpus")]
    pub corpus: PathBuf,
    /// Question sets, JSONL with `id` and `question` (comma-separated; relative to the
    /// current directory).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bench/answers/questions.jsonl"
    )]
    pub questions: Vec<PathBuf>,
    /// Answer token limit of both engines (`rag ask`'s default).
    #[arg(long, default_value_t = rag::assistant::DEFAULT_MAX_TOKENS)]
    pub max_tokens: usize,
    /// Compute threads of both engines.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Asked of both engines before the measured questions and not counted (first-use
    /// costs: page faults, our verify-cost curve when not cached yet).
    #[arg(long, default_value = "What does this documentation cover?")]
    pub warmup_question: String,
    /// The llama.cpp worker script (default: `scripts/peers/llamacpp_e2e.py`).
    #[arg(long)]
    pub peer_script: Option<PathBuf>,
    /// A/B: also answer every question with a second instance of our engine whose
    /// drafter calibrates only the last W prompt positions (`AssistantOptions::calib_window`;
    /// 0 = no calibration), asked right after ours; reported beside ours. Its model is loaded
    /// in this process too, so our peak RSS then counts both.
    #[arg(long, value_name = "W")]
    pub ab_calib_window: Option<usize>,
    /// Print every answer pair.
    #[arg(long)]
    pub verbose: bool,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub report: bench_report::ReportArgs,
}

#[derive(serde::Deserialize)]
struct Question {
    id: String,
    question: String,
}

/// One engine's answer to one prompt.
#[derive(Clone, Debug, Serialize)]
struct Run {
    ttft_ms: f64,
    answer_ms: f64,
    /// Answer tokens after the first, per second of the time after the first (0 with
    /// fewer than two tokens).
    decode_tok_s: f64,
    tokens: usize,
    /// Prompt tokens the engine had to prefill (the rest it kept from the previous prompt).
    prompt_prefilled: usize,
    #[serde(skip)]
    text: String,
}

#[derive(Debug, Serialize)]
struct QuestionResult {
    id: String,
    prompt_tokens: usize,
    retrieve_ms: f64,
    ours: Run,
    llamacpp: Run,
    identical: bool,
    /// `--ab-calib-window`'s answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    twin: Option<Run>,
}

/// Medians over the questions of one engine.
#[derive(Debug, Serialize)]
struct Summary {
    load_ms: f64,
    ttft_ms: f64,
    decode_tok_s: f64,
    answer_ms: f64,
    peak_rss_mb: f64,
}

pub fn run(a: Args) -> Result<()> {
    data_files::require(&a.corpus, "--corpus")?;
    if a.threads == 0 {
        bail!("--threads must be at least 1 (both engines get the same count)");
    }
    let questions = read_questions(&a.questions)?;
    if questions.is_empty() {
        bail!("the question sets hold no questions");
    }
    let script = match &a.peer_script {
        Some(p) => p.clone(),
        None => crate::cmd_bench_peer::peer_script("llamacpp_e2e.py")?,
    };
    let model_path = rag::models::ensure(&a.model)?;
    let load_avg_start = crate::cmd_bench_retrieval::load_average();

    let index_dir = ScratchDir::new("rag-bench-e2e-")?;
    let model_arg = model_path.display().to_string();
    let assistant = open_assistant(&index_dir, &model_arg, a.threads, Some(&a.corpus))?;
    let t = Instant::now();
    assistant.load_model()?;
    let our_load_ms = ms(t);
    // The A/B twin, with its own index directory (dropped after it).
    let twin = match a.ab_calib_window {
        Some(w) => {
            let dir = ScratchDir::new("rag-bench-e2e-twin-")?;
            let t = open_assistant_with(&dir, &model_arg, a.threads, Some(&a.corpus), |o| {
                o.calib_window = w
            })?;
            t.load_model()?;
            Some((t, dir))
        }
        None => None,
    };
    let mut peer = Peer::start(&a.python, &script, &model_path, a.threads)?;
    let ask = AskOptions {
        max_tokens: a.max_tokens,
        ..AskOptions::default()
    };

    eprintln!("warm-up: {:?}", a.warmup_question);
    let warm = assistant.build_prompt(&a.warmup_question, &ask)?;
    check_tokenization(&mut peer, &warm.tokens, &warm.text)?;
    ask_ours(&assistant, &a.warmup_question, &ask)?;
    if let Some((t, _)) = &twin {
        ask_ours(t, &a.warmup_question, &ask)?;
    }
    peer.generate(&warm.tokens, a.max_tokens)?;

    let mut results = Vec::new();
    for (i, q) in questions.iter().enumerate() {
        let built = assistant.build_prompt(&q.question, &ask)?;
        check_tokenization(&mut peer, &built.tokens, &built.text)
            .with_context(|| format!("question {}", q.id))?;
        let ask_twin = || -> Result<Option<Run>> {
            twin.as_ref()
                .map(|(t, _)| ask_ours(t, &q.question, &ask).map(|r| r.0))
                .transpose()
        };
        let ((ours, retrieve_ms, prompt_tokens), twin_run, theirs) = if i % 2 == 0 {
            let ours = ask_ours(&assistant, &q.question, &ask)?;
            let twin_run = ask_twin()?;
            (ours, twin_run, peer.generate(&built.tokens, a.max_tokens)?)
        } else {
            let theirs = peer.generate(&built.tokens, a.max_tokens)?;
            let twin_run = ask_twin()?;
            (ask_ours(&assistant, &q.question, &ask)?, twin_run, theirs)
        };
        if prompt_tokens != built.tokens.len() {
            bail!(
                "question {}: `ask` prompted {prompt_tokens} tokens, the built prompt has {}",
                q.id,
                built.tokens.len()
            );
        }
        let identical = ours.text.trim() == theirs.text.trim();
        eprintln!(
            "{} ({} prompt tokens): ours {:.0} ms / {:.0} ms, llama.cpp {:.0} ms / {:.0} ms{}",
            q.id,
            prompt_tokens,
            ours.ttft_ms,
            ours.answer_ms,
            theirs.ttft_ms,
            theirs.answer_ms,
            if identical { "" } else { ", answers differ" }
        );
        if a.verbose {
            eprintln!("  ours:      {}", ours.text.replace('\n', " "));
            eprintln!("  llama.cpp: {}", theirs.text.replace('\n', " "));
        }
        results.push(QuestionResult {
            id: q.id.clone(),
            prompt_tokens,
            retrieve_ms,
            ours,
            llamacpp: theirs,
            identical,
            twin: twin_run,
        });
    }
    let ours = summarize(
        results.iter().map(|r| &r.ours),
        our_load_ms,
        crate::cmd_bench_model::peak_rss_mb(),
    );
    let theirs = summarize(
        results.iter().map(|r| &r.llamacpp),
        peer.load_ms,
        peer.peak_rss_mb()?,
    );
    let twin = a.ab_calib_window.map(|w| twin_json(&results, w, &ours));
    let engine = std::mem::take(&mut peer.engine);
    drop(peer);
    let mut report = report_json(&file_name(&model_path), &a, &engine, ours, theirs, results);
    if let Some(t) = twin {
        report["ab_calib_window"] = t;
    }
    let table = table(&a, &report, load_avg_start)?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        // The report file's section carries the same stamp (`write_section_in`).
        println!(
            "Command: `{}`\nMachine: {}\nDate: {}\n",
            bench_report::command_line(),
            bench_report::machine(),
            bench_report::today()
        );
        print!("{table}");
    }
    if let Some(path) = &a.report.file {
        let key = format!("e2e-{}", file_stem(&model_path));
        let title = format!(
            "Whole answers against llama.cpp, {}",
            file_name(&model_path)
        );
        bench_report::write_section_in(path, &key, &title, &table)?;
    }
    Ok(())
}

/// The `--json` object: run facts, each engine's medians, the speed-ups (llama.cpp's median
/// over ours) and every question.
fn report_json(
    model: &str,
    a: &Args,
    engine: &str,
    ours: Summary,
    theirs: Summary,
    results: Vec<QuestionResult>,
) -> Value {
    json!({
        "model": model,
        "threads": a.threads,
        "max_tokens": a.max_tokens,
        "questions": results.len(),
        "identical_answers": results.iter().filter(|r| r.identical).count(),
        "retrieve_ms": median(results.iter().map(|r| r.retrieve_ms).collect()),
        "prompt_tokens": median(results.iter().map(|r| r.prompt_tokens as f64).collect()),
        "speedup": {
            "ttft": theirs.ttft_ms / ours.ttft_ms,
            "answer": theirs.answer_ms / ours.answer_ms,
        },
        "ours": ours,
        "llamacpp": theirs,
        "llamacpp_engine": engine,
        "per_question": results,
    })
}

/// The `--ab-calib-window` object: the twin's medians, how often it answered as ours did,
/// and its speed-ups over ours (above 1: the twin is faster).
fn twin_json(results: &[QuestionResult], window: usize, ours: &Summary) -> Value {
    let same = results
        .iter()
        .filter(|r| r.twin.as_ref().map(|t| t.text.trim()) == Some(r.ours.text.trim()))
        .count();
    let twins = results.iter().filter_map(|r| r.twin.as_ref());
    let s = summarize(twins, ours.load_ms, ours.peak_rss_mb);
    json!({
        "calib_window": window,
        "speedup_over_ours": {
            "ttft": ours.ttft_ms / s.ttft_ms,
            "answer": ours.answer_ms / s.answer_ms,
        },
        "same_answer_as_ours": same,
        "ours": s,
    })
}

/// Our answer to `question` through `ask`, timed from its prompt: (run, retrieval ms,
/// prompt tokens).
fn ask_ours(assistant: &Assistant, question: &str, ask: &AskOptions) -> Result<(Run, f64, usize)> {
    let t = Instant::now();
    let answer = assistant.ask(question, ask, &mut |_| true)?;
    let total = ms(t);
    let retrieve = answer.timings.retrieve_ms;
    let answer_ms = total - retrieve;
    let n = answer.tokens_generated;
    let ttft_ms = if n == 0 {
        answer_ms
    } else {
        answer.timings.first_token_ms - retrieve
    };
    let run = Run {
        ttft_ms,
        answer_ms,
        decode_tok_s: rate(n, answer_ms - ttft_ms),
        tokens: n,
        prompt_prefilled: answer
            .prompt_tokens
            .saturating_sub(answer.reused_prompt_tokens),
        text: answer.answer,
    };
    Ok((run, retrieve, answer.prompt_tokens))
}

/// Refuses to compare when llama.cpp would read the prompt text as other tokens than ours:
/// then the two engines would not answer the same prompt.
fn check_tokenization(peer: &mut Peer, ours: &[u32], text: &str) -> Result<()> {
    let theirs = peer.tokenize(text)?;
    if let Some((i, a, b)) = first_difference(ours, &theirs) {
        bail!(
            "the engines tokenize the prompt differently at token {i} of {}/{}: ours {}, \
             llama.cpp {}; the comparison would not be on the same prompt",
            ours.len(),
            theirs.len(),
            a.map_or("(end)".to_owned(), |t| t.to_string()),
            b.map_or("(end)".to_owned(), |t| t.to_string()),
        );
    }
    Ok(())
}

/// The first position where the two token lists differ (`None` past a list's end).
fn first_difference(a: &[u32], b: &[u32]) -> Option<(usize, Option<u32>, Option<u32>)> {
    (0..a.len().max(b.len()))
        .map(|i| (i, a.get(i).copied(), b.get(i).copied()))
        .find(|(_, x, y)| x != y)
}

/// Tokens after the first per second of `ms_after_first`.
fn rate(tokens: usize, ms_after_first: f64) -> f64 {
    if tokens < 2 || ms_after_first <= 0.0 {
        return 0.0;
    }
    (tokens - 1) as f64 / (ms_after_first / 1e3)
}

fn summarize<'a>(
    runs: impl Iterator<Item = &'a Run> + Clone,
    load_ms: f64,
    peak_rss_mb: f64,
) -> Summary {
    let col = |f: &dyn Fn(&Run) -> f64| median(runs.clone().map(f).collect());
    Summary {
        load_ms,
        ttft_ms: col(&|r| r.ttft_ms),
        // Answers of one token have no decode rate.
        decode_tok_s: median(
            runs.clone()
                .filter(|r| r.tokens >= 2)
                .map(|r| r.decode_tok_s)
                .collect(),
        ),
        answer_ms: col(&|r| r.answer_ms),
        peak_rss_mb,
    }
}

/// The median (the mean of the middle two for an even count); 0 for none.
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn read_questions(paths: &[PathBuf]) -> Result<Vec<Question>> {
    let mut out = Vec::new();
    for path in paths {
        data_files::require(path, "--questions")?;
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            out.push(
                serde_json::from_str(line)
                    .with_context(|| format!("{}:{}", path.display(), i + 1))?,
            );
        }
    }
    Ok(out)
}

fn table(a: &Args, r: &Value, load_avg_start: Option<f64>) -> Result<String> {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let (ours, theirs) = (&r["ours"], &r["llamacpp"]);
    let mut t = format!(
        "{}; {} threads each, {} questions from {} (median prompt {:.0} \
         tokens), answers of at most {} tokens. Ours: `rag ask`'s defaults (hybrid retrieval, \
         speculative decoding); {}: the same prompt token ids, greedy. Times run from the \
         prompt's token ids (our retrieval, median {:.1} ms, is not in them); the engines \
         take turns per question.\n\n",
        r["model"].as_str().unwrap_or("?"),
        a.threads,
        r["questions"],
        a.questions
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        f(r, "prompt_tokens"),
        a.max_tokens,
        r["llamacpp_engine"].as_str().unwrap_or("llama.cpp"),
        f(r, "retrieve_ms"),
    );
    t.push_str("| median | ours | llama.cpp | ours faster by |\n|---|---|---|---|\n");
    for (label, key, higher_better) in [
        ("model load ms", "load_ms", false),
        ("time to first token ms", "ttft_ms", false),
        ("decode tok/s", "decode_tok_s", true),
        ("whole answer ms", "answer_ms", false),
        ("peak RSS MB", "peak_rss_mb", false),
    ] {
        let (x, y) = (f(ours, key), f(theirs, key));
        let ratio = if higher_better { x / y } else { y / x };
        writeln!(t, "| {label} | {x:.1} | {y:.1} | {ratio:.2}x |")?;
    }
    writeln!(
        t,
        "\nIdentical answers: {} of {}.\n\n| question | prompt tokens | ours TTFT / answer ms | \
         llama.cpp TTFT / answer ms | tokens ours / llama.cpp | same text |\n|---|---|---|---|---|---|",
        r["identical_answers"], r["questions"]
    )?;
    for q in r["per_question"].as_array().into_iter().flatten() {
        let (o, l) = (&q["ours"], &q["llamacpp"]);
        writeln!(
            t,
            "| {} | {} | {:.0} / {:.0} | {:.0} / {:.0} | {} / {} | {} |",
            q["id"].as_str().unwrap_or("?"),
            q["prompt_tokens"],
            f(o, "ttft_ms"),
            f(o, "answer_ms"),
            f(l, "ttft_ms"),
            f(l, "answer_ms"),
            o["tokens"],
            l["tokens"],
            if q["identical"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
        )?;
    }
    let tw = &r["ab_calib_window"];
    if !tw.is_null() {
        let o = &tw["ours"];
        writeln!(
            t,
            "\nA/B (`--ab-calib-window {w}`): our engine with the drafter calibrating the last {w} \
             prompt positions (0: none), asked right after ours on every question: median TTFT \
             {:.1} ms, decode {:.1} tok/s, whole answer {:.1} ms; faster than ours (window {}) \
             by {:.3}x (TTFT) and {:.3}x (whole answer; below 1: slower); the same answer as \
             ours on {} of {}. Our peak RSS counts both models.",
            f(o, "ttft_ms"),
            f(o, "decode_tok_s"),
            f(o, "answer_ms"),
            rag::assistant::DEFAULT_CALIB_WINDOW,
            f(&tw["speedup_over_ours"], "ttft"),
            f(&tw["speedup_over_ours"], "answer"),
            tw["same_answer_as_ours"],
            r["questions"],
            w = tw["calib_window"],
        )?;
    }
    let load = |l: Option<f64>| l.map_or("?".to_owned(), |v| format!("{v:.1}"));
    writeln!(
        t,
        "\nLoad average (1 min) at start / end: {} / {}.",
        load(load_avg_start),
        load(crate::cmd_bench_retrieval::load_average())
    )?;
    Ok(t)
}

/// The llama.cpp worker process (`scripts/peers/llamacpp_e2e.py`).
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    load_ms: f64,
    engine: String,
}

impl Peer {
    fn start(python: &Path, script: &Path, model: &Path, threads: usize) -> Result<Self> {
        let mut child = Command::new(python)
            .arg(script)
            .arg("--model")
            .arg(model)
            .args(["--threads", &threads.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {} {}", python.display(), script.display()))?;
        let stdin = child.stdin.take().context("the worker's stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("the worker's stdout")?);
        let mut peer = Peer {
            child,
            stdin,
            stdout,
            load_ms: 0.0,
            engine: String::new(),
        };
        let ready = peer.read()?;
        if ready["ready"].as_bool() != Some(true) {
            bail!("the llama.cpp worker did not start: {ready}");
        }
        peer.load_ms = ready["load_ms"].as_f64().unwrap_or(0.0);
        peer.engine = ready["engine"].as_str().unwrap_or("llama.cpp").to_owned();
        Ok(peer)
    }

    fn read(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .context("reading from the llama.cpp worker")?;
        if n == 0 {
            bail!("the llama.cpp worker exited (its error is above)");
        }
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("the llama.cpp worker said {:?}", line.trim()))?;
        if let Some(e) = v.get("error") {
            bail!("the llama.cpp worker: {e}");
        }
        Ok(v)
    }

    fn request(&mut self, req: Value) -> Result<Value> {
        writeln!(self.stdin, "{req}").context("writing to the llama.cpp worker")?;
        self.stdin.flush()?;
        self.read()
    }

    fn tokenize(&mut self, text: &str) -> Result<Vec<u32>> {
        let v = self.request(json!({"op": "tokenize", "text": text}))?;
        serde_json::from_value(v["tokens"].clone()).context("the worker's tokens")
    }

    fn generate(&mut self, prompt: &[u32], max_tokens: usize) -> Result<Run> {
        let v =
            self.request(json!({"op": "generate", "tokens": prompt, "max_tokens": max_tokens}))?;
        let tokens = v["tokens"].as_array().map_or(0, Vec::len);
        let answer_ms = v["answer_ms"].as_f64().context("the worker's answer_ms")?;
        let ttft_ms = v["ttft_ms"].as_f64().unwrap_or(answer_ms);
        Ok(Run {
            ttft_ms,
            answer_ms,
            decode_tok_s: rate(tokens, answer_ms - ttft_ms),
            tokens,
            prompt_prefilled: v["prompt_evaluated"].as_u64().unwrap_or(0) as usize,
            text: v["text"].as_str().unwrap_or_default().to_owned(),
        })
    }

    fn peak_rss_mb(&mut self) -> Result<f64> {
        let v = self.request(json!({"op": "stats"}))?;
        Ok(v["peak_rss_mb"].as_f64().unwrap_or(0.0))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // Closing stdin ends the worker's loop; kill in case it is stuck.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}

fn file_stem(p: &Path) -> String {
    p.file_stem()
        .map_or_else(|| "model".to_owned(), |f| f.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ttft: f64, answer: f64, tokens: usize) -> Run {
        Run {
            ttft_ms: ttft,
            answer_ms: answer,
            decode_tok_s: rate(tokens, answer - ttft),
            tokens,
            prompt_prefilled: 100,
            text: String::new(),
        }
    }

    #[test]
    fn the_first_difference_is_found_at_either_end() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(
            first_difference(&[1, 2, 3], &[1, 5, 3]),
            Some((1, Some(2), Some(5)))
        );
        assert_eq!(
            first_difference(&[1, 2], &[1, 2, 3]),
            Some((2, None, Some(3)))
        );
        assert_eq!(
            first_difference(&[1, 2, 3], &[1, 2]),
            Some((2, Some(3), None))
        );
    }

    #[test]
    fn the_json_has_the_medians_and_speedups_a_reader_looks_for() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: Args,
        }
        let a = Cli::parse_from(["x", "--python", "python3"]).a;
        let results = vec![QuestionResult {
            id: "q1".into(),
            prompt_tokens: 500,
            retrieve_ms: 3.0,
            ours: run(100.0, 400.0, 7),
            llamacpp: run(300.0, 1000.0, 7),
            identical: true,
            twin: None,
        }];
        let ours = summarize(results.iter().map(|r| &r.ours), 50.0, 900.0);
        let theirs = summarize(results.iter().map(|r| &r.llamacpp), 80.0, 1200.0);
        let v = report_json("m.gguf", &a, "llama.cpp", ours, theirs, results);
        assert_eq!(v["questions"], 1);
        for engine in ["ours", "llamacpp"] {
            for key in [
                "load_ms",
                "ttft_ms",
                "decode_tok_s",
                "answer_ms",
                "peak_rss_mb",
            ] {
                assert!(v[engine][key].is_f64(), "{engine}.{key} in {v}");
            }
        }
        assert_eq!(v["speedup"]["ttft"], 3.0);
        assert_eq!(v["speedup"]["answer"], 2.5);
        assert_eq!(v["per_question"][0]["identical"], true);
        assert_eq!(v["identical_answers"], 1);
    }

    #[test]
    fn decode_rate_counts_the_tokens_after_the_first() {
        assert_eq!(rate(11, 500.0), 20.0);
        assert_eq!(rate(1, 500.0), 0.0);
        assert_eq!(rate(5, 0.0), 0.0);
    }

    #[test]
    fn medians_skip_one_token_answers_for_decode_rate() {
        let q = |ours: Run| QuestionResult {
            id: "q".into(),
            prompt_tokens: 100,
            retrieve_ms: 1.0,
            llamacpp: ours.clone(),
            ours,
            identical: true,
            twin: None,
        };
        let results = [
            q(run(100.0, 300.0, 11)), // 50 tok/s
            q(run(200.0, 200.0, 1)),  // no rate
            q(run(300.0, 500.0, 21)), // 100 tok/s
        ];
        let s = summarize(results.iter().map(|r| &r.ours), 5.0, 7.0);
        assert_eq!(s.ttft_ms, 200.0);
        assert_eq!(s.answer_ms, 300.0);
        assert_eq!(s.decode_tok_s, 75.0);
        assert_eq!((s.load_ms, s.peak_rss_mb), (5.0, 7.0));
        assert_eq!(median(vec![]), 0.0);
    }

    #[test]
    fn the_calibration_ab_reports_the_twin_beside_ours() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            a: Args,
        }
        let a = Cli::parse_from(["x", "--python", "python3", "--ab-calib-window", "0"]).a;
        assert_eq!(a.ab_calib_window, Some(0));
        let q = |ours: Run, twin: Run| QuestionResult {
            id: "q".into(),
            prompt_tokens: 100,
            retrieve_ms: 1.0,
            llamacpp: run(900.0, 2000.0, 11),
            ours,
            identical: true,
            twin: Some(twin),
        };
        let mut differs = run(180.0, 440.0, 11);
        differs.text = "another answer".into();
        let results = vec![
            q(run(200.0, 400.0, 11), run(100.0, 500.0, 11)),
            q(run(200.0, 400.0, 11), differs),
        ];
        let ours = summarize(results.iter().map(|r| &r.ours), 5.0, 7.0);
        let theirs = summarize(results.iter().map(|r| &r.llamacpp), 5.0, 7.0);
        let twin = twin_json(&results, 0, &ours);
        // Twin medians: TTFT (100 + 180) / 2, answer (500 + 440) / 2.
        assert_eq!(twin["ours"]["ttft_ms"], 140.0);
        assert_eq!(twin["ours"]["answer_ms"], 470.0);
        assert_eq!(twin["speedup_over_ours"]["ttft"], 200.0 / 140.0);
        assert_eq!(twin["speedup_over_ours"]["answer"], 400.0 / 470.0);
        assert_eq!(twin["same_answer_as_ours"], 1);
        let mut v = report_json("m.gguf", &a, "llama.cpp", ours, theirs, results);
        v["ab_calib_window"] = twin;
        let t = table(&a, &v, None).unwrap();
        assert!(
            t.contains("A/B (`--ab-calib-window 0`)") && t.contains("1.429x (TTFT) and 0.851x"),
            "{t}"
        );
        assert!(t.contains("the same answer as ours on 1 of 2"), "{t}");
    }
}
