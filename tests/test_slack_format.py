"""Markdown -> Slack mrkdwn conversion and splitting (pure functions)."""

from __future__ import annotations

import random

import pytest

from channels.slack_format import (
    MAX_PIECE_BYTES,
    escape,
    format_and_split,
    split_mrkdwn,
    to_mrkdwn,
)


def size(text: str) -> int:
    return len(text.encode("utf-8"))


@pytest.mark.parametrize(
    ("markdown", "mrkdwn"),
    [
        ("**bold** and __bold__", "*bold* and *bold*"),
        ("*italic* and _italic_", "_italic_ and _italic_"),
        ("***both***", "*_both_*"),
        ("~~gone~~", "~gone~"),
        ("`a < b && c`", "`a &lt; b &amp;&amp; c`"),
        ("``code with ` tick``", "`code with ` tick`"),
        ("1 < 2 & 3 > 2", "1 &lt; 2 &amp; 3 &gt; 2"),
        ("[docs](https://example.com/a?b=1&c=2)", "<https://example.com/a?b=1&amp;c=2|docs>"),
        ("[https://x.io](https://x.io)", "<https://x.io>"),
        ("<https://x.io/path>", "<https://x.io/path>"),
        ("[local](./README.md)", "local (./README.md)"),
        ("![diagram](https://x.io/d.png)", "<https://x.io/d.png|diagram>"),
        ("# Title", "*Title*"),
        ("### **Already** bold ###", "*Already bold*"),
        ("- one\n- two", "• one\n• two"),
        ("* star item\n+ plus item", "• star item\n• plus item"),
        ("- top\n  - nested", "• top\n    • nested"),
        ("- [ ] todo\n- [x] done", "☐ todo\n☑ done"),
        ("1. first\n2) second", "1. first\n2. second"),
        ("> quoted **text**", "> quoted *text*"),
        ("---", "──────────"),
        ("2*3*4 and snake_case_name", "2*3*4 and snake_case_name"),
        (r"\*not italic\*", "*not italic*"),
        ("**bold `code`** text", "*bold `code`* text"),
    ],
)
def test_inline_and_block_conversion(markdown: str, mrkdwn: str) -> None:
    assert to_mrkdwn(markdown) == mrkdwn


def test_code_fences_are_kept_verbatim_but_escaped() -> None:
    markdown = "Look:\n```python\nif a < b and **c**:\n    x = [y](z)\n```\nafter *this*"
    assert to_mrkdwn(markdown) == (
        "Look:\n```\nif a &lt; b and **c**:\n    x = [y](z)\n```\nafter _this_"
    )


def test_unclosed_fence_is_closed_and_tilde_fences_work() -> None:
    assert to_mrkdwn("~~~\ncode\n~~~\ntext") == "```\ncode\n```\ntext"
    assert to_mrkdwn("```\nnever closed") == "```\nnever closed\n```"


def test_table_becomes_a_code_block() -> None:
    table = "| a | b |\n|---|:-:|\n| 1 | <2> |\n\nafter"
    assert to_mrkdwn(table) == "```\n| a | b |\n|---|:-:|\n| 1 | &lt;2&gt; |\n```\n\nafter"


def test_short_text_is_one_piece() -> None:
    assert format_and_split("Hello **world**") == ["Hello *world*"]
    assert format_and_split("   \n ") == ["(no answer)"]


def test_split_prefers_paragraph_boundaries() -> None:
    paragraphs = [f"Paragraph {i} " + "x" * 80 for i in range(10)]
    pieces = split_mrkdwn("\n\n".join(paragraphs), max_bytes=200)
    assert all(size(p) <= 200 for p in pieces)
    # Two paragraphs (~92 bytes each plus a blank line) fit a piece; none is cut in half.
    assert pieces == ["\n\n".join(paragraphs[i : i + 2]) for i in range(0, 10, 2)]


def test_split_falls_back_to_lines_then_words() -> None:
    lines = "\n".join(f"line {i} " + "y" * 40 for i in range(20))
    pieces = split_mrkdwn(lines, max_bytes=150)
    assert all(size(p) <= 150 for p in pieces)
    assert "\n".join(pieces) == lines
    words = " ".join(f"word{i}" for i in range(200))
    pieces = split_mrkdwn(words, max_bytes=100)
    assert all(size(p) <= 100 for p in pieces)
    assert " ".join(pieces) == words
    assert all(not p.startswith(" ") and p.split(" ")[-1].startswith("word") for p in pieces)


def test_code_block_split_keeps_fences_balanced() -> None:
    code = "\n".join(f"print({i})  # a < b" for i in range(100))
    text = to_mrkdwn(f"Intro line.\n\n```\n{code}\n```\n\nOutro.")
    pieces = split_mrkdwn(text, max_bytes=300)
    assert len(pieces) > 3
    inner: list[str] = []
    for piece in pieces:
        assert size(piece) <= 300
        assert piece.count("```") % 2 == 0
        if piece.startswith("```"):
            body = piece.split("\n")
            end = body.index("```", 1)
            inner += body[1:end]
    assert inner == [escape(line) for line in code.split("\n")]
    assert pieces[0] == "Intro line." and pieces[-1].endswith("Outro.")


def test_overlong_line_cut_on_characters_not_bytes_or_entities() -> None:
    line = ("é中😀&<>" * 400).strip()
    mrkdwn = to_mrkdwn(line)
    pieces = split_mrkdwn(mrkdwn, max_bytes=101)
    assert all(size(p) <= 101 for p in pieces)
    assert "".join(pieces) == mrkdwn
    for piece in pieces:  # every piece is valid on its own: no half entity at either end
        assert not piece.endswith(("&", "&a", "&am", "&amp", "&l", "&lt", "&g", "&gt"))
        assert not piece.startswith(("amp;", "mp;", "p;", "t;", ";"))


def test_overlong_code_line_is_cut_inside_fences() -> None:
    text = "```\n" + "z" * 1000 + "\n```"
    pieces = split_mrkdwn(text, max_bytes=120)
    assert all(size(p) <= 120 and p.startswith("```\n") and p.endswith("\n```") for p in pieces)
    assert "".join(p[4:-4] for p in pieces) == "z" * 1000


def test_link_is_not_cut_in_half() -> None:
    text = "a" * 60 + "<https://example.com/" + "p" * 30 + "|label>" + "b" * 10
    pieces = split_mrkdwn(text, max_bytes=100)  # the link straddles byte 100
    assert pieces == ["a" * 60, text[60:]]


def test_random_documents_respect_the_limit() -> None:
    rng = random.Random(7)
    parts = [
        "# Heading {n}",
        "Some **bold** text with a [link](https://ex.com/{n}?a=1&b=2) & <angle> {n}",
        "- item {n} with `code < {n}`",
        "```\n" + "\n".join("code line {n} & more" for _ in range(30)) + "\n```",
        "plain " * 120 + "{n}",
        "ünïcødé 😀 " * 60,
        "> quote {n}",
        "",
    ]
    for _ in range(40):
        doc = "\n".join(rng.choice(parts).format(n=rng.randint(0, 999)) for _ in range(60))
        pieces = format_and_split(doc, max_bytes=500)
        assert pieces and all(0 < size(p) <= 500 for p in pieces)
        assert all(p.count("```") % 2 == 0 for p in pieces)
        assert format_and_split(doc, max_bytes=500) == pieces  # deterministic for resume
    big = "\n\n".join(parts * 30)
    assert all(size(p) < 4000 for p in format_and_split(big))
    assert MAX_PIECE_BYTES < 4000
