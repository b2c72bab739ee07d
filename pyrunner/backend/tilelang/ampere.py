"""Ampere as the TileLang renderer targets it (compute capability 8.x, ``sm_80``).

What differs from Hopper is what the renderer leaves out, not what it writes: a tile GEMM is still
``T.gemm`` (TileLang lowers it to ``mma.sync`` m16n8k16 warp MMAs on sm_80, operands through
``ldmatrix``), a streamed loop is still ``T.Pipelined`` (TileLang turns its global-to-shared copies
into ``cp.async`` groups, ``num_stages`` deep), and everything else is plain thread code. Left out:
the explicitly warp-specialised forms (TMA rings, mbarriers, wgmma, async-proxy fences, persistent
kernels) and programmatic dependent launch (griddepcontrol needs sm_90); and a loop of run-time length
(a causal mask's visible steps) is ``T.serial``, since TileLang's cp.async pipeline drains such a loop
with a group count that is not a constant, which has no CUDA form. The fit check is the shared
one over the A100's limits (164 KiB of shared memory per SM, 64K registers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pyrunner.backend.tilelang.compile_target import CompileTarget
from pyrunner.target.device import A100


@dataclass(frozen=True)
class Ampere(CompileTarget):
    """An Ampere GPU (``sm_80``: mma.sync and cp.async, no TMA or wgmma) as a TileLang compile target."""

    family: ClassVar[str] = "ampere"
    async_forms: ClassVar[bool] = False
    tma_pipelines: ClassVar[bool] = False
    dependent_launch: ClassVar[bool] = False
    archs: ClassVar[tuple[str, ...]] = ("sm_80", "sm_86", "sm_87", "sm_89")


AMPERE = Ampere(A100)
"""The Ampere target ``--device a100`` renders for."""
