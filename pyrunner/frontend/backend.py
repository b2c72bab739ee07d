"""``torch.compile(model, backend="superopt")``: Superopt kernels where they win, inductor for the rest.

Dynamo hands over an FX graph and example inputs. The graph is partitioned
into regions the graph IR expresses; each region is planned and kept as a
Superopt kernel only when the cost model predicts it beats the same ops
unfused (the naive plan, one kernel per op) and the compiled plan passes the
float64 check on the GPU. Everything else -- ops the IR lacks, regions with no
plan, no gain or a failed check, and whole graphs when there is no GPU or
autograd needs gradients -- goes to inductor, each fallback logged (logger
``pyrunner.frontend``) with its reason. The last report is kept in
``LAST_REPORTS`` for inspection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyrunner.frontend.compile import Options, Report, compile_graph

_log = logging.getLogger("pyrunner.frontend")
LAST_REPORTS: list[Report] = []
"""Reports of the graphs compiled by this process, newest last."""


def _inductor(gm: Any, example_inputs: list) -> Callable:
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def _eager(gm: Any, example_inputs: list) -> Callable:  # noqa: ARG001
    return gm.forward


FALLBACKS = {"inductor": _inductor, "eager": _eager}


def _whole_graph_reason(gm: Any, example_inputs: list, executor: str) -> str | None:
    import torch

    from pyrunner.run.timing import gpu_available

    if executor == "gpu" and not gpu_available():
        return "no CUDA GPU: the whole graph goes to the fallback compiler"
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        return "symbolic (dynamic) shapes: Superopt plans static shapes"
    if torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs):
        return "autograd is on and inputs require grad: Superopt kernels are forward-only (use torch.no_grad())"
    return None


def compile_fx_graph(gm: Any, example_inputs: list, *, fallback: str = "inductor", executor: str = "gpu",
                     verify: bool = True, log: str | None = None) -> Callable:
    """The backend: regions to Superopt kernels, the rest to ``fallback`` (``inductor`` or ``eager``)."""
    from pyrunner.frontend.partition import example_values

    finish = FALLBACKS[fallback]
    report = Report()
    LAST_REPORTS.append(report)
    why = _whole_graph_reason(gm, example_inputs, executor)
    if why:
        report.fallback([n for n in gm.graph.nodes if n.op.startswith("call")][:1] or [], why)
        return finish(gm, example_inputs)
    values = example_values(gm, tuple(example_inputs))
    opts = Options(executor=executor, verify=verify, must_beat_unfused=executor == "gpu",
                   progress=_log.info, name="graph", log=Path(log) if log else None, source="backend")
    gm, rep = compile_graph(gm, values.__getitem__, opts, strict=False)
    report.regions, report.fallbacks = rep.regions, rep.fallbacks
    _log.info("superopt backend: %s", report.summary())
    return finish(gm, example_inputs)


def superopt(gm: Any, example_inputs: list, options: dict | None = None) -> Callable:
    """The function registered as ``backend="superopt"``; ``torch.compile(options=...)`` keys are
    ``compile_fx_graph``'s keywords (``fallback``, ``executor``, ``verify``, ``log``)."""
    return compile_fx_graph(gm, example_inputs, **(options or {}))


def register() -> None:
    """Register ``superopt`` with dynamo (idempotent)."""
    from torch._dynamo import list_backends, register_backend

    if "superopt" not in list_backends(exclude_tags=()):
        register_backend(name="superopt")(superopt)
