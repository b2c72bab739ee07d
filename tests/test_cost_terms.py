"""The cost model's per-backend terms (``target.cost_terms``, Hopper's in ``backend.tilelang.hopper``).

One test per term the model gained for issue 41 (launch under graph replay, CUDA-core work hidden
under tensor-core work, first reads from L2), each checking what the term does to an estimate, and
that the Hopper constants are the backend's: the planner reads them from ``Machine.terms``. These
tests plan with the model alone (no tuning database).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from pyrunner.backend.tilelang.hopper import HOPPER_TERMS
from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.planner.cost import (
    DEFAULT_MACHINE,
    LoweringFacts,
    Machine,
    estimate,
    first_read_bw,
    l2_resident,
    overlapped,
)
from pyrunner.planner.search import Planner
from pyrunner.target.device import DTYPE_BYTES

ROOT = Path(__file__).resolve().parent.parent


def _one_kernel(graph, dtype: str = "bf16", gemm: bool | None = None):
    """(planner, kernel choice, tensor bytes) of the first one-kernel candidate (with or without GEMMs)."""
    planner = Planner(graph, dtype)
    for c in planner.candidates():
        if len(c.kernels) == 1 and (gemm is None or bool(c.kernels[0].low.gemms) == gemm):
            tb = {t.name: math.prod(t.shape) * DTYPE_BYTES[t.dtype] for t in c.tensors}
            return planner, c.kernels[0], tb
    raise AssertionError("no one-kernel candidate")


def _time(planner, kc, tb, m: Machine) -> float:
    cfg = kc.est.config
    fp = kc.fit.footprint(cfg)
    return estimate(kc.low, cfg, planner.sizes, tb, fp.smem_bytes, m, regs=fp.regs_per_thread).time_us


def test_the_default_machine_uses_the_hopper_backends_terms() -> None:
    assert DEFAULT_MACHINE.terms is HOPPER_TERMS
    assert DEFAULT_MACHINE.terms.backend == "tilelang-hopper"
    assert DEFAULT_MACHINE.as_dict()["launch_us"] == HOPPER_TERMS.launch_us


def test_launch_is_paid_once_per_kernel() -> None:
    """A kernel's estimate is its work plus the backend's launch cost: moving the launch term moves the
    estimate by exactly as much, and a tiny kernel's estimate is close to the launch alone."""
    graph = catalog.get("RMSNorm", {"m": 64, "d": 256, "n": 256})
    planner, kc, tb = _one_kernel(graph)
    base = _time(planner, kc, tb, DEFAULT_MACHINE)
    later = _time(planner, kc, tb,
                  Machine(DEFAULT_MACHINE.device, replace(HOPPER_TERMS, launch_us=HOPPER_TERMS.launch_us + 3.0)))
    assert later - base == pytest.approx(3.0, abs=1e-6)
    assert base < 4 * HOPPER_TERMS.launch_us


def test_overlap_hides_the_shorter_kind_of_work() -> None:
    assert overlapped(10.0, 4.0, 0.0) == 14.0
    assert overlapped(10.0, 4.0, 1.0) == 10.0
    assert overlapped(4.0, 10.0, 0.5) == 12.0


def test_attention_exponentials_overlap_with_its_mma() -> None:
    """Attention's exponentials (special-function work) run beside its MMAs: with ``cc_overlap`` at 0
    they add, at 1 the kernel is priced at the longer of the two; Hopper's value lies between."""
    graph = catalog.get("Attention", {"h": 4, "t_q": 1024, "t_kv": 1024, "d": 128})
    planner, kc, tb = _one_kernel(graph, gemm=True)

    def at(overlap: float) -> float:
        return _time(planner, kc, tb, Machine(DEFAULT_MACHINE.device, replace(HOPPER_TERMS, cc_overlap=overlap)))

    assert at(0.0) > at(HOPPER_TERMS.cc_overlap) > at(1.0) or HOPPER_TERMS.cc_overlap in (0.0, 1.0)
    assert at(0.0) > at(0.5) > at(1.0)


def test_first_reads_from_l2_only_where_the_data_stays_there() -> None:
    """Data that fits in half of L2 stays there between calls: its first reads see the backend's share
    of L2's bandwidth (when higher than HBM's); data that does not is read at HBM's rate."""
    small = load_graph_file(ROOT / "tests" / "data" / "softmax_rows.json").with_sizes({"m": 512, "n": 1024})
    large = load_graph_file(ROOT / "tests" / "data" / "softmax_rows.json").with_sizes({"m": 8192, "n": 8192})
    m = DEFAULT_MACHINE
    hbm = m.device.hbm_bw * m.memory_efficiency
    for graph, resident in ((small, True), (large, False)):
        planner, kc, tb = _one_kernel(graph)
        facts = LoweringFacts.of(kc.low, tb, m)
        assert l2_resident(facts, m) is resident
        off = Machine(DEFAULT_MACHINE.device, replace(HOPPER_TERMS, l2_bw_share=0.0))
        on = Machine(DEFAULT_MACHINE.device, replace(HOPPER_TERMS, l2_bw_share=0.6))
        assert first_read_bw(facts, off) == hbm
        assert first_read_bw(facts, on) == (max(hbm, 0.6 * m.device.l2_bw) if resident else hbm)
        if resident:
            assert _time(planner, kc, tb, on) < _time(planner, kc, tb, off)
        else:
            assert _time(planner, kc, tb, on) == _time(planner, kc, tb, off)
