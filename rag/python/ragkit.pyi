"""Private answers from your own documents, on your own device.

``ragkit`` is the Python binding of the Rust ``rag::Assistant``: an incrementally updated
local index (SQLite, BM25, dense vectors) and a small quantized LLM that answers questions
over it, citing its sources. Nothing leaves the machine.

Every call that reads files, embeds or generates releases the GIL; one ``Assistant`` can be
shared across threads (one generation runs at a time, retrieval does not wait for it).
Errors of the engine raise :class:`RagError` with the Rust error's message; bad argument
values raise ``ValueError``.

Example::

    import ragkit
    a = ragkit.Assistant(".rag-index", model="qwen2.5-coder-0.5b")
    a.add_paths(["examples/sample-corpus"])
    for piece in a.ask_stream("How long is the warranty?"):
        print(piece, end="", flush=True)
"""

from collections.abc import Callable, Iterator, Sequence
from os import PathLike
from types import TracebackType
from typing import Literal, Optional, TypedDict, Union

__version__: str
DEFAULT_MODEL: str
"""The model an ``Assistant`` uses when ``model`` is not given."""

StrPath = Union[str, "PathLike[str]"]

class Message(TypedDict):
    """One message of a chat, as in OpenAI's chat API (``developer`` is ``system``).

    A name for type checkers only: at run time messages are plain dicts.
    """

    role: Literal["system", "developer", "user", "assistant"]
    content: str

class RagError(Exception):
    """An error of the rag engine; the message is the Rust error with its causes."""

class Hit:
    """One retrieved passage."""

    chunk_id: int
    """Stable id of the chunk in the index."""
    path: str
    """The indexed file (absolute path)."""
    lines: Optional[tuple[int, int]]
    """First and last line of the passage (None for PDF pages and HTML)."""
    page: Optional[int]
    """PDF page (None otherwise)."""
    heading: Optional[str]
    """Markdown heading path of the passage, if any."""
    text: str
    score: float
    """Fused score (hybrid) or the single method's score."""
    bm25_rank: Optional[int]
    """1-based rank in the BM25 list, None if absent from it."""
    dense_rank: Optional[int]
    """1-based rank in the dense list, None if absent from it."""
    @property
    def location(self) -> str:
        """``path:10-24``, ``file.pdf#3`` or the bare path."""

class Source:
    """A passage put in the prompt, numbered as the answer cites it."""

    number: int
    """``[1]`` is the first."""
    path: str
    lines: Optional[tuple[int, int]]
    page: Optional[int]
    chunk_id: int
    score: float
    @property
    def location(self) -> str:
        """``path:10-24``, ``file.pdf#3`` or the bare path."""

class Timings:
    """Where the time of one answer went, in milliseconds."""

    retrieve_ms: float
    prefill_ms: float
    decode_ms: float
    decode_tok_s: float
    first_token_ms: float
    """From the start of the question to the first text (includes a first model load)."""
    switching: Optional[Switching]
    """Progressive prefill-to-decode graph switching under ``npu_memory_mb``; None when
    every graph stays resident."""

class Switching:
    """What progressive graph switching did during one answer's prefill."""

    schedule: str
    """The plan that ran: ``progressive-ls``, ``all-resident`` or ``decode-graphs``."""
    prefill_ms: float
    switch_ms: float
    """Loader time spent switching, hidden behind compute or not."""
    stall_ms: float
    """The part of the switching the prompt waited for."""
    switches: int
    """Blocks switched."""

class Speculation:
    """Speculative decoding's work on one answer (the text is the same in every mode)."""

    mode: str
    steps: int
    """Verification forwards."""
    mean_accepted: float
    """Tokens accepted per step."""

class Answer:
    """A finished answer. ``str(answer)`` is its text."""

    answer: str
    """The generated text, trimmed."""
    sources: list[Source]
    """The passages put in the prompt, in citation order (empty for ``ask_with_context``)."""
    timings: Timings
    tokens_generated: int
    prompt_tokens: int
    reused_prompt_tokens: int
    """Prompt tokens whose KV was reused (an earlier question's prefix, the cached prompt head)."""
    cancelled: bool
    """Stopped by the caller: ``on_text`` returned False, a stream was left or cancelled."""
    speculation: Speculation
    backend: str
    """Where the block graphs ran: ``cpu`` or ``qnn-htp``."""
    candidates: list[Candidate]
    """With ``samples`` > 1: every sample, the kept one among them (empty otherwise)."""

