"""Conversations: `Assistant.chat`, `chat_stream` and `Conversation` against `ask`, and
the follow-up searched with its subject (as rag/tests/assistant_chat.rs checks in Rust)."""

import threading
import time

import pytest

import ragkit

FIRST = "How do I do a factory reset of the Kestrel K2 console?"
FOLLOW_UP = "And how long does it take?"


def user(content):
    return {"role": "user", "content": content}


def ids(items):
    return [x.chunk_id for x in items]


def test_chat_with_one_question_is_ask(assistant):
    asked = assistant.ask(FIRST, max_tokens=20)
    pieces = []
    chatted = assistant.chat([user(FIRST)], max_tokens=20, on_text=pieces.append)
    assert chatted.answer == asked.answer
    assert "".join(pieces).strip() == chatted.answer
    assert chatted.prompt_tokens == asked.prompt_tokens
    assert ids(chatted.sources) == ids(asked.sources) and chatted.sources


def test_without_retrieval_chat_is_the_model_alone(assistant):
    plain = assistant.chat([user(FIRST)], retrieval=False, max_tokens=12)
    bare = assistant.ask_with_context(FIRST, "", max_tokens=12)
    assert plain.sources == []
    assert plain.answer == bare.answer and plain.prompt_tokens == bare.prompt_tokens
    # Without retrieval the last message need not be the user's.
    assert assistant.chat(
        [user(FIRST), {"role": "assistant", "content": "Hold"}], retrieval=False, max_tokens=4
    ).tokens_generated > 0


def test_follow_up_is_searched_with_the_question_before(assistant):
    first = assistant.chat([user(FIRST)], max_tokens=24)
    history = [user(FIRST), {"role": "assistant", "content": first.answer}, user(FOLLOW_UP)]
    second = assistant.chat(history, max_tokens=24)
    cited = ids(second.sources)
    with_subject = assistant.search(f"{FIRST}\n{FOLLOW_UP}", k=5)
    assert cited and cited == ids(with_subject)[: len(cited)]
    # Among them the reset instructions, which the follow-up searched alone does not find:
    # the history made the difference.
    reset = next(h.chunk_id for h in with_subject if "Hold both PAIR and MODE" in h.text)
    assert reset in cited
    assert reset not in ids(assistant.search(FOLLOW_UP, k=5))
    # The earlier exchange is in the prompt (the model alone: no sources to count).
    with_history = assistant.chat(history, retrieval=False, max_tokens=1)
    without = assistant.chat(history[2:], retrieval=False, max_tokens=1)
    assert with_history.prompt_tokens > without.prompt_tokens + 15


def test_system_messages_and_developer_reach_the_prompt(assistant):
    plain = assistant.chat([user(FIRST)], max_tokens=4)
    for role in ["system", "developer"]:
        told = assistant.chat(
            [{"role": role, "content": "Answer in one short sentence."}, user(FIRST)],
            max_tokens=4,
        )
        assert told.prompt_tokens > plain.prompt_tokens
        assert ids(told.sources) == ids(plain.sources)


def test_chat_stream_yields_the_chat_answer(assistant):
    history = [user(FIRST), {"role": "assistant", "content": "Hold PAIR and MODE."},
               user(FOLLOW_UP)]
    blocking = assistant.chat(history, max_tokens=24)
    stream = assistant.chat_stream(history, max_tokens=24)
    pieces = list(stream)
    assert len(pieces) > 1
    assert "".join(pieces).strip() == blocking.answer
    assert stream.answer.answer == blocking.answer
    assert ids(stream.answer.sources) == ids(blocking.sources)


def test_leaving_a_chat_stream_cancels(assistant):
    with assistant.chat_stream([user(FIRST)], max_tokens=200) as stream:
        for _ in stream:
            break
    list(stream)
    assert stream.answer.cancelled and stream.answer.tokens_generated < 200


def test_conversation_keeps_the_history_chat_is_given(assistant):
    conv = ragkit.Conversation(assistant)
    assert conv.messages == [] and conv.assistant is assistant
    first = conv.ask(FIRST, max_tokens=24)
    assert conv.messages == [user(FIRST), {"role": "assistant", "content": first.answer}]
    second = conv.ask(FOLLOW_UP, max_tokens=24)
    same = assistant.chat(
        [user(FIRST), {"role": "assistant", "content": first.answer}, user(FOLLOW_UP)],
        max_tokens=24,
    )
    assert second.answer == same.answer and ids(second.sources) == ids(same.sources)
    assert len(conv.messages) == 4 and "exchanges=2" in repr(conv)
    conv.reset()
    assert conv.messages == []


