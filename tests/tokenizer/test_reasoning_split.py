"""Splitting a thinking model's reply into its thinking and its answer
(tokenizer/reasoning.py): whole, and streamed with the markers cut anywhere."""

from __future__ import annotations

import itertools

import pytest

from dualpath.tokenizer.reasoning import (
    ReasoningSplitter,
    budget_tokens_of,
    split_reasoning,
    thinking_kwargs,
)

CASES = [
    # (reply, the prompt opened the thinking, (reasoning, content))
    ("<think>\nLet me add.\n</think>\n\nIt is 4.", False, ("Let me add.", "It is 4.")),
    ("  <think>a b</think>c", False, ("a b", "c")),
    ("Hello <think>x</think>", False, (None, "Hello <think>x</think>")),  # only a reply's start thinks
    ("plan\n</think>\n\nok", True, ("plan", "ok")),
    ("<thi", False, (None, "<thi")),  # a start of the marker that never completes is text
    ("<think> still thinking ", False, ("still thinking", "")),  # cut off while thinking
    ("</think>x", True, ("", "x")),
    ("<think></think>answer</think>", False, ("", "answer</think>")),
    ("no thinking at all", False, (None, "no thinking at all")),
    ("a </ b </th c</think>d", True, ("a </ b </th c", "d")),
]


def _streamed(text: str, opened: bool, cuts) -> tuple[str | None, str]:
    splitter = ReasoningSplitter(opened)
    reasoning = content = ""
    bounds = [0, *cuts, len(text)]
    for a, b in zip(bounds, bounds[1:]):
        r, c = splitter.feed(text[a:b])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    return (reasoning + r if splitter.saw_thinking else None), content + c


@pytest.mark.parametrize("text,opened,want", CASES)
def test_a_whole_reply_splits_into_thinking_and_answer(text, opened, want):
    assert split_reasoning(text, opened) == want


@pytest.mark.parametrize("text,opened,want", CASES)
def test_streamed_pieces_add_up_to_the_whole_split_wherever_the_markers_are_cut(text, opened, want):
    for k in (1, 2):  # every way to cut the reply into two and three pieces
        for cuts in itertools.combinations(range(1, len(text)), k):
            assert _streamed(text, opened, cuts) == want, cuts
    assert _streamed(text, opened, range(1, len(text))) == want  # one character at a time


def test_no_piece_of_a_marker_is_sent_before_it_is_whole():
    splitter = ReasoningSplitter(opened=True)
    assert splitter.feed("step one </th") == ("step one", "")
    assert splitter.feed("ink>\n") == ("", "")
    assert splitter.feed("\nThe answer") == ("", "The answer")
    start = ReasoningSplitter()
    assert start.feed(" <thi") == ("", "")  # could still open the thinking
    assert start.feed("nk>why") == ("why", "")


def test_budget_follows_the_request_then_the_effort_then_the_default():
    assert budget_tokens_of(-1) is None
    assert budget_tokens_of(100) == 100
    assert budget_tokens_of(100, 5, 50) == 5
    assert budget_tokens_of(100, None, 50) == 50
    assert budget_tokens_of(100, -1, 50) is None
    assert budget_tokens_of(-1, 0) == 0


def test_a_budget_of_zero_turns_thinking_off_where_the_template_reads_enable_thinking():
    reads = "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    assert thinking_kwargs(reads, None, 0) == {"enable_thinking": False}
    assert thinking_kwargs(reads, {"enable_thinking": True}, 0) == {"enable_thinking": True}  # the caller's wins
    assert thinking_kwargs(reads, {"x": 1}, 10) == {"x": 1}
    assert thinking_kwargs("{{ messages }}", None, 0) == {}
