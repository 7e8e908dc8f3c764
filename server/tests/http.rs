//! The server on a real bound port with SmolLM2-135M and MiniLM over a tiny corpus written
//! here: OpenAI shapes (whole and streamed), retrieval and its sources, stop sequences and
//! limits, errors, the API key, the bounded queue (429), cancellation by disconnecting,
//! and concurrent clients getting exactly the answers they get alone.
//!
//! One `Assistant` (one loaded model) is shared by every server these tests start, as
//! many servers could share it; each server has its own queue and counters.

use rag::assistant::{Assistant, AssistantOptions};
use rag::{IndexOptions, SearchMode};
use rag_server::ServerOptions;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const MODEL: &str = "smollm2-135m";
const PLAIN: &str = "smollm2-135m:no-retrieval";

fn models_available() -> bool {
    let present = rag::models::resolve(MODEL).is_ok()
        && rag::models::resolve(rag::models::DEFAULT_EMBEDDER).is_ok();
    if !present && std::env::var("RAG_SKIP_MODEL_TESTS").as_deref() != Ok("1") {
        panic!("smollm2-135m or minilm-l6-v2 is missing: run scripts/fetch-model.sh smollm2-135m minilm-l6-v2");
    }
    present
}

/// The shared assistant over a three-file corpus (built once per test binary).
fn assistant() -> Arc<Assistant> {
    static A: OnceLock<Arc<Assistant>> = OnceLock::new();
    Arc::clone(A.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let docs = dir.join("docs");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::write(
            docs.join("reset.md"),
            "# Kestrel K2 console\n\n## Factory reset\n\nTo do a factory reset, hold both PAIR \
             and MODE for 10 seconds until the screen flashes white.\n",
        )
        .unwrap();
        std::fs::write(
            docs.join("warranty.md"),
            "# Warranty\n\nThe Kestrel K2 console has a warranty of 3 years. The solar panel \
             has a warranty of 5 years.\n",
        )
        .unwrap();
        std::fs::write(
            docs.join("herons.md"),
            "# Herons\n\nGrey herons nest in colonies called heronries, high in trees.\n",
        )
        .unwrap();
        let mut opts = AssistantOptions::new(dir.join("index"));
        opts.model = MODEL.into();
        opts.threads = 2;
        let a = Assistant::open(opts).unwrap();
        a.add_paths(&[docs], &IndexOptions::default(), &|_| {})
            .unwrap();
        a.load_model().unwrap();
        Arc::new(a)
    }))
}

/// A server on 127.0.0.1:<free port>, served by its own runtime thread until the process ends.
fn start(opts: ServerOptions) -> String {
    start_with(assistant(), opts)
}

fn start_with(assistant: Arc<Assistant>, opts: ServerOptions) -> String {
    let router = rag_server::router(assistant, opts);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            rag_server::serve(listener, router, std::future::pending())
                .await
                .unwrap();
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    format!("http://{addr}")
}

fn default_server() -> String {
    start(ServerOptions {
        mode: SearchMode::Hybrid,
        ..ServerOptions::default()
    })
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .into()
}

/// POST JSON; the status and the body parsed as JSON.
fn post(url: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
    post_raw(url, &body.to_string(), key)
}

fn post_raw(url: &str, body: &str, key: Option<&str>) -> (u16, Value) {
    let mut req = agent().post(url).header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", &format!("Bearer {k}"));
    }
    let mut resp = req.send(body).unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn get(url: &str, key: Option<&str>) -> (u16, Value) {
    let mut req = agent().get(url);
    if let Some(k) = key {
        req = req.header("authorization", &format!("Bearer {k}"));
    }
    let mut resp = req.call().unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn chat(model: &str, question: &str, max_tokens: u64) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
    })
}

fn content(resp: &Value) -> String {
    resp["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content in {resp}"))
        .to_owned()
}

/// The `data:` payloads of an SSE response, in order.
fn stream_events(base: &str, body: &Value) -> Vec<String> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let resp = agent()
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .send(body.to_string())
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let reader = BufReader::new(resp.into_body().into_reader());
    reader
        .lines()
        .map(|l| l.unwrap())
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

