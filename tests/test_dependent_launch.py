"""Programmatic dependent launch of multi-kernel plans (plan/dependent_launch.py, the renderers, the
emulator): every kernel but the last lets the next be scheduled early, every kernel but the first
waits before it touches what the kernels ahead write or writes global memory, the explicitly
warp-specialised form waits per role (the producer only if it loads such a tensor, so its loads of
the plan's inputs go ahead), and the emulator catches a wait placed too late."""

from __future__ import annotations

import re

import numpy as np
import pytest
from plan_cache import search

from pyrunner.backend.tilelang.emulate import EmulationError, emulate
from pyrunner.backend.tilelang.render import render
from pyrunner.ir import catalog
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.plan.dependent_launch import dependent_launches
from pyrunner.plan.schedule import kernel_form
from pyrunner.run.executor import round_to
from pyrunner.run.runner import graph_of
from pyrunner.run.verify import compare, executor_bound

SIZES = {"m": 128, "d": 1024, "n": 256}


def _plans() -> list:
    return search(catalog.get("RMSNorm", SIZES), "bf16", top=6, tuning=False)


def _plan_with(forms: list[str]):
    """The first ranked RMSNorm plan whose kernels render in ``forms``, in launch order."""
    return next(p for p in _plans() if [kernel_form(k) for k in p.kernels] == forms)


def _run(plan, source: str | None = None):
    graph = graph_of(plan)
    inputs = {k: round_to(v, "bfloat16").astype(np.float64) for k, v in random_inputs(graph, 3).items()}
    em = emulate(plan, inputs, source=source)
    return compare(em.outputs, evaluate(graph, inputs), executor_bound(plan), 0,
                   {t.name: t.axes for t in plan.tensors if t.role == "output"}, graph)


def _kernel_sources(src: str) -> dict[str, str]:
    """Kernel name -> the text of its build function."""
    parts = re.split(r"\n(?=def build_)", src)
    return {m.group(1): p for p in parts if (m := re.match(r"def build_(\w+)\(", p))}


def test_the_launch_chain_of_a_three_kernel_plan() -> None:
    plan = next(p for p in _plans() if len(p.kernels) == 3)
    chain = dependent_launches(plan)
    first, second, last = (chain[k.name] for k in plan.kernels)
    assert (first.trigger, first.waits, first.earlier) == (True, False, frozenset())
    assert second.trigger and second.waits and second.earlier == frozenset(plan.kernels[0].writes)
    assert not last.trigger and last.waits
    assert last.earlier == frozenset(plan.kernels[0].writes) | frozenset(plan.kernels[1].writes)


@pytest.mark.parametrize("rank", range(5))
def test_every_ranked_plan_triggers_and_waits_where_it_must_and_computes_the_graph(rank: int) -> None:
    plan = _plans()[rank]
    src = render(plan)
    kernels = _kernel_sources(src)
    names = [k.name for k in plan.kernels]
    for i, name in enumerate(names):
        assert ("T.pdl_trigger()" in kernels[name]) == (i + 1 < len(names)), name
        assert ("T.pdl_sync()" in kernels[name]) == (i > 0), name
    res = _run(plan, src)  # the emulator raises if a kernel touches what it must not before its wait
    assert res.ok, res.message


def test_the_mainloop_consumers_wait_before_reading_the_statistics_and_the_producer_does_not() -> None:
    plan = _plan_with(["pipelined", "mainloop"])
    src = _kernel_sources(render(plan))[plan.kernels[1].name]
    producer, consumers = src.split("else:  # consumer warpgroups", 1)
    producer = producer.split("# producer warpgroup", 1)[1]
    assert "T.pdl_sync()" not in producer  # its loads are the plan's inputs: they go ahead at once
    stats = plan.kernels[0].writes[0]
    assert consumers.index("T.pdl_sync()") < consumers.index(f"T.copy({stats}[")


def test_a_producer_loading_an_intermediate_waits_before_its_loop() -> None:
    plan = _plan_with(["pipelined", "flat", "mainloop"])
    src = _kernel_sources(render(plan))[plan.kernels[2].name]
    producer = src.split("# producer warpgroup", 1)[1].split("else:  # consumer warpgroups", 1)[0]
    assert producer.index("T.pdl_sync()") < producer.index("T.tma_copy(")
    assert _run(plan).ok


def _move_wait(src: str, kernel: str, where: str, after: bool = False) -> str:
    """``src`` with the first wait of ``kernel``'s build function moved to just before (or after) the
    first line from there on that contains ``where``."""
    parts = _kernel_sources(src)
    body = parts[kernel]
    lines = body.split("\n")
    i = next(i for i, ln in enumerate(lines) if "T.pdl_sync()" in ln)
    del lines[i]
    j = next(j for j in range(i, len(lines)) if where in lines[j])
    indent = lines[j][: len(lines[j]) - len(lines[j].lstrip())]
    lines.insert(j + after, indent + "T.pdl_sync()")
    return src.replace(body, "\n".join(lines))


def test_the_emulator_catches_a_read_of_the_statistics_before_the_wait() -> None:
    plan = _plan_with(["pipelined", "mainloop"])
    stats = plan.kernels[0].writes[0]
    bad = _move_wait(render(plan), plan.kernels[1].name, f"T.copy({stats}[", after=True)
    with pytest.raises(EmulationError, match=r"a consumer thread reads '\w+', which a kernel ahead writes"):
        _run(plan, bad)


def test_the_emulator_catches_a_producer_load_before_its_wait() -> None:
    plan = _plan_with(["pipelined", "flat", "mainloop"])
    name = plan.kernels[2].name
    src = render(plan)
    body = _kernel_sources(src)[name]
    bad = src.replace(body, body.replace("T.pdl_sync()  # dependent launch: the loop loads", "pass  #", 1))
    with pytest.raises(EmulationError, match=r"a producer thread reads '\w+', which a kernel ahead writes"):
        _run(plan, bad)


def test_the_emulator_catches_a_store_before_the_wait() -> None:
    (plan,) = search(catalog.get("SwiGLU", {"m": 128, "d": 256, "n": 256}), "bf16", naive=True, tuning=False)
    written = {w for k in plan.kernels for w in k.writes}
    up = next(k for k in plan.kernels[1:] if not set(k.reads) & written)  # reads the plan's inputs only
    (out,) = up.writes
    bad = _move_wait(render(plan), up.name, f"T.copy({out}_tile, {out}[", after=True)
    with pytest.raises(EmulationError, match=f"a consumer thread writes to '{out}' before T.pdl_sync"):
        _run(plan, bad)


def test_a_kernel_without_a_wait_is_launched_normally_and_may_touch_anything() -> None:
    plan = _plan_with(["pipelined", "mainloop"])
    src = render(plan).replace("T.pdl_sync()", "pass")
    assert _run(plan, src).ok


@pytest.mark.slow
def test_tilelang_lowers_the_trigger_and_the_wait_before_its_own_warp_specialisation() -> None:
    pytest.importorskip("tilelang")
    from pyrunner.backend.tilelang.compile import lower_to_cuda

    plan = _plan_with(["pipelined", "mainloop"])
    first, second = plan.kernels
    cuda = lower_to_cuda(plan, {second.name: {"threads": 128, "block_m": 64}})
    assert "cudaTriggerProgrammaticLaunchCompletion();" in cuda[first.name]
    assert "cudaGridDependencySynchronize" not in cuda[first.name]
    assert cuda[second.name].count("cudaGridDependencySynchronize();") == 1
