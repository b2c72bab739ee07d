"""The Lean sources agree with the Python side on everything checkable without a Lean compiler.

No Lean toolchain exists on the development machines or in CI (DESIGN section 3), so this test
reads the Lean files as text: rule names against theorem names, the workload catalog (evaluated
term by term by a small interpreter for the restricted `let`/application form that
`Superopt/Workloads.lean` and the helpers of `Superopt/Graph.lean` are written in), the op
vocabularies, the absence of proof holes and of trusted or unchecked code, and the package layout
lake expects. `tests/test_lean_protocol.py` covers the subprocess protocol of `lake exe superopt`.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyrunner.ir import graph as G
from pyrunner.ir import ops
from pyrunner.ir.catalog import CATALOG
from pyrunner.ir.graph_json import graph_to_json

ROOT = Path(__file__).resolve().parents[1]
LEAN_DIR = ROOT / "Superopt"
LEAN_TEST_DIR = ROOT / "tests" / "lean"

# The rule names fixed by the design; pyrunner.rules.RULE_NAMES carries them (and may add more).
RULES = (
    "softmax_max_shift", "matmul_div_commute", "matmul_row_scale_commute", "exp_to_exp2",
    "mean_to_sum_div", "reduction_tiling", "online_softmax_rescale", "shared_operand_fusion",
    "reduction_in_contraction_loop", "masked_tile_skip",
)
# Trusted or unchecked code: none of it may appear outside comments and strings.
HOLES = re.compile(r"\b(sorry|admit|axiom|native_decide|implemented_by|partial|unsafe|opaque)\b"
                   r"|@\[\s*extern\b|#exit\b|\bset_option\s+[\w.]*maxHeartbeats\s+0\b")


# --- reading Lean text -----------------------------------------------------------------------

def lean_files() -> list[Path]:
    return sorted(LEAN_DIR.rglob("*.lean")) + sorted(LEAN_TEST_DIR.rglob("*.lean")) + [ROOT / "lakefile.lean"]


def strip_comments(src: str, keep_strings: bool = True) -> str:
    """Lean source without comments (nested block comments included), optionally without strings.

    Newlines are kept so line structure survives.
    """
    out: list[str] = []
    i, n, depth = 0, len(src), 0
    while i < n:
        two = src[i:i + 2]
        if depth:
            if two == "/-":
                depth, i = depth + 1, i + 2
            elif two == "-/":
                depth, i = depth - 1, i + 2
            else:
                if src[i] == "\n":
                    out.append("\n")
                i += 1
        elif two == "/-":
            depth, i = 1, i + 2
        elif two == "--":
            while i < n and src[i] != "\n":
                i += 1
        elif src[i] == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1] if keep_strings else '""')
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


@functools.cache
def code(path: Path) -> str:
    return strip_comments(path.read_text())


def all_theorems() -> set[str]:
    names: set[str] = set()
    for p in lean_files():
        names |= set(re.findall(r"^\s*(?:@\[[^\]]*\]\s*)?(?:protected\s+|private\s+)?theorem\s+([\w.']+)",
                                code(p), re.M))
    return names


# --- a tiny evaluator for the Lean workload definitions ------------------------------------------

TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
                   |(?P<id>\.?[A-Za-z_][\w.]*)|(?P<punct>[()\[\],]))""", re.X)
DEF_HEADER = re.compile(
    r"^def\s+(?P<name>[\w.]+)\s*(?P<binders>(?:\([^()]*\)\s*)*):\s*(?P<ret>[^=]+?)\s*:=\s*$")


@dataclass(frozen=True)
class Ctor:
    """`.name`: an op constructor; its Lean name is the Python op name."""

    name: str


@dataclass(frozen=True)
class LeanDef:
    name: str
    params: tuple[str, ...]
    body: tuple[str, ...]  # statements: `let x := e` lines, then the result expression


def _op(kind: tuple[str, ...], what: str) -> Callable[[Any], str]:
    def get(c: Any) -> str:
        assert isinstance(c, Ctor) and c.name in kind, f"{what} {c!r} is not one of {kind}"
        return c.name
    return get


_unary = _op(G.UNARY_OPS, "unary op")
_binary = _op(G.BINARY_OPS, "binary op")
_reduce = _op(G.REDUCE_OPS, "reduction")
_TERNARY_LEAN = {"select": "where"}  # Lean constructor -> Python name (`where` is a Lean keyword)

