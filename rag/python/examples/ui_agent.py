"""A UI-automation agent on the Python API: rag/examples/ui_agent.rs, step for step.

For each recorded DroidTask step it passes the current screen as context, asks for the next
action, and scores the answer against the reference action; it reports action accuracy and
per-step latency. Same prompt, same parsing and same scoring as the Rust example, so with the
same model both print the same answers.

    python ui_agent.py [DATASET] [--limit N] [--every K] [--skip N] [--model M]

DATASET defaults to ../shared/data/ui/droidtask_ui.jsonl (from the repository root). An
action is correct when its verb (Click / Input), the element id and, for Input, the typed
text (case-insensitive) match the reference.
"""

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

import ragkit

SYSTEM = (
    "You operate an Android app for the user. Each turn shows the task, the actions done so "
    "far and the current screen as a list of elements with ids. Reply with exactly one line "
    "holding the single next action, in one of these two forms:\n"
    "Click on <element>\n"
    "Input 'text' into <element>\n"
    "Copy the element from the screen exactly, including its id. Do not repeat the task, do "
    "not explain.\n\nExample:\n{EXAMPLE}"
)

# Two recorded steps as worked examples; a step is shown the first one from another app.
EXAMPLES = [
    (
        "applauncher",
        "Task: search 'Clock' app and open it\n"
        "Actions so far:\n- Input 'Clock' into <input id=0 >Search</input>\n"
        "Current screen:\n<input id=0 >Clock</input>\n <button id=1 text='Sort by'></button>\n "
        "<button id=2 text='Toggle app name visibility'></button>\n <button id=3 text='More options'></button>\n "
        "<button id=4>Clock</button>\n <button id=5>go back</button>\n"
        "Next action:\nClick on <button id=4>Clock</button>",
    ),
    (
        "notes",
        "Task: Rename the note 'diary' to 'events'\n"
        "Actions so far:\n- Click on <button id=3 text='More options'></button>\n"
        "- Click on <button id=0>Rename note</button>\n"
        "Current screen:\n<p id=0>Rename note</p>\n <input id=1 >Diary</input>\n "
        "<button id=2>Cancel</button>\n <button id=3>OK</button>\n <button id=4>go back</button>\n"
        "Next action:\nInput 'events' into <input id=1 >Diary</input>",
    ),
]


@dataclass(frozen=True)
class Action:
    verb: str
    element_id: Optional[int]
    text: Optional[str]


def system_for(app: str) -> str:
    example = next((e for a, e in EXAMPLES if a != app), "")
    return SYSTEM.replace("{EXAMPLE}", example)


def tag_of(screen: str, element_id: int) -> Optional[str]:
    """The tag of the element with this id on the screen (button, input, ...)."""
    needle = f" id={element_id}"
    for line in screen.splitlines():
        line = line.strip()
        end = line.find(needle)
        if end < 0 or not line[end + len(needle):].startswith((" ", ">")):
            continue
        if line.startswith("<"):
            return line[1:end]
    return None


