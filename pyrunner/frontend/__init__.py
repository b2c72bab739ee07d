"""Use Superopt's kernels from PyTorch: ``load`` a plan, ``optimize`` a function, ``torch.compile`` backend.

Importing this package registers the ``torch.compile(..., backend="superopt")`` backend.
"""

from pyrunner.frontend.export import export_source
from pyrunner.frontend.load import LoadedPlan
from pyrunner.frontend.optimize import Optimized, optimize
from pyrunner.frontend.trainable import Trainable, load

__all__ = ["LoadedPlan", "Optimized", "Trainable", "export_source", "load", "optimize"]

from pyrunner.frontend.backend import register as _register  # noqa: E402

_register()