BUILTINS: dict[str, tuple[int, Callable[..., Any]]] = {
    "Term.input": (2, lambda name, axes: G.inp(name, axes)),
    "Term.const": (1, lambda v: G.const(v)),
    "Term.axisSize": (1, lambda a: G.axis_size(a)),
    "Term.iota": (1, lambda a: G.iota(a)),
    "Term.negInf": (0, lambda: G.const(-math.inf)),
    "Term.ternary": (4, lambda f, c, a, b: G.Term("ternary", (c, a, b), fn=_TERNARY_LEAN[f.name])),
    "Term.unary": (2, lambda f, x: G.unary(_unary(f), x)),
    "Term.binary": (3, lambda f, a, b: G.binary(_binary(f), a, b)),
    "Term.reduce": (3, lambda f, x, ax: G.reduce(_reduce(f), x, ax)),
    "Term.matmul": (3, lambda a, b, ax: G.matmul(a, b, ax)),
    "Graph.mk": (4, lambda name, sizes, outputs, labels: _graph(name, sizes, outputs, labels)),
}


def _graph(name: str, sizes: list, outputs: list, labels: list) -> G.Graph:
    """A graph with labels as Python's GraphBuilder keeps them: the first label of a term wins,
    an output's name overrides it."""
    names: dict[G.Term, str] = {}
    for t, label in labels:
        names.setdefault(t, label)
    for out, t in outputs:
        names[t] = out
    return G.Graph(name, dict(sizes), tuple(outputs), names)


def parse_defs(src: str) -> dict[str, LeanDef]:
    """Every `def NAME (binders) : T :=` whose body is indented lines; other defs are ignored."""
    lines = strip_comments(src).splitlines()
    defs: dict[str, LeanDef] = {}
    i = 0
    while i < len(lines):
        m = DEF_HEADER.match(lines[i])
        i += 1
        if not m:
            continue
        groups = re.findall(r"\(([^():]+):[^()]*\)", m["binders"])
        params = tuple(n for group in groups for n in group.split())
        stmts: list[str] = []
        base = None
        while i < len(lines) and (not lines[i].strip() or lines[i][0].isspace()):
            line = lines[i]
            i += 1
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            if base is None:
                base = indent
            if indent == base:
                stmts.append(line.strip())
            else:
                stmts[-1] += " " + line.strip()
        defs[m["name"]] = LeanDef(m["name"], params, tuple(stmts))
    return defs


class Evaluator:
    """Evaluates the restricted Lean subset: `let` lines, applications, literals, lists, tuples."""

    def __init__(self, defs: dict[str, LeanDef]) -> None:
        self.defs = defs

    def call(self, name: str, args: list[Any]) -> Any:
        if name in BUILTINS:
            arity, fn = BUILTINS[name]
            assert len(args) == arity, f"{name} takes {arity} arguments, got {len(args)}"
            return fn(*args)
        d = self.defs[name]
        assert len(args) == len(d.params), f"{name} takes {len(d.params)} arguments, got {len(args)}"
        env = dict(zip(d.params, args, strict=True))
        *lets, result = d.body
        for stmt in lets:
            m = re.fullmatch(r"let\s+(\w+)\s*:=\s*(.+)", stmt)
            assert m, f"{name}: expected `let x := e`, got {stmt!r}"
            env[m[1]] = self.expr(m[2], env)
        return self.expr(result, env)

    def expr(self, text: str, env: dict[str, Any]) -> Any:
        toks = self.tokenize(text)
        value, pos = self.app(toks, 0, env)
        assert pos == len(toks), f"trailing tokens in {text!r}: {toks[pos:]}"
        return value

    @staticmethod
    def tokenize(text: str) -> list[tuple[str, str]]:
        toks, pos = [], 0
        while pos < len(text.rstrip()):
            m = TOKEN.match(text, pos)
            assert m and m.end() > pos, f"cannot tokenize {text[pos:]!r}"
            kind = m.lastgroup
            assert kind is not None
            toks.append((kind, m[kind]))
            pos = m.end()
        return toks

    def app(self, toks: list[tuple[str, str]], pos: int, env: dict[str, Any]) -> tuple[Any, int]:
        kind, tok = toks[pos]
        if kind == "id" and not tok.startswith(".") and tok not in env and (
                tok in BUILTINS or (tok in self.defs and self.defs[tok].params)):
            args, pos = [], pos + 1
            while pos < len(toks) and not (toks[pos][0] == "punct" and toks[pos][1] in ")],"):
                arg, pos = self.atom(toks, pos, env)
                args.append(arg)
            return self.call(tok, args), pos
        return self.atom(toks, pos, env)

    def atom(self, toks: list[tuple[str, str]], pos: int, env: dict[str, Any]) -> tuple[Any, int]:
        kind, tok = toks[pos]
        if kind == "str":
            return tok[1:-1], pos + 1
        if kind == "num":
            return (float(tok) if any(c in tok for c in ".eE") else int(tok)), pos + 1
        if kind == "id":
            if tok.startswith("."):
                return Ctor(tok[1:]), pos + 1
            if tok in env:
                return env[tok], pos + 1
            if tok in BUILTINS and BUILTINS[tok][0] == 0:
                return self.call(tok, []), pos + 1
            assert tok in self.defs and not self.defs[tok].params, f"unknown or unapplied name {tok!r}"
            return self.call(tok, []), pos + 1
        if tok in "([":
            close = ")" if tok == "(" else "]"
            items, pos = [], pos + 1
            while toks[pos] != ("punct", close):
                item, pos = self.app(toks, pos, env)
                items.append(item)
                if toks[pos] == ("punct", ","):
                    pos += 1
            if close == "]":
                return items, pos + 1
            return (items[0] if len(items) == 1 else tuple(items)), pos + 1
        raise AssertionError(f"unexpected token {tok!r}")


