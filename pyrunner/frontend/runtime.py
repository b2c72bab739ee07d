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
from pyrunner.frontend.strides import dense, dense_in_order, same_layout, with_strides
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
    from pyrunner.frontend.signature import plan_inputs

    f = LoadedPlan(plan, verify=verify, backend=device, views=True)
    dt = getattr(torch, plan.dtype)
    dts = {s.name: getattr(torch, s.dtype) for s in f.sig.inputs}

    def run(feed: dict[str, Any]) -> tuple:
        out = f(**{k: v.to(dts.get(k, dt)) for k, v in plan_inputs(f.sig, feed).items()})
        return out if isinstance(out, tuple) else (out,)

    def layouts() -> tuple:
        return plan_layouts(f)

    run.loaded = f  # type: ignore[attr-defined]
    run.layouts = layouts  # type: ignore[attr-defined]
    return run


def plan_layouts(f: Any) -> tuple:
    """Meta tensors shaped and strided as ``f`` (a ``LoadedPlan`` with ``views``) returns its outputs: the plan's
    own storage seen in the graph's axis order. Worked out without a GPU, so the region op can promise
    inductor the layout its kernels write instead of copying into another one."""
    import torch

    return tuple(s.from_plan(torch.empty(s.plan_shape, dtype=getattr(torch, s.dtype), device="meta"),
                             contiguous=not f.views) for s in f.sig.outputs)


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
    feed = rg.feed(xs)
    device = xs[0].device if xs else None
    launch = lp.compile(device)
    tensors = {s.name: s.to_plan(feed[s.name].to(dts.get(s.name, dt))) for s in lp.sig.inputs}
    for gt in lp.plan.tensors:
        if gt.role != "input":
            tensors[gt.name] = torch.empty(gt.shape, dtype=getattr(torch, gt.dtype), device=device)

    def run() -> None:
        launch(tensors)

    return run


def region_callable(rg: RegionGraph, impl: Impl, meta: Callable[[Any], Any],
                    strides: list[tuple[int, ...]] | None = None) -> Callable[..., tuple]:
    """Tensors in region-input order -> outputs shaped, typed and strided as promised (``strides``, default
    ``promised_strides``): the plan's own storage seen through the region's reshapes where that is dense, so
    a head-split or rotary output is returned as the view the kernels wrote and nothing is copied (a copy of
    every such output was most of a region op's own time); one copy otherwise."""
    dtypes = [meta(node).dtype for _, node, _, _ in rg.outputs]
    strides = promised_strides(rg, impl, meta) if strides is None else strides
    names = [n for n, _ in rg.graph.outputs]
    picks = [selection(rg, i) for i in range(len(rg.outputs))]

    def run(*xs: Any) -> tuple:
        feed = rg.feed(xs)
        outs = dict(zip(names, impl(feed), strict=True))
        return tuple(with_strides(as_node(outs[name], layout, shape, pick).to(dt), st)
                     for (name, _, layout, shape), pick, dt, st in zip(rg.outputs, picks, dtypes, strides, strict=True))

    return run


def selection(rg: RegionGraph, i: int) -> tuple[int, int] | None:
    """(axis position, index) of the graph output that region output ``i`` is one chunk of, or None."""
    return rg.selects.get(i)


def as_node(o: Any, layout: tuple[list[int], tuple[int, ...], tuple[int, ...]], shape: tuple[int, ...],
            pick: tuple[int, int] | None = None) -> Any:
    """A graph output (IR axis order) as the FX node's value: its chunk taken (``pick``, a view), its axes put in
    the node's order, broadcast axes expanded, reshaped to the node's shape (views wherever the strides allow)."""
    perm, ones, full = layout
    if pick is not None:
        o = o.select(*pick)
    return o.permute(perm).reshape(ones).expand(full).reshape(shape)


def promised_strides(rg: RegionGraph, impl: Impl, meta: Callable[[Any], Any]) -> list[tuple[int, ...]]:
    """What the op promises inductor for each output: the layout the plan's kernels leave it in (``impl.layouts``,
    seen through ``as_node``) where that is dense, so it is returned as it is; else ``output_strides``' choice
    (one copy). A model output keeps the FX node's strides: the caller sees eager's layout."""
    fx = output_strides(rg, meta)
    layouts = getattr(impl, "layouts", None)
    if layouts is None:
        return fx
    try:
        stored = dict(zip((n for n, _ in rg.graph.outputs), layouts(), strict=True))
    except Exception:  # noqa: BLE001 - a layout not worked out costs a copy, never the region
        return fx
    got = []
    for i, ((name, node, layout, shape), st) in enumerate(zip(rg.outputs, fx, strict=True)):
        try:
            v = as_node(stored[name], layout, tuple(shape), selection(rg, i))
        except (RuntimeError, KeyError):  # a layout that cannot be seen so: the FX node's
            got.append(st)
            continue
        mine = tuple(v.stride())
        model_output = any(u.op == "output" for u in getattr(node, "users", ()))
        keep = same_layout(tuple(shape), mine, st) or model_output or not dense(tuple(shape), mine)
        got.append(st if keep else mine)
    return got


