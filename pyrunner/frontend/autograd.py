"""Regions under autograd: each becomes a ``torch.autograd.Function`` with a planned forward and backward.

When dynamo hands over a graph with autograd on (a training step), each region is derived
(``ir.grad``) and run as a ``torch.autograd.Function`` whose forward runs the forward that also
writes the saved tensors the backward reads (a softmax's log-sum-exp, the contractions
``planner.saves`` chose to keep) and whose backward runs the derived backward graph. Both halves are
custom ops (``runtime.register_op``, with fake kernels), so inductor and AOTAutograd see two opaque
kernels and autograd records the region as one node.

What runs them follows the forward's executors: ``gpu`` the compiled plans (each verified against
float64 first), ``reference`` the float64 interpreter on both graphs (checks the whole path on a
CPU), ``plan`` (no GPU) plans both halves, CPU-checks them (``training``) and leaves the ops, and
their gradients, to PyTorch. A region whose backward cannot be derived, planned or checked stays
PyTorch ops (PyTorch's gradients), with one log line.

Saved tensors the forward adds (log-sum-exps, saved contractions) are kept between the halves as
the forward plan writes them: saved statistics (log-sum-exps) and saved values the backward reads inside
an exponent or logarithm (a pre-softmax score) in float32, other saved contractions in the plan's dtype
(``ir.grad``), which the backward plan reads as they are. Widening a bf16 contraction to float32 in
between added nothing but two conversions of the largest tensor of a layer. The float64 interpreter's
saves are kept in float32 (or the model's dtype when wider).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from pyrunner.errors import UserError
from pyrunner.frontend.errors import FrontendError
from pyrunner.frontend.region import RegionGraph
from pyrunner.ir.grad import Backward

log = logging.getLogger("pyrunner.frontend")

CALLS: Counter[str] = Counter()
"""How many times region forwards and backwards of this module ran (``forward``/``backward``): the
evidence that a training step went through the planned halves and not PyTorch's ops."""

Run = Callable[[dict[str, Any]], tuple]
"""IR input name -> tensor, to a graph's outputs in graph order."""


class TrainingImpl:
    """A region's two halves. Called like a forward ``runtime.Impl`` (the region's own outputs);
    ``runtime.assemble`` calls ``autograd_function`` instead when it finds one."""

    def __init__(self, bwd: Backward, forward: Run, backward: Run, n_outputs: int,
                 save_dtypes: dict[str, Any] | None = None) -> None:
        self.bwd, self.forward, self.backward, self.n_outputs = bwd, forward, backward, n_outputs
        self.save_dtypes = save_dtypes or {}
        """Saved tensor -> the torch dtype the forward plan writes it in (empty for the float64 interpreter)."""
        self._functions: dict[int, tuple[RegionGraph, Callable[..., Any]]] = {}

    def __call__(self, feed: dict[str, Any]) -> tuple:
        return tuple(self.forward(feed)[:self.n_outputs])  # the derived forward lists the graph's outputs first

    def autograd_function(self, rg: RegionGraph, meta: Callable[[Any], Any]) -> Callable[..., Any]:
        """The region as a differentiable function; made once per region (measured, then assembled)."""
        if id(rg) not in self._functions:  # the region kept beside its function, so its id stays its own
            self._functions[id(rg)] = (rg, region_function(rg, self, meta))
        return self._functions[id(rg)][1]


def reference_run(graph: Any) -> Run:
    """``graph`` evaluated in float64 by ``ir.reference`` (outputs on the inputs' device)."""
    import torch

    from pyrunner.ir.reference import evaluate

    def run(feed: dict[str, Any]) -> tuple:
        device = next(iter(feed.values())).device
        outs = evaluate(graph, {k: v.detach().to("cpu", torch.float64).numpy() for k, v in feed.items()})
        return tuple(torch.from_numpy(outs[n]).to(device) for n, _ in graph.outputs)

    return run


