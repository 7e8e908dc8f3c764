//! Where calibration's prefill cost goes: prefill without / with per-position
//! top-k, and the top-k selection alone over the same number of vocabulary rows.
//! `cargo run --release -p specdec --example prefill_topk_cost -- MODEL PROMPT_TOKENS_JSONL [K] [REPS]`

use npu_runtime::session::{top_k_into, LoadOptions, Model, Session, SessionOptions};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: prefill_topk_cost MODEL PROMPT_TOKENS_JSONL [K] [REPS]");
        std::process::exit(2);
    }
    let k: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4);
    let reps: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(2);
    let model =
        Model::load(std::path::Path::new(&args[1]), &LoadOptions { threads: 2 }).expect("model");
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
        let (mut t0, mut tk) = (f64::MAX, f64::MAX);
        for _ in 0..reps {
            // Interleaved so that load changes hit both alike; best of reps.
            s.truncate(0).unwrap();
            let t = Instant::now();
            s.prefill(p, 0).unwrap();
            t0 = t0.min(t.elapsed().as_secs_f64() * 1e3);
            s.truncate(0).unwrap();
            let t = Instant::now();
            s.prefill(p, k).unwrap();
            tk = tk.min(t.elapsed().as_secs_f64() * 1e3);
        }
        // Selection alone: the same number of rows over logits of this model's vocabulary
        // (the last prefill's last row, perturbed per row so branches behave as on real rows).
        s.truncate(0).unwrap();
        let last: Vec<f32> = s.prefill(p, 0).unwrap().logits.to_vec();
        let mut sel = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            for r in 0..p.len() {
                let off = (r * 7919) % v;
                let rot: &[f32] = &last;
                top_k_into(&rot[off..], k, &mut row);
                top_k_into(&rot[..off], k, &mut row);
            }
            sel = sel.min(t.elapsed().as_secs_f64() * 1e3);
        }
        println!(
            "prompt {i}: {} tokens  prefill {t0:.0} ms  with top-{k} {tk:.0} ms  (+{:.0} ms)  selection alone {sel:.0} ms",
            p.len(),
            tk - t0,
        );
    }
}
