"""JSON form of a graph, so a user can hand the tool an operator of their own.

Format (one JSON object)::

    {
      "name":    "MyOp",                                  # graph name (string)
      "axes":    {"m": 64, "d": 32, "n": 48},             # every axis and its size (integer > 0)
      "inputs":  {"X": ["m", "d"], "W": ["d", "n"]},      # input name -> its axes, in memory order
      "nodes": [                                          # in order: operands before their users
        {"name": "H", "op": "matmul", "args": ["X", "W"], "contract": "d"},
        {"name": "A", "op": "silu", "args": ["H"]},
        {"name": "C", "op": "mul", "args": ["A", 0.5]},
        {"name": "R", "op": "sum", "args": ["A"], "axis": "n"},
        {"name": "P", "op": "softmax", "args": ["H"], "axis": "n"},
        {"name": "Z", "op": "rmsnorm", "args": ["X"], "axis": "d", "eps": 1e-6},
        {"name": "L", "op": "layernorm", "args": ["X"], "axis": "d", "eps": 1e-5},
        {"name": "k", "op": "size", "axis": "d"},
        {"name": "c", "op": "const", "value": 2.0}
      ],
      "outputs": ["C", "R"]
    }

Node kinds (``op``):

- unary functions (``exp``, ``silu``, ...: every entry of ``pyrunner.ir.ops.UNARY``): ``args`` has
  one operand.
- binary ``add sub mul div max min`` (``ops.BINARY``): two operands, broadcast by axis name.
- reductions ``sum max mean`` (``ops.REDUCTIONS``) with ``"axis"``: one operand. ``max`` is the
  reduction when ``axis`` is given and the binary maximum otherwise.
- comparisons ``lt le`` (``a < b``, ``a <= b``): two operands, the value 1.0 where true, else 0.0;
  ``min``/``max`` of such values are logical and/or.
- ``where`` (``graph.TERNARY_OPS``): three operands ``[c, x, y]``, x where c != 0, else y.
- ``iota`` with ``"axis"``: the index 0, 1, ... along that axis, no args. Masks are built from these:
  causal is ``where(le(iota t_kv, iota t_q), S, "-inf")``.
- ``matmul`` with ``"contract"``: two operands that both have the contracted axis.
- helpers ``softmax`` / ``rmsnorm`` / ``layernorm`` with ``"axis"`` (and optional ``"eps"``, defaults
  1e-6 / 1e-5): expanded into primitive ops by ``GraphBuilder``, so rewrite rules see through them.
- ``size`` with ``"axis"`` (the axis extent as a scalar) and ``const`` with ``"value"``: no args
  (an empty ``"args": []`` is accepted for these and ``iota``).

An operand is the name of an input or of an *earlier* node, a number literal (a constant), or one
of the strings ``"-inf"`` / ``"inf"`` (infinite constants; so no node or input may have those names).
Node names must be unique and distinct from input names; they become ``Graph.labels``. An output is
a node or input name, or ``{"name": OUT, "node": NODE}`` to give the output another name. Nodes
no output depends on are allowed and dropped.

``graph_to_json`` emits primitive nodes only (helpers are already expanded in a ``Graph``) and uses
the labels as node names where it can, generating ``t<N>`` names otherwise, so
``graph_from_json(graph_to_json(g))`` has the same output terms and sizes as ``g``. Every problem
raises ``GraphError`` with one message naming the field or node at fault.

Why one module: reading and writing are the two halves of the one format specified above; kept
together so the round trip ``graph_from_json(graph_to_json(g))`` stays visibly exact.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from pyrunner.errors import GraphError
from pyrunner.files import read_text_bounded
from pyrunner.ir.graph import (
    BINARY_OPS,
    MAX_AXIS_SIZE,
    REDUCE_OPS,
    TERNARY_OPS,
    UNARY_OPS,
    Graph,
    GraphBuilder,
    Tensor,
    Term,
    check,
    reads_input,
    result_axes,
    with_unit_axis,
)
from pyrunner.ir.names import MAX_GRAPH_NAME, check_name

HELPER_OPS = ("softmax", "rmsnorm", "layernorm")
NULLARY_OPS = ("size", "const", "iota")
HELPER_EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}
NODE_OPS = tuple(dict.fromkeys(UNARY_OPS + BINARY_OPS + TERNARY_OPS + REDUCE_OPS + ("matmul",) + HELPER_OPS
                               + NULLARY_OPS))
INFINITE = {"-inf": -math.inf, "inf": math.inf}
"""Infinite constants are written as these strings (JSON has no infinity)."""
MAX_NODES = 5000
"""Most nodes a graph file may list (a helper such as layernorm expands to a handful of terms)."""
MAX_AXES = MAX_NODES
"""Most axes a graph may name: a chain of matmuls names an axis per link (a 300-matmul chain has 301),
so the graph's axis table is bounded as its nodes are; a tensor's rank is bounded by ``MAX_RANK``."""
MAX_RANK = 24
"""Most axes one input may have (numpy and torch stop at 64 dimensions; a plan adds at most a few)."""
_TOP_FIELDS = ("name", "axes", "inputs", "nodes", "outputs")
_GENERATED = re.compile(r"t[0-9]+")


# --- reading -------------------------------------------------------------------

def _json_type(x: object) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, (int, float)):
        return "number"
    if isinstance(x, str):
        return "string"
    if isinstance(x, list):
        return "list"
    if isinstance(x, dict):
        return "object"
    return type(x).__name__


def _short(x: object, limit: int = 60) -> str:
    s = repr(x)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _finite(x: int | float) -> bool:
    """A JSON number that is a finite float (an integer like 10**400 is not: it overflows)."""
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _name(x: object, field: str) -> str:
    if not isinstance(x, str) or not x:
        raise GraphError(f"{field}: expected a non-empty string, got {_json_type(x)} {_short(x)}")
    return check_name(x, field, MAX_GRAPH_NAME, GraphError)


def _sizes(data: object) -> dict[str, int]:
    if not isinstance(data, dict):
        raise GraphError(f"graph field 'axes': expected an object axis -> size, got {_json_type(data)}")
    if not data:
        raise GraphError("graph field 'axes': a graph needs at least one axis")
    if len(data) > MAX_AXES:
        raise GraphError(f"graph field 'axes': {len(data)} axes; the limit is {MAX_AXES}")
    sizes: dict[str, int] = {}
    for axis, n in data.items():
        _name(axis, "graph field 'axes'")
        if not _is_number(n) or (isinstance(n, float) and not n.is_integer()):
            raise GraphError(f"axes.{axis}: size must be a positive integer, got {_json_type(n)} {_short(n)}")
        if n <= 0:
            raise GraphError(f"axes.{axis}: size must be a positive integer, got {n}")
        if n > MAX_AXIS_SIZE:
            raise GraphError(f"axes.{axis}: size {_short(n)} is too large; the limit is {MAX_AXIS_SIZE} (2**31 - 1)")
        sizes[axis] = int(n)
    return sizes


class _Reader:
    """Builds the graph node by node, checking each node as it comes."""

    def __init__(self, name: str, sizes: dict[str, int]) -> None:
        self.b = GraphBuilder(name)
        self.b.sizes = dict(sizes)
        self.sizes = sizes
        self.env: dict[str, Tensor] = {}
        self.later: set[str] = set()
        self.input_names: set[str] = set()
        self.current = ""
        self.memo: dict[Term, tuple[str, ...]] = {}

    def axis(self, where: str, node: dict, key: str) -> str:
        if key not in node:
            raise GraphError(f"{where}: missing field {key!r}")
        a = node[key]
        if not isinstance(a, str) or a not in self.sizes:
            raise GraphError(f"{where}: field {key!r} names unknown axis {_short(a)}; "
                             f"graph axes are {sorted(self.sizes)}")
        return a

    def inputs(self, data: object) -> None:
        if not isinstance(data, dict):
            raise GraphError(f"graph field 'inputs': expected an object name -> [axes], got {_json_type(data)}")
        if not data:
            raise GraphError("graph field 'inputs': a graph needs at least one input")
        for name, axes in data.items():
            _name(name, "graph field 'inputs'")
            if name in INFINITE:
                raise GraphError(f"inputs: {name!r} cannot name an input (it is the constant {name})")
            if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
                raise GraphError(f"inputs.{name}: expected a list of axis names, got {_short(axes)}")
            for a in axes:
                if a not in self.sizes:
                    raise GraphError(f"inputs.{name}: unknown axis {a!r}; graph axes are {sorted(self.sizes)}")
            if len(set(axes)) != len(axes):
                raise GraphError(f"inputs.{name}: repeats an axis: {axes}")
            if len(axes) > MAX_RANK:
                raise GraphError(f"inputs.{name}: {len(axes)} axes; the limit is {MAX_RANK}")
            t = self.b.input(name, **{a: self.sizes[a] for a in axes})
            self.env[name] = t
            self.input_names.add(name)

    def operand(self, where: str, x: object) -> Tensor:
        if _is_number(x):
            if not _finite(x):
                raise GraphError(f"{where}: constant operand must be finite, got {x}")
            return self.b.const(float(x))
        if isinstance(x, str) and x in INFINITE:
            return self.b.const(INFINITE[x])
        if not isinstance(x, str):
            raise GraphError(f"{where}: an operand must be a node/input name or a number, "
                             f"got {_json_type(x)} {_short(x)}")
        if x in self.env:
            return self.env[x]
        if x == self.current:
            raise GraphError(f"{where}: node refers to itself (cycles are not allowed)")
        if x in self.later:
            raise GraphError(f"{where}: refers to {x!r}, which is defined later; nodes must come after "
                             f"their operands (cycles are not allowed)")
        raise GraphError(f"{where}: refers to undefined {x!r}; defined so far: {', '.join(self.env)}")

    def args(self, where: str, node: dict, arity: int) -> list[Tensor]:
        raw = node.get("args")
        if not isinstance(raw, list):
            raise GraphError(f"{where}: field 'args' must be a list of {arity} operand(s), "
                             f"got {_json_type(raw) if 'args' in node else 'nothing'}")
        if len(raw) != arity:
            raise GraphError(f"{where}: op {node['op']!r} takes {arity} operand(s), got {len(raw)}")
        return [self.operand(f"{where} args[{i}]", x) for i, x in enumerate(raw)]

    def axes_of(self, t: Tensor) -> tuple[str, ...]:
        return result_axes(t.term, self.memo)

    def need_axis(self, where: str, t: Tensor, axis: str, what: str) -> None:
        if axis not in self.axes_of(t):
            raise GraphError(f"{where}: {what} axis {axis!r}, but its operand has axes {list(self.axes_of(t))}")

    def node(self, i: int, node: object) -> None:
        if not isinstance(node, dict):
            raise GraphError(f"nodes[{i}]: expected an object, got {_json_type(node)} {_short(node)}")
        label = _name(node.get("name"), f"nodes[{i}] field 'name'")
        where = f"node {label!r} (nodes[{i}])"
        if label in INFINITE:
            raise GraphError(f"{where}: {label!r} cannot name a node (it is the constant {label})")
        if label in self.env:
            kind = "an input" if label in self.input_names else "an earlier node"
            raise GraphError(f"{where}: name {label!r} is already used by {kind}")
        self.current = label
        op = node.get("op")
        if not isinstance(op, str) or op not in NODE_OPS:
            raise GraphError(f"{where}: unknown op {_short(op)}; known ops: {', '.join(NODE_OPS)}")
        allowed = {"name", "op"} | set(self._fields(op, node))
        if op in NULLARY_OPS and "args" in node:
            if node["args"] != []:
                raise GraphError(f"{where}: op {op!r} takes no operands, got args {_short(node['args'])}")
            allowed.add("args")  # an empty operand list is what a generic writer emits
        extra = sorted(set(node) - allowed, key=str)
        if extra:
            raise GraphError(f"{where}: unknown field {extra[0]!r} for op {op!r}; "
                             f"allowed fields: {', '.join(sorted(allowed))}")
        t = self._build(where, op, node)
        self.b.labels.setdefault(t.term, label)
        self.env[label] = t

    @staticmethod
    def _fields(op: str, node: dict) -> tuple[str, ...]:
        if op in REDUCE_OPS and (op not in BINARY_OPS or "axis" in node):
            return ("args", "axis")
        if op in UNARY_OPS or op in BINARY_OPS:
            return ("args",)
        return {"matmul": ("args", "contract"), "softmax": ("args", "axis"),
                "rmsnorm": ("args", "axis", "eps"), "layernorm": ("args", "axis", "eps"),
                "size": ("axis",), "const": ("value",), "iota": ("axis",), "where": ("args",)}[op]

    def _build(self, where: str, op: str, node: dict) -> Tensor:
        b = self.b
        if op in REDUCE_OPS and (op not in BINARY_OPS or "axis" in node):
            (x,) = self.args(where, node, 1)
            axis = self.axis(where, node, "axis")
            self.need_axis(where, x, axis, "reduces over")
            return b.reduce(op, x, axis)
        if op in UNARY_OPS:
            (x,) = self.args(where, node, 1)
            return b.unary(op, x)
        if op in BINARY_OPS:
            x, y = self.args(where, node, 2)
            return b.binary(op, x, y)
        if op in TERNARY_OPS:
            c, x, y = self.args(where, node, 3)
            return b.where(c, x, y)
        if op == "matmul":
            x, y = self.args(where, node, 2)
            axis = self.axis(where, node, "contract")
            for side, t in (("left", x), ("right", y)):
                if axis not in self.axes_of(t):
                    raise GraphError(f"{where}: contracts axis {axis!r}, which both operands must have; "
                                     f"the {side} operand has axes {list(self.axes_of(t))}")
            return b.matmul(x, y, axis)
        if op in HELPER_OPS:
            (x,) = self.args(where, node, 1)
            axis = self.axis(where, node, "axis")
            self.need_axis(where, x, axis, f"{op} over")
            if op == "softmax":
                return b.softmax(x, axis)
            eps = node.get("eps", HELPER_EPS[op])
            if not _is_number(eps) or not _finite(eps) or eps < 0:
                raise GraphError(f"{where}: field 'eps' must be a finite number >= 0, got {_short(eps)}")
            return b.rmsnorm(x, axis, float(eps)) if op == "rmsnorm" else b.layernorm(x, axis, float(eps))
        if op == "size":
            return b.size(self.axis(where, node, "axis"))
        if op == "iota":
            return b.iota(self.axis(where, node, "axis"))
        # const
        if "value" not in node:
            raise GraphError(f"{where}: missing field 'value'")
        v = node["value"]
        if isinstance(v, str) and v in INFINITE:
            return b.const(INFINITE[v])
        if not _is_number(v) or not _finite(v):
            raise GraphError(f"{where}: field 'value' must be a finite number or \"-inf\"/\"inf\", got {_short(v)}")
        return b.const(float(v))

    def outputs(self, data: object) -> tuple[tuple[str, Term], ...]:
        if not isinstance(data, list) or not data:
            raise GraphError("graph field 'outputs': expected a non-empty list of node names")
        outs: list[tuple[str, Term]] = []
        for i, o in enumerate(data):
            where = f"outputs[{i}]"
            if isinstance(o, dict):
                extra = sorted(set(o) - {"name", "node"}, key=str)
                if extra:
                    raise GraphError(f"{where}: unknown field {extra[0]!r}; allowed fields: name, node")
                out_name = _name(o.get("name"), f"{where} field 'name'")
                ref = _name(o.get("node"), f"{where} field 'node'")
            else:
                out_name = ref = _name(o, where)
            if ref not in self.env:
                raise GraphError(f"{where}: names undefined node {ref!r}; defined: {', '.join(self.env)}")
            if out_name in (n for n, _ in outs):
                raise GraphError(f"{where}: output {out_name!r} is listed twice")
            t = self.env[ref]
            if t.term.op == "input":
                raise GraphError(f"{where}: output {out_name!r} is the input {t.term.name!r} itself; an output "
                                 f"must be computed by a node (outputs aliased to inputs are not allowed)")
            if out_name in self.env and self.env[out_name].term is not t.term:
                kind = "an input" if out_name in self.input_names else "another node"
                raise GraphError(f"{where}: output name {out_name!r} is already the name of {kind}")
            if not self.axes_of(t) and not reads_input(t.term):
                raise GraphError(f"{where}: output {out_name!r} is a scalar that reads no input; an output "
                                 f"must be computed from the inputs")
            outs.append((out_name, t.term))
        return tuple(outs)


def graph_from_json(data: object) -> Graph:
    """The graph a JSON document (already parsed) describes; GraphError on any problem."""
    if not isinstance(data, dict):
        raise GraphError(f"a graph must be a JSON object, got {_json_type(data)}")
    missing = [f for f in _TOP_FIELDS if f not in data]
    if missing:
        raise GraphError(f"graph is missing field {missing[0]!r} (a graph has fields {', '.join(_TOP_FIELDS)})")
    extra = sorted(set(data) - set(_TOP_FIELDS), key=str)
    if extra:
        raise GraphError(f"graph has unknown field {extra[0]!r}; allowed fields: {', '.join(_TOP_FIELDS)}")
    name = _name(data["name"], "graph field 'name'")
    r = _Reader(name, _sizes(data["axes"]))
    r.inputs(data["inputs"])
    nodes = data["nodes"]
    if not isinstance(nodes, list):
        raise GraphError(f"graph field 'nodes': expected a list, got {_json_type(nodes)}")
    if len(nodes) > MAX_NODES:
        raise GraphError(f"graph field 'nodes': {len(nodes)} nodes; the limit is {MAX_NODES}")
    r.later = {n["name"] for n in nodes if isinstance(n, dict) and isinstance(n.get("name"), str)}
    for i, node in enumerate(nodes):
        r.node(i, node)
    outputs = r.outputs(data["outputs"])
    g = Graph(name, dict(r.sizes), outputs)
    live = set(g.terms())
    # names graph_to_json generates (t1, t2, ...) are not the author's: keeping them as labels
    # would rename a plan's buffers after a write/read round trip
    labels = {t: n for t, n in r.b.labels.items() if t in live and not _GENERATED.fullmatch(n)}
    for n, t in outputs:  # the output name wins, as in GraphBuilder.output
        labels[t] = n
    g = with_unit_axis(Graph(name, dict(r.sizes), outputs, labels))
    check(g)
    return g


MAX_JSON_DEPTH = 512
"""Deepest JSON nesting read (a Map expression nests two levels per call; pydantic stops near 250 calls)."""
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\[\s\S])*+"?')
"""A JSON string, matched in linear time: possessive repeats never backtrack, and an unterminated
string runs to the end of the text instead of being retried from every later quote (quadratic: 100 KB
of ``\\"`` took minutes). JSON text has no string left open, so the closing quote is optional here."""
_OPEN = (ord("["), ord("{"))
_CLOSE = (ord("]"), ord("}"))


def _reject_constant(s: str) -> float:
    raise ValueError(f"{s} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def json_depth(text: str) -> int:
    """Deepest nesting of objects and lists in JSON text (strings skipped), without parsing it."""
    import numpy as np

    bare = _JSON_STRING.sub("", text).encode("utf-8", "replace")
    a = np.frombuffer(bare, dtype=np.uint8)
    steps = np.isin(a, _OPEN).astype(np.int64) - np.isin(a, _CLOSE).astype(np.int64)
    return int(np.cumsum(steps).max()) if steps.size else 0


def parse_json_text(text: str, what: str, error: type[Exception]) -> object:
    """Strict JSON (no NaN/Infinity, no duplicate keys, at most MAX_JSON_DEPTH deep); ``error``
    with one line on failure."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{what}: JSON is nested too deeply ({depth} levels; the limit is {MAX_JSON_DEPTH})")
    try:
        return json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise error(f"{what}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:
        raise error(f"{what}: not valid JSON: {e}") from None
    except RecursionError:
        raise error(f"{what}: JSON is nested too deeply") from None


def read_json_file(path: str | Path, what: str, error: type[Exception]) -> object:
    """Read (bounded, regular files only) and parse a JSON file; every problem becomes ``error``."""
    text = read_text_bounded(path, what, error)
    return parse_json_text(text, f"{what} file {str(path)!r}", error)


def load_graph_file(path: str | Path) -> Graph:
    """Load and type-check a graph JSON file."""
    data = read_json_file(path, "graph", GraphError)
    try:
        return graph_from_json(data)
    except GraphError as e:
        raise GraphError(f"graph file {str(path)!r}: {e}") from None


# --- writing -------------------------------------------------------------------

def _num(v: float) -> int | float | str:
    if math.isinf(v):
        return "-inf" if v < 0 else "inf"
    return int(v) if float(v).is_integer() and abs(v) < 2**53 else v


def graph_to_json(g: Graph) -> dict:
    """The JSON form of g: primitive nodes, named by their labels where possible."""
    terms = g.terms()
    inputs = [t for t in terms if t.op == "input"]
    used: set[str] = {t.name for t in inputs}
    names: dict[Term, str] = {t: t.name for t in inputs}

    def claim(t: Term, want: str | None) -> None:
        if t in names or t.op == "const" or not want or want in used:
            return
        names[t] = want
        used.add(want)

    for out, t in g.outputs:
        claim(t, out)
    used |= {out for out, _ in g.outputs}  # an output naming an already named value: no other node takes its name
    for t in terms:
        claim(t, g.labels.get(t))
    counter = 0
    for t in terms:
        while t not in names and t.op != "const":
            counter += 1
            claim(t, f"t{counter}")

    def ref(t: Term) -> str | int | float:
        return _num(t.value) if t.op == "const" else names[t]

    nodes: list[dict] = []
    for t in terms:
        if t.op in ("input", "const"):
            continue
        node: dict[str, Any] = {"name": names[t]}
        if t.op == "axis_size":
            node.update(op="size", axis=t.axis)
        elif t.op == "iota":
            node.update(op="iota", axis=t.axis)
        elif t.op in ("unary", "binary", "ternary"):
            node.update(op=t.fn, args=[ref(a) for a in t.args])
        elif t.op == "reduce":
            node.update(op=t.fn, args=[ref(t.args[0])], axis=t.axis)
        elif t.op == "matmul":
            node.update(op="matmul", args=[ref(a) for a in t.args], contract=t.axis)
        else:
            raise GraphError(f"cannot write op {t.op!r} as JSON")
        nodes.append(node)
    outputs: list[Any] = [n if names.get(t) == n else {"name": n, "node": ref(t)} for n, t in g.outputs]
    return {
        "name": g.name,
        "axes": dict(g.sizes),
        "inputs": {t.name: list(t.axes) for t in inputs},
        "nodes": nodes,
        "outputs": outputs,
    }
