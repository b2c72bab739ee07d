"""``pyrunner.load``: a kernel plan as a function of torch CUDA tensors.

The function takes the graph's inputs (positionally in graph order, or by
name), checks their dtypes, shapes and devices, allocates every tensor the
plan writes, launches the compiled kernels and returns the graph's outputs (a
tensor, or a tuple in graph order when there are several) in the graph's axis
order. Compilation happens on the first call, through the on-disk cache
(``frontend.cache``). Without a GPU the call says so in one line.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyrunner.frontend.errors import FrontendError
from pyrunner.frontend.signature import Signature, bind, check_tensor, signature
from pyrunner.ir.graph import Graph
from pyrunner.plan.schema import Plan, plan_hash

NO_GPU = ("no CUDA GPU is available (torch.cuda.is_available() is False): the plan's TileLang kernels run on "
          "an NVIDIA GPU; on this machine `python -m pyrunner run PLAN.json --small` checks the plan on the CPU")


def read_plan(plan: Plan | dict | str | os.PathLike) -> Plan:
    """A plan object, its JSON document, or a path -> a fully validated Plan."""
    from pyrunner.plan.validate import load_plan, validate_plan

    if isinstance(plan, (str, os.PathLike)):
        return load_plan(Path(plan))
    return validate_plan(plan)


class LoadedPlan:
    """Callable form of one plan; see the module docstring."""

    def __init__(self, plan: Plan, *, verify: bool = False, config: dict | None = None,
                 backend: str | None = None, views: bool = False) -> None:
        from pyrunner.plan.validate import plan_graph

        self.plan = plan
        self.backend = backend
        """The device name of the backend the kernels are rendered and built for (None: the local GPU's)."""
        self.views = views
        """Outputs as views of the plan's storage in the graph's axis order, where the layouts allow (the backend's
        region ops, which lay them out as the model's own tensors); False: contiguous tensors."""
        self.graph: Graph = plan_graph(plan)
        self.sig: Signature = signature(plan, self.graph)
        self.config = config
        self.hash = plan_hash(plan)
        self.verify = verify
        self.verified: Any = None
        self.cache_hit: bool | None = None
        self._launch: Callable[[dict], None] | None = None
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self.sig.input_names])
        self.__name__ = plan.workload

    def __repr__(self) -> str:
        ins = ", ".join(s.describe() for s in self.sig.inputs)
        outs = ", ".join(s.describe() for s in self.sig.outputs)
        return f"<superopt plan {self.hash} {self.plan.workload}({ins}) -> {outs}>"

    # --- compile -----------------------------------------------------------------
    def compile(self, device: Any = None) -> Callable[[dict], None]:
        """Compile (or fetch from the disk cache) every kernel; done by the first call otherwise."""
        if self._launch is not None:
            return self._launch
        require_gpu()
        from pyrunner.frontend.cache import compile_cached, device_key
        from pyrunner.plan.analysis import resolve_config

        cfg = resolve_config(self.plan, self.config)
        self._launch, self.cache_hit = compile_cached(self.plan, cfg, device_key(device), self.backend)
        return self._launch

    def check(self, device: Any = None):
        """The float64 check on fresh random inputs (``verify.GpuVerifier``); raises if it fails."""
        from pyrunner.run.verify import GpuVerifier

        launch = self.compile(device)
        result = GpuVerifier(self.plan, self.graph, device=str(device or "cuda")).check(launch)
        self.verified = result
        if not result.ok:
            raise FrontendError(f"plan {self.hash} ({self.plan.workload}) failed the float64 check: {result.message}")
        return result

    # --- call ---------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any):
        import torch

        bound = bind(self.sig, args, kwargs)
        for spec in self.sig.inputs:
            check_tensor(spec, bound[spec.name])
        if self._launch is None:
            require_gpu()
        device = _common_device(bound)
        launch = self.compile(device)
        if self.verify and self.verified is None:
            self.check(device)
        tensors: dict[str, torch.Tensor] = {}
        for spec in self.sig.inputs:
            tensors[spec.name] = spec.to_plan(bound[spec.name])
        for gt in self.plan.tensors:
            if gt.role != "input":
                tensors[gt.name] = torch.empty(gt.shape, dtype=getattr(torch, gt.dtype), device=device)
        with torch.cuda.device(device):
            launch(tensors)
        outs = tuple(s.from_plan(tensors[s.name], contiguous=not self.views) for s in self.sig.outputs)
        return outs[0] if len(outs) == 1 else outs


def require_gpu() -> None:
    """FrontendError (one line) unless torch sees a CUDA GPU and TileLang imports."""
    from pyrunner.run.timing import gpu_available

    if not gpu_available():
        raise FrontendError(NO_GPU)
    try:
        import tilelang  # noqa: F401
    except ImportError as e:
        raise FrontendError(f"TileLang is not importable ({e}); install it to compile plans") from None


def _common_device(bound: dict[str, Any]):
    devices = {name: t.device for name, t in bound.items()}
    for name, d in devices.items():
        if d.type != "cuda":
            raise FrontendError(f"input {name!r} is on {d}; the plan's kernels need CUDA tensors (.cuda())")
    if len(set(devices.values())) > 1:
        raise FrontendError("inputs are on different devices: "
                            + ", ".join(f"{n} on {d}" for n, d in devices.items()))
    return next(iter(devices.values()))


def load(plan: Plan | dict | str | os.PathLike, *, verify: bool = False, config: dict | None = None) -> LoadedPlan:
    """``pyrunner.load("plan.json")``: the plan as a function of torch CUDA tensors (see the module docstring).

    ``verify=True`` runs the float64 check (fresh random inputs, poisoned outputs) on the first call;
    ``config`` overrides tuning parameters (``{kernel: {param: value}}`` or ``{param: value}``).
    """
    p = read_plan(plan)
    if config:
        from pyrunner.run.runner import resolve

        config = resolve(p, config)
    return LoadedPlan(p, verify=verify, config=config)
