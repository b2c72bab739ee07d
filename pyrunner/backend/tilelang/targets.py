"""The TileLang compile targets by the device name ``--device`` takes, and the one used when none is named.

Adding a GPU of an instruction set already rendered is one ``Device`` entry (``target.device``) and one
line here; a new instruction set is one more module beside ``hopper.py`` and ``ampere.py``.
"""

from __future__ import annotations

from dataclasses import replace

from pyrunner.backend.tilelang.ampere import AMPERE
from pyrunner.backend.tilelang.compile_target import CompileTarget
from pyrunner.backend.tilelang.hopper import HOPPER
from pyrunner.target.device import DEFAULT_DEVICE, H100, Device

TARGETS: dict[str, CompileTarget] = {"h200": HOPPER, "h100": replace(HOPPER, device=H100), "a100": AMPERE}
"""Compile targets by device name (the keys of ``target.device.DEVICES`` that have a renderer)."""


def default_target() -> CompileTarget:
    """The target a plan is rendered for when the caller names none: the default device's."""
    return TARGETS[DEFAULT_DEVICE]


def target_for(device: Device) -> CompileTarget:
    """The compile target rendering for ``device``: the one whose instruction set serves its architecture
    (so the cost model of an A100 gets the Ampere backend's terms, never Hopper's)."""
    for t in TARGETS.values():
        if device.arch in t.archs:
            return t if t.device == device else replace(t, device=device)
    raise ValueError(f"no TileLang target renders for {device.name} ({device.arch})")
