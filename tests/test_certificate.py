"""Certified derivations: every plan's certificate replays, and wrong certificates do not.

``validate`` replays a plan's derivation from its graph (``pyrunner.rules.replay_plan``): each step
at its position with its instantiation, the recorded results and the derived graph compared, the
kernels' terms composed to it. Here: plans of the catalog, the corpus and random graphs replay
(the planner's own check would skip one that did not, so a "planner bug" warning fails the test
too); each rule's replay refuses a term outside its side condition; and mutated certificates
(wrong position, instantiation, term, order, a kernel's constant or mask) are all rejected.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from pathlib import Path

import pytest
from certificate_mutations import accepted, mutations
from graph_strategies import seeded_graph_doc
from plan_cache import search

from pyrunner.errors import PlanError
from pyrunner.ir import catalog
from pyrunner.ir.graph import LOG2E, binary, const, inp, matmul, reduce, unary
from pyrunner.ir.graph_json import graph_from_json, load_graph_file
from pyrunner.plan.schema import Plan, plan_document
from pyrunner.plan.validate import validate_plan
from pyrunner.rules.registry import ALGEBRAIC_RULE_NAMES, RULES
from pyrunner.rules.replay import RULE_REPLAYS, Inst, ReplayError, instantiate, replay

ROOT = Path(__file__).resolve().parents[1]
TINY = {"h": 2, "t_q": 64, "t_kv": 64, "d": 32, "m": 64, "n": 64, "kv_h": 2, "group": 2}
CORPUS = sorted((ROOT / "tests" / "data").glob("*.json")) + sorted((ROOT / "benchmarks" / "graphs").glob("*.json"))
FAST_CORPUS = ("softmax_rows", "matmul_chain_three", "norm_l1_rows", "reduce_logsumexp", "linear_attention",
               "gated_swiglu_linear_layout", "variance_rows_d1000")


def _tiny(name: str):
    g = catalog.get(name)
    return g.with_sizes({a: n for a, n in TINY.items() if a in g.sizes})


def _plans(graph, caplog, top: int = 1) -> list[Plan]:
    with caplog.at_level(logging.WARNING):
        plans = search(graph, "fp16", top=top, tuning=False)
    bugs = [r.getMessage() for r in caplog.records if "planner bug" in r.getMessage()]
    assert not bugs, bugs[0]
    return plans


def _replays(plan: Plan) -> None:
    doc = plan_document(plan)
    assert doc["certificate"]["kernels"] and len(doc["certificate"]["derived"]) == len(doc["graph"]["outputs"])
    algebraic = [s for s in doc["derivation"] if s["rule"] in RULE_REPLAYS]
    assert all("position" in s and "instance" in s and "term" in s for s in algebraic)
    validate_plan(doc)


def test_rule_tables_agree() -> None:
    """Every algebraic rule of the registry has a replay, and nothing else does."""
    assert set(RULE_REPLAYS) == set(ALGEBRAIC_RULE_NAMES)


@pytest.mark.parametrize("name", list(catalog.CATALOG))
def test_catalog_plans_replay(name: str, caplog) -> None:
    for plan in _plans(_tiny(name), caplog, top=2):
        _replays(plan)


@pytest.mark.parametrize("stem", FAST_CORPUS)
def test_corpus_sample_replays(stem: str, caplog) -> None:
    path = next(p for p in CORPUS if p.stem == stem)
    _replays(_plans(load_graph_file(path), caplog)[0])


@pytest.mark.parametrize("seed", range(1, 7))
def test_random_graphs_replay(seed: int, caplog) -> None:
    _replays(_plans(graph_from_json(seeded_graph_doc(seed)), caplog)[0])


@pytest.mark.slow
@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_whole_corpus_replays(path: Path, caplog) -> None:
    _replays(_plans(load_graph_file(path), caplog)[0])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, *range(7, 51)])
def test_fifty_random_graphs_replay(seed: int, caplog) -> None:
    _replays(_plans(graph_from_json(seeded_graph_doc(seed)), caplog)[0])


# --- each rule's replay checks its side condition --------------------------------------------

X = inp("X", ("m", "k"))
W = inp("W", ("k", "n"))
R = inp("R", ("m",))
RK = inp("RK", ("m", "k"))


def _refused(rule: str, t, inst: Inst, why: str) -> None:
    with pytest.raises(ReplayError, match=why):
        replay(rule, t, inst)


def test_matmul_scale_rules_need_a_factor_constant_along_the_contraction() -> None:
    ok = matmul(binary("div", X, R), W, "k")
    assert replay("matmul_div_commute", ok, Inst(scale=R, choice=(0,))) == binary("div", matmul(X, W, "k"), R)
    _refused("matmul_div_commute", matmul(binary("div", X, RK), W, "k"), Inst(scale=RK, choice=(0,)), "axis 'k'")
    _refused("matmul_row_scale_commute", matmul(binary("mul", X, RK), W, "k"), Inst(scale=RK, choice=(0, 1, 0)),
             "axis 'k'")
    _refused("sum_scale_commute", reduce("sum", binary("mul", X, RK), "k"),
             Inst(axis="k", fn="mul", scale=RK, choice=(1, 0)), "axis 'k'")


def test_exp_to_exp2_needs_the_exact_constant() -> None:
    t = unary("exp", X)
    assert replay("exp_to_exp2", t, Inst(constant=LOG2E)) == unary("exp2", binary("mul", X, const(LOG2E)))
    _refused("exp_to_exp2", t, Inst(constant=math.log2(math.e) * (1 + 2**-40)), "exactly")


def test_scaled_shift_needs_a_positive_constant_and_its_axis() -> None:
    def softmax(x):
        e = unary("exp", x)
        return binary("div", e, reduce("sum", e, "k"))

    good = softmax(binary("mul", X, const(0.5)))
    assert replay("softmax_scaled_max_shift", good, Inst(axis="k", fn="exp", scale=const(0.5), choice=(1,)))
    _refused("softmax_scaled_max_shift", softmax(binary("mul", X, const(-0.5))),
             Inst(axis="k", fn="exp", scale=const(-0.5), choice=(1,)), "positive")
    _refused("softmax_max_shift", softmax(X), Inst(axis="m", fn="exp"), "sum over 'm'")


def test_matmul_assoc_needs_its_axes() -> None:
    a, b, c = inp("A", ("i", "j")), inp("B", ("j", "k")), inp("C", ("k", "l"))
    t = matmul(matmul(a, b, "j"), c, "k")
    inst = instantiate("matmul_assoc", t, RULES["matmul_assoc"].apply(t))
    assert inst is not None
    bad = matmul(matmul(a, inp("B2", ("j", "k")), "j"), inp("C2", ("j", "k", "l")), "k")
    _refused("matmul_assoc", bad, inst, "inner contraction")


def test_instances_have_one_spelling() -> None:
    """A field the rule does not read, or one more operand choice, is refused (so a certificate is
    never accepted under an edit that changes nothing it checks)."""
    t = reduce("mean", X, "k")
    _refused("mean_to_sum_div", t, Inst(axis="k", fn="exp"), "does not read")
    _refused("mean_to_sum_div", t, Inst(axis="k", choice=(0,)), "operand choice")


def test_product_rebuild_checks_the_factors() -> None:
    a, b, c = inp("A", ("m",)), inp("B", ("m",)), inp("C", ("m",))
    t = binary("mul", a, binary("mul", b, c))
    assert replay("elementwise_mul_assoc", t, Inst(factors=((0,), (1, 0), (1, 1)))) == \
        binary("mul", binary("mul", a, b), c)
    _refused("elementwise_mul_assoc", t, Inst(factors=((0,), (1, 0))), "leaves")
    _refused("elementwise_mul_assoc", binary("add", a, b), Inst(factors=((0,), (1,))), "not a mul")
    _refused("elementwise_mul_comm", t, Inst(factors=((0,), (1, 0), (1, 1)), choice=(0, 0, 1)), "permutation")


# --- the plan as a whole -----------------------------------------------------------------------

def _doc(name: str, caplog) -> dict:
    doc = plan_document(_plans(_tiny(name), caplog)[0])
    doc["provenance"]["plan_hash"] = ""
    return doc


def test_issue_42_edits_are_rejected(caplog) -> None:
    """The edits issue 42 found accepted: rules of steps 0 and 1 swapped, step 1 moved to step 0's
    sub-term, the first step removed (Attention); the window width edited (SlidingWindowAttention)."""
    doc = _doc("Attention", caplog)
    validate_plan(doc)
    swapped = copy.deepcopy(doc)
    d = swapped["derivation"]
    d[0]["rule"], d[1]["rule"] = d[1]["rule"], d[0]["rule"]
    moved = copy.deepcopy(doc)
    moved["derivation"][1]["position"] = doc["derivation"][0]["position"]
    removed = copy.deepcopy(doc)
    del removed["derivation"][0]
    for bad in (swapped, moved, removed):
        with pytest.raises(PlanError, match=r"derivation\[[01]\]"):
            validate_plan(bad)
    doc = _doc("SlidingWindowAttention", caplog)
    validate_plan(doc)
    text = json.dumps(doc["kernels"][0])
    assert "1024.0" in text
    edited = copy.deepcopy(doc)
    edited["kernels"][0] = json.loads(text.replace("1024.0", "1000000000.0"))
    with pytest.raises(PlanError, match="kernels\\[0\\]"):
        validate_plan(edited)


def test_derivation_without_certificate_is_refused(caplog) -> None:
    doc = _doc("Attention", caplog)
    del doc["certificate"]
    with pytest.raises(PlanError, match="no certificate"):
        validate_plan(doc)


def test_plan_documents_keep_older_plans_byte_identical(caplog) -> None:
    """Certificate fields appear only where set, so a plan written before them hashes as it did."""
    doc = _doc("Matmul", caplog)
    del doc["certificate"]
    for st in doc["derivation"]:
        for key in ("position", "instance", "term"):
            st.pop(key, None)
    assert plan_document(Plan.model_validate(doc)) == doc


def _mutation_count(names: list[str], caplog, graphs: tuple = (), at_least: int = 0) -> tuple[int, list[str]]:
    """Mutations of the named catalog plans, then of the graphs' plans until ``at_least`` were made."""
    total, wrong = 0, []
    docs = [(name, lambda name=name: _doc(name, caplog)) for name in names]
    docs += [(g.name, lambda g=g: _graph_doc(g, caplog)) for g in graphs]
    for name, make in docs:
        if at_least and total >= at_least:
            break
        for label, bad in mutations(make()):
            total += 1
            if accepted(bad, validate_plan):
                wrong.append(f"{name}: {label}")
    return total, wrong


