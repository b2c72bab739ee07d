"""Any sizes: axes that no power-of-two tile divides end in a partial tile.

Loads past the end read zeros, stores past it are dropped, and every value entering a streamed
loop's accumulator is masked on the partial tile with the accumulator's identity (the mask
machinery of ``pyrunner.plan.masks``, so whole tiles run without it). Checked on the CPU executor
against float64 at small odd shapes (with ``audit``: the masks left out on whole tiles change
nothing there), and planned, validated and rendered at the issue's odd shapes.

Error bounds as in tests/test_masks.py: exact (float32 buffers) 1e-5 relative to the output's
largest magnitude, bf16 2e-2.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyrunner.backend.tilelang.render import render
from pyrunner.ir import catalog
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.plan.validate import validate_plan
from pyrunner.planner.search import search
from pyrunner.planner.tiles import block_candidates
from pyrunner.run.executor import execute

EXACT_TOL = 1e-5
BF16_TOL = 2e-2

SMALL_ODD = [
    ("Matmul", {"m": 1, "d": 96, "n": 200}),
    ("SwiGLU", {"m": 1, "n": 50, "d": 300}),
    ("RMSNorm", {"m": 50, "d": 300, "n": 72}),
    ("LayerNormMatmul", {"m": 20, "d": 400, "n": 40}),
    ("CausalAttention", {"h": 1, "t_q": 100, "t_kv": 300, "d": 32}),
    ("ScaledAttention", {"h": 1, "t_q": 70, "t_kv": 300, "d": 24}),
]


def test_block_candidates_offer_tails_where_no_wide_power_of_two_divides() -> None:
    assert block_candidates(4096) == [16, 32, 64, 128, 256]
    assert block_candidates(192) == [16, 32, 64]  # 64 divides: no tails
    assert block_candidates(50257) == [16, 32, 64, 128, 256]
    assert block_candidates(1) == [16]
    assert block_candidates(300, hi=128) == [16, 32, 64, 128]
    # only narrow tiles divide: wider ones with a partial last tile are offered beside them
    assert block_candidates(96) == [16, 32, 64, 128]
    assert block_candidates(1000, lo=8) == [8, 16, 32, 64, 128, 256]
    assert block_candidates(3000, lo=8) == [8, 16, 32, 64, 128, 256]
    assert block_candidates(40, lo=8) == [8, 16, 32, 64]
    assert block_candidates(8, lo=8) == [8]


@pytest.mark.parametrize("name, sizes", SMALL_ODD, ids=[n for n, _ in SMALL_ODD])
def test_odd_shapes_verify_on_the_executor(name: str, sizes: dict[str, int]) -> None:
    g = catalog.get(name, sizes)
    x = random_inputs(g, 5)
    ref = evaluate(g, x)
    tails = 0
    for plan in search(g, "bf16", top=2):
        validate_plan(plan)
        for k in plan.kernels:
            blocks = {gx.axis: k.defaults.get(gx.block, gx.block) for gx in k.grid}
            if k.loop is not None:
                blocks[k.loop.axis] = k.defaults[k.loop.block]
            tails += sum(1 for a, b in blocks.items() if isinstance(b, int) and g.sizes[a] % b)
        for exact, tol in ((True, EXACT_TOL), (False, BF16_TOL)):
            out = execute(plan, x, exact=exact, audit=True)
            for n, want in ref.items():
                err = np.max(np.abs(out[n] - want)) / np.max(np.abs(want))
                assert err <= tol, f"{name} {sizes} exact={exact}: relative error {err} > {tol}"
    assert tails, "no plan has a partial tile at these sizes"


def test_streamed_tail_is_masked_only_on_the_partial_tile() -> None:
    g = catalog.get("CausalAttention", {"h": 1, "t_q": 100, "t_kv": 300, "d": 32})
    plan = search(g, "bf16")[0]
    (k,) = plan.kernels
    tail_maps = [op for op in k.body if op.op == "map" and '"kind":"size","axis":"t_kv"' in op.model_dump_json()]
    assert tail_maps, "no tail mask in the loop body"
    src = render(plan)
    assert "T.ceildiv(SIZE_T_KV, block_t_kv)" in src
    assert src.count("# the mask, only on tiles it does not show whole") >= len(tail_maps) + 1


ODD = {"t_q": 4000, "t_kv": 4000, "m": 1000, "d": 96}


@pytest.mark.parametrize("name", list(catalog.CATALOG))
def test_every_workload_plans_at_odd_shapes(name: str) -> None:
    """The issue's odd shape set: t = 4000, m = 1000, d = 96, n = 50257 for the plain matmul."""
    g = catalog.get(name)
    sizes = {a: v for a, v in ODD.items() if a in g.sizes}
    if name == "Matmul":
        sizes["n"] = 50257
    plan = validate_plan(search(g.with_sizes(sizes), "bf16")[0])
    assert "T.ceildiv(" in render(plan)


@pytest.mark.slow
def test_odd_matmul_lowers_with_guarded_loads_and_stores() -> None:
    from pyrunner.backend.tilelang.compile import lower_to_cuda

    plan = search(catalog.get("Matmul", {"m": 1, "d": 96, "n": 50257}), "bf16")[0]
    (src,) = lower_to_cuda(plan).values()
    assert "< 50257)" in src, "TileLang guards the accesses past the end of n"