class Candidate:
    """One of several sampled answers."""

    text: str
    mean_logprob: float
    """Mean log-probability per generated token (natural log)."""
    votes: int
    """Samples that agree with this one, itself included (0 when its answer did not count)."""
    tokens: int
    verify: Optional[float]
    """With ``select="verify"``: the model's log-odds of "Yes" over "No" for this answer."""

class IndexSummary:
    """What one ``add_paths`` did."""

    files_seen: int
    files_indexed: int
    """New or changed files parsed this run."""
    files_unchanged: int
    files_removed: int
    skipped: dict[str, int]
    """Files that gave no chunks, by reason (unsupported, binary, too-large, ...)."""
    walk_errors: int
    chunks_added: int
    chunks_removed: int
    chunks_total: int
    chunks_embedded: int
    generation: int
    """The committed index generation."""
    elapsed_s: float

class AskStream(Iterator[str]):
    """An answer being generated (``ask_stream``, ``chat_stream``,
    ``Conversation.ask_stream``); iterate for its text pieces as they come.

    Leaving the loop early (``break``, an exception) cancels generation as soon as the
    stream is no longer referenced, as with ``for piece in a.ask_stream(q)``; ``cancel()``
    or a ``with`` block cancel at once whatever still holds a reference. After the last
    piece, ``answer`` holds the full :class:`Answer`. Iterating raises :class:`RagError`
    if generation failed.
    """

    def __iter__(self) -> AskStream: ...
    def __next__(self) -> str: ...
    def cancel(self) -> None:
        """Stop generating at the next token (the answer then has ``cancelled=True``)."""
    @property
    def answer(self) -> Optional[Answer]:
        """The full answer once iteration has ended, else None."""
    def __enter__(self) -> AskStream: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool:
        """Cancels whatever is still being generated."""

