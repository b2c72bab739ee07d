"""Hopper as the TileLang renderer targets it: the device, the compile target and its instruction set.

The Hopper forms (wgmma GEMMs, TMA loads, warp-specialised producer/consumer loops, persistent kernels
over ``SM_COUNT`` blocks, programmatic dependent launch) are rendered for this target only; this module
is where they get the GPU's numbers, so they name no device themselves. A leaf (``target.device`` and
``compile_target``): ``backend.tilelang.backend`` pairs it with the lowering check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pyrunner.backend.tilelang.compile_target import NVCC_FLAGS, CompileTarget
from pyrunner.target.device import H200

__all__ = ["HOPPER", "NVCC_FLAGS", "Hopper"]


@dataclass(frozen=True)
class Hopper(CompileTarget):
    """A Hopper GPU (compute capability 9.0, ``sm_90a``: wgmma and TMA) as a TileLang compile target."""

    family: ClassVar[str] = "hopper"
    async_forms: ClassVar[bool] = True
    tma_pipelines: ClassVar[bool] = True
    dependent_launch: ClassVar[bool] = True
    archs: ClassVar[tuple[str, ...]] = ("sm_90a",)


HOPPER = Hopper(H200)
"""The Hopper target plans are rendered for by default."""
