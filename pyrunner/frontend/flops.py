"""Floating-point operations of an FX node, to say how much of a model runs inside Superopt regions.

Contractions count two operations per multiply-add (``2 * outputs * contracted``); attention counts
its two products (a causal mask does not halve them here: the share is of the work as written);
everything else counts one operation per output element. Views, copies (cat too) and shape arithmetic count 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

FREE = {"view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze", "expand", "expand_as",
        "flatten", "unflatten", "getitem", "split", "chunk", "t", "to", "type_as", "float", "half", "bfloat16",
        "clone", "detach", "identity", "dropout", "view_as", "reshape_as", "getattr", "size", "narrow", "cat",
        "concat", "stack"}


def node_flops(node: Any, meta: Callable[[Any], Any]) -> int:
    """Operations of one node (0 for a non-tensor node or a view)."""
    import torch

    from pyrunner.frontend.torchops import target_name

    out = meta(node)
    if not isinstance(out, torch.Tensor) or node.op not in ("call_function", "call_method"):
        return 0
    name = target_name(node)
    if name in FREE:
        return 0
    n = out.numel()

    def arg(i: int, key: str) -> Any:
        a = node.args[i] if i < len(node.args) else node.kwargs.get(key)
        v = meta(a) if hasattr(a, "op") else a
        return v if isinstance(v, torch.Tensor) else None

    if name == "linear":
        w = arg(1, "weight")
        return 2 * n * (w.shape[-1] if w is not None else 1)
    if name in ("matmul", "mm", "bmm", "addmm", "baddbmm"):
        a = arg(1 if name in ("addmm", "baddbmm") else 0, "mat1" if name == "addmm" else "input")
        return 2 * n * (a.shape[-1] if a is not None and a.dim() else 1)
    if name == "scaled_dot_product_attention":
        q, k = arg(0, "query"), arg(1, "key")
        if q is None or k is None:
            return n
        scores = math.prod(q.shape[:-1]) * k.shape[-2]
        return 2 * scores * q.shape[-1] + 2 * scores * out.shape[-1] + 4 * scores
    if name == "einsum":
        ins = [meta(a) for a in node.args[1:] if hasattr(a, "op")]
        sizes = {}
        eq = node.args[0] if isinstance(node.args[0], str) else ""
        for spec, t in zip(eq.split("->")[0].split(","), ins, strict=False):
            if isinstance(t, torch.Tensor) and len(spec) == t.dim():
                sizes.update(zip(spec, t.shape, strict=True))
        return 2 * math.prod(sizes.values()) if len(ins) == 2 and sizes else n
    if name in ("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm"):
        return 5 * n
    return n
