"""Splitting long Telegram texts (autom/limits.py): nothing lost, lines kept whole where possible."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autom.limits import MAX_TEXT, split_text


def units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def test_a_short_text_is_one_part() -> None:
    assert split_text("pong") == ["pong"]
    assert split_text("y" * MAX_TEXT) == ["y" * MAX_TEXT]
    assert split_text("") == [""]


def test_a_long_text_is_cut_after_a_line() -> None:
    lines = [f"line {i:04d} " + "z" * 80 for i in range(200)]  # ~18,000 characters
    text = "\n".join(lines)
    parts = split_text(text)
    assert "".join(parts) == text
    assert all(units(p) <= MAX_TEXT for p in parts)
    assert all(p.endswith("\n") for p in parts[:-1])  # every cut falls after a line break


def test_a_text_without_line_breaks_is_cut_at_a_space_then_anywhere() -> None:
    words = ("word " * 2000).strip()
    parts = split_text(words)
    assert "".join(parts) == words and all(p.endswith(" ") for p in parts[:-1])
    solid = "x" * 9000
    assert [len(p) for p in split_text(solid)] == [4096, 4096, 808]


def test_emoji_count_twice_and_are_never_split() -> None:
    parts = split_text("😀" * 3000)
    assert [units(p) for p in parts] == [4096, 1904]


@given(st.text(alphabet=st.sampled_from(["a", " ", "\n", "é", "😀", "中"]), max_size=12_000))
def test_parts_fit_and_join_to_the_text(text: str) -> None:
    parts = split_text(text, limit=1000)
    assert "".join(parts) == text
    assert all(0 < units(p) <= 1000 for p in parts) or text == ""
