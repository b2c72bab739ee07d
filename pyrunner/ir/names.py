"""The one identifier validator for every name a user file supplies.

Graph and plan files are untrusted: their names become Python identifiers in
rendered TileLang source, file names of artifacts, and words in docstrings and
reports. Only names that pass ``check_name`` ever get there, so neither a quote,
a newline, a path separator nor a look-alike Unicode letter (``𝐗`` normalises
to ``X`` under NFKC, as Python does for identifiers) can reach generated code
or a path. The rules:

- ASCII letters, digits and ``_``, not starting with a digit (``[A-Za-z_][A-Za-z0-9_]*``);
  ASCII-only makes NFKC normalisation the identity, so two accepted names are equal
  exactly when Python would think so;
- at most ``MAX_GRAPH_NAME`` characters for names in graphs (plans derive kernel and
  buffer names from them with short prefixes and suffixes, hence ``MAX_PLAN_NAME``);
- not a Python keyword (``class``, ``None``, ...) and not a dunder (``__x``).

Names the rendered module binds itself (``T``, ``tilelang``, its constants) may still be used:
the renderer gives every plan name a fresh identifier that avoids them (``emit._Names``).
"""

from __future__ import annotations

import keyword
import re
import unicodedata
from collections.abc import Container

from pyrunner.errors import UserError

MAX_GRAPH_NAME = 64
"""Longest name a graph may use (inputs, outputs, nodes, axes, the graph itself)."""
MAX_PLAN_NAME = 128
"""Longest name a plan may use: graph names plus the planner's prefixes and suffixes."""
PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HASH_PATTERN = re.compile(r"[0-9a-f]{16}")


def name_problem(name: object, limit: int = MAX_GRAPH_NAME) -> str | None:
    """Why ``name`` is not an acceptable identifier, or None when it is."""
    if not isinstance(name, str):
        return f"expected a name (string), got {type(name).__name__}"
    if not name:
        return "a name must not be empty"
    if len(name) > limit:
        return f"name of {len(name)} characters is too long (at most {limit})"
    if not PATTERN.fullmatch(name):
        norm = unicodedata.normalize("NFKC", name)
        hint = f" (NFKC normalises it to {norm!r})" if norm != name and norm.isascii() else ""
        return (f"name {_show(name)} is not an ASCII identifier{hint}: use letters A-Z a-z, digits and _, "
                "not starting with a digit")
    if keyword.iskeyword(name):
        return f"name {name!r} is a Python keyword"
    if name.startswith("__"):
        return f"name {name!r} starts with '__' (reserved for Python's dunder names)"
    return None


def check_name(name: object, what: str, limit: int = MAX_GRAPH_NAME, error: type[Exception] = UserError) -> str:
    """``name`` itself when acceptable; else ``error`` saying what (``what``) is wrong with it."""
    problem = name_problem(name, limit)
    if problem is not None:
        raise error(f"{what}: {problem}")
    return name  # type: ignore[return-value]


def is_name(name: object, limit: int = MAX_GRAPH_NAME) -> bool:
    return name_problem(name, limit) is None


def fresh_name(base: str, taken: Container[str], fallback: str) -> str:
    """``base`` (``fallback`` where it is not a name or leaves no room for a suffix), suffixed ``_2``,
    ``_3``, ... until it is not in ``taken``: the name of an axis a graph rewrite adds."""
    if not is_name(base) or len(base) > MAX_GRAPH_NAME - 4:
        base = fallback
    name, i = base, 1
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def hash_problem(h: object) -> str | None:
    """Why ``h`` is not a plan/graph hash (16 lowercase hex digits), or None."""
    if isinstance(h, str) and HASH_PATTERN.fullmatch(h):
        return None
    return f"{_show(h)} is not a hash (16 lowercase hex digits)"


def _show(x: object, limit: int = 60) -> str:
    s = ascii(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."
