"""Load rendered TileLang modules, lower them to CUDA, build cubins, fit-check configs.

Everything here except ``compile_for_gpu`` works on a machine without a GPU:
TileLang lowers to CUDA C++ for ``sm_90a`` under a ``tvm.target.Target``
context, and the local nvcc turns that source into a cubin.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
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

from pyrunner.backend.tilelang.render import (
    MAX_GRID_YZ,
    TARGET,
    expr_refs,
    kernel_axes,
    launch_axes,
    layout_bridges,
    layout_groups,
    render,
    resolve_config,
    resolve_kernel,
)
from pyrunner.errors import DeviceFitError, PlanError
from pyrunner.plan.schema import Fill, Gemm, Kernel, Load, Map, Plan, Reduce, Store

NVCC_FLAGS = ("-std=c++20", "-w", "-Xcudafe", "--diag_suppress=177", "-lineinfo")
"""The flags TileLang itself passes to nvcc for CUDA kernels (its templates need C++20)."""

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


# --- loading generated source -------------------------------------------------

def load_module(source: str, path: Path) -> ModuleType:
    """Write ``source`` to ``path`` and import it; ``@T.prim_func`` reads its source back via inspect."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != source:
        path.write_text(source)
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


def _scratch_dir() -> Path:
    return Path(tempfile.gettempdir()) / "superopt-render"


def rendered_module(plan: Plan, work_dir: Path | None = None) -> ModuleType:
    """Render ``plan`` and import the result from ``work_dir`` (default: a scratch dir outside the repo)."""
    source = render(plan)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return load_module(source, Path(work_dir or _scratch_dir()) / f"plan_{digest}.py")


def build_prim_funcs(plan: Plan, config: dict | None = None, work_dir: Path | None = None) -> dict:
    """Kernel name -> TileLang ``PrimFunc`` under ``config`` (validated against the plan's tuning space)."""
    cfg = resolve_config(plan, config)
    return rendered_module(plan, work_dir).build_kernels(cfg)


# --- lowering and cubins ------------------------------------------------------

def render_kernel_func(plan: Plan, kernel: str, config: dict | None = None, work_dir: Path | None = None):
    """The TileLang ``PrimFunc`` of one kernel of ``plan`` under ``config``."""
    funcs = build_prim_funcs(plan, config, work_dir)
    if kernel not in funcs:
        raise PlanError(f"plan has no kernel {kernel!r}; kernels are {list(funcs)}")
    return funcs[kernel]


def lower_to_cuda(plan: Plan, config: dict | None = None, work_dir: Path | None = None) -> dict[str, str]:
    """Kernel name -> CUDA C++ source for sm_90a; needs no GPU."""
    import tilelang
    from tvm.target import Target

    funcs = build_prim_funcs(plan, config, work_dir)
    target = Target(TARGET)
    out: dict[str, str] = {}
    with target:
        for name, func in funcs.items():
            out[name] = tilelang.lower(func, target=target).kernel_source
    return out


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


