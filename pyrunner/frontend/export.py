"""``python -m pyrunner export PLAN.json --out kernel.py``: one standalone module per plan.

The module is the renderer's TileLang source (kernels, tuning space, launch)
plus a wrapper ``forward(<inputs>)`` over torch CUDA tensors that checks its
arguments, allocates what the plan writes, and returns the outputs in the
graph's axis order, exactly like ``pyrunner.load``. It imports tilelang and
torch only, never pyrunner; the docstring carries the plan's derivation and
cost so a reader sees where the kernels came from.
"""

from __future__ import annotations

import ast

from pyrunner.backend.tilelang.render import render
from pyrunner.frontend.signature import Signature, signature
from pyrunner.ir.graph import show
from pyrunner.plan.schema import Plan, plan_hash

WRAPPER = "forward"


def _docstring(plan: Plan, sig: Signature, rendered_doc: str) -> list[str]:
    from pyrunner.plan.validate import plan_graph

    graph = plan_graph(plan)
    lines = [f"Superopt kernels for {plan.workload} ({plan.dtype}), plan {plan_hash(plan)}: standalone export.",
             "",
             "Computes (graph over named axes, float32 accumulation):"]
    lines += [f"    {name} = {show(term)}" for name, term in graph.outputs]
    lines += ["", "Usage (torch CUDA tensors, axes in the order shown):",
              f"    {', '.join(sig.output_names)} = {WRAPPER}("
              f"{', '.join(sig.input_names)})"]
    lines += [f"    {s.describe()}" for s in sig.inputs]
    lines += ["  returns " + ", ".join(s.describe() for s in sig.outputs), "", "Derivation (rule @ where; each rule "
              "is a theorem of the Lean package Superopt/):"]
    lines += [f"  {i + 1}. {st.rule} @ {st.at}" + (f" -> {st.result}" if st.result else "")
              for i, st in enumerate(plan.derivation)] or ["  (none: the graph as written)"]
    lines += ["", f"Cost model estimate: {plan.cost.total_us:g} us in {plan.cost.launches} launch(es)."]
    lines += [f"  {k.kernel}: {k.time_us:g} us, {k.bound}-bound" for k in plan.cost.kernels]
    lines += [f"Provenance: {plan.provenance.planner} {plan.provenance.version}, graph {plan.provenance.graph_hash}.",
              ""]
    doc = rendered_doc.strip().splitlines()
    start = next((i for i, ln in enumerate(doc) if ln.startswith("Kernels, in launch order")), len(doc))
    stop = next((i for i in range(start, len(doc)) if not doc[i].strip()), len(doc))
    lines += doc[start:stop]
    lines += ["", "forward() only computes; `pyrunner.load(plan, verify=True)` checks the same kernels against the",
              "graph's float64 reference on fresh random inputs."]
    return [ln.replace("\\", "\\\\").replace('"""', '\\"\\"\\"') for ln in lines]


def _wrapper(sig: Signature) -> list[str]:
    params = ", ".join(sig.input_names)
    specs = {s.name: (s.axes, s.shape, s.dtype, s.flat_axes) for s in sig.inputs}
    outs = {s.name: (s.axes, s.flat_axes, s.flat_shape) for s in sig.outputs}
    return [
        "",
        "",
        "# --- torch wrapper -----------------------------------------------------------------------------",
        "import torch  # noqa: E402",
        "",
        "# graph input -> (graph axes, shape, dtype, axes as the kernels store it)",
        "INPUTS = {", *[f"    {k!r}: {v!r}," for k, v in specs.items()], "}",
        "# graph output -> (graph axes, axes as the kernels store it, its shape in that order)",
        "OUTPUTS = {", *[f"    {k!r}: {v!r}," for k, v in outs.items()], "}",
        "",
        "",
        "def _to(x, have, want):",
        '    """x laid out as axes `have`, permuted to `want`."""',
        "    return x if have == want else x.permute([have.index(a) for a in want])",
        "",
        "",
        "def _run(args, config=None):",
        '    """Check the inputs, allocate every other global tensor, launch, return outputs in graph order."""',
        "    for name, (axes, shape, dtype, _) in INPUTS.items():",
        "        x = args[name]",
        "        if not isinstance(x, torch.Tensor):",
        '            raise TypeError(f"input {name!r} must be a torch.Tensor, got {type(x).__name__}")',
        "        if x.dtype != getattr(torch, dtype) or tuple(x.shape) != shape:",
        '            raise ValueError(f"input {name!r} must be {shape} torch.{dtype} (axes {axes}), "',
        '                             f"got {tuple(x.shape)} {x.dtype}")',
        "    device = next(iter(args.values())).device",
        "    for name, x in args.items():",
        "        if x.device.type != 'cuda' or x.device != device:",
        '            raise ValueError(f"input {name!r} is on {x.device}; all inputs must be on one CUDA device")',
        "    # merged and unit axes (the plan's axis_merges, axis_units) are row-major reshapes: views",
        "    tensors = {name: _to(args[name], axes, plan_axes).reshape(TENSORS[name][0]).contiguous()",
        "               for name, (axes, _, _, plan_axes) in INPUTS.items()}",
        "    for name, (shape, dtype, role) in TENSORS.items():",
        "        if role != 'input':",
        "            tensors[name] = torch.empty(shape, dtype=getattr(torch, dtype), device=device)",
        "    with torch.cuda.device(device):",
        "        launch(tensors, config)",
        "    outs = tuple(_to(tensors[n].reshape(flat), plan_axes, axes).contiguous()",
        "                 for n, (axes, plan_axes, flat) in OUTPUTS.items())",
        "    return outs[0] if len(outs) == 1 else outs",
        "",
        "",
        f"def {WRAPPER}({params}, *, config=None):",
        f'    """{", ".join(sig.output_names)} from {params} (see the module docstring); config overrides tiles."""',
        f"    return _run({{{', '.join(f'{n!r}: {n}' for n in sig.input_names)}}}, config)",
    ]


def export_source(plan: Plan, device: str | None = None) -> str:
    """Source of the standalone module for ``plan`` (validated first), rendered for the backend of ``device``
    (``h200``, ``a100``; None: the GPU found at run time, h200 without one), as ``superopt --device``."""
    from pyrunner.backend.tilelang.backend import resolve_backend
    from pyrunner.frontend.load import read_plan
    from pyrunner.plan.validate import plan_graph

    target = resolve_backend(device).target
    plan = read_plan(plan)
    sig = signature(plan, plan_graph(plan))
    rendered = render(plan, target)
    tree = ast.parse(rendered)
    first = tree.body[0]
    doc = ast.get_docstring(tree) or ""
    rest = rendered.splitlines()[first.end_lineno:] if doc else rendered.splitlines()
    out = ['"""' + _docstring(plan, sig, doc)[0], *_docstring(plan, sig, doc)[1:], '"""', *rest, *_wrapper(sig)]
    text = "\n".join(out).rstrip("\n") + "\n"
    ast.parse(text)  # a bug here must never write a broken file
    return text
