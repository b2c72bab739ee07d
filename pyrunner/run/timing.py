"""Median timing with warm-up excluded.

On a GPU, ``triton.testing.do_bench`` (CUDA events, L2 flushed between runs,
median) when triton is importable, else CUDA events directly. Without a GPU, a
wall-clock fallback exists only so the code paths can be exercised in tests;
its numbers are never reported as kernel times.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

WARMUP_MS = 25.0
REP_MS = 100.0


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return torch.cuda.is_available()


def device_name() -> str:
    """The device results are attributed to ("cpu" when there is no GPU)."""
    if gpu_available():
        import torch

        return torch.cuda.get_device_name()
    return "cpu"


def _have_triton() -> bool:
    try:
        import triton.testing  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not usable"
        return False
    return True


def _cuda_events(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    times = []
    for _ in range(max(5, int(rep_ms / est))):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def _wall_clock(fn: Callable[[], object], warmup_ms: float, rep_ms: float, min_reps: int) -> float:
    t0 = time.perf_counter()
    fn()
    est = max((time.perf_counter() - t0) * 1e3, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    times = []
    for _ in range(max(min_reps, int(rep_ms / est))):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def median_ms(fn: Callable[[], object], warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS,
              *, min_reps: int = 5) -> float:
    """Median time of one call of fn, in milliseconds, warm-up excluded."""
    if gpu_available():
        if _have_triton():
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
        return _cuda_events(fn, warmup_ms, rep_ms)
    return _wall_clock(fn, warmup_ms, rep_ms, min_reps)


def median_us(fn: Callable[[], object], warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS) -> float:
    """Median time of one call of fn, in microseconds (the results log's unit)."""
    return median_ms(fn, warmup_ms, rep_ms) * 1e3


def exclusive_spans(spans: list[tuple[float, float]]) -> list[float]:
    """Each span's length outside every span that started before it (same order as given).

    A kernel launched with programmatic dependent launch starts while the kernel before it runs and
    waits in ``griddepcontrol.wait``: its own span covers that wait, so summing spans counts the
    overlap twice (run 84: the decode plan's kernels summed 51.1 + 47.7 + 44.1 us for a 57.0 us
    plan). The overlap is charged to the earlier kernel; the lengths add up to the union's."""
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    out = [0.0] * len(spans)
    reach = float("-inf")
    for i in order:
        start, end = spans[i]
        out[i] = max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return out


def kernel_times_us(fn: Callable[[], object], names: list[str], calls: int = 10) -> dict[str, float]:
    """Mean device time per call of each GPU kernel fn launches, via the PyTorch profiler.

    A kernel event is attributed to the first of `names` it contains (TileLang
    names device functions after the prim_func); others keep their own name. A kernel's time
    excludes what overlaps kernels that started before it (``exclusive_spans``), so the times add
    up to the plan's. Returns {} where the profiler cannot see device activity.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return {}
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    keys: list[str] = []
    spans: list[tuple[float, float]] = []
    for ev in prof.events():
        if getattr(ev, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        us = float(getattr(ev, "device_time", 0.0) or getattr(ev, "cuda_time", 0.0) or 0.0)
        if us <= 0:
            continue
        keys.append(next((n for n in sorted(names, key=len, reverse=True) if n in ev.name), ev.name))
        start = float(ev.time_range.start)  # microseconds on the device's clock
        spans.append((start, start + us))
    out: dict[str, float] = {}
    for key, us in zip(keys, exclusive_spans(spans), strict=True):
        out[key] = out.get(key, 0.0) + us / calls
    return out


def _warm(fn: Callable[[], object], warmup_ms: float) -> None:
    """Call fn back to back for about warmup_ms of device time (clocks up, caches and autotuners settled)."""
    import torch

    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est_ms = max((time.perf_counter() - t) * 1e3, 1e-3)
    for _ in range(min(10000, max(1, int(warmup_ms / est_ms)))):
        fn()
    torch.cuda.synchronize()


def graph_bench_ms(fn: Callable[[], object], rep_ms: float = REP_MS, min_calls: int = 8) -> float:
    """Per-call time (ms) of ``fn`` replayed from a CUDA graph of back-to-back calls (launch gaps removed).

    The graph holds enough calls to run about ``rep_ms / 5``; it is replayed five times and the
    median replay divided by the calls is returned. L2 stays warm between calls, for every
    function timed this way alike. Raises when ``fn`` cannot be captured (a host sync, say).
    """
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        one = torch.cuda.CUDAGraph()
        with torch.cuda.graph(one, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        one.replay()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 3, 1e-3)
    calls = max(min_calls, min(2000, int(rep_ms / 5 / est)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    g.replay()  # warm replay
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / calls)
    del g, one
    return statistics.median(times)


def side_by_side_us(fns: dict[str, Callable[[], object]], rounds: int = 3, warmup_ms: float = WARMUP_MS,
                    rep_ms: float = REP_MS) -> tuple[dict[str, float], dict[str, str], dict[str, list[float]]]:
    """Time several functions identically, interleaved: round r times each in turn, medians over rounds.

    Every function gets the same warm-up and the same method: CUDA-graph replay when all of
    them can be captured (``graph``), else ``do_bench`` with L2 flushed between calls for all
    (``do_bench``); the method used is returned per function. Interleaving in rounds spreads clock and order
    effects over all of them; the per-round times are returned too (their spread is the noise).
    Without a GPU, the wall-clock fallback of ``median_ms``.
    """
    if not gpu_available():
        rounds_cpu = {k: [median_ms(f, warmup_ms / max(1, rounds), rep_ms / max(1, rounds)) * 1e3
                          for _ in range(max(1, rounds))] for k, f in fns.items()}
        times = {k: statistics.median(v) for k, v in rounds_cpu.items()}
        return times, {k: "wall-clock" for k in fns}, rounds_cpu
    method: dict[str, str] = {}
    per_round: dict[str, list[float]] = {k: [] for k in fns}
    for k, f in fns.items():  # warm-up, and the method each function can use
        _warm(f, warmup_ms)
        try:
            graph_bench_ms(f, rep_ms=min(rep_ms, 10.0))
            method[k] = "graph"
        except Exception as e:  # noqa: BLE001 - not capturable: events with L2 flush
            method[k] = "do_bench"
            print(f"timing: {k} cannot be replayed from a CUDA graph ({type(e).__name__}: "
                  f"{' '.join(str(e).split())[:200]}); every function is timed with do_bench",
                  file=sys.stderr, flush=True)
    if "do_bench" in method.values():  # one method for all, or the comparison is not like for like
        method = {k: "do_bench" for k in fns}
    for _ in range(max(1, rounds)):
        for k, f in fns.items():
            try:
                if method[k] == "graph":
                    ms = graph_bench_ms(f, rep_ms=rep_ms / rounds)
                else:
                    ms = median_ms(f, warmup_ms / rounds, rep_ms / rounds)
            except Exception:  # noqa: BLE001 - one failing function must not lose the others
                continue
            per_round[k].append(ms * 1e3)
    times = {k: statistics.median(v) for k, v in per_round.items() if v}
    return times, method, per_round
