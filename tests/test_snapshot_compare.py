"""benchmarks/snapshot_compare.py: two plan snapshots sorted into identical, cost-only and structural cases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import snapshot_compare as sc  # noqa: E402

SOURCE = '''"""TileLang kernels for plan {h}."""
PLAN_HASH = '{h}'  # the plan's hash
# --- kernel 'k0' (plan {h}) ---
def k0():
    s = "# not a comment"
    return {block}
'''


def _plan(h: str, block: int = 64, time_us: float = 2.0) -> dict:
    return {"kernels": [{"name": "k0", "defaults": {"block_m": block}}], "cost": {"total_us": time_us},
            "provenance": {"planner": "superopt-python", "plan_hash": h}}


def _case(root: Path, name: str, plans: list[dict], sources: list[str], rc: int = 0, tuning: str = "tuning") -> None:
    d = root / tuning / name
    d.mkdir(parents=True)
    (d / "notes.txt").write_text(f"rc {rc}\n")
    (d / "plans.json").write_text(json.dumps(plans))
    for i, src in enumerate(sources):
        (d / f"plan{i + 1}.py").write_text(src)


def test_cases_are_sorted_by_what_changed(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    src = SOURCE.format(h="aaaa", block=64)
    _case(a, "same", [_plan("aaaa")], [src])
    _case(b, "same", [_plan("aaaa")], [src.replace("# the plan's hash", "# renamed comment")])
    _case(a, "refit", [_plan("aaaa")], [src])
    _case(b, "refit", [_plan("bbbb", time_us=1.5)], [SOURCE.format(h="bbbb", block=64)])
    _case(a, "config", [_plan("aaaa"), _plan("cccc")], [src, SOURCE.format(h="cccc", block=128)])
    _case(b, "config", [_plan("aaaa"), _plan("dddd", block=32)], [src, SOURCE.format(h="dddd", block=32)])
    _case(a, "code", [_plan("aaaa")], [src])
    _case(b, "code", [_plan("aaaa")], [src.replace('"# not a comment"', '"# another string"')])
    _case(a, "fails", [_plan("aaaa")], [src])
    _case(b, "fails", [], [], rc=1)
    _case(a, "gone", [_plan("aaaa")], [src])
    res = sc.compare(a, b)
    assert res["identical"] == [("tuning/same", "")] and res["cost-only"] == [("tuning/refit", "")]
    assert res["structural"] == [("tuning/code", "plans [1] of 1 -> 1"), ("tuning/config", "plans [2] of 2 -> 2")]
    assert res["failed"] == [("tuning/fails", "rc 0 -> rc 1")] and res["missing"] == [("tuning/gone", "before only")]
    assert sc.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("identical 1, cost-only 1, structural 2, failed 1, missing 1\n")
    assert "structural: tuning/config: plans [2] of 2 -> 2" in out


def test_a_missing_folder_is_one_error_line(tmp_path: Path, capsys) -> None:
    assert sc.main([str(tmp_path / "nothing"), str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nothing'} is not a snapshot folder\n"


def test_a_top_one_snapshot_holds_one_plan_not_a_list(tmp_path: Path) -> None:
    """`superopt --top 1` writes the plan itself; it compares like a list of one."""
    a, b = tmp_path / "a", tmp_path / "b"
    src = SOURCE.format(h="aaaa", block=64)
    _case(a, "one", [_plan("aaaa")], [src])
    _case(b, "one", [], [src])
    (b / "tuning" / "one" / "plans.json").write_text(json.dumps(_plan("aaaa")))
    assert sc.compare(a, b)["identical"] == [("tuning/one", "")]
