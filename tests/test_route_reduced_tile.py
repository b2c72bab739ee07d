"""A loaded tile that the loop both reduces and maps into a wgmma operand is read through the Map's
fragment (planner/lower.py ``route_reduced_tile``), so every row statistic shares the wgmma layout;
other loops are left as they are. Short-query GQA's plans build and compute the graph with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyrunner.backend.tilelang.buildable import lowering_problem
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import Buffer, Call, Gemm, Load, Map, Reduce, Ref
from pyrunner.planner import search
from pyrunner.planner.lower import route_reduced_tile
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import verify_executor

DATA = Path(__file__).resolve().parent / "data"


def _buffers() -> dict[str, Buffer]:
    def buf(name, axes, scope, dtype="float32", state=False):
        return Buffer(name=name, axes=axes, scope=scope, dtype=dtype, state=state)

    return {b.name: b for b in (
        buf("S_s", ["q", "k"], "shared"), buf("V_s", ["k", "d"], "shared", "bfloat16"),
        buf("m", ["q"], "fragment", state=True), buf("t", ["q", "k"], "fragment"),
        buf("p", ["q", "k"], "fragment", "bfloat16"), buf("acc", ["q", "d"], "fragment", state=True))}


def _body(with_gemm: bool = True) -> list:
    body = [Load(src="S", dst="S_s"), Load(src="V", dst="V_s"),
            Reduce(fn="max", src="S_s", dst="m", axis="k", accumulate=True),
            Map(dst="t", expr=Call(fn="sub", args=[Ref(buf="S_s"), Ref(buf="m")])),
            Map(dst="p", expr=Ref(buf="t"))]
    if with_gemm:
        body.append(Gemm(a="p", b="V_s", c="acc", contract="k", clear=False))
    return body


def test_reduction_and_map_read_the_fragment_copy() -> None:
    out = route_reduced_tile(_buffers(), _body(), {"S_s", "V_s"})
    assert out[2] == Map(dst="t", expr=Ref(buf="S_s"))
    assert out[3] == Reduce(fn="max", src="t", dst="m", axis="k", accumulate=True)
    assert out[4] == Map(dst="t", expr=Call(fn="sub", args=[Ref(buf="t"), Ref(buf="m")]))


def test_left_alone_without_a_wgmma_operand_in_the_maps_layout() -> None:
    body = _body(with_gemm=False)
    assert route_reduced_tile(_buffers(), body, {"S_s", "V_s"}) == body


@pytest.mark.slow
def test_short_query_gqa_plans_build_and_compute_the_graph() -> None:
    graph = load_graph_file(DATA / "attention_gqa_decode.json")
    for plan in search(graph, "bf16", top=2):
        assert lowering_problem(plan) is None
        small = scale_down(plan)
        res = verify_executor(small, graph_of(small), execute)
        assert res.ok, res.message
