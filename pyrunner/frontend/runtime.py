"""Put compiled regions back into the FX graph, as PyTorch custom ops.

Each region becomes one op ``torch.ops.superopt.region<N>`` (with a fake
implementation giving output shapes, so inductor and ``make_fx`` treat it as an
opaque kernel); its FX nodes are erased and their users read the op's outputs.
Python values computed from shapes are folded to constants first.

A region's executor is the plan's kernels (``pyrunner.load``) on the GPU, or the
float64 reference interpreter (``executor="reference"``) that lets everything
here be checked on a CPU.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from pyrunner.frontend.region import RegionGraph
from pyrunner.plan.schema import Plan

Impl = Callable[[dict[str, Any]], tuple]
"""IR input name -> tensor, to the graph's outputs (IR axis order) as a tuple."""

_LIB: Any = None
_COUNTER = itertools.count()
_LOCK = threading.Lock()


def plan_impl(plan: Plan, verify: bool = True, device: str | None = None) -> Impl:
    """The plan's kernels, built for the backend of ``device`` (None: the local GPU's); inputs cast to the
    plan dtype (verify: float64 check on first call)."""
    import torch

    from pyrunner.frontend.load import LoadedPlan

    f = LoadedPlan(plan, verify=verify, backend=device, views=True)
    dt = getattr(torch, plan.dtype)
    dts = {s.name: getattr(torch, s.dtype) for s in f.sig.inputs}

    def run(feed: dict[str, Any]) -> tuple:
        out = f(**{k: v.to(dts.get(k, dt)) for k, v in feed.items()})
        return out if isinstance(out, tuple) else (out,)

    run.loaded = f  # type: ignore[attr-defined]
    return run


def reference_impl(rg: RegionGraph | Any) -> Impl:
    """The region's graph (or a graph: the bucketed one) evaluated in float64 by ``ir.reference`` (any
    device; for checking)."""
    import torch

    from pyrunner.ir.reference import evaluate

    graph = rg.graph if isinstance(rg, RegionGraph) else rg

    def run(feed: dict[str, Any]) -> tuple:
        device = next(iter(feed.values())).device
        outs = evaluate(graph, {k: v.detach().to("cpu", torch.float64).numpy() for k, v in feed.items()})
        return tuple(torch.from_numpy(outs[n]).to(device) for n, _ in graph.outputs)

    return run


def kernels_only(rg: RegionGraph, impl: Impl, xs: list[Any]) -> Callable[[], None] | None:
    """The region's kernels alone on ``xs`` (region-input order): every tensor converted to the plan's layout and
    allocated once, so a call is the launch and nothing else. Timed beside ``region_callable``'s call, the
    difference is the region op's own work per call (layout copies, allocation, output reshapes). None when
    ``impl`` is not a plain plan (a padded bucket, the reference)."""
    import torch

    lp = getattr(impl, "loaded", None)
    if lp is None:
        return None
    dt = getattr(torch, lp.plan.dtype)
    dts = {s.name: getattr(torch, s.dtype) for s in lp.sig.inputs}
    feed = {name: x.reshape(shape) for (name, _, shape), x in zip(rg.inputs, xs, strict=True)}
    device = xs[0].device if xs else None
    launch = lp.compile(device)
    tensors = {s.name: s.to_plan(feed[s.name].to(dts.get(s.name, dt))) for s in lp.sig.inputs}
    for gt in lp.plan.tensors:
        if gt.role != "input":
            tensors[gt.name] = torch.empty(gt.shape, dtype=getattr(torch, gt.dtype), device=device)

    def run() -> None:
        launch(tensors)

    return run


def with_strides(x: Any, stride: tuple[int, ...] | None) -> Any:
    """``x`` laid out with ``stride`` (None: contiguous): itself when it already is (size-one dimensions may have
    any stride), else one copy into a tensor of those strides."""
    import torch

    if stride is None:
        return x.contiguous()
    if all(n <= 1 or a == b for n, a, b in zip(x.shape, x.stride(), stride, strict=True)):
        return x
    return torch.empty_strided(tuple(x.shape), stride, dtype=x.dtype, device=x.device).copy_(x)


