"""Cut an FX graph into regions the graph IR can express.

Regions are runs of the graph's topological order, grown greedily node by node;
tuple-valued nodes and chunk views are skipped, so a region is checked convex
(``reentry``: no path leaves it and comes back) and the graph is put back in
order after the regions are spliced in (``restore_order``).
A region ends where the next node cannot be mapped (it stays with PyTorch, and
the reason is kept) or would make a value hold one axis twice (the next region
then sees its operands as fresh inputs). Nodes computing Python values from
shapes are folded to constants (shapes are static). A region that the planner
cannot plan is split in two at the contraction nearest its middle, and so on.
A region whose contractions are followed by a tail of other ops is also cut
there when the cost model says the two pieces are cheaper (``cheaper_cut``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyrunner.frontend.region import RegionGraph, finish
from pyrunner.frontend.torchops import new_trace
from pyrunner.frontend.trace import AxisConflict, Unmappable, unmappable

ANCHORS = {"matmul": 1, "mm": 1, "bmm": 1, "addmm": 1, "baddbmm": 1, "linear": 1, "einsum": 1,
           "scaled_dot_product_attention": 2}
"""Contractions per op: the planner's search grows fast with them."""
MAX_CONTRACTIONS = 4
"""A segment with more contractions is cut before it is planned."""
MAX_CHAIN = 2
"""Nor may a chain of dependent contractions in one segment be longer (attention's QK^T then PV is 2)."""
TAIL_CUTS = True
"""Whether ``cheaper_cut`` may cut a segment after its contractions (a switch: ``pyrunner.switches``)."""


@dataclass
class Partition:
    """Segments of tensor nodes, each a candidate region, and the nodes left to PyTorch with why."""

    segments: list[list[Any]] = field(default_factory=list)
    fallbacks: list[tuple[Any, str]] = field(default_factory=list)


def example_values(gm: Any, inputs: tuple) -> dict[Any, Any]:
    """Node -> example value (tensors as meta-device stand-ins with the value's shape, dtype and strides: a view
    in the model stays one, which the region ops lay their outputs out as; Python values as they are)."""
    import torch
    import torch.fx

    out: dict[Any, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):  # type: ignore[override]
            r = super().run_node(n)
            out[n] = (torch.empty_strided(r.shape, r.stride(), dtype=r.dtype, device="meta")
                      if isinstance(r, torch.Tensor) else r)
            return r

    with torch.no_grad():
        Recorder(gm).run(*inputs)
    return out


def is_tensor_node(node: Any, meta: Callable[[Any], Any]) -> bool:
    import torch

    return node.op in ("call_function", "call_method", "call_module") and isinstance(meta(node), torch.Tensor)


def partition(gm: Any, meta: Callable[[Any], Any], strict: bool = False) -> Partition:
    """Greedy regions; with ``strict`` the first unmappable node raises instead of falling back."""
    part = Partition()
    cur = new_trace(meta)

    def close() -> None:
        nonlocal cur
        if cur.nodes:
            part.segments.append(list(cur.nodes))
        cur = new_trace(meta)

    for node in gm.graph.nodes:
        if not is_tensor_node(node, meta):
            continue
        trial = cur.snapshot()
        try:
            trial.add(node)
            cur = trial
            continue
        except Unmappable as e:
            if strict:
                raise
            close()
            part.fallbacks.append((node, str(e)))
            continue
        except AxisConflict:
            close()
        fresh = new_trace(meta)
        try:
            fresh.add(node)
            cur = fresh
        except AxisConflict as e:
            err = unmappable(node, f"its result would hold one axis twice ({e}); the graph IR names every axis")
            if strict:
                raise err from None
            part.fallbacks.append((node, str(err)))
        except Unmappable as e:
            if strict:
                raise
            part.fallbacks.append((node, str(e)))
    close()
    return part


def segment_outputs(nodes: list[Any], meta: Callable[[Any], Any]) -> list[Any]:
    """Nodes of a segment whose tensors are needed outside it (by a later node or the graph's output; through a
    ``split`` too, when a part of it is read outside)."""
    inside = set(nodes)
    outs = []
    for n in nodes:
        if any(u not in inside and (u.op == "output" or is_tensor_node(u, meta)
                                    or (_tuple_node(u, meta) and any(p not in inside for p in u.users)))
               for u in n.users):
            outs.append(n)
    return outs


