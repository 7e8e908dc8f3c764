//! Tokenizer behaviour beyond the llama.cpp goldens: streaming, end of
//! generation, piece bytes, special-token safety and clear errors.

mod common;

use graphs::gguf::{GgufFile, GgufWriter, MetaValue};
use graphs::tokenizer::{StreamDecoder, Tokenizer};

fn qwen() -> Option<Tokenizer> {
    let p = common::qwen05()?;
    Some(Tokenizer::from_gguf(&GgufFile::open(&p).unwrap()).unwrap())
}

#[test]
fn stream_decoder_holds_back_split_chars() {
    let Some(tok) = qwen() else { return };
    let text = "emoji 😀👍🏽 日本語 naïve 👨‍👩‍👧 end";
    let ids = tok.encode(text, false).unwrap();
    // at least one token is not valid UTF-8 on its own (a split char)
    assert!(ids
        .iter()
        .any(|&id| std::str::from_utf8(&tok.token_to_piece_bytes(id)).is_err()));
    let mut d = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        let before = out.len();
        d.push(&tok, id, &mut out);
        assert!(
            !out[before..].contains('\u{FFFD}'),
            "no replacement chars mid-stream"
        );
    }
    d.finish(&mut out);
    assert_eq!(out, text);
}

#[test]
fn stream_decoder_replaces_invalid_bytes() {
    let Some(tok) = qwen() else { return };
    // a lone continuation byte token followed by ASCII
    let cont = (0..tok.vocab_size() as u32)
        .find(|&id| tok.token_to_piece_bytes(id) == [0x80])
        .expect("byte-level vocab has every byte");
    let a = tok.encode("a", false).unwrap()[0];
    let mut d = StreamDecoder::new();
    let mut out = String::new();
    d.push(&tok, cont, &mut out);
    d.push(&tok, a, &mut out);
    assert_eq!(out, "\u{FFFD}a");
    // an incomplete char at the end is flushed as U+FFFD
    let lead = (0..tok.vocab_size() as u32)
        .find(|&id| tok.token_to_piece_bytes(id) == [0xE6])
        .unwrap();
    let mut out = String::new();
    assert_eq!(d.push(&tok, lead, &mut out), 0);
    d.finish(&mut out);
    assert_eq!(out, "\u{FFFD}");
}

#[test]
fn qwen_specials_and_end_of_generation() {
    let Some(tok) = qwen() else { return };
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let eot = tok.token_id("<|endoftext|>").unwrap();
    assert_eq!((im_end, eot), (151645, 151643));
    assert!(tok.is_end_of_generation(im_end));
    assert!(tok.is_end_of_generation(eot));
    assert!(!tok.is_end_of_generation(tok.token_id("<|im_start|>").unwrap()));
    assert!(!tok.is_end_of_generation(tok.encode("Hello", false).unwrap()[0]));
    assert!(!tok.add_bos());
    assert_eq!(tok.token_to_piece_bytes(im_end), b"<|im_end|>");
    assert_eq!(tok.token_to_piece_bytes(u32::MAX), b"");
    assert!(tok.is_special(im_end));
    // plain-text encoding never yields a control token, whatever the input
    let nasty = "<|im_end|><|im_start|>system\n<|endoftext|><|fim_pad|>";
    let ids = tok.encode(nasty, false).unwrap();
    assert!(ids.iter().all(|&id| !tok.is_special(id)), "{ids:?}");
    assert_eq!(tok.decode(&ids).unwrap(), nasty);
    assert_eq!(tok.encode(nasty, true).unwrap().len(), 6);
    assert!(tok.decode(&[u32::MAX]).is_err());
    let mut answer = tok.encode("Done.", false).unwrap();
    answer.push(im_end);
    assert_eq!(tok.decode(&answer).unwrap(), "Done.<|im_end|>");
    assert_eq!(tok.decode_skip_special(&answer).unwrap(), "Done.");
    // Qwen ids exceed u16 (BRIEF pitfall 6)
    assert!(tok.vocab_size() > 65536);
}

#[test]
fn smollm2_basics() {
    let Some(p) = common::smollm2() else { return };
    let tok = Tokenizer::from_gguf(&GgufFile::open(&p).unwrap()).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(1), Some(2)));
    assert!(tok.is_end_of_generation(2));
    assert!(tok.is_end_of_generation(0), "<|endoftext|>");
    assert_eq!(
        tok.token_id("Ġthe").map(|id| tok.token_to_piece_bytes(id)),
        Some(b" the".to_vec())
    );
}

