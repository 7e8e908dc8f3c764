//! `rag bench prefill`: graph-switch schedules for chunked prefill (sync, async,
//! progressive, progressive-wc, optimal), simulated from a profile or run on a backend.

use anyhow::{bail, Context};
use npu_runtime::schedule::choose::{
    block_layers, choose, default_block_counts, LayoutChoice, Overheads, DEFAULT_CHUNKS,
};
use npu_runtime::schedule::instance::ns_to_ms;
use npu_runtime::schedule::{choose, exact};
use npu_runtime::schedule::{simulate, Instance, MemoryBudget, Metrics, Profile, ScheduleKind};
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
    /// Comma-separated: sync, async, progressive, progressive-wc, optimal.
    #[arg(long, default_value = "sync,async,progressive,progressive-wc,optimal")]
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
    /// Write the results into this Markdown file (a section between markers; e.g. BENCHMARKS.md).
    #[arg(long)]
    benchmarks: Option<PathBuf>,
    /// cpu: layer blocks the model is cut into.
    #[arg(long, default_value_t = 4)]
    blocks: usize,
    /// cpu: tokens per prefill chunk (G1 shape).
    #[arg(long, default_value_t = 128)]
    chunk: usize,
    /// cpu: tokens per G2 run (decode/verify shape).
    #[arg(long, default_value_t = 32)]
    g2: usize,
    /// cpu: timed runs per schedule (the run with the median TTFT is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// cpu: compute threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// cpu: re-run warm-up profiling even if a cached profile exists.
    #[arg(long)]
    reprofile: bool,
}

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
        "qnn" => bail!(
            "the qnn backend is not available in this build yet; use --backend sim with a profile"
        ),
        "cpu" => return run_cpu(&args, budget, &kinds),
        other => bail!("unknown backend {other:?} (cpu, qnn or sim)"),
    }
    let profile = match &args.profile {
        Some(p) => Profile::load(p)?,
        None => Profile::paper_phone(),
    };
    let inst = Instance::from_profile(&profile, args.prompt_tokens, budget)?;
    let choice = choose_layout(&profile, args.prompt_tokens, budget)?;
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
) -> anyhow::Result<LayoutChoice> {
    let n_layers: usize = block_layers(profile)?.iter().sum();
    Ok(choose(
        profile,
        prompt_tokens,
        budget,
        ScheduleKind::ProgressiveWc,
        &default_block_counts(n_layers),
        &DEFAULT_CHUNKS,
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

/// Real execution on the CPU backend: warm-up profile (cached), then every schedule planned
/// from that profile and executed with the background loader; outputs must match.
fn run_cpu(args: &Args, budget: MemoryBudget, kinds: &[ScheduleKind]) -> anyhow::Result<()> {
    use npu_runtime::schedule::cpu::CpuExecutor;
    use npu_runtime::schedule::exec::{execute, execute_ideal};
    use npu_runtime::schedule::profile::{cache_dir, cache_path, machine_id};
    use npu_runtime::schedule::warmup::{warmup_profile, WarmupConfig};
    use npu_runtime::session::{LoadOptions, Model};
    let name = args
        .model
        .as_deref()
        .context("--backend cpu needs --model")?;
    let path = rag::models::ensure(name)?;
    let model = Model::load(
        &path,
        &LoadOptions {
            threads: args.threads,
        },
    )?;
    let kv_cap = (args.prompt_tokens + args.g2 + 1).next_multiple_of(64);
    if kv_cap > model.config().ctx_len {
        bail!(
            "--prompt-tokens {} exceeds the model's context {}",
            args.prompt_tokens,
            model.config().ctx_len
        );
    }
    let exec = CpuExecutor::new(model.clone(), args.blocks, args.chunk, args.g2, kv_cap)?;
    let model_id = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| name.into());
    let machine = format!("{} ({} threads)", machine_id(), model.threads());
    let cache = cache_path(
        &cache_dir(),
        &format!("{model_id}-b{}-g{}", exec.n_blocks(), args.g2),
        "cpu",
        &machine,
        args.chunk,
    );
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..args.prompt_tokens as u32)
        .map(|i| (i.wrapping_mul(7919) + 13) % vocab)
        .collect();
    let mut profiled_now = false;
    let profile = match (&args.profile, args.reprofile) {
        (Some(p), _) => Profile::load(p)?,
        (None, false) if cache.exists() => Profile::load(&cache)?,
        _ => {
            profiled_now = true;
            exec.set_prompt(&prompt[..args.chunk.min(prompt.len())])?;
            exec.reset_forms()?;
            let cfg = WarmupConfig {
                model: model_id.clone(),
                backend: "cpu".into(),
                machine: machine.clone(),
                chunk_tokens: args.chunk,
                g2_tokens: args.g2,
                layers: exec.layer_labels(),
                reps: 3,
                switch_needed: true,
            };
            let p = warmup_profile(&exec, &cfg)?;
            p.save(&cache)?;
            eprintln!("warm-up profile cached at {}", cache.display());
            p
        }
    };
    if profile.n_blocks() != exec.n_blocks() {
        bail!(
            "profile has {} blocks, the executor {}",
            profile.n_blocks(),
            exec.n_blocks()
        );
    }
    let inst = Instance::from_profile(&profile, args.prompt_tokens, budget)?;
    // The layout choice is cached beside the profile it was derived from.
    let choice_file = choose::choice_path(&cache, args.prompt_tokens, budget);
    let choice = match LayoutChoice::load(&choice_file) {
        Some(c) if !profiled_now && args.profile.is_none() => c,
        _ => {
            let c = choose_layout(&profile, args.prompt_tokens, budget)?;
            if args.profile.is_none() {
                c.save(&choice_file)?;
            }
            c
        }
    };
    exec.set_prompt(&prompt)?;
    let (n, c) = (exec.n_blocks(), exec.n_chunks());
    let double = inst.double_resident();
    let reps = args.reps.max(1);
    let median_of = |mut runs: Vec<npu_runtime::schedule::exec::ExecReport>| {
        runs.sort_by_key(|r| r.ttft);
        runs.swap_remove(runs.len() / 2)
    };
    // The ideal: every G2 form already resident, nothing switches.
    let mut ideal_runs = Vec::new();
    for _ in 0..reps {
        exec.reset_forms()?;
        exec.load_all()?;
        ideal_runs.push(execute_ideal(&exec, n, c)?);
    }
    let ideal = median_of(ideal_runs);
    let reference = exec.output();
    let mut results = Vec::new();
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
            exec.reset_forms()?;
            runs.push(execute(&exec, n, c, &plan, double)?);
            if exec.output() != reference {
                bail!(
                    "schedule {} changed the prefill output (logits/KV)",
                    k.name()
                );
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
    let note = format!(
        "CPU backend: G1 and G2 share the model's weights; a switch only frees/allocates activation \
         buffers (warm-up: {:.3} ms per block on average; G1 chunk {:.1} ms vs G2 chunk {:.1} ms per block). \
         Both forms fit together (a few MB), so on this backend no switch is needed; the schedules \
         above run the switches anyway, for real, to exercise the loader. Prefill output (logits + KV) \
         identical across all schedules and the ideal run: yes. Measured ideal: prefill {:.1} ms, TTFT {:.1} ms.",
        profile.blocks.iter().map(|b| b.load_g2_ms + b.unload_g1_ms).sum::<f64>() / profile.n_blocks() as f64,
        profile.blocks.iter().map(|b| b.g1_chunk_ms).sum::<f64>() / profile.n_blocks() as f64,
        profile.blocks.iter().map(|b| b.g2_chunk_ms).sum::<f64>() / profile.n_blocks() as f64,
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
        let choice = choose_layout(&profile, 512, MemoryBudget::OneFormPerBlock).unwrap();
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