def plan_run(loaded: Any) -> Run:
    """A ``load.LoadedPlan`` as a ``Run``: inputs cast to the dtype the plan stores each in (the plan dtype,
    masks included, as ``plan_impl``; float32 for a saved statistic such as a log-sum-exp)."""
    import torch

    from pyrunner.frontend.signature import plan_inputs

    dt = getattr(torch, loaded.plan.dtype)
    dts = {s.name: getattr(torch, s.dtype) for s in loaded.sig.inputs}

    def run(feed: dict[str, Any]) -> tuple:
        out = loaded(**{k: v.to(dts.get(k, dt)) for k, v in plan_inputs(loaded.sig, feed).items()})
        return out if isinstance(out, tuple) else (out,)

    return run


# --- layouts: FX values <-> IR tensors ----------------------------------------------------------------

def _to_node(o: Any, layout: tuple, shape: tuple[int, ...], dt: Any) -> Any:
    perm, ones, full = layout
    return o.permute(perm).reshape(ones).expand(full).reshape(shape).to(dt).contiguous()


def _to_ir(g: Any, layout: tuple, ir_shape: tuple[int, ...], wide: Any) -> Any:
    """A cotangent of an FX value -> the IR output's layout: summed in ``wide`` over the axes the value only
    broadcasts. Otherwise its dtype is kept: the plan's run casts it once to the dtype the plan reads (a
    cast to float32 here and back to bf16 there was two copies of every cotangent per step)."""
    perm, ones, full = layout
    g = g.reshape(full)
    dims = [i for i, (a, b) in enumerate(zip(ones, full, strict=True)) if a == 1 and b != 1]
    if dims:
        g = g.to(wide).sum(dims, keepdim=True)
    inverse = sorted(range(len(perm)), key=perm.__getitem__)
    return g.reshape([ir_shape[p] for p in perm]).permute(inverse)


def _to_input(v: Any, have: tuple[str, ...], want: tuple[str, ...], shape: Any, dt: Any) -> Any:
    """A gradient with axes ``have`` -> the input's axes ``want`` (unit axes it gained dropped), its shape."""
    keep = [a in want for a in have]
    if not all(keep):
        v = v.reshape([n for n, k in zip(v.shape, keep, strict=True) if k])
        have = tuple(a for a in have if a in want)
    return v.permute([have.index(a) for a in want]).reshape(shape).to(dt).contiguous()


# --- the autograd.Function ----------------------------------------------------------------------------

