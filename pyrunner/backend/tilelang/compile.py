"""Load rendered TileLang modules, lower them to CUDA, build cubins, fit-check configs.

Everything here except ``compile_for_gpu`` works on a machine without a GPU:
TileLang lowers to CUDA C++ for the compile target's architecture (``sm_90a``,
``sm_80``) under a ``tvm.target.Target`` context, and the local nvcc turns that
source into a cubin. Every function takes the ``CompileTarget`` (default
``targets.default_target()``); none names a GPU. Plans and configs
arrive validated (``pyrunner.plan.validate``); the fit check is
``pyrunner.target.fit``, the device ``pyrunner.target.device``.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from pyrunner.backend.tilelang.compile_target import NVCC_FLAGS, CompileTarget
from pyrunner.backend.tilelang.limits import size_problem
from pyrunner.backend.tilelang.render import PASS_CONFIGS, kernel_pass_configs, render
from pyrunner.backend.tilelang.targets import default_target
from pyrunner.errors import DeviceFitError, PlanError
from pyrunner.files import inside, write_text_atomic
from pyrunner.plan.analysis import resolve_config
from pyrunner.plan.schema import Plan, axis_sizes
from pyrunner.target.device import Device
from pyrunner.target.fit import FitModel, Footprint

# --- loading generated source -------------------------------------------------

def load_module(source: str, path: Path) -> ModuleType:
    """Write ``source`` to ``path`` and import it; ``@T.prim_func`` reads its source back via inspect."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise PlanError(f"refusing to write rendered source to {str(path)!r}: not a regular file")
    if not path.exists() or path.read_text() != source:
        write_text_atomic(path, source, "rendered source")
    name = f"superopt_rendered_{hashlib.sha256((str(path) + source).encode()).hexdigest()[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


_SCRATCH: list[Path] = []


def _scratch_dir() -> Path:
    """This process's private folder for rendered modules: made by ``tempfile.mkdtemp`` (mode 0700,
    unpredictable name), so no other user can plant or swap the file that gets imported; removed at exit."""
    if not _SCRATCH:
        path = Path(tempfile.mkdtemp(prefix="superopt-render-"))
        os.chmod(path, 0o700)
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _SCRATCH.append(path)
    return _SCRATCH[0]


def rendered_module(plan: Plan, work_dir: Path | None = None, target: CompileTarget | None = None) -> ModuleType:
    """Render ``plan`` for ``target`` and import the result from ``work_dir`` (default: a private scratch dir).

    Importing runs the module, so this is only called where TileLang needs the prim_funcs
    (lowering to CUDA, compiling); the source holds no user string that is not a checked name.
    """
    too_big = size_problem(plan)
    if too_big is not None:
        raise PlanError(f"plan {plan.provenance.plan_hash}: {too_big}")
    source = render(plan, target)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return load_module(source, Path(work_dir or _scratch_dir()) / f"plan_{digest}.py")


def build_prim_funcs(plan: Plan, config: dict | None = None, work_dir: Path | None = None,
                     target: CompileTarget | None = None) -> dict:
    """Kernel name -> TileLang ``PrimFunc`` under ``config`` (validated against the plan's tuning space)."""
    cfg = resolve_config(plan, config)
    return rendered_module(plan, work_dir, target).build_kernels(cfg)


# --- lowering and cubins ------------------------------------------------------

def render_kernel_func(plan: Plan, kernel: str, config: dict | None = None, work_dir: Path | None = None,
                       target: CompileTarget | None = None):
    """The TileLang ``PrimFunc`` of one kernel of ``plan`` under ``config``."""
    funcs = build_prim_funcs(plan, config, work_dir, target)
    if kernel not in funcs:
        raise PlanError(f"plan has no kernel {kernel!r}; kernels are {list(funcs)}")
    return funcs[kernel]


def lower_to_cuda(plan: Plan, config: dict | None = None, work_dir: Path | None = None,
                  target: CompileTarget | None = None) -> dict[str, str]:
    """Kernel name -> CUDA C++ source for ``target``'s architecture; needs no GPU."""
    import tilelang
    import tvm
    from tvm.target import Target

    compile_target = target or default_target()
    funcs = build_prim_funcs(plan, config, work_dir, compile_target)
    target = Target(compile_target.target)
    out: dict[str, str] = {}
    passes = pass_configs(plan)
    for name, func in funcs.items():
        with target, tvm.transform.PassContext(config=passes[name]):
            out[name] = tilelang.lower(func, target=target).kernel_source
    return out


def pass_configs(plan: Plan) -> dict[str, dict[str, bool]]:
    """Kernel name -> the TileLang pass configs it is lowered and compiled under (the rendered module's
    ``PASS_CONFIGS`` overlaid by its ``KERNEL_PASS_CONFIGS`` entry)."""
    tensors = {t.name: t for t in plan.tensors}
    return {k.name: {**PASS_CONFIGS, **kernel_pass_configs(k, tensors)} for k in plan.kernels}


@dataclass
class CubinResult:
    """Outcome of ``compile_cubin``: the cubins built, or why nothing was built.

    Iterates over (and has the length of) ``paths``, so it reads like the list of cubins.
    """

    paths: list[Path] = field(default_factory=list)
    skipped: bool = False
    message: str = ""

    def __iter__(self):
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


class NvccError(RuntimeError):
    """nvcc rejected generated CUDA source: a renderer or TileLang bug, never bad user input."""


