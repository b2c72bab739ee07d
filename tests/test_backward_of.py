"""A backward plan records its derivation (``provenance.backward_of``), the validator replays it, and every
check draws the plan's saved tensors from its forward inputs (issue 44).

Drawn on their own, a backward's saved log-sum-exp does not belong to the scores it recomputes, and a check
of the plan file alone judged it on values no forward produces (its outlier draw fell back to magnitudes
of 5 or 2.5, or failed on the GPU where ``exp(S - LSE)`` left the dtype)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyrunner.cli import main
from pyrunner.ir.graph_json import graph_from_json
from pyrunner.plan.backward_of import derivation_of
from pyrunner.plan.schema import Plan, plan_document, plan_hash
from pyrunner.plan.validate import load_plan, plan_graph, validate_plan
from pyrunner.planner.aliases import graph_hash
from pyrunner.run import executor, runner
from pyrunner.run.executor import execute
from pyrunner.run.shrink import scale_down
from pyrunner.run.verify import GpuVerifier

SHAPE = ["--shape", "h=2", "--shape", "t_q=256", "--shape", "t_kv=256", "--shape", "d=32"]
"""Where the backward is two kernels: at t = 64 it is one, whose tighter a-priori bound leaves the planted draw
ill-conditioned in fp16 (``PlantedDraw.accepts``), so no planted draw would be checked."""


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``superopt ScaledAttention --backward`` at a small shape, saved as a file (fp16: the narrow dtype)."""
    path = tmp_path_factory.mktemp("bwd") / "bwd.plan.json"
    assert main(["superopt", "ScaledAttention", "--backward", "--dtype", "fp16", *SHAPE, "--no-lower-check",
                 "--out", str(path)]) == 0
    return path


def _belongs(inputs: dict[str, np.ndarray]) -> float:
    """Largest gap between the drawn log-sum-exp and the one of the drawn Q and K's scaled scores."""
    s = np.einsum("hqd,hkd->hqk", inputs["Q"], inputs["K"]) / np.sqrt(inputs["Q"].shape[-1])
    m = s.max(axis=-1)
    lse = np.log(np.exp(s - m[..., None]).sum(axis=-1)) + m
    return float(np.max(np.abs(np.asarray(inputs["LSE_P"]) - lse)))


def test_the_plan_records_its_derivation(saved_plan: Path) -> None:
    doc = json.loads(saved_plan.read_text())
    rec = doc["provenance"]["backward_of"]
    assert rec["forward"]["name"] == "ScaledAttention" and rec["outputs"] == ["O"]
    assert rec["wrt"] == ["K", "Q", "V"]
    bwd = derivation_of(load_plan(saved_plan))
    assert bwd is not None and "LSE_P" in bwd.saved and bwd.cotangents == {"d_O": "O"}
    assert plan_hash(Plan.model_validate(doc)) == doc["provenance"]["plan_hash"]  # the record is hashed


