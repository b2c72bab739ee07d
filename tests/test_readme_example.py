"""README's own-operator example is real: its graph plans to the plan and explanation README quotes."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _section(title: str) -> str:
    return (ROOT / "README.md").read_text().split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_readme_operator_plans_as_quoted() -> None:
    from pyrunner.ir.graph_json import graph_from_json
    from pyrunner.planner import explain, search

    text = _section("Your own operator")
    graph_text = text.split("```json", 1)[1].split("```", 1)[0]
    graph = graph_from_json(json.loads(graph_text))
    quoted = text.split("```\nplan ", 1)[1].split("```", 1)[0]
    (plan,) = search(graph, "bfloat16", top=1)
    now = explain(plan).rstrip("\n")
    assert now == ("plan " + quoted).rstrip("\n"), \
        f"README's --explain output for its example graph is stale; the planner now prints:\n{now}"
    hashes = set(re.findall(r"plan ([0-9a-f]{16})", text))
    assert hashes == {plan.provenance.plan_hash}
