"""Programmatic dependent launch (PDL): how far a kernel may run before the kernels ahead of it finish.

A plan's kernels run in order on one stream. Launched with PDL, kernel k is scheduled as soon as
kernel k-1 has triggered (it does so first thing), so its launch latency, barrier set-up, TMA
descriptor prefetch and loads of the plan's inputs overlap the tail of kernel k-1. It must wait
(``griddepcontrol.wait``: every earlier grid finished, its writes visible) before it touches a
tensor an earlier kernel writes, and before it writes global memory at all.

Why the wait covers every earlier kernel, not only k-1: kernel k-1 finishes only after its own
wait returned, so kernel k-2 had finished by then, and so on down to kernel 0, which is launched
normally (after everything the stream ran before the plan). Graph inputs are written by no kernel
of the plan, so reading them early is safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyrunner.plan.schema import Kernel, Load, Op, Plan, Store


@dataclass(frozen=True)
class DependentLaunch:
    """One kernel's part in the plan's launch chain."""

    trigger: bool
    """A later kernel waits for this one: it lets that kernel be scheduled from its first instruction."""
    waits: bool
    """Launched dependently (every kernel but the first): it waits before touching ``earlier``."""
    earlier: frozenset[str]
    """Global tensors written by the kernels ahead of it."""

    def first_wait(self, ops: Sequence[Op]) -> int | None:
        """Index of the first op of ``ops`` that must come after the wait: a load of a tensor an
        earlier kernel writes, or any store to global memory; None if no op must."""
        if not self.waits:
            return None
        for i, op in enumerate(ops):
            if (isinstance(op, Load) and op.src in self.earlier) or isinstance(op, Store):
                return i
        return None


def dependent_launches(plan: Plan) -> dict[str, DependentLaunch]:
    """Kernel name -> its part in the launch chain of ``plan`` (kernels in launch order)."""
    out: dict[str, DependentLaunch] = {}
    written: set[str] = set()
    kernels: list[Kernel] = plan.kernels
    for i, k in enumerate(kernels):
        out[k.name] = DependentLaunch(trigger=i + 1 < len(kernels), waits=i > 0, earlier=frozenset(written))
        written |= set(k.writes)
    return out