@functools.cache
def lean_catalog() -> dict[str, G.Graph]:
    defs = parse_defs((LEAN_DIR / "Graph.lean").read_text())
    defs.update(parse_defs((LEAN_DIR / "Workloads.lean").read_text()))
    graphs = Evaluator(defs).call("catalog", [])
    return {g.name: g for g in graphs}


# --- tests -----------------------------------------------------------------------------------------

def lean_rule_catalog() -> tuple[str, ...]:
    """The rule names `Superopt/Plan.lean` accepts in a plan (its `ruleCatalog`), in order."""
    m = re.search(r"^def ruleCatalog : List RuleInfo := \[(?P<body>.*?)\]$", code(LEAN_DIR / "Plan.lean"), re.M | re.S)
    assert m, "def ruleCatalog not found in Superopt/Plan.lean"
    return tuple(re.findall(r"``(\w+)", m["body"]))


def test_every_rule_has_a_theorem() -> None:
    missing = sorted(set(RULES) - all_theorems())
    assert not missing, f"rules without a Lean theorem in Superopt/: {missing}"


def test_every_python_rule_has_a_lean_theorem() -> None:
    from pyrunner.rules.registry import RULE_NAMES

    assert set(RULES) <= set(RULE_NAMES)
    missing = sorted(set(RULE_NAMES) - all_theorems())
    assert not missing, f"Python rules without a Lean theorem in Superopt/: {missing}"


def test_lean_rule_catalog_covers_python_rules() -> None:
    from pyrunner.rules.registry import RULE_NAMES

    listed = lean_rule_catalog()
    assert len(set(listed)) == len(listed), "a rule is listed twice"
    assert not set(listed) - all_theorems(), "ruleCatalog names a missing theorem"
    assert not set(RULE_NAMES) - set(listed), "the Lean rule catalog must list every Python rule"
    assert [r for r in listed if r in RULES] == list(RULES), "the design's rules come in the design's order"


def test_lean_catalog_lists_python_workloads_in_order() -> None:
    assert list(lean_catalog()) == list(CATALOG)


@pytest.mark.parametrize("name", list(CATALOG))
def test_lean_workload_matches_python(name: str) -> None:
    lean, py = lean_catalog()[name], CATALOG[name]()
    G.check(lean)
    assert lean.sizes == py.sizes, "default sizes differ"
    assert list(lean.sizes) == list(py.sizes), "axes are declared in a different order"
    assert [(t.name, t.axes) for t in lean.inputs()] == [(t.name, t.axes) for t in py.inputs()]
    assert lean.outputs == py.outputs, "output terms differ"
    assert graph_to_json(lean) == graph_to_json(py), "labels (node names) differ"


def test_evaluator_notices_a_changed_label() -> None:
    src = (LEAN_DIR / "Workloads.lean").read_text().replace('[(s, "S"), (p, "P")]', '[(s, "S")]', 1)
    defs = parse_defs((LEAN_DIR / "Graph.lean").read_text())
    defs.update(parse_defs(src))
    changed = Evaluator(defs).call("attention", [])
    assert changed == CATALOG["Attention"]()  # same terms: labels do not take part in equality
    assert graph_to_json(changed) != graph_to_json(CATALOG["Attention"]())