def compile_cubin(cuda_sources: dict[str, str], out_dir: Path, arch: str = "sm_90a") -> CubinResult:
    """Compile each kernel's CUDA source to ``out_dir/<kernel>.cubin`` with the local nvcc.

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
    number = arch.removeprefix("sm_")

    def one(name: str) -> Path:
        stem = "".join(c if c.isalnum() or c in "_-" else "_" for c in name)
        src, cubin = out_dir / f"{stem}.cu", out_dir / f"{stem}.cubin"
        src.write_text(cuda_sources[name])
        cmd = [nvcc, *NVCC_FLAGS, "-cubin", "-gencode", f"arch=compute_{number},code={arch}", *includes,
               "-o", str(cubin), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise NvccError(f"nvcc failed on kernel {name!r} ({src}):\n{(proc.stderr or proc.stdout)[-4000:]}")
        return cubin

    workers = max(1, min(len(cuda_sources), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        paths = list(pool.map(one, sorted(cuda_sources)))
    return CubinResult(paths, False, f"compiled {len(paths)} cubin(s) for {arch} with {nvcc}")


# --- the GPU path ---------------------------------------------------------------

def compile_for_gpu(plan: Plan, config: dict | None = None,
                    work_dir: Path | None = None) -> Callable[[dict], None]:
    """JIT-compile every kernel for the local GPU; returns ``launch(tensors)`` bound to them."""
    cfg = resolve_config(plan, config)
    check_fits(plan, cfg)
    module = rendered_module(plan, work_dir)
    kernels = module.compile_kernels(cfg, target=TARGET)

    def launch(tensors: dict) -> None:
        module.launch(tensors, cfg, kernels=kernels)

    launch.module = module  # type: ignore[attr-defined]
    launch.kernels = kernels  # type: ignore[attr-defined]
    return launch


# --- device fit -------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceLimits:
    name: str
    smem_per_block: int
    smem_per_sm: int
    regs_per_sm: int
    regs_per_thread: int
    max_threads: int = 1024


H200 = DeviceLimits("H200", smem_per_block=227 * 1024, smem_per_sm=228 * 1024, regs_per_sm=64 * 1024,
                    regs_per_thread=255)

REG_OVERHEAD = 32
"""Registers per thread assumed for addresses, loop counters and temporaries on top of the fragments."""


@dataclass(frozen=True)
class KernelFit:
    kernel: str
    smem_bytes: int
    regs_per_thread: int
    threads: int


def _reads_writes(op) -> tuple[set[str], set[str]]:
    if isinstance(op, Load):
        return set(), {op.dst}
    if isinstance(op, Store):
        return {op.src}, set()
    if isinstance(op, Fill):
        return set(), {op.dst}
    if isinstance(op, Gemm):
        return {op.a, op.b} | (set() if op.clear else {op.c}), {op.c}
    if isinstance(op, Reduce):
        return {op.src} | ({op.dst} if op.accumulate else set()), {op.dst}
    if isinstance(op, Map):
        return set(expr_refs(op.expr)), {op.dst}
    return set(), set()  # pragma: no cover - the schema has no other ops


def _peak_fragment_bytes(kernel: Kernel, sizes: dict[str, int]) -> int:
    """Largest total size of fragments live at once, by a linear liveness scan of the ops.

    A fragment lives from its first to its last mention; state buffers span the whole loop body.
    At a Map the operands read for the last time do not count (elementwise: the result can reuse
    their registers); at a Gemm or Reduce they do.
    """
    ops = kernel.prologue + kernel.body + kernel.epilogue
    body = range(len(kernel.prologue), len(kernel.prologue) + len(kernel.body))
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, op in enumerate(ops):
        r, w = _reads_writes(op)
        for b in r | w:
            first.setdefault(b, i)
            last[b] = i
    for b in kernel.buffers:
        if b.state and b.name in first and kernel.loop is not None and len(body):
            first[b.name] = min(first[b.name], body.start)
            last[b.name] = max(last[b.name], body.stop - 1)
    peak = 0
    for i, op in enumerate(ops):
        r, w = _reads_writes(op)
        live = {b for b in sizes if first.get(b, -1) <= i < last.get(b, -1)} | (w & set(sizes))
        if not isinstance(op, Map):
            live |= r & set(sizes)
        peak = max(peak, sum(sizes[b] for b in live))
    return peak


def estimate_kernel(plan: Plan, kernel_name: str, cfg: dict[str, int]) -> KernelFit:
    """Shared bytes per block (buffers loaded in the loop body count once per stage) and registers per thread."""
    kernel = next(k for k in plan.kernels if k.name == kernel_name)
    shape = resolve_kernel(plan, kernel, cfg)
    staged = {op.dst for op in kernel.body if isinstance(op, Load)} if kernel.loop else set()
    smem = 0
    frag_bytes: dict[str, int] = {}
    for b in kernel.buffers:
        nbytes = math.prod(shape.blocks[a] for a in b.axes) * _DTYPE_BYTES[b.dtype]
        if b.scope == "shared":
            smem += nbytes * (max(1, shape.stages) if b.name in staged else 1)
        else:
            # spread over the block's threads; small (replicated) fragments still take a register each
            frag_bytes[b.name] = max(4, -(-nbytes // shape.threads))
    for b in {b for bs in layout_bridges(kernel).values() for b in bs}:  # shared copies the renderer adds
        buf = next(x for x in kernel.buffers if x.name == b)
        smem += math.prod(shape.blocks[a] for a in buf.axes) * _DTYPE_BYTES[buf.dtype]
    regs = REG_OVERHEAD + -(-_peak_fragment_bytes(kernel, frag_bytes) // 4)
    return KernelFit(kernel.name, smem, regs, shape.threads)


def _check_gemm_warps(kernel: Kernel, shape, where: str) -> None:
    """Each tile GEMM must split among the block's warps: m_w * n_w = warps, 16 rows x 8 columns per warp.

    (384 threads cannot split a 128-wide tile, say.) A GEMM whose A operand is a fragment laid
    out like another GEMM's accumulator (P = softmax(S) feeding P @ V) needs every warp on its own
    rows, else TileLang cannot reconcile the two layouts: rows must be a multiple of 16 x warps.
    """
    warps = shape.threads // 32
    bufs = {b.name: b for b in kernel.buffers}
    gemms = [op for op in kernel.prologue + kernel.body + kernel.epilogue if isinstance(op, Gemm)]
    group = layout_groups(kernel)
    acc_groups = {group[op.c] for op in gemms if op.c in group}
    for op in gemms:
        if op.c not in bufs or len(bufs[op.c].axes) != 2:
            continue
        rows, cols = (shape.blocks[a] for a in bufs[op.c].axes)
        if op.a in group and group[op.a] in acc_groups and rows % (16 * warps):
            raise DeviceFitError(f"{where}: the tile GEMM into {op.c!r} reads its A operand {op.a!r} from "
                                 f"registers, so each of the {warps} warps ({shape.threads} threads) needs 16 "
                                 f"whole rows of it, but the tile has {rows} rows")
        if not any(warps % mw == 0 and rows % (16 * mw) == 0 and cols % (8 * (warps // mw)) == 0
                   for mw in range(1, warps + 1)):
            raise DeviceFitError(f"{where}: the {rows}x{cols} tile GEMM into {op.c!r} cannot be split among "
                                 f"{warps} warps ({shape.threads} threads): each warp needs a 16x8 multiple")


def check_fits(plan: Plan, config: dict | None = None, device_limits: DeviceLimits = H200) -> list[KernelFit]:
    """Estimate every kernel's footprint under ``config``; raise DeviceFitError naming the first that does not fit."""
    cfg = resolve_config(plan, config)
    lim = device_limits
    fits = []
    for k in plan.kernels:
        fit = estimate_kernel(plan, k.name, cfg[k.name])
        where = f"kernel {k.name!r} with {cfg[k.name]}"
        if fit.threads > lim.max_threads or fit.threads % 32:
            raise DeviceFitError(f"{where}: {fit.threads} threads per block; {lim.name} needs a multiple of 32 "
                                 f"up to {lim.max_threads}")
        if fit.smem_bytes > lim.smem_per_block:
            raise DeviceFitError(f"{where}: needs about {fit.smem_bytes / 1024:.1f} KiB of shared memory per block, "
                                 f"{lim.name} allows {lim.smem_per_block / 1024:.0f} KiB")
        if fit.regs_per_thread > lim.regs_per_thread:
            raise DeviceFitError(f"{where}: needs about {fit.regs_per_thread} registers per thread for its "
                                 f"fragments, {lim.name} allows {lim.regs_per_thread}")
        if fit.regs_per_thread * fit.threads > lim.regs_per_sm:
            raise DeviceFitError(f"{where}: needs about {fit.regs_per_thread * fit.threads} registers per block "
                                 f"({fit.regs_per_thread} x {fit.threads} threads), {lim.name} has "
                                 f"{lim.regs_per_sm} per SM")
        shape = resolve_kernel(plan, k, cfg[k.name])
        _check_gemm_warps(k, shape, where)
        for dim, axes in zip("yz", launch_axes(k, kernel_axes(plan, k))[1:], strict=False):
            count = math.prod(shape.tiles[a] for a in axes)
            if count > MAX_GRID_YZ:
                raise DeviceFitError(f"{where}: grid axes {axes} launch {count} blocks along gridDim.{dim}; "
                                     f"CUDA allows {MAX_GRID_YZ}")
        fits.append(fit)
    return fits