def _graph_doc(g, caplog) -> dict:
    doc = plan_document(_plans(g, caplog)[0])
    doc["provenance"]["plan_hash"] = ""
    return doc


def test_mutated_certificates_are_rejected(caplog) -> None:
    total, wrong = _mutation_count(["Attention", "SlidingWindowAttention", "RMSNorm", "LayerNormMatmul"], caplog)
    assert total >= 150 and not wrong, (total, wrong[:5])


@pytest.mark.slow
def test_a_thousand_mutated_certificates_are_rejected(caplog) -> None:
    graphs = tuple(graph_from_json(seeded_graph_doc(seed)) for seed in range(1, 40))
    total, wrong = _mutation_count(list(catalog.CATALOG), caplog, graphs, at_least=1000)
    assert total >= 1000 and not wrong, (total, wrong[:5])


def test_lean_replay_rules_are_algebraic_rules() -> None:
    """The Lean replay (Superopt/Replay.lean, Superopt/Certificate.lean) names only algebraic rules of
    the registry, and the certificate fields it reads are the schema's."""
    import re

    replay_src = (ROOT / "Superopt" / "Replay.lean").read_text()
    cert_src = (ROOT / "Superopt" / "Certificate.lean").read_text()
    names = set(re.findall(r'=> "(\w+)"', replay_src.split("def Rule.name")[1].split("/-!")[0]))
    parsed = set(re.findall(r'\|\s+"(\w+)", ', cert_src.split("def buildRule")[1].split("def constIsLog2e")[0]))
    covered = set(re.findall(r'"(\w+)"', cert_src.split("def leanRules")[1].split("/--")[0]))
    assert names and names <= set(ALGEBRAIC_RULE_NAMES) and parsed == names == covered
    # every algebraic rule, the product rebuilds included, has a Lean rule instance and Rule.apply_sound
    assert names == set(ALGEBRAIC_RULE_NAMES)
    fields = set(re.findall(r'getObjValD "(\w+)"', cert_src)) | set(re.findall(r'j[A-Z]\w* \w+ "(\w+)"', cert_src))
    from pyrunner.plan.certificate import Certificate, Instance, KernelTerms, Position, TermNode
    from pyrunner.plan.schema import Kernel, Plan, Step

    known = set()
    for model in (Certificate, Instance, KernelTerms, Position, TermNode, Kernel, Plan, Step):
        known |= set(model.model_fields)
    assert fields <= known, sorted(fields - known)


