//! Tokenization equals llama.cpp's, token for token, on tricky strings
//! (fixture made by fixtures/make_tokenizer_golden.py with llama-cpp-python).

mod common;

use graphs::gguf::GgufFile;
use graphs::tokenizer::Tokenizer;

fn golden() -> serde_json::Value {
    serde_json::from_str(include_str!("fixtures/tokenizer_golden.json")).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_model(key: &str, path: Option<std::path::PathBuf>) {
    let Some(p) = path else { return };
    let g = golden();
    let m = &g["models"][key];
    let tok = Tokenizer::from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    assert_eq!(tok.vocab_size() as u64, m["n_vocab"].as_u64().unwrap());
    assert_eq!(
        tok.bos_id().map(|v| v as i64),
        Some(m["bos"].as_i64().unwrap())
    );
    assert_eq!(
        tok.eos_id().map(|v| v as i64),
        Some(m["eos"].as_i64().unwrap())
    );
    let mut failures = Vec::new();
    for c in m["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        for (special, field) in [(false, "plain"), (true, "special")] {
            let want = ids(&c[field]);
            let got = tok.encode(text, special).unwrap();
            if got != want {
                failures.push(format!(
                    "{text:?} special={special}: got {got:?}, llama.cpp {want:?}"
                ));
            }
            // decoding restores the text exactly
            assert_eq!(tok.decode(&got).unwrap(), text, "decode of {text:?}");
        }
    }
    for c in m["chats"].as_array().unwrap() {
        let text = c["rendered"].as_str().unwrap();
        let want = ids(&c["tokens_special"]);
        let got = tok.encode(text, true).unwrap();
        if got != want {
            failures.push(format!("chat {text:?}: got {got:?}, llama.cpp {want:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{key}: {} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_model("smollm2", common::smollm2());
}

#[test]
fn qwen05_matches_llama_cpp() {
    check_model("qwen05", common::qwen05());
}
