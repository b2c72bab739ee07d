"""One partition per graph structure and shape bucket: a decode loop cuts its graph once, not every step.

Dynamo's symbolic graph is compiled once per concrete shape (``specialize``), so in a KV-cache decode loop
every step is a new graph of the same ops at a new KV length, and ``partition`` (a trial translation of
every node, with a copy of the trace at each) ran again at every step. Where a graph cuts depends on its
ops, how they are wired and which dimensions are 1, not on the exact lengths, so the cut is kept under a
key of exactly those, with every size (a tensor's dimension or an integer argument) at its shape bucket
(``padmask.bucket``: 1 stays 1, the rest round up as a decode loop's KV lengths do).

A cut reused is a proposal, never trusted for values: every segment is translated afresh at its real
shapes (``region_of``), and a piece that does not translate is split or left to PyTorch as any other
(``compile.compile_segment``). The cache is bounded (least recently used out).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from pyrunner.frontend.partition import Partition, partition

MAX_ENTRIES = 256
"""Cuts kept per process (least recently used dropped)."""

_CUTS: OrderedDict[str, tuple[list[list[int]], list[tuple[int, str]]]] = OrderedDict()
STATS = {"hits": 0, "misses": 0}
"""Lookups since the process started (for tests and the curious)."""


def _size(n: int) -> int:
    from pyrunner.frontend.padmask import bucket

    return n if n <= 1 else bucket(n)


def _arg(a: Any, index: dict[Any, int]) -> Any:
    import torch
    import torch.fx

    if isinstance(a, torch.fx.Node):
        return ("node", index[a])
    if isinstance(a, bool) or a is None:
        return a
    if isinstance(a, int):
        return ("int", _size(a) if a >= 0 else a)
    if isinstance(a, (list, tuple)):
        return (type(a).__name__, tuple(_arg(x, index) for x in a))
    if isinstance(a, dict):
        return ("dict", tuple(sorted((str(k), _arg(v, index)) for k, v in a.items())))
    if isinstance(a, slice):
        return ("slice", _arg(a.start, index), _arg(a.stop, index), _arg(a.step, index))
    if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(a)
    if isinstance(a, (float, str)):
        return (type(a).__name__, repr(a))
    return ("other", type(a).__name__)  # an opaque value: the key keeps only its kind


def _value(v: Any) -> Any:
    import torch

    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(_size(int(d)) for d in v.shape), str(v.dtype))
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):  # a size read from a shape: bucketed as the shapes are
        return ("int", _size(v) if v >= 0 else v)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_value(x) for x in v))
    return type(v).__name__


def structure_key(gm: Any, meta: Callable[[Any], Any]) -> str:
    """A digest of the graph's ops, their argument wiring and every value's kind and bucketed shape."""
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    parts = []
    for n in nodes:
        target = n.target if isinstance(n.target, str) else getattr(n.target, "__qualname__", str(n.target))
        mod = getattr(n.target, "__module__", "") if not isinstance(n.target, str) else ""
        try:
            value = _value(meta(n)) if n.op != "output" else None
        except KeyError:  # a node the example run did not reach
            value = None
        parts.append(repr((n.op, mod, target, _arg(n.args, index), _arg(n.kwargs, index), value)))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def cached_partition(gm: Any, meta: Callable[[Any], Any], strict: bool = False) -> tuple[Partition, bool]:
    """``partition(gm, meta, strict)``, reusing the cut of an earlier graph of the same structure and shape
    bucket; and whether it was reused. ``strict`` (the first unmappable node raises) always partitions."""
    if strict:
        return partition(gm, meta, strict=True), False
    key = structure_key(gm, meta)
    nodes = list(gm.graph.nodes)
    hit = _CUTS.get(key)
    if hit is not None:
        _CUTS.move_to_end(key)
        STATS["hits"] += 1
        segs, falls = hit
        return Partition([[nodes[i] for i in seg] for seg in segs], [(nodes[i], why) for i, why in falls]), True
    STATS["misses"] += 1
    part = partition(gm, meta, strict=False)
    index = {n: i for i, n in enumerate(nodes)}
    _CUTS[key] = ([[index[n] for n in seg] for seg in part.segments], [(index[n], why) for n, why in part.fallbacks])
    while len(_CUTS) > MAX_ENTRIES:
        _CUTS.popitem(last=False)
    return part, False