class Assistant:
    """An index plus a local LLM behind one thread-safe handle.

    Opening creates the index directory if needed and, with ``dense=True``, loads the
    embedding model (fetched on first use into ``$RAG_MODEL_DIR``, default
    ``~/.cache/rag/models``). The generation model is loaded on the first question (or by
    ``load_model``/``preload_model=True``).

    :param index_dir: the index directory (created if missing).
    :param model: a model name (``rag model list``; fetched on first use) or a GGUF path;
        default :data:`DEFAULT_MODEL`.
    :param spec: speculative decoding: ``none``, ``pld``, ``sam``, ``samcal``, ``samext`` or
        ``sdnpu``. The answer is identical in every mode; only speed differs.
    :param threads: compute threads, 0 for all cores.
    :param dense: hybrid retrieval with the MiniLM embedder; BM25 only if False.
    :param kv_capacity: KV slots of the generation session (prompt + answer).
    :param kv_cache: ``f32`` (exact) or ``f16`` (half the cache memory).
    :param backend: ``cpu`` or ``qnn`` (Qualcomm's HTP; its slow emulator on x86-64).
    :param preload_model: start loading the generation model in the background now.
    :param weights_cache: keep the model's repacked weights on disk between runs.
    :param npu_memory_mb: residency budget of the block graphs in MB: when a block's
        prefill and decode graphs do not fit together, the prefill switches each block from
        one to the other progressively (``Timings.switching``). None: the backend's default
        (QNN 4096, the CPU never switches). A budget below one form per block raises
        ``RagError`` when the model loads.
    :raises RagError: the index cannot be opened or the embedder cannot be loaded.
    :raises ValueError: an unknown ``spec``, ``kv_cache`` or ``backend``.
    """

    def __init__(
        self,
        index_dir: StrPath,
        *,
        model: Optional[str] = None,
        spec: str = "sdnpu",
        threads: int = 0,
        dense: bool = True,
        kv_capacity: int = 4096,
        kv_cache: str = "f32",
        backend: str = "cpu",
        preload_model: bool = False,
        weights_cache: bool = True,
        npu_memory_mb: Optional[int] = None,
    ) -> None: ...
    @property
    def model(self) -> str:
        """Name or path of the generation model."""
    @property
    def index_dir(self) -> str:
        """The index directory."""
    def add_paths(
        self,
        paths: Sequence[StrPath],
        *,
        progress: Optional[Callable[[str, int, int, Optional[str]], object]] = None,
    ) -> IndexSummary:
        """Add or update files and folders (incremental: unchanged files are not re-read).

        ``progress(phase, done, total, current)`` is called as work advances (phase is
        ``scan``, ``parse``, ``embed`` or ``finish``); an exception it raises is reported
        as unraisable and does not stop indexing.
        """
    def remove_path(self, path: StrPath) -> int:
        """Remove a file, or every file under a folder, from the index; returns the count."""
    def search(self, query: str, k: int = 5, *, mode: str = "hybrid") -> list[Hit]:
        """The ``k`` best passages for ``query``, best first.

        ``mode`` is ``hybrid`` (BM25 and dense fused), ``bm25`` or ``dense``.
        """
    def ask(
        self,
        question: str,
        *,
        top_k: int = 5,
        mode: str = "hybrid",
        context_tokens: int = 1024,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        samples: int = 1,
        select: str = "vote",
        stop: Optional[list[str]] = None,
        on_text: Optional[Callable[[str], object]] = None,
    ) -> Answer:
        """Retrieve, prompt with numbered sources, and generate the answer.

        Decoding is greedy at ``temperature`` 0 (the default); above it each token is drawn
        from the tempered softmax cut to the ``top_p`` nucleus, reproducibly for a given
        ``seed`` (a fresh one when ``None``). Speculative decoding does not change a
        sampled answer: it equals plain sampled decoding with the same seed.

        ``samples`` (1 to 16) answers are decoded together in one batch and ``select``
        keeps one: ``"vote"`` (the answer most samples agree on), ``"logprob"`` (the
        most confident) or ``"verify"`` (the one the model judges correct when asked
        after each); all are in ``Answer.candidates``, and the kept text reaches
        ``on_text`` in one piece. Sample 0 is the single answer with this ``seed``.
        ``stop`` sequences end the answer (each sample) before the first occurrence.

        ``on_text(piece)`` receives the text as it is generated; returning ``False`` stops
        generation (the answer then has ``cancelled=True``). An exception it raises, or
        Ctrl-C, stops generation and propagates. It must not ask this ``Assistant`` another
        question (one generation runs at a time: that call would wait forever).
        """
    def ask_stream(
        self,
        question: str,
        *,
        top_k: int = 5,
        mode: str = "hybrid",
        context_tokens: int = 1024,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        samples: int = 1,
        select: str = "vote",
        stop: Optional[list[str]] = None,
    ) -> AskStream:
        """Like ``ask``, but returns at once an iterator over the answer's text pieces.

        Generation runs on a background thread; breaking out of the loop cancels it. With
        ``samples`` > 1 the kept answer arrives as one piece once every sample is done.
        """
    def chat(
        self,
        messages: Sequence[Message],
        *,
        retrieval: bool = True,
        top_k: int = 5,
        mode: str = "hybrid",
        context_tokens: int = 1024,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        samples: int = 1,
        select: str = "vote",
        stop: Optional[list[str]] = None,
        on_text: Optional[Callable[[str], object]] = None,
    ) -> Answer:
        """Answer the last message of a chat, with the earlier turns in the prompt.

        ``messages`` are ``{"role": ..., "content": ...}`` dicts, oldest first: system
        messages, earlier questions and answers, the question last (as in OpenAI's chat
        API). With ``retrieval``, the last message must be the user's: passages are searched
        with it and the user's previous message (so that a follow-up such as "and how long
        does it take?" is searched with its subject) and the answer cites them as ``ask``
        does. Without, the messages go to the model as they are and ``sources`` is empty.
        ``on_text``, ``samples``, ``select`` and ``stop`` work as in ``ask``. :class:`Conversation` keeps the history for you.

        :raises ValueError: no messages, an unknown role, a message without ``role`` or
            ``content``, or (with ``retrieval``) a last message that is not the user's.
        :raises TypeError: ``messages`` is not a list of dicts, or a role or content is not
            a ``str``.
        """
    def chat_stream(
        self,
        messages: Sequence[Message],
        *,
        retrieval: bool = True,
        top_k: int = 5,
        mode: str = "hybrid",
        context_tokens: int = 1024,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        samples: int = 1,
        select: str = "vote",
        stop: Optional[list[str]] = None,
    ) -> AskStream:
        """Like ``chat``, but returns at once an iterator over the answer's text pieces.

        The messages are checked at once (same exceptions as ``chat``); generation runs on
        a background thread and breaking out of the loop cancels it.
        """
    def ask_with_context(
        self,
        question: str,
        context: str,
        system: Optional[str] = None,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        samples: int = 1,
        select: str = "vote",
        stop: Optional[list[str]] = None,
        on_text: Optional[Callable[[str], object]] = None,
    ) -> Answer:
        """Answer over caller-supplied ``context`` (a UI agent's screen) instead of retrieval.

        ``system`` optionally replaces the system message. The context is data: it is
        tokenized without special tokens. ``on_text``, ``samples``, ``select`` and
        ``stop`` work as in ``ask``.
        """
    def load_model(self) -> None:
        """Load the generation model now instead of on the first question."""
    def finish_background_work(self) -> None:
        """Wait for work that outlives an answer (writing the repacked-weights cache after
        the model's first load), so that the next process finds the cache."""

