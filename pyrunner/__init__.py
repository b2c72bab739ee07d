"""Superopt's Python side: graph IR, planner twin, plan runner."""

__version__ = "0.1.0"