def region_callable(rg: RegionGraph, impl: Impl, meta: Callable[[Any], Any]) -> Callable[..., tuple]:
    """Tensors in region-input order -> outputs shaped, typed and strided like the FX nodes they replace.

    A node that is a view in the model (``q.view(b, t, h, d).transpose(1, 2)``) has a view's strides; where the
    plan's own storage seen through the region's reshapes has the same strides, the output is that view and
    nothing is copied (a contiguous copy of every such output was most of a region op's own time)."""
    dtypes = [meta(node).dtype for _, node, _, _ in rg.outputs]
    strides = output_strides(rg, meta)

    def run(*xs: Any) -> tuple:
        feed = {name: x.reshape(shape) for (name, _, shape), x in zip(rg.inputs, xs, strict=True)}
        outs = impl(feed)
        return tuple(with_strides(o.permute(perm).reshape(ones).expand(full).reshape(shape).to(dt), st)
                     for o, (_, _, (perm, ones, full), shape), dt, st
                     in zip(outs, rg.outputs, dtypes, strides, strict=True))

    return run


def output_strides(rg: RegionGraph, meta: Callable[[Any], Any]) -> list[tuple[int, ...]]:
    """What the op promises inductor for each output: the FX node's strides where they lay it out densely (a
    permuted view, such as a head split), else contiguous ones (a slice's gaps, as ``split`` leaves, inductor
    would not keep)."""
    got = []
    for _, node, _, shape in rg.outputs:
        stride = tuple(meta(node).stride())
        got.append(stride if dense(tuple(shape), stride) else contiguous_strides(tuple(shape)))
    return got


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (what ``torch.empty(shape)`` has)."""
    out, n = [], 1
    for size in reversed(shape):
        out.append(n)
        n *= max(size, 1)
    return tuple(reversed(out))


def dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """The strides lay the elements out with no gap and no overlap (some permutation of a contiguous layout)."""
    n = 1
    for size, st in sorted(((sz, st) for sz, st in zip(shape, stride, strict=True) if sz > 1), key=lambda p: p[1]):
        if st != n:
            return False
        n *= size
    return True


Out = tuple[tuple[int, ...], Any] | tuple[tuple[int, ...], Any, tuple[int, ...]]
"""An op output: (shape, dtype), contiguous, or (shape, dtype, stride)."""


def register_op(fn: Callable[..., tuple], n_in: int, outs: list[Out]) -> Any:
    """A fresh custom op ``superopt::region<N>(Tensor x0, ...) -> (Tensor, ...)`` running ``fn``."""
    import torch

    global _LIB
    with _LOCK:
        if _LIB is None:
            _LIB = torch.library.Library("superopt", "FRAGMENT")
        name = f"region{next(_COUNTER)}"
    ret = "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    _LIB.define(f"{name}({', '.join(f'Tensor x{i}' for i in range(n_in))}) -> {ret}")
    strides = [o[2] if len(o) > 2 else None for o in outs]

    def impl(*xs: Any):
        # The fake kernel promises each output's strides, and inductor asserts the strides it was promised;
        # whatever ran (the kernels, a padded bucket sliced back, or the fallback's code after a measured
        # decision) may hand back other strides, so it is laid out here (no copy when it already is).
        r = tuple(with_strides(x, st) for x, st in zip(fn(*xs), strides, strict=True))
        return r[0] if len(outs) == 1 else r

    def fake(*xs: Any):
        dev = xs[0].device
        r = tuple(torch.empty(o[0], dtype=o[1], device=dev) if st is None
                  else torch.empty_strided(o[0], st, dtype=o[1], device=dev)
                  for o, st in zip(outs, strides, strict=True))
        return r[0] if len(outs) == 1 else r

    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"superopt::{name}", fake, lib=_LIB)
    torch.library.register_autograd(f"superopt::{name}", _no_backward, lib=_LIB)
    return getattr(torch.ops.superopt, name).default


def _no_backward(ctx: Any, *grads: Any) -> tuple:  # noqa: ARG001
    """A forward-only region op: under autograd the backend puts ``autograd``'s Function (with the derived
    backward) in its place, so reaching this is a misuse: say so rather than return no gradient."""
    from pyrunner.frontend.errors import FrontendError

    raise FrontendError("a Superopt region has no backward; run it under torch.no_grad() or let the backend "
                        "compile the graph again with autograd on (it then plans each region's backward)")


def region_module(gm: Any, rg: RegionGraph, args: tuple) -> Any:
    """The region's own FX nodes as a module taking the region op's inputs ``args`` (nodes of ``gm`` now),
    what the fallback compiler would run for them; None when a node reads anything else. A tuple-valued node
    the region reads through ``getitem`` (GPT-2's ``c_attn(...).split``, a fused gate/up ``chunk``) is not
    one of its nodes but is computed from them alone, so it is copied in with them."""
    import torch.fx

    g = torch.fx.Graph()
    env: dict[Any, Any] = {}
    for i, src in enumerate(args):
        ph = g.placeholder(f"x{i}")
        env.setdefault(src, ph)

    def read(n: Any) -> Any:
        if n not in env and n.op in ("call_function", "call_method") and all(a in env for a in n.all_input_nodes):
            env[n] = g.node_copy(n, lambda a: env[a])
        return env[n]

    try:
        for node in rg.nodes:
            env[node] = g.node_copy(node, read)
    except KeyError:
        return None
    g.output(tuple(env[node] for _, node, _, _ in rg.outputs))
    return torch.fx.GraphModule(gm, g)


def assemble(gm: Any, regions: list[tuple[RegionGraph, Impl]], meta: Callable[[Any], Any]) -> Any:
    """Replace each region's nodes in ``gm`` (in place) by a call of its op; returns gm, recompiled.
    Regions that lost their measurement (``compile._keep_winners``) are not among them: their nodes stay."""
    import operator

    import torch

    graph = gm.graph
    _fold_python_values(gm, meta)
    replaced: dict[Any, Any] = {}
    for rg, impl in regions:
        args = tuple(replaced.get(src, src) for _, src, _ in rg.inputs)
        make = getattr(impl, "autograd_function", None)  # a region under autograd (``frontend.autograd``)
        if make is not None:
            op = make(rg, meta)
        else:
            fn = region_callable(rg, impl, meta)
            op = register_op(fn, len(rg.inputs), [(shape, meta(node).dtype, st) for (_, node, _, shape), st
                                                  in zip(rg.outputs, output_strides(rg, meta), strict=True)])
        with graph.inserting_after(rg.nodes[-1]):  # every input is defined by then, no outside user yet
            call = graph.call_function(op, args)
        prev = call
        for i, (_, node, _, _) in enumerate(rg.outputs):
            new = call
            if len(rg.outputs) > 1:
                with graph.inserting_after(prev):
                    new = prev = graph.call_function(operator.getitem, (call, i))
            node.replace_all_uses_with(new)
            replaced[node] = new
        for node in reversed(rg.nodes):
            if not node.users:
                graph.erase_node(node)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    _ = torch  # the ops live in torch.ops.superopt
    return gm


def _fold_python_values(gm: Any, meta: Callable[[Any], Any]) -> None:
    """Shape arithmetic (``x.shape[-1] ** -0.5``) becomes literals: shapes are static here.

    Only plain Python values fold: a tuple that holds tensors (``x.split(...)``, ``x.chunk(2)``) is a
    computation whose parts its users index, never a constant.
    """
    import torch.fx

    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method"):
            continue
        value = meta(node)
        if isinstance(value, torch.Size):
            value = tuple(value)
        if not _plain(value):
            continue
        for user in list(node.users):
            user.args = torch.fx.node.map_arg(user.args, lambda n, node=node, value=value: value if n is node else n)
            user.kwargs = torch.fx.node.map_arg(user.kwargs,
                                                lambda n, node=node, value=value: value if n is node else n)


def _plain(value: Any) -> bool:
    """A Python number, or a tuple/list of them (no tensor, no symbolic size, nothing else)."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, (int, float, bool))