class Conversation:
    """A conversation with an :class:`Assistant`: each question is answered with the
    exchanges so far, so follow-ups may refer to earlier questions (``Assistant.chat``
    over the kept history, as ``rag chat`` does).

    An exchange is kept once its answer is complete; an answer that was cancelled (a
    callback returned False, a stream was left early) is not. Only the last
    ``max_exchanges`` exchanges are kept, so a long conversation never outgrows the
    context. Ask one question at a time: concurrent questions each see the history as it
    was when they were asked.

    Example::

        chat = ragkit.Conversation(a)
        print(chat.ask("How do I factory reset the console?"))
        print(chat.ask("And how long does it take?"))   # searched with the reset question

    :param assistant: the assistant that answers.
    :param system: a system message put first (with ``retrieval``, after the assistant's
        own instructions).
    :param retrieval: cite passages of the index (the default), or talk with the model only.
    :param max_exchanges: questions (with their answers) kept in the prompt.
    """

    def __init__(
        self,
        assistant: Assistant,
        system: Optional[str] = None,
        *,
        retrieval: bool = True,
        max_exchanges: int = 4,
    ) -> None: ...
    @property
    def assistant(self) -> Assistant:
        """The assistant that answers."""
    @property
    def messages(self) -> list[Message]:
        """What the next question follows: the system message (if any), then each kept
        exchange as a ``user`` and an ``assistant`` message."""
    def ask(
        self,
        question: str,
        *,
        top_k: int = 5,
        mode: str = "hybrid",
        context_tokens: int = 1024,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        samples: int = 1,
        select: str = "vote",
        stop: Optional[list[str]] = None,
        on_text: Optional[Callable[[str], object]] = None,
    ) -> Answer:
        """Answer ``question`` in this conversation and keep the exchange (unless
        cancelled). Arguments as in ``Assistant.ask``."""
    def ask_stream(
        self,
        question: str,
        *,
        top_k: int = 5,
        mode: str = "hybrid",
        context_tokens: int = 1024,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        samples: int = 1,
        select: str = "vote",
        stop: Optional[list[str]] = None,
    ) -> AskStream:
        """Like ``ask``, but returns at once an iterator over the answer's text pieces; the
        exchange is kept when the iteration reaches the end of an answer not cancelled."""
    def reset(self) -> None:
        """Forget the exchanges (the system message stays)."""
