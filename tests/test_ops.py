"""The op table: every entry complete, and its numpy, PyTorch, sympy and TileLang forms agree.

The Lean names are compared with ``Superopt/Graph.lean`` in tests/test_lean_sources.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F

from pyrunner.ir.ops import (
    BINARY,
    ELEMENTWISE,
    REDUCTIONS,
    TERM_KINDS,
    TERNARY,
    TILE_REDUCTIONS,
    UNARY,
    Elementwise,
    Reduction,
    TermKind,
    entry_fields,
)
from pyrunner.plan.schema import EXPR_FUNCTIONS, json_schema

# points where every unary op is defined (log, sqrt, rsqrt need x > 0)
POINTS = (0.3, 0.7, 1.9)
BINARY_POINTS = ((0.3, 1.7), (-1.2, 0.5), (2.5, -0.4))


@pytest.mark.parametrize("table, cls", [(ELEMENTWISE, Elementwise), (REDUCTIONS, Reduction),
                                        (TERM_KINDS, TermKind)])
def test_every_entry_fills_every_field(table, cls) -> None:
    for name, entry in table.items():
        assert entry.name == name
        for f in entry_fields(cls):
            value = getattr(entry, f)
            assert value is not None and value != "", f"{cls.__name__} {name!r} lacks {f}"


def test_unary_and_binary_are_disjoint_and_arities_match() -> None:
    assert not set(UNARY) & set(BINARY) and not (set(UNARY) | set(BINARY)) & set(TERNARY)
    assert all(op.arity == 1 for op in UNARY.values()) and all(op.arity == 2 for op in BINARY.values())
    assert all(op.arity == 3 for op in TERNARY.values())
    assert EXPR_FUNCTIONS == {n: op.arity for n, op in ELEMENTWISE.items()}


def test_plan_schema_lists_exactly_the_table() -> None:
    defs = json_schema()["$defs"]
    assert defs["Call"]["properties"]["fn"]["enum"] == list(ELEMENTWISE)
    assert defs["Reduce"]["properties"]["fn"]["enum"] == list(TILE_REDUCTIONS)
    assert all(REDUCTIONS[r.tile].tile == r.tile for r in REDUCTIONS.values())
    assert all(r.combine in BINARY for r in REDUCTIONS.values())


def _torch_value(op: Elementwise, args: tuple[float, ...]) -> float:
    names = [f"a{i}" for i in range(len(args))]
    env = {"torch": torch, "F": F, **{n: torch.tensor(v, dtype=torch.float64) for n, v in zip(names, args)}}
    return float(eval(op.torch.format(*names), env))  # noqa: S307 - the table's own templates


def _sympy_value(op: Elementwise, args: tuple[float, ...]) -> float:
    return float(op.sympy(sp, *(sp.Float(a) for a in args)).evalf())


def _tilelang_value(op: Elementwise, args: tuple[float, ...]) -> float:
    """Evaluate the TileLang template with T.* bound to float64 math (the template's meaning)."""

    class T:
        float32 = staticmethod(float)
        exp = staticmethod(math.exp)
        exp2 = staticmethod(lambda x: 2.0**x)
        log = staticmethod(math.log)
        log1p = staticmethod(math.log1p)
        sqrt = staticmethod(math.sqrt)
        rsqrt = staticmethod(lambda x: 1.0 / math.sqrt(x))
        tanh = staticmethod(math.tanh)
        abs = staticmethod(abs)
        max = staticmethod(max)
        min = staticmethod(min)
        if_then_else = staticmethod(lambda c, a, b: a if c else b)

    names = [f"a{i}" for i in range(len(args))]
    env: dict = {"T": T, **dict(zip(names, args))}
    if op.helper:
        exec(f"def {op.name}(x):\n    {op.tilelang}\n", env)  # noqa: S102 - the table's own helper body
    return float(eval(op.emit_tilelang(names), env))  # noqa: S307


TERNARY_POINTS = ((1.0, 0.3, 1.7), (0.0, -1.2, 0.5), (-2.0, 2.5, -0.4))


def _cases(op: Elementwise) -> list[tuple[float, ...]]:
    return {1: [(x,) for x in POINTS], 2: list(BINARY_POINTS), 3: list(TERNARY_POINTS)}[op.arity]


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_forms_agree_with_the_numpy_reference(name: str) -> None:
    op = ELEMENTWISE[name]
    for args in _cases(op):
        want = float(op.numpy(*(np.float64(a) for a in args)))
        assert math.isfinite(want)
        for form, got in (("torch", _torch_value(op, args)), ("sympy", _sympy_value(op, args)),
                          ("tilelang", _tilelang_value(op, args))):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-12), f"{name} {form} at {args}"


def test_binary_scalar_forms_agree() -> None:
    for op in BINARY.values():
        if not op.torch_scalar:
            continue
        t = torch.tensor([0.3, -2.0, 5.0], dtype=torch.float64)
        got = eval(op.torch_scalar.format(t="t", c="1.5"), {"torch": torch, "t": t})  # noqa: S307
        assert np.allclose(got.numpy(), op.numpy(t.numpy(), 1.5))


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_forms_agree(name: str) -> None:
    r = REDUCTIONS[name]
    x = np.array([[0.3, -1.2, 2.5], [1.0, 0.25, -0.5]])
    want = r.numpy(x, 1)
    got_torch = eval(r.torch.format("t", 1), {"t": torch.tensor(x)}).numpy()  # noqa: S307
    got_sympy = [float(r.sympy(sp, [sp.Float(v) for v in row])) for row in x]
    assert np.allclose(got_torch, want) and np.allclose(got_sympy, want)
    # a streamed accumulator: identity, then combine tile results, equals the whole reduction
    combine = ELEMENTWISE[r.combine].numpy
    tile = REDUCTIONS[r.tile].numpy
    acc = np.full(2, r.identity)
    for j in range(3):
        acc = combine(acc, tile(x[:, j:j + 1], 1))
    whole = tile(x, 1)
    assert np.allclose(acc, whole)


def test_term_kind_shape_rules() -> None:
    from pyrunner.ir import graph as G

    x = G.inp("X", ("m", "d"))
    w = G.inp("W", ("d", "n"))
    r = G.reduce("sum", x, "d")
    assert G.result_axes(G.matmul(x, w, "d")) == ("m", "n")
    assert G.result_axes(G.binary("add", r, G.inp("Y", ("n", "m")))) == ("m", "n")
    assert G.result_axes(r) == ("m",)
    assert G.result_axes(G.unary("exp", x)) == ("m", "d")
    assert G.result_axes(G.const(1.0)) == () and G.result_axes(G.axis_size("m")) == ()


def test_cpu_executor_runs_every_function_of_the_table() -> None:
    """A Map calling every table function, executed tile by tile in float32, matches the float64 meaning."""
    from plan_fixtures import REFERENCES, elementwise4d_plan

    from pyrunner.run.executor import execute
    from pyrunner.run.verify import max_error

    plan = elementwise4d_plan(a=1, b=2, c=32, e=64)
    x = np.random.default_rng(0).standard_normal((1, 2, 32, 64)) * 0.7
    got = execute(plan, {"X": x}, exact=True)["Y"]
    assert max_error(got, REFERENCES["elementwise4d"]({"X": x})["Y"]) <= 1e-5  # float32 arithmetic
