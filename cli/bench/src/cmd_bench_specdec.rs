//! `rag-bench specdec`: speculative decoding modes on Spec-Bench / DroidTask prompts.
//!
//! Every mode decodes the same prompts on one session, greedily or (`--temperature`)
//! sampled with one seed; plain decoding (one decode step per token) is the reference
//! for output (any difference is a losslessness bug, counted as a mismatch) and `none`
//! for speed. The verify-cost curve comes from the cache
//! (`specdec::curve_cache`: same model file, threads, machine and engine build) or is
//! profiled once on the first prompt, and is shared by all modes.

use crate::bench_report;
use anyhow::{bail, Context, Result};
use npu_runtime::session::{LoadOptions, Model, SessionOptions};
use rag::engine::Engine;
use serde_json::json;
use specdec::budget::{CostCurve, DEFAULT_SIZES};
use specdec::curve_cache::{self, CurveSource};
use specdec::gap::{gap_parts, GapParts};
use specdec::oracle::{longest_true_continuations, oracle_schedule, OracleSchedule, OracleSources};
use specdec::{GenConfig, Generator, Metrics, Mode, Sampling, TokenDb};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// Model file or manifest name.
    #[arg(long)]
    model: String,
    /// KV cache precision (f32 exact; f16 half the memory and attention bytes).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16"])]
    kv_cache: String,
    /// Spec-Bench style JSONL (default, relative to the current directory:
    /// ../shared/data/spec_bench/question.jsonl, or ../shared/data/ui/droidtask_ui.jsonl
    /// for --category ui).
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// summarization | rag | qa | translation | ui | ...
    #[arg(long, default_value = "summarization")]
    category: String,
    #[arg(long, default_value_t = 10)]
    limit: usize,
    /// Comma-separated: none,pld,sam,sam+cal,sam+ext,sdnpu
    #[arg(long, default_value = "none,pld,sam,sdnpu")]
    modes: String,
    /// Ablation like the paper's Table 3: none, sam, sam+cal, sam+ext, sdnpu.
    #[arg(long)]
    ablation: bool,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Compute threads (0 = all cores).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Prompts already chat-formatted and tokenized, JSONL {question_id, tokens}
    /// (specdec/bench/llamacpp_lookup.py --tokens-out writes them, so llama.cpp and
    /// we decode exactly the same token ids).
    #[arg(long)]
    prompt_tokens: Option<PathBuf>,
    /// Token database to draft from (read, never written; default: start empty).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Do not add each finished answer to the in-memory token database (the
    /// assistant keeps past answers as a draft source; by default the benchmark does too).
    #[arg(long)]
    no_conversation_db: bool,
    /// Verify-cost curve file (JSON): read if present, else profiled and written.
    /// Without it the curve is cached per model, threads, machine and engine build in
    /// the profile directory (`RAG_PROFILE_DIR`, else `~/.cache/rag/profiles`).
    #[arg(long)]
    cost_curve: Option<PathBuf>,
    /// Profile the verify-cost curve even when a valid cached one exists (and replace it).
    #[arg(long)]
    reprofile: bool,
    /// Largest verify batch (graph shapes and the cost profile).
    #[arg(long, default_value_t = 64)]
    max_verify: usize,
    /// Largest batch the budget controller may choose (default: the library's, 16).
    #[arg(long)]
    max_budget: Option<usize>,
    /// Verify this many tree rows every step instead of the cost-curve budget.
    #[arg(long)]
    fixed_budget: Option<usize>,
    /// Rank draft nodes by the drafters' heuristic priors only (ablation of the
    /// online-learned node acceptance).
    #[arg(long)]
    heuristic_ranking: bool,
    /// Always verify the tree of every source (ablation of the per-step choice
    /// between it and the raw-text-only base arm).
    #[arg(long)]
    single_arm: bool,
    /// Choose budgets on the cost curve as profiled (or given), not on the verify
    /// times measured while generating (ablation of live cost tracking).
    #[arg(long)]
    fixed_costs: bool,
    /// Also run every drafting mode with `--fixed-costs`, taking turns with it on each
    /// prompt (reported as `<mode>-fixed`): the live costs' A/B in one run.
    #[arg(long)]
    ab_fixed_costs: bool,
    /// Calibrate only the last N prompt positions (default: all); the prompt
    /// head is prefilled without top-k rows.
    #[arg(long)]
    calib_window: Option<usize>,
    /// Output of specdec/bench/llamacpp_lookup.py on the same prompts (same
    /// --prompt-tokens), run just before: adds llama.cpp's speeds and the ratio of
    /// every mode to llama.cpp's lookup decoding.
    #[arg(long)]
    llamacpp_json: Option<PathBuf>,
    /// Print each prompt's reference (`none`) output text to stderr.
    #[arg(long)]
    show_output: bool,
    /// A new generator for every prompt, as every `rag ask` process starts: no
    /// acceptance learned on earlier prompts (the token database still grows).
    #[arg(long)]
    fresh_generator: bool,
    /// With `--fresh-generator`: each new generator starts from what the previous one
    /// learned (budget calibration, node acceptance), as `rag ask` processes do through
    /// the file they keep beside the cost curve.
    #[arg(long, requires = "fresh_generator")]
    carry_learned: bool,
    /// Skip the plain greedy reference run (one decode step per token, no tree
    /// verification) that every mode's output is compared with, token for token.
    #[arg(long)]
    no_greedy_reference: bool,
    /// Sample at this temperature (0: greedy). Every mode then draws with the same
    /// seed, and the reference is plain sampled decoding (one decode step per token).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus of the sampling, in (0, 1].
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    backend: rag_cli::backend_args::BackendArgs,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    report: bench_report::ReportArgs,
}

