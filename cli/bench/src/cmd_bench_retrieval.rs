//! `rag-bench retrieval`: quality (recall@1/5/10, MRR) of BM25, dense and hybrid on a
//! labelled question set, and `--scale N` for indexing throughput and query latency on a
//! synthetic corpus of about N chunks. Results go to stdout and the `--report` file.

use crate::{bench_report, data_files};
use anyhow::{Context, Result};
use rag::embed::WeightFormat;
use rag::hybrid::{fuse, Fusion};
use rag::index::{CANDIDATES, DEFAULT_FUSION};
use rag::{Embedder, Hit, Index, IndexOptions, IndexProgress, Phase, SearchMode};
use std::cell::Cell;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Corpus folders (the labels' paths are suffixes of indexed paths).
    #[arg(long, required = true)]
    pub corpus: Vec<PathBuf>,
    /// Labelled questions, JSONL (default: the repository's set, relative to the current
    /// directory).
    #[arg(long, default_value = "bench/retrieval/questions.jsonl")]
    pub questions: PathBuf,
    /// Reuse this index directory (default: a fresh temporary one, removed afterwards).
    /// With `--scale`, the synthetic corpus is kept beside it (`<DIR>.corpus`), so a second
    /// run re-indexes nothing and measures only the queries.
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// BM25 only.
    #[arg(long)]
    pub no_dense: bool,
    /// Embedding model: minilm-l6-v2 or multilingual-e5-small [default: the one a reused
    /// `--index-dir` was built with, else minilm-l6-v2]. Another than the default writes its
    /// own report section.
    #[arg(long, value_name = "NAME")]
    pub embedder: Option<String>,
    /// Synthetic corpus of about this many chunks: throughput and latency instead of quality.
    #[arg(long)]
    pub scale: Option<usize>,
    /// Queries per mode for latency percentiles.
    #[arg(long, default_value_t = 300)]
    pub latency_queries: usize,
    /// Chunk size in tokens. A non-default size writes its own section.
    #[arg(long, default_value_t = corpus_tools::chunk::DEFAULT_CHUNK_TOKENS)]
    pub chunk_tokens: usize,
    #[command(flatten)]
    pub report: bench_report::ReportArgs,
    #[arg(long)]
    pub json: bool,
    /// Also write each question's two candidate lists (chunk id, score, relevant) as JSONL,
    /// to study a fusion rule offline.
    #[arg(long)]
    pub dump_candidates: Option<PathBuf>,
}

#[derive(serde::Deserialize)]
struct Question {
    id: String,
    question: String,
    relevant: Vec<Label>,
}

#[derive(serde::Deserialize)]
struct Label {
    path: String,
    #[serde(default)]
    contains: String,
}

#[derive(serde::Serialize, Clone)]
struct ModeResult {
    mode: String,
    recall_at_1: f64,
    recall_at_5: f64,
    recall_at_10: f64,
    mrr: f64,
    misses_at_5: Vec<String>,
}

