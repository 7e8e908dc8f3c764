//! The C entry points called from Rust: bad arguments are errors, never crashes.

use rag_capi::*;
use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

/// Takes the message out of an error slot.
fn message(error: *mut c_char) -> String {
    assert!(!error.is_null(), "no error message");
    // SAFETY: a string from the library, freed right after.
    let s = unsafe { CStr::from_ptr(error) }
        .to_string_lossy()
        .into_owned();
    unsafe { rag_string_free(error) };
    s
}

#[test]
fn null_arguments_are_reported_as_errors() {
    let mut error = null_mut();
    let a = unsafe { rag_open(null(), null(), false, 0, &mut error) };
    assert!(a.is_null());
    assert!(message(error).contains("index_dir is NULL"));

    let q = CString::new("warranty").unwrap();
    let mut error = null_mut();
    let hits = unsafe { rag_search(null(), q.as_ptr(), 3, null(), &mut error) };
    assert!(hits.is_null());
    assert!(message(error).contains("handle is NULL"));

    let mut error = null_mut();
    let answer = unsafe {
        rag_ask(
            null(),
            q.as_ptr(),
            null(),
            None,
            null_mut(),
            null(),
            &mut error,
        )
    };
    assert!(answer.is_null());
    assert!(message(error).contains("handle is NULL"));

    // A NULL error slot is allowed: the failure is still reported by the return value.
    assert_eq!(
        unsafe { rag_add_paths(null(), null(), 0, null_mut(), null_mut()) },
        RAG_ERROR
    );
    // Freeing NULL is a no-op.
    unsafe {
        rag_close(null_mut());
        rag_hits_free(null_mut());
        rag_answer_free(null_mut());
        rag_string_free(null_mut());
    }
}

#[test]
fn indexing_searching_and_removing_through_the_abi() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    std::fs::write(docs.join("a.txt"), "The heron nests by the river.\n").unwrap();
    std::fs::write(docs.join("b.txt"), "Invoices are due in thirty days.\n").unwrap();
    let index = CString::new(dir.path().join("idx").to_str().unwrap()).unwrap();
    let mut error = null_mut();
    let a = unsafe { rag_open(index.as_ptr(), null(), false, 1, &mut error) };
    assert!(!a.is_null(), "{}", message(error));

    let path = CString::new(docs.to_str().unwrap()).unwrap();
    let paths = [path.as_ptr()];
    let mut chunks = 0u64;
    let rc = unsafe { rag_add_paths(a, paths.as_ptr(), 1, &mut chunks, &mut error) };
    assert_eq!(rc, RAG_OK);
    assert_eq!(chunks, 2);

    let q = CString::new("heron river").unwrap();
    let bm25 = CString::new("bm25").unwrap();
    let hits = unsafe { rag_search(a, q.as_ptr(), 5, bm25.as_ptr(), &mut error) };
    assert!(!hits.is_null());
    let list = unsafe { &*hits };
    assert_eq!(list.len, 1);
    let hit = unsafe { &*list.hits };
    let hit_path = unsafe { CStr::from_ptr(hit.path) }.to_str().unwrap();
    assert!(hit_path.ends_with("a.txt"));
    assert_eq!((hit.line_first, hit.line_last, hit.page), (1, 1, 0));
    assert!(unsafe { CStr::from_ptr(hit.text) }
        .to_str()
        .unwrap()
        .contains("heron"));
    unsafe { rag_hits_free(hits) };

    let bad_mode = CString::new("psychic").unwrap();
    let hits = unsafe { rag_search(a, q.as_ptr(), 5, bad_mode.as_ptr(), &mut error) };
    assert!(hits.is_null());
    assert!(message(error).contains("unknown search mode"));

    let file = CString::new(docs.join("a.txt").to_str().unwrap()).unwrap();
    let mut removed = 0usize;
    let rc = unsafe { rag_remove_path(a, file.as_ptr(), &mut removed, &mut error) };
    assert_eq!((rc, removed), (RAG_OK, 1));
    let hits = unsafe { rag_search(a, q.as_ptr(), 5, bm25.as_ptr(), &mut error) };
    assert_eq!(unsafe { (*hits).len }, 0);
    unsafe { rag_hits_free(hits) };

    let missing = CString::new(dir.path().join("missing").to_str().unwrap()).unwrap();
    let paths = [missing.as_ptr()];
    let rc = unsafe { rag_add_paths(a, paths.as_ptr(), 1, null_mut(), &mut error) };
    assert_eq!(rc, RAG_ERROR);
    assert!(message(error).contains("missing"));
    unsafe { rag_close(a) };
}

