"""PyTorch interpreter of the graph IR: the eager, torch.compile and vendor baselines.

Any graph gets baselines without hand-written code: ``torch_fn(graph)`` is what a
PyTorch user would write for it (ops in the inputs' dtype, matmuls through
``torch.matmul``, softmax sub-graphs through ``torch.softmax``), and
``vendor_fn(graph)`` swaps in a vendor kernel where the graph's structure admits
one (SDPA for softmax attention, cuBLAS for a lone matmul). Patterns are found
structurally; nothing here knows workload names.
"""

from __future__ import annotations

import hashlib
import linecache
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pyrunner.ir.graph import Graph, Term, result_axes, softmax_source, subterms
from pyrunner.ir.ops import COMPARISONS, ELEMENTWISE, REDUCTIONS
from pyrunner.ir.reference import evaluate_terms
from pyrunner.run.torch_code import Values, lit, magnitude_code, matmul_code, permute, reshape

TorchFn = Callable[..., dict[str, torch.Tensor]]

# --- structural helpers --------------------------------------------------------

def _is_constant(t: Term) -> bool:
    """True when t depends on no input and has no axis (its value is one number)."""
    return all(s.op not in ("input", "iota") for s in subterms([t]))


def _constant_value(t: Term, sizes: Mapping[str, int]) -> float:
    return float(evaluate_terms([t], sizes, {})[t])


@dataclass(frozen=True)
class AttentionMatch:
    """``softmax_kv(mask(scale * (q @_d k))) @_kv v`` found inside a graph (the mask optional)."""

    term: Term
    q: Term
    k: Term
    v: Term
    d: str
    kv: str
    scale: float
    mask: Term | None = None  # the predicate of a where(mask, scores, -inf) before the softmax
    causal: bool = False  # the mask is exactly kv <= q (SDPA's is_causal, top-left aligned)


def _strip_scale(t: Term, sizes: Mapping[str, int]) -> tuple[Term, float]:
    """Peel multiplications/divisions by constant sub-graphs off t."""
    scale = 1.0
    while t.op == "binary" and t.fn in ("mul", "div"):
        a, b = t.args
        if _is_constant(b):
            c = _constant_value(b, sizes)
            scale *= c if t.fn == "mul" else 1.0 / c
            t = a
        elif t.fn == "mul" and _is_constant(a):
            scale *= _constant_value(a, sizes)
            t = b
        else:
            break
    return t, scale


def match_attention(t: Term, sizes: Mapping[str, int]) -> AttentionMatch | None:
    """Structural SDPA detection: matmul -> softmax over the next matmul's contracted axis."""
    if t.op != "matmul":
        return None
    p, v = t.args
    sm = softmax_source(p)
    if sm is None:
        return None
    s, kv = sm
    if kv != t.axis:
        return None
    mask = None
    if s.op == "ternary" and s.fn == "where" and s.args[2].op == "const" and s.args[2].value == -math.inf \
            and _is_index_only(s.args[0]):
        mask, s = s.args[0], s.args[1]
    s, scale = _strip_scale(s, sizes)
    if s.op != "matmul" or not math.isfinite(scale):
        return None
    q, k = s.args
    d = s.axis
    qa, ka, va = result_axes(q), result_axes(k), result_axes(v)
    batch = [x for x in qa if x in ka and x != d]
    if [x for x in ka if x not in batch and x != d] != [kv]:
        return None  # K must carry exactly the softmax axis besides batch and d
    if kv in qa or any(x not in va for x in batch) or kv not in va:
        return None
    v_free = [x for x in va if x not in batch and x != kv]
    q_free = [x for x in qa if x not in batch and x != d]
    if not v_free or any(x in q_free for x in v_free):
        return None  # no query axis (a decode step per batch row) is SDPA with one query row
    causal = False
    if mask is not None:
        if not set(result_axes(mask)) <= set(q_free) | {kv} or len(q_free) != 1:
            return None
        causal = _is_causal(mask, q_free[0], kv, sizes)
    return AttentionMatch(t, q, k, v, d, kv, scale, mask, causal)


def _is_index_only(t: Term) -> bool:
    return all(s.op not in ("input", "reduce", "matmul") for s in subterms([t]))


