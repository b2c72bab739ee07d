"""Kernel bisection: which kernel of a multi-kernel plan is wrong on the device, and where.

The GPU check compares a plan's final outputs with float64; when it fails, it cannot say which
kernel went wrong. Here every kernel runs alone on the device, and the CPU executor runs the same
kernel of the plan on exactly the tensors the device kernel read (earlier kernels' device results
included), so each kernel is judged on its own inputs. The first kernel whose writes disagree is
the culprit; its error map by grid tile (which blocks, which rows inside a block) says whether the
fault is in tiling, a thread mapping or one pipeline stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from pyrunner.plan.analysis import kernel_geometry
from pyrunner.plan.schema import Kernel, Plan, Store, axis_sizes
from pyrunner.run.executor import run_kernel


@dataclass
class KernelVerdict:
    """How one device kernel compares with the executor's run of the same kernel."""

    kernel: str
    errors: dict[str, float]  # global tensor written -> normalised max error
    bad_tiles: dict[str, list[dict[str, int]]] = field(default_factory=dict)  # tensor -> tile coordinates
    bad_rows_in_tile: dict[str, list[int]] = field(default_factory=dict)  # tensor -> offsets inside a tile

    def ok(self, bound: float) -> bool:
        """Every write within ``bound``; a NaN/inf error never is, whatever the bound."""
        return all(math.isfinite(e) and e <= bound for e in self.errors.values())


def _written(k: Kernel) -> list[str]:
    return [op.dst for op in k.prologue + k.body + k.epilogue if isinstance(op, Store)]


def _normalised(out: np.ndarray, ref: np.ndarray) -> np.ndarray:
    scale = float(np.nanmax(np.abs(ref))) if ref.size else 1.0
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    diff[~np.isfinite(out)] = np.inf
    return diff / (scale if scale > 0 else 1.0)


def _tile_map(err: np.ndarray, axes: list[str], blocks: Mapping[str, int], bound: float,
              limit: int = 8) -> tuple[list[dict[str, int]], list[int]]:
    """Tiles (by axis) whose error exceeds ``bound``, and the first axis' offsets inside a tile that do."""
    bad = np.argwhere(err > bound)
    tiles: list[dict[str, int]] = []
    seen: set[tuple[int, ...]] = set()
    for idx in bad:
        key = tuple(int(i) // blocks.get(a, 1) for i, a in zip(idx, axes))
        if key not in seen:
            seen.add(key)
            tiles.append(dict(zip(axes, key)))
            if len(tiles) >= limit:
                break
    rows: list[int] = []
    if len(bad) and axes:
        b0 = blocks.get(axes[-2] if len(axes) > 1 else axes[0], 1)
        col = -2 if len(axes) > 1 else 0
        rows = sorted({int(i[col]) % b0 for i in bad})[:64]
    return tiles, rows


def bisect_kernels(plan: Plan, run_device_kernel: Callable[[str], None], tensors: Mapping[str, object],
                   values: Mapping[str, Mapping[str, int]], bound: float) -> list[KernelVerdict]:
    """Run each kernel on the device (``run_device_kernel(name)`` on the shared ``tensors``, torch
    tensors by global name) and judge it against the executor on the same inputs."""
    sizes = axis_sizes(plan)
    dtypes = {t.name: t.dtype for t in plan.tensors}
    taxes = {t.name: list(t.axes) for t in plan.tensors}
    verdicts: list[KernelVerdict] = []
    for k in plan.kernels:
        host = {n: t.detach().float().cpu().numpy().copy() for n, t in tensors.items()}
        run_device_kernel(k.name)
        run_kernel(k, dict(values[k.name]), sizes, host, dtypes, taxes)
        geo = kernel_geometry(k, values[k.name], sizes)
        verdict = KernelVerdict(k.name, {})
        for name in _written(k):
            dev = tensors[name].detach().float().cpu().numpy()
            err = _normalised(dev, host[name])
            verdict.errors[name] = float(err.max()) if err.size else 0.0
            if verdict.errors[name] > bound:
                verdict.bad_tiles[name], verdict.bad_rows_in_tile[name] = _tile_map(
                    err, taxes[name], geo.blocks, bound)
        verdicts.append(verdict)
    return verdicts