#[test]
fn invalid_utf8_is_an_error() {
    let bad = [0xffu8 as c_char, 0];
    let mut error = null_mut();
    let a = unsafe { rag_open(bad.as_ptr(), null(), false, 0, &mut error) };
    assert!(a.is_null());
    assert!(message(error).contains("not UTF-8"));
}

#[test]
fn version_is_the_crate_version() {
    let v = unsafe { CStr::from_ptr(rag_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

/// A handle on a fresh BM25 index of two small files (`docs/a.txt` about a heron).
fn open_small_index(dir: &std::path::Path, model: Option<&str>) -> *mut RagAssistant {
    let docs = dir.join("docs");
    std::fs::create_dir(&docs).unwrap();
    std::fs::write(docs.join("a.txt"), "The heron nests by the river.\n").unwrap();
    std::fs::write(docs.join("b.txt"), "Invoices are due in thirty days.\n").unwrap();
    let index = CString::new(dir.join("idx").to_str().unwrap()).unwrap();
    let model = model.map(|m| CString::new(m).unwrap());
    let mut error = null_mut();
    let a = unsafe {
        rag_open(
            index.as_ptr(),
            model.as_ref().map_or(null(), |m| m.as_ptr()),
            false,
            2,
            &mut error,
        )
    };
    assert!(!a.is_null(), "{}", message(error));
    let path = CString::new(docs.to_str().unwrap()).unwrap();
    let paths = [path.as_ptr()];
    let rc = unsafe { rag_add_paths(a, paths.as_ptr(), 1, null_mut(), &mut error) };
    assert_eq!(rc, RAG_OK);
    a
}

/// Appends each streamed piece to the `String` behind `user_data`.
unsafe extern "C" fn collect(
    piece: *const c_char,
    len: usize,
    user_data: *mut std::ffi::c_void,
) -> bool {
    // SAFETY: `piece` holds `len` bytes of UTF-8 for the call; `user_data` is the String
    // the test passed.
    let bytes = unsafe { std::slice::from_raw_parts(piece.cast::<u8>(), len) };
    let text = unsafe { &mut *user_data.cast::<String>() };
    text.push_str(std::str::from_utf8(bytes).unwrap());
    true
}

#[test]
fn ask_with_context_answers_over_the_screen_without_sources() {
    if rag::models::resolve("smollm2-135m").is_err() {
        panic!("smollm2-135m is missing: run scripts/fetch-model.sh smollm2-135m");
    }
    let dir = tempfile::tempdir().unwrap();
    let a = open_small_index(dir.path(), Some("smollm2-135m"));
    // The index could answer this question (a.txt mentions the heron); the contract is that
    // only the given context is used: no retrieval, no sources.
    let question = "Task: ask where the heron nests. Next action?";
    let screen = "<button id=3>Send</button>\n<input id=4>Message</input>";
    let system = "Reply with one action: click(ID) or input(ID, \"text\").";
    let (q, s, sys) = (
        CString::new(question).unwrap(),
        CString::new(screen).unwrap(),
        CString::new(system).unwrap(),
    );
    let mut opts = rag_ask_options_default();
    opts.max_tokens = 16;
    let mut streamed = String::new();
    let mut error = null_mut();
    let answer = unsafe {
        rag_ask_with_context(
            a,
            q.as_ptr(),
            s.as_ptr(),
            sys.as_ptr(),
            &opts,
            Some(collect),
            (&mut streamed as *mut String).cast(),
            null(),
            &mut error,
        )
    };
    assert!(!answer.is_null(), "{}", message(error));
    let got = unsafe { &*answer };
    let text = unsafe { CStr::from_ptr(got.text) }
        .to_str()
        .unwrap()
        .to_owned();
    let (n_sources, retrieve_ms, tokens, prompt_tokens, cancelled) = (
        got.n_sources,
        got.retrieve_ms,
        got.tokens_generated,
        got.prompt_tokens,
        got.cancelled,
    );
    unsafe { rag_answer_free(answer) };
    assert_eq!((n_sources, retrieve_ms), (0, 0.0));
    assert!(!text.is_empty() && tokens > 0 && tokens <= 16 && !cancelled);
    assert_eq!(streamed.trim(), text);

    // The Rust API gives the same answer for the same prompt (the screen and the system
    // message are in it: the prompt is longer than the question's alone).
    let mut opts = rag::assistant::AssistantOptions::new(dir.path().join("rust-idx"));
    opts.model = "smollm2-135m".into();
    opts.dense = false;
    opts.threads = 2;
    let rust = rag::assistant::Assistant::open(opts).unwrap();
    let ask = rag::assistant::AskOptions {
        max_tokens: 16,
        ..Default::default()
    };
    let want = rust
        .ask_with_context(question, screen, Some(system), &ask, &mut |_| true)
        .unwrap();
    assert_eq!(text, want.answer);
    assert_eq!(prompt_tokens, want.prompt_tokens);
    let bare = rust
        .ask_with_context(question, "", None, &ask, &mut |_| true)
        .unwrap();
    assert!(prompt_tokens > bare.prompt_tokens + 20);

    // Sampling through the ABI: the Rust API's answer for the same seed; bad values are
    // errors, not answers.
    let sampled_n = |temperature: f32, samples: u32, select: u32| {
        let mut opts = rag_ask_options_default();
        opts.max_tokens = 16;
        opts.temperature = temperature;
        opts.seed = 7;
        opts.samples = samples;
        opts.select = select;
        let mut error = null_mut();
        let answer = unsafe {
            rag_ask_with_context(
                a,
                q.as_ptr(),
                s.as_ptr(),
                sys.as_ptr(),
                &opts,
                None,
                null_mut(),
                null(),
                &mut error,
            )
        };
        if answer.is_null() {
            return Err(message(error));
        }
        let text = unsafe { CStr::from_ptr((*answer).text) }
            .to_str()
            .unwrap()
            .to_owned();
        unsafe { rag_answer_free(answer) };
        Ok(text)
    };
    let ask = rag::assistant::AskOptions {
        max_tokens: 16,
        sampling: rag::assistant::Sampling::new(1.2, 1.0, 7).unwrap(),
        ..Default::default()
    };
    let want = rust
        .ask_with_context(question, screen, Some(system), &ask, &mut |_| true)
        .unwrap();
    let sampled = |temperature: f32| sampled_n(temperature, 1, RAG_SELECT_VOTE);
    assert_eq!(sampled(1.2).unwrap(), want.answer);
    assert!(sampled(3.0).unwrap_err().contains("temperature"));
    assert!(sampled(-1.0).unwrap_err().contains("temperature"));
    // Several samples, one kept: the Rust API's choice for the same options.
    let ask = rag::assistant::AskOptions {
        samples: 4,
        select: rag::select::Selector::Logprob,
        ..ask
    };
    let want = rust
        .ask_with_context(question, screen, Some(system), &ask, &mut |_| true)
        .unwrap();
    assert_eq!(want.candidates.len(), 4);
    assert_eq!(sampled_n(1.2, 4, RAG_SELECT_LOGPROB).unwrap(), want.answer);
    assert!(sampled_n(1.2, 0, RAG_SELECT_VOTE)
        .unwrap_err()
        .contains("samples"));
    assert!(sampled_n(1.2, 17, RAG_SELECT_VOTE)
        .unwrap_err()
        .contains("samples"));
    assert!(sampled_n(1.2, 2, 9).unwrap_err().contains("select"));
    unsafe { rag_close(a) };
}

#[test]
fn bad_chats_are_reported_as_errors() {
    let dir = tempfile::tempdir().unwrap();
    let a = open_small_index(dir.path(), Some("no-such-model"));
    let chat = |messages: &[(&CString, *const c_char)], retrieve: bool| -> String {
        let list: Vec<RagChatMessage> = messages
            .iter()
            .map(|(role, content)| RagChatMessage {
                role: role.as_ptr(),
                content: *content,
            })
            .collect();
        let mut error = null_mut();
        let answer = unsafe {
            rag_chat(
                a,
                list.as_ptr(),
                list.len(),
                retrieve,
                null(),
                None,
                null_mut(),
                null(),
                &mut error,
            )
        };
        assert!(answer.is_null());
        message(error)
    };
    let (user, assistant, tool) = (
        CString::new("user").unwrap(),
        CString::new("assistant").unwrap(),
        CString::new("tool").unwrap(),
    );
    let hi = CString::new("Where does the heron nest?").unwrap();
    assert!(chat(&[], true).contains("no messages"));
    let unknown = chat(&[(&user, hi.as_ptr()), (&tool, hi.as_ptr())], false);
    assert!(
        unknown.contains("messages[1] has the unknown role \"tool\""),
        "{unknown}"
    );
    let null_content = chat(&[(&user, null())], false);
    assert!(
        null_content.contains("messages[0].content is NULL"),
        "{null_content}"
    );
    let last = chat(&[(&user, hi.as_ptr()), (&assistant, hi.as_ptr())], true);
    assert!(last.contains("last message must be the user's"), "{last}");
    // A valid chat gets as far as loading the model (which does not exist here).
    let no_model = chat(&[(&user, hi.as_ptr())], true);
    assert!(no_model.contains("no-such-model"), "{no_model}");

    let mut error = null_mut();
    let answer = unsafe {
        rag_chat(
            a,
            null(),
            1,
            true,
            null(),
            None,
            null_mut(),
            null(),
            &mut error,
        )
    };
    assert!(answer.is_null());
    assert!(message(error).contains("messages is NULL"));
    unsafe { rag_close(a) };
}
