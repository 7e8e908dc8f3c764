//! `rag-bench prefill`: graph-switch schedules for chunked prefill (sync, async,
//! progressive, progressive-wc, progressive-ls, optimal), simulated from a profile or run on a backend.

use anyhow::{bail, Context};
use npu_runtime::backend::Backend;
use npu_runtime::schedule::choose::{
    block_layers, choose, default_block_counts, LayoutChoice, Overheads, DEFAULT_CHUNKS,
};
use npu_runtime::schedule::instance::ns_to_ms;
use npu_runtime::schedule::{choose, exact};
use npu_runtime::schedule::{simulate, Instance, MemoryBudget, Metrics, Profile, ScheduleKind};
use npu_runtime::session::{Session, SessionOptions};
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Model name or GGUF path (needed for real backends; optional with `--backend sim`).
    #[arg(long)]
    model: Option<String>,
    /// cpu, qnn or sim (simulation from a profile; needs no model).
    #[arg(long, default_value = "sim")]
    backend: String,
    #[arg(long, default_value_t = 1024)]
    prompt_tokens: usize,
    /// Comma-separated: sync, async, progressive, progressive-wc, progressive-ls, optimal.
    #[arg(
        long,
        default_value = "sync,async,progressive,progressive-wc,progressive-ls,optimal"
    )]
    schedule: String,
    /// Profile JSON (default for sim: the paper-derived Qwen2.5-1.5B phone profile).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// `one-form` (default: one form per block, phone-like), `unlimited`, or bytes with an
    /// optional K/M/G suffix.
    #[arg(long, default_value = "one-form")]
    memory_budget: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also print each schedule's timeline.
    #[arg(long)]
    timeline: bool,
    /// Also write the results into this Markdown file (e.g. BENCHMARKS.md), as this run's
    /// section between its markers; the rest of the file is kept.
    #[arg(long = "report", alias = "benchmarks", value_name = "FILE")]
    benchmarks: Option<PathBuf>,
    /// cpu/qnn: layer blocks the model is cut into (default: the warm-up's choice; the
    /// first layout profiled is 4 blocks on cpu, 2 on qnn).
    #[arg(long)]
    blocks: Option<usize>,
    /// cpu/qnn: tokens per prefill chunk, the G1 shape (default: the warm-up's choice; the
    /// first layout profiled uses 128 on cpu, 16 on qnn).
    #[arg(long)]
    chunk: Option<usize>,
    /// cpu/qnn: tokens per G2 run, the decode/verify shape (default 32 on cpu, 16 on qnn; at least 16 on qnn, and it must divide the chunk).
    #[arg(long)]
    g2: Option<usize>,
    /// cpu/qnn: chunk sizes the warm-up may choose from (comma-separated; default
    /// 32,64,128,256 on cpu, 16 on qnn).
    #[arg(long)]
    choose_chunks: Option<String>,
    /// cpu/qnn: layouts warm-up may measure besides the first (default 3 on cpu, 1 on qnn).
    #[arg(long)]
    measure_layouts: Option<usize>,
    /// cpu/qnn: warm-up repetitions per layout (medians; default 3 on cpu, 1 on qnn).
    #[arg(long)]
    warmup_reps: Option<usize>,
    /// cpu/qnn: timed runs per schedule (the run with the median TTFT is reported; default
    /// 3 on cpu, 1 on qnn).
    #[arg(long)]
    reps: Option<usize>,
    /// cpu: compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// cpu/qnn: re-run warm-up profiling even if a cached profile exists.
    #[arg(long)]
    reprofile: bool,
}

/// Per-backend defaults of the real-execution flags.
struct RealDefaults {
    blocks: usize,
    chunk: usize,
    g2: usize,
    chunks: &'static [usize],
    measure: usize,
    warmup_reps: usize,
    reps: usize,
}

const CPU_DEFAULTS: RealDefaults = RealDefaults {
    blocks: 4,
    chunk: 128,
    g2: 32,
    chunks: &DEFAULT_CHUNKS,
    measure: 3,
    warmup_reps: 3,
    reps: 3,
};

