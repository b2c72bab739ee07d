"""``pyrunner.optimize(fn, *example_args, **example_kwargs)``: a PyTorch function through the superoptimizer.

``fn`` (a function or an ``nn.Module``) is captured by dynamo -- the same capture
as ``torch.compile(backend="superopt")``, so real model code (decorators,
``*shape`` unpacking, modules called from functions, data-dependent branches as
graph breaks) is taken as PyTorch runs it. Each captured graph is cut into regions
the graph IR expresses, each region planned (and compiled and verified on a GPU;
without one, CPU-checked against float64 and left to PyTorch); an op the IR
cannot express stays a PyTorch op, with one log line naming it and its source
line. The result is a callable with ``fn``'s signature; ``.report`` is a table of
what runs where. Capture runs under ``torch.no_grad()``; called with autograd on, the graph
is captured again and each region runs with its derived backward (``autograd``; a region
without one stays PyTorch ops, so gradients are PyTorch's own there). On a GPU, as in the
backend, each region is kept only where it is measured faster than inductor's code for its ops
(``decide``), and inductor compiles the rest: never slower than ``torch.compile`` by more than noise.
A new input shape is planned again (shapes are static): dynamo goes symbolic once and the backend
compiles one specialisation per concrete shape, so regions stay at every shape (no recompile limit).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from pyrunner.frontend.compile import Report
from pyrunner.frontend.decide import Measure
from pyrunner.frontend.errors import FrontendError
from pyrunner.frontend.progress import RichTracker, Tracker, tracker


class Optimized:
    """The optimized function: same signature as ``fn``; ``report`` says what runs where."""

    def __init__(self, fn: Callable, compiled: Callable, report: Report, graphs: list[Any]) -> None:
        self.fn, self.compiled, self.report, self.graph_modules = fn, compiled, report, graphs
        self.later_reports: list[Report] = []
        """Reports of graphs compiled after the capture (a new shape; autograd on: regions with their backward)."""
        target = fn.forward if hasattr(fn, "forward") and not inspect.isfunction(fn) else fn
        try:
            self.__signature__ = inspect.signature(target)
        except (TypeError, ValueError):  # a builtin: no signature to copy
            pass
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    @property
    def graph_module(self) -> Any:
        """The first captured graph, with its regions spliced in (a graph break gives more)."""
        return self.graph_modules[0] if self.graph_modules else None

    tensor_slots: frozenset[str | int] = frozenset()
    """Parameters (names; positions where ``fn`` has no signature) that held a tensor in the example call:
    a call must give tensors there too."""

    def _bound(self, args: tuple, kwargs: dict) -> dict[str | int, Any]:
        sig = getattr(self, "__signature__", None)
        if sig is not None:
            try:
                return dict(sig.bind(*args, **kwargs).arguments)
            except TypeError as e:
                raise FrontendError(f"{self.__name__}: {e}") from None
        return {**dict(enumerate(args)), **kwargs}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        if self.tensor_slots:
            given = self._bound(args, kwargs)
            for where in sorted(self.tensor_slots, key=str):
                if where in given and not isinstance(given[where], torch.Tensor):
                    raise FrontendError(f"{self.__name__}: argument {where!r} was a torch.Tensor when optimized, "
                                        f"called with {type(given[where]).__name__}")
        return self.compiled(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<superopt-optimized {self.__name__}: {self.report.summary().splitlines()[0]}>"


def capture(fn: Callable, args: tuple, kwargs: dict, backend: Callable) -> Callable:
    """``fn`` compiled by dynamo and ``backend``; run once on the examples to capture (static shapes).
    A later new shape makes dynamo go symbolic once; the backend then specialises per concrete shape.

    Dynamo's caches are reset first: a model's ``forward`` compiled before (another ``optimize``, another
    backend) must not be reused here, nor count towards dynamo's recompile limit, past which it would
    run the frame eagerly without a word. Functions compiled earlier compile again on their next call."""
    import torch

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, dynamic=None)  # a second shape: symbolic, specialised per shape
    try:
        with torch.no_grad():
            compiled(*args, **kwargs)
    except FrontendError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's function itself failed on the examples
        inner = e
        while inner.__cause__ is not None or inner.__context__ is not None:
            inner = inner.__cause__ or inner.__context__
        if isinstance(inner, FrontendError):  # raised in the backend, wrapped by dynamo
            raise FrontendError(str(inner)) from None
        msg = " ".join(str(e).split())
        raise FrontendError(f"running {getattr(fn, '__name__', type(fn).__name__)} on the example inputs "
                            f"failed: {type(e).__name__}: {msg}") from None
    return compiled


def optimize(fn: Callable, *example_args: Any, axes: dict[str, Any] | None = None, dtype: str | None = None,
             verify: bool = True, executor: str = "auto", fallback: str = "auto", progress: bool | Tracker = True,
             log: str | os.PathLike | None = None, measure: Measure | bool | None = None, backward: bool = True,
             device: str | None = None, **example_kwargs: Any) -> Optimized:
    """Capture, plan (compile and verify on a GPU) ``fn`` at the shapes of the example inputs.

    Example inputs are given as ``fn`` takes them, by position and keyword (any keyword not named
    below goes to ``fn``). ``axes`` names the axes of inputs (``{"x": "td"}``); others get letters.
    ``dtype`` plans regions in ``float16``/``bfloat16`` (default: the inputs' own dtype; a float32
    region then stays with PyTorch, saying so). ``executor``: ``auto`` (the GPU when there is one,
    else ``plan``: plan and CPU-check only), ``gpu``, ``plan`` or ``reference`` (each region in
    the float64 interpreter; for checking). ``fallback``: ``eager`` or ``inductor`` for what
    Superopt does not take (``auto``: inductor on the GPU, eager elsewhere). ``measure``: as the backend,
    on the GPU each region's kernels are timed against the fallback compiler's code for its ops when the
    graph is compiled and only the faster is kept (``decide``; ``False``: keep what the cost model ranks above unfused
    ops; a ``decide.Measure`` callable supplies the timing). ``log`` (a results-log path) records each
    chosen plan. ``progress``: one bar per stage (capture, plan, check, compile, measure) and the report
    table on a terminal's stderr; quiet when stderr is not a terminal or ``progress=False`` (a
    ``progress.Tracker`` may be given instead).
    ``backward=False``: called with autograd on, the graph goes to PyTorch whole (no derived backward).
    ``device`` (``h200``, ``a100``): the backend regions are planned, rendered and compiled for, as
    ``superopt --device`` (default: the GPU found at run time, h200 without one).
    """
    from pyrunner.frontend.backend import (
        compile_fx_graph,
        dtype_problem,
        flag_problem,
        resolve_executor,
        resolve_fallback,
    )
    from pyrunner.frontend.region import ident

    if not callable(fn):  # dynamo's own check is an AssertionError with its traceback
        raise FrontendError(f"optimize: the first argument must be a function or module, not {type(fn).__name__}")
    problem = flag_problem({"verify": verify, "backward": backward}) or dtype_problem(dtype)
    if problem:
        raise FrontendError(problem)
    resolved = resolve_executor(executor)
    fallback = resolve_fallback(fallback, resolved)
    names = axis_names(axes)
    trk = tracker(progress)
    say = trk.say
    report = Report()
    graphs: list[Any] = []
    later: list[Report] = []
    name = ident(getattr(fn, "__name__", type(fn).__name__))

    def backend(gm: Any, example_inputs: list) -> Callable:
        """During capture every graph reports into ``report``; a later compile (a new shape, autograd
        turned on) into a report of its own in ``.later_reports``."""
        if captured:
            later.append(Report())
        else:
            graphs.append(gm)
        return compile_fx_graph(gm, example_inputs, fallback=fallback, executor=resolved, verify=verify,
                                log=str(log) if log else None, dtype=dtype, report=later[-1] if captured else report,
                                progress=say, axis_names=names, name=f"{name}{len(graphs) - 1 or ''}", tracker=trk,
                                source="optimize", measure=measure,
                                new_report=lambda: (later.append(Report()), later[-1])[1], backward=backward,
                                device=device)

    captured = False
    trk.start("capture")
    try:
        compiled = capture(fn, example_args, example_kwargs, backend)
        trk.done("capture")
    finally:
        trk.close()
    captured = True
    if isinstance(trk, RichTracker):
        trk.console.print(report)
    opt = Optimized(fn, compiled, report, graphs)
    opt.tensor_slots = _tensor_slots(opt, example_args, example_kwargs)
    opt.later_reports = later
    return opt


def _tensor_slots(opt: Optimized, args: tuple, kwargs: dict) -> frozenset[str | int]:
    import torch

    return frozenset(k for k, v in opt._bound(args, kwargs).items() if isinstance(v, torch.Tensor))


def axis_names(axes: Any) -> dict[str, tuple[str, ...]]:
    """``axes`` (``{"x": "td"}`` or ``{"x": ["t", "d"]}``) as names per input; anything else is one error line."""
    if axes is None:
        return {}
    if not isinstance(axes, dict):
        raise FrontendError(f"axes must map input names to axis names (e.g. {{'x': 'td'}}), not {type(axes).__name__}")
    out: dict[str, tuple[str, ...]] = {}
    for k, v in axes.items():
        names = tuple(v) if isinstance(v, (str, list, tuple)) else None
        if not isinstance(k, str) or names is None or not all(isinstance(n, str) for n in names):
            raise FrontendError(f"axes[{k!r}]: give the input's axis names as a string or a list of strings "
                                f"(e.g. 'td'), not {type(v).__name__}")
        out[k] = names
    return out


def capture_graph(fn: Callable, *args: Any, **kwargs: Any) -> tuple[Any, list]:
    """The first FX graph dynamo captures from ``fn(*args, **kwargs)`` and its example inputs (parameters
    included), untouched: what the backend is handed, for tools and tests that look at the partition."""
    import torch

    got: list[tuple[Any, list]] = []

    def record(gm: Any, example_inputs: list) -> Callable:
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    capture(fn, args, kwargs, record)
    if not got:
        raise FrontendError(f"dynamo captured no graph from {getattr(fn, '__name__', type(fn).__name__)}")
    return got[0]
