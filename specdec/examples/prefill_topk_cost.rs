//! Where calibration's prefill cost goes: prefill without / with per-position
//! top-k, and the top-k selection alone over the same number of vocabulary rows.
//! Also the windowed variant the generator uses with `calib_window` W: the head
//! prefilled without top-k, the last >= W positions with it (split at a multiple
//! of the prefill chunk).
//! `cargo run --release -p specdec --example prefill_topk_cost -- MODEL PROMPT_TOKENS_JSONL [K] [REPS] [W]`

use npu_runtime::session::{top_k_into, LoadOptions, Model, Session, SessionOptions};
use std::time::Instant;

/// Process CPU time (user + system, all threads) in ms, from /proc (Linux): on a
/// loaded machine it moves far less than wall time. 0 where unavailable.
fn cpu_ms() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |r| r.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) * 10.0 // USER_HZ = 100 on Linux
}

/// Wall ms and CPU ms of `f`.
fn timed(f: impl FnOnce()) -> (f64, f64) {
    let (t, c) = (Instant::now(), cpu_ms());
    f();
    (t.elapsed().as_secs_f64() * 1e3, cpu_ms() - c)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: prefill_topk_cost MODEL PROMPT_TOKENS_JSONL [K] [REPS]");
        std::process::exit(2);
    }
    let k: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4);
    let reps: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(2);
    let window: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(256);
    let model = Model::load(
        std::path::Path::new(&args[1]),
        &LoadOptions::with_threads(2),
    )
    .expect("model");
    let text = std::fs::read_to_string(&args[2]).expect("prompt tokens");
    let prompts: Vec<Vec<u32>> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json");
            v["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| t.as_u64().expect("id") as u32)
                .collect()
        })
        .collect();
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(1);
    let mut s = Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: (longest + 8).min(model.config().ctx_len),
            ..Default::default()
        },
    )
    .expect("session");
    let v = model.vocab_size();
    let mut row = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let chunk = s.options().prefill_chunk;
        let split = p.len().saturating_sub(window) / chunk * chunk;
        // (wall, cpu) best of reps, interleaved so that load changes hit all alike.
        let mut best = [(f64::MAX, f64::MAX); 5];
        for _ in 0..reps {
            let runs: [&dyn Fn(&mut Session); 5] = [
                &|s| {
                    s.prefill(p, 0).unwrap();
                },
                &|s| {
                    s.prefill(p, k).unwrap();
                },
                &|s| {
                    if split > 0 {
                        s.prefill(&p[..split], 0).unwrap();
                    }
                    s.prefill(&p[split..], k).unwrap();
                },
                // The blocked LM head over kept hidden rows, all positions / the window.
                &|s| {
                    s.prefill_topk_from(p, k, 0).unwrap();
                },
                &|s| {
                    s.prefill_topk_from(p, k, p.len().saturating_sub(window))
                        .unwrap();
                },
            ];
            for (b, run) in best.iter_mut().zip(runs) {
                s.truncate(0).unwrap();
                let (w, c) = timed(|| run(&mut s));
                *b = (b.0.min(w), b.1.min(c));
            }
        }
        let [t0, tk, tw, tb, tbw] = best;
        // Selection alone: the same number of rows over logits of this model's vocabulary
        // (the last prefill's last row, perturbed per row so branches behave as on real rows).
        s.truncate(0).unwrap();
        let last: Vec<f32> = s.prefill(p, 0).unwrap().logits.to_vec();
        let mut sel = (f64::MAX, f64::MAX);
        for _ in 0..reps {
            let (w, c) = timed(|| {
                for r in 0..p.len() {
                    let off = (r * 7919) % v;
                    top_k_into(&last[off..], k, &mut row);
                    top_k_into(&last[..off], k, &mut row);
                }
            });
            sel = (sel.0.min(w), sel.1.min(c));
        }
        println!(
            "prompt {i}: {} tokens | wall ms: prefill {:.0}, with top-{k} +{:.0}, selection alone {:.0}, top-{k} on the last {} +{:.0} | cpu ms: prefill {:.0}, with top-{k} +{:.0}, selection alone {:.0}, windowed +{:.0}, blocked all +{:.0}, blocked last {} +{:.0}",
            p.len(),
            t0.0,
            tk.0 - t0.0,
            sel.0,
            p.len() - split,
            tw.0 - t0.0,
            t0.1,
            tk.1 - t0.1,
            sel.1,
            tw.1 - t0.1,
            tb.1 - t0.1,
            window.min(p.len()),
            tbw.1 - t0.1,
        );
    }
}
