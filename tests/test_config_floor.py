"""The config search's time floor (``cost._TimeFloor``, issue 46): ``best_config`` prices tile extents
least floor first and stops once the floor exceeds the best time found, so it must pick the config an
exhaustive walk picks (ties: the first in walk order), and the floor must never exceed a priced time.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.planner import cost
from pyrunner.planner.cost import DEFAULT_MACHINE, LoweringFacts, best_config, config_verdicts
from pyrunner.planner.memo import kernel_of
from pyrunner.planner.search import Planner
from pyrunner.planner.space import param_space
from pyrunner.target.device import DTYPE_BYTES
from pyrunner.target.fit import FitModel

ROOT = Path(__file__).resolve().parent.parent


def _kernels(graph, dtype: str = "fp16"):
    """(lowering, tensor bytes, sizes) of every distinct kernel of the planner's candidates."""
    planner = Planner(graph, dtype)
    seen, out = set(), []
    for c in planner.candidates():
        tb = {t.name: math.prod(t.shape) * DTYPE_BYTES[t.dtype] for t in c.tensors}
        for kc in c.kernels:
            if id(kc.low) not in seen:
                seen.add(id(kc.low))
                out.append((kc.low, tb, planner.sizes))
    return out


def _exhaustive(low, space, sizes, tb, fit, facts):
    """The least rank key over every fitting config, first in walk order (the search without a floor)."""
    names = sorted(space)
    verdicts = config_verdicts(space, fit)
    wide = cost.wide_steps(low, sizes, facts, DEFAULT_MACHINE)
    fast_chain = any(v is not None and not v[2] for v in verdicts)
    fitting = [(dict(zip(names, values)), v) for values, v in
               zip(itertools.product(*(space[n] for n in names)), verdicts, strict=True) if v is not None]
    if facts.long_rows:
        smallest = min(cost._size(cfg, low.stream) for cfg, _ in fitting)
        fitting = [(cfg, v) for cfg, v in fitting if cost._size(cfg, low.stream) <= smallest]
    elif fast_chain:
        fitting = [(cfg, v) for cfg, v in fitting if not v[2]]
    best = None
    for cfg, (smem, regs, slow) in fitting:
        got = cost._estimated(low, cfg, sizes, tb, smem, DEFAULT_MACHINE, facts, regs)
        key = cost._rank_key(fit, cfg, got[0], low.stream, facts.long_rows, wide, slow)
        if best is None or key < best[0]:
            best = key, cfg, got[0]
    return best


CASES = [
    pytest.param("softmax_rows", lambda: load_graph_file(ROOT / "tests" / "data" / "softmax_rows.json")
                 .with_sizes({"m": 512, "n": 1000}), id="softmax_rows"),
    pytest.param("matmul_bias_residual",
                 lambda: load_graph_file(ROOT / "tests" / "data" / "matmul_bias_residual.json"), id="matmul"),
    pytest.param("ScaledAttention", lambda: catalog.get("ScaledAttention", {"h": 1, "t_q": 128, "t_kv": 128, "d": 64}),
                 id="attention", marks=pytest.mark.slow),  # a flash chain (its asynchronous configs first)
]


@pytest.mark.parametrize("name,make", CASES)
def test_the_floor_keeps_the_exhaustive_winner_and_never_exceeds_a_priced_time(name, make) -> None:
    m = DEFAULT_MACHINE
    floor = cost._TimeFloor.of(m)
    pruned = 0
    for low, tb, sizes in _kernels(make()):
        space = param_space(low, sizes, m.device.sms)
        fit = FitModel(kernel_of(low, "k", space), sizes, m.device)
        facts = LoweringFacts.of(low, tb, m)
        ref = _exhaustive(low, space, sizes, tb, fit, facts)
        got = best_config(low, space, sizes, tb, fit, m, facts=LoweringFacts.of(low, tb, m))
        if ref is None:
            assert got is None
            continue
        assert got is not None and got.config == ref[1] and got.time_us == ref[2], name
        names = sorted(space)
        for values, v in zip(itertools.product(*(space[n] for n in names)), config_verdicts(space, fit), strict=True):
            if v is None:
                continue
            cfg = dict(zip(names, values))
            t = cost._estimated(low, cfg, sizes, tb, v[0], m, facts, v[1])[0]
            f = floor(low, cfg, sizes, tb, facts)
            assert f <= t, (name, cfg)
            pruned += round(f, 3) > round(ref[2], 3)
    assert pruned > 0  # the floor rules configs out, so the search above is not the exhaustive one


@pytest.mark.parametrize("name,make", CASES[:2])
def test_batched_fit_verdicts_agree_with_check_on_every_config(name, make) -> None:
    """``FitModel.fitting`` judges a space once per tile extents and thread count; each verdict must be
    what ``check`` says of that config alone (fits or not, shared bytes, registers)."""
    m = DEFAULT_MACHINE
    for low, _, sizes in _kernels(make()):
        space = param_space(low, sizes, m.device.sms)
        names = sorted(space)
        configs = list(itertools.product(*(space[n] for n in names)))
        batched = FitModel(kernel_of(low, "k", space), sizes, m.device).fitting(names, configs)
        alone = FitModel(kernel_of(low, "k", space), sizes, m.device)
        for values, got in zip(configs, batched, strict=True):
            why, fp = alone.check(dict(zip(names, values)))
            assert got == (None if why is not None else (fp.smem_bytes, fp.regs_per_thread)), (name, values)
