"""Planner switches flipped by the benchmarks (benchmarks/switches.py, switch_cases.py, gpu_ab.py): a case a
switch changes is listed, one it cannot change is not (and its second search is skipped soundly), and the
A/B's planning half says which cases it would time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_ab  # noqa: E402
import switch_cases  # noqa: E402
import switches  # noqa: E402
from gpu_sweep import Case  # noqa: E402

from pyrunner.ir import catalog  # noqa: E402
from pyrunner.ir.graph_json import graph_to_json  # noqa: E402
from pyrunner.plan.schema import canonical_json  # noqa: E402
from pyrunner.planner import cost  # noqa: E402
from pyrunner.target import fit  # noqa: E402

ASYNC = "fit.ASYNC_PARTIAL_TILES"
PARTIAL = {"h": 2, "t_q": 128, "t_kv": 400, "d": 64}
"""Off, no asynchronous step divides 400 keys, so the scores go through global memory (two kernels); on, one
kernel streams 128-wide steps, the last one partial (as attention over 4000 keys at the real shape)."""
WHOLE = {"h": 2, "t_q": 128, "t_kv": 128, "d": 64}


def _case(sizes: dict[str, int]) -> Case:
    return Case("Attention@test/bf16", "catalog", graph_to_json(catalog.get("Attention", sizes)), "small")


def test_the_listing_names_the_case_async_partial_tiles_changes() -> None:
    """Attention over 400 keys plans one kernel instead of two with the switch on; over 128 keys nothing has a
    partial tile, so the first search never reads the switch at a decision, the second search is skipped,
    and the case is not listed."""
    (changed,) = switch_cases.compare_case(_case(PARTIAL), [ASYNC], "h200", False)
    assert changed["changed"] and changed["searched"], changed
    assert (len(changed["off"]["kernels"]), len(changed["on"]["kernels"])) == (2, 1), changed
    (same,) = switch_cases.compare_case(_case(WHOLE), [ASYNC], "h200", False)
    assert not same["changed"] and not same["searched"], same
    assert fit.ASYNC_PARTIAL_TILES is True  # restored to its default


def test_a_skipped_second_search_finds_what_a_real_one_finds() -> None:
    """Where the probe says the switch decided nothing, searching again with it on gives the same plan bytes."""
    from pyrunner.planner import search

    graph = catalog.get("Attention", WHOLE)
    with switches.probed([ASYNC]) as probes:
        (off,) = search(graph, "bf16", top=1, tuning=False)
    assert not probes[ASYNC].read
    with switches.switched({ASYNC: True}):
        (on,) = search(graph, "bf16", top=1, tuning=False)
    assert canonical_json(on.model_dump()) == canonical_json(off.model_dump())


def test_switches_parse_set_and_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    region_plans = types.ModuleType("fake_region_plans")  # the frontend's caches, without importing torch
    region_plans._PLANS = {}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_region_plans", region_plans)
    monkeypatch.setattr(switches, "CACHES", (("fake_region_plans", "_PLANS"),))
    assert switches.parse_all(["async_partial_tiles=1,cost.PHASED_BLOCKS=off"]) == {ASYNC: True,
                                                                                     "cost.PHASED_BLOCKS": False}
    assert switches.parse("pyrunner.planner.cost.PHASED_BLOCKS") == ("cost.PHASED_BLOCKS", True)
    with pytest.raises(ValueError, match="unknown switch"):
        switches.parse("fit.NO_SUCH=1")
    with pytest.raises(ValueError, match="value must be"):
        switches.parse("cost.PHASED_BLOCKS=maybe")
    region_plans._PLANS[("stale", "bf16", None)] = None  # type: ignore[attr-defined]
    with switches.switched({"cost.PHASED_BLOCKS": False}):
        assert cost.PHASED_BLOCKS is False and not region_plans._PLANS
    assert cost.PHASED_BLOCKS is True


def test_switch_cases_writes_the_list_gpu_sweep_reads(tmp_path: Path) -> None:
    import gpu_sweep

    graph = tmp_path / "attn400.json"
    graph.write_text(json.dumps(graph_to_json(catalog.get("Attention", PARTIAL))))
    sweep = ["--only", "attn400", "--graph", str(graph), "--shapes", "real", "--random", "0"]
    assert switch_cases.main(["--switch", ASYNC, "--out-dir", str(tmp_path), "--", *sweep]) == 0
    listed = tmp_path / f"{ASYNC}.txt"
    assert listed.read_text() == "attn400@real/bf16\n"
    args = gpu_sweep.parser().parse_args([*sweep, "--cases", f"@{listed}", "--switch", f"{ASYNC}=1"])
    assert [c.id for c in gpu_sweep.collect(args)] == ["attn400@real/bf16"]


@pytest.mark.parametrize("argv", [["--switch", "fit.NOPE"], ["--switch", ASYNC, "--jobs", "0"],
                                  ["--switch", ASYNC, "--", "--switch", ASYNC]])
def test_switch_cases_argument_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        switch_cases.main(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--feature", "no_such"], ["--feature", "phased_blocks", "--workloads", "NoSuch"],
                                  ["--feature", "phased_blocks", "--workloads", "Attention:t_kv=many"],
                                  ["--feature", "pdl", "--dtypes", "float8"]])
def test_gpu_ab_argument_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        gpu_ab.main([*argv, "--plan-only"])
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_ab_plan_only_says_which_switch_cases_it_would_time(tmp_path: Path) -> None:
    """The switch's two arms are searched apart, through TileLang's lowering gate as the sweep plans (about 20
    s): over 400 keys they differ (off, the two-kernel plan does not lower and three kernels are handed out;
    on, one), so the case would be timed; over 128 keys they do not."""
    spec = ";".join(f"{a}={n}" for a, n in PARTIAL.items())
    whole = ";".join(f"{a}={n}" for a, n in WHOLE.items())
    assert gpu_ab.main(["--plan-only", "--feature", "async_partial_tiles", "--out", str(tmp_path),
                        "--workloads", f"Attention:{spec},Attention:{whole}"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "ab.jsonl").read_text().splitlines()]
    assert [r["status"].split(":")[0] for r in rows] == ["planned", "skipped"], rows
    assert len(rows[0]["without_kernels"]) > 1 and len(rows[0]["with_kernels"]) == 1, rows[0]
    assert fit.ASYNC_PARTIAL_TILES is True  # restored to its default


def test_sweep_and_grad_bench_refuse_unknown_switches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_sweep
    import grad_bench

    assert gpu_sweep.main(["--dry", "--switch", "fit.NOPE=1", "--out", str(tmp_path)]) == 2
    assert "error: unknown switch" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        grad_bench.main(["--small", "--ab-switch", "nope"])
    assert e.value.code == 2 and "error: unknown switch" in capsys.readouterr().err


def test_a_guard_the_default_config_decides_alike_is_not_listed() -> None:
    """decode_matvec at its real shape (m 1, d 4096, n 4096): the switch drops the divisibility test on m from
    the rendered guard of its GEMM mainloop, but at its default config (256 threads, 64 rows for one row) the
    guard's other conditions keep the synchronous form either way, so the same kernel is built: not listed."""
    import gpu_sweep

    args = gpu_sweep.parser().parse_args(["--only", "decode_matvec", "--shapes", "real", "--random", "0"])
    (case,) = gpu_sweep.collect(args)
    (rec,) = switch_cases.compare_case(case, [ASYNC], "h200", False)
    assert rec["guard_only"] and not rec["changed"], rec
