"""Strides: what a region op promises inductor about its outputs' layout, as plain tuple arithmetic.

Why apart from ``runtime``: these say what a layout is (dense, contiguous, the same as another) and
are used by the op builder, the layout check and the timing inputs alike; the op machinery is not.
"""

from __future__ import annotations

from typing import Any


def with_strides(x: Any, stride: tuple[int, ...] | None) -> Any:
    """``x`` laid out with ``stride`` (None: contiguous): itself when it already is (size-one dimensions may have
    any stride), else one copy into a tensor of those strides."""
    import torch

    if stride is None:
        return x.contiguous()
    if same_layout(tuple(x.shape), tuple(x.stride()), tuple(stride)):
        return x
    return torch.empty_strided(tuple(x.shape), stride, dtype=x.dtype, device=x.device).copy_(x)


def same_layout(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Strides ``a`` and ``b`` place every element alike (a size-one dimension's stride is free)."""
    return all(n <= 1 or x == y for n, x, y in zip(shape, a, b, strict=True))


def dense_in_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides that keep the order of ``stride`` (largest outermost; size-one dimensions aside), or
    contiguous ones when two dimensions share a stride or one has none."""
    at = [k for k, n in enumerate(shape) if n > 1]
    if len({stride[k] for k in at}) != len(at) or any(stride[k] == 0 for k in at):
        return contiguous_strides(shape)
    out = list(contiguous_strides(shape))
    n = 1
    for k in sorted(at, key=lambda k: stride[k]):
        out[k] = n
        n *= shape[k]
    return tuple(out)


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