def output_strides(rg: RegionGraph, meta: Callable[[Any], Any]) -> list[tuple[int, ...]]:
    """The FX node's strides where they lay it out densely (a permuted view, such as a head split); else its
    axes in the same order with the gaps closed (a ``split`` piece's, which inductor would not keep: GPT-2's
    Q, K and V token-major, the order the next region reads them in), or contiguous where the strides tell
    no order (a broadcast)."""
    got = []
    for _, node, _, shape in rg.outputs:
        stride = tuple(meta(node).stride())
        got.append(stride if dense(tuple(shape), stride) else dense_in_order(tuple(shape), stride))
    return got


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
    Regions that lost their measurement (``winners.keep_winners``) are not among them: their nodes stay."""
    import operator

    import torch

    from pyrunner.frontend.partition import restore_order

    graph = gm.graph
    _fold_python_values(gm, meta)
    strides = layouts_checked(gm, regions, meta)
    replaced: dict[Any, Any] = {}
    for (rg, impl), st in zip(regions, strides, strict=True):
        args = tuple(replaced.get(src, src) for _, src, _ in rg.inputs)
        make = getattr(impl, "autograd_function", None)  # a region under autograd (``frontend.autograd``)
        if make is not None:
            op = make(rg, meta)
        else:
            fn = region_callable(rg, impl, meta, st)
            op = register_op(fn, len(rg.inputs), [(shape, meta(node).dtype, s) for (_, node, _, shape), s
                                                  in zip(rg.outputs, st, strict=True)])
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
    restore_order(graph)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    _ = torch  # the ops live in torch.ops.superopt
    return gm


def layouts_checked(gm: Any, regions: list[tuple[RegionGraph, Impl]],
                    meta: Callable[[Any], Any]) -> list[list[tuple[int, ...]]]:
    """Each region's promised output strides (``promised_strides``), provided the graph's own code downstream of
    them still traces with those layouts; else every region promises ``output_strides`` (the FX nodes' layouts,
    which the graph was traced with). A ``.view`` that only the model's own strides allow is what would fail:
    inductor traces the graph around the ops with the strides they promise."""
    plan = [promised_strides(rg, impl, meta) for rg, impl in regions]
    fx = [output_strides(rg, meta) for rg, _ in regions]
    changed = {node: s for (rg, _), mine, theirs in zip(regions, plan, fx, strict=True)
               for (_, node, _, _), s, t in zip(rg.outputs, mine, theirs, strict=True) if s != t}
    if not changed:
        return plan
    inside = {n for rg, _ in regions for n in rg.nodes}
    if _traces(gm, changed, inside, meta):
        return plan
    import logging

    logging.getLogger("pyrunner.frontend").info(
        "superopt: the graph's code after the regions needs the model's own layouts; region ops copy into them")
    return fx


def _traces(gm: Any, changed: dict[Any, tuple[int, ...]], inside: set[Any], meta: Callable[[Any], Any]) -> bool:
    """Whether the nodes of ``gm`` outside the regions (``inside``) that read, directly or not, an output laid
    out as ``changed`` says still compute on meta tensors so laid out (every other node keeps its example
    value, which nothing recomputes)."""
    import torch
    import torch.fx

    dirty = set(changed)

    def stand_in(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")
        if isinstance(v, (tuple, list)):
            return type(v)(stand_in(x) for x in v)
        return v

    class Check(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:  # type: ignore[override]
            if n in changed:
                m = meta(n)
                return torch.empty_strided(tuple(m.shape), changed[n], dtype=m.dtype, device="meta")
            if (n.op in ("call_function", "call_method", "call_module") and n not in inside
                    and any(a in dirty for a in n.all_input_nodes)):
                dirty.add(n)
                return super().run_node(n)
            return None if n.op == "output" else stand_in(meta(n))

    try:
        with torch.no_grad():
            Check(gm).run(*[None for n in gm.graph.nodes if n.op == "placeholder"])
    except Exception:  # noqa: BLE001 - any failure: the FX nodes' own layouts, which the graph was traced with
        return False
    return True


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