def _tuple_node(node: Any, meta: Callable[[Any], Any]) -> bool:
    """A call giving a tuple of tensors (``split``, ``chunk``), which its users index."""
    import torch

    v = meta(node) if node.op in ("call_function", "call_method") else None
    return isinstance(v, (tuple, list)) and any(isinstance(x, torch.Tensor) for x in v)


def chunk_views(rt: Any, nodes: list[Any]) -> set[Any]:
    """Nodes that are only views of chunks of one computed value, read only outside the segment, and that
    together cover every chunk (GPT-2's Q, K and V: ``split`` parts of ``c_attn(x)``, heads split by views).
    Left out of the region, the value itself is its output, written once by the kernel that computes it, and
    the parts stay views in the model's code: no kernel copies them out, and the next region (or inductor)
    reads them as the model does."""
    from pyrunner.frontend.region import chunk_of

    inside = set(nodes)
    found = {}
    for n in nodes:
        got = chunk_of(rt.values[n].term)
        if got is not None and got[0].op != "input":
            found[n] = (got[0], rt.axes.find(got[1]), got[2])  # each part split the axis afresh: its class
    drop = set(found)
    while True:
        changed = True
        while changed:  # a part some kept node reads is computed in the region after all
            changed = False
            for n in list(drop):
                if any(u in inside and u not in drop for u in n.users):
                    drop.discard(n)
                    changed = True
        covered: dict[tuple[Any, str], set[int]] = {}
        for n in drop:
            x, a, c = found[n]
            covered.setdefault((x, a), set()).add(c)
        whole = {k for k, cs in covered.items() if cs == set(range(rt.extent(k[1])))}
        kept = {n for n in drop if found[n][:2] in whole}
        if kept == drop:  # a part kept because its chunks are not all dropped may be read by another part
            return drop  # (GPT-NeoX: Q, K, V chunks of qkv, and Q's rotary slice, a chunk of Q, kept): again
        drop = kept


def region_of(nodes: list[Any], meta: Callable[[Any], Any], name: str,
              axis_names: dict[str, tuple[str, ...]] | None = None, views: bool = True) -> RegionGraph | None:
    """Translate a segment from scratch; None when it computes nothing (only views of its inputs). ``views``:
    split parts leaving the region are views of one output, inputs are read in their stored order
    (``region.finish``)."""
    rt = new_trace(meta)
    for n in nodes:
        rt.add(n)
    drop = chunk_views(rt, nodes) if views else set()
    if drop:
        return region_of([n for n in nodes if n not in drop], meta, name, axis_names, views)
    outs = [n for n in segment_outputs(nodes, meta) if rt.values[n].term.op != "input"]
    if not outs:
        return None
    rg = finish(rt, outs, name, axis_names, views)
    back = reentry(rg)
    if back is not None:
        raise unmappable(back, "the region would read it after computing what it reads (a path leaves the "
                               "region and comes back); the region is cut")
    return rg


def reentry(rg: RegionGraph) -> Any | None:
    """An input of ``rg`` computed from one of its own nodes, if any: such a region is not one call (its op
    would run before the input exists). Segments skip tuple-valued nodes and chunk views (``chunk_views``),
    so a segment's nodes need not be contiguous; this is what keeps a region convex all the same."""
    inside = set(rg.nodes)
    if not inside:
        return None
    order = {n: i for i, n in enumerate(rg.nodes[0].graph.nodes)}
    start = min(order[n] for n in inside)
    seen: set[Any] = set()
    for _, src, _ in rg.inputs:
        stack = [src]
        while stack:
            n = stack.pop()
            if n in seen or order[n] < start:
                continue
            seen.add(n)
            if n in inside:
                return src
            stack.extend(n.all_input_nodes)
    return None


def restore_order(graph: Any) -> None:
    """Move each node after what it reads, keeping the graph's order otherwise. A region's op is placed after its
    last node, and a segment skips tuple-valued nodes (``chunk``, ``split``), so a node outside the region
    placed among its nodes may read one of its outputs (GPT-NeoX's and CodeGen's fused QKV): such a node now
    comes after the op. ``reentry`` keeps regions convex, so an order always exists. In place, and nothing is
    done to a graph already in order: torch's ``stable_topological_sort`` copies every node into a new graph."""
    import heapq

    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    waiting = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [index[n] for n in nodes if not waiting[n]]
    heapq.heapify(ready)
    order = []
    while ready:
        n = nodes[heapq.heappop(ready)]
        order.append(n)
        for u in n.users:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, index[u])
    if order == nodes:
        return
    if len(order) != len(nodes):
        raise AssertionError("superopt: the graph has a cycle after its regions were spliced in")
    prev = order[0]
    for n in order[1:]:
        prev.append(n)
        prev = n


