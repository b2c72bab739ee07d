"""Co-scheduling: a kernel run on the SMs that the dependently launched kernel after it leaves idle.

A warp-specialised kernel holds one block per SM. If its grid is a single wave with fewer blocks
than the device has SMs, the remaining SMs sit idle. Suppose it also waits for the kernels ahead
of it only after its loop: RMSNorm's GEMM reads the row statistics only to scale its accumulator
(``plan.passes.sink_late_inputs``), and every role of the explicitly warp-specialised form
waits where it first needs them (``backend.tilelang.render_ws``). Then the kernel ahead can run
beside that loop. Launched first on no more blocks than there are idle SMs, it triggers the
dependent launch at once. The GEMM's blocks take the SMs it leaves free, and the GEMM's wait
after its loop finds it finished. The pair then takes about the longer of the two, not their
sum, and the kernel ahead is tiled for its few blocks.

Hopper run 97 (``benchmarks/probes/config_variants.py``, RMSNorm 1024 x 4096 -> 4096; variants
verified and timed side by side):

- With the statistics on 4 blocks of 256 rows, the plan measured 48.9-50.5 us in bf16 and fp16.
  On 64 blocks of 16 rows it measured 50.9-52.6 (49.6-52.3 waiting before the loop).
- The 4-block statistics kernel alone takes about 25 us (71.9-74.6 when the GEMM waits for it
  first).
- On 8 blocks, four GEMM tiles wait for an SM, and the plan measured 67.

No pass changes a plan's numbers here: only its tile config and its predicted time.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from pyrunner.plan.dependent_launch import DependentLaunch
from pyrunner.plan.passes import rendered_kernel
from pyrunner.plan.schedule import async_schedule
from pyrunner.plan.schema import GlobalTensor, Kernel
from pyrunner.planner.cost import DTYPE_BYTES, Estimate, LoweringFacts, Machine, estimate, grid_blocks
from pyrunner.planner.lower import Lowered
from pyrunner.target.fit import FitModel

MIN_GAIN_US = 0.5
"""Co-schedule only where the model predicts at least this much less than running the two in turn."""

MIN_LOOP_US = 10.0
"""Co-schedule only beside a kernel predicted to run at least this long past its launch. Shorter
kernels are bound by launch and load latency, which decide the overlap there and which no
measurement here covers (run 97 measured a 47 us GEMM). Without this bound, a latency-bound
attention at t = 512 would be split into a statistics kernel and a chain that recomputes its
scores, priced at the longer of the two (7.7 us) instead of at one kernel."""


@dataclass(frozen=True)
class Pairing:
    """Kernel ``ahead`` of a plan re-tiled to run beside kernel ``ahead + 1``."""

    ahead: int
    estimate: Estimate
    """The re-tiled kernel ahead: its config fills at most ``idle_sms`` blocks."""
    idle_sms: int
    saved_us: float
    """Predicted time saved against running the two one after the other."""


def waits_after_loop(kernel: Kernel, earlier: frozenset[str]) -> bool:
    """Whether ``kernel``, launched dependently after kernels writing ``earlier``, renders in the
    explicitly warp-specialised form and touches none of ``earlier`` (and stores nothing) before its
    loop ends, so that every role's wait for the kernels ahead comes after the loop."""
    k = rendered_kernel(kernel, earlier)
    if k.loop is None or async_schedule(k) is None:
        return False
    chain = DependentLaunch(trigger=False, waits=True, earlier=earlier)
    return chain.first_wait(k.prologue) is None and chain.first_wait(k.body) is None


def idle_sms(low: Lowered, config: Mapping[str, int], sizes: Mapping[str, int], machine: Machine) -> int:
    """SMs that a one-block-per-SM kernel leaves idle: zero once its grid fills a wave."""
    return max(0, machine.device.sms - grid_blocks(low, config, sizes))