fn default_dataset(category: &str) -> PathBuf {
    let rel = if category == "ui" {
        "../shared/data/ui/droidtask_ui.jsonl"
    } else {
        "../shared/data/spec_bench/question.jsonl"
    };
    PathBuf::from(rel)
}

/// (question_id, first turn) of the category's first `limit` records.
fn load_questions(path: &Path, category: &str, limit: usize) -> Result<Vec<(i64, String)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading dataset {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        if v["category"].as_str() != Some(category) {
            continue;
        }
        let id = v["question_id"].as_i64().unwrap_or(i as i64);
        let turn = v["turns"][0]
            .as_str()
            .with_context(|| format!("{}:{}: no turns[0]", path.display(), i + 1))?;
        out.push((id, turn.to_owned()));
        if out.len() == limit {
            break;
        }
    }
    if out.is_empty() {
        bail!("no records of category '{category}' in {}", path.display());
    }
    Ok(out)
}

/// Pre-tokenized prompts for the selected question ids, in dataset order.
fn load_prompt_tokens(path: &Path, ids: &[i64], vocab: usize) -> Result<Vec<Vec<u32>>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading prompt tokens {}", path.display()))?;
    let mut map = std::collections::HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let id = v["question_id"].as_i64().context("question_id missing")?;
        let toks = v["tokens"]
            .as_array()
            .context("tokens missing")?
            .iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| (t as usize) < vocab)
                    .map(|t| t as u32)
                    .with_context(|| format!("{}:{}: bad token id {t}", path.display(), i + 1))
            })
            .collect::<Result<Vec<u32>>>()?;
        map.insert(id, toks);
    }
    ids.iter()
        .map(|id| {
            map.remove(id)
                .with_context(|| format!("question {id} missing from {}", path.display()))
        })
        .collect()
}

/// Each question as a one-message chat, formatted with the model's template.
fn chat_prompts(model: &Path, questions: &[(i64, String)]) -> Result<Vec<Vec<u32>>> {
    let f = graphs::gguf::GgufFile::open(model)
        .map_err(|e| anyhow::anyhow!("{}: {e}", model.display()))?;
    let tok = graphs::tokenizer::Tokenizer::from_gguf(&f)
        .map_err(|e| anyhow::anyhow!("{}: tokenizer: {e}", model.display()))?;
    let tmpl = graphs::chat::ChatTemplate::from_gguf(&f);
    questions
        .iter()
        .map(|(id, text)| {
            tmpl.encode_chat(&tok, &[graphs::chat::ChatMessage::new("user", text)], true)
                .map_err(|e| anyhow::anyhow!("question {id}: chat template: {e}"))
        })
        .collect()
}

/// The oracle's schedule summed over the prompts: each greedy output copied from its
/// prompt and (with `earlier_answers`, as the conversation database holds them) the
/// outputs of the prompts before it.
fn oracle_bound(
    prompts: &[Vec<u32>],
    outputs: &[Vec<u32>],
    earlier_answers: bool,
    curve: &CostCurve,
    max_rows: usize,
) -> OracleSchedule {
    let mut total = OracleSchedule::default();
    for (i, out) in outputs.iter().enumerate() {
        let mut fixed: Vec<&[u32]> = vec![&prompts[i]];
        if earlier_answers {
            fixed.extend(outputs[..i].iter().map(Vec::as_slice));
        }
        let src = OracleSources {
            fixed,
            min_context: 1,
        };
        let cont = longest_true_continuations(out, &src, max_rows);
        total.add(&oracle_schedule(&cont, out.len(), curve, max_rows));
    }
    total
}

struct ModeResult {
    mode: Mode,
    /// The mode's name, `-fixed` added for the `--ab-fixed-costs` twin.
    label: String,
    metrics: Metrics,
    outputs: Vec<Vec<u32>>,
    /// Accepted per estimated draft token at each candidate budget (controller state).
    ratios: Vec<(usize, f64)>,
    /// Verify cost per candidate budget the controller ended on (ms).
    live_costs: Vec<(usize, f64)>,
}