/// The HTP emulator runs a 15-layer block over a chunk in seconds: small shapes. G2 is the
/// smallest precise HTP graph (16 rows); a chunk runs on it as 16-row runs, with the same
/// bits as one G1 run (slot attention, docs/qnn.md).
const QNN_DEFAULTS: RealDefaults = RealDefaults {
    blocks: 2,
    chunk: 32,
    g2: 16,
    chunks: &[32],
    measure: 1,
    warmup_reps: 1,
    reps: 1,
};

fn parse_budget(s: &str) -> anyhow::Result<MemoryBudget> {
    let s = s.trim();
    match s {
        "one-form" => return Ok(MemoryBudget::OneFormPerBlock),
        "unlimited" => return Ok(MemoryBudget::Bytes(u64::MAX)),
        _ => {}
    }
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let v: u64 = num.parse().with_context(|| {
        format!("--memory-budget {s:?}: expected one-form, unlimited or a byte count like 3G")
    })?;
    Ok(MemoryBudget::Bytes(
        v.checked_mul(mul).context("--memory-budget overflows")?,
    ))
}

/// One schedule's outcome: metrics, or why it was not run.
enum Outcome {
    Ran(Metrics, String),
    Skipped(String),
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let kinds = args
        .schedule
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(ScheduleKind::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if kinds.is_empty() {
        bail!("--schedule names no schedule");
    }
    if args.prompt_tokens == 0 || args.prompt_tokens > 1 << 20 {
        bail!("--prompt-tokens must be in 1..=1048576");
    }
    let budget = parse_budget(&args.memory_budget)?;
    match args.backend.as_str() {
        "sim" => {}
        "qnn" => return run_qnn(&args, budget, &kinds),
        "cpu" => return run_cpu(&args, budget, &kinds),
        other => bail!("unknown backend {other:?} (cpu, qnn or sim)"),
    }
    let profile = match &args.profile {
        Some(p) => Profile::load(p)?,
        None => Profile::paper_phone(),
    };
    let inst = Instance::from_profile(&profile, args.prompt_tokens, budget)?;
    let choice = choose_layout(&profile, args.prompt_tokens, budget, &DEFAULT_CHUNKS)?;
    let mut results: Vec<(ScheduleKind, Outcome)> = Vec::new();
    for &k in &kinds {
        let outcome = match k.plan(&inst) {
            Ok(plan) => {
                let sim = simulate(&inst, &plan)?;
                Outcome::Ran(sim.metrics, npu_runtime::schedule::sim::render(&sim.events))
            }
            Err(e @ npu_runtime::schedule::ScheduleError::TooLarge(_))
            | Err(e @ npu_runtime::schedule::ScheduleError::Unsupported(_)) => {
                Outcome::Skipped(e.to_string())
            }
            Err(e) => return Err(e.into()),
        };
        results.push((k, outcome));
    }
    report(&args, &profile, &inst, &results, &choice, None)
}

/// The warm-up's choice of block count and chunk size for this prompt (see
/// `npu_runtime::schedule::choose`), predicted with progressive-wc, with the per-call
/// overhead estimated from the profile.
fn choose_layout(
    profile: &Profile,
    prompt_tokens: usize,
    budget: MemoryBudget,
    chunks: &[usize],
) -> anyhow::Result<LayoutChoice> {
    let n_layers: usize = block_layers(profile)?.iter().sum();
    Ok(choose(
        profile,
        prompt_tokens,
        budget,
        ScheduleKind::ProgressiveWc,
        &default_block_counts(n_layers),
        chunks,
        Overheads::estimate(profile),
    )?)
}

fn choice_line(c: &LayoutChoice) -> String {
    let p = &c.predicted;
    format!(
        "warm-up choice for {} tokens (predicted with {} over {} layouts, {:.3} ms per graph \
         call): {} blocks, chunks of {} tokens: prefill {:.1} ms, stall {:.1} ms, TTFT {:.1} ms",
        c.prompt_tokens,
        c.schedule,
        c.candidates.len(),
        c.overheads.call_ms,
        c.n_blocks,
        c.chunk_tokens,
        p.prefill_ms,
        p.stall_ms,
        p.ttft_ms
    )
}

fn report(
    args: &Args,
    profile: &Profile,
    inst: &Instance,
    results: &[(ScheduleKind, Outcome)],
    choice: &LayoutChoice,
    note: Option<&str>,
) -> anyhow::Result<()> {
    let ideal_ms = ns_to_ms(inst.ideal_ttft());
    if args.json {
        let mut schedules = serde_json::Map::new();
        let mut skipped = serde_json::Map::new();
        for (k, o) in results {
            match o {
                Outcome::Ran(m, _) => {
                    schedules.insert(k.name().into(), serde_json::to_value(m)?);
                }
                Outcome::Skipped(why) => {
                    skipped.insert(k.name().into(), why.clone().into());
                }
            }
        }
        let out = serde_json::json!({
            "backend": args.backend,
            "profile": {
                "model": profile.model, "backend": profile.backend,
                "machine": profile.machine, "source": profile.source,
            },
            "prompt_tokens": args.prompt_tokens,
            "n_blocks": inst.n_blocks,
            "n_chunks": inst.n_chunks,
            "memory_budget": args.memory_budget,
            "ideal_ttft_ms": ideal_ms,
            "layout_choice": choice,
            "note": note,
            "schedules": schedules,
            "skipped": skipped,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", table(profile, inst, args, results));
        println!("{}", choice_line(choice));
        if let Some(n) = note {
            println!("{n}");
        }
        if args.timeline {
            for (k, o) in results {
                if let Outcome::Ran(_, tl) = o {
                    println!("\n{} timeline (start ms, end ms):\n{tl}", k.name());
                }
            }
        }
    }
    if let Some(path) = &args.benchmarks {
        write_section(path, args, profile, inst, results, choice, note)?;
        eprintln!("results written to {}", path.display());
    }
    Ok(())
}

fn table(
    profile: &Profile,
    inst: &Instance,
    args: &Args,
    results: &[(ScheduleKind, Outcome)],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "profile: {} on {} ({}); {} blocks x {} chunks of {} tokens, prompt {} tokens, budget {}",
        profile.model,
        profile.backend,
        profile.machine,
        inst.n_blocks,
        inst.n_chunks,
        profile.chunk_tokens,
        args.prompt_tokens,
        args.memory_budget
    );
    let _ = writeln!(
        s,
        "ideal from the profile (no switch needed): prefill {:.1} ms, TTFT {:.1} ms",
        ns_to_ms(inst.ideal_prefill()),
        ns_to_ms(inst.ideal_ttft())
    );
    let _ = writeln!(
        s,
        "| schedule | prefill_ms | switch_ms | ttft_ms | stall_ms | overhead_pct |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for (k, o) in results {
        match o {
            Outcome::Ran(m, _) => {
                let _ = writeln!(
                    s,
                    "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
                    k.name(),
                    m.prefill_ms,
                    m.switch_ms,
                    m.ttft_ms,
                    m.stall_ms,
                    m.overhead_pct
                );
            }
            Outcome::Skipped(why) => {
                let _ = writeln!(s, "| {} | n/a | n/a | n/a | n/a | n/a ({why}) |", k.name());
            }
        }
    }
    s
}

/// This run's section of the benchmarks file, through the shared section writer (which
/// stamps the command line, machine and date).
fn write_section(
    path: &std::path::Path,
    args: &Args,
    profile: &Profile,
    inst: &Instance,
    results: &[(ScheduleKind, Outcome)],
    choice: &LayoutChoice,
    note: Option<&str>,
) -> anyhow::Result<()> {
    let key = format!(
        "prefill:{}:{}:{}",
        args.backend, profile.model, args.prompt_tokens
    );
    let title = format!(
        "Prefill graph-switch schedules: {} / {}, {} prompt tokens",
        args.backend, profile.model, args.prompt_tokens
    );
    let mut body = String::new();
    let _ = writeln!(body, "Profile source: {}  ", profile.source);
    let _ = writeln!(
        body,
        "Exact solver limits: {} blocks, {} steps.",
        exact::MAX_BLOCKS,
        exact::MAX_STEPS
    );
    let _ = writeln!(body);
    body.push_str(&table(profile, inst, args, results));
    let _ = writeln!(body, "\n{}", choice_line(choice));
    if let Some(n) = note {
        let _ = writeln!(body, "\n{n}");
    }
    crate::bench_report::write_section_in(path, &key, &title, &body)
}

fn parse_chunks(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            t.trim()
                .parse::<usize>()
                .ok()
                .filter(|&v| v > 0)
                .with_context(|| format!("--choose-chunks: {t:?} is not a positive integer"))
        })
        .collect()
}

