"""Superopt's Python side. The subpackages follow the pipeline, each importing only earlier ones:

``ir`` (graph IR, the op table, float64 reference, catalog) -> ``rules`` (proven rewrites) and
``plan`` (plan schema, validation, analysis) -> ``target`` (device model and fit check) ->
``planner`` (search, lowering, cost) and ``backend.tilelang`` (render, compile) -> ``run``
(runner, verification, CPU executor, PyTorch baselines, timing) -> ``frontend`` (use it from
PyTorch: ``load``, ``export``, ``optimize``, the ``torch.compile`` backend) -> ``cli``; ``log``
holds the results log and report. ``tests/test_architecture.py`` checks the layering.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``pyrunner.load`` / ``pyrunner.optimize`` without importing torch at ``import pyrunner``."""
    if name in ("load", "optimize"):
        import pyrunner.frontend as frontend

        return getattr(frontend, name)
    raise AttributeError(f"module 'pyrunner' has no attribute {name!r}")
