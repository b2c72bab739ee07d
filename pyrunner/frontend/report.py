"""What happened to a captured graph: the regions and their decisions, what stayed with PyTorch and why.

Kept apart from the compiler so the report (a plain table, Markdown, a ``rich``
table) can be read, printed and tested without the planner.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pyrunner.frontend.region import RegionGraph
from pyrunner.frontend.trace import op_name, where
from pyrunner.plan.schema import Plan

log = logging.getLogger("pyrunner.frontend")


@dataclass
class RegionChoice:
    """A region and what became of it: Superopt kernels, or planned but left to PyTorch, and why."""

    region: RegionGraph
    plan: Plan | None
    naive_us: float | None = None
    check: str = ""
    decision: str = "superopt"
    """``superopt`` (its kernels run), ``reference`` (the float64 interpreter runs it) or ``planned`` (a plan
    exists and passed its CPU check, but no GPU is here: PyTorch runs the ops)."""
    reason: str = ""
    flops: int = 0
    planned: Any = None
    """The graph the plan was made for (the region's at its shape bucket), when it differs from the region's."""
    backward: Plan | None = None
    """A training region's derived backward plan: a step spends both halves, so the table shows both."""

    def kernels(self) -> str:
        """Kernel count, ``forward + backward`` for a training region ('-' without a plan)."""
        if self.plan is None:
            return "-"
        n = str(len(self.plan.kernels))
        return f"{n} + {len(self.backward.kernels)}" if self.backward else n

    def model_us(self) -> str:
        """Modelled µs, ``forward + backward`` for a training region ('-' without a plan)."""
        if self.plan is None:
            return "-"
        fwd = f"{self.plan.cost.total_us:.2f}"
        return f"{fwd} + {self.backward.cost.total_us:.2f}" if self.backward else fwd


@dataclass
class Report:
    """What happened to a graph: the regions replaced by kernels and what stayed with PyTorch, with why.

    ``str(report)`` is a table of the regions (ops, kernels, modelled us, decision, reason) and the
    fallbacks; ``flop_share`` is the part of the graph's operations inside planned regions."""

    regions: list[RegionChoice] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    flops_total: int = 0
    notes: list[str] = field(default_factory=list)

    def chose(self, choice: RegionChoice) -> None:
        """Record a region and say in one log line what was chosen for it and why."""
        self.regions.append(choice)
        what = f"{choice.kernels()} kernel(s), {choice.model_us()} us modelled" if choice.plan else "no plan"
        log.info("superopt: %s: %d op(s) -> %s: %s (%s)", choice.region.label, len(choice.region.nodes), what,
                 choice.decision, choice.reason or choice.check or "-")

    def fallback(self, nodes: list[Any], why: str) -> None:
        why = " ".join(str(why).split())
        what = ", ".join(f"{op_name(n)} ({where(n)})" for n in nodes[:3]) + (" ..." if len(nodes) > 3 else "")
        self.fallbacks.append((what, why))
        log.warning("superopt: left to PyTorch: %s", why if why.startswith("cannot map") else f"{what}: {why}")

    def merge(self, other: Report) -> None:
        self.regions += other.regions
        self.fallbacks += other.fallbacks
        self.flops_total += other.flops_total
        self.notes += other.notes

    @property
    def flops_in_regions(self) -> int:
        return sum(c.flops for c in self.regions)

    @property
    def flop_share(self) -> float:
        """Operations inside regions that have a plan, over all the graph's operations (0 if none)."""
        return self.flops_in_regions / self.flops_total if self.flops_total else 0.0

    def summary(self) -> str:
        lines = [f"{len(self.regions)} region(s) as Superopt kernels, {len(self.fallbacks)} fallback(s), "
                 f"{100 * self.flop_share:.1f}% of FLOPs in regions"]
        for c in self.regions:
            label = c.region.label
            est = f"{c.plan.cost.total_us:g} us est. (unfused {c.naive_us:g} us)" if c.plan and c.naive_us else ""
            k = f"{c.kernels()} kernel(s) plan {c.plan.provenance.plan_hash}" if c.plan else "reference"
            lines.append(f"  {label}: {len(c.region.nodes)} op(s) -> {k} {est} {c.check}".rstrip())
        lines += [f"  fallback: {why if why.startswith('cannot map') else f'{what}: {why}'}"
                  for what, why in self.fallbacks]
        return "\n".join(lines)

    HEADER = ("region", "ops", "kernels", "model us", "decision", "reason")

    def rows(self) -> list[tuple[str, ...]]:
        """One row per region: label, ops, kernels, modelled us (each ``forward + backward`` for a training
        region), decision, reason (``HEADER``)."""
        return [(c.region.label, str(len(c.region.nodes)), c.kernels(), c.model_us(), c.decision,
                 c.reason or c.check or "-") for c in self.regions]

    def footer(self) -> list[str]:
        """The totals line, then one line per fallback and per note."""
        lines = [f"{len(self.regions)} region(s), {len(self.fallbacks)} op(s) left to PyTorch; "
                 f"{100 * self.flop_share:.1f}% of {self.flops_total:,} FLOPs inside Superopt regions"]
        lines += [f"left to PyTorch: {why if why.startswith('cannot map') else f'{what}: {why}'}"
                  for what, why in self.fallbacks]
        return lines + [f"note: {n}" for n in self.notes]

    def table(self) -> str:
        """One row per region (ops, kernels, modelled us, decision, reason), then the fallbacks."""
        rows = [self.HEADER, *self.rows()]
        width = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = ["  ".join(x.ljust(w) for x, w in zip(r[:5], width, strict=True)) + "  " + r[5] for r in rows]
        foot = self.footer()
        return "\n".join(lines + foot[:1] + [f"  {x}" for x in foot[1:]])

    def markdown(self) -> str:
        """The table as Markdown (pipes in cells escaped), then the footer as a list."""
        def cell(x: str) -> str:
            return x.replace("|", "\\|")

        lines = ["| " + " | ".join(self.HEADER) + " |", "|" + "---|" * len(self.HEADER)]
        lines += ["| " + " | ".join(cell(x) for x in r) + " |" for r in self.rows()]
        return "\n".join(lines + [""] + [f"- {cell(x)}" for x in self.footer()])

    def __rich__(self) -> Any:
        """A ``rich`` table (``rich.print(report)``; ``optimize`` prints it on a terminal)."""
        from rich.table import Table

        t = Table(*self.HEADER, title="Superopt regions", caption="\n".join(self.footer()), caption_justify="left")
        for r in self.rows():
            t.add_row(*r)
        return t

    def __str__(self) -> str:
        return self.table()
