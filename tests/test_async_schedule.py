"""The asynchronous loop schedules (plan/schedule.py, render_ws.py), the two-GEMM chain
and the GEMM mainloop: which loops get them and how their ops split, that the rendered
producer/consumer source computes the graph on the CPU emulator with its barrier protocol replayed,
and that the emulator and the lowered-CUDA check catch a slot released too early, a slot never
released, and a wait that lets a wgmma run on past the point its result or operand is needed."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from plan_cache import search

from pyrunner.backend.tilelang.emulate import EmulationError, emulate
from pyrunner.backend.tilelang.lowered import releases_in_flight
from pyrunner.backend.tilelang.render import render
from pyrunner.backend.tilelang.structure import structure_problems
from pyrunner.ir import catalog
from pyrunner.ir.reference import evaluate, random_inputs
from pyrunner.plan.analysis import op_reads_writes
from pyrunner.plan.schedule import async_schedule, chain_schedule, gemm_operand_loads, issue_order, mainloop_schedule
from pyrunner.plan.schema import Gemm, Map, Ref
from pyrunner.run.executor import round_to
from pyrunner.run.runner import graph_of
from pyrunner.run.verify import compare, executor_bound

SMALL = {"h": 1, "t_q": 128, "t_kv": 512, "d": 32}  # eight loop steps: every ring slot is reused
SMALL_MM = {"m": 128, "d": 1024, "n": 256}  # sixteen steps of the default 64-deep tile


def _plan(name: str = "Attention", sizes: dict | None = None):
    (plan,) = search(catalog.get(name, sizes), "bf16", top=1)
    return plan


def test_attention_splits_into_g1_early_late_and_g2() -> None:
    (k,) = _plan().kernels
    sched = chain_schedule(k)
    assert sched is not None
    body = k.body
    assert isinstance(body[sched.g1], Gemm) and body[sched.g1].clear
    assert isinstance(body[sched.g2], Gemm) and not body[sched.g2].clear
    g2 = body[sched.g2]
    for i in sched.early:  # run under G2 of the previous step: never touch its operands
        r, w = op_reads_writes(body[i])
        assert not {g2.a, g2.c} & (set(r) | set(w)), body[i]
    late_writes = {w for i in sched.late for w in op_reads_writes(body[i])[1]}
    assert {g2.a, g2.c} <= late_writes  # P = cast(S) and the rescale of acc wait for G2
    assert sched.release == {"K_s": "g1", "V_s": "g2"}
    order = issue_order(sched, 3)
    assert order[0] == (0, sched.g1) and order[-1] == (2, sched.g2)
    assert order.index((1, sched.g1)) < order.index((0, sched.g2))  # G1 of step 1 goes before G2 of step 0
    assert sum(1 for _, i in order if i == sched.g2) == 3


def test_no_chain_for_one_gemm_or_an_op_after_g2_that_reads_its_accumulator() -> None:
    (mm,) = _plan("Matmul").kernels
    assert chain_schedule(mm) is None
    (k,) = _plan().kernels
    sched = chain_schedule(k)
    acc = k.body[sched.g2].c
    reads_acc = Map(op="map", dst=k.body[sched.early[0]].dst, expr=Ref(kind="ref", buf=acc))
    broken = k.model_copy(update={"body": [*k.body, reads_acc]})
    assert chain_schedule(broken) is None


def test_matmul_gets_the_mainloop_and_a_gemm_after_thread_code_does_not() -> None:
    (mm,) = _plan("Matmul").kernels
    sched = mainloop_schedule(mm)
    assert sched is not None and async_schedule(mm) == sched
    assert [type(mm.body[i]).__name__ for i in sched.gemms] == ["Gemm"]
    assert issue_order(sched, 2) == [(0, sched.gemms[0]), (1, sched.gemms[0])]
    (k,) = _plan().kernels  # attention: thread code between the GEMMs, so the chain, not the mainloop
    assert mainloop_schedule(k) is None
    g = mm.body[sched.gemms[0]]
    cleared = mm.model_copy(update={"body": [*mm.body[:-1], g.model_copy(update={"clear": True})]})
    assert mainloop_schedule(cleared) is None  # no loop state to accumulate into
    scaled = Map(op="map", dst=g.a, expr=Ref(kind="ref", buf=g.a))  # thread code writing a ring slot
    assert mainloop_schedule(mm.model_copy(update={"body": [*mm.body, scaled]})) is None


def _small_case(name: str = "Attention", sizes: dict | None = None):
    plan = _plan(name, sizes or SMALL)
    graph = graph_of(plan)
    inputs = {k: round_to(v, "bfloat16").astype(np.float64) for k, v in random_inputs(graph, 5).items()}
    return plan, graph, inputs, render(plan)


def _run(plan, graph, inputs, source):
    em = emulate(plan, inputs, source=source)
    res = compare(em.outputs, evaluate(graph, inputs), executor_bound(plan), 0,
                  {t.name: t.axes for t in plan.tensors if t.role == "output"}, graph)
    return em, res


def test_rendered_producer_and_consumers_compute_attention() -> None:
    plan, graph, inputs, src = _small_case()
    assert "T.wgmma_gemm(" in src and "T.tma_copy(" in src and "T.wait_wgmma(1)" in src
    em, res = _run(plan, graph, inputs, src)
    assert ("async",) in em.traces[plan.kernels[0].name].events  # the producer branch really ran
    assert res.ok, res.message
    assert structure_problems(plan, em) == []


def test_rendered_mainloop_computes_matmul() -> None:
    plan, graph, inputs, src = _small_case("Matmul", SMALL_MM)
    assert "asynchronous GEMM mainloop" in src and "T.wait_wgmma(1)" in src
    em, res = _run(plan, graph, inputs, src)
    assert ("async",) in em.traces[plan.kernels[0].name].events
    assert res.ok, res.message
    assert structure_problems(plan, em) == []


def _fused_rmsnorm_case():
    """RMSNorm fed into a GEMM as one kernel: the loop sums squares of the X tile the GEMM multiplies."""
    plans = search(catalog.get("RMSNorm", SMALL_MM), "bf16", top=5, tuning=False)
    plan = next(p for p in plans if len(p.kernels) == 1)
    graph = graph_of(plan)
    inputs = {k: round_to(v, "bfloat16").astype(np.float64) for k, v in random_inputs(graph, 7).items()}
    return plan, graph, inputs, render(plan)


def test_thread_work_beside_the_mainloop_reads_the_ring_slot() -> None:
    plan, graph, inputs, src = _fused_rmsnorm_case()
    (k,) = plan.kernels
    sched = mainloop_schedule(k)
    assert sched is not None and sched.ops  # the sum of squares runs beside the wgmma
    assert re.search(r"X_s\[d_step % stages, m_i, d_i\]", src)  # element reads index the step's slot
    em, res = _run(plan, graph, inputs, src)
    assert ("async",) in em.traces[k.name].events
    assert res.ok, res.message
    assert structure_problems(plan, em) == []
    # freeing X's slot of this step, not the previous one, lets the producer refill it under the wgmma
    _assert_caught((plan, graph, inputs, src), *MAINLOOP_MUTATIONS["current_slot"], "current_slot")


MAINLOOP_MUTATIONS = {
    # the slot of this step freed instead of the previous one's: its wgmma has not been waited on
    "current_slot": (r"T\.barrier_arrive\(X_s_empty\[\(d_step - 1\) % stages\]\)",
                     "T.barrier_arrive(X_s_empty[d_step % stages])"),
    # the previous step's wgmma may still be in flight when its slot is freed
    "wait_two": (r"T\.wait_wgmma\(1\)", "T.wait_wgmma(2)"),
    # W's slots never freed past the first ring: deadlock
    "no_release": (r"\n\s+T\.barrier_arrive\(W_s_empty\[\(d_step - 1\) % stages\]\)\n", "\n"),
}


def _assert_caught(case: tuple, pat: str, rep: str, what: str) -> None:
    """The source with one planted protocol bug computes wrong numbers or stops with a deadlock."""
    plan, graph, inputs, src = case
    bad, n = re.subn(pat, rep, src, count=1)
    assert n == 1, f"mutation {what!r} did not apply"
    _assert_broken(case, bad, f"mutation {what!r}")


def _assert_broken(case: tuple, bad: str, what: str) -> None:
    """A broken rendering ``bad`` of the case computes wrong numbers or stops with a deadlock."""
    plan, graph, inputs, _ = case
    try:
        _, res = _run(plan, graph, inputs, bad)
    except EmulationError as e:
        assert "deadlock" in str(e)
        return
    assert not res.ok, f"{what} went unnoticed"


@pytest.mark.parametrize("mutation", sorted(MAINLOOP_MUTATIONS))
def test_the_emulator_catches_a_broken_mainloop(mutation: str) -> None:
    _assert_caught(_small_case("Matmul", SMALL_MM), *MAINLOOP_MUTATIONS[mutation], mutation)


MUTATIONS = {
    # V's slot freed before the wgmma reading it is waited on: the producer refills it underneath
    "early_release": (r"(\n\s+)(T\.wait_wgmma\(0\)\n)(\s+)"
                      r"(T\.barrier_arrive\(V_s_empty\[\(t_kv_step - 1\) % stages\]\))", r"\1\4\n\3\2"),
    # K's slot never freed: the producer waits for it for ever
    "no_release": (r"\n\s+T\.barrier_arrive\(K_s_empty\[t_kv_step % stages\]\)\n", "\n"),
    # the softmax reads S before G1 has been waited on
    "no_wait": (r"T\.wait_wgmma\(1\)", "T.wait_wgmma(2)"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_emulator_catches_a_broken_barrier_protocol(mutation: str) -> None:
    _assert_caught(_small_case(), *MUTATIONS[mutation], mutation)


def test_lowered_check_flags_a_release_under_a_wgmma_in_flight() -> None:
    ok = ("tl::warpgroup_commit_batch();\n  tl::wait_wgmma<1>();\n  K_s_empty[(k & 1)].arrive();\n"
          "  tl::warpgroup_commit_batch();\n  tl::wait_wgmma<0>();\n  V_s_empty[0].arrive();\n")
    assert releases_in_flight(ok) == []
    bad = ok.replace("  tl::wait_wgmma<1>();\n", "", 1)
    assert releases_in_flight(bad) == ["line 2: K_s_empty"]


@pytest.mark.slow
def test_rendered_attention_and_matmul_lower_without_a_release_in_flight() -> None:
    pytest.importorskip("tilelang")
    from pyrunner.backend.tilelang.compile import lower_to_cuda

    for plan in (_plan(), _plan("Matmul")):
        (src,) = lower_to_cuda(plan).values()
        assert "wait_wgmma<1>" in src and "warpgroup_reg_alloc" in src
        assert releases_in_flight(src) == []


# --- loops with masked bounds: each block runs its steps [lo, hi) ------------------------------------

MASKED = {"h": 1, "t_q": 1024, "t_kv": 1024, "d": 64}
MASKED_WINDOW = 512
"""Sliding-window attention at t = 1024 with a 512-key window (the catalog's 1024 at half the length, a
quarter of the emulation): later query blocks start past step 0, and (t_kv_lo) is not a multiple of the
ring's stages for some of them."""


