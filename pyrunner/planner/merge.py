"""Sibling kernels of a partition merged into multi-output kernels.

A partition gives every materialised term its own kernel. Two kernels with the same grid axes
and the same streamed loop axis (or none), neither depending on the other's output (or, in the
search's last pass over its best partitions, one reading the other's directly), can be one kernel:
it lowers the union of their cones (``lower.lower`` with several roots), so a tile both load is
loaded once, a subterm both compute (the scores of an attention and its log-sum-exp, say) is
computed once, and there is one launch instead of two.
Each global tensor still has one writer (one store in the merged kernel).

Whether a merge pays is the cost model's call: a merge is kept only when the merged kernel's
predicted time is below the two kernels' together (it counts the shared reads and the launch saved,
and also the register pressure that may force smaller tiles). The search offers the merged
partition beside the unmerged one and ranks both.

Why a module: the dependency bookkeeping over kernel groups (reachability, a topological order
after merging) is separate from the search's levels; ``Planner`` supplies the lowering.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

MAX_MERGE_KERNELS = 64
"""Partitions with more kernels than this are not merged (the pairwise search is quadratic; such
partitions are long chains, whose kernels depend on each other anyway)."""

SHARED_INTERMEDIATES = False
"""The dependent pass also pairs a kernel with one that reads an intermediate it writes which a third kernel
reads too: the reader computes the value and stores it for the third. Attention's backward: the D pass
(``rowsum(dO * O)``, read by the dK/dV and dQ kernels) folds into the dQ kernel, which loads dO already
(ScaledAttention's backward 1041.6 -> 1028.5 us modelled on the H100, CausalAttention's 990.3 -> 978.3). A
switch (``benchmarks/switches.py``), off until a GPU sweep of the plans it changes and a timing decide it."""

MAX_MERGE_TRIES = 4
"""Merges tried per kernel of a partition (each is a lowering and a tile search), so a partition of
many compatible siblings costs linear, not cubic, work."""

C = TypeVar("C")


@dataclass
class Group(Generic[C]):
    """Kernels of a partition computed by one kernel: their indices, and the chosen lowering."""

    members: tuple[int, ...]
    reads: frozenset[str]
    writes: frozenset[str]
    key: tuple
    choice: C
    time_us: float


def _reach(groups: list[Group]) -> list[set[int]]:
    """For each group, the groups it depends on, directly or through others (the group graph is a
    DAG: merging two groups with no path between them never closes a cycle)."""
    writer = {name: gi for gi, g in enumerate(groups) for name in g.writes}
    direct = [{writer[n] for n in g.reads if n in writer and writer[n] != gi} for gi, g in enumerate(groups)]
    memo: dict[int, set[int]] = {}
    for start in range(len(groups)):
        stack = [(start, False)]
        while stack:
            gi, done = stack.pop()
            if gi in memo:
                continue
            if done:
                memo[gi] = set(direct[gi]).union(*(memo[h] for h in direct[gi]))
                continue
            stack.append((gi, True))
            stack.extend((h, False) for h in direct[gi] if h not in memo)
    return [memo[gi] for gi in range(len(groups))]


def topological(groups: list[Group]) -> list[Group]:
    """Groups in an order where every kernel runs after the kernels whose outputs it reads; among
    ready groups, the one holding the earliest original kernel first (the unmerged order)."""
    reach = _reach(groups)
    left = sorted(range(len(groups)), key=lambda gi: min(groups[gi].members))
    done: set[int] = set()
    out: list[Group] = []
    while left:
        gi = next(g for g in left if reach[g] <= done)
        left.remove(gi)
        done.add(gi)
        out.append(groups[gi])
    return out


def merge_siblings(groups: list[Group[C]],
                   try_merge: Callable[[Group[C], Group[C]], Group[C] | None],
                   dependent: bool = False, outputs: frozenset[str] = frozenset()) -> list[Group[C]]:
    """Greedily merge compatible pairs while the merged kernel is predicted faster.

    ``try_merge(a, b)`` lowers the union (None when it is infeasible or does not fit). With
    ``dependent``, a kernel may also merge with one it reads directly (``_mergeable``; ``outputs``:
    the graph's output tensors, whose cuts no partition can leave out). Returns the groups in a valid
    execution order; the input when nothing merged.
    """
    if len(groups) < 2 or len(groups) > MAX_MERGE_KERNELS:
        return groups
    groups = list(groups)
    tries = MAX_MERGE_TRIES * len(groups)
    tried: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    merged = True
    while merged:
        merged = False
        reach = _reach(groups)
        for i, j in _pairs(groups, dependent, outputs):
            pair = (groups[i].members, groups[j].members)
            if pair in tried or not _mergeable(i, j, groups, reach, dependent, outputs):
                continue
            if tries <= 0:
                return topological(groups)
            tries -= 1
            tried.add(pair)
            g = try_merge(groups[i], groups[j])
            if g is None or g.time_us >= groups[i].time_us + groups[j].time_us:
                continue
            groups = [x for k, x in enumerate(groups) if k not in (i, j)] + [g]
            merged = True
            break
    return topological(groups)


def _mergeable(i: int, j: int, groups: list[Group], reach: list[set[int]], dependent: bool,
               outputs: frozenset[str] = frozenset()) -> bool:
    """Whether groups i and j can be one kernel: no path between them runs through a third group (it
    would close a cycle). A direct dependency is fine: the merged kernel computes the value it would have
    read (a root of the same kernel) and still stores it, which pays only where a third kernel reads it
    too (a split reduction's chunk maxima, say) or where it is a graph output (a residual sum returned
    beside its norm): else the partition without that cut is the fused kernel. Every tensor the
    producer writes must be so, or the merged kernel would store one that nothing reads."""
    for a, b in ((i, j), (j, i)):
        if a not in reach[b]:
            continue
        if not dependent or any(a in reach[k] for k in reach[b] if k != a):
            return False
        # every tensor the producer writes must still be needed once the pair is one kernel: a graph
        # output or read by a third kernel (else the merged kernel would store a value nobody reads)
        if not all(w in outputs or any(w in groups[k].reads for k in range(len(groups)) if k not in (a, b))
                   for w in groups[a].writes):
            return False
    return True


def _pairs(groups: list[Group], dependent: bool = False,
           outputs: frozenset[str] = frozenset()) -> list[tuple[int, int]]:
    """Index pairs of groups with the same grid axes and loop axis, earliest kernels first. With
    ``dependent``, also a kernel and one that reads a graph output it writes (``SHARED_INTERMEDIATES``: or
    an intermediate a third kernel reads too), whatever their grids: a row statistic returned beside the
    rows it scales (absmax scaling) is streamed on its own, but merged, the statistic's row is held whole
    and read once, a form no partition reaches (the output's cut is fixed), so ``try_merge`` lowers the
    union afresh (``Planner._merged``)."""
    order = sorted(range(len(groups)), key=lambda gi: min(groups[gi].members))

    def needed(w: str, a: int, b: int) -> bool:
        """``w`` must be stored whoever computes it: a graph output, or (``SHARED_INTERMEDIATES``) read by a
        third kernel."""
        return w in outputs or (SHARED_INTERMEDIATES and any(
            w in groups[k].reads for k in range(len(groups)) if k not in (a, b)))

    def feeds(a: int, b: int) -> bool:
        return any(needed(w, a, b) for w in groups[a].writes & groups[b].reads)

    return [(i, j) for a, i in enumerate(order) for j in order[a + 1:]
            if groups[i].key == groups[j].key or (dependent and (feeds(i, j) or feeds(j, i)))]