def test_run_checks_a_saved_backward_plan_on_outlier_and_planted_draws(saved_plan: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)  # no nvcc: the CPU check is what is tested
    seen: list[dict[str, np.ndarray]] = []

    def recording(plan, inputs, *a, **kw):
        seen.append(dict(inputs))
        return execute(plan, inputs, *a, **kw)

    monkeypatch.setattr(executor, "execute", recording)
    code = main(["run", str(saved_plan), "--small", "--no-baselines", "--seed", "0", "--quiet",
                 "--log", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0, out
    flat = " ".join(out.split())
    assert "on outlier inputs (up to 20)" in flat and "on planted inputs" in flat
    assert len(seen) == 3
    assert max(_belongs(x) for x in seen) < 0.05  # the LSE is the drawn scores' own (fp16-rounded Q, K)


def test_the_gpu_check_draws_saved_tensors_from_the_forward(saved_plan: Path, executor_launch) -> None:
    plan = load_plan(saved_plan)
    verifier = GpuVerifier(plan, plan_graph(plan), seed=0, device="cpu")
    labels = [label for label, _ in verifier.draws]
    assert labels[:2] == ["", "on outlier inputs (up to 20)"] and labels[2].startswith("on planted inputs"), labels
    for _, d in verifier.draws:
        assert _belongs({k: v.double().numpy() for k, v in d.inputs.items()}) < 0.05
    res = verifier.check(executor_launch(plan))
    assert res.ok and res.draws == ["normal", "outlier", "planted"], res.message


def _forged(doc: dict, *, graph: bool = False) -> dict:
    """``doc`` with its hashes made to match its (edited) content, as a forger would."""
    if graph:
        doc["provenance"]["graph_hash"] = graph_hash(plan_graph(Plan.model_validate(doc)))
    doc["provenance"]["plan_hash"] = ""
    doc["provenance"]["plan_hash"] = plan_hash(Plan.model_validate(doc))
    return doc


def _refused(doc: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> str:
    path = tmp_path / "edited.plan.json"
    path.write_text(json.dumps(doc))
    for argv in (["validate", str(path)], ["run", str(path), "--small", "--quiet", "--log", str(tmp_path / "r.jsonl"),
                                          "--out", str(tmp_path / "out")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.jsonl").exists()
    return err


def _node(graph: dict, op: str) -> dict:
    return next(n for n in graph["nodes"] if n.get("op") == op)


def test_an_edited_backward_graph_is_refused(saved_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    doc = json.loads(saved_plan.read_text())
    _node(doc["graph"], "rsqrt")["op"] = "sqrt"  # the backward's score scale, record and hashes kept consistent
    err = _refused(_forged(doc, graph=True), tmp_path, capsys)
    assert "provenance.backward_of" in err and "is not the backward" in err


@pytest.mark.parametrize("forgery", ["scale", "saves", "output", "term", "graph"])
def test_a_forged_record_is_refused(saved_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                    forgery: str) -> None:
    doc = json.loads(saved_plan.read_text())
    rec = doc["provenance"]["backward_of"]
    if forgery == "scale":  # a forward graph that derives another backward
        _node(rec["forward"], "rsqrt")["op"] = "sqrt"
    elif forgery == "saves":  # drop the saved scores, or save them where the planner recomputes them
        first_matmul = next(i for i, t in enumerate(graph_from_json(rec["forward"]).terms()) if t.op == "matmul")
        rec["save"] = [] if rec["save"] else [first_matmul]
    elif forgery == "output":
        rec["outputs"] = ["O\n../x"]
    elif forgery == "term":
        rec["save"] = [10**6]
    else:
        rec["forward"]["nodes"][0]["args"] = ["Q", "nowhere"]
    err = _refused(_forged(doc), tmp_path, capsys)
    assert "provenance.backward_of" in err and "../x\n" not in err


def test_without_the_record_a_plan_is_checked_as_before(saved_plan: Path) -> None:
    doc = json.loads(saved_plan.read_text())
    del doc["provenance"]["backward_of"]
    plan = validate_plan(_forged(doc))
    assert derivation_of(plan) is None and "backward_of" not in plan_document(plan)["provenance"]
    verifier = GpuVerifier(plan, plan_graph(plan), seed=0, device="cpu")
    assert _belongs({k: v.double().numpy() for k, v in verifier.draws[0][1].inputs.items()}) > 1.0  # drawn alone


def test_the_cpu_check_shape_keeps_the_record(saved_plan: Path) -> None:
    small = scale_down(load_plan(saved_plan))
    bwd = derivation_of(small)  # replayed at the new sizes: the forward graph was resized with the plan's
    assert bwd is not None and bwd.graph.sizes == plan_graph(small).sizes != plan_graph(load_plan(saved_plan)).sizes


@pytest.mark.slow  # plans forward-with-saves and backward twice: about a minute on the 2-core machine
def test_training_plans_record_the_derivation() -> None:
    """The training path (``plan_training``, ``load(plan, backward=True)``) hands out backward plans that carry
    their record, and the record replays to the derivation the path used."""
    from pyrunner.frontend.trainable import Trainable
    from pyrunner.frontend.training import plan_training
    from pyrunner.ir import catalog

    graph = catalog.get("ScaledAttention", {"h": 2, "t_q": 64, "t_kv": 64, "d": 32})
    tp = plan_training(graph, "float16", cpu_check=True)
    assert tp.backward is not None and "backward CPU-checked" in tp.check
    bwd = derivation_of(validate_plan(plan_document(tp.backward)))
    assert bwd is not None and bwd.graph.outputs == tp.bwd.graph.outputs and bwd.saved == tp.bwd.saved
    trainable = Trainable(tp.forward)
    again = derivation_of(trainable.plans.backward)
    assert again is not None and again.saved == trainable.plans.bwd.saved
