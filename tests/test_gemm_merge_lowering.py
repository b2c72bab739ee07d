"""Merged GEMM pairs (two GEMMs sharing A, one wide B tile) lower at every tile width (GPU sweep 1).

The wide B tile is filled by one copy per half. TileLang lays shared tiles out in 128-byte swizzle
atoms; a half narrower than one atom (block_n = 16 or 32 in bf16) is a gapped box, which TileLang
rejects with "plain SMEM layout is not a bijection". The renderer must merge only where each half
spans whole atoms, and fall back to two GEMMs otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pyrunner.backend.tilelang.compile import lower_to_cuda, rendered_module
from pyrunner.backend.tilelang.render import gemm_merges
from pyrunner.ir import catalog
from pyrunner.planner import search

SMALL = {"m": 128, "d": 512, "n": 128}  # d streamed: a whole-d tile has no loop, so nothing to merge
_WGMMA_N = re.compile(r"wgmma_(?:ss|rs)<[^,]+, [^,]+, [^,]+, \d+, (\d+), \d+,")


def _small_plan(name: str):
    (plan,) = search(catalog.get(name, SMALL), "bf16", top=1)
    return plan


def test_merge_condition_requires_whole_swizzle_atoms(tmp_path: Path) -> None:
    plan = _small_plan("SwiGLU")
    (k,) = plan.kernels
    assert gemm_merges(k), "SwiGLU's gate and up GEMMs share X: a merge candidate"
    mod = rendered_module(plan, work_dir=tmp_path)
    src = Path(mod.__file__).read_text()
    assert "block_n % 64 == 0" in src  # 64 bf16 = one 128-byte atom per half


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SwiGLU", "GeGLU", "RMSNormMLP"])
def test_merged_gemm_pairs_lower_at_every_block_n(name: str, tmp_path: Path) -> None:
    plan = _small_plan(name)
    (k,) = plan.kernels
    widths = sorted(set(rendered_module(plan, work_dir=tmp_path).CONFIG_SPACE[k.name]["block_n"]))
    assert any(b < 64 for b in widths), widths  # the widths that failed in the sweep
    for block_n in widths:
        # one warpgroup: 16-column tiles are legal WGMMA tiles for it (two need >= 32, issue 8 item 7)
        cuda = lower_to_cuda(plan, {k.name: {"block_n": block_n, "threads": 128}}, work_dir=tmp_path)[k.name]
        ns = {int(n) for n in _WGMMA_N.findall(cuda)}
        merged = block_n % 64 == 0 and 2 * block_n <= 256
        assert ns, f"{name} block_n={block_n}: no wgmma"
        assert (2 * block_n in ns) == merged, (name, block_n, ns)


def test_no_merge_when_a_fragment_is_computed_from_the_merged_half() -> None:
    """SwiGLU's forward that also saves G and U maps ``Y = silu(G) * U`` into a fragment of its own; merged,
    TileLang laid that fragment out at the merged width and ``Y`` failed on the GPU (run 157). The same GEMM
    pair merges where the map writes the half in place (the plain forward)."""
    from pyrunner.frontend.training import plan_training

    graph = catalog.get("SwiGLU", SMALL)
    fwd = plan_training(graph, "bf16", cpu_check=False).forward
    assert {"G", "U", "Y"} <= {t.name for t in fwd.tensors if t.role == "output"}, "the forward saves G and U"
    gemm = next(k for k in fwd.kernels if k.loop is not None)
    assert len([op for op in gemm.body if op.op == "gemm"]) == 2
    assert gemm_merges(gemm) == []
    assert gemm_merges(_small_plan("SwiGLU").kernels[0]), "the plain forward still merges its pair"


@pytest.mark.slow
def test_fragments_of_the_saving_forward_lower_at_their_own_width(tmp_path: Path) -> None:
    """Every fragment of the saving forward's kernel is a block_m x block_n tile over its threads: 64 float32
    registers a thread at 128 x 128 over 256 (the merged form gave ``Y_tile`` 128)."""
    from pyrunner.frontend.training import plan_training

    fwd = plan_training(catalog.get("SwiGLU"), "bf16", cpu_check=False).forward  # its catalog shape, as timed
    (k,) = [k for k in fwd.kernels if k.loop is not None]
    cuda = lower_to_cuda(fwd, {k.name: {"block_m": 128, "block_n": 128, "threads": 256}}, work_dir=tmp_path)[k.name]
    sizes = {name: int(n) for name, n in re.findall(r"float (\w+_tile)\[(\d+)\];", cuda)}
    assert {"G_tile", "U_tile", "Y_tile"} <= set(sizes), sizes
    assert set(sizes.values()) == {128 * 128 // 256}, sizes
