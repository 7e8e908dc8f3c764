//! Builds `examples/chat.c` against the static library (`librag_capi.a`) and runs a
//! two-question conversation on the sample corpus with SmolLM2-135M: each answer and its
//! sources must equal what `rag::Assistant::chat` gives for the same messages, and the
//! follow-up must be searched with the question before it.

mod c_build;

use c_build::{between, build_example, corpus, Link, MODEL};
use rag::assistant::{AskOptions, Assistant, AssistantOptions, ChatMessage, Source};
use rag::SearchMode;
use std::process::Command;

const FIRST: &str = "How do I do a factory reset of the Kestrel K2 console?";
const FOLLOW_UP: &str = "And how long does it take?";
const MAX_TOKENS: usize = 24;

fn sources(list: &[Source]) -> String {
    list.iter()
        .map(|s| format!("[{}] {}\n", s.number, s.location()))
        .collect()
}

#[test]
fn statically_linked_chat_answers_follow_ups_like_the_rust_api() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("chat");
    build_example("chat", Link::Static, &exe);
    let index = dir.path().join("idx");
    let out = Command::new(&exe)
        .arg(&index)
        .arg(corpus())
        .arg(MODEL)
        .arg(MAX_TOKENS.to_string())
        .args([FIRST, FOLLOW_UP])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chat failed: {stderr}\n{stdout}");

    let mut opts = AssistantOptions::new(&index);
    opts.model = MODEL.into();
    opts.dense = false;
    let assistant = Assistant::open(opts).unwrap();
    let ask = AskOptions {
        max_tokens: MAX_TOKENS,
        ..AskOptions::default()
    };
    let mut chat = vec![ChatMessage::new("user", FIRST)];
    let first = assistant.chat(&chat, true, &ask, &mut |_| true).unwrap();
    assert!(!first.answer.is_empty());
    assert_eq!(
        between(&stdout, "--- answer 1\n", "\n--- sources 1\n").trim(),
        first.answer
    );
    assert_eq!(
        between(&stdout, "--- sources 1\n", "--- answer 2\n"),
        sources(&first.sources)
    );

    chat.push(ChatMessage::new("assistant", &first.answer));
    chat.push(ChatMessage::new("user", FOLLOW_UP));
    let second = assistant.chat(&chat, true, &ask, &mut |_| true).unwrap();
    assert_eq!(
        between(&stdout, "--- answer 2\n", "\n--- sources 2\n").trim(),
        second.answer
    );
    assert_eq!(
        stdout.split("--- sources 2\n").nth(1),
        Some(&*sources(&second.sources))
    );

    // The follow-up was searched with its subject: the passages of the reset question and
    // the follow-up together, among them the reset instructions, which the follow-up alone
    // does not find.
    let joined = format!("{FIRST}\n{FOLLOW_UP}");
    let with_subject = assistant
        .retrieve(&joined, ask.top_k, SearchMode::Hybrid)
        .unwrap();
    let alone = assistant
        .retrieve(FOLLOW_UP, ask.top_k, SearchMode::Hybrid)
        .unwrap();
    let cited: Vec<i64> = second.sources.iter().map(|s| s.chunk_id).collect();
    let ids: Vec<i64> = with_subject.iter().map(|h| h.chunk_id).collect();
    assert_eq!(cited, ids[..cited.len()]);
    let reset = with_subject
        .iter()
        .find(|h| h.text.contains("Hold both PAIR and MODE"))
        .expect("the reset instructions are found with the subject")
        .chunk_id;
    assert!(cited.contains(&reset), "{stdout}");
    assert!(alone.iter().all(|h| h.chunk_id != reset));
    // The earlier exchange is in the prompt: longer than the same sources without it.
    let without_history = assistant
        .chat_with_query(&chat[2..], Some(&joined), &ask, &mut |_| true)
        .unwrap();
    assert_eq!(without_history.sources.len(), second.sources.len());
    assert!(second.prompt_tokens > without_history.prompt_tokens + 15);
}
