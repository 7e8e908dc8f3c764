//! `POST /v1/chat/completions`: OpenAI's chat completion, whole or as server-sent events.
//!
//! A request is validated, takes a place in the generation queue (429 if full), and runs
//! [`rag::assistant::Assistant::chat`] on tokio's blocking pool; text comes back through a
//! channel, passes the stop-sequence matcher, and is sent or collected. When the client
//! goes away the handler (or the stream) is dropped: its guard cancels the generation and
//! the closed channel stops it at the next token either way.

use crate::error::{ApiError, ApiJson};
use crate::openai::{ChatRequest, Content, Message};
use crate::{AppState, NO_RETRIEVAL_SUFFIX};
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use graphs::chat::ChatMessage;
use rag::assistant::{Answer, AskOptions, CancelToken, Sampling};
use rag::prompt::{chat_role, CHAT_ROLES};
use rag::select::Candidate;
use rag::stop::StopMatcher;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// OpenAI's limit on stop sequences.
const MAX_STOPS: usize = 4;
/// Most choices a request may ask for (`n`): samples decoded together in one batch.
const MAX_CHOICES: u64 = 16;

/// A validated request.
struct Plan {
    model: String,
    messages: Vec<ChatMessage>,
    retrieve: bool,
    max_tokens: usize,
    sampling: Sampling,
    stops: Vec<String>,
    /// Choices (`n`): more than one are samples decoded together, each cut at the stops.
    n: usize,
    stream: bool,
    include_usage: bool,
}

enum GenEvent {
    Text(String),
    Done {
        answer: Box<Answer>,
        finish_reason: &'static str,
    },
    Failed(ApiError),
}

/// Cancels the generation when the request's future or stream is dropped (client gone).
struct CancelOnDrop(CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

pub(crate) async fn completions(
    State(app): State<Arc<AppState>>,
    ApiJson(req): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let plan = validate(&app, req)?;
    let ticket = app
        .generation
        .enter()
        .await
        .map_err(|_| ApiError::queue_full("chat completion"))?;
    let cancel = CancelToken::default();
    let guard = CancelOnDrop(cancel.clone());
    let (tx, rx) = unbounded_channel();
    let ask = AskOptions {
        top_k: app.opts.top_k,
        mode: app.opts.mode,
        context_tokens: app.opts.context_tokens,
        max_tokens: plan.max_tokens,
        sampling: plan.sampling,
        samples: plan.n,
        // One answer streams through the matcher below; several are cut each on its own.
        stop: if plan.n > 1 {
            plan.stops.clone()
        } else {
            Vec::new()
        },
        cancel: Some(cancel.clone()),
        ..AskOptions::default()
    };
    let several = plan.n > 1;
    let job_app = Arc::clone(&app);
    let (messages, retrieve, stops) = (plan.messages.clone(), plan.retrieve, plan.stops.clone());
    tokio::task::spawn_blocking(move || {
        let _ticket = ticket; // the slot is free once the generation has really ended
        let mut stop = StopMatcher::new(stops);
        let mut client_gone = false;
        let result = {
            let mut on_text = |piece: &str| {
                if several {
                    // The choices are the answer's candidates, sent at the end.
                    return true;
                }
                let shown = stop.push(piece);
                if !shown.is_empty() && tx.send(GenEvent::Text(shown)).is_err() {
                    client_gone = true;
                    return false;
                }
                !stop.stopped()
            };
            job_app
                .assistant
                .chat(&messages, retrieve, &ask, &mut on_text)
        };
        let counters = &job_app.counters;
        let event = match result {
            Ok(answer) => {
                counters
                    .tokens
                    .fetch_add(answer.tokens_generated as u64, Ordering::SeqCst);
                let rest = stop.finish();
                if !rest.is_empty() && tx.send(GenEvent::Text(rest)).is_err() {
                    client_gone = true;
                }
                if client_gone || cancel.is_cancelled() {
                    counters.cancelled.fetch_add(1, Ordering::SeqCst);
                } else {
                    counters.completed.fetch_add(1, Ordering::SeqCst);
                }
                let finish_reason = if !stop.stopped() && answer.tokens_generated >= ask.max_tokens
                {
                    "length"
                } else {
                    "stop"
                };
                GenEvent::Done {
                    answer: Box::new(answer),
                    finish_reason,
                }
            }
            Err(e) => {
                counters.failed.fetch_add(1, Ordering::SeqCst);
                GenEvent::Failed(generation_error(&e))
            }
        };
        let _ = tx.send(event);
    });
    if plan.stream {
        Ok(stream(app, plan, rx, guard).into_response())
    } else {
        collect(app, plan, rx, guard).await
    }
}

/// Errors of the generation as OpenAI reports them: an over-long prompt is the client's.
fn generation_error(e: &anyhow::Error) -> ApiError {
    let message = format!("{e:#}");
    // `Assistant::generate` refuses a prompt that leaves no room in the context.
    if message.contains("the context holds") {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request("messages", message)
        }
    } else {
        ApiError::internal(message)
    }
}