def test_conversation_system_message_and_bounded_history(assistant):
    conv = ragkit.Conversation(assistant, "Answer briefly.", max_exchanges=1)
    conv.ask(FIRST, max_tokens=4)
    conv.ask(FOLLOW_UP, max_tokens=4)
    roles = [m["role"] for m in conv.messages]
    assert roles == ["system", "user", "assistant"]
    assert conv.messages[0]["content"] == "Answer briefly."
    assert conv.messages[1]["content"] == FOLLOW_UP  # the older exchange was dropped
    conv.reset()
    assert [m["role"] for m in conv.messages] == ["system"]


def test_conversation_stream_keeps_only_finished_answers(assistant):
    conv = ragkit.Conversation(assistant)
    with conv.ask_stream(FIRST, max_tokens=200) as stream:
        for _ in stream:
            break
    list(stream)
    assert stream.answer.cancelled
    assert conv.messages == []  # an interrupted answer is not part of the conversation

    stream = conv.ask_stream(FIRST, max_tokens=16)
    text = "".join(stream).strip()
    assert text == stream.answer.answer and not stream.answer.cancelled
    assert conv.messages == [user(FIRST), {"role": "assistant", "content": text}]


def test_conversation_ask_cancelled_by_on_text_is_not_kept(assistant):
    conv = ragkit.Conversation(assistant)
    answer = conv.ask(FIRST, max_tokens=64, on_text=lambda piece: False)
    assert answer.cancelled and conv.messages == []


def test_chat_releases_the_gil(assistant):
    done = threading.Event()
    ticks = 0

    def generate():
        try:
            assistant.chat(
                [user("Count from 1 to 300, one number per line.")],
                retrieval=False,
                max_tokens=48,
            )
        finally:
            done.set()

    t = threading.Thread(target=generate)
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert ticks > 20


@pytest.mark.parametrize(
    "messages, error, message",
    [
        ([], ValueError, "messages is empty"),
        ((), ValueError, "messages is empty"),
        ([{"role": "tool", "content": "x"}], ValueError,
         r"messages\[0\] has the unknown role \"tool\" \(roles: system, developer, user, assistant\)"),
        ([user("a"), {"role": "User", "content": "b"}], ValueError, r"messages\[1\] has the unknown role"),
        ([{"role": "user", "content": 42}], TypeError, r"messages\[0\]\['content'\] must be a str, not int"),
        ([{"role": "user", "content": None}], TypeError, r"must be a str, not NoneType"),
        ([{"role": 1, "content": "x"}], TypeError, r"messages\[0\]\['role'\] must be a str"),
        ([{"content": "x"}], ValueError, r"messages\[0\] has no 'role'"),
        ([{"role": "user"}], ValueError, r"messages\[0\] has no 'content'"),
        ([("user", "x")], TypeError, r"messages\[0\] must be a dict with 'role' and 'content', not tuple"),
        ("How long?", TypeError, "messages must be a list of"),
        (user("How long?"), TypeError, "messages must be a list of"),
        (42, TypeError, "messages must be a list of"),
        ([user(FIRST), {"role": "assistant", "content": "x"}], ValueError,
         "the last message must be the user's question"),
    ],
)
def test_bad_messages_raise_clean_errors(assistant, messages, error, message):
    with pytest.raises(error, match=message):
        assistant.chat(messages, max_tokens=4)
    # The stream checks them at once, before any generation.
    with pytest.raises(error, match=message):
        assistant.chat_stream(messages, max_tokens=4)


def test_bad_chat_options_raise_value_error(assistant):
    with pytest.raises(ValueError, match="unknown search mode"):
        assistant.chat([user(FIRST)], mode="psychic")
    with pytest.raises(ValueError, match="unknown search mode"):
        ragkit.Conversation(assistant).ask(FIRST, mode="psychic")


def test_samples_and_stop_reach_chat_streams_and_conversations(assistant):
    kw = dict(max_tokens=12, temperature=1.0, seed=5, samples=3)
    asked = assistant.ask(FIRST, **kw)
    assert len(asked.candidates) == 3
    chatted = assistant.chat([user(FIRST)], **kw)
    assert chatted.answer == asked.answer
    assert [c.text for c in chatted.candidates] == [c.text for c in asked.candidates]
    streamed = "".join(assistant.chat_stream([user(FIRST)], **kw))
    assert streamed.strip() == asked.answer
    assert "".join(assistant.ask_stream(FIRST, **kw)).strip() == asked.answer
    conv = ragkit.Conversation(assistant)
    first = conv.ask(FIRST, **kw)
    assert first.answer == asked.answer and len(first.candidates) == 3
    assert conv.messages[-1]["content"] == first.answer
    # A stop sequence ends every sample before it.
    cut = conv.ask(FOLLOW_UP, max_tokens=12, stop=[" "])
    assert " " not in cut.answer.strip()
    with pytest.raises(ValueError, match="samples"):
        assistant.chat([user(FIRST)], max_tokens=4, samples=17)
    with pytest.raises(ValueError, match="select"):
        ragkit.Conversation(assistant).ask_stream(FIRST, samples=2, select="best")
