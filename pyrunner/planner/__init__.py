"""The Python planner (the executable twin of the Lean one)."""

from pyrunner.planner.explain import explain
from pyrunner.planner.search import search

__all__ = ["explain", "search"]
