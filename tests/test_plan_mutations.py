"""100 edited plans, none of which passes the CPU check (issue 46, "What it must show").

Plans of the catalog and the corpus are edited where the CPU check used to be blind: a mask predicate
negated, the constant a mask compares an index with (a window, a band, a causal offset) moved, the
partial last tile of an output zeroed (a tail), an arithmetic constant negated. Each edit keeps a
well-formed plan with its hash recomputed, and the plan is read schema-only (no certificate replay),
so the CPU check alone stands between the edit and a pass: at the shapes ``cpu_check_plan`` chooses,
with ``audit`` on, on both of its draws (normal inputs, then outliers), every edited plan must fail.
Edits that cannot change a value are not made: constants below 1e-3 in magnitude (an epsilon) or 1e4
and above (a masked-out fill), and zeros.

Before the outlier draw, 1 of the 100 passed: attention with sinks with the 0.125 scale negated in the
kernel computing the softmax's row maximum. That maximum is only the exponent's shift, so the edit changes
nothing until the shifted exponent overflows, which N(0, 0.5) inputs never reach
(tests/test_outlier_check.py holds that plan as a fast test).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import Plan, plan_document, with_hash
from pyrunner.planner import search
from pyrunner.planner.search import Budget
from pyrunner.run.executor import execute
from pyrunner.run.runner import graph_of
from pyrunner.run.shrink import cpu_check_plan
from pyrunner.run.verify import verify_executor

ROOT = Path(__file__).resolve().parent.parent
WANTED = 100
SMALL = 256
"""Largest axis extent the base plans are planned at (the CPU check then runs near their real shapes)."""
WORK = 4000
"""Partition-search work per base plan: small, so planning a hundred graphs stays minutes (the plans
still fuse; what is edited is what they hold, not how good they are)."""
NEGATED = {"lt": "le", "le": "lt"}
"""not (a < b) is b <= a, and not (a <= b) is b < a: a predicate is negated by swapping its operands
and trading lt for le (plan expressions compare with these two only)."""

Path_ = tuple[object, ...]


def _walk(x: object, path: Path_ = ()) -> Iterator[tuple[Path_, dict]]:
    if isinstance(x, dict):
        yield path, x
        for k, v in x.items():
            yield from _walk(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _walk(v, (*path, i))


def _indexed(node: dict) -> bool:
    """Whether an expression reads a loop or grid index (a mask's operand)."""
    return any(n.get("kind") == "index" for _, n in _walk(node))


def _number(value: object) -> bool:
    """A finite constant written as a number (the schema writes infinities as strings)."""
    return isinstance(value, (int, float)) and value == value and abs(value) < 1e300


def _material(value: object) -> bool:
    return _number(value) and value != 0.0 and 1e-3 <= abs(value) < 1e4  # type: ignore[operator]


def _moved(v: float) -> float:
    """A mask constant's edit: a window or band doubled, a small offset moved by one."""
    return float(v * 2 if abs(v) >= 2 else v + 1)


def _sites(doc: dict) -> dict[str, list[Path_]]:
    """Where each kind of edit can be made in a plan document (paths into ``doc``).

    Mask predicates are those comparing indices with each other or with a constant (causal, window,
    band); a tail guard (an index against its axis's ``size``) is edited by the tail kind instead, as
    negating it can keep every value (a row maximum taken over the padding only still shifts a softmax
    exactly). A mask constant is edited only where it or its edit falls inside the indexed axes'
    extents: a 1024-wide window over 256 positions masks nothing, and neither does a 2048-wide one."""
    extents = {a: n for t in doc["tensors"] for a, n in zip(t["axes"], t["shape"], strict=True)}
    out: dict[str, list[Path_]] = {"predicate": [], "mask constant": [], "constant": [], "tail": []}
    compared: set[Path_] = set()
    for path, node in _walk(doc["kernels"], ("kernels",)):
        if not (node.get("kind") == "call" and node.get("fn") in NEGATED and _indexed(node)):
            continue
        inner = [n for _, n in _walk(node)]
        for sub, n in _walk(node, path):
            if n.get("kind") == "const":
                compared.add(sub)
        if any(n.get("kind") == "size" for n in inner):
            continue
        out["predicate"].append(path)
        reach = max((extents.get(n["axis"], 0) for n in inner if n.get("kind") == "index"), default=0)
        for sub, n in _walk(node, path):
            v = n.get("value") if n.get("kind") == "const" else None
            if _number(v) and min(abs(v), abs(_moved(v))) < reach:  # type: ignore[arg-type]
                out["mask constant"].append(sub)
    for path, node in _walk(doc["kernels"], ("kernels",)):
        if node.get("kind") == "const" and path not in compared and _material(node["value"]):
            out["constant"].append(path)
    for ki, k in enumerate(doc["kernels"]):
        for oi, op in enumerate(k["epilogue"]):
            if op["op"] == "store":
                out["tail"].append(("kernels", ki, "epilogue", oi))
    return out


def _at(doc: dict, path: Path_) -> dict:
    node: object = doc
    for p in path:
        node = node[p]  # type: ignore[index]
    return node  # type: ignore[return-value]


def _tail_axis(doc: dict, store: dict) -> tuple[str, int] | None:
    """The axis of a stored tensor and the first index of its last tile (or last row when tiles divide)."""
    tensor = next(t for t in doc["tensors"] if t["name"] == store["dst"])
    sizes = dict(zip(tensor["axes"], tensor["shape"], strict=True))
    axis = max(sizes, key=lambda a: sizes[a])
    if sizes[axis] < 2:
        return None
    return axis, max(1, sizes[axis] - 1)


def _edit(doc: dict, kind: str, path: Path_) -> dict | None:
    """``doc`` with one edit of ``kind`` at ``path`` (None when it would change nothing)."""
    out = copy.deepcopy(doc)
    if kind == "predicate":
        node = _at(out, path)
        node["fn"] = NEGATED[node["fn"]]
        node["args"] = node["args"][::-1]
    elif kind == "mask constant":
        node = _at(out, path)
        node["value"] = _moved(node["value"])
    elif kind == "constant":
        node = _at(out, path)
        node["value"] = -node["value"]
    else:  # tail: the store's last row along its longest axis zeroed
        kernel = _at(out, path[:2])
        store = _at(out, path)
        tail = _tail_axis(out, store)
        if tail is None:
            return None
        axis, bound = tail
        keep = {"kind": "call", "fn": "lt", "args": [{"kind": "index", "axis": axis},
                                                     {"kind": "const", "value": float(bound)}]}
        kernel["epilogue"].insert(path[3], {"op": "map", "dst": store["src"], "expr": {
            "kind": "call", "fn": "where", "args": [keep, {"kind": "ref", "buf": store["src"]},
                                                    {"kind": "const", "value": 0.0}]}})
    return out


def _base_graphs() -> Iterator[tuple[str, object]]:
    for name, make in catalog.CATALOG.items():
        g = make()
        yield f"catalog:{name}", catalog.get(name, {a: min(n, SMALL) for a, n in g.sizes.items()})
    for d in (ROOT / "tests" / "data", ROOT / "benchmarks" / "graphs"):
        for p in sorted(d.glob("*.json")):
            g = load_graph_file(p)
            yield str(p.relative_to(ROOT)), g.with_sizes({a: min(n, SMALL) for a, n in g.sizes.items()})


KINDS = ("predicate", "mask constant", "tail", "constant")
MASK_CONSTANTS = """With every axis at most SMALL long, one mask constant of the catalog and corpus bites: the band
width of benchmarks/graphs/band_mask_softmax.json. The sliding window (1024) and the causal prefix (1792)
exceed the extents, and the other masks compare two indices (causal). So that kind is held to one edit."""
PER_KIND = WANTED // len(KINDS)


def _mutants() -> list[tuple[str, str, dict]]:
    """``WANTED`` (source, edit, edited plan document) triples, the kinds taken in turn: base plans are
    planned until every kind has ``PER_KIND`` sites or the graphs run out (mask sites are only in
    masked graphs, so those plans are edited at several sites), each kind's sites spread over its
    plans; a kind short of sites leaves its turns to the others."""
    pools: dict[str, list[tuple[str, dict, Path_]]] = {k: [] for k in KINDS}
    for source, g in _base_graphs():
        if all(len(p) >= PER_KIND for p in pools.values()):
            break
        try:
            plan = search(g, "fp16", tuning=False, budget=Budget(WORK))[0]
        except Exception:  # noqa: BLE001, S112 - a graph the planner refuses at these shapes has no plan to edit
            continue
        doc = plan_document(plan)
        for kind, paths in _sites(doc).items():
            pools[kind].extend((source, doc, path) for path in paths[:4])
    for kind in KINDS:  # one site per plan first, then the second of each, ...
        rank: dict[str, int] = {}
        order = []
        for source, doc, path in pools[kind]:
            rank[source] = rank.get(source, -1) + 1
            order.append((rank[source], len(order), (source, doc, path)))
        pools[kind] = [x for *_, x in sorted(order, key=lambda o: o[:2])]
    out: list[tuple[str, str, dict]] = []
    taken = dict.fromkeys(KINDS, 0)
    while len(out) < WANTED and any(taken[k] < len(pools[k]) for k in KINDS):
        for kind in KINDS:
            while taken[kind] < len(pools[kind]) and len(out) < WANTED:
                source, doc, path = pools[kind][taken[kind]]
                taken[kind] += 1
                edited = _edit(doc, kind, path)
                if edited is not None:
                    out.append((source, kind, edited))
                    break
    return out


@pytest.mark.slow
def test_a_hundred_edited_plans_all_fail_the_cpu_check() -> None:
    passed: list[str] = []
    kinds: dict[str, int] = {}
    mutants = _mutants()
    for source, kind, doc in mutants:
        plan = with_hash(Plan.model_validate(doc))
        small = cpu_check_plan(plan)
        res = verify_executor(small, graph_of(small), partial(execute, audit=True), seed=11)
        if res.ok:
            passed.append(f"{source} ({kind}): {res.message}")
        kinds[kind] = kinds.get(kind, 0) + 1
    assert not passed, f"{len(passed)} of {len(mutants)} edited plans pass the CPU check:\n" + "\n".join(passed)
    assert len(mutants) == WANTED, f"only {len(mutants)} plans could be edited"
    assert all(kinds.get(k, 0) >= 10 for k in KINDS if k != "mask constant"), kinds
    assert kinds.get("mask constant", 0) >= 1, (kinds, MASK_CONSTANTS)


def test_each_edit_changes_the_plan_it_is_made_in() -> None:
    """The edits the slow test relies on find their sites and change the document (fast tier)."""
    g = catalog.sliding_window_attention(h=1, t_q=256, t_kv=256, d=32, window=64)
    doc = plan_document(search(g, "fp16", tuning=False, budget=Budget(WORK))[0])
    sites = _sites(doc)
    for kind in KINDS:
        assert sites[kind], kind
        edited = _edit(doc, kind, sites[kind][0])
        assert edited is not None and edited != doc, kind
        Plan.model_validate(edited)
