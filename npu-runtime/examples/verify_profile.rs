//! Verify-cost harness: one forward of N new tokens (a chain) at a given depth, repeated.
//! Reports per N the minimum and median wall time and, for `--threads 1`, the thread's
//! CPU time (`/proc/thread-self/schedstat`, excludes time descheduled by other load).
//!
//! cargo run --release -p npu-runtime --example verify_profile -- \
//!     --model ~/.cache/rag/models/qwen2.5-coder-0.5b.gguf --depth 1000 --ns 1,8,16 --reps 10
//! `--weights-cache DIR` loads through a repacked-weights cache in DIR (`weights_cache`).
//! `--only N --secs S` loops one size for S seconds (for `perf record`).
//! `--kv f16` uses a half-float KV cache (default f32).
//! `--interleave` times the sizes in turns, one forward of each per round.
//! `--argmax` runs `forward_tree_argmax` (the verify path: argmax per row, no logits);
//! `--compare-argmax` alternates `forward_tree` and `forward_tree_argmax` rep by rep in
//! one process and reports both (an A/B that a loaded machine disturbs least).

use npu_runtime::session::{KvPrecision, LoadOptions, Model, Session, SessionOptions};
use npu_runtime::weights_cache::WeightsCache;
use std::time::Instant;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .map(|i| args[i + 1].clone())
        .unwrap_or_else(|| default.to_string())
}

fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `VmRSS` and `VmHWM` (peak) of this process in MB.
fn rss_mb() -> (f64, f64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |key: &str| {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let home = std::env::var("HOME").unwrap_or_default();
    let default_model = format!("{home}/.cache/rag/models/qwen2.5-coder-0.5b.gguf");
    let path = arg(&args, "--model", &default_model);
    let threads: usize = arg(&args, "--threads", "2").parse()?;
    let depth: usize = arg(&args, "--depth", "1000").parse()?;
    let kv_precision =
        KvPrecision::parse(&arg(&args, "--kv", "f32")).ok_or("--kv: expected f32 or f16")?;
    let reps: usize = arg(&args, "--reps", "10").parse()?;
    let ns: Vec<usize> = arg(&args, "--ns", "1,2,4,8,16")
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()?;
    let only: usize = arg(&args, "--only", "0").parse()?;
    let secs: f64 = arg(&args, "--secs", "10").parse()?;
    let argmax_only = args.iter().any(|a| a == "--argmax");
    let compare = args.iter().any(|a| a == "--compare-argmax");
    let cache = arg(&args, "--weights-cache", "");
    let opts = LoadOptions {
        threads,
        weights_cache: if cache.is_empty() {
            WeightsCache::Off
        } else {
            WeightsCache::Dir(cache.into())
        },
        plain_lm_head: args.iter().any(|a| a == "--plain-head"),
    };
    let t_load = Instant::now();
    let model = Model::load(std::path::Path::new(&path), &opts)?;
    println!(
        "load {:.0} ms, weights cache: {:?}",
        t_load.elapsed().as_secs_f64() * 1e3,
        model.weights_cache()
    );
    let (rss, peak) = rss_mb();
    println!("after load: RSS {rss:.0} MB, peak {peak:.0} MB");
    let mut s = Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: 2048,
            kv_precision,
            ..SessionOptions::default()
        },
    )?;
    let vocab = model.vocab_size() as u64;
    let toks: Vec<u32> = (0..depth as u64 + 80)
        .map(|i| (1000 + (i * 7919 + 13) % (vocab.min(30_000) - 1000)) as u32)
        .collect();
    s.prefill(&toks[..depth], 0)?;
    let chain = |n: usize| (0..n as i32).map(|i| i - 1).collect::<Vec<i32>>();
    let mut ids = Vec::with_capacity(64);
    let mut forward = |s: &mut Session, toks: &[u32], p: &[i32], argmax: bool| {
        if argmax {
            s.forward_tree_argmax(toks, p, &mut ids)
        } else {
            s.forward_tree(toks, p).map(|_| ())
        }
    };
    if only > 0 {
        // Marker for attaching a profiler (`perf record -p`) after load and prefill.
        println!("prefilled {depth} tokens, looping N={only}");
        std::io::Write::flush(&mut std::io::stdout())?;
        let p = chain(only);
        let t0 = Instant::now();
        let mut k = 0;
        while t0.elapsed().as_secs_f64() < secs {
            forward(&mut s, &toks[depth..depth + only], &p, argmax_only)?;
            k += 1;
        }
        println!("N={only}: {k} forwards in {secs} s");
        return Ok(());
    }
    println!(
        "threads {threads}, depth {depth}, {reps} reps (min / median wall ms, cpu ms if 1 thread){}",
        if argmax_only { ", argmax LM head" } else { "" }
    );
    if args.iter().any(|a| a == "--interleave") {
        // One forward of every size per round (what `rag-bench model` times), so the
        // host's phases land on all sizes alike.
        let mut wall = vec![Vec::with_capacity(reps); ns.len()];
        let chains: Vec<Vec<i32>> = ns.iter().map(|&n| chain(n)).collect();
        for round in 0..=reps {
            for ((&n, p), w) in ns.iter().zip(&chains).zip(&mut wall) {
                let t0 = Instant::now();
                forward(&mut s, &toks[depth..depth + n], p, argmax_only)?;
                if round > 0 {
                    w.push(t0.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        for (&n, mut w) in ns.iter().zip(wall) {
            w.sort_by(f64::total_cmp);
            println!("N={n:3}  wall min {:8.2}  med {:8.2}", w[0], w[reps / 2]);
        }
        return Ok(());
    }
    let mut base = None;
    for &n in &ns {
        let p = chain(n);
        forward(&mut s, &toks[depth..depth + n], &p, argmax_only)?;
        let mut wall = Vec::with_capacity(reps);
        let mut cpu = Vec::with_capacity(reps);
        let (mut wall_a, mut cpu_a) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
        for _ in 0..reps {
            let (t0, c0) = (Instant::now(), thread_cpu_ns());
            forward(&mut s, &toks[depth..depth + n], &p, argmax_only)?;
            wall.push(t0.elapsed().as_secs_f64() * 1e3);
            cpu.push((thread_cpu_ns() - c0) as f64 / 1e6);
            if compare {
                let (t0, c0) = (Instant::now(), thread_cpu_ns());
                forward(&mut s, &toks[depth..depth + n], &p, true)?;
                wall_a.push(t0.elapsed().as_secs_f64() * 1e3);
                cpu_a.push((thread_cpu_ns() - c0) as f64 / 1e6);
            }
        }
        if compare {
            wall_a.sort_by(f64::total_cmp);
            cpu_a.sort_by(f64::total_cmp);
            println!(
                "N={n:3}  argmax: wall min {:8.2}  med {:8.2}  cpu min {:8.2}  med {:8.2}",
                wall_a[0],
                wall_a[reps / 2],
                cpu_a[0],
                cpu_a[reps / 2]
            );
        }
        wall.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        let key = if threads == 1 { cpu[0] } else { wall[0] };
        let b = *base.get_or_insert(key);
        println!(
            "N={n:3}  wall min {:8.2}  med {:8.2}  cpu min {:8.2}  med {:8.2}  ratio(min) {:.2}",
            wall[0],
            wall[reps / 2],
            cpu[0],
            cpu[reps / 2],
            key / b
        );
    }
    let (rss, peak) = rss_mb();
    println!("end: RSS {rss:.0} MB, peak {peak:.0} MB");
    println!("weights cache: {:?}", model.wait_weights_cache());
    Ok(())
}