def test_evaluator_notices_a_changed_workload() -> None:
    src = (LEAN_DIR / "Workloads.lean").read_text().replace('("t_kv", 4096)]', '("t_kv", 2048)]', 1)
    defs = parse_defs((LEAN_DIR / "Graph.lean").read_text())
    defs.update(parse_defs(src))
    changed = Evaluator(defs).call("attention", [])
    assert changed.sizes["t_kv"] == 2048
    assert changed != CATALOG["Attention"]()


def _inductive_ctors(name: str) -> list[str]:
    m = re.search(rf"^inductive {name} where\n(?P<body>(?:\s+\|.*\n)+)", code(LEAN_DIR / "Graph.lean"), re.M)
    assert m, f"inductive {name} not found"
    return re.findall(r"\|\s*(\w+)", m["body"])


def _name_table(name: str) -> list[tuple[str, str]]:
    m = re.search(rf"^def {name}\.name : {name} → String\n(?P<body>(?:\s+\|.*\n)+)",
                  code(LEAN_DIR / "Graph.lean"), re.M)
    assert m, f"def {name}.name not found"
    return re.findall(r'\|\s*\.(\w+)\s*=>\s*"(\w+)"', m["body"])


@pytest.mark.parametrize("lean_name, entries", [
    ("UnaryOp", ops.UNARY), ("BinaryOp", ops.BINARY), ("ReduceOp", ops.REDUCTIONS)])
def test_op_vocabulary_matches_the_op_table(lean_name: str, entries: dict) -> None:
    """Each op table entry's Lean constructor exists, in table order, and its name string is the Python name."""
    python_ops = tuple(entries)
    assert tuple(_inductive_ctors(lean_name)) == tuple(e.lean for e in entries.values())
    table = _name_table(lean_name)
    assert table == [(e.lean, e.name) for e in entries.values()]
    m = re.search(rf"^def {lean_name}\.all : List {lean_name} :=(?P<body>[^\]]*\])",
                  code(LEAN_DIR / "Graph.lean"), re.M)
    assert m and tuple(re.findall(r"\.(\w+)", m["body"])) == python_ops


def test_term_constructors_match_the_op_table_and_the_json_writer() -> None:
    ctors = _inductive_ctors("Term")
    # Lean constants are exact decimals, which have no infinity: -inf is a constructor of its own there,
    # Python's `const` with value -inf (written "-inf" in graph JSON)
    assert [c for c in ctors if c != "negInf"] == [k.lean for k in ops.TERM_KINDS.values()]
    m = re.search(r"^def Naming\.node .*?(?=^def |\Z)", code(LEAN_DIR / "Json.lean"), re.M | re.S)
    assert m, "def Naming.node not found in Superopt/Json.lean"
    assert re.findall(r"\|\s*\.(\w+)", m[0]) == ctors, "the JSON writer must handle every Term constructor"
    assert re.findall(r'\("op", jsonString "(\w+)"\)', m[0]) == ["size", "iota", "matmul"]


def holes_in(src: str) -> list[str]:
    """The lines of Lean source with a proof hole or trusted code outside comments and strings."""
    lines = strip_comments(src, keep_strings=False).splitlines()
    return [f"{n}: {line.strip()}" for n, line in enumerate(lines, 1) if HOLES.search(line)]
def test_ternary_vocabulary_matches_graph_py() -> None:
    """`TernaryOp` names its one constructor `select` (`where` is a Lean keyword) and maps it to "where"."""
    assert _inductive_ctors("TernaryOp") == list(_TERNARY_LEAN)
    m = re.search(r"^def TernaryOp\.name : TernaryOp → String\n(?P<body>(?:\s+\|.*\n)+)",
                  code(LEAN_DIR / "Graph.lean"), re.M)
    assert m and dict(re.findall(r'\|\s*\.(\w+)\s*=>\s*"(\w+)"', m["body"])) == _TERNARY_LEAN
    assert tuple(_TERNARY_LEAN.values()) == G.TERNARY_OPS


def test_no_proof_holes() -> None:
    found = [f"{p.relative_to(ROOT)}:{hole}" for p in lean_files() for hole in holes_in(p.read_text())]
    assert not found, "proof holes or trusted code:\n" + "\n".join(found)


def test_hole_scan_sees_code_but_not_comments() -> None:
    src = 'theorem t : True := by\n  -- sorry in a comment\n  /- admit -/ exact sorry\ndef s := "axiom"\n'
    stripped = strip_comments(src, keep_strings=False)
    assert re.findall(r"\b(sorry|admit|axiom)\b", stripped) == ["sorry"]