/// Session options of a layout: prefill graphs of `chunk` rows (G1), one decode graph of
/// `g2` rows (G2).
fn layout_options(n: usize, chunk: usize, g2: usize, kv_capacity: usize) -> SessionOptions {
    SessionOptions {
        kv_capacity,
        prefill_chunk: chunk,
        max_verify: g2,
        min_verify: g2,
        blocks: n,
        ..SessionOptions::default()
    }
}

/// Real execution on the CPU backend (see [`run_real`]).
fn run_cpu(args: &Args, budget: MemoryBudget, kinds: &[ScheduleKind]) -> anyhow::Result<()> {
    let model = load_model(args)?;
    let m = model.clone();
    run_real(
        args,
        budget,
        kinds,
        &CPU_DEFAULTS,
        &model,
        "cpu",
        &|n, c, g2, cap| Ok(Session::new(m.clone(), layout_options(n, c, g2, cap))?),
    )
}

/// Real execution on the QNN HTP backend (the emulator on x86-64): context binaries are
/// compiled once and cached on disk (`qnn::BinaryCache`), so a switch is a real free of
/// the G1 context and a load of the G2 context binary.
fn run_qnn(args: &Args, budget: MemoryBudget, kinds: &[ScheduleKind]) -> anyhow::Result<()> {
    use npu_qnn::{BinaryCache, QnnBackend, MIN_PRECISE_ROWS};
    let model = load_model(args)?;
    let m = model.clone();
    run_real(
        args,
        budget,
        kinds,
        &QNN_DEFAULTS,
        &model,
        "qnn",
        &|n, c, g2, cap| {
            anyhow::ensure!(
                g2 >= MIN_PRECISE_ROWS,
                "on QNN the G2 graphs need at least {MIN_PRECISE_ROWS} rows (got {g2}): \
                 smaller HTP graphs compute less precisely, so a chunk on G2 would differ \
                 from the same chunk on G1"
            );
            let opts = layout_options(n, c, g2, cap);
            opts.check(m.config())?;
            let backend = QnnBackend::new(
                m.clone(),
                cap,
                Some(BinaryCache::new(BinaryCache::default_dir())),
            )?;
            Ok(Session::with_backend(backend, m.clone(), opts)?)
        },
    )
}