def _masked_case(name: str, pingpong: bool):
    """A masked attention plan, with the ping-pong config (two consumer warpgroups, 128-row blocks)
    added to its space where ``pingpong``: the small shape's space leaves it out."""
    from pyrunner.plan.schema import with_hash

    if name == "SlidingWindowAttention":
        (plan,) = search(catalog.sliding_window_attention(**MASKED, window=MASKED_WINDOW), "bf16", top=1)
    else:
        plan = _plan(name, MASKED)
    if pingpong:
        (k,) = plan.kernels
        params = {**k.params, "block_t_q": [64, 128], "threads": [128, 256]}
        k = k.model_copy(update={"params": params,
                                 "defaults": {**k.defaults, "block_t_q": 128, "threads": 256, "stages": 2}})
        plan = with_hash(plan.model_copy(update={"kernels": [k]}))
    graph = graph_of(plan)
    inputs = {k: round_to(v, "bfloat16").astype(np.float64) for k, v in random_inputs(graph, 5).items()}
    return plan, graph, inputs, render(plan)


@pytest.mark.parametrize("pingpong", [False, True])
@pytest.mark.parametrize("name", ["CausalAttention", "SlidingWindowAttention"])
def test_masked_attention_runs_the_chain_over_its_visible_steps(name: str, pingpong: bool) -> None:
    plan, graph, inputs, src = _masked_case(name, pingpong)
    (k,) = plan.kernels
    assert chain_schedule(k) is not None and k.loop.visible is not None
    assert "T.serial(t_kv_lo, t_kv_hi)" in src and "if t_kv_hi > t_kv_lo:" in src
    em, res = _run(plan, graph, inputs, src)
    assert ("async",) in em.traces[k.name].events
    assert res.ok, res.message
    assert structure_problems(plan, em) == []


