"""Unmodified Hugging Face decoder layers through ``pyrunner.optimize`` on the CPU path (issue 40).

Layers are built from config objects with random weights (``frontend_models``; no downloads) at a
tiny shape (hidden 64, 4 heads, 16 tokens). Each is captured by dynamo, cut into regions and
either run region by region in the float64 interpreter (``executor="reference"``: the mapping of
views, rotary embeddings, masks, GQA and softcapping is checked against eager) or planned and
CPU-checked (``executor="plan"``, what a machine without a GPU does). The share of the layer's
FLOPs inside regions is printed per block.
"""

from __future__ import annotations

import pytest
import torch
from frontend_models import HF_BLOCKS

import pyrunner

pytest.importorskip("transformers")

FP32_VS_F64 = 1e-5
"""Eager runs the layer in float32, the reference executor each region in float64: the max error relative to
the output's largest value stays within float32 rounding through a layer (measured: 1.6e-7 to 3.2e-7)."""

MIN_SHARE = 0.9
"""At least this share of a layer's FLOPs must lie inside Superopt regions (issue 40: Llama and Qwen2)."""


def _first(y):
    return y[0] if isinstance(y, tuple) else y


def _superopt_ops(opt) -> int:
    return sum(1 for gm in opt.graph_modules for n in gm.graph.nodes if str(n.target).startswith("superopt."))


@pytest.mark.parametrize("block", list(HF_BLOCKS))
def test_block_maps_whole_and_matches_eager(block: str, capsys: pytest.CaptureFixture) -> None:
    m, args, kwargs = HF_BLOCKS[block]()
    opt = pyrunner.optimize(m, *args, executor="reference", progress=False, **kwargs)
    with capsys.disabled():
        print(f"\n{block}: {100 * opt.report.flop_share:.1f}% of {opt.report.flops_total:,} FLOPs in regions "
              f"(reference executor)\n{opt.report}")
    assert not opt.report.fallbacks, opt.report.fallbacks
    assert opt.report.flop_share >= MIN_SHARE
    assert _superopt_ops(opt) == len(opt.report.regions) >= 1  # the regions really replaced the ops
    with torch.no_grad():
        want, got = _first(m(*args, **kwargs)), _first(opt(*args, **kwargs))
    assert got.shape == want.shape and got.dtype == want.dtype
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= FP32_VS_F64, err


def _planned(block: str, capsys: pytest.CaptureFixture) -> None:
    m, args, kwargs = HF_BLOCKS[block]()
    opt = pyrunner.optimize(m, *args, executor="plan", dtype="bfloat16", progress=False, **kwargs)
    with capsys.disabled():
        print(f"\n{block}: {100 * opt.report.flop_share:.1f}% of FLOPs in planned regions (bfloat16)\n{opt.report}")
    assert not opt.report.fallbacks, opt.report.fallbacks
    assert opt.report.flop_share >= MIN_SHARE
    for c in opt.report.regions:
        assert c.decision == "planned" and c.plan is not None and c.plan.kernels
        assert c.check.startswith("CPU-checked")
    assert any("no CUDA GPU" in n for n in opt.report.notes)
    with torch.no_grad():  # PyTorch runs the layer: its own values
        assert torch.equal(_first(opt(*args, **kwargs)), _first(m(*args, **kwargs)))


@pytest.mark.parametrize("block", ["llama", "qwen2"])
def test_block_plans_on_the_cpu_path(block: str, capsys: pytest.CaptureFixture) -> None:
    """Every region of the layer has a plan that passes the CPU executor's float64 check (~25 s each)."""
    _planned(block, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["gpt2", "gemma2"])
def test_other_blocks_plan_on_the_cpu_path(block: str, capsys: pytest.CaptureFixture) -> None:
    """As above for GPT-2 and Gemma2 (~35 s each of planning on a small CPU: marked slow)."""
    _planned(block, capsys)
