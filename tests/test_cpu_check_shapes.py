"""The CPU check's shapes keep what the plan's constants test (issue 46).

Scaled down to t = 64, a 1024-wide sliding window never bites, so a plan with its window dropped or
changed passed ``run``. ``scale_down`` now keeps every axis a mask compares with a constant well past
that constant, and the runner executes with ``audit`` (skipped tiles are run and must change nothing).
Each mutation below keeps a well-formed plan (its hash recomputed). Two independent checks stand
between it and a pass: ``validate`` replays the plan's certificate (the kernel's masks and constants
must come from the terms it certifies), and, for a plan read past that check (schema only), the
CPU check at shapes where the edit bites. Both must reject it.
"""

from __future__ import annotations

import json
import math
from functools import partial

import pytest

from pyrunner.errors import PlanError
from pyrunner.ir import catalog
from pyrunner.plan.schema import Plan, plan_document, with_hash
from pyrunner.plan.validate import validate_plan
from pyrunner.planner import search
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import compared_constants, cpu_check_plan
from pyrunner.run.verify import verify_executor

WINDOW = 96.0
_CACHE: dict[str, str] = {}


def _swa_text() -> str:
    if "swa" not in _CACHE:
        g = catalog.sliding_window_attention(h=2, t_q=384, t_kv=384, d=64, window=int(WINDOW))
        _CACHE["swa"] = json.dumps(plan_document(search(g, "fp16", tuning=False)[0]))
    return _CACHE["swa"]


def _checked(text: str, *, certified: bool = True):
    """The CPU check of the plan in ``text``; ``certified=False`` reads it schema-only (no certificate
    replay), so the CPU check is tested on its own."""
    plan = validate_plan(json.loads(text)) if certified else Plan.model_validate(json.loads(text))
    small = cpu_check_plan(plan)
    return verify_executor(small, graph_of(small), partial(execute, audit=True), seed=3), small


def _rehashed(text: str) -> str:
    return json.dumps(plan_document(with_hash(Plan.model_validate(json.loads(text)))))


_WINDOW_ATOM = ('{"kind": "call", "fn": "lt", "args": [{"kind": "call", "fn": "sub", "args": [{"kind": "index", '
                '"axis": "t_q"}, {"kind": "const", "value": 96.0}]}, {"kind": "index", "axis": "t_kv"}]}')
_CAUSAL_ATOM = ('{"kind": "call", "fn": "le", "args": [{"kind": "index", "axis": "t_kv"}, '
                '{"kind": "index", "axis": "t_q"}]}')


def test_the_unedited_plan_passes_at_shapes_where_its_window_bites() -> None:
    text = _swa_text()
    assert text.count(_WINDOW_ATOM) >= 2 and text.count(_CAUSAL_ATOM) >= 2
    res, small = _checked(text)
    assert res.ok, res.message
    sizes = dict(graph_of(small).sizes)
    assert compared_constants(small)["t_kv"] == WINDOW
    assert sizes["t_q"] > 1.5 * WINDOW and sizes["t_kv"] > 1.5 * WINDOW


