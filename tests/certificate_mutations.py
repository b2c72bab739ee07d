"""Wrong certificates made from right ones: each mutation applies a rule wrongly or claims a wrong term.

``mutations(doc)`` takes a certified plan document (its hash dropped, as an editor would) and yields
``(label, mutated document)`` pairs, each wrong: a step at another position (one whose sub-term
differs), another instantiation (one the rule's replay does not turn into the recorded term), a
recorded term or derived term changed, steps swapped or removed, a kernel's constant, mask or
loop predicate edited, a loop's skip removed while still cited, a loop's contraction or reduction moved
off the loop axis, a kernel's terms swapped. Positions and instantiations that happen to give
the same rewrite (a shared sub-term's other occurrence) are left out: they certify the same step.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator

from pyrunner.errors import PlanError
from pyrunner.plan.schema import Plan
from pyrunner.plan.views import merged_graph
from pyrunner.rules.registry import replace_in_graph
from pyrunner.rules.replay import RULE_REPLAYS, Inst, ReplayError, replay
from pyrunner.rules.terms_table import decode_nodes


def _inst(x: dict, terms: list) -> Inst:
    return Inst(axis=x["axis"], fn=x["fn"], scale=None if x["scale"] is None else terms[x["scale"]],
                constant=x["constant"], choice=tuple(x["choice"]), factors=tuple(tuple(p) for p in x["factors"]))


def _states(plan: Plan) -> list:
    """The graph before each algebraic step (by derivation index)."""
    terms = decode_nodes(plan.certificate.nodes)
    g = merged_graph(plan)
    out = {}
    for i, st in enumerate(plan.derivation):
        if st.rule not in RULE_REPLAYS:
            continue
        out[i] = g
        t = _follow(g, st.position.output, st.position.path)
        g = replace_in_graph(g, t, terms[st.term])
    return out


def _follow(g, output: int, path: list[int]):
    if output >= len(g.outputs):
        return None
    t = g.outputs[output][1]
    for k in path:
        if k >= len(t.args):
            return None
        t = t.args[k]
    return t


def _wrong(rule: str, t, inst_doc: dict, terms: list, want) -> bool:
    """Whether the rule under this instance does not rewrite t into ``want``."""
    if t is None:
        return True
    try:
        return replay(rule, t, _inst(inst_doc, terms)) != want
    except (ReplayError, IndexError, TypeError):
        return True


def _step_mutations(doc: dict, plan: Plan) -> Iterator[tuple[str, dict]]:
    terms = decode_nodes(plan.certificate.nodes)
    states = _states(plan)
    n_nodes = len(terms)
    for i, st in enumerate(doc["derivation"]):
        if i not in states:
            continue
        g, pos, inst = states[i], st["position"], st["instance"]
        here = _follow(g, pos["output"], pos["path"])
        want = terms[st["term"]]
        paths = [pos["path"][:-1], pos["path"] + [0], pos["path"] + [1], pos["path"][:-1] + [1 - pos["path"][-1]]
                 if pos["path"] else [2]]
        for p in paths:
            t = _follow(g, pos["output"], p)
            if t is None or t != here:
                yield f"step {i}: position {p}", _set(doc, i, "position", {"output": pos["output"], "path": p})
        if pos["output"] + 1 < 50:
            yield f"step {i}: output +1", _set(doc, i, "position", {"output": pos["output"] + 1, "path": pos["path"]})
        variants = []
        for axis in sorted(g.sizes):
            variants.append({**inst, "axis": axis})
        variants += [{**inst, "fn": f} for f in ("exp", "exp2", "mul", "div", "")]
        variants += [{**inst, "choice": c} for c in _choices(inst["choice"])]
        variants += [{**inst, "scale": s} for s in (None, 0, n_nodes - 1, (inst["scale"] or 0) + 1)]
        variants += [{**inst, "constant": c} for c in (None, 1.4426950408889634 * (1 + 2**-40), 1.0)]
        if inst["factors"]:
            variants += [{**inst, "factors": inst["factors"][::-1]}, {**inst, "factors": inst["factors"][:-1]}]
        for v in variants:
            if v != inst and (v["scale"] is None or v["scale"] < n_nodes) and _wrong(st["rule"], here, v, terms, want):
                yield f"step {i}: instance {json.dumps(v, sort_keys=True)}", _set(doc, i, "instance", v)
        for other in (st["term"] - 1, st["term"] + 1, 0):
            if 0 <= other < n_nodes and terms[other] != want:
                yield f"step {i}: term {other}", _set(doc, i, "term", other)
                break
        removed = copy.deepcopy(doc)
        del removed["derivation"][i]
        yield f"step {i}: removed", removed
        nxt = i + 1
        if nxt in states and doc["derivation"][nxt] != st and not _commute(g, st, doc["derivation"][nxt], terms):
            swapped = copy.deepcopy(doc)
            d = swapped["derivation"]
            d[i], d[nxt] = d[nxt], d[i]
            yield f"steps {i}, {nxt}: swapped", swapped
            rules = copy.deepcopy(doc)
            d = rules["derivation"]
            if d[i]["rule"] != d[nxt]["rule"]:
                d[i]["rule"], d[nxt]["rule"] = d[nxt]["rule"], d[i]["rule"]
                yield f"steps {i}, {nxt}: rules swapped", rules


def _commute(g, first: dict, second: dict, terms: list) -> bool:
    """Whether the two steps also apply in the other order, each giving its recorded term (two
    rewrites of disjoint sub-terms): swapped, they certify the same derivation."""
    for st in (second, first):
        t = _follow(g, st["position"]["output"], st["position"]["path"])
        if _wrong(st["rule"], t, st["instance"], terms, terms[st["term"]]):
            return False
        g = replace_in_graph(g, t, terms[st["term"]])
    return True


def _choices(choice: list[int]) -> list[list[int]]:
    out = [choice + [0], choice[:-1]] if choice else [[0], [1]]
    for k in range(len(choice)):
        flipped = list(choice)
        flipped[k] = 1 - flipped[k] if flipped[k] in (0, 1) else 0
        out.append(flipped)
    return out


def _set(doc: dict, i: int, key: str, value) -> dict:
    out = copy.deepcopy(doc)
    out["derivation"][i][key] = value
    return out


def _consts(expr: dict, path: tuple = ()) -> Iterator[tuple]:
    if expr.get("kind") == "const" and isinstance(expr["value"], float) and expr["value"] not in (0.0, 1.0):
        yield path
    for k, a in enumerate(expr.get("args", [])):
        yield from _consts(a, path + ("args", k))


def _index_preds(expr: dict, path: tuple = ()) -> Iterator[tuple]:
    if expr.get("kind") == "call" and expr["fn"] in ("lt", "le") and any(
            a.get("kind") == "index" for a in expr["args"]) and expr["args"][1].get("kind") != "size":
        yield path
    for k, a in enumerate(expr.get("args", [])):
        yield from _index_preds(a, path + ("args", k))


def _get(x, path: tuple):
    for k in path:
        x = x[k]
    return x


def _loop_axis_mutations(doc: dict, ki: int, k: dict) -> Iterator[tuple[str, dict]]:
    """A contraction or reduction of the loop moved off the loop axis (a fused loop over two axes)."""
    s = k["loop"]["axis"]
    other = next((g["axis"] for g in k["grid"] if g["axis"] != s), None)
    for oi, op in enumerate(k["body"]):
        field = {"gemm": "contract", "reduce": "axis"}.get(op["op"])
        if other is not None and field is not None and op[field] == s:
            out = copy.deepcopy(doc)
            out["kernels"][ki]["body"][oi][field] = other
            yield f"kernel {ki} body[{oi}]: over {other!r}, not the loop axis", out


def _kernel_mutations(doc: dict) -> Iterator[tuple[str, dict]]:
    for ki, k in enumerate(doc["kernels"]):
        for section in ("prologue", "body", "epilogue"):
            for oi, op in enumerate(k[section]):
                if op["op"] != "map":
                    continue
                for p in _consts(op["expr"]):
                    for factor in (2.0, 1e6):
                        out = copy.deepcopy(doc)
                        c = _get(out["kernels"][ki][section][oi]["expr"], p)
                        c["value"] = c["value"] * factor
                        yield f"kernel {ki} {section}[{oi}]: constant x{factor}", out
                for p in _index_preds(op["expr"]):
                    out = copy.deepcopy(doc)
                    node = _get(out["kernels"][ki][section][oi]["expr"], p)
                    node.clear()
                    node.update({"kind": "const", "value": 1.0})
                    yield f"kernel {ki} {section}[{oi}]: mask predicate removed", out
        loop = k.get("loop")
        if loop and loop.get("visible"):
            for p in _consts(loop["visible"]):
                out = copy.deepcopy(doc)
                c = _get(out["kernels"][ki]["loop"]["visible"], p)
                c["value"] = 1e9
                yield f"kernel {ki} loop.visible: constant 1e9", out
            out = copy.deepcopy(doc)
            del out["kernels"][ki]["loop"]["visible"]
            yield f"kernel {ki} loop.visible removed, masked_tile_skip still cited", out
        if loop:
            yield from _loop_axis_mutations(doc, ki, k)
    cert = doc["certificate"]
    writes = [w for k in cert["kernels"] for w in k["writes"]]
    if len(set(writes)) > 1:
        out = copy.deepcopy(doc)
        ks = out["certificate"]["kernels"]
        first = ks[0]["writes"][0]
        ks[0]["writes"][0] = next(w for w in writes if w != first)
        yield "kernel terms: swapped", out
    for j in range(len(cert["derived"])):
        out = copy.deepcopy(doc)
        out["certificate"]["derived"][j] = max(0, cert["derived"][j] - 1)
        yield f"derived[{j}] edited", out


def mutations(doc: dict) -> Iterator[tuple[str, dict]]:
    """Wrong variants of a certified plan document (see the module docstring)."""
    doc = copy.deepcopy(doc)
    doc["provenance"]["plan_hash"] = ""
    plan = Plan.model_validate(doc)
    yield from _step_mutations(doc, plan)
    yield from _kernel_mutations(doc)


def accepted(doc: dict, validate) -> bool:
    try:
        validate(doc)
    except PlanError:
        return False
    return True