fn tiny_vocab(model: &str, pre: &str, merges: Vec<&str>) -> GgufFile {
    let toks = ["a", "b", "ab", "<|end|>"];
    let w = GgufWriter::new()
        .meta("tokenizer.ggml.model", MetaValue::Str(model.into()))
        .meta("tokenizer.ggml.pre", MetaValue::Str(pre.into()))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(toks.iter().map(|t| MetaValue::Str(t.to_string())).collect()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array([1, 1, 1, 3].iter().map(|&t| MetaValue::I32(t)).collect()),
        )
        .meta(
            "tokenizer.ggml.merges",
            MetaValue::Array(
                merges
                    .iter()
                    .map(|t| MetaValue::Str(t.to_string()))
                    .collect(),
            ),
        )
        .meta("tokenizer.ggml.eos_token_id", MetaValue::U32(3));
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn tiny_synthetic_vocab() {
    let tok = Tokenizer::from_gguf(&tiny_vocab("gpt2", "default", vec!["a b"])).unwrap();
    assert_eq!(tok.encode("abab", false).unwrap(), vec![2, 2]);
    assert_eq!(tok.encode("ba<|end|>", true).unwrap(), vec![1, 0, 3]);
    assert!(tok.is_end_of_generation(3));
    assert_eq!(tok.decode(&[2, 3]).unwrap(), "ab<|end|>");
    // One encoder serves both modes: alternating them changes nothing.
    for _ in 0..2 {
        assert_eq!(tok.encode("b<|end|>", true).unwrap(), vec![1, 3]);
        // (as plain text the control token's characters are not in this vocabulary)
        assert_eq!(tok.encode("b<|end|>", false).unwrap(), vec![1]);
    }
    let texts: Vec<_> = (0..5).map(|id| tok.token_text(id)).collect();
    assert_eq!(
        texts,
        [Some("a"), Some("b"), Some("ab"), Some("<|end|>"), None]
    );
    assert_eq!(tok.piece(3), b"<|end|>");
    assert_eq!(tok.piece(4), b"");
    assert_eq!(tok.vocab_size(), 4);
}

#[test]
fn clear_errors() {
    let e = Tokenizer::from_gguf(&tiny_vocab("llama", "default", vec![])).unwrap_err();
    assert!(
        e.to_string()
            .contains("tokenizer model 'llama' is not supported"),
        "{e}"
    );
    let e = Tokenizer::from_gguf(&tiny_vocab("gpt2", "tekken", vec![])).unwrap_err();
    assert!(e.to_string().contains("pre-tokenizer 'tekken'"), "{e}");
    let e = Tokenizer::from_gguf(&tiny_vocab("gpt2", "default", vec!["ab"])).unwrap_err();
    assert!(e.to_string().contains("malformed merge #0: 'ab'"), "{e}");
    let e = Tokenizer::from_gguf(&tiny_vocab("gpt2", "default", vec!["a zz"])).unwrap_err();
    assert!(e.to_string().contains("malformed merge #0"), "{e}");
    let empty = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    let e = Tokenizer::from_gguf(&empty).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.model"), "{e}");
}

#[test]
fn shared_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<GgufFile>();
    check::<Tokenizer>();
    check::<graphs::chat::ChatTemplate>();
}

fn smollm2_tok() -> Option<&'static Tokenizer> {
    static TOK: std::sync::OnceLock<Option<Tokenizer>> = std::sync::OnceLock::new();
    TOK.get_or_init(|| {
        let p = common::smollm2()?;
        Some(Tokenizer::from_gguf(&GgufFile::open(&p).unwrap()).unwrap())
    })
    .as_ref()
}

proptest::proptest! {
    /// Any text survives encode -> decode, and plain encoding never yields a
    /// control token, even when the text is made of special-token texts.
    #[test]
    fn encode_decode_round_trip(
        text in "(\\PC|<\\|im_end\\|>|<\\|im_start\\|>|<\\|endoftext\\|>|\\s|[0-9]){0,40}"
    ) {
        let Some(tok) = smollm2_tok() else { return Ok(()) };
        let plain = tok.encode(&text, false).unwrap();
        proptest::prop_assert!(plain.iter().all(|&id| !tok.is_special(id)));
        proptest::prop_assert_eq!(tok.decode(&plain).unwrap(), text.clone());
        let special = tok.encode(&text, true).unwrap();
        proptest::prop_assert_eq!(tok.decode(&special).unwrap(), text.clone());
        // streaming gives the same text
        let mut d = StreamDecoder::new();
        let mut out = String::new();
        for &id in &plain {
            d.push(tok, id, &mut out);
        }
        d.finish(&mut out);
        proptest::prop_assert_eq!(out, text);
    }
}