def contractions(nodes: list[Any]) -> int:
    from pyrunner.frontend.torchops import target_name

    return sum(ANCHORS.get(target_name(n), 0) for n in nodes)


def stages(nodes: list[Any]) -> list[list[Any]]:
    """Cut a segment (first fit, in order) so each piece stays within MAX_CONTRACTIONS and MAX_CHAIN.

    The planner's search grows quickly with contractions; pieces it still cannot plan are
    split further by ``split``.
    """
    from pyrunner.frontend.torchops import target_name

    pieces: list[list[Any]] = [[]]
    depth: dict[Any, int] = {}
    total = 0
    for n in nodes:
        w = ANCHORS.get(target_name(n), 0)
        d = w + max((depth[a] for a in n.all_input_nodes if a in depth), default=0)
        if pieces[-1] and (d > MAX_CHAIN or total + w > MAX_CONTRACTIONS):
            pieces.append([])
            depth, total = {}, 0
            d = w
        pieces[-1].append(n)
        depth[n] = d
        total += w
    return pieces


def tail_cut(nodes: list[Any]) -> int | None:
    """Where a segment's contractions end: after its last contraction and the views of that result that follow
    it; None when no computing op follows (or there is no contraction).

    A tail that re-indexes the contractions' result can cost them their tiles: rotary embeddings split each
    head's features into halves that an index predicate swaps, so in one region the projection's output is
    four axes (row, head, half, feature) that the planner may not merge, and its GEMM gets 64-wide tiles
    and a backward that writes one partial product per half and head. Cut there, the projection is one GEMM
    over the merged heads and the tail an elementwise region."""
    from pyrunner.frontend.flops import FREE
    from pyrunner.frontend.torchops import target_name

    last = max((i for i, n in enumerate(nodes) if ANCHORS.get(target_name(n))), default=None)
    if last is None:
        return None
    cut = last + 1
    while cut < len(nodes) and target_name(nodes[cut]) in FREE:
        cut += 1
    return cut if any(target_name(n) not in FREE for n in nodes[cut:]) else None


@dataclass(frozen=True)
class Cut:
    """A segment cut in two by ``cheaper_cut``, with the modelled times that decided it."""

    head: list[Any]
    tail: list[Any]
    pieces_us: tuple[float, float]
    whole_us: float

    def describe(self) -> str:
        whole = "no plan" if math.isinf(self.whole_us) else f"{self.whole_us:.1f} us"
        return (f"cut after its contractions ({len(self.head)} + {len(self.tail)} op(s)): modelled "
                f"{self.pieces_us[0]:.1f} + {self.pieces_us[1]:.1f} us against {whole} whole")


def cheaper_cut(nodes: list[Any], modelled_us: Callable[[list[Any]], float]) -> Cut | None:
    """The segment cut at ``tail_cut`` when its two pieces' modelled time (``modelled_us``, which raises where a
    piece has no plan) is below the whole segment's, or the whole has no plan; else None.

    Deterministic, and decided by the same model that chooses every plan: the regions the GPU then measures
    against the fallback compiler are the pieces."""
    cut = tail_cut(nodes) if TAIL_CUTS else None
    if cut is None:
        return None
    try:
        pieces = (modelled_us(nodes[:cut]), modelled_us(nodes[cut:]))
    except Exception:  # noqa: BLE001 - a piece without a plan: the segment stays whole
        return None
    try:
        whole = modelled_us(nodes)
    except Exception:  # noqa: BLE001 - no plan for the whole, one for each piece
        whole = math.inf
    return Cut(nodes[:cut], nodes[cut:], pieces, whole) if sum(pieces) < whole else None


def split(nodes: list[Any]) -> tuple[list[Any], list[Any]]:
    """Two contiguous halves, cut before the contraction nearest the middle (or at the middle)."""
    from pyrunner.frontend.torchops import target_name

    mid = len(nodes) / 2
    anchors = [i for i, n in enumerate(nodes) if i > 0 and ANCHORS.get(target_name(n))]
    cut = min(anchors, key=lambda i: abs(i - mid)) if anchors else max(1, len(nodes) // 2)
    return nodes[:cut], nodes[cut:]
