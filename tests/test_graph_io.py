"""Graph JSON: a user's own operator loads, type-checks and evaluates; every bad document is one GraphError."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from json_mutation import json_values, mutated_documents

from pyrunner.errors import GraphError, UserError
from pyrunner.ir import catalog as workloads
from pyrunner.ir.graph import check, result_axes
from pyrunner.ir.graph_json import graph_from_json, graph_to_json, load_graph_file
from pyrunner.ir.reference import evaluate, random_inputs

DATA = Path(__file__).parent / "data"
MIXTURE = DATA / "gated_mixture.json"


def test_custom_operator_matches_numpy() -> None:
    g = load_graph_file(MIXTURE)
    check(g)
    assert g.name == "GatedMixture" and g.sizes == {"m": 8, "d": 6, "n": 5, "e": 3}
    assert [n for n, _ in g.outputs] == ["R", "M", "Mx", "Out"]
    assert [result_axes(t) for _, t in g.outputs] == [("m",), ("m", "n"), ("m",), ("m", "d")]
    x = random_inputs(g, seed=3)
    got = evaluate(g, x)

    X, W1, W2, Wg, We = (x[k] for k in ("X", "W1", "W2", "Wg", "We"))
    gate = np.maximum(X @ W1, 0.0) * (1.0 / (1.0 + np.exp(-(X @ W2))))
    logits = X @ Wg
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    mix = probs @ We
    centered = X - X.mean(axis=1, keepdims=True)
    ln = centered / np.sqrt((centered**2).mean(axis=1, keepdims=True) + 1e-5)
    rms = X / np.sqrt((X**2).mean(axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(got["R"], gate.sum(axis=1), rtol=1e-12)
    np.testing.assert_allclose(got["M"], mix, rtol=1e-12)
    np.testing.assert_allclose(got["Mx"], mix.max(axis=1), rtol=1e-12)
    np.testing.assert_allclose(got["Out"], np.maximum(ln / np.sqrt(6.0) + 0.25, rms), rtol=1e-12)


def test_labels_are_node_names() -> None:
    g = load_graph_file(MIXTURE)
    names = set(g.labels.values())
    assert {"H1", "AB", "G", "Ln", "Out"} <= names
    assert "unused" not in names  # dead nodes are dropped with their labels


@pytest.mark.parametrize("name", sorted(workloads.CATALOG))
def test_round_trip_catalog(name: str) -> None:
    g = workloads.get(name)
    data = graph_to_json(g)
    again = graph_from_json(json.loads(json.dumps(data)))
    assert again == g and again.sizes == g.sizes
    assert graph_to_json(again) == data
    ops = {n["op"] for n in data["nodes"]}
    assert not ops & {"softmax", "rmsnorm", "layernorm"}  # primitives only


def test_round_trip_custom_and_output_alias() -> None:
    g = load_graph_file(MIXTURE)
    data = graph_to_json(g)
    assert {"name": "Out", "node": "Y"} not in data["outputs"]  # Y's label became Out
    again = graph_from_json(data)
    assert again == g and graph_to_json(again) == data
    same = g.with_outputs(g.outputs + (("Again", g.outputs[0][1]),))
    data = graph_to_json(same)
    assert data["outputs"][-1] == {"name": "Again", "node": "R"}
    assert graph_from_json(data) == same


def _base() -> dict:
    return json.loads(MIXTURE.read_text())


def _node(d: dict, name: str) -> dict:
    return next(n for n in d["nodes"] if n["name"] == name)


def _swap_nodes(d: dict) -> None:
    d["nodes"][0], d["nodes"][2] = d["nodes"][2], d["nodes"][0]


BAD = [
    ("not a dict", lambda d: ["x"], "a graph must be a JSON object, got list"),
    ("missing field", lambda d: d.pop("outputs"), "graph is missing field 'outputs'"),
    ("extra field", lambda d: d.update(extra=1), "graph has unknown field 'extra'"),
    ("name type", lambda d: d.update(name=3), "graph field 'name': expected a non-empty string, got number 3"),
    ("axes type", lambda d: d.update(axes=[8, 6]), "graph field 'axes': expected an object"),
    ("non-numeric size", lambda d: d["axes"].update(m="eight"), "axes.m: size must be a positive integer, got string"),
    ("fractional size", lambda d: d["axes"].update(m=2.5), "axes.m: size must be a positive integer"),
    ("zero size", lambda d: d["axes"].update(m=0), "axes.m: size must be a positive integer, got 0"),
    ("bool size", lambda d: d["axes"].update(m=True), "axes.m: size must be a positive integer, got boolean"),
    ("input axes type", lambda d: d["inputs"].update(X="m,d"), "inputs.X: expected a list of axis names"),
    ("input unknown axis", lambda d: d["inputs"].update(X=["m", "q"]), "inputs.X: unknown axis 'q'"),
    ("input repeated axis", lambda d: d["inputs"].update(X=["m", "m"]), "inputs.X: repeats an axis"),
    ("nodes type", lambda d: d.update(nodes={}), "graph field 'nodes': expected a list, got object"),
    ("node type", lambda d: d["nodes"].insert(0, "H1"), "nodes[0]: expected an object, got string"),
    ("node without name", lambda d: d["nodes"][0].pop("name"), "nodes[0] field 'name': expected a non-empty string"),
    ("unknown op", lambda d: _node(d, "A").update(op="hadamard"), "node 'A' (nodes[2]): unknown op 'hadamard'"),
    ("missing op", lambda d: _node(d, "A").pop("op"), "node 'A' (nodes[2]): unknown op None"),
    ("unknown field", lambda d: _node(d, "A").update(axis="n"), "node 'A' (nodes[2]): unknown field 'axis' for op"),
    ("unary arity", lambda d: _node(d, "A").update(args=["H1", "H2"]), "op 'relu' takes 1 operand(s), got 2"),
    ("binary arity", lambda d: _node(d, "AB").update(args=["A"]), "node 'AB' (nodes[4]): op 'mul' takes 2 operand(s)"),
    ("args type", lambda d: _node(d, "AB").update(args="A"), "node 'AB' (nodes[4]): field 'args' must be a list"),
    ("missing args", lambda d: _node(d, "AB").pop("args"), "field 'args' must be a list of 2 operand(s), got nothing"),
    ("operand type", lambda d: _node(d, "AB").update(args=["A", True]), "node 'AB' (nodes[4]) args[1]: an operand"),
    ("operand object", lambda d: _node(d, "AB").update(args=["A", {"x": 1}]), "got object"),
    ("undefined", lambda d: _node(d, "AB").update(args=["A", "Q"]),
     "node 'AB' (nodes[4]) args[1]: refers to undefined 'Q'"),
    ("forward reference", _swap_nodes, "node 'A' (nodes[0]) args[0]: refers to 'H1', which is defined later"),
    ("self reference", lambda d: _node(d, "A").update(args=["A"]),
     "node 'A' (nodes[2]) args[0]: node refers to itself"),
    ("duplicate node", lambda d: _node(d, "B").update(name="A"),
     "node 'A' (nodes[3]): name 'A' is already used by an earlier node"),
    ("node named as input", lambda d: _node(d, "A").update(name="X"), "name 'X' is already used by an input"),
    ("reduce unknown axis", lambda d: _node(d, "R").update(axis="z"),
     "node 'R' (nodes[5]): field 'axis' names unknown axis 'z'"),
    ("reduce axis type", lambda d: _node(d, "R").update(axis=1), "field 'axis' names unknown axis 1"),
    ("reduce missing axis", lambda d: _node(d, "R").pop("axis"), "node 'R' (nodes[5]): missing field 'axis'"),
    ("reduce axis absent", lambda d: _node(d, "R").update(axis="d"),
     "node 'R' (nodes[5]): reduces over axis 'd', but its operand has axes ['m', 'n']"),
    ("matmul contract", lambda d: _node(d, "H1").update(contract="n"), "node 'H1' (nodes[0]): contracts axis 'n'"),
    ("matmul missing contract", lambda d: _node(d, "H1").pop("contract"),
     "node 'H1' (nodes[0]): missing field 'contract'"),
    ("softmax axis", lambda d: _node(d, "G").update(axis="n"), "node 'G' (nodes[7]): softmax over axis 'n'"),
    ("eps type", lambda d: _node(d, "Ln").update(eps="small"),
     "node 'Ln' (nodes[12]): field 'eps' must be a finite number"),
    ("const value", lambda d: _node(d, "c").update(value="x"),
     "node 'c' (nodes[11]): field 'value' must be a finite number"),
    ("const missing", lambda d: _node(d, "c").pop("value"), "node 'c' (nodes[11]): missing field 'value'"),
    ("nullary with operands", lambda d: _node(d, "k").update(args=["X"]),
     "node 'k' (nodes[10]): op 'size' takes no operands, got args"),
    ("size axis", lambda d: _node(d, "k").update(axis="q"),
     "node 'k' (nodes[10]): field 'axis' names unknown axis 'q'"),
    ("outputs empty", lambda d: d.update(outputs=[]), "graph field 'outputs': expected a non-empty list"),
    ("output undefined", lambda d: d["outputs"].append("Q"), "outputs[4]: names undefined node 'Q'"),
    ("output twice", lambda d: d["outputs"].append("R"), "outputs[4]: output 'R' is listed twice"),
    ("output scalar", lambda d: d["outputs"].append("k"), "outputs[4]: output 'k' is a scalar"),
    ("output alias field", lambda d: d["outputs"].append({"name": "Z", "of": "R"}), "outputs[4]: unknown field 'of'"),
    ("output type", lambda d: d["outputs"].append(7), "outputs[4]: expected a non-empty string, got number 7"),
    ("max without axis", lambda d: _node(d, "Mx").pop("axis"),
     "node 'Mx' (nodes[9]): op 'max' takes 2 operand(s), got 1"),
]


@pytest.mark.parametrize("case,mutate,fragment", BAD, ids=[c[0] for c in BAD])
def test_bad_graphs(case: str, mutate, fragment: str) -> None:
    data = _base()
    replaced = mutate(data)
    with pytest.raises(GraphError) as e:
        graph_from_json(replaced if case == "not a dict" else data)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match="graph file .* does not exist"):
        load_graph_file(tmp_path / "missing.json")
    bad = tmp_path / "g.json"
    bad.write_text("{'name': 1}")
    with pytest.raises(GraphError, match="not valid JSON: Expecting property name"):
        load_graph_file(bad)
    bad.write_text(json.dumps({**_base(), "axes": {"m": 8}}))
    with pytest.raises(GraphError, match=r"graph file '.*g.json': inputs.X: unknown axis 'd'"):
        load_graph_file(bad)


# --- property: only GraphError escapes ------------------------------------------------

_BASES = [_base()] + [graph_to_json(workloads.get(n)) for n in ("Attention", "RMSNormMLP")]
_NAMES = ["X", "H1", "A", "m", "d", "n", "axis", "args", "op", "sum", "max", "softmax", "contract", "Q"]


def mutated_graphs() -> st.SearchStrategy:
    return mutated_documents(_BASES, _NAMES)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_graphs())
def test_mutated_graphs_raise_only_graph_errors(data: object) -> None:
    try:
        g = graph_from_json(data)
    except GraphError as e:
        assert str(e) and "\n" not in str(e)
    else:
        check(g)
        assert graph_from_json(graph_to_json(g)) == g


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_random_json_graphs(data: object) -> None:
    with pytest.raises(UserError):
        graph_from_json(data)


def test_show_handles_equal_but_distinct_subterms() -> None:
    """Two structurally equal subterms built separately (QK-norm attention normalises Q and K alike):
    ``show`` once failed with a KeyError on the second, breaking ``export``."""
    from pyrunner.ir.graph import show
    from pyrunner.ir.graph_json import graph_from_json, read_json_file

    doc = read_json_file(Path(__file__).parent / "data" / "attention_qk_norm.json", "graph file", GraphError)
    g = graph_from_json(doc)
    text = show(g.outputs[0][1])
    assert "@d" in text and "rsqrt" in text


def test_an_output_that_repeats_a_value_keeps_its_name_from_other_nodes() -> None:
    """rmsnorm(X) under two output names: the generated names of its inner nodes must not take the
    second output's name (the JSON would then name two things alike; found by the random-graph test)."""
    doc = {"name": "G", "axes": {"m": 64, "f0": 64}, "inputs": {"X0": ["m", "f0"]},
           "nodes": [{"name": "t1", "op": "rmsnorm", "args": ["X0"], "axis": "f0"},
                     {"name": "t4", "op": "rmsnorm", "args": ["X0"], "axis": "f0"}],
           "outputs": ["t4", "t1"]}
    g = graph_from_json(doc)
    again = graph_from_json(graph_to_json(g))
    assert again.outputs == g.outputs


