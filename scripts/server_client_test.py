"""Drives a running `rag serve` with the official `openai` Python client.

Usage: python server_client_test.py BASE_URL API_KEY   (run by scripts/test-server.sh)

The server must serve smollm2-135m over the three-file corpus test-server.sh writes
(reset.md, warranty.md, herons.md) with the minilm-l6-v2 embedder.
"""

import json
import math
import sys
import threading
import time
import traceback
import urllib.request

import openai
from openai import OpenAI

BASE, KEY = sys.argv[1], sys.argv[2]
MODEL = "smollm2-135m"
PLAIN = MODEL + ":no-retrieval"
EMBEDDER = "minilm-l6-v2"
RESET_Q = "How do I do a factory reset of the Kestrel K2 console?"
LONG_Q = "Write a long story about a heron who lives by a lake."

client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=300)
results = []


def test(fn):
    name = fn.__name__
    started = time.time()
    try:
        fn()
        results.append(True)
        print(f"ok    {name} ({time.time() - started:.1f} s)", flush=True)
    except Exception:
        results.append(False)
        print(f"FAIL  {name}", flush=True)
        traceback.print_exc()
    return fn


def health():
    with urllib.request.urlopen(BASE + "/health", timeout=30) as r:
        return json.load(r)


def ask(model, question, max_tokens, **kw):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        **kw,
    )


def ask_streamed(model, question, max_tokens):
    """Text, final chunk and usage chunk of a streamed answer."""
    stream = ask(
        model, question, max_tokens, stream=True, stream_options={"include_usage": True}
    )
    text, last, usage = "", None, None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        assert last is None, "text after the final chunk"
        text += chunk.choices[0].delta.content or ""
        if chunk.choices[0].finish_reason is not None:
            last = chunk
    assert last is not None, "no final chunk"
    return text, last, usage


@test
def models_are_listed():
    ids = [m.id for m in client.models.list()]
    assert ids == [MODEL, PLAIN, EMBEDDER], ids
    assert client.models.retrieve(PLAIN).id == PLAIN


@test
def chat_answers_with_sources():
    r = ask(MODEL, RESET_Q, 24)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content.strip(), r
    assert r.choices[0].finish_reason in ("stop", "length")
    assert 0 < r.usage.completion_tokens <= 24, r.usage
    sources = r.model_extra["sources"]
    assert sources and sources[0]["path"].endswith("reset.md"), sources
    plain = ask(PLAIN, RESET_Q, 4)
    assert plain.model_extra["sources"] == []


@test
def streamed_chat_equals_whole_chat():
    whole = ask(MODEL, RESET_Q, 24)
    text, last, usage = ask_streamed(MODEL, RESET_Q, 24)
    assert text == whole.choices[0].message.content, (text, whole)
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert last.model_extra["sources"] == whole.model_extra["sources"]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


@test
def stop_and_max_tokens():
    r = ask(PLAIN, LONG_Q, 5)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    full = ask(PLAIN, LONG_Q, 24).choices[0].message.content
    stop = full[8:11]
    r = ask(PLAIN, LONG_Q, 24, stop=[stop])
    assert r.choices[0].message.content == full[: full.index(stop)], (r, stop)
    assert r.choices[0].finish_reason == "stop"


@test
def temperature_and_seed():
    greedy = ask(PLAIN, LONG_Q, 24).choices[0].message.content
    zero = ask(PLAIN, LONG_Q, 24, temperature=0, seed=5).choices[0].message.content
    assert zero == greedy, (zero, greedy)
    answers = []
    for seed in (11, 12, 13):
        a = ask(PLAIN, LONG_Q, 24, temperature=1.2, seed=seed).choices[0].message.content
        b = ask(PLAIN, LONG_Q, 24, temperature=1.2, seed=seed).choices[0].message.content
        assert a == b, f"seed {seed} not reproducible: {a!r} vs {b!r}"
        answers.append(a)
    assert len(set(answers)) > 1, answers
    assert any(a != greedy for a in answers), answers