def _is_causal(mask: Term, q: str, kv: str, sizes: Mapping[str, int]) -> bool:
    """Whether the mask, evaluated, is exactly ``kv <= q`` over (q, kv)."""
    import numpy as np

    val = evaluate_terms([mask], sizes, {})[mask]
    ax = result_axes(mask)
    full = np.broadcast_to(_align_np(val, ax, (q, kv)), (sizes[q], sizes[kv]))
    want = np.arange(sizes[kv])[None, :] <= np.arange(sizes[q])[:, None]
    return bool(np.array_equal(full != 0, want))


def _align_np(x, have: tuple[str, ...], want: tuple[str, ...]):
    from pyrunner.ir.reference import align

    return align(x, have, want)


def _sdpa_code(m: AttentionMatch, q: str, k: str, v: str, out_axes: tuple[str, ...],
               sizes: Mapping[str, int], mask: str | None = None) -> str:
    qa, ka, va = result_axes(m.q), result_axes(m.k), result_axes(m.v)
    batch = tuple(x for x in qa if x in ka and x != m.d)
    q_free = tuple(x for x in qa if x not in batch and x != m.d)
    v_free = tuple(x for x in va if x not in batch and x != m.kv)
    # 4-D (1, batch, seq, dim): SDPA's flash and cuDNN backends only take 4-D inputs
    nb = [1, math.prod(sizes[x] for x in batch)]
    q3 = reshape(permute(q, qa, batch + q_free + (m.d,)), nb + [math.prod(sizes[x] for x in q_free), sizes[m.d]])
    k3 = reshape(permute(k, ka, batch + (m.kv, m.d)), nb + [sizes[m.kv], sizes[m.d]])
    v3 = reshape(permute(v, va, batch + (m.kv,) + v_free), nb + [sizes[m.kv], math.prod(sizes[x] for x in v_free)])
    extra = ""
    if m.causal:
        extra = ", is_causal=True"
    elif m.mask is not None and mask is not None:
        (qf,) = q_free
        extra = f", attn_mask={permute(mask, result_axes(m.mask), (qf, m.kv))} != 0"
    o = f"F.scaled_dot_product_attention({q3}, {k3}, {v3}, scale={m.scale!r}{extra})"
    have = batch + q_free + v_free
    return permute(reshape(o, [sizes[x] for x in have]), have, out_axes)


# --- code generation -------------------------------------------------------------

OPERAND_DTYPES = {"float16": "torch.float16", "bfloat16": "torch.bfloat16", "float32": "torch.float32"}
"""Storage dtypes a reference may round contraction operands to (``torch_fn(..., operand_dtype)``)."""


def _matmul_operand(code: str, t: Term, operand_dtype: str | None, const: bool, has_iota: bool) -> str:
    """A GEMM operand's expression: a computed one rounded as a tensor-core kernel must
    (``operand_dtype``), and with index-built values about (float32: an ALiBi bias promotes the
    scores) taken in the inputs' dtype ``_dt``, as the plan's kernel takes it (torch.matmul refuses
    mixed dtypes)."""
    if operand_dtype is not None and t.op != "input" and not const:
        code = f"{code}.to({OPERAND_DTYPES[operand_dtype]}).to({code}.dtype)"
    return f"{code}.to(_dt)" if has_iota else code


def _binary_code(fn: str, xa: str, a_const: bool, xb: str, b_const: bool) -> str:
    """A binary op's expression (its scalar form where one operand is a Python number); a comparison's
    0/1 mask is taken in the inputs' dtype ``_dt``: a float32 mask times a 0-d float64 tensor stays float32."""
    op = ELEMENTWISE[fn]
    if op.torch_scalar and a_const != b_const:
        code = op.torch_scalar.format(t=xb, c=xa) if a_const else op.torch_scalar.format(t=xa, c=xb)
    else:
        code = op.torch.format(xa, xb)
    return f"({code}).to(_dt)" if fn in COMPARISONS else code


