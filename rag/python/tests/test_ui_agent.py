"""The Python UI agent (examples/ui_agent.py) parses actions as rag/examples/ui_agent.rs does
(the same cases as the Rust example's unit tests)."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "ui_agent", Path(__file__).resolve().parents[1] / "examples" / "ui_agent.py"
)
ui_agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ui_agent)
Action = ui_agent.Action

SCREEN = (
    "Current screen:\n<input id=0 >Search</input>\n "
    "<button id=1 text='Sort by'></button>\n <button id=4>Clock</button>"
)


@pytest.mark.parametrize(
    "reply, want",
    [
        ("Click on <button id=4>Clock</button> because...", Action("click", 4, None)),
        ("Input 'Clock' into <input id=0 >Search</input>", Action("input", 0, "clock")),
        ("I don't know", None),
        ("Next action: click on <button id=1 text='Sort by'></button>", Action("click", 1, None)),
        ('Type "clock" into <input id=0 >Search</input>', Action("input", 0, "clock")),
        ("<button id=4>Clock</button>", Action("click", 4, None)),
        # A bare element that is an input field with no text to type is still a click.
        ("<input id=0 >Search</input>", Action("click", 0, None)),
        ("Click on the search field", None),
    ],
)
def test_parses_actions_like_the_rust_agent(reply, want):
    assert ui_agent.parse_action(reply, SCREEN) == want


def test_examples_never_come_from_the_scored_app():
    for app in ["applauncher", "notes", "clock"]:
        s = ui_agent.system_for(app)
        shown = [a for a, e in ui_agent.EXAMPLES if e in s]
        assert len(shown) == 1 and shown[0] != app


def test_finds_element_tags():
    assert ui_agent.tag_of(SCREEN, 0) == "input"
    assert ui_agent.tag_of(SCREEN, 4) == "button"
    assert ui_agent.tag_of(SCREEN, 9) is None