@test
def n_sampled_choices():
    one = ask(PLAIN, LONG_Q, 10, temperature=1.0, seed=21).choices[0].message.content
    r = ask(PLAIN, LONG_Q, 10, temperature=1.0, seed=21, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2], r.choices
    texts = [c.message.content for c in r.choices]
    assert texts[0] == one.strip(), (texts[0], one)
    assert len(set(texts)) > 1, texts
    assert all(c.finish_reason in ("stop", "length") for c in r.choices)
    # Streamed: the chunks of each choice index add up to that choice.
    parts = {}
    for chunk in client.chat.completions.create(
        model=PLAIN,
        messages=[{"role": "user", "content": LONG_Q}],
        max_tokens=10,
        temperature=1.0,
        seed=21,
        n=3,
        stream=True,
    ):
        for c in chunk.choices:
            parts[c.index] = parts.get(c.index, "") + (c.delta.content or "")
    assert [parts[i] for i in range(3)] == texts, (parts, texts)


@test
def embeddings_base64_and_float():
    texts = ["grey herons", "factory reset of the console"]
    # The client asks for base64 by default and decodes it itself.
    e = client.embeddings.create(model=EMBEDDER, input=texts)
    assert e.model == EMBEDDER and len(e.data) == 2
    for d in e.data:
        assert len(d.embedding) == 384
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1) < 1e-3
    f = client.embeddings.create(model=EMBEDDER, input=texts, encoding_format="float")
    for a, b in zip(e.data, f.data):
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding)) < 1e-6
    assert e.usage.prompt_tokens > 0


@test
def errors_are_openai_exceptions():
    bad = OpenAI(base_url=BASE + "/v1", api_key="wrong-" + KEY, max_retries=0)
    for call in (
        lambda: bad.models.list(),
        lambda: bad.chat.completions.create(
            model=PLAIN, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        ),
        lambda: bad.embeddings.create(model=EMBEDDER, input="x"),
    ):
        try:
            call()
            raise AssertionError("no 401")
        except openai.AuthenticationError as e:
            assert e.status_code == 401
    try:
        ask("gpt-4o", "hi", 2)
        raise AssertionError("no 404")
    except openai.NotFoundError as e:
        assert e.code == "model_not_found", e
    try:
        ask(PLAIN, "hi", 100000)
        raise AssertionError("no 400")
    except openai.BadRequestError as e:
        assert e.param == "max_tokens", e


@test
def concurrent_clients_and_one_that_disconnects():
    questions = [
        (MODEL, RESET_Q),
        (PLAIN, "Name three colours."),
        (MODEL, "Where do grey herons nest?"),
    ]
    alone = [ask(m, q, 16).choices[0].message.content for m, q in questions]
    before = health()["generations"]
    got, errors = [None] * len(questions), []

    def streamed(i):
        try:
            got[i] = ask_streamed(questions[i][0], questions[i][1], 16)
        except Exception as e:  # reported below
            errors.append(e)

    def leaver():
        try:
            stream = ask(PLAIN, LONG_Q, 2000, stream=True)
            for n, _ in enumerate(stream):
                if n == 3:
                    break
            stream.close()  # drops the connection mid-answer
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=leaver)]
    threads += [threading.Thread(target=streamed, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    for (text, _, _), want in zip(got, alone):
        assert text == want, (text, want)
    deadline = time.time() + 60
    while health()["generations"]["cancelled"] == before["cancelled"]:
        assert time.time() < deadline, "the disconnected client's generation was not cancelled"
        time.sleep(0.1)
    after = health()["generations"]
    assert after["completed"] - before["completed"] == len(questions), after
    # The leaver's tokens: everything generated minus the others' answers; far below 2000.
    others = sum(usage.completion_tokens for _, _, usage in got)
    left = after["tokens"] - before["tokens"] - others
    assert 0 < left < 300, f"the cancelled answer ran {left} tokens"


@test
def health_needs_no_key():
    h = health()
    assert h["status"] == "ok" and h["model"] == MODEL


failed = results.count(False)
print(f"openai-client: {len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
