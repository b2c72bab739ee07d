"""Stage 3, search: derivations, kernel partitions, loop structure, tiles, ranked by cost (the Lean planner's twin)."""

from pyrunner.planner.explain import explain
from pyrunner.planner.search import search

__all__ = ["explain", "search"]
