"""Markdown -> Telegram HTML and splitting at 4096 UTF-16 units (no aiogram needed).

Every piece is checked with the fake Bot API's HTML parser, which parses entities and counts
lengths the way Telegram does.
"""

from __future__ import annotations

import re

import pytest

from channels.telegram_format import (
    LIMIT,
    html_to_text,
    markdown_to_html,
    split_markdown,
    utf16_len,
)
from tests.fakes.telegram_api import ApiError, parse_html


def render(html_text: str) -> tuple[str, list[dict]]:
    """What Telegram shows for `html_text` (raises like Telegram on bad HTML)."""
    text, entities = parse_html(html_text)
    return text, entities


def check_pieces(source: str, limit: int = LIMIT) -> list:
    pieces = split_markdown(source, limit)
    assert pieces, "no pieces"
    for piece in pieces:
        text, _ = render(piece.html)
        assert 0 < utf16_len(text.strip()) <= limit
        assert utf16_len(piece.markdown) <= limit  # the plain-text fallback fits too
        assert piece.markdown.strip()
    return pieces


def entity_text(text: str, entity: dict) -> str:
    """The part of `text` an entity covers (offsets are UTF-16 units)."""
    raw = text.encode("utf-16-le")
    start, end = entity["offset"] * 2, (entity["offset"] + entity["length"]) * 2
    return raw[start:end].decode("utf-16-le")


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_inline_and_block_markdown() -> None:
    md = (
        "# Title\n\nSome **bold**, *italic*, _also_, ~~gone~~ and `a<b>&c` with "
        "[a link](https://example.com/a_(b)?x=1&y=2).\n"
        "- first\n* second\n> quoted **words**\n> more\n\n"
        "```python\nif a < b and c > d:\n    print('&')\n```\nafter"
    )
    html_text = markdown_to_html(md)
    text, entities = render(html_text)
    assert text.startswith("Title\n\nSome bold, italic, also, gone and a<b>&c with a link.")
    assert "• first\n• second" in text
    assert "if a < b and c > d:\n    print('&')" in text
    kinds = [e["type"] for e in entities]
    for kind in ("bold", "italic", "strikethrough", "code", "text_link", "blockquote", "pre"):
        assert kind in kinds, kind
    link = next(e for e in entities if e["type"] == "text_link")
    assert link["url"] == "https://example.com/a_(b)?x=1&y=2"
    pre = next(e for e in entities if e["type"] == "pre")
    assert pre["language"] == "python"


def test_words_with_underscores_and_stars_stay_literal() -> None:
    md = "archived as 3f2a__9b1c__archive__20240101 and snake_case_name, 2 * 3 * 4, **"
    text, entities = render(markdown_to_html(md))
    assert text == md
    assert entities == []


def test_html_in_model_output_is_escaped_not_interpreted() -> None:
    md = "<p>hello</p> <script>x</script> &amp; [bad](javascript:alert(1))"
    text, _ = render(markdown_to_html(md))
    assert "<p>hello</p> <script>x</script> &amp;" in text


def test_unclosed_fence_and_empty_block() -> None:
    text, entities = render(markdown_to_html("look:\n```\ncode <here>"))
    assert text == "look:\ncode <here>"
    assert entities[0]["type"] == "pre"
    pieces = check_pieces("```\n```")
    assert html_to_text(pieces[0].html).strip() == "```\n```"


def test_short_text_is_one_piece_with_its_source() -> None:
    pieces = check_pieces("Hello **there** 👋")
    assert len(pieces) == 1
    assert pieces[0].markdown == "Hello **there** 👋"
    assert pieces[0].html == "Hello <b>there</b> 👋"


def test_splits_at_paragraphs_counting_utf16() -> None:
    paragraph = ("emoji 😀 counts twice " * 50).strip()  # 1100 chars, 1150 UTF-16 units
    assert utf16_len(paragraph) > len(paragraph)
    source = "\n\n".join(f"{i}: {paragraph}" for i in range(8))
    pieces = check_pieces(source)
    assert len(pieces) == 3
    for piece in pieces:
        # Every piece is made of whole paragraphs.
        for part in piece.markdown.split("\n\n"):
            assert re.fullmatch(r"\d: " + re.escape(paragraph), part)
    # Python len would have allowed bigger pieces: the UTF-16 count is what limits them.
    assert all(utf16_len(p.markdown) <= LIMIT < len(p.markdown) * 2 for p in pieces)


def test_code_block_is_closed_and_reopened() -> None:
    lines = [f"row_{i} = '{'😀' * (i % 5)}' * {i}  # <tag> & more" for i in range(300)]
    source = "Intro paragraph.\n\n```python\n" + "\n".join(lines) + "\n```\n\nOutro."
    pieces = check_pieces(source)
    assert len(pieces) >= 3
    code_text = ""
    for piece in pieces:
        text, entities = render(piece.html)
        pres = [e for e in entities if e["type"] == "pre"]
        if "row_" in text:
            assert pres and pres[0]["language"] == "python"
            assert piece.markdown.count("```") == 2
            code_text += "\n" + entity_text(text, pres[0])
    # No code line was lost, duplicated or cut in the middle.
    found = [line for line in code_text.split("\n") if line]
    assert found == lines
    assert pieces[0].markdown.startswith("Intro paragraph.")
    assert pieces[-1].markdown.endswith("Outro.")


def test_long_lines_and_emoji_sequences_are_not_broken() -> None:
    family = "👩\u200d👩\u200d👧"  # one glyph, 8 UTF-16 units
    flag = "🇩🇪"
    source = (family + flag) * 1500  # one 18 000-unit "word"
    pieces = check_pieces(source)
    assert len(pieces) == 5
    assert "".join(p.markdown for p in pieces) == source
    for piece in pieces:
        assert re.fullmatch(f"(?:{family}|{flag})+", piece.markdown)
    words = " ".join(["word"] * 3000)
    pieces = check_pieces(words)
    assert "".join(p.markdown for p in pieces) == words
    assert all(
        not p.markdown.startswith(" ") and p.markdown.strip().endswith("word") for p in pieces
    )


def test_nine_thousand_characters_round_trip() -> None:
    prose = " ".join(f"Sentence {i} with **bold** and emoji 🎉." for i in range(120))
    code = "\n".join(f"print({i})  # 🐍" for i in range(150))
    source = f"{prose}\n\n```py\n{code}\n```\n\n{prose}"
    assert len(source) > 9000
    pieces = check_pieces(source)
    assert 3 <= len(pieces) <= 5
    shown = "".join(render(p.html)[0] for p in pieces)
    expected = render(markdown_to_html(source))[0]
    assert squash(shown) == squash(expected)


@pytest.mark.parametrize("limit", [101, 257, 1000])
def test_small_limits_keep_every_invariant(limit: int) -> None:
    source = (
        "Para one *x* 😀.\n\n"
        + "```js\n"
        + "\n".join(f"let v{i} = {i};" for i in range(60))
        + "\n```\n"
        + "tail " * 100
    )
    pieces = check_pieces(source, limit)
    shown = "".join(render(p.html)[0] for p in pieces)
    assert squash(shown) == squash(render(markdown_to_html(source))[0])


def test_fake_rejects_what_the_fallback_is_for() -> None:
    with pytest.raises(ApiError, match="can't parse entities"):
        parse_html("<p>x</p>")