fn validate(app: &AppState, req: ChatRequest) -> Result<Plan, ApiError> {
    let retrieval_model = if req.model == app.model_id {
        true
    } else if req.model.strip_suffix(NO_RETRIEVAL_SUFFIX) == Some(app.model_id.as_str()) {
        false
    } else {
        return Err(ApiError::model_not_found(&req.model, &app.model_ids()));
    };
    let retrieve = retrieval_model && req.retrieval.unwrap_or(true);
    if req.messages.is_empty() {
        return Err(ApiError::bad_request(
            "messages",
            "messages must not be empty",
        ));
    }
    let messages = req
        .messages
        .into_iter()
        .map(chat_message)
        .collect::<Result<Vec<_>, _>>()?;
    if retrieve && messages.last().is_some_and(|m| m.role != "user") {
        return Err(ApiError::bad_request(
            "messages",
            "with retrieval the last message must be the user's (the search query); \
             use the model `<id>:no-retrieval` or \"retrieval\": false otherwise",
        ));
    }
    let n = req.n.unwrap_or(1);
    if !(1..=MAX_CHOICES).contains(&n) {
        return Err(ApiError::bad_request(
            "n",
            format!("n must be between 1 and {MAX_CHOICES}"),
        ));
    }
    let limit = app.opts.max_tokens_limit;
    let max_tokens = match req.max_completion_tokens.or(req.max_tokens) {
        None => app.opts.default_max_tokens.min(limit),
        Some(0) => {
            return Err(ApiError::bad_request(
                "max_tokens",
                "max_tokens must be > 0",
            ))
        }
        Some(n) if n > limit as u64 => {
            return Err(ApiError::bad_request(
                "max_tokens",
                format!("max_tokens is {n}, but this server allows at most {limit}"),
            ))
        }
        Some(n) => n as usize,
    };
    let stops = req.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stops.len() > MAX_STOPS {
        return Err(ApiError::bad_request(
            "stop",
            format!("at most {MAX_STOPS} stop sequences"),
        ));
    }
    // Greedy unless a temperature above 0 is asked for or configured (docs/server.md);
    // a request without a seed gets the configured one, else a fresh one as OpenAI's do.
    let temperature = req
        .temperature
        .unwrap_or(app.opts.default_temperature as f64);
    if !(0.0..=2.0).contains(&temperature) || temperature.is_nan() {
        return Err(ApiError::bad_request(
            "temperature",
            "temperature must be between 0 and 2",
        ));
    }
    let top_p = req.top_p.unwrap_or(app.opts.default_top_p as f64);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request("top_p", "top_p must be in (0, 1]"));
    }
    let seed = req
        .seed
        .map(|s| s as u64)
        .or(app.opts.default_seed)
        .unwrap_or_else(Sampling::fresh_seed);
    // Both are in range, so the checked constructor cannot refuse them (a top_p
    // below f32's range rounds up to its smallest positive value).
    let sampling = Sampling::new(
        temperature as f32,
        (top_p as f32).max(f32::MIN_POSITIVE),
        seed,
    )
    .map_err(|e| ApiError::bad_request("temperature", e.to_string()))?;
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::bad_request("tools", "tools are not supported"));
    }
    if let Some(f) = &req.response_format {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::bad_request(
                "response_format",
                "only the text response format is supported",
            ));
        }
    }
    Ok(Plan {
        model: req.model,
        messages,
        retrieve,
        max_tokens,
        sampling,
        stops,
        n: n as usize,
        stream: req.stream,
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
    })
}

fn chat_message(m: Message) -> Result<ChatMessage, ApiError> {
    let Some(role) = chat_role(&m.role) else {
        return Err(ApiError::bad_request(
            "messages",
            format!("unsupported role `{}` ({CHAT_ROLES})", m.role),
        ));
    };
    let content = match m.content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => {
            let mut texts = Vec::new();
            for p in parts {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => texts.push(t),
                    (kind, _) => {
                        return Err(ApiError::bad_request(
                            "messages",
                            format!("unsupported content part `{kind}`: only text"),
                        ))
                    }
                }
            }
            texts.join("\n")
        }
    };
    Ok(ChatMessage {
        role: role.into(),
        content,
    })
}

fn usage(a: &Answer) -> Value {
    // Every choice's tokens count, as OpenAI counts them.
    let completion = if a.candidates.is_empty() {
        a.tokens_generated
    } else {
        a.candidates.iter().map(|c| c.tokens).sum()
    };
    json!({
        "prompt_tokens": a.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": a.prompt_tokens + completion,
    })
}

/// Why choice `c` of several ended: its token budget, or a stop (end of text or sequence).
fn choice_finish(c: &Candidate, max_tokens: usize) -> &'static str {
    if c.tokens >= max_tokens {
        "length"
    } else {
        "stop"
    }
}