def tilelang_include_dirs() -> list[str]:
    """TileLang's ``tl_templates`` root and its bundled CUTLASS/cute headers."""
    from tilelang import env

    return [str(Path(env.TILELANG_TEMPLATE_PATH).resolve()), str(Path(env.CUTLASS_INCLUDE_DIR).resolve())]


def compile_cubin(cuda_sources: dict[str, str], out_dir: Path, target: CompileTarget | None = None) -> CubinResult:
    """Compile each kernel's CUDA source to ``out_dir/<kernel>.cubin`` with the local nvcc, for ``target``'s
    architecture (a fat binary, ``.fatbin``, where the target builds for more than one).

    Without nvcc on PATH nothing is built and the result says so (``skipped``).
    Raises NvccError with nvcc's message when compilation fails.
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return CubinResult([], True, f"nvcc not found on PATH: skipped cubin compilation of "
                                     f"{len(cuda_sources)} kernel(s) ({', '.join(cuda_sources)})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{d}" for d in tilelang_include_dirs()]
    target = target or default_target()
    kind = "fatbin" if len(target.code) > 1 else "cubin"
    fast_math = ["--use_fast_math"] if PASS_CONFIGS.get("tl.enable_fast_math") else []

    def one(name: str) -> Path:
        stem = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in name) or "kernel"
        src, cubin = inside(out_dir, f"{stem}.cu"), inside(out_dir, f"{stem}.{kind}")
        write_text_atomic(src, cuda_sources[name], "CUDA source")
        cmd = [nvcc, *NVCC_FLAGS, *fast_math, f"-{kind}", *target.gencode(), *includes, "-o", str(cubin), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise NvccError(f"nvcc failed on kernel {name!r} ({src}):\n{(proc.stderr or proc.stdout)[-4000:]}")
        return cubin

    workers = max(1, min(len(cuda_sources), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        paths = list(pool.map(one, sorted(cuda_sources)))
    code = f" (machine code for {', '.join(target.code)})" if target.code else ""
    return CubinResult(paths, False, f"compiled {len(paths)} {kind}(s) for {target.arch}{code} with {nvcc}")


# --- the GPU path ---------------------------------------------------------------

def local_gpu_arch() -> str:
    """The architecture of the GPU torch sees (``sm_90``, ``sm_80``)."""
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def compile_for_gpu(plan: Plan, config: dict | None = None, work_dir: Path | None = None,
                    target: CompileTarget | None = None) -> Callable[[dict], None]:
    """JIT-compile every kernel of ``plan`` rendered for ``target`` and run it on the local GPU; returns
    ``launch(tensors)`` bound to them. A target older than the GPU is built for the GPU from the
    target's own instruction set (``CompileTarget.running_on``: an sm_80 build on a Hopper GPU)."""
    target = (target or default_target()).running_on(local_gpu_arch())
    cfg = resolve_config(plan, config)
    check_fits(plan, cfg, target.device)
    module = rendered_module(plan, work_dir, target)
    kernels = compile_kernels_in_threads(module.build_kernels(cfg), pass_configs(plan), target.target)

    def launch(tensors: dict) -> None:
        module.launch(tensors, cfg, kernels=kernels)

    launch.module = module  # type: ignore[attr-defined]
    launch.kernels = kernels  # type: ignore[attr-defined]
    return launch


def compile_kernels_in_threads(funcs: dict, passes: dict[str, dict[str, bool]], target: str,
                               workers: int | None = None) -> dict:
    """The rendered module's ``compile_kernels`` of the prim_funcs ``funcs`` (its ``build_kernels``), one
    thread per kernel: nvcc, which takes most of a kernel's compile, runs as a subprocess outside the GIL,
    so a nine-kernel backward plan builds in about the time of its slowest kernel (TileLang's autotuner
    compiles its configs in threads the same way). ``passes``: ``pass_configs`` of the plan. Each thread
    selects the caller's CUDA device, which is per thread, before loading its kernel."""
    import tilelang
    import torch

    device = torch.cuda.current_device()

    def one(name: str):
        torch.cuda.set_device(device)
        return tilelang.compile(funcs[name], target=target, pass_configs=passes[name])

    workers = max(1, min(len(funcs), workers or os.cpu_count() or 1))
    if workers == 1:
        return {name: one(name) for name in funcs}
    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(funcs, pool.map(one, funcs), strict=True))


# --- device fit -------------------------------------------------------------------

def estimate_kernel(plan: Plan, kernel_name: str, values: dict[str, int],
                    device: Device | None = None) -> Footprint:
    """Shared bytes per block and registers per thread of one kernel under parameter ``values`` on ``device``
    (default: the default target's)."""
    kernel = next(k for k in plan.kernels if k.name == kernel_name)
    return FitModel(kernel, axis_sizes(plan), device or default_target().device).footprint(values)


def check_fits(plan: Plan, config: dict | None = None, device: Device | None = None) -> list[Footprint]:
    """Every kernel's footprint under ``config`` on ``device`` (default: the default target's); raise
    DeviceFitError naming the first that does not fit."""
    device = device or default_target().device
    cfg = resolve_config(plan, config)
    sizes = axis_sizes(plan)
    out = []
    for k in plan.kernels:
        model = FitModel(k, sizes, device)
        why = model.why_not(cfg[k.name])
        if why is not None:
            raise DeviceFitError(f"kernel {k.name!r} with {cfg[k.name]}: {why}")
        out.append(model.footprint(cfg[k.name]))
    return out
