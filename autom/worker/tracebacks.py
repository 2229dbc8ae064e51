"""What a failed run keeps besides its one-line error: its traceback and its handler's log.

``traceback_text`` formats an unexpected exception (no local variables: a traceback
says no more than the error text and the source lines), bounded to ``MAX_TRACEBACK``
characters (the head and the innermost frames kept). ``user_frame`` names the
innermost frame of the user's code (``file.py:LINE in function``): not autom's own,
not the standard library's, not an installed package's. ``RunLog`` keeps the first
``MAX_LINES`` lines a handler logged through ``ctx.log`` (``MAX_LOG_BYTES`` in all).
"""

from __future__ import annotations

import os
import sysconfig
import traceback

#: the most characters of a traceback stored with its attempt
MAX_TRACEBACK = 16_000
#: the most lines of ``ctx.log`` kept with one attempt, each cut to ``MAX_LINE`` characters ...
MAX_LINES = 100
MAX_LINE = 1000
#: ... and at most this many characters in all
MAX_LOG_BYTES = 16_000

_NOT_USER = tuple(os.path.realpath(p) + os.sep for p in {
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the autom package
    *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
} if p)


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback as text (chained exceptions included, no locals), at most ``MAX_TRACEBACK``
    characters: the start and the innermost part kept."""
    text = "".join(traceback.format_exception(exc)).replace("\x00", "\ufffd")
    if len(text) <= MAX_TRACEBACK:
        return text
    head = MAX_TRACEBACK // 8
    return text[:head] + "\n… (cut) …\n" + text[-(MAX_TRACEBACK - head - 12):]


def _is_user(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    return not os.path.realpath(filename).startswith(_NOT_USER)


def user_frame(exc: BaseException) -> str | None:
    """The innermost frame of the user's code in ``exc``'s traceback (``file.py:LINE in function``),
    or None when none of its frames is the user's."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if _is_user(frame.filename):
            return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
    return None


class RunLog:
    """The lines one run's handler logged through ``ctx.log`` (the first ``MAX_LINES``, bounded)."""

    __slots__ = ("lines", "size")

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.size = 0

    def add(self, level: str, message: str) -> None:
        """Keep one line, if there is room."""
        if len(self.lines) >= MAX_LINES or self.size >= MAX_LOG_BYTES:
            return
        line = f"{level} {message}".replace("\x00", "\ufffd")[:MAX_LINE]
        line = line[:MAX_LOG_BYTES - self.size]
        self.lines.append(line)
        self.size += len(line)
