"""``torch.compile(model, backend="superopt")``: Superopt kernels where they win, inductor for the rest.

Dynamo hands over an FX graph and example inputs. The graph is partitioned
into regions the graph IR expresses; each region is planned (free axes at their
shape bucket, ``buckets``), compiled and checked against float64 on the GPU, and
put back as a custom op inside the graph that inductor compiles. When the graph
is compiled its kernels are timed against inductor's code for the same ops and
the faster is kept (a losing region's ops stay in the graph inductor compiles;
``decide``; the decision cached on disk per region graph,
dtype, device and TileLang version). Symbolic shapes (``dynamic=None`` after a
second shape, a KV-cache decode loop) are specialised per concrete shape at run
time (``specialize``), never handed whole to inductor. Without a GPU
(``executor="auto"``) each region is planned and its plan checked on the CPU
executor against float64 at reduced shapes ("planned, not measured"); inductor
then compiles the whole graph, with a one-line note. Everything else -- ops the
IR lacks, regions with no plan or a failed check (with autograd on: no backward
plan; ``autograd``) -- goes to inductor, each fallback logged (logger
``pyrunner.frontend``) with its reason. The last report is kept in
``LAST_REPORTS`` for inspection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyrunner.frontend.autograd import grad_nodes, training_segment
from pyrunner.frontend.compile import KERNEL_DTYPES, Options, Report, compile_graph
from pyrunner.frontend.decide import Measure, gpu_measure
from pyrunner.frontend.errors import FrontendError
from pyrunner.frontend.progress import NullTracker, Tracker

_log = logging.getLogger("pyrunner.frontend")
LAST_REPORTS: list[Report] = []
"""Reports of the graphs compiled by this process, newest last."""


def _inductor(gm: Any, example_inputs: list) -> Callable:
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs)


def _eager(gm: Any, example_inputs: list) -> Callable:  # noqa: ARG001
    return gm.forward


FALLBACKS = {"inductor": _inductor, "eager": _eager}


def resolve_executor(executor: str) -> str:
    """``auto``: the GPU's kernels when a CUDA GPU is here, else plan and CPU-check only (``plan``)."""
    from pyrunner.run.timing import gpu_available

    if executor not in EXECUTORS:
        raise FrontendError(f"executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    if executor == "auto":
        return "gpu" if gpu_available() else "plan"
    return executor


EXECUTORS = ("auto", "gpu", "plan", "reference")


def resolve_measure(measure: Measure | bool | None, executor: str) -> Measure | None:
    """What times each region against the fallback compiler's code, for the backend and ``optimize`` alike:
    by default CUDA-graph replay timing on the GPU (``gpu_measure``) and nothing elsewhere; ``True`` asks for it,
    ``False`` turns it off, a callable is used as given (``decide.Measure``)."""
    if measure is None:
        return gpu_measure if executor == "gpu" else None
    if measure is True:
        return gpu_measure
    return measure or None


def resolve_fallback(fallback: str, executor: str) -> str:
    """``auto``: inductor where regions run as kernels (the GPU: never slower than torch.compile for what
    Superopt does not take), eager elsewhere (PyTorch runs the model as written)."""
    if fallback == "auto":
        return "inductor" if executor == "gpu" else "eager"
    return fallback
NO_GPU_NOTE = ("no CUDA GPU: regions are planned and CPU-checked only; PyTorch runs the model "
               "(see .report for what would run as Superopt kernels)")


def _training(gm: Any, example_inputs: list) -> frozenset[Any]:
    """The nodes whose values need gradients (``autograd.grad_nodes``: from an input or a parameter the graph holds
    itself, a ``get_attr`` node, that requires one) when grad mode is on; none otherwise, or when no tensor needs
    one. Not empty: the graph runs under autograd."""
    import torch

    return grad_nodes(gm, example_inputs) if torch.is_grad_enabled() else frozenset()


def _whole_graph_reason(gm: Any, example_inputs: list, executor: str, backward: bool = False) -> str | None:
    import torch

    from pyrunner.run.timing import gpu_available

    if executor == "gpu" and not gpu_available():
        return "no CUDA GPU: the whole graph goes to the fallback compiler"
    if not all(isinstance(x, (torch.Tensor, int, float, bool)) for x in example_inputs):
        return "inputs other than tensors and numbers: Superopt plans tensor graphs of static shape"
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if not backward and torch.is_grad_enabled() and any(x.requires_grad for x in tensors):
        return "autograd is on and inputs require grad: backward=False leaves training graphs to PyTorch"
    if executor == "gpu" and any(x.device.type != "cuda" for x in tensors if x.is_floating_point()):
        return "CPU tensors: Superopt kernels run on a CUDA GPU (move the model and inputs with .cuda())"
    return None


def compile_fx_graph(gm: Any, example_inputs: list, *, fallback: str = "inductor", executor: str = "auto",
                     verify: bool = True, log: str | None = None, dtype: str | None = None,
                     report: Report | None = None, progress: Callable[[str], None] | None = None,
                     axis_names: dict[str, tuple[str, ...]] | None = None, name: str = "graph",
                     source: str = "backend", new_report: Callable[[], Report] | None = None,
                     measure: Measure | bool | None = None, tracker: Tracker | None = None,
                     bucket: bool = True, backward: bool = True, device: str | None = None) -> Callable:
    """The backend: regions to Superopt kernels, the rest to ``fallback`` (``inductor`` or ``eager``).

    ``dtype`` (``bfloat16``/``float16``) plans regions of a float32 model in that dtype (and says so);
    ``report`` (default: a new one in ``LAST_REPORTS``) receives what happened. Whatever goes wrong
    here leaves the graph to ``fallback`` with one log line, never a traceback. A graph with symbolic
    shapes is compiled once per concrete shape at run time (``specialize``), each shape's report from
    ``new_report`` (default: a new one in ``LAST_REPORTS``). ``measure`` (a ``decide.Measure``) times each
    region against ``fallback``'s code for its ops when the graph is compiled and keeps the faster
    (decision cached under ``$SUPEROPT_CACHE_DIR``); default: CUDA-graph replay timing in the backend on a GPU, none
    otherwise (``False``: never measure). ``bucket`` plans free axes at their bucket size (``buckets``). With
    autograd on, each region runs its derived backward (``autograd``); ``backward=False`` leaves such graphs to
    PyTorch. ``device`` (``h200``, ``a100``): the backend regions are planned, rendered and compiled for, as
    ``superopt --device`` (default: the GPU found at run time, h200 without one)."""
    from pyrunner.frontend.partition import example_values
    from pyrunner.frontend.specialize import Specialized, is_symbolic

    if fallback not in FALLBACKS:
        raise FrontendError(f"fallback {fallback!r}: choose one of {', '.join(FALLBACKS)}")
    finish = FALLBACKS[fallback]
    if is_symbolic(example_inputs):
        _log.info("superopt backend: symbolic shapes: compiling %s once per concrete shape at run time", name)

        def static(g: Any, args: list) -> Callable:
            return compile_fx_graph(g, args, fallback=fallback, executor=executor, verify=verify, log=log,
                                    dtype=dtype, report=new_report() if new_report else None, progress=progress,
                                    axis_names=axis_names, name=name, source=source, measure=measure,
                                    tracker=tracker, bucket=bucket, backward=backward, device=device)

        return Specialized(gm, static)
    if report is None:
        report = Report()
        LAST_REPORTS.append(report)
    executor = resolve_executor(executor)
    why = _whole_graph_reason(gm, example_inputs, executor, backward)
    needs_grad = _training(gm, example_inputs) if backward else frozenset()
    training = bool(needs_grad)
    if why:
        report.fallback([n for n in gm.graph.nodes if n.op.startswith("call")][:1] or [], why)
        return finish(gm, example_inputs)
    if dtype:
        report.notes.append(f"regions planned in {dtype} as asked (dtype={dtype!r}); the model's own dtype "
                            f"stays outside them")
    pristine = _unspliced_copy(gm)  # what the fallback compiles if splicing fails halfway (gm is changed in place)
    try:
        device = _device(device)
        values = example_values(gm, tuple(example_inputs))
        measure = resolve_measure(measure, executor)
        beat = executor == "gpu" and measure is None  # not measured: the cost model's word
        opts = Options(executor=executor, dtype=dtype, verify=verify, must_beat_unfused=beat,
                       progress=progress or _log.info, name=name, axis_names=axis_names,
                       log=Path(log) if log else None, source=source, measure=measure,
                       fallback_compile=finish, tracker=tracker or NullTracker(), bucket=bucket and not training,
                       segment=training_segment if training else None, device=device,
                       needs_grad=needs_grad if training else None)
        gm, rep = compile_graph(gm, values.__getitem__, opts, strict=False)
    except FrontendError as e:
        if source == "optimize":
            raise  # a wrong optimize() argument (axes= names, say): the caller's error, in one line
        report.fallback(_first_call(pristine), f"the superopt backend was given a bad option ({e}); the whole "
                        f"graph goes to {fallback}")
        return finish(pristine, example_inputs)
    except Exception as e:  # noqa: BLE001 - a frontend failure must never fail the model
        report.fallback([], f"the superopt backend failed on this graph ({type(e).__name__}: {e}); "
                            f"the whole graph goes to {fallback}")
        return finish(pristine, example_inputs)
    report.merge(rep)
    if executor == "plan" and NO_GPU_NOTE not in report.notes:
        report.notes.append(NO_GPU_NOTE)
    _log.info("superopt backend: %s", rep.summary().splitlines()[0])
    return finish(gm, example_inputs)


def _device(device: str | None) -> str:
    """The known device name ``device`` names (the local GPU's when None); FrontendError otherwise."""
    from pyrunner.backend.tilelang.backend import device_name
    from pyrunner.errors import UserError

    try:
        return device_name(device)
    except UserError as e:
        raise FrontendError(f"device={device!r}: {str(e).removeprefix(f'--device {device!r}: ')}") from None


def _unspliced_copy(gm: Any) -> Any:
    """A module running ``gm``'s graph as captured, sharing its parameters: splicing regions in changes ``gm``'s
    own graph, so a failure halfway would otherwise hand the fallback a graph that reads values it never
    defines."""
    import copy

    import torch.fx

    return torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _first_call(gm: Any) -> list:
    """The graph's first call node, for a whole-graph fallback line to point at (none in an empty graph)."""
    return [n for n in gm.graph.nodes if n.op.startswith("call")][:1]


def _shown(value: Any) -> str:
    """``repr(value)`` cut to 60 characters, for an error line about a user's option."""
    shown = repr(value)
    return shown[:60] + "..." if len(shown) > 60 else shown


BACKEND_OPTIONS = ("fallback", "executor", "verify", "log", "dtype", "device", "measure", "bucket", "backward")
"""The ``torch.compile(backend="superopt", options=...)`` keys: ``compile_fx_graph``'s user-facing keywords."""


def option_problem(options: dict) -> str | None:
    """What is wrong with ``options`` (unknown keys, a fallback or executor no one has), or None."""
    unknown = sorted(map(str, set(options) - set(BACKEND_OPTIONS)))
    if unknown:
        return f"unknown option(s) {', '.join(unknown)}; known: {', '.join(BACKEND_OPTIONS)}"
    if options.get("fallback", "inductor") not in FALLBACKS:
        return f"fallback {options['fallback']!r}: choose one of {', '.join(FALLBACKS)}"
    if options.get("executor", "auto") not in EXECUTORS:
        return f"executor {options['executor']!r}: choose one of {', '.join(EXECUTORS)}"
    return flag_problem(options) or dtype_problem(options.get("dtype"))


FLAGS = ("verify", "bucket", "backward")
"""Options that are True or False: any other value (``"no"``, 0) would be read as its truthiness."""


def flag_problem(options: dict) -> str | None:
    """The first of ``FLAGS`` in ``options`` that is not a bool, as one line, or None."""
    for k in FLAGS:
        if k in options and not isinstance(options[k], bool):
            return f"{k} {_shown(options[k])}: give True or False"
    return None


def dtype_problem(dtype: Any) -> str | None:
    """What is wrong with a ``dtype`` option, or None. Only the kernels' dtypes are taken, as written: a
    region planned in another dtype (``float64``, ``int8``) or an alias would be a silent coercion, and
    each region refusing it on its own said so once per region, after capture."""
    if dtype is None or (isinstance(dtype, str) and dtype in KERNEL_DTYPES):
        return None
    return f"dtype {_shown(dtype)}: kernels are planned in {' or '.join(KERNEL_DTYPES)}"


def superopt(gm: Any, example_inputs: list, options: dict | None = None) -> Callable:
    """The function registered as ``backend="superopt"``; ``torch.compile(options=...)`` keys are
    ``BACKEND_OPTIONS``. Options it cannot take leave the whole graph to inductor with one log line:
    an exception here would reach the user wrapped by dynamo, with its traceback."""
    options = dict(options or {})
    problem = option_problem(options)
    if problem is not None:
        report = Report()  # its fallback line is the one log line
        report.fallback(_first_call(gm), f"{problem}; the graph goes to inductor")
        LAST_REPORTS.append(report)
        return _inductor(gm, example_inputs)
    return compile_fx_graph(gm, example_inputs, **options)


def register() -> None:
    """Register ``superopt`` with dynamo (idempotent)."""
    from torch._dynamo import list_backends, register_backend

    if "superopt" not in list_backends(exclude_tags=()):
        register_backend(name="superopt")(superopt)