@pytest.mark.parametrize("line", [
    "partial def f : Nat → Nat", "unsafe def g := 1", "opaque h : Nat", "@[extern \"c_fn\"] def k := 1",
    "@[ extern \"c\"] def k := 1", "#exit", "set_option maxHeartbeats 0 in", "set_option synthInstance.maxHeartbeats 0",
    "theorem t : True := sorry", "axiom bad : False", "attribute [implemented_by f] g", "by native_decide"])
def test_hole_scan_rejects(line: str) -> None:
    found = holes_in(f"def ok := 1\n{line}\n")
    assert len(found) == 1 and found[0].startswith("2: ")


@pytest.mark.parametrize("line", [
    "set_option maxHeartbeats 400000 in", "def partialSum := 1", "-- partial in a comment",
    'def s := "unsafe opaque #exit"', "/- @[extern \"x\"] -/ def k := 1", "theorem axioms_ok : True := trivial"])
def test_hole_scan_allows(line: str) -> None:
    assert holes_in(f"{line}\n") == []


def test_modules_have_docstrings_and_core_imports_only() -> None:
    for p in lean_files():
        text = p.read_text()
        body = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith(("import ", "open "))]
        assert body and body[0].startswith("/-!"), f"{p.relative_to(ROOT)} must start with a module docstring"
        for mod in re.findall(r"^import\s+(\S+)", text, re.M):
            root = mod.split(".")[0]
            assert root in ("Init", "Std", "Lean", "Lake", "Superopt"), f"{p.name} imports {mod}"
            if root == "Superopt":
                assert (ROOT / (mod.replace(".", "/") + ".lean")).is_file(), f"{p.name} imports missing {mod}"


def test_basic_imports_every_library_module() -> None:
    imported = set(re.findall(r"^import\s+(\S+)", (LEAN_DIR / "Basic.lean").read_text(), re.M))
    modules = {"Superopt." + p.relative_to(LEAN_DIR).with_suffix("").as_posix().replace("/", ".")
               for p in LEAN_DIR.rglob("*.lean")}
    assert imported == modules - {"Superopt.Basic", "Superopt.Main"}


def test_package_layout() -> None:
    toolchain = (ROOT / "lean-toolchain").read_text().strip()
    assert re.fullmatch(r"leanprover/lean4:v\d+\.\d+\.\d+", toolchain), toolchain
    assert not (ROOT / "Superopt.lean").exists(), "the top level is fixed: no Superopt.lean"
    lakefile = code(ROOT / "lakefile.lean")
    assert re.search(r"^package superopt\b", lakefile, re.M)
    assert re.search(r"^lean_lib Superopt where\n\s+globs := #\[\.submodules `Superopt\]", lakefile, re.M)
    exes = dict(re.findall(r"^lean_exe (\w+) where\n((?:[ \t]+.*\n?)+)", lakefile, re.M))
    assert set(exes) == {"superopt", "superopt_test"}
    for name, body in exes.items():
        root = re.search(r"root := `([\w.]+)", body)
        src = re.search(r'srcDir := "([^"]+)"', body)
        assert root, f"lean_exe {name} has no root"
        path = ROOT / (src[1] if src else ".") / (root[1].replace(".", "/") + ".lean")
        assert path.is_file(), f"lean_exe {name}: {path} does not exist"
    assert re.search(r'testDriver := "superopt_test"', lakefile)


def test_lean_tile_checks_are_pythons_interval_reasoning() -> None:
    """`tests/lean/SuperoptTest.lean`'s masked-tile checks (run by `lake test` over the proved
    `Pred.allFalse` / `skippedOk` of Superopt/Masks.lean) give the answers of `pyrunner.plan.masks`,
    which the renderer and the executor use: the same tiles all false, the same loop steps run."""
    from pyrunner.plan import masks

    src = code(LEAN_TEST_DIR / "SuperoptTest.lean")
    body = re.search(r"def windowMask : Pred :=(.*?)\n\n", src, re.S)[1]
    atoms = [masks.Atom(tuple(sorted((a, int(c)) for a, c in re.findall(r'\("(\w+)", (-?\d+)\)', coef))), int(off))
             for coef, off in re.findall(r"⟨\[(.*?)\], (-?\d+)⟩", body)]
    assert len(atoms) == 2
    pred = masks.All(tuple(atoms))
    axis, lo, hi = re.search(r'def queryBlock : Box := fun a => if a = "(\w+)" then \((\d+), (\d+)\)', src).groups()
    box = {axis: (int(lo), int(hi))}
    tiles = re.findall(r'(!?)\(?windowMask\.allFalse \(stepBox queryBlock "(\w+)" (\d+) (\d+)\)', src)
    assert len(tiles) == 4
    for negated, s, block, j in tiles:
        b, j = int(block), int(j)
        test = masks.tile_test(pred, {**box, s: (j * b, j * b + b - 1)}, masks.IntArith())
        assert (test.all_false is not None and test.all_false > 0) == (negated == ""), (j, test)
    run = r'run, the rest are masked", skippedOk windowMask queryBlock "(\w+)" (\d+) (\d+) (\d+) (\d+)\)'
    s, block, steps, run_lo, run_hi = re.search(run, src).groups()
    assert masks.visible_steps(pred, s, int(block), int(steps), box) == range(int(run_lo), int(run_hi))