fn norm(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

fn is_relevant(hit: &Hit, labels: &[Label]) -> bool {
    let text = norm(&hit.text);
    labels.iter().any(|l| {
        let p = Path::new(&hit.path);
        p.ends_with(&l.path) && (l.contains.is_empty() || text.contains(&norm(&l.contains)))
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn modes(dense: bool) -> Vec<(SearchMode, &'static str)> {
    let mut m = vec![(SearchMode::Bm25, "bm25")];
    if dense {
        m.push((SearchMode::Dense, "dense"));
        m.push((SearchMode::Hybrid, "hybrid (default fusion)"));
    }
    m
}

struct TempIndex {
    dir: PathBuf,
    remove: bool,
}

impl Drop for TempIndex {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn index_dir(a: &Args, tag: &str) -> TempIndex {
    match &a.index_dir {
        Some(d) => TempIndex {
            dir: d.clone(),
            remove: false,
        },
        None => TempIndex {
            dir: std::env::temp_dir().join(format!("rag-bench-{tag}-{}", std::process::id())),
            remove: true,
        },
    }
}

/// Index with phase timings: (summary, parse+bm25 seconds, embed seconds).
fn timed_index(
    index: &Index,
    roots: &[PathBuf],
    chunk_tokens: usize,
) -> Result<(rag::IndexSummary, f64, f64)> {
    let t0 = Instant::now();
    let embed_start: Cell<Option<Instant>> = Cell::new(None);
    let embed_end: Cell<Option<Instant>> = Cell::new(None);
    // Long runs log embedding progress (every 1000 chunks) so a run stopped early still
    // tells how far it got and at what rate.
    let logged: Cell<u64> = Cell::new(0);
    let progress = |p: IndexProgress| match p.phase {
        Phase::Embed if embed_start.get().is_none() => embed_start.set(Some(Instant::now())),
        Phase::Embed if p.done >= logged.get() + 1000 => {
            logged.set(p.done);
            let s = embed_start.get().map_or(0.0, |t| t.elapsed().as_secs_f64());
            eprintln!(
                "embed {}/{} chunks in {s:.0} s ({:.1} chunks/s)",
                p.done,
                p.total,
                p.done as f64 / s.max(1e-9)
            );
        }
        Phase::Finish if embed_end.get().is_none() => embed_end.set(Some(Instant::now())),
        _ => {}
    };
    let mut opts = IndexOptions::default();
    opts.chunk.chunk_tokens = chunk_tokens;
    let s = index.add_paths(roots, &opts, &progress)?;
    let end = Instant::now();
    let es = embed_start.get();
    let parse = es.unwrap_or(end).duration_since(t0).as_secs_f64();
    let embed = match (es, embed_end.get()) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    Ok((s, parse, embed))
}

pub fn run(a: Args) -> Result<()> {
    for c in &a.corpus {
        data_files::require(c, "--corpus")?;
    }
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
    anyhow::ensure!(
        !questions.is_empty(),
        "no questions in {}",
        a.questions.display()
    );
    match a.scale {
        Some(n) => run_scale(&a, &questions, n),
        None => run_quality(&a, &questions),
    }
}

/// The embedder a run uses (none with `--no-dense`) and its model-cache name.
fn bench_embedder(a: &Args, index_dir: &Path) -> Result<(Option<Arc<dyn Embedder>>, String)> {
    let embedder = rag_cli::embedder::load_embedder(a.no_dense, index_dir, a.embedder.as_deref())?;
    let name = embedder
        .as_ref()
        .and_then(|e| e.name().map(str::to_owned))
        .unwrap_or_default();
    Ok((embedder, name))
}

fn run_quality(a: &Args, questions: &[Question]) -> Result<()> {
    let tmp = index_dir(a, "quality");
    let (embedder, embedder_name) = bench_embedder(a, &tmp.dir)?;
    let dense = embedder.is_some();
    let index = Index::open(&tmp.dir, embedder)?;
    let (summary, _, _) = timed_index(&index, &a.corpus, a.chunk_tokens)?;
    eprintln!(
        "{}",
        rag_cli::index_progress::summary_line(&summary, &tmp.dir)
    );
    let stats = index.stats();

    // Quality: candidates once per question, then every ranking method on the same lists.
    let mut methods: Vec<(String, Option<Fusion>)> = vec![("bm25".into(), None)];
    if dense {
        methods.push(("dense".into(), None));
        for f in FUSIONS {
            let tag = if f == DEFAULT_FUSION {
                " (default)"
            } else {
                ""
            };
            methods.push((format!("hybrid {}{tag}", f.name()), Some(f)));
        }
    }
    let mode = if dense {
        SearchMode::Hybrid
    } else {
        SearchMode::Bm25
    };
    let mut acc = vec![(0.0, 0.0, 0.0, 0.0, Vec::<String>::new()); methods.len()];
    let mut dump = String::new();
    for q in questions {
        let (bm25, dn) = index.candidates(&q.question, CANDIDATES, mode)?;
        if a.dump_candidates.is_some() {
            let label = |list: &[(i64, f32)]| -> Result<Vec<serde_json::Value>> {
                let mut out = Vec::with_capacity(list.len());
                for (id, score) in list {
                    let hit = index.hits(&fuse(&[(*id, *score)], &[], DEFAULT_FUSION), 1)?;
                    let rel = hit.first().is_some_and(|h| is_relevant(h, &q.relevant));
                    out.push(serde_json::json!([id, score, rel]));
                }
                Ok(out)
            };
            let line = serde_json::json!({
                "id": q.id, "question": q.question, "bm25": label(&bm25)?, "dense": label(&dn)?,
            });
            writeln!(dump, "{line}")?;
        }
        for (mi, (name, fusion)) in methods.iter().enumerate() {
            let fused = match (name.as_str(), fusion) {
                ("bm25", _) => fuse(&bm25, &[], DEFAULT_FUSION),
                ("dense", _) => fuse(&[], &dn, DEFAULT_FUSION),
                (_, Some(f)) => index.fuse(&q.question, &bm25, &dn, *f)?,
                _ => unreachable!(),
            };
            let hits = index.hits(&fused, 10)?;
            let rank = hits
                .iter()
                .position(|h| is_relevant(h, &q.relevant))
                .map(|p| p + 1);
            let m = &mut acc[mi];
            if let Some(r) = rank {
                m.0 += (r <= 1) as u32 as f64;
                m.1 += (r <= 5) as u32 as f64;
                m.2 += 1.0;
                m.3 += 1.0 / r as f64;
            }
            if rank.is_none_or(|r| r > 5) {
                m.4.push(q.id.clone());
            }
        }
    }
    if let Some(path) = &a.dump_candidates {
        std::fs::write(path, dump).with_context(|| format!("writing {}", path.display()))?;
    }
    let n = questions.len() as f64;
    let results: Vec<ModeResult> = methods
        .iter()
        .zip(acc)
        .map(|((name, _), m)| ModeResult {
            mode: name.clone(),
            recall_at_1: m.0 / n,
            recall_at_5: m.1 / n,
            recall_at_10: m.2 / n,
            mrr: m.3 / n,
            misses_at_5: m.4,
        })
        .collect();

    // Latency: the product path (`Index::search`), query embedding included.
    let mut latency = Vec::new();
    for (mode, name) in modes(dense) {
        let mut lat = Vec::new();
        for q in questions {
            let t = Instant::now();
            let _ = index.search(&q.question, 10, mode)?;
            lat.push(t.elapsed().as_secs_f64() * 1e3);
        }
        lat.sort_by(f64::total_cmp);
        latency.push((name, percentile(&lat, 0.5), percentile(&lat, 0.99)));
    }

    let mut body = String::new();
    let corpus: Vec<String> = a.corpus.iter().map(|c| c.display().to_string()).collect();
    writeln!(
        body,
        "Corpus: {} ({} files indexed, {} skipped, {} chunks of <={} tokens by {}, overlap 40). Questions: {} ({}), written for this corpus; a hit counts when its file matches the label and its text contains the labelled snippet. Candidates: top {CANDIDATES} of each list. Embedder: {}.\n",
        corpus.join(", "),
        stats.documents,
        stats.skipped_documents,
        stats.chunks,
        a.chunk_tokens,
        if dense { "the embedder's WordPiece tokenizer" } else { "the word-piece estimate" },
        questions.len(),
        a.questions.display(),
        if dense { embedder_label(&embedder_name) } else { "none (--no-dense)".into() }
    )?;
    writeln!(
        body,
        "| method | recall@1 | recall@5 | recall@10 | MRR@10 |"
    )?;
    writeln!(body, "|---|---|---|---|---|")?;
    for r in &results {
        writeln!(
            body,
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} |",
            r.mode, r.recall_at_1, r.recall_at_5, r.recall_at_10, r.mrr
        )?;
    }
    writeln!(
        body,
        "\n| mode (Index::search) | query p50 (ms) | query p99 (ms) | queries |"
    )?;
    writeln!(body, "|---|---|---|---|")?;
    for (name, p50, p99) in &latency {
        writeln!(
            body,
            "| {name} | {p50:.2} | {p99:.2} | {} |",
            questions.len()
        )?;
    }
    for r in &results {
        if !r.misses_at_5.is_empty() {
            writeln!(
                body,
                "\nMissed at 5 by {}: {}",
                r.mode,
                r.misses_at_5.join(", ")
            )?;
        }
    }
    if a.json {
        let j = serde_json::json!({
            "questions": a.questions.display().to_string(),
            "question_count": questions.len(),
            "corpus": corpus,
            "documents": stats.documents,
            "chunks": stats.chunks,
            "candidates_per_list": CANDIDATES,
            "embedder": if dense { embedder_label(&embedder_name) } else { "none".into() },
            "methods": results,
            "latency": latency.iter().map(|(n, p50, p99)| serde_json::json!({"mode": n, "p50_ms": p50, "p99_ms": p99})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!("{body}");
    }
    if let Some(path) = &a.report.file {
        let (key, title) = if rag_cli::embedder::embed_format()? == WeightFormat::Q8_0 {
            (
                "retrieval-quality-q8_0",
                "Retrieval quality, Q8_0 embedder (the default)",
            )
        } else {
            (
                "retrieval-quality",
                "Retrieval quality, f32 embedder (RAG_EMBED_FORMAT=f32)",
            )
        };
        let (mut key, mut title) = (key.to_string(), title.to_string());
        if dense && embedder_name != rag::models::DEFAULT_EMBEDDER {
            key = format!("{key}-{embedder_name}");
            title = format!("{title}, {embedder_name}");
        }
        if a.chunk_tokens != corpus_tools::chunk::DEFAULT_CHUNK_TOKENS {
            key = format!("{key}-c{}", a.chunk_tokens);
            title = format!("{title}, chunks of <= {} tokens", a.chunk_tokens);
        }
        // Another question set (e.g. the held-out one) gets its own section.
        let set = a.questions.file_stem().and_then(|s| s.to_str());
        if let Some(set) = set.filter(|s| *s != "questions") {
            key = format!("{key}-{set}");
            title = format!("{title}, question set {set}");
        }
        bench_report::write_section_in(path, &key, &title, &body)?;
    }
    Ok(())
}

/// How the reports name the embedder (`name` as [`rag::Embedder::name`] gives it).
fn embedder_label(name: &str) -> String {
    let model = match name {
        rag::embed::E5_EMBEDDER => "multilingual-e5-small (Q4_0 file)",
        _ => "all-MiniLM-L6-v2",
    };
    match rag_cli::embedder::embed_format() {
        Ok(WeightFormat::Q8_0) => format!("{model} on our runtime (Q8_0 weights, CPU)"),
        _ => format!("{model} on our runtime (f32, CPU)"),
    }
}

/// Fusions compared by the quality benchmark.
const FUSIONS: [Fusion; 7] = [
    Fusion::Adaptive(rag::hybrid::ADAPTIVE),
    Fusion::Rrf { k: 60.0 },
    Fusion::Rrf { k: 20.0 },
    Fusion::Rrf { k: 5.0 },
    Fusion::Convex { alpha: 0.3 },
    Fusion::Convex { alpha: 0.5 },
    Fusion::Convex { alpha: 0.7 },
];

/// Deterministic xorshift for the synthetic corpus.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Write files of random sentences over the corpus vocabulary: 10 sections per file, each
/// sized to become exactly one chunk, so the chunk count is known in advance.
fn synth_corpus(dir: &Path, vocab_from: &[PathBuf], chunks: usize) -> Result<usize> {
    let mut vocab: Vec<String> = Vec::new();
    let (files, _) = corpus_tools::walk::walk(vocab_from, &Default::default());
    for f in files.iter().take(2000) {
        if let Ok(t) = std::fs::read_to_string(f) {
            vocab.extend(
                t.split(|c: char| !c.is_alphanumeric())
                    .filter(|w| w.len() >= 3 && w.len() <= 12)
                    .map(|w| w.to_lowercase()),
            );
        }
    }
    vocab.sort();
    vocab.dedup();
    anyhow::ensure!(
        vocab.len() > 100,
        "too few words in the corpus to synthesize from"
    );
    std::fs::create_dir_all(dir)?;
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let files_needed = chunks.div_ceil(10);
    for f in 0..files_needed {
        let sub = dir.join(format!("d{:03}", f / 1000));
        std::fs::create_dir_all(&sub)?;
        let mut doc = String::new();
        for s in 0..10 {
            writeln!(doc, "## Section {f}-{s}\n")?;
            let mut tokens = 0;
            while tokens < 120 {
                let mut line = String::new();
                for _ in 0..12 {
                    let w = &vocab[(rng.next() % vocab.len() as u64) as usize];
                    line.push_str(w);
                    line.push(' ');
                }
                tokens += corpus_tools::tokens::estimate_tokens(&line);
                writeln!(doc, "{}.", line.trim_end())?;
            }
            doc.push('\n');
        }
        // A kept corpus (`--index-dir`) is rewritten only where it differs, so its
        // index sees no change.
        let path = sub.join(format!("doc{f:06}.md"));
        if std::fs::read(&path).ok().as_deref() != Some(doc.as_bytes()) {
            std::fs::write(path, doc)?;
        }
    }
    Ok(files_needed * 10)
}

/// The 1-minute load average (Linux), to tell a shared machine's figures from a quiet one's.
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn run_scale(a: &Args, questions: &[Question], n: usize) -> Result<()> {
    let load_start = load_average();
    let tmp = index_dir(a, &format!("scale{n}"));
    let (embedder, embedder_name) = bench_embedder(a, &tmp.dir)?;
    let dense = embedder.is_some();
    let corpus = match &a.index_dir {
        Some(d) => TempIndex {
            dir: d.with_extension("corpus"),
            remove: false,
        },
        None => TempIndex {
            dir: std::env::temp_dir().join(format!("rag-bench-synth{n}-{}", std::process::id())),
            remove: true,
        },
    };
    let corpus_dir = corpus.dir.clone();
    let planned = synth_corpus(&corpus_dir, &a.corpus, n)?;
    let index = Index::open(&tmp.dir, embedder)?;
    let (summary, parse_s, embed_s) =
        timed_index(&index, std::slice::from_ref(&corpus_dir), a.chunk_tokens)?;
    eprintln!(
        "{}",
        rag_cli::index_progress::summary_line(&summary, &tmp.dir)
    );
    let total_s = summary.elapsed.as_secs_f64();
    // Re-run with nothing changed: the incremental no-op cost.
    let (noop, _, _) = timed_index(&index, std::slice::from_ref(&corpus_dir), a.chunk_tokens)?;
    let mut lat_rows = Vec::new();
    for (mode, name) in modes(dense) {
        let mut lat = Vec::with_capacity(a.latency_queries);
        for i in 0..a.latency_queries {
            let q = &questions[i % questions.len()].question;
            let t = Instant::now();
            let _ = index.search(q, 10, mode)?;
            lat.push(t.elapsed().as_secs_f64() * 1e3);
        }
        lat.sort_by(f64::total_cmp);
        lat_rows.push((name, percentile(&lat, 0.5), percentile(&lat, 0.99)));
    }
    let load_end = load_average();
    let mut body = String::new();
    writeln!(
        body,
        "Synthetic corpus: {} files of random sentences over the vocabulary of {} ({} chunks planned, {} indexed), default chunking. Embedder: {}.\n",
        planned / 10,
        a.corpus.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", "),
        planned,
        summary.chunks_total,
        if dense { embedder_label(&embedder_name) } else { "none (--no-dense: BM25 only)".into() }
    )?;
    if summary.chunks_added == 0 {
        writeln!(
            body,
            "The index in {} was already built: the indexing columns are of a run that changed nothing.\n",
            tmp.dir.display()
        )?;
    }
    if let (Some(s), Some(e)) = (load_start, load_end) {
        writeln!(
            body,
            "Load average (1 min) at the start / end of the run: {s:.1} / {e:.1} on {n} hardware threads{}; the run's own threads account for up to {n} of the end value.\n",
            // The start value is the minute before the run; only it says whether
            // something else was busy.
            if s >= 1.0 { " (the minute before the run was busy)" } else { "" },
            n = std::thread::available_parallelism().map_or(1, |n| n.get()),
        )?;
    }
    writeln!(body, "| chunks | index total (s) | walk+parse+chunk+store+BM25 (s) | embed (s) | throughput (chunks/s, end to end) | no-op re-run (s) |")?;
    writeln!(body, "|---|---|---|---|---|---|")?;
    writeln!(
        body,
        "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |\n",
        summary.chunks_total,
        total_s,
        parse_s,
        embed_s,
        summary.chunks_added as f64 / total_s.max(1e-9),
        noop.elapsed.as_secs_f64()
    )?;
    writeln!(
        body,
        "| method | query p50 (ms) | query p99 (ms) | queries |"
    )?;
    writeln!(body, "|---|---|---|---|")?;
    for (name, p50, p99) in &lat_rows {
        writeln!(
            body,
            "| {name} | {p50:.2} | {p99:.2} | {} |",
            a.latency_queries
        )?;
    }
    if a.json {
        let j = serde_json::json!({
            "chunks": summary.chunks_total, "index_s": total_s, "parse_s": parse_s, "embed_s": embed_s,
            "noop_s": noop.elapsed.as_secs_f64(),
            "latency": lat_rows.iter().map(|(n, p50, p99)| serde_json::json!({"mode": n, "p50_ms": p50, "p99_ms": p99})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!("{body}");
    }
    if let Some(path) = &a.report.file {
        let q8 = dense && rag_cli::embedder::embed_format()? == WeightFormat::Q8_0;
        let other = dense && embedder_name != rag::models::DEFAULT_EMBEDDER;
        let key = format!(
            "retrieval-scale-{n}{}{}",
            if !dense {
                "-bm25"
            } else if q8 {
                "-q8_0"
            } else {
                ""
            },
            if other {
                format!("-{embedder_name}")
            } else {
                String::new()
            }
        );
        let title = format!(
            "Retrieval at scale: {n} chunks{}",
            if !dense {
                " (BM25 only)"
            } else if q8 {
                " (Q8_0 embedder)"
            } else {
                ""
            }
        );
        let title = if other {
            format!("{title}, {embedder_name}")
        } else {
            title
        };
        bench_report::write_section_in(path, &key, &title, &body)?;
    }
    let _ = Duration::ZERO;
    Ok(())
}