/// Streamed text, the final chunk (finish reason, sources) and the usage chunk if any.
fn streamed(events: &[String]) -> (String, Value, Option<Value>) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut last = None;
    let mut usage = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"], "one id per stream");
        if c["choices"].as_array().unwrap().is_empty() {
            usage = Some(c["usage"].clone());
            continue;
        }
        assert!(last.is_none(), "text after the final chunk: {events:?}");
        let choice = &c["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if !choice["finish_reason"].is_null() {
            last = Some(c.clone());
        }
    }
    (text, last.expect("a final chunk with finish_reason"), usage)
}

#[test]
fn chat_answers_with_sources_usage_and_openai_shape() {
    if !models_available() {
        return;
    }
    let base = default_server();
    let q = "How do I do a factory reset of the Kestrel K2 console?";
    let (status, r) = post(
        &format!("{base}/v1/chat/completions"),
        &chat(MODEL, q, 24),
        None,
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["model"], MODEL);
    assert!(r["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert!(!content(&r).trim().is_empty());
    let finish = r["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(finish == "stop" || finish == "length", "{finish}");
    let sources = r["sources"].as_array().unwrap();
    assert!(!sources.is_empty(), "{r}");
    assert_eq!(sources[0]["number"], 1);
    assert!(
        sources[0]["path"].as_str().unwrap().ends_with("reset.md"),
        "the reset passage ranks first: {r}"
    );
    let usage = &r["usage"];
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!(completion > 0 && completion <= 24, "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + completion
    );
    // The retrieved passage is in the prompt: it is longer than the question alone.
    let (_, plain) = post(
        &format!("{base}/v1/chat/completions"),
        &chat(PLAIN, q, 4),
        None,
    );
    assert!(plain["sources"].as_array().unwrap().is_empty());
    assert!(
        usage["prompt_tokens"].as_u64().unwrap()
            > plain["usage"]["prompt_tokens"].as_u64().unwrap() + 20
    );
    // The request field turns retrieval off as the model suffix does.
    let mut body = chat(MODEL, q, 4);
    body["retrieval"] = json!(false);
    let (_, off) = post(&format!("{base}/v1/chat/completions"), &body, None);
    assert!(off["sources"].as_array().unwrap().is_empty());
    assert_eq!(
        off["usage"]["prompt_tokens"],
        plain["usage"]["prompt_tokens"]
    );
}

#[test]
fn a_stream_carries_the_same_answer_as_a_whole_response() {
    if !models_available() {
        return;
    }
    let base = default_server();
    let mut body = chat(
        MODEL,
        "How long is the warranty of the Kestrel K2 console?",
        20,
    );
    let (_, whole) = post(&format!("{base}/v1/chat/completions"), &body, None);
    body["stream_options"] = json!({"include_usage": true});
    let (text, last, usage) = streamed(&stream_events(&base, &body));
    assert_eq!(text, content(&whole));
    assert_eq!(
        last["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    assert_eq!(last["sources"], whole["sources"]);
    assert!(!last["sources"].as_array().unwrap().is_empty());
    assert_eq!(usage.expect("usage chunk"), whole["usage"]);
    // Without include_usage there is no usage chunk.
    body["stream_options"] = Value::Null;
    let (_, _, usage) = streamed(&stream_events(&base, &body));
    assert!(usage.is_none());
}

#[test]
fn max_tokens_stop_sequences_and_sampling_parameters() {
    if !models_available() {
        return;
    }
    let base = default_server();
    let url = format!("{base}/v1/chat/completions");
    let q = "Write a long story about a heron who lives by a lake.";
    let (_, r) = post(&url, &chat(PLAIN, q, 5), None);
    assert_eq!(r["choices"][0]["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 5);
    let (_, full) = post(&url, &chat(PLAIN, q, 24), None);
    let full = content(&full);
    // A stop sequence from the middle of the answer ends it just before.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 12, "{full:?}");
    let stop: String = chars[8..11].iter().collect();
    let expected = &full[..full.find(&stop).unwrap()];
    let mut body = chat(PLAIN, q, 24);
    body["stop"] = json!(["\u{1}never", stop]);
    let (_, r) = post(&url, &body, None);
    assert_eq!(content(&r), expected);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    let (text, last, _) = streamed(&stream_events(&base, &body));
    assert_eq!(text, expected);
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    // Temperature 0 is greedy whatever top_p and seed say; above 0 a seed makes the
    // sampled answer reproducible, streamed or not (docs/server.md).
    let mut body = chat(PLAIN, q, 24);
    body["temperature"] = json!(0);
    body["top_p"] = json!(0.5);
    body["seed"] = json!(7);
    let (status, r) = post(&url, &body, None);
    assert_eq!(status, 200);
    assert_eq!(content(&r), full);
    let mut sampled = Vec::new();
    for seed in [7, 8, 9] {
        let mut body = chat(PLAIN, q, 24);
        body["temperature"] = json!(1.2);
        body["seed"] = json!(seed);
        let (status, a) = post(&url, &body, None);
        assert_eq!(status, 200, "{a}");
        let (_, b) = post(&url, &body, None);
        assert_eq!(content(&a), content(&b), "seed {seed} is not reproducible");
        let (text, _, _) = streamed(&stream_events(&base, &body));
        assert_eq!(text, content(&a), "seed {seed}: stream differs");
        sampled.push(content(&a).to_string());
    }
    assert!(
        sampled.iter().any(|t| *t != full),
        "sampling at temperature 1.2 never left the greedy answer: {sampled:?}"
    );
    assert!(
        sampled[0] != sampled[1] || sampled[1] != sampled[2],
        "three seeds gave one answer: {sampled:?}"
    );
}

#[test]
fn n_gives_that_many_sampled_choices_the_first_being_the_single_answer() {
    if !models_available() {
        return;
    }
    let base = default_server();
    let url = format!("{base}/v1/chat/completions");
    let q = "Write a long story about a heron who lives by a lake.";
    let mut one = chat(PLAIN, q, 12);
    one["temperature"] = json!(1.1);
    one["seed"] = json!(5);
    let (_, single) = post(&url, &one, None);
    let mut body = one.clone();
    body["n"] = json!(3);
    let (status, r) = post(&url, &body, None);
    assert_eq!(status, 200, "{r}");
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let texts: Vec<String> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i);
            assert_eq!(c["message"]["role"], "assistant");
            assert!(c["finish_reason"] == "length" || c["finish_reason"] == "stop");
            c["message"]["content"].as_str().unwrap().to_owned()
        })
        .collect();
    // Sample 0 runs under the request's seed: the answer of the same request with n = 1.
    assert_eq!(texts[0], content(&single).trim());
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "{texts:?}");
    assert!(
        r["usage"]["completion_tokens"].as_u64().unwrap()
            > single["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // Reproducible, and streamed as chunks per choice index.
    let (_, again) = post(&url, &body, None);
    assert_eq!(again["choices"], r["choices"]);
    let events = stream_events(&base, &body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut by_index = vec![String::new(); 3];
    let mut finished = [false; 3];
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        for ch in c["choices"].as_array().unwrap() {
            let i = ch["index"].as_u64().unwrap() as usize;
            assert!(!finished[i], "text after choice {i} finished");
            if let Some(t) = ch["delta"]["content"].as_str() {
                by_index[i].push_str(t);
            }
            finished[i] |= !ch["finish_reason"].is_null();
        }
    }
    assert_eq!(by_index, texts);
    assert!(finished.iter().all(|&f| f));
    // Stop sequences cut every choice.
    body["stop"] = json!([" "]);
    let (_, cut) = post(&url, &body, None);
    for c in cut["choices"].as_array().unwrap() {
        assert!(
            !c["message"]["content"].as_str().unwrap().contains(' '),
            "{cut}"
        );
    }
}

fn assert_error(status: u16, body: &Value, want_status: u16, kind: &str, param: Option<&str>) {
    assert_eq!(status, want_status, "{body}");
    let e = &body["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(e["type"], kind, "{body}");
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}");
    }
}

#[test]
fn bad_requests_get_openai_errors_with_the_right_status() {
    if !models_available() {
        return;
    }
    let base = start(ServerOptions {
        max_body_bytes: 4096,
        max_tokens_limit: 64,
        ..ServerOptions::default()
    });
    let url = format!("{base}/v1/chat/completions");
    let bad = "invalid_request_error";
    let (s, b) = post(&url, &chat("gpt-4o", "hi", 4), None);
    assert_error(s, &b, 404, bad, Some("model"));
    assert_eq!(b["error"]["code"], "model_not_found");
    let (s, b) = post(&url, &chat(MODEL, "hi", 65), None);
    assert_error(s, &b, 400, bad, Some("max_tokens"));
    let (s, b) = post(&url, &chat(MODEL, "hi", 0), None);
    assert_error(s, &b, 400, bad, Some("max_tokens"));
    let (s, b) = post(&url, &json!({"model": MODEL, "messages": []}), None);
    assert_error(s, &b, 400, bad, Some("messages"));
    let (s, b) = post(
        &url,
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]}),
        None,
    );
    assert_error(s, &b, 400, bad, Some("messages"));
    let (s, b) = post(
        &url,
        &json!({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}),
        None,
    );
    assert_error(s, &b, 400, bad, Some("messages"));
    let (s, b) = post(
        &url,
        &json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
        None,
    );
    assert_error(s, &b, 400, bad, Some("messages"));
    for (field, value) in [
        ("temperature", json!(2.5)),
        ("top_p", json!(0)),
        ("n", json!(17)),
        ("n", json!(0)),
        ("stop", json!(["a", "b", "c", "d", "e"])),
        ("tools", json!([{"type": "function"}])),
        ("response_format", json!({"type": "json_object"})),
    ] {
        let mut body = chat(MODEL, "hi", 4);
        body[field] = value;
        let (s, b) = post(&url, &body, None);
        assert_error(s, &b, 400, bad, Some(field));
    }
    let (s, b) = post_raw(&url, "{not json", None);
    assert_error(s, &b, 400, bad, None);
    let (s, b) = post_raw(&url, r#"{"model": "x"}"#, None);
    assert_error(s, &b, 400, bad, None);
    let big = chat(MODEL, &"word ".repeat(2000), 4);
    let (s, b) = post(&url, &big, None);
    assert_error(s, &b, 413, bad, None);
    let (s, b) = get(&format!("{base}/v1/nothing"), None);
    assert_error(s, &b, 404, bad, None);
    let (s, b) = get(&url, None);
    assert_error(s, &b, 405, bad, None);
    // Content parts of type text are accepted and joined.
    let (s, b) = post(
        &url,
        &json!({"model": PLAIN, "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi"}]}]}),
        None,
    );
    assert_eq!(s, 200, "{b}");
}