def best_on_blocks(low: Lowered, space: Mapping[str, list[int]], fit: FitModel, sizes: dict[str, int],
                   tensor_bytes: dict[str, int], machine: Machine, max_blocks: int) -> Estimate | None:
    """The cheapest fitting config of ``space`` whose grid has at most ``max_blocks`` blocks, or None."""
    names = sorted(space)
    best: Estimate | None = None
    facts = LoweringFacts.of(low, tensor_bytes, machine)
    for values in itertools.product(*(space[n] for n in names)):
        cfg = dict(zip(names, values, strict=True))
        if grid_blocks(low, cfg, sizes) > max_blocks:
            continue
        why, fp = fit.check(cfg)
        if why is not None:
            continue
        est = estimate(low, cfg, sizes, tensor_bytes, fp.smem_bytes, machine, facts, fp.regs_per_thread)
        if best is None or est.time_us < best.time_us:
            best = est
    return best


def tma_rows(low: Lowered) -> bool:
    """Whether every tensor the loop loads has two axes or more and 16-byte aligned rows, as TMA
    needs (``backend.tilelang.ws_forms``: otherwise the loop renders under ``T.Pipelined``, which
    waits for the kernels ahead before anything)."""
    return all(ld.asynchronous and len(ld.axes) >= 2 for ld in low.loads if ld.in_loop)


def pairings(kernels: list, sizes: dict[str, int], tensors: Mapping[str, GlobalTensor],
             machine: Machine, memo: dict | None = None) -> list[Pairing]:
    """Which kernels of a plan (``KernelChoice``s in launch order) to re-tile beside the next one.

    A kernel takes part in one pairing at most, and the kernel ahead has no GEMM. Measured here is
    a memory-bound statistics kernel. With GEMMs allowed, the only pairs found were attention
    split into a statistics kernel and a chain that recomputes the same scores (h = 1,
    t = 2048: 116 SMs idle). The model priced that split as free, and no run has measured it.

    The pair's predicted time is the longer of the two kernel estimates. The kernel ahead must
    run no longer than the loop it sits beside, or the wait after the loop stalls. Its estimate
    on few blocks is the model's latency and reach bound, which says 55 us for RMSNorm's
    statistics where run 97 measured 25, so the test errs toward running in turn. ``memo`` (one
    per planner: fixed sizes and machine) keeps the answers per kernel object across the
    candidates that share it.
    """
    memo = {} if memo is None else memo
    tensor_bytes = {n: math.prod(t.shape) * DTYPE_BYTES[t.dtype] for n, t in tensors.items()}
    out: list[Pairing] = []
    written: set[str] = set()
    taken: set[int] = set()
    for i in range(len(kernels) - 1):
        written |= set(kernels[i].low.writes)
        a, b = kernels[i], kernels[i + 1]
        if i in taken:
            continue
        if b.est.time_us - machine.launch_us < MIN_LOOP_US or a.low.gemms:
            continue  # decided before anything needs a fit model
        memo.setdefault(("alive", id(a.kernel)), a.kernel)  # keys hold ids: keep their objects alive
        memo.setdefault(("alive", id(b.kernel)), b.kernel)
        key = ("b", id(b.kernel), tuple(sorted(b.est.config.items())), frozenset(written))
        if key not in memo:
            # the cheap tests first: a fit model is built only for a grid short of a wave
            idle = idle_sms(b.low, b.est.config, sizes, machine) if tma_rows(b.low) else 0
            ok = idle > 0 and b.fit.renders_async(b.est.config)
            memo[key] = idle if ok and waits_after_loop(b.kernel, frozenset(written)) else 0
        idle = memo[key]
        if idle == 0:
            continue
        key = ("a", id(a.kernel), idle, tuple(sorted(tensor_bytes.get(n, 0) for n in a.low.reads)))
        if key not in memo:
            memo[key] = best_on_blocks(a.low, a.kernel.params, a.fit, sizes, tensor_bytes, machine, idle)
        alt = memo[key]
        if alt is None:
            continue
        saved = a.est.time_us + b.est.time_us - max(b.est.time_us, alt.time_us)
        if saved >= MIN_GAIN_US:
            out.append(Pairing(i, alt, idle, saved))
            taken |= {i, i + 1}
    return out
