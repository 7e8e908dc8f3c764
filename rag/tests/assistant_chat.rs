//! `Assistant::chat` (the server's entry point) against the paths it generalizes: one
//! user message with retrieval is `ask`, without retrieval it is `ask_with_context` with no
//! context; earlier turns reach the prompt, and the previous user turn the search.

use graphs::chat::ChatMessage;
use rag::assistant::{AskEvent, AskOptions};
use rag::SearchMode;

mod sample_assistant;
use sample_assistant::sample_assistant;

fn model_available() -> bool {
    let present = rag::models::resolve("smollm2-135m").is_ok();
    if !present && std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() != Ok("1") {
        panic!("smollm2-135m is missing: run scripts/fetch-model.sh smollm2-135m");
    }
    present
}

fn opts() -> AskOptions {
    AskOptions {
        max_tokens: 20,
        mode: SearchMode::Bm25,
        ..AskOptions::default()
    }
}

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: content.into(),
    }
}

#[test]
fn chat_generalizes_ask_and_ask_with_context() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = sample_assistant(dir.path());
    let q = "How do I do a factory reset of the Kestrel K2 console?";
    let asked = a.ask(q, &opts(), &mut |_| true).unwrap();
    let mut streamed = String::new();
    let chatted = a
        .chat(&[msg("user", q)], true, &opts(), &mut |p| {
            streamed.push_str(p);
            true
        })
        .unwrap();
    assert_eq!(chatted.answer, asked.answer);
    assert_eq!(streamed.trim(), chatted.answer);
    assert_eq!(chatted.prompt_tokens, asked.prompt_tokens);
    let ids = |s: &[rag::assistant::Source]| s.iter().map(|s| s.chunk_id).collect::<Vec<_>>();
    assert_eq!(ids(&chatted.sources), ids(&asked.sources));
    assert!(!chatted.sources.is_empty());

    let plain = a
        .chat(&[msg("user", q)], false, &opts(), &mut |_| true)
        .unwrap();
    let bare = a
        .ask_with_context(q, "", None, &opts(), &mut |_| true)
        .unwrap();
    assert_eq!(plain.answer, bare.answer);
    assert_eq!(plain.prompt_tokens, bare.prompt_tokens);
    assert!(plain.sources.is_empty());

    // Earlier turns and a caller's system message reach the prompt; the search is on the
    // query given, and `chat` searches the last two user messages.
    let history = [
        msg("system", "Answer in one sentence."),
        msg("user", "What is the Kestrel K2?"),
        msg("assistant", "A weather station console."),
        msg("user", q),
    ];
    let followed = a
        .chat_with_query(&history, Some(q), &opts(), &mut |_| true)
        .unwrap();
    assert_eq!(ids(&followed.sources), ids(&asked.sources));
    assert!(followed.prompt_tokens > asked.prompt_tokens + 15);
    let joined = format!("What is the Kestrel K2?\n{q}");
    assert_eq!(rag::prompt::search_query(&history), joined);
    let chatted = a.chat(&history, true, &opts(), &mut |_| true).unwrap();
    let searched = a
        .chat_with_query(&history, Some(&joined), &opts(), &mut |_| true)
        .unwrap();
    assert_eq!(ids(&chatted.sources), ids(&searched.sources));
    assert_eq!(chatted.answer, searched.answer);
    assert_eq!(chatted.prompt_tokens, followed.prompt_tokens);

    let err = a
        .chat(&history[..3], true, &opts(), &mut |_| true)
        .unwrap_err();
    assert!(format!("{err}").contains("last message"), "{err}");
    assert!(a.chat(&[], false, &opts(), &mut |_| true).is_err());
}

#[test]
fn chat_stream_streams_what_chat_answers() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = std::sync::Arc::new(sample_assistant(dir.path()));
    let chat = vec![
        msg("user", "What is the Kestrel K2?"),
        msg("assistant", "A weather station console."),
        msg("user", "How do I do a factory reset of it?"),
    ];
    let want = a.chat(&chat, true, &opts(), &mut |_| true).unwrap();
    let (mut events, _cancel) = a.chat_stream(chat, true, opts());
    let mut text = String::new();
    let mut done = None;
    while let Some(event) = events.blocking_recv() {
        match event {
            AskEvent::Text(piece) => text.push_str(&piece),
            AskEvent::Done(answer) => done = Some(answer),
            AskEvent::Error(e) => panic!("{e}"),
        }
    }
    let done = done.expect("a Done event");
    assert_eq!(done.answer, want.answer);
    assert_eq!(text.trim(), want.answer);
    let ids = |s: &[rag::assistant::Source]| s.iter().map(|s| s.chunk_id).collect::<Vec<_>>();
    assert_eq!(ids(&done.sources), ids(&want.sources));
    assert!(!done.sources.is_empty());
}