def region_function(rg: RegionGraph, impl: TrainingImpl, meta: Callable[[Any], Any]) -> Callable[..., Any]:
    """The region as ``torch.autograd.Function.apply`` over the FX inputs, returning the FX outputs."""
    import torch

    from pyrunner.frontend.runtime import register_op

    if rg.input_perms or rg.selects:  # ``region_of(..., views=False)`` makes training regions
        raise FrontendError(f"{rg.label}: a training region reads its inputs and writes its outputs in the model's "
                            "own axis order (built with views=False)")
    bwd = impl.bwd
    fwd_names = [n for n, _ in bwd.forward.outputs]
    fwd_terms = dict(bwd.forward.outputs)
    n_in, n_out, saved = len(rg.inputs), len(rg.outputs), list(bwd.saved)
    out_dt = [meta(node).dtype for _, node, _, _ in rg.outputs]
    in_meta = [meta(src) for _, src, _ in rg.inputs]
    own = {n for n, _, _, _ in rg.outputs}
    wide = torch.promote_types(torch.float32, out_dt[0])
    save_dt = [out_dt[[o[0] for o in rg.outputs].index(n)] if n in own else impl.save_dtypes.get(n, wide)
               for n in saved]
    ir_shape = {n: bwd.forward.shape_of(t) for n, t in bwd.forward.outputs}
    in_axes = {t.name: tuple(t.axes) for t in rg.graph.inputs()}
    back_in = {t.name for t in bwd.graph.inputs()}
    back_names = [n for n, _ in bwd.graph.outputs]
    back_axes = {n: bwd.graph.axes_of(t) for n, t in bwd.graph.outputs}
    cot_of = {out: c for c, out in bwd.cotangents.items()}
    grad_of = {i: g for g, i in bwd.gradients.items()}
    has_grad = [name in grad_of and m.dtype.is_floating_point for (name, _, _), m in zip(rg.inputs, in_meta,
                                                                                          strict=True)]
    reads = _inputs_read(rg)

    def forward(*xs: Any) -> tuple:
        CALLS["forward"] += 1
        feed = {name: x.reshape(shape) for (name, _, shape), x in zip(rg.inputs, xs, strict=True)}
        res = dict(zip(fwd_names, impl.forward(feed), strict=True))
        user = [_to_node(res[n], layout, shape, dt) for (n, _, layout, shape), dt in zip(rg.outputs, out_dt,
                                                                                        strict=True)]
        return (*user, *(res[n].to(dt).contiguous() for n, dt in zip(saved, save_dt, strict=True)))

    def backward(*args: Any) -> tuple:
        CALLS["backward"] += 1
        xs, kept, gs = args[:n_in], args[n_in:n_in + len(saved)], args[n_in + len(saved):]
        feed = {name: x.reshape(shape) for (name, _, shape), x in zip(rg.inputs, xs, strict=True) if name in back_in}
        feed.update(zip(saved, kept, strict=True))
        for (n, _, layout, _), g in zip(rg.outputs, gs, strict=True):
            if n in cot_of:
                feed[cot_of[n]] = _to_ir(g, layout, ir_shape[n], wide)
        res = dict(zip(back_names, impl.backward({k: v for k, v in feed.items() if k in back_in}), strict=True))
        grads = []
        for (name, _, _), m in zip(rg.inputs, in_meta, strict=True):
            g = grad_of.get(name)
            if g is None:
                grads.append(torch.zeros(m.shape, dtype=m.dtype, device=xs[0].device))
            elif g in bwd.aliases:  # the gradient is an output's cotangent, passed through
                c = bwd.aliases[g]
                out = bwd.cotangents[c]
                grads.append(_to_input(feed[c], bwd.forward.axes_of(fwd_terms[out]), in_axes[name], m.shape, m.dtype))
            else:
                grads.append(_to_input(res[g], back_axes[g], in_axes[name], m.shape, m.dtype))
        return tuple(grads)

    fwd_op = register_op(forward, n_in, [(shape, dt) for (_, _, _, shape), dt in zip(rg.outputs, out_dt, strict=True)]
                         + [(ir_shape[n], dt) for n, dt in zip(saved, save_dt, strict=True)])
    bwd_op = register_op(backward, n_in + len(saved) + n_out, [(tuple(m.shape), m.dtype) for m in in_meta])

    def tup(r: Any) -> tuple:
        return r if isinstance(r, tuple) else (r,)

    class RegionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *xs: Any) -> Any:
            r = tup(fwd_op(*xs))
            ctx.save_for_backward(*xs, *r[n_out:])
            # an output computed from no input that needs a gradient (a rotary table beside Q) is none of autograd's
            # business: marked so, the forward-only region reading it later is not asked for a backward
            constant = [r[i] for i in range(n_out) if not any(ctx.needs_input_grad[j] for j in reads[i])]
            if constant:
                ctx.mark_non_differentiable(*constant)
            return r[:n_out]

        @staticmethod
        def backward(ctx: Any, *gs: Any) -> Any:
            r = tup(bwd_op(*ctx.saved_tensors, *(g.contiguous() for g in gs)))
            return tuple(g if has_grad[i] and ctx.needs_input_grad[i] else None for i, g in enumerate(r))

    RegionFunction.__name__ = RegionFunction.__qualname__ = f"SuperoptRegion_{rg.label}"

    def run(*xs: Any) -> Any:
        r = RegionFunction.apply(*xs)
        return r[0] if n_out == 1 else r

    run.__name__ = f"superopt_{rg.label}"
    return run