MASKED_MUTATIONS = {
    # the consumers count slots from step 0, the producer from t_kv_lo: they disagree past the window
    "slots_from_zero": (r"K_s_full\[\(t_kv_step - t_kv_lo\) % stages\], \(\(t_kv_step - t_kv_lo\) // stages\) % 2",
                        "K_s_full[t_kv_step % stages], (t_kv_step // stages) % 2"),
    # the last step's G2 reads a slot one past the block's range
    "last_past_range": (r"last_step = t_kv_hi - 1", "last_step = t_kv_hi"),
}


@pytest.mark.parametrize("mutation", sorted(MASKED_MUTATIONS))
def test_the_emulator_catches_a_broken_masked_chain(mutation: str) -> None:
    _assert_caught(_masked_case("SlidingWindowAttention", False), *MASKED_MUTATIONS[mutation], mutation)


@pytest.mark.slow
def test_masked_attention_lowers_without_a_release_in_flight() -> None:
    pytest.importorskip("tilelang")
    from pyrunner.backend.tilelang.compile import lower_to_cuda

    plan = _plan("CausalAttention")  # the real shape: 128-row blocks, ping-pong, two stages fit
    (src,) = lower_to_cuda(plan, {plan.kernels[0].name: {"stages": 2}}).values()
    assert "wait_wgmma<1>" in src and "warpgroup_reg_alloc" in src
    assert releases_in_flight(src) == []


