"""Shape buckets: a region's free axes rounded up, so nearby shapes share one plan.

A *free* axis of a region graph is one no term reduces, contracts, indexes
(``iota``) or measures (``axis_size``): every output element at position i
along it reads only position i of the inputs (or inputs broadcast along it).
Padding such an axis with zeros and slicing the outputs back is exact -- what
the padded positions compute (even inf or NaN) never reaches a kept one. Such
axes (the tokens of a prefill's MLP, norms, projections) are rounded up to
``bucket(n)``; the region is planned at the bucket size, once for every shape
in it. An axis a softmax runs over (the KV length of attention) is padded too,
to a power of two below the tile and a multiple of it above (``padmask.bucket``),
when ``padmask`` proves it exact: with a mask input (1 at real keys, 0 at padded
ones) the scores become ``where(mask, s, -inf)``, so padded keys are excluded,
never silently included; a decode loop then plans once per bucket. Other
reduced axes stay exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyrunner.frontend.padmask import MASK_PREFIX, mask_values, masked, softmax_axes
from pyrunner.frontend.padmask import bucket as softmax_bucket
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


def bucketed(graph: Any, rule: Callable[[int], int] = bucket,
             softmax_rule: Callable[[int], int] | None = softmax_bucket) -> tuple[Any, dict[str, int]]:
    """``graph`` with its free axes at their bucket size and its softmax axes at theirs where the mask makes
    that exact (``padmask``; ``softmax_rule=None``: never), and axis -> original size for those padded."""
    pads = {a: n for a, n in graph.sizes.items() if a in free_axes(graph) and rule(n) != n}
    g = graph.with_sizes({a: rule(n) for a, n in pads.items()}) if pads else graph
    for a in sorted(softmax_axes(graph) if softmax_rule else ()):
        n = graph.sizes[a]
        size = softmax_rule(n)  # type: ignore[misc]
        if size != n and (m := masked(g, a, size)) is not None:
            g, pads[a] = m, n
    return g, pads


def padded_impl(impl: Impl, padded: Any, pads: dict[str, int]) -> Impl:
    """``impl`` of the padded graph run on inputs at the original sizes: zero-pad, run, slice the outputs."""
    in_axes = {t.name: t.axes for t in padded.inputs()}
    out_axes = [padded.axes_of(t) for _, t in padded.outputs]
    masks = {k: axes[0] for k, axes in in_axes.items() if k.startswith(MASK_PREFIX)}

    def run(feed: dict[str, Any]) -> tuple:
        like = next((v for v in feed.values() if v.is_floating_point()), next(iter(feed.values())))
        fed = {k: mask_values(pads[a], padded.sizes[a], like) for k, a in masks.items()}
        for k, v in feed.items():
            shape = tuple(padded.sizes[a] if a in pads else n for a, n in zip(in_axes[k], v.shape, strict=True))
            if shape != tuple(v.shape):
                z = v.new_zeros(shape)
                z[tuple(slice(0, n) for n in v.shape)] = v
                v = z
            fed[k] = v
        return cut(impl(fed))

    def cut(outs: tuple) -> tuple:
        return tuple(o[tuple(slice(0, pads[a]) if a in pads else slice(None) for a in axes)]
                     for o, axes in zip(outs, out_axes, strict=True))

    layouts = getattr(impl, "layouts", None)
    if layouts is not None:  # the padded plan's storage, sliced back as a call's outputs are
        run.layouts = lambda: cut(layouts())  # type: ignore[attr-defined]
    return run
