"""The prefetch helper (``planner.prefetch``) decides who computes a kernel, never which plan comes out.

The helper is a forked process that lowers and prices the kernels of the last derivation variants while
the search works through the first ones. These tests plan with and without it and compare the plan
bytes: served every entry it could have sent, helped by a real fork, and with a helper that dies.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from pyrunner.ir import catalog
from pyrunner.ir.graph_json import load_graph_file
from pyrunner.plan.schema import canonical_json, plan_document
from pyrunner.planner import prefetch

search_module = importlib.import_module("pyrunner.planner.search")
TWO_CPUS = prefetch.usable_cpus() >= 2 and prefetch.can_fork()


def _plan_bytes(graph, top: int = 3) -> list[str]:
    return [canonical_json(plan_document(p)) for p in search_module.search(graph, "bf16", top=top)]


def _alone(graph, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    with monkeypatch.context() as m:
        m.setattr(prefetch, "ENABLED", False)
        return _plan_bytes(graph)


def _record_starts(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every ``Prefetch`` the search starts (None where it ran alone), kept for the test to read."""
    started: list = []
    real = prefetch.start

    def start(*args):
        started.append(real(*args))
        return started[-1]

    monkeypatch.setattr(prefetch, "start", start)
    return started


class _Served:
    """Stands in for the helper's pipe: every entry a helper would send, already there."""

    def __init__(self, entries: dict, table) -> None:
        self.entries, self.table, self.taken = entries, table, 0

    def reached(self, i: int) -> None:
        pass

    def next_pass(self, listed) -> None:
        pass

    def take(self, key):
        data = self.entries.pop(key, None)
        if data is None:
            return None
        self.taken += 1
        return self.table.loads(data)

    def close(self) -> None:
        pass


def _serve_helper_entries(graph, monkeypatch: pytest.MonkeyPatch, met_at: int = 0) -> tuple[dict, list[_Served]]:
    """Run a helper's first pass in this process (a second planner, so its terms are other objects than
    the search's) down to variant ``met_at``, through the pickling, and have every search take from it.
    Returns the entries sent and the stand-ins the searches got."""
    helper = search_module.Planner(graph, "bf16")
    variants = helper.variants()
    table = prefetch._Shared(t for v in variants for t in v.graph.terms())
    entries: dict = {}
    helper._helper(variants, lambda k, v: entries.setdefault(k, table.dumps(v)), lambda p, i: i < met_at,
                   lambda p: None)
    served: list[_Served] = []

    def start(n, shared, work):
        served.append(_Served(dict(entries), table))
        return served[-1]

    monkeypatch.setattr(prefetch, "start", start)
    return entries, served


def test_a_search_served_every_prefetched_kernel_gives_the_same_plans(monkeypatch):
    graph = catalog.get("Attention")
    alone = _alone(graph, monkeypatch)
    assert len(search_module.Planner(graph, "bf16").variants()) >= prefetch.MIN_VARIANTS
    entries, served = _serve_helper_entries(graph, monkeypatch)
    kinds = {k[0] if isinstance(k[0], str) else "kernel" for k in entries}
    assert kinds == {"kernel", "tile", "verdicts"}
    assert _plan_bytes(graph) == alone
    assert served and served[0].taken > 100  # the search took the helper's kernels, not its own


@pytest.mark.parametrize("met_at", [6, 18])
def test_kernels_lowered_for_other_variants_merge_as_the_search_own_would(met_at, monkeypatch):
    """The helper meets the search at variant ``met_at``: the search lowers the first variants' kernels
    and takes the rest, whose roots are another planner's equal terms. A merge once built its cone
    from both and read a root's equal below another root as a leaf (the top plan changed); merges now
    map roots to the partition's own terms first."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs" / "kl_rows.json"
    graph = load_graph_file(path)
    graph = graph.with_sizes({a: min(n, 1024) for a, n in graph.sizes.items()})
    alone = _alone(graph, monkeypatch)
    _, served = _serve_helper_entries(graph, monkeypatch, met_at)
    assert _plan_bytes(graph) == alone
    assert served[0].taken > 0


@pytest.mark.skipif(not TWO_CPUS, reason="the helper runs only with fork and two usable CPUs")
@pytest.mark.parametrize("name", ["Attention", "LayerNormMatmul"])
def test_a_forked_helper_leaves_the_plans_byte_identical(name, monkeypatch):
    graph = catalog.get(name)
    started = _record_starts(monkeypatch)
    helped = _plan_bytes(graph)
    assert started and started[0] is not None
    assert helped == _alone(graph, monkeypatch)


@pytest.mark.skipif(not TWO_CPUS, reason="the helper runs only with fork and two usable CPUs")
def test_a_helper_that_fails_leaves_the_search_to_finish_alone(monkeypatch):
    graph = catalog.get("Attention")

    def broken(self, *args):
        raise RuntimeError("the helper fails at once")

    with monkeypatch.context() as m:
        m.setattr(search_module.Planner, "_helper", broken)
        helped = _plan_bytes(graph)
    assert helped == _alone(graph, monkeypatch)


def test_no_helper_is_forked_from_a_thread_other_than_the_main_one():
    import threading

    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(prefetch.can_fork()))
    thread.start()
    thread.join()
    assert got == [False]


@pytest.mark.slow
@pytest.mark.skipif(not TWO_CPUS, reason="the helper runs only with fork and two usable CPUs")
def test_the_qk_norm_attention_plans_the_same_with_the_helper_doing_part_of_the_work(monkeypatch):
    graph = load_graph_file(Path(__file__).parent / "data" / "attention_qk_norm.json")
    started = _record_starts(monkeypatch)
    helped = _plan_bytes(graph)
    assert started[0] is not None and started[0].taken > 0
    assert helped == _alone(graph, monkeypatch)
