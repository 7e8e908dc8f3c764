//! Write our full logits for every golden case (prompt positions, then the teacher-forced
//! greedy steps) as raw little-endian f32 rows, for comparing with llama.cpp's
//! (tests/fixtures/golden/compare_logits.py).
//!
//! Usage: cargo run --release -p rag-e2e --example dump_logits -- MODEL_NAME OUT_DIR

use npu_runtime::session::{LoadOptions, Model, Session, SessionOptions};
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 3, "usage: dump_logits MODEL_NAME OUT_DIR");
    let (name, out_dir) = (&args[1], PathBuf::from(&args[2]));
    let path = rag::models::cache_dir().join(format!("{name}.gguf"));
    let model = Model::load(&path, &LoadOptions::with_threads(2))?;
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/golden/{name}.json"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(fixture)?)?;
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_default()
    };
    for case in doc["cases"].as_array().into_iter().flatten() {
        let greedy = ids(&case["greedy"]);
        let mut tokens = ids(&case["prompt"]);
        tokens.extend_from_slice(&greedy[..greedy.len() - 1]);
        let mut s = Session::new(
            model.clone(),
            SessionOptions {
                kv_capacity: 512,
                ..SessionOptions::default()
            },
        )?;
        let case_id = case["id"].as_str().unwrap_or("case");
        let mut f = std::io::BufWriter::new(std::fs::File::create(
            out_dir.join(format!("{name}.{case_id}.ours.f32")),
        )?);
        for &t in &tokens {
            for v in s.decode_step(t)? {
                f.write_all(&v.to_le_bytes())?;
            }
        }
        println!("{case_id} {}", tokens.len());
    }
    Ok(())
}