fn load_model(args: &Args) -> anyhow::Result<std::sync::Arc<npu_runtime::session::Model>> {
    use npu_runtime::session::{LoadOptions, Model};
    let name = args
        .model
        .as_deref()
        .context("--backend cpu/qnn needs --model")?;
    let path = rag::models::ensure(name)?;
    Ok(Model::load(
        &path,
        &LoadOptions::with_threads(args.threads),
    )?)
}

/// A session and its layout (blocks, chunk tokens).
type Built<B> = ((usize, usize), Session<B>);

/// Builds a session of (blocks, chunk, G2 rows, KV capacity): prefill graphs of `chunk`
/// rows (G1), one decode graph of G2 rows (G2).
type MakeSession<'a, B> = dyn Fn(usize, usize, usize, usize) -> anyhow::Result<Session<B>> + 'a;

/// Real execution: warm-up profiles (cached per model, backend, machine and layout), the
/// layout chosen from them (measured by warm-up, see `schedule::choose::choose_measured`)
/// unless `--blocks` and `--chunk` fix it, then every schedule planned from that layout's
/// profile and executed with the background loader; the prefill output must be identical.
#[allow(clippy::too_many_arguments)]
fn run_real<B: Backend>(
    args: &Args,
    budget: MemoryBudget,
    kinds: &[ScheduleKind],
    d: &RealDefaults,
    model: &std::sync::Arc<npu_runtime::session::Model>,
    backend: &str,
    make: &MakeSession<'_, B>,
) -> anyhow::Result<()> {
    use npu_runtime::schedule::profile::{cache_dir, cache_path};
    use npu_runtime::schedule::profile_machine;
    use std::cell::RefCell;
    let g2 = args.g2.unwrap_or(d.g2);
    let kv_cap = (args.prompt_tokens + g2 + 1).next_multiple_of(64);
    if kv_cap > model.config().ctx_len {
        bail!(
            "--prompt-tokens {} exceeds the model's context {}",
            args.prompt_tokens,
            model.config().ctx_len
        );
    }
    let model_id = model
        .path()
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let machine = profile_machine(backend, model.threads());
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..args.prompt_tokens as u32)
        .map(|i| (i.wrapping_mul(7919) + 13) % vocab)
        .collect();
    let warmup_reps = args.warmup_reps.unwrap_or(d.warmup_reps).max(1);
    // The executor last built, kept for the run when its layout is the one chosen.
    let built: RefCell<Option<Built<B>>> = RefCell::new(None);
    let exec_for = |n: usize, c: usize| -> anyhow::Result<()> {
        if built.borrow().as_ref().is_none_or(|(l, _)| *l != (n, c)) {
            *built.borrow_mut() = None; // free the old graphs first
            let e = make(n, c, g2, kv_cap)?;
            *built.borrow_mut() = Some(((n, c), e));
        }
        Ok(())
    };
    let cache_of = |n: usize, c: usize| {
        cache_path(
            &cache_dir(),
            &format!("{model_id}-b{n}-g{g2}-kv{kv_cap}"),
            backend,
            &machine,
            c,
        )
    };
    let profile_of = |n: usize, c: usize| -> anyhow::Result<Profile> {
        let path = cache_of(n, c);
        if !args.reprofile {
            if let Ok(p) = Profile::load(&path) {
                return Ok(p);
            }
        }
        exec_for(n, c)?;
        let mut b = built.borrow_mut();
        let session = &mut b.as_mut().expect("built").1;
        let t = std::time::Instant::now();
        let mut p = session.profile_forms(&model_id, &machine, warmup_reps)?;
        p.backend = backend.into();
        p.save(&path)?;
        eprintln!(
            "warm-up of {n} blocks x {c} tokens: {:.1} s, cached at {}",
            t.elapsed().as_secs_f64(),
            path.display()
        );
        Ok(p)
    };

    let n_layers = model.config().n_layer;
    let block_counts = match args.blocks {
        Some(b) => vec![b],
        None => default_block_counts(n_layers),
    };
    let chunks = match (args.chunk, &args.choose_chunks) {
        (Some(c), _) => vec![c],
        (None, Some(list)) => parse_chunks(list)?,
        (None, None) => d.chunks.to_vec(),
    };
    // A chunk no larger than G2 has no second form to switch to.
    let chunks: Vec<usize> = chunks
        .into_iter()
        .filter(|&c| c > g2 && c % g2 == 0)
        .collect();
    if chunks.is_empty() {
        bail!("no chunk size is a multiple of the G2 size {g2} larger than it");
    }
    let base = match &args.profile {
        Some(p) => Profile::load(p)?,
        None => profile_of(
            args.blocks.unwrap_or(d.blocks),
            args.chunk.unwrap_or(d.chunk),
        )?,
    };
    let explicit = args.profile.is_some() || (args.blocks.is_some() && args.chunk.is_some());
    let (choice, how) = if explicit {
        (
            // The backend's candidate chunks (on QNN only G2 = chunk can run).
            choose_layout(
                &base,
                args.prompt_tokens,
                budget,
                &match &args.choose_chunks {
                    Some(list) => parse_chunks(list)?,
                    None => d.chunks.to_vec(),
                },
            )?,
            "given on the command line (the warm-up choice below is a prediction only)",
        )
    } else {
        let measure = args.measure_layouts.unwrap_or(d.measure);
        let c = choose::choose_measured(
            &base,
            args.prompt_tokens,
            budget,
            ScheduleKind::ProgressiveWc,
            &block_counts,
            &chunks,
            measure,
            |n, c| {
                profile_of(n, c)
                    .map_err(|e| npu_runtime::schedule::ScheduleError::Executor(format!("{e:#}")))
            },
        )?;
        (c, "chosen by warm-up (measured layouts)")
    };
    let (n_run, c_run) = if explicit {
        (base.n_blocks(), base.chunk_tokens)
    } else {
        (choice.n_blocks, choice.chunk_tokens)
    };
    let profile = if explicit {
        base
    } else {
        profile_of(n_run, c_run)?
    };
    exec_for(n_run, c_run)?;
    let mut b = built.borrow_mut();
    let session = &mut b.as_mut().expect("built").1;
    let n = session.n_blocks();
    if profile.n_blocks() != n || profile.chunk_tokens != c_run {
        bail!(
            "profile has {} blocks x {} tokens, the session {n} x {c_run}",
            profile.n_blocks(),
            profile.chunk_tokens,
        );
    }
    let inst = Instance::from_profile(&profile, args.prompt_tokens, budget)?;
    let c = prompt.len().div_ceil(c_run);
    let output = |s: &mut Session<B>, logits: Vec<f32>| -> anyhow::Result<_> {
        Ok((logits, s.export_kv(prompt.len())?))
    };
    let double = inst.double_resident();
    let reps = args.reps.unwrap_or(d.reps).max(1);
    let median_of = |mut runs: Vec<npu_runtime::schedule::exec::ExecReport>| {
        runs.sort_by_key(|r| r.ttft);
        runs.swap_remove(runs.len() / 2)
    };
    // The ideal: every G2 form already resident, nothing switches.
    let mut ideal_runs = Vec::new();
    let mut reference = None;
    for _ in 0..reps {
        let (r, logits) = session.prefill_ideal(&prompt)?;
        ideal_runs.push(r);
        reference = Some(output(session, logits)?);
    }
    let ideal = median_of(ideal_runs);
    let reference = reference.expect("at least one repetition");
    let mut results = Vec::new();
    let mut mismatches: Vec<String> = Vec::new();
    for &k in kinds {
        let plan = match k.plan(&inst) {
            Ok(p) => p,
            Err(e @ npu_runtime::schedule::ScheduleError::TooLarge(_))
            | Err(e @ npu_runtime::schedule::ScheduleError::Unsupported(_)) => {
                results.push((k, Outcome::Skipped(e.to_string())));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let mut runs = Vec::new();
        for _ in 0..reps {
            let (r, logits) = session.prefill_planned(&prompt, &plan, double)?;
            runs.push(r);
            let out = output(session, logits)?;
            if out != reference {
                let diff = |a: &[f32], b: &[f32]| {
                    a.iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max)
                };
                let (dl, dk) = (diff(&out.0, &reference.0), diff(&out.1, &reference.1));
                if backend == "cpu" {
                    bail!(
                        "schedule {} changed the prefill output (max |logit diff| {dl}, \
                         max |KV diff| {dk})",
                        k.name()
                    );
                }
                mismatches.push(format!(
                    "{} (max |logit diff| {dl:.4}, max |KV diff| {dk:.4})",
                    k.name()
                ));
            }
        }
        let rep = median_of(runs);
        results.push((
            k,
            Outcome::Ran(
                rep.metrics(ideal.ttft),
                npu_runtime::schedule::sim::render(&rep.events),
            ),
        ));
    }
    let nb = profile.n_blocks() as f64;
    let avg = |f: fn(&npu_runtime::schedule::BlockProfile) -> f64| {
        profile.blocks.iter().map(f).sum::<f64>() / nb
    };
    let per_block = format!(
        "warm-up per block (average of {} blocks): G1 chunk {:.1} ms, G2 chunk {:.1} ms, \
         free G1 {:.3} ms, load G2 {:.3} ms, G1 {:.1} MB, G2 {:.1} MB; decode step {:.1} ms",
        profile.n_blocks(),
        avg(|b| b.g1_chunk_ms),
        avg(|b| b.g2_chunk_ms),
        avg(|b| b.unload_g1_ms),
        avg(|b| b.load_g2_ms),
        avg(|b| b.mem_g1_bytes as f64) / (1 << 20) as f64,
        avg(|b| b.mem_g2_bytes as f64) / (1 << 20) as f64,
        profile.decode_step_ms
    );
    let backend_note = match backend {
        "cpu" => {
            "CPU backend: G1 and G2 share the model's weights; a switch only frees/allocates \
                  activation buffers. Both forms fit together (a few MB), so on this backend no \
                  switch is needed; the schedules above run the switches anyway, for real, to \
                  exercise the loader."
        }
        _ => {
            "QNN backend (HTP emulator on x86-64): each form is its own context binary; a \
              switch is a real contextFree of G1 and contextCreateFromBinary of G2. Loads, \
              frees and executions of distinct contexts take the QNN runtime's lock shared, \
              so a switch overlaps the compute in flight (RAG_QNN_SERIAL_CALLS=1 makes every \
              call exclusive again, as when a switch could only be moved into \
              prefill)."
        }
    };
    let identical = if mismatches.is_empty() {
        "yes".to_string()
    } else {
        format!("NO for {}", mismatches.join(", "))
    };
    let note = format!(
        "Layout: {n} blocks x chunks of {c_run} tokens ({c} chunks), G2 runs of {g2} tokens, \
         {how}. {per_block}. {backend_note} Prefill output (logits + KV) identical across all \
         schedules and the ideal run: {identical}. Measured ideal: prefill {:.1} ms, TTFT {:.1} ms \
         (median of {reps}).",
        ns_to_ms(ideal.prefill_end),
        ns_to_ms(ideal.ttft),
    );
    report(args, &profile, &inst, &results, &choice, Some(&note))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    fn sim_results(args: &Args) -> (Profile, Instance, Vec<(ScheduleKind, Outcome)>) {
        let profile = Profile::paper_phone();
        let inst =
            Instance::from_profile(&profile, args.prompt_tokens, MemoryBudget::OneFormPerBlock)
                .unwrap();
        let results = ScheduleKind::ALL
            .iter()
            .map(|&k| {
                let m = simulate(&inst, &k.plan(&inst).unwrap()).unwrap().metrics;
                (k, Outcome::Ran(m, String::new()))
            })
            .collect();
        (profile, inst, results)
    }

    #[test]
    fn budgets_parse_or_fail_clearly() {
        assert_eq!(
            parse_budget("one-form").unwrap(),
            MemoryBudget::OneFormPerBlock
        );
        assert_eq!(parse_budget("3G").unwrap(), MemoryBudget::Bytes(3 << 30));
        assert_eq!(parse_budget("512").unwrap(), MemoryBudget::Bytes(512));
        assert!(parse_budget("lots").is_err());
        assert!(parse_budget("99999999999999999999G").is_err());
    }

    #[test]
    fn benchmarks_section_is_replaced_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("BENCHMARKS.md");
        std::fs::write(&path, "# Benchmarks\n\nother section\n").unwrap();
        let args = Wrap::parse_from(["x", "--prompt-tokens", "512"]).args;
        let (profile, inst, results) = sim_results(&args);
        let choice = choose_layout(
            &profile,
            512,
            MemoryBudget::OneFormPerBlock,
            &DEFAULT_CHUNKS,
        )
        .unwrap();
        write_section(&path, &args, &profile, &inst, &results, &choice, None).unwrap();
        write_section(
            &path,
            &args,
            &profile,
            &inst,
            &results,
            &choice,
            Some("a note"),
        )
        .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("other section"));
        assert_eq!(text.matches(":begin -->").count(), 1, "{text}");
        assert!(text.contains("a note") && text.contains("| progressive |"));
        assert!(text.contains("warm-up choice for 512 tokens"), "{text}");
        let table = table(&profile, &inst, &args, &results);
        assert_eq!(
            table.lines().filter(|l| l.starts_with("| ")).count(),
            1 + ScheduleKind::ALL.len()
        );
    }
}