# --- the planner's view of the asynchronous form --------------------------------------------------

@pytest.mark.parametrize("name", ["Attention", "CausalAttention", "GroupedQueryAttention", "SlidingWindowAttention",
                                  "Matmul", "RMSNorm", "SwiGLU"])
def test_the_fit_model_predicts_the_renderers_guard_and_defaults_take_the_async_form(name: str) -> None:
    """``FitModel.renders_async`` (what config ranking and co-scheduling rely on) never says yes where
    the rendered build function's guard says no, agrees with it on every config of these spaces, and
    the planner's default config is one that renders asynchronously."""
    from pyrunner.backend.tilelang.emulate import Trace, load_emulated
    from pyrunner.plan.schema import axis_sizes
    from pyrunner.target.fit import FitModel

    plan = search(catalog.get(name), "bf16", top=1, tuning=False)[0]
    src = render(plan)
    ns = load_emulated(src, Trace())
    checked = 0
    for k in plan.kernels:
        build = src.split(f"def build_{k.name}(", 1)[1].split("\ndef build_", 1)[0]
        found = re.search(r"\n    if (.*):  # asynchronous (two-GEMM chain|GEMM mainloop)", build)
        fit = FitModel(k, axis_sizes(plan))
        if found is None:
            assert not fit.renders_async(k.defaults), k.name
            continue
        names = sorted(k.params)
        agree = 0
        for values in itertools.product(*(k.params[p] for p in names)):
            cfg = dict(zip(names, values))
            guard = bool(eval(found.group(1), dict(ns), dict(cfg)))  # noqa: S307 - our own rendered source
            assert not (fit.renders_async(cfg) and not guard), (k.name, cfg)
            agree += fit.renders_async(cfg) == guard
        assert agree == math.prod(len(k.params[p]) for p in names), k.name
        assert fit.renders_async(k.defaults), k.name
        checked += 1
    assert checked == (name != "SwiGLU")  # SwiGLU's gate and up GEMMs merge into one wide MMA: T.Pipelined