#[test]
fn the_api_key_guards_every_endpoint_but_health() {
    if !models_available() {
        return;
    }
    let base = start(ServerOptions {
        api_key: Some("s3cret".into()),
        ..ServerOptions::default()
    });
    for key in [None, Some("wrong"), Some("S3CRET"), Some("s3cret2")] {
        let (s, b) = get(&format!("{base}/v1/models"), key);
        assert_error(s, &b, 401, "invalid_request_error", None);
        assert_eq!(b["error"]["code"], "invalid_api_key");
        let (s, _) = post(
            &format!("{base}/v1/chat/completions"),
            &chat(PLAIN, "hi", 2),
            key,
        );
        assert_eq!(s, 401);
        let (s, _) = post(
            &format!("{base}/v1/search"),
            &json!({"query": "reset"}),
            key,
        );
        assert_eq!(s, 401);
    }
    let (s, b) = get(&format!("{base}/v1/models"), Some("s3cret"));
    assert_eq!(s, 200);
    let ids: Vec<&str> = b["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [MODEL, PLAIN, "minilm-l6-v2"]);
    let (s, b) = get(&format!("{base}/v1/models/{PLAIN}"), Some("s3cret"));
    assert_eq!((s, b["id"].as_str()), (200, Some(PLAIN)));
    let (s, _) = get(&format!("{base}/v1/models/nope"), Some("s3cret"));
    assert_eq!(s, 404);
    let (s, b) = get(&format!("{base}/health"), None);
    assert_eq!((s, b["status"].as_str()), (200, Some("ok")));
}

#[test]
fn search_gives_the_hits_of_rag_search_json() {
    if !models_available() {
        return;
    }
    let base = default_server();
    let a = assistant();
    for mode in [SearchMode::Hybrid, SearchMode::Bm25, SearchMode::Dense] {
        let name = format!("{mode:?}").to_lowercase();
        let (s, b) = post(
            &format!("{base}/v1/search"),
            &json!({"query": "factory reset", "top_k": 2, "mode": name}),
            None,
        );
        assert_eq!(s, 200, "{b}");
        // `rag search --json` prints exactly this serialization of `Index::search`.
        let hits = a.retrieve("factory reset", 2, mode).unwrap();
        let want: Value = serde_json::from_str(&serde_json::to_string(&hits).unwrap()).unwrap();
        assert_eq!(b["data"], want);
        assert_eq!(b["mode"], name.as_str());
        assert!(b["data"][0]["path"].as_str().unwrap().ends_with("reset.md"));
    }
    let (s, b) = post(
        &format!("{base}/v1/search"),
        &json!({"query": "x", "mode": "fuzzy"}),
        None,
    );
    assert_error(s, &b, 400, "invalid_request_error", Some("mode"));
    let (s, b) = post(&format!("{base}/v1/search"), &json!({"query": " "}), None);
    assert_error(s, &b, 400, "invalid_request_error", Some("query"));
}

#[test]
fn embeddings_are_the_index_embedders_as_floats_or_base64() {
    if !models_available() {
        return;
    }
    let base = default_server();
    let url = format!("{base}/v1/embeddings");
    let texts = ["grey herons", "factory reset of the console"];
    let (s, b) = post(
        &url,
        &json!({"model": "minilm-l6-v2", "input": texts}),
        None,
    );
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["object"], "list");
    assert_eq!(b["model"], "minilm-l6-v2");
    assert!(b["usage"]["prompt_tokens"].as_u64().unwrap() >= 8);
    let want = assistant()
        .index()
        .embedder()
        .unwrap()
        .embed_batch(&texts)
        .unwrap();
    let data = b["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        let v: Vec<f32> = serde_json::from_value(d["embedding"].clone()).unwrap();
        assert_eq!(v, want[i]);
    }
    let (_, b) = post(
        &url,
        &json!({"model": "minilm-l6-v2", "input": texts[1], "encoding_format": "base64"}),
        None,
    );
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let v: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(v, want[1]);
    let bad = "invalid_request_error";
    let (s, b) = post(&url, &json!({"model": MODEL, "input": "x"}), None);
    assert_error(s, &b, 404, bad, Some("model"));
    let (s, b) = post(&url, &json!({"model": "minilm-l6-v2", "input": ""}), None);
    assert_error(s, &b, 400, bad, Some("input"));
    let (s, b) = post(
        &url,
        &json!({"model": "minilm-l6-v2", "input": [1, 2]}),
        None,
    );
    assert_error(s, &b, 400, bad, Some("input"));
    let (s, b) = post(
        &url,
        &json!({"model": "minilm-l6-v2", "input": "x", "dimensions": 8}),
        None,
    );
    assert_error(s, &b, 400, bad, Some("dimensions"));
}