def _inputs_read(rg: RegionGraph) -> list[set[int]]:
    """Per output of ``rg`` (in ``rg.outputs`` order), the positions in ``rg.inputs`` of the inputs it is
    computed from."""
    position = {name: i for i, (name, _, _) in enumerate(rg.inputs)}
    terms = dict(rg.graph.outputs)
    below: dict[Any, set[int]] = {}
    for t in rg.graph.terms():  # operands first
        if t.op == "input":
            below[t] = {position[t.name]} if t.name in position else set()
        else:
            below[t] = set().union(*(below[a] for a in t.args)) if t.args else set()
    return [below[terms[name]] for name, _, _, _ in rg.outputs]


# --- the compile hook -------------------------------------------------------------------------------------

def training_segment(nodes: list[Any], meta: Callable[[Any], Any], opts: Any, report: Any,
                     counter: list[int]) -> list[tuple[RegionGraph, Any]]:
    """``compile.compile_segment`` for a graph under autograd: the segment's region with its backward, split
    where no backward plan exists; what is left stays PyTorch ops (one log line each)."""
    from pyrunner.frontend.flops import node_flops
    from pyrunner.frontend.partition import cheaper_cut, region_of, split

    counter[0] += 1
    why = ""
    try:
        # views=False: the backward takes one cotangent per graph output, gives gradients in the model's axis order
        rg = region_of(nodes, meta, f"{opts.name}_r{counter[0]}", opts.axis_names, views=False)
    except Exception as e:  # noqa: BLE001 - a piece that does not translate alone: smaller pieces, else PyTorch
        if isinstance(e, UserError) and "axes for" in str(e):
            raise
        rg, why = None, str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}"
    if rg is None and not why:
        return []
    wrt = _wrt(rg, opts)
    if wrt is not None and not wrt:  # nothing it reads needs a gradient: a forward-only region
        from pyrunner.frontend.compile import compile_segment

        return compile_segment(nodes, meta, opts, report, counter)
    cut = cheaper_cut(nodes, lambda piece: _training_us(piece, meta, opts)) \
        if rg is not None and opts.executor != "reference" else None
    if cut is not None:
        msg = f"{opts.name}: {len(nodes)} op(s) from {nodes[0].name}: {cut.describe()}, forward and backward"
        log.info(msg)
        if opts.progress is not None:
            opts.progress("  " + msg)
        return (training_segment(cut.head, meta, opts, report, counter)
                + training_segment(cut.tail, meta, opts, report, counter))
    if rg is not None:
        try:
            impl, choice = _prepare(rg, meta, opts, sum(node_flops(n, meta) for n in nodes), wrt)
            report.chose(choice)
            return [] if impl is None else [(rg, impl)]
        except Exception as e:  # noqa: BLE001 - no backward: the ops and their gradients stay with PyTorch
            why = f"no backward plan: {e if isinstance(e, UserError) else f'{type(e).__name__}: {e}'}"
    if len(nodes) > 1:
        a, b = split(nodes)
        # said, as the forward-only path says it: a region split for a failed check looked like a planned one
        msg = f"{opts.name}: {len(nodes)} op(s) from {nodes[0].name}: {' '.join(why.split())[:300]}; " \
              f"splitting {len(a)} + {len(b)} op(s)"
        log.info(msg)
        if opts.progress is not None:
            opts.progress("  " + msg)
        return (training_segment(a, meta, opts, report, counter) + training_segment(b, meta, opts, report, counter))
    report.fallback(nodes, why)
    return []


def _training_us(nodes: list[Any], meta: Callable[[Any], Any], opts: Any) -> float:
    """The modelled forward-with-saves plus backward time ``_prepare`` would plan for ``nodes`` (0 where they only
    view their inputs); raises where there is none. Derivations and plans are cached: none is made twice."""
    from pyrunner.frontend.compile import region_dtype
    from pyrunner.frontend.partition import region_of
    from pyrunner.frontend.training import plan_training

    rg = region_of(nodes, meta, "piece", opts.axis_names, views=False)
    if rg is None:
        return 0.0
    wrt = _wrt(rg, opts)
    if wrt is not None and not wrt:
        raise UserError("no input of the piece needs a gradient")  # planned forward-only, not modelled here
    tp = plan_training(rg.graph, region_dtype(rg, meta, opts.dtype), cpu_check=False, device=opts.device, wrt=wrt)
    assert tp.forward is not None and tp.backward is not None
    return tp.forward.cost.total_us + tp.backward.cost.total_us