def parse_action(s: str, screen: str) -> Optional[Action]:
    """The first click/tap/input/type/enter verb, the first id=N after it, and for input the
    quoted text; without a verb a bare element is a click unless it is an input field."""
    lower = s.lower()
    verbs = [("click", "click"), ("tap", "click"), ("input", "input"), ("type", "input"), ("enter", "input")]
    prose = lower[: lower.find("<")] if "<" in lower else lower

    def first_word(w: str) -> Optional[int]:
        p = prose.find(w)
        while p >= 0:
            before = prose[p - 1] if p > 0 else ""
            after = prose[p + len(w)] if p + len(w) < len(prose) else ""
            if not before.isalnum() and not after.isalnum():
                return p
            p = prose.find(w, p + 1)
        return None

    found = min(
        ((p, v) for w, v in verbs if (p := first_word(w)) is not None),
        key=lambda pv: pv[0],
        default=None,
    )
    rest = s[found[0] if found else 0:]
    element_id = None
    p = rest.find("id=")
    if p >= 0:
        digits = ""
        for c in rest[p + 3:]:
            if not c.isascii() or not c.isdigit():
                break
            digits += c
        element_id = int(digits) if digits else None
    text = None
    for q in ("'", '"'):
        a = rest.find(q)
        if a < 0:
            continue
        b = rest.find(q, a + 1)
        # A quote inside the element (text='Sort by') is not the typed text.
        if b < 0 or "<" in rest[:a]:
            continue
        text = rest[a + 1:b]
        break
    if found:
        verb = found[1]
    else:
        tag = tag_of(screen, element_id) if element_id is not None else None
        if tag is None:
            return None
        verb = "input" if tag == "input" and text is not None else "click"
    if element_id is None:
        return None
    return Action(verb, element_id, text.strip().lower() if verb == "input" and text is not None else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", nargs="?", default="../shared/data/ui/droidtask_ui.jsonl")
    ap.add_argument("--limit", type=int, default=sys.maxsize)
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--model", default=ragkit.DEFAULT_MODEL)
    args = ap.parse_args()

    with open(args.dataset) as f:
        records = [line for line in f if line.strip()]
    with tempfile.TemporaryDirectory(prefix="rag-ui-agent-") as index_dir:
        # The agent brings its own context: no retrieval, no embedder.
        agent = ragkit.Assistant(index_dir, model=args.model, dense=False)
        t = time.perf_counter()
        agent.load_model()  # per-step latency excludes the one-time load
        print(f"model {args.model} loaded in {(time.perf_counter() - t) * 1e3:.0f} ms", file=sys.stderr)

        steps = correct = 0
        latencies = []
        per_app = {}
        for line in records[args.skip:: max(args.every, 1)][: args.limit]:
            rec = json.loads(line)
            prompt, reference, app = rec["turns"][0], rec["reference"], rec.get("app", "")
            at = prompt.find("Current screen:")
            screen = prompt[at:] if at >= 0 else ""
            start = max(prompt.find("Task:"), 0)
            end = prompt.rfind("\nReply with")
            context = prompt[start: end if end >= 0 else len(prompt)].rstrip()
            seen = []

            def first_line(piece: str) -> bool:
                # Only the first line is the action: stop generating after it.
                seen.append(piece)
                return "\n" not in "".join(seen).lstrip()

            t = time.perf_counter()
            answer = agent.ask_with_context("Next action:", context, system_for(app), max_tokens=40, on_text=first_line)
            ms = (time.perf_counter() - t) * 1e3
            got = answer.answer.lstrip().split("\n")[0]
            a, r = parse_action(got, screen), parse_action(reference, screen)
            ok = a is not None and r is not None and a == r
            steps += 1
            correct += ok
            n, c = per_app.get(app, (0, 0))
            per_app[app] = (n + 1, c + ok)
            latencies.append(ms)
            print(f"{'OK ' if ok else 'BAD'} step {steps:>3} {app:<13} {ms:>7.0f} ms  ref: {reference}  got: {got}", file=sys.stderr)

    latencies.sort()
    pct = lambda p: latencies[round((len(latencies) - 1) * p)] if latencies else 0.0  # noqa: E731
    apps = ", ".join(f"{a} {c}/{n}" for a, (n, c) in sorted(per_app.items()))
    print(
        f"model {args.model}, prompt one-shot, steps {steps} (every {args.every} from {args.skip}), "
        f"action accuracy {100 * correct / max(steps, 1):.1f}% ({correct}/{steps}), "
        f"latency p50 {pct(0.5):.0f} ms, p90 {pct(0.9):.0f} ms, p99 {pct(0.99):.0f} ms, "
        f"mean {sum(latencies) / max(len(latencies), 1):.0f} ms\nper app: {apps}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
