"""The plan store (``frontend.plan_store``): plans and derivations found again by another process, and only
for the graph, dtype, device, source, tuning database and switches they were made for; an entry edited or
misfiled is refused and planned again, never used."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from pyrunner.frontend import plan_store, region_plans, training
from pyrunner.ir import catalog
from pyrunner.plan.schema import plan_hash

ATTN = {"h": 2, "t_q": 64, "t_kv": 64, "d": 32}


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh store and empty process caches (as a second process would start)."""
    monkeypatch.setattr(plan_store, "ROOT", tmp_path)
    monkeypatch.setattr(region_plans, "_PLANS", {})
    monkeypatch.setattr(training, "_DERIVED", {})
    return tmp_path


def _new_process(monkeypatch: pytest.MonkeyPatch, *, plan: bool = True, derive: bool = True) -> None:
    """Empty the in-process caches; with ``plan``/``derive`` False, planning/choosing saves fails loudly."""
    monkeypatch.setattr(region_plans, "_PLANS", {})
    monkeypatch.setattr(training, "_DERIVED", {})

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("planned again: the store was not used")
    if not plan:
        monkeypatch.setattr(region_plans, "plan_region", refuse)
    if not derive:
        import pyrunner.planner.saves as saves
        monkeypatch.setattr(saves, "choose_saves", refuse)


def _files(root: Path, kind: str) -> list[Path]:
    return sorted(root.glob(f"*/{kind}/*.json"))


def test_a_stored_plan_is_found_by_the_next_process(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = catalog.get("Matmul", {"m": 64, "d": 64, "n": 64})
    first, hit = region_plans.cached_plan(g, "bfloat16")
    assert not hit and len(_files(store, "plans")) == 1
    _new_process(monkeypatch, plan=False)
    again, _ = region_plans.cached_plan(g, "bfloat16")
    assert plan_hash(again) == plan_hash(first)


def test_another_dtype_or_graph_is_planned_not_taken_from_the_store(store: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    region_plans.cached_plan(catalog.get("Matmul", {"m": 64, "d": 64, "n": 64}), "bfloat16")
    region_plans.cached_plan(catalog.get("Matmul", {"m": 64, "d": 64, "n": 64}), "float16")
    region_plans.cached_plan(catalog.get("Matmul", {"m": 64, "d": 128, "n": 64}), "bfloat16")
    assert len(_files(store, "plans")) == 3


def test_a_switch_flipped_opens_another_folder(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyrunner.planner.cost as cost

    g = catalog.get("Matmul", {"m": 64, "d": 64, "n": 64})
    region_plans.cached_plan(g, "bfloat16")
    _new_process(monkeypatch)
    monkeypatch.setattr(cost, "PHASED_BLOCKS", not cost.PHASED_BLOCKS)
    region_plans.cached_plan(g, "bfloat16")
    assert len({p.parent.parent for p in _files(store, "plans")}) == 2


def test_an_edited_plan_is_refused_and_planned_again(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    g = catalog.get("Matmul", {"m": 64, "d": 64, "n": 64})
    first, _ = region_plans.cached_plan(g, "bfloat16")
    (path,) = _files(store, "plans")
    entry = json.loads(path.read_text())
    entry["value"]["kernels"][0]["threads"] = "block_m"  # an edit the stored hash does not cover
    path.write_text(json.dumps(entry))
    _new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="pyrunner.frontend.plan_store"):
        again, _ = region_plans.cached_plan(g, "bfloat16")
    assert plan_hash(again) == plan_hash(first)
    assert "holds no valid plan" in caplog.text
    assert json.loads(path.read_text())["value"]["kernels"][0]["threads"] != "block_m"  # stored afresh


def test_an_entry_filed_under_another_key_is_not_used(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    small, big = catalog.get("Matmul", {"m": 64, "d": 64, "n": 64}), catalog.get("Matmul", {"m": 128, "d": 64, "n": 64})
    region_plans.cached_plan(small, "bfloat16")
    big_plan, _ = region_plans.cached_plan(big, "bfloat16")
    a, b = _files(store, "plans")
    a_text, b_text = a.read_text(), b.read_text()
    a.write_text(b_text)  # each entry under the other's name
    b.write_text(a_text)
    _new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="pyrunner.frontend.plan_store"):
        again, _ = region_plans.cached_plan(big, "bfloat16")
    assert plan_hash(again) == plan_hash(big_plan)
    assert "is not the entry for this graph" in caplog.text


def test_a_stored_derivation_is_replayed_with_its_saves(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = catalog.get("ScaledAttention", ATTN)
    first = training.derivation(g, "bfloat16")
    assert len(_files(store, "derivations")) == 1
    _new_process(monkeypatch, derive=False)
    again = training.derivation(g, "bfloat16")
    assert again.saved == first.saved and again.graph.outputs == first.graph.outputs


def test_a_derivation_for_some_inputs_is_filed_apart(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A region whose other inputs need no gradient (``wrt``) gets its own entry, replayed with only those
    gradients; the derivation for every input is another entry."""
    g = catalog.get("Matmul", {"m": 64, "d": 64, "n": 64})
    names = sorted(t.name for t in g.inputs())
    part = training.derivation(g, "bfloat16", wrt=frozenset(names[:1]))
    whole = training.derivation(g, "bfloat16")
    assert set(part.gradients.values()) == {names[0]} and set(whole.gradients.values()) == set(names)
    assert len(_files(store, "derivations")) == 2
    _new_process(monkeypatch, derive=False)
    again = training.derivation(g, "bfloat16", wrt=frozenset(names[:1]))
    assert set(again.gradients.values()) == {names[0]} and again.graph.outputs == part.graph.outputs


def test_a_derivation_of_another_graph_is_refused(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    g, other = catalog.get("RMSNorm", {"m": 64, "d": 64, "n": 64}), catalog.get("Matmul", {"m": 64, "d": 64, "n": 64})
    training.derivation(g, "bfloat16")
    training.derivation(other, "bfloat16")
    paths = _files(store, "derivations")
    entries = [json.loads(p.read_text()) for p in paths]
    for p, e, o in zip(paths, entries, reversed(entries), strict=True):
        p.write_text(json.dumps({"key": e["key"], "value": o["value"]}))  # the right key, another's record
    _new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="pyrunner.frontend.plan_store"):
        again = training.derivation(g, "bfloat16")
    assert "derives another graph" in caplog.text
    assert again.graph.name == training.derivation(g, None).graph.name


def test_without_a_store_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_store, "ROOT", None)
    monkeypatch.setattr(region_plans, "_PLANS", {})
    region_plans.cached_plan(catalog.get("Matmul", {"m": 64, "d": 64, "n": 64}), "bfloat16")
    assert not list(tmp_path.iterdir())


def test_a_store_named_by_a_string_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_store, "ROOT", None)
    monkeypatch.setattr(region_plans, "_PLANS", {})
    plan_store.use(str(tmp_path))
    try:
        region_plans.cached_plan(catalog.get("Matmul", {"m": 64, "d": 64, "n": 64}), "bfloat16")
    finally:
        plan_store.use(None)
    assert len(_files(tmp_path, "plans")) == 1