def _source(graph: Graph, use_sdpa: bool, operand_dtype: str | None = None,
            perturbed: Callable[[Term], bool] | None = None,
            decided: Callable[[Term], bool] | None = None) -> tuple[str, list[AttentionMatch]]:
    """Plain PyTorch source computing the graph: one statement per op, static shapes (``perturbed``: each
    computed value it holds true of passed through ``_perturb``, which the caller's namespace supplies;
    ``decided``: each comparison it holds true of passed through ``_decide(mask, a, b, |a|, |b|)`` with its
    operands and their magnitudes, ``torch_code.magnitude_code``, computed beside every value)."""
    roots = [t for _, t in graph.outputs]
    sizes = graph.sizes
    axes: dict[Term, tuple[str, ...]] = {}
    for t in subterms(roots):
        result_axes(t, axes)
    attn: dict[Term, AttentionMatch] = {}
    if use_sdpa:
        for t in subterms(roots):
            m = match_attention(t, sizes)
            if m is not None:
                attn[t] = m
    softmax = {t: sm for t in subterms(roots) if (sm := softmax_source(t)) is not None}
    consts: dict[Term, float] = {}

    def deps(t: Term) -> tuple[Term, ...]:
        if t.op != "input" and _is_constant(t):
            return ()  # folded to a Python number
        if t in attn:
            m = attn[t]
            return (m.q, m.k, m.v) + ((m.mask,) if m.mask is not None and not m.causal else ())
        if t in softmax:
            return (softmax[t][0],)
        return t.args

    # Only the terms the chosen lowering reads are computed (an SDPA hides its scores).
    needed: list[Term] = []
    for t in subterms(roots, deps):
        if t.op != "input" and _is_constant(t):
            consts[t] = _constant_value(t, sizes)
        else:
            needed.append(t)

    name: dict[Term, str] = {}
    lines = ["def baseline(**inputs):",
             f'    """{graph.name} as plain PyTorch (generated by pyrunner.run.baselines)."""']
    has_iota = any(t.op == "iota" for t in needed)
    has_mask = any(t.op == "binary" and t.fn in COMPARISONS for t in needed)
    if has_iota:  # indices are float32 (exact to 2^24); what they reach is float32 too
        lines.append("    _dev = next(iter(inputs.values())).device")
    if has_iota or has_mask:  # the inputs' dtype: GEMM operands and 0/1 masks are taken in it
        lines.append("    _dt = next(iter(inputs.values())).dtype")

    def ref(t: Term) -> str:
        return lit(consts[t]) if t in consts else name[t]

    vals = Values(name, consts, axes, sizes)

    for t in needed:
        v = name[t] = f"v{len(name)}"
        if t.op == "input":
            code = f"inputs[{t.name!r}]"
        elif t in attn:
            m = attn[t]
            mask = ref(m.mask) if m.mask is not None and not m.causal else None
            code = _sdpa_code(m, ref(m.q), ref(m.k), ref(m.v), axes[t], sizes, mask)
        elif t.op == "iota":
            code = f"torch.arange({sizes[t.axis]}, device=_dev, dtype=torch.float32)"
        elif t.op == "ternary":
            args = [vals.value(a, axes[t]) for a in t.args]
            code = ELEMENTWISE[t.fn].torch.format(*args)
        elif t in softmax:
            x, a = softmax[t]
            code = f"torch.softmax({ref(x)}, dim={axes[x].index(a)})"
        elif t.op == "unary":
            code = ELEMENTWISE[t.fn].torch.format(ref(t.args[0]))
        elif t.op == "binary":
            a, b = t.args
            code = _binary_code(t.fn, vals.value(a, axes[t]), a in consts, vals.value(b, axes[t]), b in consts)
        elif t.op == "reduce":
            code = REDUCTIONS[t.fn].torch.format(ref(t.args[0]), axes[t.args[0]].index(t.axis))
        elif t.op == "matmul":
            a, b = t.args
            xa, xb = (_matmul_operand(ref(x), x, operand_dtype, x in consts, has_iota) for x in (a, b))
            code = matmul_code(xa, axes[a], xb, axes[b], t.axis, axes[t], sizes)
        else:  # pragma: no cover - check() rejects unknown ops
            raise ValueError(t.op)
        lines += _statements(t, v, code, perturbed, decided, vals)
    outs = ", ".join(f"{n!r}: {ref(t)}" for n, t in graph.outputs)
    lines.append(f"    return {{{outs}}}")
    return "\n".join(lines) + "\n", list(attn.values())