def _wrt(rg: RegionGraph | None, opts: Any) -> frozenset[str] | None:
    """The region's inputs whose gradients are needed (``Options.needs_grad``); None: all of them."""
    if rg is None or opts.needs_grad is None:
        return None
    return frozenset(name for name, src, _ in rg.inputs if src in opts.needs_grad)


def held_value(gm: Any, node: Any) -> Any:
    """The value a ``get_attr`` node reads from ``gm`` (its target may be a dotted path, ``layer.weight``), or
    None where there is none."""
    value = gm
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value


def grad_nodes(gm: Any, example_inputs: list) -> frozenset[Any]:
    """The nodes of ``gm`` whose values need gradients: the placeholders whose example input requires one, the
    parameters it holds that do, and every node computed from one of those. An over-approximation (no op is
    taken to cut the gradient): a region asked for a gradient nobody reads computes it for nothing, a region
    that left one out would give a wrong one."""
    import torch

    inputs = iter(example_inputs)
    out: set[Any] = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            x = next(inputs, None)
            if isinstance(x, torch.Tensor) and x.requires_grad:
                out.add(n)
        elif n.op == "get_attr":
            x = held_value(gm, n)
            if isinstance(x, torch.Tensor) and x.requires_grad:
                out.add(n)
        elif any(a in out for a in n.all_input_nodes):
            out.add(n)
    return frozenset(out)


def _prepare(rg: RegionGraph, meta: Callable[[Any], Any], opts: Any, flops: int,
             wrt: frozenset[str] | None = None) -> tuple[Any, Any]:
    """The region's ``TrainingImpl`` (None where PyTorch runs it) and its report row, by executor."""
    from pyrunner.frontend.compile import region_dtype
    from pyrunner.frontend.report import RegionChoice
    from pyrunner.frontend.training import derivation, gpu_check_backward, plan_training

    n = len(rg.graph.outputs)
    if opts.executor == "reference":
        bwd = derivation(rg.graph, None, wrt=wrt)
        impl = TrainingImpl(bwd, reference_run(bwd.forward), reference_run(bwd.graph), n)
        return impl, RegionChoice(rg, None, decision="reference", flops=flops,
                                  reason=f"float64 interpreter, forward and derived backward (saves {_saves(bwd)})")
    dtype = region_dtype(rg, meta, opts.dtype)
    tp = plan_training(rg.graph, dtype, cpu_check=opts.executor == "plan" and opts.verify, device=opts.device,
                       wrt=wrt)
    assert tp.forward is not None and tp.backward is not None
    kernels = f"backward {len(tp.backward.kernels)} kernel(s), saves {_saves(tp.bwd)}"
    if opts.executor == "plan":
        return None, RegionChoice(rg, tp.forward, None, tp.check, decision="planned", flops=flops, backward=tp.backward,
                                  reason=f"planned with its backward ({kernels}), not measured (no GPU): PyTorch "
                                         f"runs these ops and their gradients" + (f"; {tp.check}" if tp.check else ""))
    from pyrunner.frontend.load import LoadedPlan

    fwd, back = LoadedPlan(tp.forward, backend=opts.device), LoadedPlan(tp.backward, backend=opts.device)
    check = ""
    fwd.compile("cuda")
    back.compile("cuda")
    if opts.verify:
        f, b = fwd.check("cuda"), gpu_check_backward(back, tp.bwd)
        check = f"forward verified ({f.message}); backward {'not ' * b.uncheckable}verified ({b.message})"
    import torch

    written = {t.name: getattr(torch, t.dtype) for t in tp.forward.tensors if t.name in tp.bwd.saved}
    impl = TrainingImpl(tp.bwd, plan_run(fwd), plan_run(back), n, written)
    return impl, RegionChoice(rg, tp.forward, None, check, flops=flops, backward=tp.backward,
                              reason=f"{check or 'kernels compiled'}; {kernels}")


def _saves(bwd: Backward) -> str:
    return ", ".join(bwd.saved) or "nothing"
