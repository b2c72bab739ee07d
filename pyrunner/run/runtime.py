"""The runner's one seam to a GPU: what a run asks of the device, as a protocol.

Why: the runner's GPU path (compile fallbacks, verification before timing, autotuning within a deadline,
side-by-side timing, checkpoints, tuning records) is orchestration that is worth testing without a GPU.
Everything in it that needs TileLang or CUDA goes through a ``GpuRuntime``; ``TileLangRuntime`` is the
real one (a thin wrapper of ``backend.tilelang.compile``, ``run.timing`` and ``run.baselines``, moved here
unchanged from the runner), and tests pass a fake that computes on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from pyrunner.ir.graph import Graph
    from pyrunner.plan.schema import Plan

Launch = Callable[[dict], object]
"""A compiled plan: called with the plan's global tensors (``GpuVerifier.tensors()``), writes its outputs."""
COMPILE_MODES = {"torch_compile": None, "max_autotune": "max-autotune-no-cudagraphs"}
"""torch.compile modes of the compiled baselines."""


class GpuRuntime(Protocol):
    """What the runner's GPU path needs from a device."""

    def available(self) -> bool:
        """Whether this runtime can run plans (a GPU is there)."""
        ...

    def name(self) -> str:
        """The device results are attributed to."""
        ...

    def compile(self, plan: Plan, config: dict[str, dict[str, int]], target: object) -> Launch:
        """The plan compiled at ``config`` for ``target`` (a ``backend.tilelang.backend`` target)."""
        ...

    def time_us(self, fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
        """One autotuning measurement of ``fn`` in microseconds."""
        ...

    def side_by_side_us(self, fns: dict[str, Callable[[], object]], rounds: int, warmup_ms: float,
                        rep_ms: float) -> tuple[dict[str, float], dict[str, str], dict[str, list[float]]]:
        """The final timing of the plan and its baselines, interleaved: (times, method, per-round times)."""
        ...

    def kernel_times_us(self, fn: Callable[[], object], names: list[str]) -> dict[str, float]:
        """Per-kernel times of one call of ``fn`` (kernel names of the plan)."""
        ...

    def baseline(self, graph: Graph, name: str) -> tuple[str, Callable[[], Callable]] | None:
        """Baseline ``name`` of ``runner.BASELINES`` for ``graph``: the key it is logged under and a builder of
        its function (called once, where its failure is recorded), or None where the graph admits none."""
        ...

    def warm(self, graph: Graph, dtype: str, names: tuple[str, ...]) -> None:
        """Compile the named baselines once so the timed run finds their caches hot."""
        ...

    def release(self) -> None:
        """Give cached device memory back at the end of a run."""
        ...


class TileLangRuntime:
    """The real runtime: TileLang compiles, CUDA-event and CUDA-graph timing, torch baselines."""

    def available(self) -> bool:
        from pyrunner.run.timing import gpu_available

        return gpu_available()

    def name(self) -> str:
        from pyrunner.run.timing import device_name

        return device_name()

    def compile(self, plan: Plan, config: dict[str, dict[str, int]], target: object) -> Launch:
        from pyrunner.backend.tilelang.compile import compile_for_gpu

        return compile_for_gpu(plan, config, target=target)

    def time_us(self, fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
        """CUDA-graph replay (as the final timing), else do_bench."""
        from pyrunner.run.timing import graph_bench_ms, median_us

        try:
            return graph_bench_ms(fn, rep_ms=rep_ms / 2) * 1e3
        except Exception:  # noqa: BLE001 - not capturable
            return median_us(fn, warmup_ms, rep_ms)

    def side_by_side_us(self, fns: dict[str, Callable[[], object]], rounds: int, warmup_ms: float,
                        rep_ms: float) -> tuple[dict[str, float], dict[str, str], dict[str, list[float]]]:
        from pyrunner.run.timing import side_by_side_us

        return side_by_side_us(fns, rounds, warmup_ms, rep_ms)

    def kernel_times_us(self, fn: Callable[[], object], names: list[str]) -> dict[str, float]:
        from pyrunner.run.timing import kernel_times_us

        return kernel_times_us(fn, names)

    def baseline(self, graph: Graph, name: str) -> tuple[str, Callable[[], Callable]] | None:
        from pyrunner.run.baselines import torch_fn, vendor_fn
        from pyrunner.run.flex import flex_fn

        if name == "vendor":
            v = vendor_fn(graph)
            return None if v is None else (v[0], lambda: v[1])
        if name == "flex":
            f = flex_fn(graph)
            return None if f is None else ("flex_attention", lambda: f)
        if name in COMPILE_MODES:
            return name, lambda: compiled(graph, COMPILE_MODES[name])
        fn = torch_fn(graph)
        return name, lambda: fn

    def warm(self, graph: Graph, dtype: str, names: tuple[str, ...]) -> None:
        warm_baselines(graph, dtype, names)

    def release(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def compiled(graph: Graph, mode: str | None) -> Callable:
    """``graph``'s torch function under torch.compile in ``mode`` (dynamo reset first)."""
    import torch

    from pyrunner.run.baselines import torch_fn

    torch._dynamo.reset()
    return torch.compile(torch_fn(graph), mode=mode)


def warm_baselines(graph: Graph, dtype: str, names: tuple[str, ...] = ("torch_compile", "max_autotune"),
                   seed: int = 0) -> None:
    """Compile the torch.compile baselines once so their on-disk caches are hot (gpu_run's warm phase)."""
    import torch

    from pyrunner.ir.reference import random_inputs
    from pyrunner.run.flex import flex_fn

    dt = getattr(torch, dtype)
    inputs = {k: torch.from_numpy(v).to("cuda", dt) for k, v in random_inputs(graph, seed).items()}
    with torch.no_grad():
        for name in names:
            try:
                if name in COMPILE_MODES:
                    compiled(graph, COMPILE_MODES[name])(**inputs)
                elif name == "flex" and (fn := flex_fn(graph)) is not None:
                    fn(**inputs)
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001, S112 - the timed run records the failure; warm the others
                continue
