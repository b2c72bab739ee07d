"""Unit axes: a batched matrix-vector contraction gets a row axis of extent 1 and a tensor-core tile.

Batched decode attention (``Q[b, h, d] @d K[b, h, t, d]``) has no row axis of its own; reading ``Q``
with an axis of extent 1 inserted is a view that changes no value, and lets the planner run the
flash-attention chain on one padded 64-row tile instead of summing products on CUDA cores (run 84:
3.0 ms where the bytes take 0.6). The plan keeps the author's graph; every caller converts through
``plan.views``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyrunner.errors import GraphError, PlanError
from pyrunner.ir.graph import GraphBuilder
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.ir.unit_axes import AxisUnit, add_unit, unit_candidate
from pyrunner.plan.schema import Plan, plan_document
from pyrunner.plan.validate import validate_plan
from pyrunner.plan.views import to_plan_layout, to_source_layout, view_of
from pyrunner.planner import search
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan
from pyrunner.run.verify import verify_executor

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def _decode(b: int = 4, h: int = 2, t: int = 256, d: int = 64):
    g = GraphBuilder("Decode")
    q = g.input("Q", b=b, h=h, d=d)
    k, v = g.input("K", b=b, h=h, t=t, d=d), g.input("V", b=b, h=h, t=t, d=d)
    g.output("O", g.matmul(g.softmax(g.mul(g.matmul(q, k, contract="d"), 0.125), axis="t"), v, contract="t"))
    return g.build()


@pytest.fixture(scope="module")
def small_decode_plan() -> Plan:
    """The best plan of a small decode graph, planned once for the tests that read or edit its document."""
    return search(_decode(b=2, h=2, t=128, d=64), "bf16", tuning=False)[0]


def test_a_batched_query_vector_takes_the_unit_axis() -> None:
    unit = unit_candidate(_decode())
    assert unit == AxisUnit("unit", (("Q", 2),))


def test_a_query_scaled_elementwise_still_reaches_its_input() -> None:
    g = GraphBuilder("ScaledQuery")
    q = g.mul(g.input("Q", b=2, h=2, d=32), g.input("s", d=32))
    k, v = g.input("K", b=2, h=2, t=64, d=32), g.input("V", b=2, h=2, t=64, d=32)
    g.output("O", g.matmul(g.softmax(g.matmul(q, k, contract="d"), axis="t"), v, contract="t"))
    assert unit_candidate(g.build()) == AxisUnit("unit", (("Q", 2),))


def test_a_projected_query_takes_the_axis_on_its_weight_and_attention_reads_it_through() -> None:
    graph = load_graph_file(ROOT / "benchmarks" / "graphs" / "projected_decode_batched.json")
    assert unit_candidate(graph) == AxisUnit("unit", (("Wq", 2),))  # not K: P reads Wq already
    plan = search(graph, "bf16", tuning=False)[0]
    assert plan.derivation[0].rule == "unit_axis"
    assert sum(op.op == "gemm" for k in plan.kernels for op in k.body) >= 2  # the flash chain's two
    small = cpu_check_plan(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, res.message


@pytest.mark.parametrize("path", ["benchmarks/graphs/gemv_softmax_decode.json", "tests/data/attention_gqa_decode.json"])
def test_no_unit_axis_without_batch_axes_or_where_rows_exist(path: str) -> None:
    # the decode GEMV has no batch axis (its two-axis product streams at bandwidth); GQA has query rows
    assert unit_candidate(load_graph_file(ROOT / path)) is None


def test_no_unit_axis_for_a_batched_dot_product() -> None:
    # neither operand has a free axis: one unit axis would still leave the other side without one
    g = GraphBuilder("BatchedDot")
    g.output("O", g.matmul(g.input("P", b=4, h=2, t=64), g.input("V", b=4, h=2, t=64), contract="t"))
    assert unit_candidate(g.build()) is None


def test_the_unit_axis_changes_no_value() -> None:
    src = _decode(b=2, h=3, t=16, d=8)
    unit = unit_candidate(src)
    widened = add_unit(src, unit)
    assert widened.sizes["unit"] == 1
    x = random_inputs(src, 3)
    out = evaluate(widened, {**x, "Q": x["Q"].reshape(2, 3, 1, 8)})["O"]
    assert out.shape == (2, 3, 1, 8)
    np.testing.assert_array_equal(out.reshape(2, 3, 8), evaluate(src, x)["O"])


@pytest.mark.parametrize(("unit", "match"), [
    (AxisUnit("d", (("Q", 0),)), "taken or not a name"),
    (AxisUnit("u", (("Nope", 0),)), "not an input"),
    (AxisUnit("u", (("Q", 9),)), "position 9 is outside"),
    (AxisUnit("u", ()), "at least one"),
])
def test_bad_unit_specs_are_refused(unit: AxisUnit, match: str) -> None:
    with pytest.raises(GraphError, match=match):
        add_unit(_decode(), unit)


def test_batched_decode_plans_on_the_tensor_cores_and_verifies_on_the_cpu() -> None:
    graph = load_graph_file(DATA / "attention_mha_decode_batched.json")
    plan = search(graph, "bf16", tuning=False)[0]
    assert [u.model_dump() for u in plan.axis_units] == [{"axis": "unit", "inputs": ["Q"], "positions": [2]}]
    assert plan.derivation[0].rule == "unit_axis"
    assert plan.graph["inputs"]["Q"] == ["b", "h", "d"]  # the author's graph, unchanged
    assert any(op.op == "gemm" for k in plan.kernels for op in k.body)
    q, o = (next(t for t in plan.tensors if t.name == n) for n in ("Q", "O"))
    assert (q.shape, o.shape) == ([64, 16, 1, 128], [64, 16, 1, 128])
    validate_plan(plan_document(plan))
    small = cpu_check_plan(plan)
    res = verify_executor(small, graph_of(small), execute)
    assert res.ok, res.message


def test_unit_views_round_trip(small_decode_plan: Plan) -> None:
    plan = small_decode_plan
    view = view_of(plan)
    q = next(t for t in plan.tensors if t.name == "Q")
    x = np.arange(2 * 2 * 64, dtype=np.float32).reshape(2, 2, 64)
    stored = to_plan_layout(x, ("b", "h", "d"), q.axes, view)
    assert list(stored.shape) == q.shape
    np.testing.assert_array_equal(to_source_layout(stored, q.axes, ("b", "h", "d"), view), x)


def test_a_plan_whose_unit_inputs_and_positions_disagree_is_refused(small_decode_plan: Plan) -> None:
    plan = small_decode_plan
    doc = plan_document(plan)
    doc["axis_units"][0]["positions"] = [2, 0]
    with pytest.raises(PlanError, match=r"axis_units\[0\]: 1 inputs but 2 positions"):
        validate_plan(json.loads(json.dumps(doc)))
    doc["axis_units"][0].update(positions=[2], inputs=["K"])  # the unit on K: the tensors say it is Q's
    with pytest.raises(PlanError, match=r"input 'Q' has axes \['b', 'h', 'unit', 'd'\], but the graph's"):
        validate_plan(json.loads(json.dumps(doc)))
    doc["axis_units"][0].update(inputs=["Q"], axis="bad name!")  # names pass the one validator
    with pytest.raises(PlanError, match=r"axis_units\[0\]\.axis: name 'bad name!' is not an ASCII identifier"):
        validate_plan(json.loads(json.dumps(doc)))
    assert Plan.model_validate(plan_document(plan)).axis_units == plan.axis_units


@pytest.mark.parametrize("edit", [
    {"axis": "__import__('os').system('true')"},
    {"axis": "../../x"},
    {"inputs": ["Q\"); open('x', 'w'); (\""]},
    {"inputs": []},
    {"positions": [-1]},
    {"positions": [99]},
    {"positions": ["x"]},
    {"axis": 7},
])
def test_hostile_unit_specs_end_in_one_error_line(edit: dict, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  small_decode_plan: Plan) -> None:
    from pyrunner import cli
    from pyrunner.plan.schema import plan_hash

    plan = small_decode_plan
    doc = plan_document(plan)
    doc["axis_units"][0].update(edit)
    doc["provenance"]["plan_hash"] = ""
    try:
        doc["provenance"]["plan_hash"] = plan_hash(Plan.model_validate(doc))
    except Exception:  # noqa: BLE001 - a schema-invalid edit keeps an empty hash
        pass
    (tmp_path / "p.json").write_text(json.dumps(doc))
    code = cli.main(["validate", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len([x for x in err.splitlines() if x.startswith("error:")]) == 1, err
    assert "axis_units" in err or "tensors" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


def test_the_naive_plan_of_a_batched_decode_takes_the_unit_axis_too() -> None:
    """One kernel per op leaves ``Q[b, h, d] @d K[b, h, t, d]`` no tile GEMM (Q has no free axis) and no
    rewrite to sum it otherwise: the naive plan, the fallback when no fused plan builds, was infeasible
    ("a tile GEMM operand needs exactly one tiled free axis"; projected decode's backward, run 127). It is
    now planned on the graph with the unit axis, and verifies."""
    from pyrunner.ir.grad import derive
    from pyrunner.run.grad_check import backward_inputs

    (plan,) = search(_decode(b=2, h=2, t=64, d=32), "bf16", naive=True, tuning=False)
    assert plan.provenance.planner.endswith("-naive") and [u.axis for u in plan.axis_units] == ["unit"]
    res = verify_executor(plan, graph_of(plan), execute, seed=3)
    assert res.ok, res.message
    forward = load_graph_file(ROOT / "benchmarks" / "graphs" / "projected_decode_batched.json")
    bwd = derive(forward.with_sizes({"b": 2, "h": 2, "t": 64, "d": 32, "c": 64}))
    (plan,) = search(bwd.graph, "bf16", naive=True, tuning=False)
    assert plan.axis_units and len(plan.kernels) > 4  # every op its own kernel
    res = verify_executor(plan, bwd.graph, execute, seed=3, inputs=backward_inputs(bwd, bwd.graph, 3))
    assert res.ok, res.message