/// A streamed request over a raw socket, returned once its first content chunk arrived
/// (so its generation is running).
fn open_stream(base: &str, body: &Value) -> TcpStream {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut body = body.clone();
    body["stream"] = json!(true);
    let body = body.to_string();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"content\":\"") || count(&seen) < 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

fn count(seen: &[u8]) -> usize {
    String::from_utf8_lossy(seen).matches("data: ").count()
}

fn health(base: &str) -> Value {
    get(&format!("{base}/health"), None).1
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A prompt SmolLM2 answers at length (it does not stop by itself within the budget).
fn long_request() -> Value {
    chat(
        PLAIN,
        "Write a long story about a heron who lives by a lake.",
        2000,
    )
}

#[test]
fn a_client_that_disconnects_cancels_its_generation() {
    if !models_available() {
        return;
    }
    let base = start(ServerOptions {
        max_tokens_limit: 4000,
        keep_alive: Duration::from_millis(200),
        ..ServerOptions::default()
    });
    // The prompt really runs long: cut by the token limit, not ended by the model.
    let mut probe = long_request();
    probe["max_tokens"] = json!(300);
    let (_, r) = post(&format!("{base}/v1/chat/completions"), &probe, None);
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    let before = health(&base)["generations"]["tokens"].as_u64().unwrap();
    let s = open_stream(&base, &long_request());
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    wait_for("the cancelled generation", Duration::from_secs(60), || {
        health(&base)["generations"]["cancelled"] == 1
    });
    let h = health(&base);
    let tokens = h["generations"]["tokens"].as_u64().unwrap() - before;
    assert!(
        tokens < 150,
        "the generation went on for {tokens} tokens: {h}"
    );
    assert_eq!(h["generations"]["completed"], 1, "{h}");
    assert_eq!(h["generation_queue"]["running"], 0, "{h}");

    // The same for a client waiting for a whole (not streamed) answer.
    let before = h["generations"]["tokens"].as_u64().unwrap();
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    let body = long_request().to_string();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    wait_for("the whole answer to start", Duration::from_secs(60), || {
        health(&base)["generation_queue"]["running"] == 1
    });
    std::thread::sleep(Duration::from_millis(100));
    s.shutdown(std::net::Shutdown::Both).unwrap();
    drop(s);
    wait_for(
        "the second cancelled generation",
        Duration::from_secs(60),
        || health(&base)["generations"]["cancelled"] == 2,
    );
    let h = health(&base);
    let tokens = h["generations"]["tokens"].as_u64().unwrap() - before;
    assert!(
        tokens < 300,
        "the generation went on for {tokens} tokens: {h}"
    );
    assert_eq!(h["generations"]["completed"], 1, "{h}");
    // The slot is free: the next client is answered.
    let (s, b) = post(
        &format!("{base}/v1/chat/completions"),
        &chat(PLAIN, "Hi", 4),
        None,
    );
    assert_eq!(s, 200, "{b}");
}

#[test]
fn a_full_queue_answers_429_and_the_queue_runs_in_order() {
    if !models_available() {
        return;
    }
    let base = start(ServerOptions {
        max_tokens_limit: 4000,
        queue_waiting: 1,
        ..ServerOptions::default()
    });
    let running = open_stream(&base, &long_request());
    let waiting = {
        let base = base.clone();
        std::thread::spawn(move || {
            post(
                &format!("{base}/v1/chat/completions"),
                &chat(PLAIN, "Hi", 4),
                None,
            )
        })
    };
    wait_for("a waiting request", Duration::from_secs(20), || {
        health(&base)["generation_queue"]["waiting"] == 1
    });
    let (s, b) = post(
        &format!("{base}/v1/chat/completions"),
        &chat(PLAIN, "Hi", 4),
        None,
    );
    assert_error(s, &b, 429, "rate_limit_error", None);
    // Leaving frees the slot for the one that waited.
    drop(running);
    let (s, b) = waiting.join().unwrap();
    assert_eq!(s, 200, "{b}");
}

#[test]
fn concurrent_clients_get_the_answers_they_get_alone() {
    if !models_available() {
        return;
    }
    let base = default_server();
    let questions = [
        (
            MODEL,
            "How do I do a factory reset of the Kestrel K2 console?",
        ),
        (PLAIN, "Name three colours."),
        (MODEL, "Where do grey herons nest?"),
        (PLAIN, "What is 2 + 2?"),
        (MODEL, "How long is the warranty of the solar panel?"),
        (PLAIN, "Write a haiku about rain."),
    ];
    let alone: Vec<String> = questions
        .iter()
        .map(|(m, q)| {
            content(
                &post(
                    &format!("{base}/v1/chat/completions"),
                    &chat(m, q, 16),
                    None,
                )
                .1,
            )
        })
        .collect();
    let handles: Vec<_> = questions
        .iter()
        .enumerate()
        .map(|(i, (m, q))| {
            let (base, body) = (base.clone(), chat(m, q, 16));
            std::thread::spawn(move || {
                if i % 2 == 0 {
                    streamed(&stream_events(&base, &body)).0
                } else {
                    content(&post(&format!("{base}/v1/chat/completions"), &body, None).1)
                }
            })
        })
        .collect();
    for ((h, want), (_, q)) in handles.into_iter().zip(&alone).zip(&questions) {
        assert_eq!(&h.join().unwrap(), want, "{q}");
    }
    assert_eq!(
        health(&base)["generations"]["completed"],
        2 * questions.len()
    );
}

#[test]
fn searches_stay_whole_while_another_writer_reindexes() {
    // BM25 only: no model is loaded for search, so this needs none.
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    let write_docs = |docs: &std::path::Path, round: usize| {
        for i in 0..20 {
            std::fs::write(
                docs.join(format!("heron-{i}.md")),
                format!(
                    "# Heron {i}\n\nRound {round}: grey heron number {i} fishes in the lake.\n"
                ),
            )
            .unwrap();
        }
    };
    write_docs(&docs, 0);
    let index_dir = dir.path().join("index");
    let mut opts = AssistantOptions::new(&index_dir);
    opts.dense = false;
    let a = Arc::new(Assistant::open(opts).unwrap());
    a.add_paths(
        std::slice::from_ref(&docs),
        &IndexOptions::default(),
        &|_| {},
    )
    .unwrap();
    let base = start_with(
        a,
        ServerOptions {
            mode: SearchMode::Bm25,
            ..ServerOptions::default()
        },
    );
    // Another index handle rewrites every document and adds new ones, as `rag index` in
    // another process would, while clients search.
    let writer = {
        let (docs, index_dir) = (docs.clone(), index_dir.clone());
        std::thread::spawn(move || {
            let index = rag::Index::open(&index_dir, None).unwrap();
            for round in 1..=3 {
                write_docs(&docs, round);
                std::fs::write(
                    docs.join(format!("otters-{round}.md")),
                    "# Otters\n\nOtters hold hands while they sleep.\n",
                )
                .unwrap();
                index
                    .add_paths(
                        std::slice::from_ref(&docs),
                        &IndexOptions::default(),
                        &|_| {},
                    )
                    .unwrap();
            }
        })
    };
    let (mut searches, mut short) = (0, 0);
    while !writer.is_finished() || searches == 0 {
        let (s, b) = post(
            &format!("{base}/v1/search"),
            &json!({"query": "grey heron lake", "top_k": 5}),
            None,
        );
        assert_eq!(s, 200, "{b}");
        let hits = b["data"].as_array().unwrap();
        // While a rewritten document's new chunks are committed to the store but not yet
        // to BM25, its old hits are dropped (rag/README.md): fewer hits, never wrong ones.
        if hits.len() < 5 {
            short += 1;
        }
        for h in hits {
            let text = h["text"].as_str().unwrap();
            assert!(text.contains("grey heron number"), "{h}");
            assert!(h["path"].as_str().unwrap().contains("heron-"), "{h}");
        }
        searches += 1;
    }
    writer.join().unwrap();
    eprintln!("{searches} searches during re-indexing, {short} with fewer than 5 hits");
    let (_, b) = post(
        &format!("{base}/v1/search"),
        &json!({"query": "grey heron lake", "top_k": 5}),
        None,
    );
    assert_eq!(b["data"].as_array().unwrap().len(), 5, "{b}");
    let (_, b) = post(
        &format!("{base}/v1/search"),
        &json!({"query": "otters sleep", "top_k": 3}),
        None,
    );
    let paths: Vec<&str> = b["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 3, "{b}");
    assert!(paths.iter().all(|p| p.contains("otters-")), "{paths:?}");
    let (_, b) = post(
        &format!("{base}/v1/search"),
        &json!({"query": "heron", "top_k": 1}),
        None,
    );
    assert!(
        b["data"][0]["text"].as_str().unwrap().contains("Round 3"),
        "{b}"
    );
}

#[test]
fn a_prompt_longer_than_the_context_is_the_clients_error() {
    if !models_available() {
        return;
    }
    let base = default_server();
    // ~6000 tokens against the 4096-token context.
    let (s, b) = post(
        &format!("{base}/v1/chat/completions"),
        &chat(PLAIN, &"heron lake ".repeat(3000), 4),
        None,
    );
    assert_error(s, &b, 400, "invalid_request_error", Some("messages"));
    assert_eq!(b["error"]["code"], "context_length_exceeded");
}
