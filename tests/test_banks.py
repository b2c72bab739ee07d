"""Bank conflicts of maps that read a shared tile across its rows (``planner.banks``).

Run 82 timed the transposed add at shared rows of 16, 32, 64 and 256 bytes: 4.2, 5.5, 7.3 and
11.5 us, one extra pass per warp read and conflict way. The cost model now prices those passes, so
it picks the narrow rows the GPU measured fastest where it used to pick 128 x 128 tiles (11.7 us).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import Buffer
from pyrunner.planner import search
from pyrunner.planner.banks import conflict_ways

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("block_m", "ways"), [(1, 1), (2, 1), (8, 4), (16, 8), (32, 16), (64, 32), (128, 32)])
def test_reading_across_rows_conflicts_by_the_row_length(block_m: int, ways: int) -> None:
    tile = Buffer(name="B_s", axes=["n", "m"], scope="shared", dtype="bfloat16")
    assert conflict_ways(tile, "n", {"n": 128, "m": block_m}) == ways


def test_reading_along_rows_or_a_broadcast_does_not_conflict() -> None:
    tile = Buffer(name="B_s", axes=["n", "m"], scope="shared", dtype="float32")
    assert conflict_ways(tile, "m", {"n": 128, "m": 128}) == 1  # contiguous
    assert conflict_ways(tile, "k", {"n": 128, "m": 128, "k": 64}) == 1  # every thread one address


def test_few_threads_along_the_fast_axis_bound_the_conflict() -> None:
    tile = Buffer(name="B_s", axes=["n", "m"], scope="shared", dtype="float32")
    assert conflict_ways(tile, "n", {"n": 4, "m": 128}) == 4


def test_the_transposed_add_takes_narrow_shared_rows() -> None:
    graph = load_graph_file(ROOT / "benchmarks" / "graphs" / "transposed_elementwise.json")
    (plan,) = search(graph, "bf16", tuning=False)
    (kernel,) = plan.kernels
    assert kernel.defaults["block_m"] <= 8, kernel.defaults  # rows of 16 bytes: 4 ways, not 32