# --- masked_tile_skip's side condition, re-checked by validate ---------------------------------

def _masked_row_sum(hidden: float):
    """out[t_q] = sum over t_kv of X where t_kv <= t_q, else ``hidden``."""
    from pyrunner.ir.graph import Graph, iota, where

    x = inp("X", ("t_q", "t_kv"))
    body = where(binary("le", iota("t_kv"), iota("t_q")), x, const(hidden))
    return Graph("masked_row_sum", {"t_q": 1024, "t_kv": 4096}, (("out", reduce("sum", body, "t_kv")),))


def _looped(doc: dict) -> dict:
    return next(k for k in doc["kernels"] if k.get("loop") and k["loop"]["axis"] == "t_kv")


CAUSAL = {"kind": "call", "fn": "le", "args": [{"kind": "index", "axis": "t_kv"}, {"kind": "index", "axis": "t_q"}]}


def test_a_loop_skips_only_tiles_whose_masked_elements_add_nothing(caplog) -> None:
    """Masked with 0 (a sum's identity) the planner skips the all-false tiles and validate accepts it;
    masked with 1, a plan hand-edited to skip them is refused (the hidden elements still count), by the
    Python check alone: no Lean involved."""
    skipping = plan_document(_plans(_masked_row_sum(0.0), caplog)[0])
    assert _looped(skipping)["loop"].get("visible") is not None
    validate_plan(skipping)

    doc = plan_document(_plans(_masked_row_sum(1.0), caplog)[0])
    doc["provenance"]["plan_hash"] = ""
    validate_plan(copy.deepcopy(doc))
    assert _looped(doc)["loop"].get("visible") is None
    _looped(doc)["loop"]["visible"] = CAUSAL
    with pytest.raises(PlanError, match="masked_tile_skip's side condition"):
        validate_plan(doc)