PERSISTENT = {  # more tiles than SM_COUNT = 3, and steps per tile no multiple of 2 x stages
    "Attention": {"h": 8, "t_q": 128, "t_kv": 384, "d": 32},  # each tile of a block another head
    "GroupedQueryAttention": {"kv_h": 2, "group": 4, "t_q": 128, "t_kv": 384, "d": 32},
}


def _persistent_case(name: str, monkeypatch: pytest.MonkeyPatch):
    """Rendered for a Hopper target of 3 SMs (the default target's, swapped for this test)."""
    from dataclasses import replace

    from pyrunner.backend.tilelang import targets
    from pyrunner.backend.tilelang.hopper import Hopper
    from pyrunner.target.device import DEFAULT_DEVICE

    default = targets.default_target()
    monkeypatch.setitem(targets.TARGETS, DEFAULT_DEVICE, Hopper(replace(default.device, sms=3)))
    return _small_case(name, PERSISTENT[name])


@pytest.mark.parametrize("name", sorted(PERSISTENT))
def test_persistent_blocks_loop_over_tiles_with_one_ring(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    case = _persistent_case(name, monkeypatch)
    plan, graph, inputs, src = case
    assert "SM_COUNT = 3" in src and "with T.Kernel(SM_COUNT" in src
    # two launched axes (attention: query blocks x heads) walk TileLang's panels; three unravel
    assert ("panel_rows" in src) == (name == "Attention")
    em, res = _run(plan, graph, inputs, src)
    assert ("async",) in em.traces[plan.kernels[0].name].events
    assert res.ok, res.message  # every tile of every block written, in every block's order
    # the ring's step count restarted at each tile: the mbarrier phases no longer match the waits,
    # so a wait passes on the last tile's phase (stale data) or never passes (deadlock)
    bad, n = re.subn(r"\(tile_it \* \(SIZE_\w+ // \w+\) \+ ", "(", src)
    assert n > 0
    _assert_broken(case, bad, "a ring restarted per tile")


def test_only_chains_past_one_wave_render_persistent() -> None:
    plan, graph, inputs, src = _small_case()  # one tile on 132 SMs
    assert "if tiles > SM_COUNT:" not in src  # no config of its space passes one wave: nothing added
    assert "if tiles > SM_COUNT:" in render(_plan()) and "with T.Kernel(SM_COUNT" in render(_plan())
    src4k = render(_plan("Matmul", {"m": 4096, "d": 4096, "n": 4096}))  # 512 tiles, but a mainloop
    assert "asynchronous GEMM mainloop" in src4k and "SM_COUNT, threads" not in src4k


def test_the_producer_loads_a_gemm_only_prologue_tile_and_frees_it_after_the_last_g1(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plan, graph, inputs, src = _persistent_case("Attention", monkeypatch)
    (k,) = plan.kernels
    assert [k.prologue[i].dst for i in gemm_operand_loads(k)] == ["Q_s"]
    assert re.search(r"T\.tma_copy\(Q\[.*\], Q_s, barrier=Q_s_full\[0\]\)", src)
    assert "T.barrier_wait(Q_s_full[0], tile_it % 2)" in src
    # Q_s freed as soon as it is loaded: the producer's next tile overwrites it under this tile's G1
    free = "T.barrier_arrive(Q_s_empty[0])  # 'Q_s': every G1 of this tile waited on"
    assert free in src
    early = re.sub(re.escape(free), "pass", src)
    early = early.replace("T.barrier_wait(Q_s_full[0], tile_it % 2)  # 'Q_s': the producer's TMA load",
                          "T.barrier_wait(Q_s_full[0], tile_it % 2)\n" + " " * 28 + "T.barrier_arrive(Q_s_empty[0])")
    assert early != src
    _assert_broken((plan, graph, inputs, src), early, "Q_s freed before the tile's last G1")


# --- partial last tiles in the asynchronous forms (``target.fit.ASYNC_PARTIAL_TILES``) ----------

PARTIAL = {  # no tile of the spaces divides the loaded axes: the last step is a partial tile
    "Attention": {"h": 2, "t_q": 200, "t_kv": 200, "d": 64},
    "CausalAttention": {"h": 2, "t_q": 200, "t_kv": 200, "d": 64},
    "Matmul": {"m": 200, "d": 1000, "n": 256},
}


def test_partial_tiles_keep_the_synchronous_form_when_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default (runs 132-133); switched off, a loaded axis with a partial last tile keeps the
    guard's divisibility test, and the fit model says such a config renders T.Pipelined."""
    from pyrunner.plan.schema import axis_sizes
    from pyrunner.target import fit

    assert fit.ASYNC_PARTIAL_TILES is True
    on = _plan("Attention", PARTIAL["Attention"])
    assert "SIZE_T_KV % block_t_kv == 0" not in render(on)
    monkeypatch.setattr(fit, "ASYNC_PARTIAL_TILES", False)
    plan = _plan("Attention", PARTIAL["Attention"])
    assert "SIZE_T_KV % block_t_kv == 0" in render(plan)
    (k,) = plan.kernels
    assert not fit.FitModel(k, axis_sizes(plan)).renders_async({**k.defaults, "block_t_kv": 128})


@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_switched_on_the_asynchronous_forms_compute_partial_tiles(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Switched on, the asynchronous form takes configs whose last step is partial (zeros loaded past
    the end, the mask on that step alone, stores past the end dropped) and agrees with float64 on the
    CPU emulator at every step width, with the producer branch running; the fit model agrees."""
    from pyrunner.plan.schema import axis_sizes
    from pyrunner.target import fit

    monkeypatch.setattr(fit, "ASYNC_PARTIAL_TILES", True)
    plan, graph, inputs, src = _small_case(name, PARTIAL[name])
    (k,) = plan.kernels
    step = next(p for p in k.params if p.startswith("block_") and p.removeprefix("block_") == k.loop.axis)
    size = axis_sizes(plan)[k.loop.axis]
    widths = [w for w in k.params[step] if size % w]
    assert widths
    model = fit.FitModel(k, axis_sizes(plan))
    ran = 0
    for w in widths:
        cfg = {**k.defaults, step: w}
        if not model.renders_async(cfg):
            continue
        ran += 1
        em = emulate(plan, inputs, config={k.name: cfg}, source=src)
        assert ("async",) in em.traces[k.name].events, cfg
        res = compare(em.outputs, evaluate(graph, inputs), executor_bound(plan), 0,
                      {t.name: t.axes for t in plan.tensors if t.role == "output"}, graph)
        assert res.ok, (cfg, res.message)
    assert ran, f"no partial-tile config of {k.name} renders asynchronously"
    from pyrunner.backend.tilelang.emulate import Trace, load_emulated

    ns = load_emulated(src, Trace())
    found = re.search(r"\n    if (.*):  # asynchronous (two-GEMM chain|GEMM mainloop)",
                      src.split(f"def build_{k.name}(", 1)[1])
    assert found is not None
    for w in k.params[step]:  # the rendered guard and the fit model agree at every width
        cfg = {**k.defaults, step: w}
        assert bool(eval(found.group(1), dict(ns), dict(cfg))) == model.renders_async(cfg), cfg  # noqa: S307
