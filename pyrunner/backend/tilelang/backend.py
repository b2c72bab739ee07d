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
from pyrunner.backend.tilelang.targets import TARGETS
from pyrunner.errors import UserError
from pyrunner.plan.schema import Plan
from pyrunner.target.device import DEFAULT_DEVICE, Device, device_key_of


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


def device_key_or_name(device: str) -> str:
    """The key of ``BACKENDS`` that ``device`` names (``target.device.device_key_of``: a device name in any case
    or a GPU name the driver reports), else the name as typed in lower case, for ``BACKENDS`` to refuse."""
    return device_key_of(device) or device.strip().lower()


def backend_for(device: str = DEFAULT_DEVICE) -> TileLangBackend:
    """The backend of the device called ``device``: a device name (case-insensitive) or a GPU name the driver
    reports (``target.device.device_key_of``: ``NVIDIA A100-SXM4-80GB`` is a100); UserError naming the known
    ones otherwise."""
    backend = BACKENDS.get(device_key_or_name(device))
    if backend is None:
        raise UserError(f"--device {device!r}: no backend for that device; known: {', '.join(sorted(BACKENDS))}")
    return backend


def describe(device: str) -> str:
    """What a record says of the backend of ``device``: ``a100 (tilelang-ampere, sm_80)``."""
    b = backend_for(device)
    return f"{device_name(device)} ({b.name}, {b.target.arch})"


def _number(arch: str) -> int | None:
    """``sm_90a`` -> 90; None for a string that is not an architecture."""
    digits = arch.removeprefix("sm_").rstrip("af")
    return int(digits) if digits.isdigit() else None


def backend_name_for_arch(gpu_arch: str) -> str:
    """The device name of the backend a GPU of architecture ``gpu_arch`` (``sm_90``) is planned for: the one
    whose instruction set is the GPU's own, else the newest one the GPU runs (an older instruction set
    built for it: ``CompileTarget.running_on``), else the default. An arch-specific target (``sm_90a``)
    runs on its own architecture only."""
    gpu = _number(gpu_arch)
    if gpu is None:
        return DEFAULT_DEVICE
    runnable: list[tuple[int, str]] = []
    for name, b in BACKENDS.items():
        own = _number(b.target.arch)
        if own == gpu:
            return name
        if own is not None and own < gpu and not b.target.arch.endswith("a"):
            runnable.append((own, name))
    return max(runnable)[1] if runnable else DEFAULT_DEVICE


def local_backend_name() -> str:
    """The device name of the backend for the GPU torch sees at run time: the known device its name names
    (any A100 is a100), else the one its architecture runs (``backend_name_for_arch``); the default without
    one. ``unknown_gpu_note`` says when the GPU is not a known device."""
    try:
        import torch

        if not torch.cuda.is_available():
            return DEFAULT_DEVICE
        major, minor = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001 - no usable torch or driver: plan for the default device
        return DEFAULT_DEVICE
    known = device_key_of(name)
    return known if known in BACKENDS else backend_name_for_arch(f"sm_{major}{minor}")


def unknown_gpu_note(gpu_name: str, backend: str) -> str | None:
    """One line for a GPU that is not a known device (``target.device.device_named`` refuses its name), run
    with the backend ``backend``: its plans are made with that backend's device numbers, not its own, and
    its times are filed under its own name; None for a known GPU."""
    if device_key_of(gpu_name) is not None:
        return None
    from pyrunner.target.tuning import device_key

    b = backend_for(backend)
    return (f"this GPU ({gpu_name}) is not a known device (known: {', '.join(sorted(BACKENDS))}): plans for it are "
            f"made with the {b.device.name}'s numbers ({describe(backend)}), and its times are filed under "
            f"'{device_key(gpu_name)}', which no plan reads")


def resolve_backend(device: str | None) -> TileLangBackend:
    """``backend_for(device)``, or the local GPU's backend (``local_backend_name``) when ``device`` is None."""
    return backend_for(local_backend_name() if device is None else device)


def device_name(device: str | None) -> str:
    """The known device name (a key of ``BACKENDS``) that ``device`` names (a device name or a GPU name the
    driver reports), or the local GPU's when None; UserError naming the known ones."""
    name = local_backend_name() if device is None else device_key_or_name(device)
    backend_for(name)
    return name