pub fn run(args: Args) -> Result<()> {
    let sampling = Sampling::new(args.temperature, args.top_p, args.seed)
        .map_err(|e| anyhow::anyhow!("--temperature/--top-p: {e}"))?;
    let reference_name = if sampling.is_greedy() {
        "greedy".to_string()
    } else {
        format!(
            "sampled (temperature {}, top-p {}, seed {})",
            sampling.temperature, sampling.top_p, sampling.seed
        )
    };
    let modes: Vec<Mode> = if args.ablation {
        vec![
            Mode::None,
            Mode::Sam,
            Mode::SamCal,
            Mode::SamExt,
            Mode::Sdnpu,
        ]
    } else {
        let mut m = args
            .modes
            .split(',')
            .map(Mode::parse)
            .collect::<Result<Vec<_>, _>>()?;
        // `none` is the reference for speed-up: first, and always there unless the
        // plain greedy run is (then it may be left out, e.g. on a slow backend).
        let had_none = m.contains(&Mode::None);
        m.retain(|&x| x != Mode::None);
        if had_none || args.no_greedy_reference {
            m.insert(0, Mode::None);
        }
        m
    };
    // Each run: a mode, and whether it chooses on the profiled curve only.
    let mut variants: Vec<(Mode, bool)> = modes.iter().map(|&m| (m, args.fixed_costs)).collect();
    if args.ab_fixed_costs && !args.fixed_costs {
        variants.extend(
            modes
                .iter()
                .filter(|&&m| m != Mode::None)
                .map(|&m| (m, true)),
        );
    }
    let label = |(mode, fixed): (Mode, bool)| {
        if fixed && args.ab_fixed_costs {
            format!("{}-fixed", mode.name())
        } else {
            mode.name().to_owned()
        }
    };
    let dataset = args
        .dataset
        .clone()
        .unwrap_or_else(|| default_dataset(&args.category));
    crate::data_files::require(&dataset, "--dataset")?;
    let questions = load_questions(&dataset, &args.category, args.limit)?;
    let path = rag::models::ensure(&args.model)?;
    let model = Model::load(&path, &LoadOptions::with_threads(args.threads))?;
    let ids: Vec<i64> = questions.iter().map(|q| q.0).collect();
    let prompts = match &args.prompt_tokens {
        Some(p) => load_prompt_tokens(p, &ids, model.vocab_size())?,
        None => chat_prompts(&path, &questions)?,
    };
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let kv = (longest + args.max_tokens + args.max_verify + 8).min(model.config().ctx_len);
    let precision = rag_cli::kv_precision(&args.kv_cache)?;
    let backend = args.backend.choice()?;
    let budget = args.backend.npu_memory_mb;
    let mut session: Box<dyn Engine> = match &backend {
        rag::engine::BackendChoice::Cpu => Box::new(rag::engine::cpu_session(
            &model,
            SessionOptions {
                kv_capacity: kv,
                max_verify: args.max_verify,
                kv_precision: precision,
                ..SessionOptions::default()
            },
            budget,
        )?),
        // A static shape: rounded up so that runs on similar prompts share compiled graphs.
        qnn => rag::engine::open(&model, qnn, kv.div_ceil(128) * 128, precision, budget)?,
    };
    let backend_tag = session.profile_tag();
    let max_verify = session.max_verify();
    let base_db = match &args.db {
        Some(p) => Some(TokenDb::open(p, specdec::tokendb::DEFAULT_MAX_TOKENS)?),
        None => None,
    };

    // Verify-cost curve at the depth of the first prompt.
    let mut pre = specdec::PrefillOut::default();
    specdec::Target::prefill(&mut *session, &prompts[0], 0, &mut pre)?;
    let profile =
        |session: &mut dyn Engine| CostCurve::profile(session, pre.next, &DEFAULT_SIZES, 3);
    let (curve, source) = match &args.cost_curve {
        Some(p) if p.exists() && !args.reprofile => {
            (CostCurve::load(p)?, CurveSource::Cached(p.clone()))
        }
        Some(p) => {
            let c = profile(&mut *session)?;
            c.save(p)?;
            let why = if args.reprofile {
                "--reprofile"
            } else {
                "no file at --cost-curve"
            };
            (c, CurveSource::Profiled { why: why.into() })
        }
        None => {
            let key =
                curve_cache::CurveKey::current(&path, model.threads())?.on_backend(&backend_tag);
            let file = curve_cache::backend_cache_file(
                &npu_runtime::schedule::profile::cache_dir(),
                &path,
                model.threads(),
                &backend_tag,
            );
            curve_cache::get_or_profile(&file, &key, args.reprofile, || profile(&mut *session))?
        }
    };
    if !args.json {
        eprintln!("verify cost curve: {source}");
    }
    if !args.json {
        eprintln!(
            "verify cost (ms): {}",
            curve
                .sizes
                .iter()
                .zip(&curve.ms)
                .map(|(n, ms)| format!("{n}:{ms:.1}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }

    // Modes take turns on each prompt so that load changes on a shared machine
    // spread over all modes instead of biasing whichever ran last.
    let mut dbs: Vec<Option<TokenDb>> = variants
        .iter()
        .map(|_| {
            if args.no_conversation_db {
                base_db.clone()
            } else {
                Some(
                    base_db
                        .clone()
                        .unwrap_or_else(|| TokenDb::new(specdec::tokendb::DEFAULT_MAX_TOKENS)),
                )
            }
        })
        .collect();
    let make_gen = |(mode, fixed_costs): (Mode, bool), db: &Option<TokenDb>| {
        let cfg = GenConfig {
            cost_curve: Some(curve.clone()),
            max_budget: args
                .max_budget
                .unwrap_or(GenConfig::default().max_budget)
                .min(max_verify),
            fixed_budget: args.fixed_budget.filter(|_| mode != Mode::None),
            learned_ranking: !args.heuristic_ranking,
            arm_choice: !args.single_arm,
            calib_window: args.calib_window.unwrap_or(usize::MAX),
            fixed_costs,
            ..Default::default()
        };
        let sam = db
            .as_ref()
            .filter(|d| d.total_tokens() > 0)
            .map(|d| Arc::new(d.build_index()));
        Generator::new(mode, sam, cfg)
    };
    let mut gens: Vec<Generator> = variants
        .iter()
        .zip(&dbs)
        .map(|(&v, db)| make_gen(v, db))
        .collect();
    let mut results: Vec<ModeResult> = variants
        .iter()
        .map(|&v| ModeResult {
            mode: v.0,
            label: label(v),
            metrics: Metrics::default(),
            outputs: Vec::new(),
            ratios: Vec::new(),
            live_costs: Vec::new(),
        })
        .collect();
    let mut greedy = ModeResult {
        mode: Mode::None,
        label: Mode::None.name().to_owned(),
        metrics: Metrics::default(),
        outputs: Vec::new(),
        ratios: Vec::new(),
        live_costs: Vec::new(),
    };
    for (i, prompt) in prompts.iter().enumerate() {
        if !args.no_greedy_reference {
            session.truncate(0)?;
            let (out, st) = session
                .generate_plain(prompt, args.max_tokens, &sampling)
                .with_context(|| format!("{reference_name} reference, prompt {}", ids[i]))?;
            if !args.json {
                eprintln!(
                    "  {:8} q{:<5} {:3} tok  {:6.1} ms/tok  prefill {:5.0} ms",
                    if sampling.is_greedy() {
                        "greedy"
                    } else {
                        "sampled"
                    },
                    ids[i],
                    out.len(),
                    st.decode_ms / st.generated.saturating_sub(1).max(1) as f64,
                    st.prefill_ms
                );
            }
            let m = &mut greedy.metrics;
            m.runs += 1;
            m.prompt_tokens += st.prompt_tokens;
            m.tokens += out.len();
            m.steps += st.generated.saturating_sub(1);
            m.prefill_ms += st.prefill_ms;
            m.decode_ms += st.decode_ms;
            // Each decode step costs a one-row batch on the curve.
            let eog = st.stop == npu_runtime::session::StopReason::EndOfGeneration;
            let steps = st.generated.saturating_sub(1) + usize::from(eog);
            m.modeled_verify_ms += steps as f64 * curve.cost(1);
            greedy.outputs.push(out);
        }
        for (k, gen) in gens.iter_mut().enumerate() {
            if args.fresh_generator {
                let learned = args.carry_learned.then(|| gen.learned());
                *gen = make_gen(variants[k], &dbs[k]);
                if let Some(l) = learned {
                    gen.restore_learned(&l)
                        .map_err(|e| anyhow::anyhow!("restoring the learned state: {e}"))?;
                }
            }
            session.truncate(0)?;
            let (out, m) = gen
                .generate_sampled(
                    &mut *session,
                    prompt,
                    args.max_tokens,
                    &sampling,
                    &mut |_| {},
                    &|| false,
                )
                .with_context(|| format!("mode {} prompt {}", results[k].label, ids[i]))?;
            if let Some(d) = dbs[k].as_mut().filter(|_| !args.no_conversation_db) {
                // A finished answer joins the database, like the assistant's
                // conversation database (answers only).
                if !out.is_empty() {
                    d.add(&out);
                    gen.set_database(Some(Arc::new(d.build_index())));
                }
            }
            if !args.json {
                eprintln!(
                    "  {:8} q{:<5} {:3} tok  {:6.1} ms/tok  {:.2} tok/step  batch {:.1}  base arm {:3}/{:3} steps  acc base/cal/ext {}/{}/{}  prefill {:5.0} ms  (potential @4 {:.2}, @8 {:.2}, @16 {:.2}, @64 {:.2})",
                    results[k].label,
                    ids[i],
                    m.tokens,
                    m.ms_per_token(),
                    m.mean_accepted(),
                    m.mean_budget(),
                    m.base_arm_steps,
                    m.steps,
                    m.accepted_base,
                    m.accepted_calib_only,
                    m.accepted_ext_only,
                    m.prefill_ms,
                    m.potential_accepted(4),
                    m.potential_accepted(8),
                    m.potential_accepted(16),
                    m.potential_accepted(64)
                );
            }
            results[k].metrics.add(&m);
            results[k].outputs.push(out);
        }
    }
    if args.show_output {
        let f = graphs::gguf::GgufFile::open(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let tok = graphs::tokenizer::Tokenizer::from_gguf(&f)
            .map_err(|e| anyhow::anyhow!("{}: tokenizer: {e}", path.display()))?;
        let shown = if greedy.outputs.is_empty() {
            &results[0].outputs
        } else {
            &greedy.outputs
        };
        for (id, out) in ids.iter().zip(shown) {
            let text = tok.decode(out).unwrap_or_else(|e| format!("<{e}>"));
            eprintln!("--- q{id} output:\n{text}\n---");
        }
    }
    for (r, g) in results.iter_mut().zip(&gens) {
        r.ratios = g.calibration_ratios();
        r.live_costs = g.live_costs();
    }

    let llama = match &args.llamacpp_json {
        Some(p) => Some(read_llamacpp(p, prompts.len(), args.max_tokens)?),
        None => None,
    };
    // Speed-ups are over `none` (one-row tree verification) when it ran, else over plain
    // greedy steps; outputs are compared with plain greedy steps when they ran.
    let has_greedy = !greedy.outputs.is_empty();
    let base = results
        .iter()
        .find(|r| r.mode == Mode::None)
        .unwrap_or(&greedy);
    let base_ms = base.metrics.ms_per_token();
    let base_model_ms = base.metrics.modeled_ms_per_token();
    let reference = if has_greedy {
        greedy.outputs.clone()
    } else {
        results[0].outputs.clone()
    };
    // The retrieval oracle's bound on the greedy outputs (None when sampling or without
    // the plain reference).
    let max_rows = args
        .max_budget
        .unwrap_or(GenConfig::default().max_budget)
        .min(max_verify);
    let oracle = (has_greedy && sampling.is_greedy()).then(|| {
        oracle_bound(
            &prompts,
            &greedy.outputs,
            !args.no_conversation_db,
            &curve,
            max_rows,
        )
    });
    // Where each drafting mode's gap to the bound goes (`specdec::gap`): the same
    // greedy outputs, sources and curve, the drafter replayed at every position.
    let gaps: Vec<Option<GapParts>> = results
        .iter()
        .map(|r| {
            (oracle.is_some() && r.mode != Mode::None).then(|| {
                let mut model = specdec::accept_model::AcceptModel::default();
                let mut total = GapParts::default();
                for (i, out) in greedy.outputs.iter().enumerate() {
                    let earlier: Vec<&[u32]> = if args.no_conversation_db {
                        Vec::new()
                    } else {
                        greedy.outputs[..i].iter().map(Vec::as_slice).collect()
                    };
                    total.add(&gap_parts(
                        r.mode,
                        &prompts[i],
                        out,
                        &earlier,
                        &curve,
                        max_rows,
                        &mut model,
                    ));
                }
                total
            })
        })
        .collect();
    // A mode's measured speed-up over plain decoding (the oracle's reference).
    let over_plain = |m: &Metrics| {
        if has_greedy && m.ms_per_token() > 0.0 {
            greedy.metrics.ms_per_token() / m.ms_per_token()
        } else {
            f64::NAN
        }
    };
    // The same from the cost curve (steps' padded batches, plus drafting time for the
    // mode; plain decoding: one row per step), insensitive to load during the run.
    let modeled_over_plain = |m: &Metrics| {
        if has_greedy && m.modeled_ms_per_token() > 0.0 {
            greedy.metrics.modeled_ms_per_token() / m.modeled_ms_per_token()
        } else {
            f64::NAN
        }
    };
    // Verify time alone, as the oracle's schedules count it.
    let modeled_verify_over_plain = |m: &Metrics| {
        if has_greedy && m.modeled_verify_ms > 0.0 {
            greedy.metrics.modeled_verify_ms / m.modeled_verify_ms
        } else {
            f64::NAN
        }
    };
    let mut table = String::new();
    table.push_str(&format!(
        "Model `{}`, category `{}`, {} prompts, max {} tokens, {} threads. Verify cost (ms) by batch: {}; curve: {}.\n\n",
        path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        args.category,
        prompts.len(),
        args.max_tokens,
        model.threads(),
        curve
            .sizes
            .iter()
            .zip(&curve.ms)
            .map(|(n, ms)| format!("{n}:{ms:.1}"))
            .collect::<Vec<_>>()
            .join(" "),
        match &source {
            CurveSource::Cached(_) => "cached profile".to_string(),
            s => s.to_string(),
        }
    ));
    table.push_str(&format!(
        "Backend {backend_tag}. Mismatches = prompts whose output differs from {} (tokens that differ).\n\n",
        if has_greedy {
            format!("plain {reference_name} decoding (one decode step per token)")
        } else {
            "mode `none`".to_string()
        }
    ));
    if has_greedy {
        let m = &greedy.metrics;
        table.push_str(&format!(
            "Plain {reference_name} decoding: {:.2} tok/s, {:.1} ms/token, prefill {:.0} ms per prompt; \
             speed-ups below are over {}.\n\n",
            m.decode_tok_s(),
            m.ms_per_token(),
            m.prefill_ms / m.runs.max(1) as f64,
            if std::ptr::eq(base, &greedy) {
                format!("plain {reference_name} decoding")
            } else {
                "mode `none`".to_string()
            }
        ));
    }
    table.push_str("| mode | decode tok/s | ms/token | speedup | modeled speedup | mean accepted (kept) | mean batch | valid | wasted | underutil. | draft overhead | prefill ms | mismatches | potential @4 / @8 / @16 / @64 |\n");
    table.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut jmodes = serde_json::Map::new();
    for (r, gap) in results.iter().zip(&gaps) {
        let m = &r.metrics;
        let (v, w, u) = m.shares();
        let speedup = if m.ms_per_token() > 0.0 {
            base_ms / m.ms_per_token()
        } else {
            0.0
        };
        let modeled = if m.modeled_ms_per_token() > 0.0 {
            base_model_ms / m.modeled_ms_per_token()
        } else {
            0.0
        };
        let mismatches = r
            .outputs
            .iter()
            .zip(&reference)
            .filter(|(a, b)| a != b)
            .count();
        let mismatched_tokens: usize = r
            .outputs
            .iter()
            .zip(&reference)
            .map(|(a, b)| {
                let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
                a.len().max(b.len()) - same
            })
            .sum();
        let mismatch_cell = format!("{mismatches} ({mismatched_tokens})");
        table.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.2}x | {:.2}x | {:.2} ({:.2}) | {:.1} | {:.0}% | {:.0}% | {:.0}% | {:.1}% | {:.0} | {} | {:.2} / {:.2} / {:.2} / {:.2} |\n",
            r.label.as_str(),
            m.decode_tok_s(),
            m.ms_per_token(),
            speedup,
            modeled,
            m.mean_accepted(),
            m.mean_kept(),
            m.mean_budget(),
            100.0 * v,
            100.0 * w,
            100.0 * u,
            100.0 * m.overhead_share(),
            m.prefill_ms / m.runs.max(1) as f64,
            mismatch_cell,
            m.potential_accepted(4),
            m.potential_accepted(8),
            m.potential_accepted(16),
            m.potential_accepted(64)
        ));
        jmodes.insert(
            r.label.clone(),
            json!({
                "decode_tok_s": m.decode_tok_s(),
                "ms_per_token": m.ms_per_token(),
                "speedup": speedup,
                "modeled_speedup": modeled,
                "mean_accepted": m.mean_accepted(),
                "mean_kept": m.mean_kept(),
                "valid": v,
                "wasted": w,
                "underutilized": u,
                "mismatches": mismatches,
                "mismatched_tokens": mismatched_tokens,
                "mean_batch": m.mean_budget(),
                "draft_overhead": m.overhead_share(),
                "prefill_ms": m.prefill_ms / m.runs.max(1) as f64,
                "steps": m.steps,
                "base_arm_steps": m.base_arm_steps,
                "accepted_base": m.accepted_base,
                "accepted_calib_only": m.accepted_calib_only,
                "accepted_ext_only": m.accepted_ext_only,
                "steps_calib_in_tree": m.steps_calib_in_tree,
                "steps_calib_accepted": m.steps_calib_accepted,
                "steps_ext_in_tree": m.steps_ext_in_tree,
                "steps_ext_accepted": m.steps_ext_accepted,
                "tokens": m.tokens,
                "accepted_per_estimated": r.ratios.iter().map(|(n, q)| json!([n, q])).collect::<Vec<_>>(),
                "live_cost_ms": r.live_costs.iter().map(|(n, c)| json!([n, c])).collect::<Vec<_>>(),
                "potential_accepted_4": m.potential_accepted(4),
                "potential_accepted_8": m.potential_accepted(8),
                "potential_accepted_16": m.potential_accepted(16),
                "potential_accepted_64": m.potential_accepted(64),
                "speedup_over_plain": over_plain(m),
                "share_of_oracle": oracle.map(|o| over_plain(m) / o.speedup()),
                "modeled_share_of_oracle": oracle.map(|o| modeled_over_plain(m) / o.speedup()),
                "gap": gap.as_ref().map(|g| gap_json(g, modeled_verify_over_plain(m))),
            }),
        );
    }
    let sourced: Vec<String> = results
        .iter()
        .filter(|r| r.metrics.steps_calib_in_tree + r.metrics.steps_ext_in_tree > 0)
        .map(|r| {
            let m = &r.metrics;
            format!(
                "{}: of {} steps, {} verified a calibration-only node and {} accepted one \
                 ({} tokens); {} verified an extension-only node and {} accepted one ({} tokens)",
                r.label.as_str(),
                m.steps,
                m.steps_calib_in_tree,
                m.steps_calib_accepted,
                m.accepted_calib_only,
                m.steps_ext_in_tree,
                m.steps_ext_accepted,
                m.accepted_ext_only
            )
        })
        .collect();
    if !sourced.is_empty() {
        table.push_str(&format!(
            "\nNodes no raw-text source proposed: {}.\n",
            sourced.join("; ")
        ));
    }
    let live: Vec<String> = results
        .iter()
        .filter(|r| r.mode != Mode::None && !r.live_costs.is_empty())
        .map(|r| {
            let costs: Vec<String> = r
                .live_costs
                .iter()
                .map(|(n, ms)| format!("{n}:{ms:.1}"))
                .collect();
            format!("{} {}", r.label.as_str(), costs.join(" "))
        })
        .collect();
    if !live.is_empty() {
        table.push_str(&format!(
            "\nVerify cost (ms) the budget controller ended on ({}): {}.\n",
            if args.fixed_costs {
                "`--fixed-costs`: the curve"
            } else {
                "the median of each budget's latest measured times"
            },
            live.join("; ")
        ));
    }
    if let Some(o) = &oracle {
        table.push_str(&format!(
            "\nOracle bound (`specdec::oracle`): a drafter that knows the greedy output and \
             copies its longest true continuation from the prompt{} (at least one matching \
             token of context, chains of at most {max_rows} rows, the cheapest schedule on this \
             cost curve) would reach {:.2}x over plain decoding ({:.2} tokens per step). \
             Measured speed-up over plain decoding and its share of that bound: {}.\n",
            if args.no_conversation_db {
                ""
            } else {
                " and the earlier prompts' answers"
            },
            o.speedup(),
            o.tokens_per_step(),
            results
                .iter()
                .map(|r| {
                    let x = over_plain(&r.metrics);
                    let y = modeled_over_plain(&r.metrics);
                    format!(
                        "{} {x:.2}x ({:.0}%; modeled {y:.2}x, {:.0}%)",
                        r.label.as_str(),
                        100.0 * x / o.speedup(),
                        100.0 * y / o.speedup()
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for (r, g) in results.iter().zip(&gaps) {
            let Some(g) = g else { continue };
            table.push_str(&gap_line(
                r.label.as_str(),
                g,
                modeled_verify_over_plain(&r.metrics),
            ));
        }
    }
    if let Some(l) = &llama {
        table.push_str(&format!(
            "\n{} on the same prompt tokens: none {:.1} tok/s, prompt lookup {:.1} tok/s \
             ({:.2}x over its none, {} mismatches). Decode tok/s of each mode here / llama.cpp lookup: {}.\n",
            l.engine,
            l.none_tok_s,
            l.lookup_tok_s,
            l.lookup_tok_s / l.none_tok_s.max(1e-9),
            l.lookup_mismatches,
            results
                .iter()
                .map(|r| format!(
                    "{} {:.2}x",
                    r.label.as_str(),
                    r.metrics.decode_tok_s() / l.lookup_tok_s.max(1e-9)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for r in &results {
            if let Some(serde_json::Value::Object(o)) = jmodes.get_mut(r.label.as_str()) {
                o.insert(
                    "vs_llamacpp_lookup".into(),
                    json!(r.metrics.decode_tok_s() / l.lookup_tok_s.max(1e-9)),
                );
            }
        }
    }
    table.push_str(
        "\nmean accepted = tokens per verify step (accepted drafts + 1); (kept) = the same counting only \
         tokens delivered (a last step accepting past EOG or the token cap counts what is kept); valid/wasted/underutilized = \
         shares of verify rows used / rejected / left idle below the cost curve's saturation length; \
         draft overhead = drafting + tree building + budget bookkeeping as a share of decode time; \
         modeled speedup = the same ratio with each step's verify time taken from the cost curve \
         (cost of its padded batch) plus the measured drafting time, insensitive to load changes during the run; \
         potential @B = tokens per step had every step verified the best B rows of its draft tree \
         (measured against the actual output, independent of the cost curve).\n",
    );
    let model_name = path
        .file_stem()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    if args.json {
        let j = json!({
            "model": model_name,
            "category": args.category,
            "prompts": prompts.len(),
            "threads": model.threads(),
            "cost_curve_ms": curve.sizes.iter().zip(&curve.ms).map(|(n, ms)| json!([n, ms])).collect::<Vec<_>>(),
            "cost_curve_source": source.to_string(),
            "backend": backend_tag,
            "sampling": {
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "seed": sampling.seed,
            },
            // Plain decoding, greedy or sampled as `sampling` says.
            "greedy_reference": has_greedy.then(|| json!({
                "decode_tok_s": greedy.metrics.decode_tok_s(),
                "ms_per_token": greedy.metrics.ms_per_token(),
                "prefill_ms": greedy.metrics.prefill_ms / greedy.metrics.runs.max(1) as f64,
                "tokens": greedy.metrics.tokens,
            })),
            "modes": jmodes,
            "oracle": oracle.map(|o| json!({
                "speedup": o.speedup(),
                "tokens_per_step": o.tokens_per_step(),
                "max_rows": max_rows,
            })),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
    } else {
        println!("{table}");
    }
    if let Some(path) = &args.report.file {
        // The f32 cache (default) keeps the sections it always had.
        let kv = match args.kv_cache.as_str() {
            "f32" => ("", String::new()),
            kv => ("-kv-", format!(", KV cache {kv}")),
        };
        let key = format!(
            "specdec-{}{}-{}{}{}{}",
            model_name,
            if backend_tag == "cpu" { "" } else { "-qnn" },
            args.category,
            if args.ablation { "-ablation" } else { "" },
            kv.0,
            if kv.0.is_empty() { "" } else { &args.kv_cache }
        );
        let title = format!(
            "Speculative decoding: {}{} on {}{}{}",
            model_name,
            if backend_tag == "cpu" {
                ""
            } else {
                " (QNN HTP emulator)"
            },
            args.category,
            if args.ablation { " (ablation)" } else { "" },
            kv.1
        );
        bench_report::write_section_in(path, &key, &title, &table)?;
    }
    Ok(())
}

/// Modeled verify milliseconds per output token of a schedule (lower is faster).
fn ms_per_token(s: &OracleSchedule) -> f64 {
    s.cost_ms / s.tokens.max(1) as f64
}

/// Shares of the run's gap to the oracle (in modeled verify time per token) lost to the
/// drafter's recall, its ranking, and the budget chosen without hindsight; `run` is
/// the run's modeled verify speed-up over plain decoding.
fn gap_shares(g: &GapParts, run: f64) -> [f64; 3] {
    let plain = g.oracle.base_ms / g.oracle.tokens.max(1) as f64;
    let run_ms = plain / run;
    let (o, rc, rk) = (
        ms_per_token(&g.oracle),
        ms_per_token(&g.recall),
        ms_per_token(&g.ranked),
    );
    let total = (run_ms - o).max(1e-12);
    [(rc - o) / total, (rk - rc) / total, (run_ms - rk) / total]
}

fn gap_line(mode: &str, g: &GapParts, run: f64) -> String {
    let [recall, ranking, budget] = gap_shares(g, run);
    format!(
        "\nGap to the bound, {mode} (`specdec::gap`, modeled verify time on this curve, over plain \
         decoding; tokens per step in brackets): oracle {:.2}x ({:.2}), oracle without look-ahead \
         {:.2}x ({:.2}); the drafter's whole trie at every position (recall) {:.2}x ({:.2}); that \
         trie cut by its ranking at the best budget in hindsight {:.2}x ({:.2}); the run {run:.2}x. \
         Of the run's gap to the oracle: recall {:.0}%, ranking {:.0}%, budget chosen without \
         hindsight {:.0}%. Mean true continuation per position: oracle {:.2}, in the trie {:.2}; \
         {} of {} positions had an oracle continuation of >= 2 tokens the trie held only in part \
         ({} not at all).\n",
        g.oracle.speedup(),
        g.oracle.tokens_per_step(),
        g.myopic.speedup(),
        g.myopic.tokens_per_step(),
        g.recall.speedup(),
        g.recall.tokens_per_step(),
        g.ranked.speedup(),
        g.ranked.tokens_per_step(),
        100.0 * recall,
        100.0 * ranking,
        100.0 * budget,
        g.oracle_len as f64 / g.positions.max(1) as f64,
        g.recall_len as f64 / g.positions.max(1) as f64,
        g.short_positions,
        g.positions,
        g.empty_positions,
    )
}

fn gap_json(g: &GapParts, run: f64) -> serde_json::Value {
    let [recall, ranking, budget] = gap_shares(g, run);
    json!({
        "oracle": g.oracle.speedup(),
        "myopic_oracle": g.myopic.speedup(),
        "recall": g.recall.speedup(),
        "ranked": g.ranked.speedup(),
        "run_modeled_verify": run,
        "share_recall": recall,
        "share_ranking": ranking,
        "share_budget": budget,
        "positions": g.positions,
        "short_positions": g.short_positions,
        "empty_positions": g.empty_positions,
    })
}

struct LlamaCpp {
    engine: String,
    none_tok_s: f64,
    lookup_tok_s: f64,
    lookup_mismatches: u64,
}

/// llama.cpp's figures from llamacpp_lookup.py's JSON; it must cover the same prompts.
fn read_llamacpp(path: &Path, prompts: usize, max_tokens: usize) -> Result<LlamaCpp> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading llama.cpp results {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    if v["prompts"].as_u64() != Some(prompts as u64) {
        bail!(
            "{}: {} prompts, this run has {prompts}",
            path.display(),
            v["prompts"]
        );
    }
    if let Some(m) = v["max_tokens"].as_u64() {
        if m != max_tokens as u64 {
            bail!("{}: max tokens {m}, this run {max_tokens}", path.display());
        }
    }
    let tok_s = |mode: &str| {
        v["modes"][mode]["decode_tok_s"]
            .as_f64()
            .filter(|x| *x > 0.0)
            .with_context(|| format!("{}: no decode_tok_s for mode {mode}", path.display()))
    };
    Ok(LlamaCpp {
        engine: v["engine"].as_str().unwrap_or("llama.cpp").to_owned(),
        none_tok_s: tok_s("none")?,
        lookup_tok_s: tok_s("lookup")?,
        lookup_mismatches: v["modes"]["lookup"]["mismatches"].as_u64().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_copies_from_the_prompt_and_earlier_answers_only_when_told() {
        // Flat cost up to 8 rows: a chain of k true tokens costs one step.
        let curve = CostCurve::new(vec![1, 8], vec![10.0, 10.0]).unwrap();
        let answer: Vec<u32> = (100..120).collect();
        let unrelated: Vec<u32> = (500..520).collect();
        // The second prompt shares nothing with its answer, which repeats the first one's.
        let prompts = vec![answer.clone(), unrelated.clone()];
        let outputs = vec![answer.clone(), answer.clone()];
        let with = oracle_bound(&prompts, &outputs, true, &curve, 8);
        let without = oracle_bound(&prompts, &outputs, false, &curve, 8);
        // 19 positions after the first per answer; chains of up to 7 drafts + 1 per step.
        assert_eq!(with.tokens, 38);
        assert_eq!(with.steps, 3 + 3);
        assert_eq!(without.steps, 3 + 19);
        assert!(with.speedup() > without.speedup());
        // Nothing to copy from: one token per step, no gain.
        let none = oracle_bound(
            std::slice::from_ref(&unrelated),
            &[answer],
            false,
            &curve,
            8,
        );
        assert_eq!(none.speedup(), 1.0);
    }
}