MUTATIONS = {
    "window widened": lambda s: s.replace('"value": 96.0', '"value": 192.0'),
    "window narrowed": lambda s: s.replace('"value": 96.0', '"value": 48.0'),
    "window dropped": lambda s: s.replace(_WINDOW_ATOM, '{"kind": "const", "value": 1.0}'),
    "causal bound moved": lambda s: s.replace(_CAUSAL_ATOM, _CAUSAL_ATOM.replace('"le"', '"lt"')),
    "loop bounds narrowed only": lambda s: s.replace(
        '"visible": {"kind": "call", "fn": "min", "args": [' + _CAUSAL_ATOM + ", " + _WINDOW_ATOM,
        '"visible": {"kind": "call", "fn": "min", "args": [' + _CAUSAL_ATOM + ", "
        + _WINDOW_ATOM.replace("96.0", "32.0"), 1),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_an_edited_mask_fails_the_cpu_check(name: str) -> None:
    text = _swa_text()
    edited = MUTATIONS[name](text)
    assert edited != text, f"mutation {name!r} found nothing to edit"
    with pytest.raises(PlanError):
        validate_plan(json.loads(_rehashed(edited)))
    res, _ = _checked(_rehashed(edited), certified=False)
    assert not res.ok, f"{name}: {res.message}"


def test_a_matmul_with_its_rows_past_a_bound_zeroed_fails() -> None:
    """Issue 46's first wrong plan: rows m >= 2000 zeroed passed at m = 48."""
    plan = search(catalog.get("Matmul", {"m": 8192, "d": 256, "n": 256}), "fp16", tuning=False)[0]
    d = plan_document(plan)
    k = d["kernels"][0]
    store = next(op for op in k["epilogue"] if op["op"] == "store")
    keep = {"kind": "call", "fn": "lt", "args": [{"kind": "index", "axis": "m"}, {"kind": "const", "value": 2000.0}]}
    k["epilogue"].insert(k["epilogue"].index(store), {"op": "map", "dst": store["src"], "expr": {
        "kind": "call", "fn": "where", "args": [keep, {"kind": "ref", "buf": store["src"]},
                                                {"kind": "const", "value": 0.0}]}})
    with pytest.raises(PlanError):
        validate_plan(json.loads(_rehashed(json.dumps(d))))
    res, small = _checked(_rehashed(json.dumps(d)), certified=False)
    assert graph_of(small).sizes["m"] > 2000
    assert not res.ok, res.message


def test_a_partial_last_tile_at_the_real_shape_stays_partial_when_scaled() -> None:
    """Issue 46: the LM head (n = 50257) was checked at n = 64, so its partial last tile never ran."""
    from pyrunner.run.shrink import scale_down

    plan = search(catalog.get("Matmul", {"m": 4096, "d": 256, "n": 50257}), "fp16", tuning=False)[0]
    (k,) = plan.kernels
    assert 50257 % k.defaults["block_n"] and 4096 % k.defaults["block_m"] == 0
    small = scale_down(plan)
    sizes = dict(graph_of(small).sizes)
    (ks,) = small.kernels
    assert sizes["n"] % ks.defaults["block_n"] != 0 and sizes["n"] > 2 * ks.defaults["block_n"]
    assert sizes["m"] % ks.defaults["block_m"] == 0
    res = verify_executor(small, graph_of(small), partial(execute, audit=True), seed=5)
    assert res.ok, res.message


def test_scale_down_never_scales_an_axis_up() -> None:
    """An axis shorter than the small size it would be given keeps its own extent (where no other axis has
    it). A Llama layer's rotary region (``multi_rotary_qk_value_projection``, with 16 query heads where the
    layer has 32): its halves (2), heads (32) and half head dim (64) became 96, 144 and 112 wide, so its
    backward's CPU check asked the float64 reference for more than 16 GiB; the frontend took the failed
    check for a region without a backward plan and split it into six pieces, each slower than inductor's
    code (run 160)."""
    from pathlib import Path

    from pyrunner.ir.grad import derive
    from pyrunner.ir.graph_json import load_graph_file
    from pyrunner.plan.schema import axis_sizes
    from pyrunner.run.shrink import scale_down

    g = load_graph_file(Path(__file__).parent / "data" / "multi_rotary_qk_value_projection.json")
    (plan,) = search(derive(g).graph, "bf16", tuning=False)
    real, small = axis_sizes(plan), axis_sizes(scale_down(plan))
    grown = {a for a in real if small[a] > real[a]}
    assert grown == {a for a in grown if real[a] in {n for b, n in small.items() if b != a}}  # only where taken
    assert math.prod(small[a] for a in ("h", "s", "half", "hd")) <= math.prod(real[a] for a in ("h", "s", "half", "hd"))
