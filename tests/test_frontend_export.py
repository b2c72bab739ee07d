"""Export: every catalog plan becomes one standalone module (tilelang + torch only) that parses,
imports on a machine without a GPU, lowers to CUDA for sm_90a, and checks its arguments."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from pyrunner.cli import main
from pyrunner.frontend.export import WRAPPER, export_source
from pyrunner.ir import catalog
from pyrunner.planner import search


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _imports(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add((node.module or "").split(".")[0])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("workload", list(catalog.CATALOG))
def test_export_standalone_and_lowers(workload: str, tmp_path: Path) -> None:
    import tilelang
    from tvm.target import Target

    plan = search(catalog.get(workload), "fp16")[0]
    src = export_source(plan)
    tree = ast.parse(src)
    assert _imports(tree) == {"tilelang", "torch"}
    doc = ast.get_docstring(tree)
    assert plan.provenance.plan_hash in doc
    assert all(st.rule in doc for st in plan.derivation)
    path = tmp_path / "kernel.py"
    path.write_text(src)
    before = {m for m in sys.modules if m.startswith("pyrunner")}
    mod = _import(path, f"exported_{workload}")
    assert {m for m in sys.modules if m.startswith("pyrunner")} == before
    graph_inputs = [n for n in plan.graph["inputs"]]
    params = list(ast.parse(src).body[-1].args.args)
    assert [a.arg for a in params] == graph_inputs
    funcs = mod.build_kernels()
    last = plan.kernels[-1].name
    with Target(mod.TARGET) as target:
        cuda = tilelang.lower(funcs[last], target=target).kernel_source
    assert "__global__" in cuda


def test_exported_wrapper_checks_arguments(tmp_path: Path) -> None:
    plan = search(catalog.get("Matmul", {"m": 64, "d": 128, "n": 128}), "fp16")[0]
    path = tmp_path / "mm.py"
    path.write_text(export_source(plan))
    fwd = getattr(_import(path, "exported_mm_checks"), WRAPPER)
    x, w = torch.zeros(64, 128, dtype=torch.float16), torch.zeros(128, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"input 'X' must be \(64, 128\) torch.float16"):
        fwd(x.float(), w)
    with pytest.raises(ValueError, match="input 'W' must be"):
        fwd(x, w[:64])
    with pytest.raises(ValueError, match="input 'X' is on cpu"):
        fwd(x, w)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        fwd(x.numpy(), w)


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = search(catalog.get("SwiGLU", {"m": 64, "d": 128, "n": 128}), "bf16")[0]
    pj = tmp_path / "plan.json"
    pj.write_text(plan.model_dump_json())
    out = tmp_path / "kernel.py"
    assert main(["export", str(pj), "--out", str(out)]) == 0
    assert out.read_text() == export_source(plan)
    assert main(["export", str(tmp_path / "missing.json"), "--out", str(out)]) == 2
    assert "error: " in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1}')
    assert main(["export", str(bad), "--out", str(tmp_path / "x.py")]) == 2
    assert not (tmp_path / "x.py").exists()
