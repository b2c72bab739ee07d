"""Use Superopt's kernels from PyTorch: ``load`` a plan, ``optimize`` a function, ``torch.compile`` backend.

Importing this package registers the ``torch.compile(..., backend="superopt")`` backend.
"""

from pyrunner.frontend.export import export_source
from pyrunner.frontend.load import LoadedPlan, load

__all__ = ["LoadedPlan", "export_source", "load"]
