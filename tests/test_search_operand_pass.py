"""The partition search's second pass (computed GEMM operands as cuts) gets a share of the budget.

A decoder layer's region (causal attention, its output projection, residual, LayerNorm, a GELU-tanh
FFN, residual) has 57 derivation variants; the first pass used to spend the whole work budget on them,
so the operand pass never ran and the FFN GEMMs recomputed LayerNorm and GELU-tanh in their main loops
from float32 tensors (issue 40: GPT-2-medium's layer, 8 kernels, 128.7 us modelled, 319 us measured).
"""

from __future__ import annotations

from pyrunner.ir.graph_json import graph_from_json
from pyrunner.planner.search import MAX_WORK, OPERAND_PASS_SHARE, Budget, Planner, search

_N = [{"name": "t1", "op": "iota", "axis": "l"}, {"name": "t2", "op": "iota", "axis": "j"},
      {"name": "t3", "op": "le", "args": ["t1", "t2"]},
      {"name": "t4", "op": "matmul", "args": ["in0", "in1"], "contract": "k"},
      {"name": "t5", "op": "mul", "args": ["t4", 0.125]},
      {"name": "t6", "op": "where", "args": ["t3", "t5", "-inf"]},
      {"name": "t7", "op": "exp", "args": ["t6"]}, {"name": "t8", "op": "sum", "args": ["t7"], "axis": "l"},
      {"name": "t9", "op": "div", "args": ["t7", "t8"]},
      {"name": "t10", "op": "matmul", "args": ["t9", "in2"], "contract": "l"},
      {"name": "t11", "op": "matmul", "args": ["t10", "in3"], "contract": "m"},
      {"name": "t12", "op": "sum", "args": ["t11"], "axis": "i"},
      {"name": "t13", "op": "add", "args": ["t12", "in4"]}, {"name": "t14", "op": "add", "args": ["t13", "in5"]},
      {"name": "t15", "op": "mean", "args": ["t14"], "axis": "n"},
      {"name": "t16", "op": "sub", "args": ["t14", "t15"]}, {"name": "t17", "op": "square", "args": ["t16"]},
      {"name": "t18", "op": "mean", "args": ["t17"], "axis": "n"},
      {"name": "t19", "op": "add", "args": ["t18", 1e-05]}, {"name": "t20", "op": "rsqrt", "args": ["t19"]},
      {"name": "t21", "op": "mul", "args": ["t16", "t20"]}, {"name": "t22", "op": "mul", "args": ["t21", "in6"]},
      {"name": "t23", "op": "add", "args": ["t22", "in7"]},
      {"name": "t24", "op": "matmul", "args": ["t23", "in8"], "contract": "n"},
      {"name": "t25", "op": "add", "args": ["t24", "in9"]}, {"name": "t26", "op": "mul", "args": [0.5, "t25"]},
      {"name": "t27", "op": "square", "args": ["t25"]}, {"name": "t28", "op": "mul", "args": ["t25", "t27"]},
      {"name": "t29", "op": "mul", "args": [0.044715, "t28"]}, {"name": "t30", "op": "add", "args": ["t25", "t29"]},
      {"name": "t31", "op": "mul", "args": [0.7978845608028654, "t30"]}, {"name": "t32", "op": "tanh", "args": ["t31"]},
      {"name": "t33", "op": "add", "args": [1, "t32"]}, {"name": "t34", "op": "mul", "args": ["t26", "t33"]},
      {"name": "t35", "op": "matmul", "args": ["t34", "in10"], "contract": "p"},
      {"name": "t36", "op": "add", "args": ["t35", "in11"]}, {"name": "out0", "op": "add", "args": ["t14", "t36"]}]
LAYER = {"name": "decoder_layer", "axes": {"i": 16, "j": 1024, "k": 64, "l": 1024, "m": 64, "n": 1024, "p": 4096},
         "inputs": {"in0": ["i", "j", "k"], "in1": ["i", "l", "k"], "in2": ["i", "l", "m"], "in3": ["i", "m", "n"],
                    "in4": ["n"], "in5": ["j", "n"], "in6": ["n"], "in7": ["n"], "in8": ["n", "p"], "in9": ["p"],
                    "in10": ["p", "n"], "in11": ["n"]},
         "nodes": _N, "outputs": ["out0"]}
"""The region the backend cuts from GPT-2-medium's layer after the QKV projection (heads i, tokens j,
head dim k = m, hidden n, FFN p), as ``benchmarks/hf_regions.py --out`` writes it."""


def test_layer_stores_the_norm_and_the_activation_as_bf16_gemm_operands() -> None:
    """With the default budget, the FFN's two GEMMs read the LayerNorm output and the GELU output as
    bf16 tensors written once, instead of recomputing both in their main loops from float32 ones."""
    plan = search(graph_from_json(LAYER), "bf16")[0]
    inter = {tuple(t.axes): t.dtype for t in plan.tensors if t.role == "intermediate"}
    assert inter.get(("j", "p")) == "bfloat16", inter  # the GELU output, the down projection's operand
    assert inter.get(("j", "n")) == "bfloat16", inter  # the LayerNorm output, the up projection's operand
    assert not any("tanh" in repr(k.body) or "tanh" in repr(k.prologue) for k in plan.kernels
                   if k.loop is not None and k.loop.axis == "p"), "GELU recomputed in the down projection's loop"
    assert len(plan.kernels) <= 7 and plan.cost.total_us < 110.0, (len(plan.kernels), plan.cost.total_us)


def test_the_operand_pass_runs_on_its_own_share_after_the_first_pass_spent_the_budget() -> None:
    """The first pass spends the budget as before (no plan of it is lost); the operand pass then gets its share."""
    planner = Planner(graph_from_json(LAYER), "bf16")
    seen: list[tuple[bool, int]] = []
    explore = planner._explore

    def spy(v, budget, operands=False):
        seen.append((operands, budget.left))
        return explore(v, budget, operands)

    planner._explore = spy
    planner.candidates(budget=Budget())
    first = [left for operands, left in seen if not operands]
    second = [left for operands, left in seen if operands]
    assert second, "the operand pass never ran"
    assert min(first) < MAX_WORK * OPERAND_PASS_SHARE  # this graph's first pass spends most of the budget
    assert second[0] >= MAX_WORK * OPERAND_PASS_SHARE


def test_a_grant_adds_work_from_zero() -> None:
    b = Budget(work=100)
    assert not b.spend(130) and b.exhausted()
    b.grant(25)
    assert not b.exhausted() and b.left == 25
    assert b.spend(25) and b.exhausted()
