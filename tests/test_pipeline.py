"""``pipeline.best_plan``: one entry point for the plan a user gets, whichever door it comes through.

The ``superopt`` command and a library call give byte-identical plans for the same graph, dtype and
tuning file; the frontend's call site (``search(graph, dtype)[0]``) can take ``best_plan`` instead; the
lowering gate's notes come back through the ``notes`` callback, nothing is printed; the tuning
database is read only when passed.
"""

from __future__ import annotations

import json

import pytest

from pyrunner import cli
from pyrunner.backend.tilelang.backend import BACKENDS, TileLangBackend, backend_for
from pyrunner.backend.tilelang.hopper import HOPPER
from pyrunner.ir import catalog
from pyrunner.pipeline import LOWER_CHECK_SPARES, Note, best_plan
from pyrunner.plan.schema import plan_document
from pyrunner.planner import search
from pyrunner.target import tuning as tuning_mod
from pyrunner.target.tuning import TuningDB

SIZES = {"m": 128, "d": 256, "n": 256}


def _tuned_file(tmp_path, graph) -> tuple:
    """A tuning file holding another config of ``graph``'s best bf16 plan: it must change the plan handed out."""
    (plan,) = best_plan(graph, "bfloat16", lower_check=False)
    (k,) = plan.kernels
    name, values = next((p, v) for p, v in sorted(k.params.items()) if len(v) > 1)
    cfg = {k.name: {**k.defaults, name: next(v for v in values if v != k.defaults[name])}}
    db = TuningDB(tmp_path / "h200.json")
    db.record(plan, cfg, 0.5, "h200")
    return db.save(), cfg


def test_cli_and_best_plan_give_byte_identical_plans(tmp_path, capsys) -> None:
    graph = catalog.get("Matmul", SIZES)
    path, cfg = _tuned_file(tmp_path, graph)
    out = tmp_path / "plans.json"
    shapes = [f"--shape={a}={n}" for a, n in SIZES.items()]
    assert cli.main(["superopt", "Matmul", *shapes, "--dtype", "bf16", "--top", "2", "--tuning", str(path),
                     "--out", str(out)]) == 0
    plans = best_plan(graph, "bfloat16", top=2, tuning=TuningDB.load(path), lower_check=False)
    assert out.read_text() == json.dumps([plan_document(p) for p in plans], indent=2) + "\n"
    first = json.loads(out.read_text())[0]
    assert first["cost"]["total_us"] == 0.5  # the tuning file was used, at its config
    assert {k["name"]: k["defaults"] for k in first["kernels"]} == cfg


def test_cli_without_tuning_ignores_the_database(tmp_path, capsys) -> None:
    graph = catalog.get("Matmul", SIZES)
    out = tmp_path / "plan.json"
    shapes = [f"--shape={a}={n}" for a, n in SIZES.items()]
    assert cli.main(["superopt", "Matmul", *shapes, "--dtype", "bf16", "--no-tuning", "--out", str(out)]) == 0
    (plan,) = best_plan(graph, "bfloat16", lower_check=False)
    assert out.read_text() == json.dumps(plan_document(plan), indent=2) + "\n"


def test_cli_plans_with_the_committed_database_by_default() -> None:
    args = cli.build_parser().parse_args(["superopt", "Matmul"])
    assert cli._tuning(args).path == TuningDB.for_device("h200").path
    args = cli.build_parser().parse_args(["superopt", "Matmul", "--no-tuning"])
    assert cli._tuning(args) is None


def test_missing_tuning_file_is_one_error_line(tmp_path, capsys) -> None:
    code = cli.main(["superopt", "Matmul", "--tuning", str(tmp_path / "nope.json")])
    err = capsys.readouterr().err
    assert code == 2 and [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: --tuning: tuning database {str(tmp_path / 'nope.json')!r} does not exist"]


def test_library_calls_do_not_read_the_committed_database(monkeypatch) -> None:
    def refuse(*a, **k):
        raise AssertionError("the committed tuning database was read")

    monkeypatch.setattr(TuningDB, "for_device", classmethod(refuse))
    graph = catalog.get("Matmul", SIZES)
    assert best_plan(graph, "bf16", lower_check=False) == search(graph, "bf16")[:1]
    with pytest.raises(AssertionError):
        tuning_mod.committed_tuning()


def test_the_frontend_call_site_can_take_best_plan() -> None:
    """``frontend.compile`` takes ``search(graph, dtype)[0]``; ``best_plan(graph, dtype)[0]`` is the same
    plan where the best plan builds (the lowering check on here when TileLang is installed)."""
    graph = catalog.get("RMSNorm", SIZES)
    notes: list[Note] = []
    (plan,) = best_plan(graph, "float16", notes=notes.append)
    if not any(n.kind == "skipped" for n in notes):
        assert plan == search(graph, "float16")[0]
    assert all(n.kind != "no-fused" for n in notes)


def test_skips_come_back_as_notes_and_nothing_is_printed(capsys) -> None:
    graph = catalog.get("RMSNorm", SIZES)
    ranked = search(graph, "bf16", top=1 + LOWER_CHECK_SPARES)
    assert len(ranked) >= 2

    class Refuses(TileLangBackend):
        """A backend whose lowering check refuses the best-ranked plan."""

        def lowering_problem(self, plan):
            return "no layout" if plan.provenance.plan_hash == ranked[0].provenance.plan_hash else None

    notes: list[Note] = []
    (plan,) = best_plan(graph, "bf16", backend=Refuses("refuses", HOPPER), notes=notes.append)
    assert plan == ranked[1]
    assert [n.kind for n in notes] == ["checking", "skipped"]
    assert notes[0].count == len(ranked) and "no layout" in notes[1].text and "plan 1" in notes[1].text
    assert capsys.readouterr() == ("", "")


def test_no_ranked_plan_builds_gives_the_naive_plan() -> None:
    graph = catalog.get("RMSNorm", SIZES)

    class OnlyNaive(TileLangBackend):
        def lowering_problem(self, plan):
            return None if plan.provenance.planner.endswith("-naive") else "no layout"

    notes: list[Note] = []
    (plan,) = best_plan(graph, "bf16", backend=OnlyNaive("only-naive", HOPPER), notes=notes.append)
    assert plan == search(graph, "bf16", naive=True)[0]
    assert [n.kind for n in notes][-2:] == ["naive-fallback", "no-fused"]


def test_the_devices_and_an_unknown_one_is_one_error_line(capsys) -> None:
    assert set(BACKENDS) == {"h200", "h100", "a100"} and backend_for("H200").device is HOPPER.device
    assert HOPPER.target == {"kind": "cuda", "arch": "sm_90a"}
    assert backend_for("a100").target.arch == "sm_80"
    assert cli.main(["superopt", "Matmul", "--device", "v100"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: --device 'v100': no backend for that device; known: a100, h100, h200\n"
