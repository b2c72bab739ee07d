"""A bounded, non-recursive rendering of a term, for derivation steps and messages.

``graph.show`` renders the whole tree, which doubles with every level of a
shared sub-graph; a step or an error message needs only its first characters.
"""

from __future__ import annotations

from pyrunner.ir.graph import Term


def _pieces(t: Term) -> list[Term | str]:
    """t's rendering as text and operand terms, left to right (as ``graph.show``)."""
    if t.op == "input":
        return [t.name]
    if t.op == "const":
        return [f"{t.value:g}"]
    if t.op == "axis_size":
        return [f"|{t.axis}|"]
    if t.op == "unary":
        return [f"{t.fn}(", t.args[0], ")"]
    if t.op == "binary":
        return [f"{t.fn}(", t.args[0], ", ", t.args[1], ")"]
    if t.op == "reduce":
        return [f"{t.fn}_{t.axis}(", t.args[0], ")"]
    if t.op == "matmul":
        return ["(", t.args[0], f" @{t.axis} ", t.args[1], ")"]
    return [f"<{t.op}>"]


def brief(t: Term, limit: int = 160) -> str:
    """``graph.show(t)``, cut to at most ``limit`` characters (ending in "..." when cut)."""
    out: list[str] = []
    n = 0
    stack: list[Term | str] = [t]
    while stack and n <= limit:
        cur = stack.pop()
        if isinstance(cur, str):
            out.append(cur)
            n += len(cur)
        else:
            stack.extend(reversed(_pieces(cur)))
    text = "".join(out)
    if stack or len(text) > limit:
        return text[: limit - 3] + "..."
    return text
