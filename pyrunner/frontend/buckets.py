"""Shape buckets: a region's free axes rounded up, so nearby shapes share one plan.

A *free* axis of a region graph is one no term reduces, contracts, indexes
(``iota``) or measures (``axis_size``): every output element at position i
along it reads only position i of the inputs (or inputs broadcast along it).
Padding such an axis with zeros and slicing the outputs back is exact -- what
the padded positions compute (even inf or NaN) never reaches a kept one. Such
axes (the tokens of a prefill's MLP, norms, projections) are rounded up to
``bucket(n)``; the region is planned at the bucket size, once for every shape
in it. Axes that are reduced over (the KV length of attention) stay exact: a
padded key would change the softmax, and masking it would need a run-time bound
the plans do not take; those regions are planned per shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyrunner.frontend.runtime import Impl

TILE = 64
"""Sizes up to this stay exact (decode's single token is not padded to a tile); larger round up to a multiple."""


def bucket(n: int, tile: int = TILE) -> int:
    """``n`` up to ``tile``; above, the next multiple of ``tile`` (at most ``tile - 1`` padded positions)."""
    return n if n <= tile else -(-n // tile) * tile


def free_axes(graph: Any) -> set[str]:
    """Axes of ``graph`` that no reduce, matmul, iota or axis_size names (padding them is exact)."""
    from pyrunner.ir.graph import subterms

    used = {t.axis for t in subterms(t for _, t in graph.outputs) if t.axis}
    return set(graph.sizes) - used


def bucketed(graph: Any, rule: Callable[[int], int] = bucket) -> tuple[Any, dict[str, int]]:
    """``graph`` with its free axes at their bucket size, and axis -> original size for those padded."""
    pads = {a: n for a, n in graph.sizes.items() if a in free_axes(graph) and rule(n) != n}
    return (graph.with_sizes({a: rule(n) for a, n in pads.items()}) if pads else graph), pads


def padded_impl(impl: Impl, padded: Any, pads: dict[str, int]) -> Impl:
    """``impl`` of the padded graph run on inputs at the original sizes: zero-pad, run, slice the outputs."""
    in_axes = {t.name: t.axes for t in padded.inputs()}
    out_axes = [padded.axes_of(t) for _, t in padded.outputs]

    def run(feed: dict[str, Any]) -> tuple:
        fed = {}
        for k, v in feed.items():
            shape = tuple(padded.sizes[a] if a in pads else n for a, n in zip(in_axes[k], v.shape, strict=True))
            if shape != tuple(v.shape):
                z = v.new_zeros(shape)
                z[tuple(slice(0, n) for n in v.shape)] = v
                v = z
            fed[k] = v
        outs = impl(fed)
        return tuple(o[tuple(slice(0, pads[a]) if a in pads else slice(None) for a in axes)]
                     for o, axes in zip(outs, out_axes, strict=True))

    return run
