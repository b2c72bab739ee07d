"""The frontend's one error type: a user mistake reported in one line."""

from __future__ import annotations

from pyrunner.errors import UserError


class FrontendError(UserError):
    """Bad call, untraceable function or missing GPU: one line, never a traceback."""