async fn collect(
    app: Arc<AppState>,
    plan: Plan,
    mut rx: UnboundedReceiver<GenEvent>,
    guard: CancelOnDrop,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(event) = rx.recv().await {
        match event {
            GenEvent::Text(t) => text.push_str(&t),
            GenEvent::Failed(e) => return Err(e),
            GenEvent::Done {
                answer,
                finish_reason,
            } => {
                drop(guard);
                let choices: Vec<Value> = if answer.candidates.is_empty() {
                    vec![json!({
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": null,
                        "finish_reason": finish_reason,
                    })]
                } else {
                    answer
                        .candidates
                        .iter()
                        .enumerate()
                        .map(|(i, c)| {
                            json!({
                                "index": i,
                                "message": {"role": "assistant", "content": c.text},
                                "logprobs": null,
                                "finish_reason": choice_finish(c, plan.max_tokens),
                            })
                        })
                        .collect()
                };
                let body = json!({
                    "id": app.next_id("chatcmpl"),
                    "object": "chat.completion",
                    "created": now(),
                    "model": plan.model,
                    "choices": choices,
                    "usage": usage(&answer),
                    "sources": crate::printed_value(&answer.sources),
                });
                return Ok(Json(body).into_response());
            }
        }
    }
    Err(ApiError::internal("the generation ended without an answer"))
}

/// What the SSE stream still has to send.
enum Phase {
    Role,
    Body,
    Finished(Vec<Event>),
}

struct StreamState {
    rx: UnboundedReceiver<GenEvent>,
    _guard: CancelOnDrop,
    phase: Phase,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    max_tokens: usize,
}

impl StreamState {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        self.chunk_of(0, delta, finish_reason)
    }

    /// A chunk of choice `index`.
    fn chunk_of(&self, index: usize, delta: Value, finish_reason: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": index,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        })
    }

    /// The events that end a stream: the last chunk (finish reason and sources), the usage
    /// chunk if asked for, and `[DONE]`.
    fn ending(&self, answer: &Answer, finish_reason: &str) -> Vec<Event> {
        let mut events = Vec::new();
        let mut last = if answer.candidates.is_empty() {
            self.chunk(json!({}), Some(finish_reason))
        } else {
            // Several choices arrive whole at the end: choice 0 had its role already.
            let n = answer.candidates.len();
            for (i, c) in answer.candidates.iter().enumerate() {
                let delta = if i == 0 {
                    json!({"content": c.text})
                } else {
                    json!({"role": "assistant", "content": c.text})
                };
                events.push(data(&self.chunk_of(i, delta, None)));
            }
            for (i, c) in answer.candidates.iter().enumerate().take(n - 1) {
                let why = choice_finish(c, self.max_tokens);
                events.push(data(&self.chunk_of(i, json!({}), Some(why))));
            }
            let c = &answer.candidates[n - 1];
            self.chunk_of(n - 1, json!({}), Some(choice_finish(c, self.max_tokens)))
        };
        last["sources"] = crate::printed_value(&answer.sources);
        events.push(data(&last));
        if self.include_usage {
            let mut u = self.chunk(json!({}), None);
            u["choices"] = json!([]);
            u["usage"] = usage(answer);
            events.push(data(&u));
        }
        events.push(Event::default().data("[DONE]"));
        events
    }
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

fn stream(
    app: Arc<AppState>,
    plan: Plan,
    rx: UnboundedReceiver<GenEvent>,
    guard: CancelOnDrop,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let state = StreamState {
        rx,
        _guard: guard,
        phase: Phase::Role,
        id: app.next_id("chatcmpl"),
        created: now(),
        model: plan.model,
        include_usage: plan.include_usage,
        max_tokens: plan.max_tokens,
    };
    let events = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            match &mut st.phase {
                Phase::Role => {
                    st.phase = Phase::Body;
                    let first = st.chunk(json!({"role": "assistant", "content": ""}), None);
                    return Some((Ok(data(&first)), st));
                }
                Phase::Finished(rest) => {
                    if rest.is_empty() {
                        return None;
                    }
                    let e = rest.remove(0);
                    return Some((Ok(e), st));
                }
                Phase::Body => {
                    let event = match st.rx.recv().await {
                        Some(GenEvent::Text(t)) => data(&st.chunk(json!({"content": t}), None)),
                        Some(GenEvent::Done {
                            answer,
                            finish_reason,
                        }) => {
                            st.phase = Phase::Finished(st.ending(&answer, finish_reason));
                            continue;
                        }
                        Some(GenEvent::Failed(e)) => {
                            st.phase = Phase::Finished(Vec::new());
                            data(&e.body())
                        }
                        None => {
                            st.phase = Phase::Finished(Vec::new());
                            data(
                                &ApiError::internal("the generation ended without an answer")
                                    .body(),
                            )
                        }
                    };
                    return Some((Ok(event), st));
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(app.opts.keep_alive))
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
