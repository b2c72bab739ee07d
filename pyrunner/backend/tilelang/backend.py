"""The TileLang backends by device: what ``pipeline.best_plan`` and ``superopt --device`` choose from.

A backend pairs a compile target (``hopper.HOPPER``, ``ampere.AMPERE``: device, architecture,
instruction set) with the lowering check that gates a plan before it is handed out
(``buildable.lowering_problem``). The planner gets the backend's ``device`` (its cost model and fit
check), the renderer and compiler its target. Adding a GPU of an instruction set already rendered is
one ``Device`` entry and one line in ``targets.TARGETS``; a new instruction set is one more target
module beside ``hopper.py`` and ``ampere.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyrunner.backend.tilelang.compile_target import CompileTarget
from pyrunner.backend.tilelang.targets import DEFAULT_TARGET_NAME, TARGETS
from pyrunner.errors import UserError
from pyrunner.plan.schema import Plan
from pyrunner.target.device import Device


@dataclass(frozen=True)
class TileLangBackend:
    """TileLang rendering for one target: its device, its compile target and its lowering check."""

    name: str
    target: CompileTarget

    @property
    def device(self) -> Device:
        return self.target.device

    def lowering_problem(self, plan: Plan) -> str | None:
        """One line saying why TileLang cannot lower ``plan`` for this target, or None."""
        from pyrunner.backend.tilelang.buildable import lowering_problem

        return lowering_problem(plan, self.target)


BACKENDS: dict[str, TileLangBackend] = {name: TileLangBackend(f"tilelang-{t.family}", t) for name, t in TARGETS.items()}
"""Backends by the device name ``--device`` takes."""

DEFAULT_BACKEND = DEFAULT_TARGET_NAME


def backend_for(device: str = DEFAULT_BACKEND) -> TileLangBackend:
    """The backend of the device called ``device`` (case-insensitive); UserError naming the known ones."""
    backend = BACKENDS.get(device.strip().lower())
    if backend is None:
        raise UserError(f"--device {device!r}: no backend for that device; known: {', '.join(sorted(BACKENDS))}")
    return backend
