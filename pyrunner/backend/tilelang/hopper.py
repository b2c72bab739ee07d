"""Hopper as the TileLang renderer targets it: the device, the compile target and the nvcc flags.

The renderer's forms (wgmma GEMMs, TMA loads, warp-specialised producer/consumer loops, persistent
kernels over ``SM_COUNT`` blocks) are written for Hopper; this module is where they get the GPU's
numbers, so they name no device themselves. A leaf (only ``target.device``): the renderer imports
it, and ``backend.tilelang.backend`` pairs it with the lowering check.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyrunner.target.device import H200, Device

NVCC_FLAGS = ("-std=c++20", "-w", "-Xcudafe", "--diag_suppress=177", "-lineinfo")
"""The flags TileLang itself passes to nvcc for CUDA kernels (its templates need C++20)."""


@dataclass(frozen=True)
class Hopper:
    """A Hopper GPU (compute capability 9.0, ``sm_90a``: wgmma and TMA) as a TileLang compile target."""

    device: Device

    def __post_init__(self) -> None:
        if self.device.arch != "sm_90a":
            raise ValueError(f"the Hopper renderer needs an sm_90a device, not {self.device.name} ({self.device.arch})")

    @property
    def arch(self) -> str:
        """The CUDA architecture TileLang and nvcc compile for."""
        return self.device.arch

    @property
    def target(self) -> dict[str, str]:
        """The ``tvm.target.Target`` description TileLang lowers under."""
        return {"kind": "cuda", "arch": self.arch}

    @property
    def sm_count(self) -> int:
        """Blocks a persistent kernel launches (one per SM)."""
        return self.device.sms


HOPPER = Hopper(H200)
"""The Hopper target the renderer renders for."""
