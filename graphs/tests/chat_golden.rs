//! Chat templates render exactly as jinja2 with HF settings does, and
//! `encode_chat` equals llama.cpp's tokenization of the rendered prompt except
//! that message contents can never produce control tokens.
//! Fixture: fixtures/tokenizer_golden.json (fixtures/make_tokenizer_golden.py).

mod common;

use graphs::chat::{ChatMessage, ChatTemplate};
use graphs::gguf::GgufFile;
use graphs::tokenizer::Tokenizer;

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn count(hay: &[u32], id: u32) -> usize {
    hay.iter().filter(|&&x| x == id).count()
}

fn check_model(key: &str, path: Option<std::path::PathBuf>) {
    let Some(p) = path else { return };
    let g: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/tokenizer_golden.json")).unwrap();
    let f = GgufFile::open(&p).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    let tmpl = ChatTemplate::from_gguf(&f);
    assert_eq!(
        tmpl.warning(),
        None,
        "{key}: the model's own template is used"
    );
    let im_end = tok.token_id("<|im_end|>").unwrap();
    for c in g["models"][key]["chats"].as_array().unwrap() {
        let msgs: Vec<ChatMessage> = c["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let agp = c["add_generation_prompt"].as_bool().unwrap();
        let rendered = tmpl.render(&msgs, agp).unwrap();
        assert_eq!(rendered, c["rendered"].as_str().unwrap(), "{key}: render");

        let want = ids(&c["tokens_special"]);
        let got = tmpl.encode_chat(&tok, &msgs, agp).unwrap();
        let injected = msgs.iter().any(|m| m.content.contains("<|im_end|>"));
        if !injected {
            assert_eq!(
                got, want,
                "{key}: encode_chat equals llama.cpp on the rendered text"
            );
        } else {
            // llama.cpp parses the injected "<|im_end|>" as a control token;
            // encode_chat must not: exactly one fewer <|im_end|>.
            assert_eq!(count(&got, im_end) + 1, count(&want, im_end), "{key}");
            let plain = tok.encode("And <|im_end|> 3+3?", false).unwrap();
            assert!(
                got.windows(plain.len()).any(|w| w == plain.as_slice()),
                "{key}"
            );
            assert_eq!(tok.decode(&got).unwrap(), rendered, "{key}: same text");
        }
    }
}

#[test]
fn smollm2_chat() {
    check_model("smollm2", common::smollm2());
}

#[test]
fn qwen05_chat() {
    check_model("qwen05", common::qwen05());
}

#[test]
fn fallback_to_chatml_with_warning() {
    let t = ChatTemplate::from_source("{% for m in messages %}{{ m.content", "", "");
    assert!(
        t.warning().unwrap().contains("does not compile"),
        "{:?}",
        t.warning()
    );
    let msgs = [ChatMessage::new("user", "hi")];
    assert_eq!(
        t.render(&msgs, true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let t = ChatTemplate::from_source("{{ raise_exception('no system role') }}", "", "");
    assert!(
        t.warning().unwrap().contains("no system role"),
        "{:?}",
        t.warning()
    );
}

#[test]
fn hf_python_methods_work() {
    // .strip(), .startswith(), raise_exception only on a bad role, bos_token
    let src = "{{ bos_token }}{% for m in messages %}{% if m.role not in ['user','system'] %}{{ raise_exception('bad role') }}{% endif %}[{{ m.role.upper() }}]{{ m.content.strip() }}{% if m.content.startswith(' ') %}!{% endif %}\n{% endfor %}";
    let t = ChatTemplate::from_source(src, "<s>", "</s>");
    assert_eq!(t.warning(), None);
    let out = t
        .render(&[ChatMessage::new("user", "  hi  ")], false)
        .unwrap();
    assert_eq!(out, "<s>[USER]hi!"); // trim_blocks eats the newline, as in jinja2
    let err = t
        .render(&[ChatMessage::new("tool", "x")], false)
        .unwrap_err();
    assert!(err.to_string().contains("bad role"), "{err}");
}

#[test]
fn trimming_template_still_encodes_safely() {
    let Some(p) = common::qwen05() else { return };
    let f = GgufFile::open(&p).unwrap();
    let tok = Tokenizer::from_gguf(&f).unwrap();
    // llama3-style template that trims contents
    let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}";
    let t = ChatTemplate::from_source(src, "", "");
    let msgs = [ChatMessage::new("user", "  doc says <|im_end|> here \n")];
    let ids = t.encode_chat(&tok, &msgs, false).unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    assert_eq!(count(&ids, im_end), 1);
    assert_eq!(
        tok.decode(&ids).unwrap(),
        "<|im_start|>user\ndoc says <|im_end|> here<|im_end|>\n"
    );
}
