"""One meaningful line from a TileLang / TVM / nvcc failure, for the user; the whole text for the log.

TileLang failures end in a line that rarely says what went wrong (a fragment dump, the tail of
a C++ backtrace); the line naming the conflict sits somewhere above it. ``failure_line`` picks
it by a short list of patterns, most specific first, falling back to the last line that looks
like an exception message, then to the last non-empty line.
"""

from __future__ import annotations

import re
import traceback

MAX_LINE = 300
MAX_DETAIL = 20000
"""Characters of the full failure text kept in a results record (the log keeps everything)."""

_PATTERNS = (
    re.compile(r"Layout infer conflict.*"),
    re.compile(r"Not a canonical \w+ layout.*"),
    re.compile(r"[\w./-]*\.cu\(\d+\): (?:error|catastrophic error): .*"),
    re.compile(r"ptxas (?:error|fatal)\s*:.*"),
    re.compile(r"Check failed: .*"),
    re.compile(r"(?:Assertion|Value|Type|Index|Key|Runtime|Plan|DeviceFit|Nvcc|Tile\w*)Error: .*"),
)
_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$")
_NOISE = re.compile(r"^\s*(File \"|Traceback|\d+: |\[bt\]|During handling|The above exception|\^+$|~+$)")


def failure_line(text: str) -> str:
    """The line of ``text`` that says what failed (trimmed to MAX_LINE characters)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pat in _PATTERNS:
        for ln in lines:
            m = pat.search(ln)
            if m:
                return _trim(m.group(0))
    for ln in reversed(lines):
        m = _EXCEPTION_LINE.match(ln)
        if m and not m.group(2).startswith(("fragment Fragment", "Traceback")):
            return _trim(f"{m.group(1)}: {m.group(2)}")
    for ln in reversed(lines):
        if not _NOISE.match(ln):
            return _trim(ln)
    return ""


def one_line(e: BaseException) -> str:
    """``Type: meaningful line`` for an exception (the type is not repeated when the line names one)."""
    line = failure_line(str(e))
    if not line:
        return type(e).__name__
    if _EXCEPTION_LINE.match(line) or line.startswith(type(e).__name__):
        return line
    return f"{type(e).__name__}: {line}"


def detail(e: BaseException) -> str:
    """The whole failure: message and traceback, capped at MAX_DETAIL characters (the tail kept)."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return text if len(text) <= MAX_DETAIL else "...\n" + text[-MAX_DETAIL:]


def _trim(s: str) -> str:
    return s if len(s) <= MAX_LINE else s[: MAX_LINE - 3] + "..."
