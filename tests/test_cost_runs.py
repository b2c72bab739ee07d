"""The cost model's price of narrow tile rows: global memory moves in sectors, and each contiguous run
a thread-moved tile makes costs about 16 bytes more (H200 run 71 probe: ``where`` over two 3000 x 1000
inputs, 10.6 us on 64 x 8 tiles, rows of 16 bytes, against 5.5 on 8 x 128). These tests plan with
the model alone (no tuning database), so they check the model's choices, not measured ones.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.analysis import resolve_config
from pyrunner.planner.cost import estimate
from pyrunner.planner.search import Planner, search
from pyrunner.planner.traffic import FULL_RUN_BYTES, SECTOR_BYTES, contiguous_bytes, run_cost
from pyrunner.target.device import DTYPE_BYTES

ROOT = Path(__file__).resolve().parent.parent
WHERE = ROOT / "benchmarks" / "graphs" / "where_threshold_3in.json"


def test_a_run_extends_over_whole_inner_blocks_only() -> None:
    sizes = {"m": 3000, "n": 1000, "d": 64}
    assert contiguous_bytes(("m", "n"), sizes, {"m": 64, "n": 8}, 2) == 16
    assert contiguous_bytes(("m", "n"), sizes, {"m": 8, "n": 1000}, 2) == 16000  # whole rows: one run
    assert contiguous_bytes(("m", "d"), sizes, {"m": 4, "d": 64}, 4) == 1024
    assert contiguous_bytes(("n",), sizes, {"n": 2048}, 2) == 2000  # a block past the axis: the axis


@pytest.mark.parametrize(("run", "overhead", "cost"), [
    (2, 16, SECTOR_BYTES), (16, 16, 32), (32, 16, 48), (64, 16, 80), (16, 0, SECTOR_BYTES), (64, 0, 64),
    (FULL_RUN_BYTES, 16, FULL_RUN_BYTES), (2000, 16, 2016)])
def test_run_cost_is_whole_sectors_and_an_overhead_below_full_runs(run: int, overhead: int, cost: int) -> None:
    assert run_cost(run, overhead) == cost


def test_narrow_rows_cost_more_and_the_planner_avoids_them() -> None:
    """The elementwise kernel of ``where`` over 3000 x 1000 bf16: 8-wide column tiles (16-byte rows)
    are priced near twice 128-wide ones at the bandwidth bound, as run 71 measured, and the
    model-only plan takes rows of at least 256 bytes."""
    graph = load_graph_file(WHERE)
    planner = Planner(graph, "bf16")
    cand = next(c for c in planner.candidates() if any(not kc.low.gemms and kc.low.stream is None for kc in c.kernels))
    kc = next(kc for kc in cand.kernels if kc.low.stream is None)
    tb = {t.name: math.prod(t.shape) * DTYPE_BYTES[t.dtype] for t in cand.tensors}
    launch = planner.machine.launch_us  # the backend's launch term (target.cost_terms)

    def body_us(block_m: int, block_n: int) -> float:
        cfg = {**kc.est.config, "block_m": block_m, "block_n": block_n, "threads": 256}
        return estimate(kc.low, cfg, planner.sizes, tb, kc.fit.footprint(cfg).smem_bytes).time_us - launch

    assert 1.7 < body_us(64, 8) / body_us(8, 128) < 2.3
    plan = search(graph, "bf16", tuning=False)[0]
    cfg = resolve_config(plan)
    flat = next(k for k in plan.kernels if k.loop is None)
    assert cfg[flat.name]["block_n"] * 2 >= FULL_RUN_BYTES, cfg


def test_a_loop_free_kernel_keeps_a_block_per_sm() -> None:
    """A 1000 x 3000 elementwise chain: 96 blocks of 128 x 256 took 5.4 us in run 73, 752 of 64 x 64
    4.2 in run 51. A block without a loop loads, computes and stores in turn, so the model no
    longer lets fewer blocks than SMs draw more than their share of the bandwidth: the model-only
    plan fills every SM, on rows of at least 256 bytes."""
    graph = load_graph_file(ROOT / "benchmarks" / "graphs" / "elementwise_poly_1000x3000.json")
    plan = search(graph, "bf16", tuning=False)[0]
    (k,) = plan.kernels
    cfg = resolve_config(plan)[k.name]
    blocks = math.ceil(1000 / cfg["block_m"]) * math.ceil(3000 / cfg["block_n"])
    assert blocks >= 132 and cfg["block_n"] * 2 >= FULL_RUN_BYTES, cfg


def test_a_strided_stream_narrows_its_rows_so_the_contiguous_axis_runs_wide() -> None:
    """Mean-pool over t of X[b, t, d]: the loop streams the strided axis t while the tiles span b and
    d, d contiguous. Its rows (b) may go down to 2 (``planner.space.strided_rows``), so d takes
    tiles of 256 and more (runs of 512 bytes: 11.2 us on the H200, run 78) at the block size the
    old floor of 8 rows kept at 64 (runs of 128 bytes: 18.5 us)."""
    from pyrunner.planner.space import strided_rows

    plan = search(load_graph_file(ROOT / "tests" / "data" / "reduce_meanpool_projection.json"), "bf16",
                  tuning=False)[0]
    k = next(k for k in plan.kernels if k.loop is not None and k.loop.axis == "t")
    assert min(k.params["block_b"]) == 2
    assert k.defaults["block_d"] >= 256 and k.defaults["block_b"] * k.defaults["block_d"] <= 1024
    # a column max over the rows of Z[m, n] streams m, but its one tiled axis is the contiguous n:
    # no rows to narrow
    planner = Planner(load_graph_file(WHERE), "bfloat16")
    column = [kc.low for c in planner.candidates()[:3] for kc in c.kernels if kc.low.stream == "m"]
    assert column and all(strided_rows(low) == set() for low in column)
