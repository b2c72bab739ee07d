"""User-facing errors: each becomes one clear message and exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (graph, plan, flags); never a bug of ours."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        # one line, whatever names a user's file smuggles in
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


class GraphError(UserError):
    """A graph that does not type-check (unknown op or axis, shape mismatch)."""


class PlanError(UserError):
    """A plan that does not validate against the schema or is inconsistent."""


class DeviceFitError(UserError):
    """A plan whose kernels do not fit the target device's limits."""