def _lean_schedule_examples(name: str = "scheduleExamples") -> list[tuple[str, dict, bool]]:
    src = code(LEAN_TEST_DIR / "SuperoptTest.lean")
    body = re.search(rf"def {name} : List \(String × String × Bool\) := \[(.*?)\]\n\n", src, re.S)
    assert body, f"def {name} not found in tests/lean/SuperoptTest.lean"
    cases = re.findall(r'\(\s*"((?:[^"\\]|\\.)*)",\s*"((?:[^"\\]|\\.)*)",\s*(true|false)\)', body[1])
    return [(label, json.loads(json.loads(f'"{text}"')), want == "true") for label, text, want in cases]


def test_lean_schedule_examples_are_pythons_answers() -> None:
    """`tests/lean/SuperoptTest.lean` expects `kernelProblem` (Superopt/Schedule.lean) to accept or refuse
    each small kernel as `pyrunner.plan.schedule_rules.kernel_problem` does: the same loop forms, the same
    masked-tile skips (a window narrowed in `visible`, a skip with no mask, fused contractions over
    different axes, a partial tile left unmasked all refused on both sides)."""
    from pyrunner.plan.schedule_rules import kernel_problem

    cases = _lean_schedule_examples()
    assert len(cases) >= 10 and {want for _, _, want in cases} == {True, False}
    for label, doc, want in cases:
        assert (kernel_problem(doc["kernel"], doc["sizes"], doc["masks"]) is None) == want, label


def test_lean_run_range_is_the_renderers() -> None:
    """Lean's `runRange` (the steps `maskedSkipOk` lets a block run) on the window example is the step range
    the renderer and executor run (`masks.visible_steps`), and the Python mirror's scan agrees."""
    from pyrunner.plan import masks
    from pyrunner.plan.schedule_rules import run_range

    src = code(LEAN_TEST_DIR / "SuperoptTest.lean")
    s, block, steps, lo, hi = re.search(
        r'runRange windowMask queryBlock "(\w+)" (\d+) (\d+) == \((\d+), (\d+)\)', src).groups()
    body = re.search(r"def windowMask : Pred :=(.*?)\n\n", src, re.S)[1]
    atoms = [masks.Atom(tuple(sorted((a, int(c)) for a, c in re.findall(r'\("(\w+)", (-?\d+)\)', coef))), int(off))
             for coef, off in re.findall(r"⟨\[(.*?)\], (-?\d+)⟩", body)]
    pred = masks.All(tuple(atoms))
    box = {"t_q": (2048, 2111)}
    assert masks.visible_steps(pred, s, int(block), int(steps), box) == range(int(lo), int(hi))
    assert run_range(pred, box, s, int(block), int(steps)) == (int(lo), int(hi))


def test_lean_view_examples_are_pythons_answers() -> None:
    """`viewExamples` (Superopt/Schedule.lean's `viewProblem`): a split whose chunks miss part of the axis, a
    merge whose parts do not multiply to its extent, a unit axis of extent 2 are refused, as by
    `pyrunner.plan.schedule_rules.view_problem`."""
    from pyrunner.plan.schedule_rules import view_problem

    cases = _lean_schedule_examples("viewExamples")
    assert len(cases) >= 6 and {want for _, _, want in cases} == {True, False}
    for label, doc, want in cases:
        sizes: dict[str, int] = {}
        for t in doc.get("tensors", []):
            for a, n in zip(t["axes"], t["shape"], strict=True):
                sizes.setdefault(a, n)
        for a, n in doc["graph"]["axes"].items():
            sizes.setdefault(a, n)
        assert (view_problem(doc, sizes) is None) == want, label
