"""What every TileLang compile target answers: its device, its CUDA architecture and its instruction set.

One subclass per instruction set (``hopper.Hopper``: wgmma, TMA, warp-specialised forms, dependent
launch; ``ampere.Ampere``: mma.sync, cp.async pipelines). The renderer, the compiler and the lowering
check take a target as an argument and ask it, so none of them names a GPU. A leaf (only
``target.device`` and ``target.cost_terms``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from pyrunner.target.cost_terms import CostTerms
from pyrunner.target.device import Device

NVCC_FLAGS = ("-std=c++20", "-w", "-Xcudafe", "--diag_suppress=177", "-lineinfo")
"""The flags TileLang itself passes to nvcc for CUDA kernels (its templates need C++20)."""


@dataclass(frozen=True)
class CompileTarget:
    """A GPU as the TileLang renderer and compiler target it.

    ``code``: the real architectures nvcc builds machine code for, from this target's virtual
    architecture (empty: this target's own). An sm_80 program built with ``code=("sm_90",)`` (nvcc
    ``-gencode arch=compute_80,code=sm_90``) runs on a Hopper GPU as its compute_80 PTX would after
    the driver's JIT: the Ampere instruction set, Hopper machine code (``running_on``).
    """

    device: Device
    code: tuple[str, ...] = ()

    family: ClassVar[str] = ""
    """The instruction set's name (``hopper``, ``ampere``)."""
    async_forms: ClassVar[bool] = False
    """The explicitly warp-specialised forms (TMA rings, mbarriers, ``T.wgmma_gemm``, persistent kernels)."""
    tma_pipelines: ClassVar[bool] = False
    """TileLang lowers a ``T.Pipelined`` loop's loads to TMA under its own warp specialisation (sm_90); without
    it they are cp.async groups, whose drain needs a trip count known at compile time."""
    dependent_launch: ClassVar[bool] = False
    """Programmatic dependent launch (``T.pdl_trigger`` / ``T.pdl_sync``: griddepcontrol, sm_90 and later)."""
    archs: ClassVar[tuple[str, ...]] = ()
    """Architectures of the devices this instruction set serves."""
    terms: ClassVar[CostTerms]
    """The cost model's constants for this instruction set's code (the subclass's module states them)."""

    def __post_init__(self) -> None:
        if self.device.arch not in self.archs:
            raise ValueError(f"the {self.family} renderer needs a device of {', '.join(self.archs)}, "
                             f"not {self.device.name} ({self.device.arch})")

    @property
    def arch(self) -> str:
        """The CUDA architecture TileLang and nvcc compile for."""
        return self.device.arch

    @property
    def target(self) -> dict:
        """The ``tvm.target.Target`` description TileLang lowers under."""
        out: dict = {"kind": "cuda", "arch": self.arch}
        if self.code:
            out["code"] = list(self.code)
        return out

    @property
    def sm_count(self) -> int:
        """Blocks a persistent kernel launches (one per SM)."""
        return self.device.sms

    def gencode(self) -> list[str]:
        """nvcc's ``-gencode`` arguments for this target."""
        number = self.arch.removeprefix("sm_")
        code = ",".join(self.code) if self.code else self.arch
        return ["-gencode", f"arch=compute_{number},code={f'[{code}]' if len(self.code) > 1 else code}"]

    def running_on(self, gpu_arch: str) -> CompileTarget:
        """This target, built to run on a GPU of architecture ``gpu_arch`` (``sm_90``): machine code for that
        GPU from this target's instruction set, where it differs from the target's own architecture and is
        newer (an older GPU cannot run a newer instruction set, and an arch-specific one such as ``sm_90a``
        runs on its own architecture only: this target, unchanged)."""
        if self.arch.endswith("a"):
            return self
        own = self.arch.removeprefix("sm_").rstrip("f")
        other = gpu_arch.removeprefix("sm_").rstrip("af")
        if not (own.isdigit() and other.isdigit()) or int(other) <= int(own):
            return self
        return replace(self, code=(gpu_arch,))
