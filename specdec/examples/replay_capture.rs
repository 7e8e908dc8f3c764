//! Capture what a drafting replay needs from the real model, once per prompt: the
//! chat-formatted prompt, the prefill's top-k successors at every prompt position
//! and the greedy output (plus its end-of-generation token). `replay_sim` then
//! re-runs the drafters, tree ranking and budget controller against it in
//! milliseconds (see its doc for what a replay can and cannot reproduce).
//! `cargo run --release -p specdec --example replay_capture -- MODEL DATASET CATEGORY LIMIT MAX_TOKENS K OUT.jsonl`

use npu_runtime::session::{argmax, LoadOptions, Model, Session, SessionOptions};
use std::io::Write;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 8 {
        eprintln!(
            "usage: replay_capture MODEL DATASET CATEGORY LIMIT MAX_TOKENS K OUT.jsonl [THREADS]"
        );
        std::process::exit(2);
    }
    let (model_path, dataset, category) = (&a[1], &a[2], &a[3]);
    let limit: usize = a[4].parse().expect("LIMIT");
    let max_tokens: usize = a[5].parse().expect("MAX_TOKENS");
    let k: usize = a[6].parse().expect("K");
    let threads: usize = a.get(8).and_then(|s| s.parse().ok()).unwrap_or(2);
    let model = Model::load(
        std::path::Path::new(model_path),
        &LoadOptions::with_threads(threads),
    )
    .expect("model");
    let text = std::fs::read_to_string(dataset).expect("dataset");
    let mut qs = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        if v["category"].as_str() == Some(category.as_str()) {
            let turn = v["turns"][0].as_str().expect("turns[0]").to_owned();
            qs.push((v["question_id"].as_i64().unwrap_or(0), turn));
            if qs.len() == limit {
                break;
            }
        }
    }
    let prompts: Vec<Vec<u32>> = qs
        .iter()
        .map(|(_, t)| {
            model
                .chat_template()
                .encode_chat(
                    model.tokenizer(),
                    &[graphs::chat::ChatMessage::new("user", t)],
                    true,
                )
                .expect("chat template")
        })
        .collect();
    let v = model.vocab_size();
    let eog: Vec<u32> = (0..v as u32).filter(|&t| model.is_eog(t)).collect();
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(1);
    let mut s = Session::new(
        model.clone(),
        SessionOptions {
            kv_capacity: (longest + max_tokens + 8).min(model.config().ctx_len),
            ..Default::default()
        },
    )
    .expect("session");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&a[7]).expect("OUT"));
    for ((id, _), p) in qs.iter().zip(&prompts) {
        s.truncate(0).expect("truncate");
        let (mut ids, mut logits) = (Vec::new(), Vec::new());
        let po = s.prefill(p, k).expect("prefill");
        let mut tok = argmax(po.logits);
        for r in po.topk {
            ids.extend(r.iter().map(|x| x.0));
            logits.extend(r.iter().map(|x| x.1));
        }
        let mut gen = Vec::new();
        loop {
            gen.push(tok);
            if model.is_eog(tok) || gen.len() > max_tokens {
                break;
            }
            tok = argmax(s.decode_step(tok).expect("decode"));
        }
        let j = serde_json::json!({
            "question_id": id, "prompt": p, "k": k, "topk_ids": ids,
            "topk_logits": logits, "output": gen, "eog_ids": eog,
        });
        writeln!(out, "{j}").expect("write");
        out.flush().expect("flush");
        eprintln!("q{id}: prompt {} tokens, output {}", p.len(), gen.len());
    }
}
