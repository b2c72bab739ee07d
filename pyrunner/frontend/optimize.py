"""``pyrunner.optimize(fn, *example_inputs)``: a PyTorch function through the superoptimizer.

``fn`` (a function or an ``nn.Module``) is traced with ``torch.fx`` (into
``nn`` modules too, so ``nn.Linear`` is seen as ``F.linear``), its shapes taken
from the example inputs, cut into regions the graph IR expresses, and each
region planned, compiled and verified against float64; the result is a
callable with ``fn``'s signature. An op with no IR meaning is an error naming
the op and its source line; a region the planner cannot plan even when split
down to single ops stays a PyTorch op, with a warning.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyrunner.frontend.compile import Options, Report, compile_graph
from pyrunner.frontend.errors import FrontendError
from pyrunner.frontend.partition import example_values


def fx_trace(fn: Callable) -> Any:
    """``torch.fx`` symbolic trace that enters ``nn`` modules and records source lines."""
    import torch
    import torch.fx

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:  # noqa: ARG002
            return False

        def _filter_traceback_frames(self, summary):  # type: ignore[override]
            import traceback

            user = [f for f in summary if "/torch/" not in f.filename and "/pyrunner/frontend/" not in f.filename]
            return traceback.StackSummary.from_list(user[-1:])

    tracer = Tracer()
    tracer.record_stack_traces = True
    root = fn if isinstance(fn, torch.nn.Module) else torch.nn.Module()
    try:
        graph = tracer.trace(fn)
    except Exception as e:  # noqa: BLE001 - data-dependent control flow and the like
        msg = " ".join(str(e).split())[:300]
        raise FrontendError(f"torch.fx cannot trace {getattr(fn, '__name__', type(fn).__name__)}: "
                            f"{type(e).__name__}: {msg}") from None
    return torch.fx.GraphModule(root, graph)


class Optimized:
    """The optimized function: same signature as ``fn``; ``report`` says what runs where."""

    def __init__(self, fn: Callable, gm: Any, report: Report) -> None:
        self.fn, self.graph_module, self.report = fn, gm, report
        target = fn.forward if hasattr(fn, "forward") and not inspect.isfunction(fn) else fn
        self.__signature__ = inspect.signature(target)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bound = self.__signature__.bind(*args, **kwargs)
        bound.apply_defaults()
        return self.graph_module(*bound.arguments.values())

    def __repr__(self) -> str:
        return f"<superopt-optimized {self.__name__}: {self.report.summary().splitlines()[0]}>"


def optimize(fn: Callable, *example_inputs: Any, axes: dict[str, Any] | None = None, dtype: str | None = None,
             verify: bool = True, executor: str = "gpu", progress: bool = True,
             log: str | os.PathLike | None = None) -> Optimized:
    """Trace, plan, compile and verify ``fn`` at the shapes of ``example_inputs``; returns a callable.

    ``axes`` names the axes of inputs (``{"x": "td"}`` or ``{"x": ("t", "d")}``); others get letters.
    ``dtype`` forces the kernels' dtype (``float16``/``bfloat16``; default: the inputs').
    ``executor="reference"`` runs each region in the float64 interpreter instead (no GPU needed).
    ``log`` (a results-log path) records each chosen plan.
    """
    if executor not in ("gpu", "reference"):
        raise FrontendError(f"executor {executor!r}: choose 'gpu' or 'reference'")
    if executor == "gpu":
        from pyrunner.frontend.load import require_gpu

        require_gpu()
    gm = fx_trace(fn)
    values = example_values(gm, example_inputs)
    names = {k: tuple(v) for k, v in (axes or {}).items()}
    say = (lambda s: print(f"superopt: {s}", file=sys.stderr, flush=True)) if progress else None
    opts = Options(executor=executor, dtype=dtype, verify=verify, axis_names=names, progress=say,
                   name=_ident(getattr(fn, "__name__", type(fn).__name__)), log=Path(log) if log else None)
    gm, report = compile_graph(gm, values.__getitem__, opts, strict=True)
    if say:
        say(report.summary())
    return Optimized(fn, gm, report)


def _ident(name: str) -> str:
    from pyrunner.frontend.region import ident

    return ident(name)