def _statements(t: Term, v: str, code: str, perturbed: Callable[[Term], bool] | None,
                decided: Callable[[Term], bool] | None, vals: Values) -> list[str]:
    """A term's statement (``_source``'s ``perturbed`` and ``decided``), with its magnitude's under ``decided``."""
    if perturbed is not None and t.op not in ("input", "iota") and perturbed(t):
        code = f"_perturb({code})"
    if decided is None:
        return [f"    {v} = {code}"]
    if t.op == "binary" and decided(t):
        a, b = t.args
        ax = vals.axes[t]
        code = f"_decide({code}, {vals.value(a, ax)}, {vals.value(b, ax)}, {vals.mag(a, ax)}, {vals.mag(b, ax)})"
    return [f"    {v} = {code}", f"    m{v} = {magnitude_code(t, v, vals)}"]


def _load(src: str, extra: Mapping[str, object] | None = None) -> TorchFn:
    """Compile generated source into a function; its text is registered so tracebacks show it."""
    # named by content, so another process generates the same name (inductor's caches stay valid)
    filename = f"<pyrunner.run.baselines baseline {hashlib.sha256(src.encode()).hexdigest()[:16]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(keepends=True), filename)
    namespace: dict = {"torch": torch, "F": F, **(extra or {})}
    exec(compile(src, filename, "exec"), namespace)  # noqa: S102 - our own generated code
    fn = namespace["baseline"]
    fn.source = src
    return fn


def _build(graph: Graph, use_sdpa: bool, operand_dtype: str | None = None) -> tuple[TorchFn, list[AttentionMatch]]:
    src, matches = _source(graph, use_sdpa, operand_dtype)
    return _load(src), matches


def torch_source(graph: Graph, vendor: bool = False) -> str:
    """The generated PyTorch source of a graph's baseline (``vendor``: with SDPA where it applies)."""
    return _source(graph, vendor)[0]


def torch_fn(graph: Graph, operand_dtype: str | None = None) -> TorchFn:
    """Eager PyTorch for any graph: ``torch_fn(g)(**tensors) -> {output name: tensor}``.

    Outputs have the axes ``result_axes`` gives (the reference's order). ``operand_dtype`` (a key of
    ``OPERAND_DTYPES``): every computed contraction operand is rounded to it first, as
    ``reference.evaluate`` does with ``round_operand``.
    """
    return _build(graph, use_sdpa=False, operand_dtype=operand_dtype)[0]


def perturbed_fn(graph: Graph, perturb: Callable[[torch.Tensor], torch.Tensor],
                 rounds: Callable[[Term], bool]) -> TorchFn:
    """``torch_fn(graph)`` with ``perturb`` applied to every value it computes that ``rounds`` holds true of:
    the float64 reference under a kernel's own roundings (``run.conditioning``)."""
    return _load(_source(graph, False, None, perturbed=rounds)[0], {"_perturb": perturb})


def decided_fn(graph: Graph, decide: Callable[..., torch.Tensor], decided: Callable[[Term], bool]) -> TorchFn:
    """``torch_fn(graph)`` with each comparison ``decided`` holds true of passed through
    ``decide(mask, a, b, |a|, |b|)``: the float64 reference with decisions a kernel's rounding can turn
    taken another way (``run.conditioning.decision_tolerance``)."""
    return _load(_source(graph, False, None, decided=decided)[0], {"_decide": decide})


def attention_matches(graph: Graph) -> list[AttentionMatch]:
    return _build(graph, use_sdpa=True)[1]


def _single_matmul(graph: Graph) -> bool:
    if len(graph.outputs) != 1:
        return False
    t = graph.outputs[0][1]
    return t.op == "matmul" and all(a.op == "input" for a in t.args)


def vendor_fn(graph: Graph) -> tuple[str, TorchFn] | None:
    """The vendor-library baseline the graph's structure admits, as (name, fn), or None.

    ``sdpa``: every softmax-attention sub-graph runs as
    ``F.scaled_dot_product_attention`` (scale = the detected constant, 1.0 if none).
    ``cublas``: a graph that is one matmul of inputs runs as one ``torch.matmul``.
    """
    fn, matches = _build(graph, use_sdpa=True)
    if matches:
        return "sdpa", fn
    if _single_matmul(graph):
        return "cublas", fn
    return None
