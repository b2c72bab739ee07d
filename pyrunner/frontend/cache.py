"""On-disk cache of compiled kernels, keyed by plan hash, tile config, device and TileLang version.

TileLang already stores what it builds (CUDA source, host wrapper, shared
library, parameters) in ``TILELANG_CACHE_DIR`` and finds it again by a hash of
the kernel's TIR. We give every (plan, config, device, TileLang version) its
own such directory, with the rendered module and a small manifest beside it, so
a second process compiles nothing, a device or TileLang upgrade never reuses a
stale binary, and one plan's entry can be inspected or deleted on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pyrunner.plan.schema import Plan, canonical_json, plan_hash

ENV_DIR = "SUPEROPT_CACHE_DIR"
_ENV_LOCK = threading.Lock()


def cache_root() -> Path:
    """``$SUPEROPT_CACHE_DIR`` or ``~/.cache/superopt``."""
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "superopt")


def tilelang_version() -> str:
    try:
        import tilelang
    except ImportError:
        return "none"
    return str(getattr(tilelang, "__version__", "unknown"))


def device_key(device: object = None) -> str:
    """Name and compute capability of a CUDA device, e.g. ``NVIDIA_A100-SXM4-40GB-sm80``."""
    import torch

    idx = torch.device(device if device is not None else "cuda").index
    idx = torch.cuda.current_device() if idx is None else idx
    major, minor = torch.cuda.get_device_capability(idx)
    return _slug(f"{torch.cuda.get_device_name(idx)}-sm{major}{minor}")


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s).strip("_") or "unknown"


def entry_dir(plan: Plan, config: dict, device: str, version: str | None = None) -> Path:
    """Cache directory of one compiled plan (nothing is created)."""
    cfg = hashlib.sha256(canonical_json(config).encode()).hexdigest()[:12]
    return cache_root() / "kernels" / _slug(version or tilelang_version()) / _slug(device) / \
        f"{plan_hash(plan)}-{cfg}"


@contextmanager
def tilelang_cache_dir(path: Path) -> Iterator[None]:
    """Point TileLang's kernel cache at ``path`` for the duration (TileLang reads it at each compile)."""
    with _ENV_LOCK:
        old = os.environ.get("TILELANG_CACHE_DIR")
        os.environ["TILELANG_CACHE_DIR"] = str(path)
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TILELANG_CACHE_DIR", None)
            else:
                os.environ["TILELANG_CACHE_DIR"] = old


def manifest(plan: Plan, config: dict, device: str) -> dict:
    return {"plan_hash": plan_hash(plan), "workload": plan.workload, "dtype": plan.dtype, "config": config,
            "device": device, "tilelang": tilelang_version()}


def compile_cached(plan: Plan, config: dict, device: str,
                   backend: str | None = None) -> tuple[Callable[[dict], None], bool]:
    """``compile_for_gpu`` through the cache, for the backend of the device named ``backend`` (None: the
    local GPU's); returns the launcher and whether the entry existed. A backend other than the GPU's own
    (an sm_80 build on a Hopper GPU) has entries of its own."""
    from pyrunner.backend.tilelang.backend import local_backend_name, resolve_backend
    from pyrunner.backend.tilelang.compile import compile_for_gpu

    target = resolve_backend(backend).target
    if backend is not None and backend.strip().lower() != local_backend_name():
        device = f"{device}-{_slug(target.arch)}"
    d = entry_dir(plan, config, device)
    meta = d / "entry.json"
    hit = meta.is_file()
    with tilelang_cache_dir(d / "tilelang"):
        launch = compile_for_gpu(plan, config, work_dir=d / "src", target=target)
    if not hit:
        meta.write_text(json.dumps(manifest(plan, config, device), indent=2) + "\n")
    return launch, hit
