"""The package's shape: no import cycles, subpackages layered along the pipeline, short modules.

Imports are read from the source (every ``import``, also those inside functions), so a cycle
hidden behind a lazy import counts too.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pyrunner"
MAX_LINES = 400
LONG_MARK = "Why one module:"

# Each subpackage may import only from earlier layers (or itself): the folder list is the pipeline.
LAYERS = [
    {"pyrunner", "errors", "files", "switches"},
    {"ir"},
    {"rules", "plan", "log"},
    {"target"},
    {"planner", "backend"},
    {"pipeline"},
    {"run"},
    {"frontend"},
    {"cli"},
    {"__main__"},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """pyrunner modules imported anywhere in the file (``from a.b import c`` counts a.b.c if a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in MODULES}


FACADE = {"pyrunner": {"pyrunner.frontend"}}
"""The package root's lazy ``__getattr__`` re-exports the PyTorch entry points (``pyrunner.load``,
``pyrunner.optimize``): an attribute lookup on first use, not an import dependency of the root."""

@cache
def _graph() -> dict[str, set[str]]:
    """Each module's pyrunner imports (parsed on first use: every xdist worker imports this file at
    collection, the slow tier's too, and only the worker running these tests needs the parse)."""
    return {m: _imports(p) - {m} - FACADE.get(m, set()) for m, p in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "pyrunner"
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{module}: subpackage {top!r} has no layer in tests/test_architecture.py")


def test_no_import_cycles() -> None:
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(_graph()[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(_graph()):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_subpackages_import_only_earlier_layers() -> None:
    bad = [f"{m} imports {d}" for m, deps in _graph().items() for d in sorted(deps) if _layer(d) > _layer(m)]
    assert not bad, "imports against the pipeline order:\n" + "\n".join(bad)


def docstring_problems(modules: dict[str, Path]) -> list[str]:
    """Every module without a docstring, and every long one whose docstring does not say why."""
    problems = []
    for module, path in sorted(modules.items()):
        text = path.read_text()
        if path.name == "__init__.py" and not text.strip():
            continue
        doc = ast.get_docstring(ast.parse(text))
        if not doc:
            problems.append(f"{module} has no module docstring")
        elif len(text.splitlines()) > MAX_LINES and LONG_MARK not in doc:
            problems.append(f"{module} has {len(text.splitlines())} lines: split it or say '{LONG_MARK} ...' "
                            "in its docstring")
    return problems


def test_every_module_has_a_docstring_and_long_ones_say_why(tmp_path: Path) -> None:
    """One test over every module (it was one per module: 92 tests that could each only pass); the check
    itself is shown to catch a module without a docstring and a long one that does not say why."""
    bare = tmp_path / "bare.py"
    bare.write_text("x = 1\n")
    long = tmp_path / "long.py"
    long.write_text('"""Short."""\n' + "x = 1\n" * (MAX_LINES + 1))
    assert len(docstring_problems({"bare": bare, "long": long})) == 2
    problems = docstring_problems(MODULES)
    assert not problems, "\n".join(problems)