def test_a_scalar_output_is_stored_over_a_unit_axis() -> None:
    """A loss (a mean over every axis) is one element over a new axis of extent 1, of exactly the
    scalar's value; the name is fresh where the author's axes hold 'unit' already, and survives a
    round trip; a scalar that reads no input is still refused."""
    doc = {"name": "MSE", "axes": {"m": 6, "unit": 5},
           "inputs": {"X": ["m", "unit"], "T": ["m", "unit"]},
           "nodes": [{"name": "d", "op": "sub", "args": ["X", "T"]},
                     {"name": "d2", "op": "square", "args": ["d"]},
                     {"name": "r", "op": "mean", "args": ["d2"], "axis": "unit"},
                     {"name": "L", "op": "mean", "args": ["r"], "axis": "m"}],
           "outputs": ["L", "r"]}
    g = graph_from_json(doc)
    assert g.sizes == {"m": 6, "unit": 5, "unit_2": 1}
    assert [(n, result_axes(t)) for n, t in g.outputs] == [("L", ("unit_2",)), ("r", ("m",))]
    x = random_inputs(g, seed=5)
    got = evaluate(g, x)
    np.testing.assert_allclose(got["L"], [((x["X"] - x["T"]) ** 2).mean()], rtol=1e-12)
    assert graph_from_json(json.loads(json.dumps(graph_to_json(g)))) == g
    doc["nodes"].append({"name": "k", "op": "size", "axis": "m"})
    doc["outputs"].append("k")
    with pytest.raises(GraphError, match="output 'k' is a scalar that reads no input"):
        graph_from_json(doc)


def test_nullary_ops_accept_an_empty_operand_list() -> None:
    """A generic writer emits ``"args": []`` for every node; size, const and iota take it as no operands."""
    doc = {"name": "EmptyArgs", "axes": {"m": 8, "n": 4}, "inputs": {"X": ["m", "n"]},
           "nodes": [{"name": "i", "op": "iota", "axis": "n", "args": []},
                     {"name": "c", "op": "const", "value": 2.0, "args": []},
                     {"name": "k", "op": "size", "axis": "n", "args": []},
                     {"name": "Y", "op": "add", "args": ["X", "i"]},
                     {"name": "Z", "op": "mul", "args": ["Y", "c"]},
                     {"name": "W", "op": "div", "args": ["Z", "k"]}],
           "outputs": ["W"]}
    without = json.loads(json.dumps(doc))
    for node in without["nodes"][:3]:
        node.pop("args")
    assert graph_from_json(doc).outputs == graph_from_json(without).outputs
