"""The repository keeps its promises: fixed top level, README and CI in step."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in section.splitlines() if ln.startswith("    ")]
    assert lines, f"README section {heading!r} has no command"
    return lines[0]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    test_cmd = _readme_block("Test")
    assert test_cmd in ci.splitlines()[-1] or any(ln.strip() == test_cmd for ln in ci.splitlines())


def test_ci_performs_the_readme_set_up() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    setup = _readme_block("Set up")
    venv, install = (part.strip() for part in setup.split("&&"))
    assert venv in ci
    assert install.replace(".venv/bin/python -m pip install", "").strip() in ci


def test_fixed_top_level() -> None:
    required = {"lakefile.lean", "lean-toolchain", "Superopt", "pyrunner", "pyproject.toml", "tests",
                "benchmarks", "README.md", ".ci"}
    present = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"}
    assert required <= present, f"missing at the top level: {sorted(required - present)}"
    ci = ROOT / ".ci" / "run"
    assert ci.is_file() and ci.stat().st_mode & 0o111, ".ci/run must be an executable script"


def test_schema_version_documented() -> None:
    from pyrunner.plan.schema import SCHEMA_VERSION

    schema = (ROOT / "pyrunner" / "schema" / "plan.schema.json").read_text()
    assert re.search(rf'"const":\s*{SCHEMA_VERSION}', schema) or f'"default": {SCHEMA_VERSION}' in schema


def _readme_commands(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return [ln.strip() for ln in section.splitlines() if ln.startswith("    ")]


def test_ci_runs_every_test_tier_the_readme_names() -> None:
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    tiers = [c for c in _readme_commands("Test") if "pytest" in c]
    assert len(tiers) >= 2, "README's Test section names the fast tier and the slow tier"
    for cmd in tiers:
        assert cmd in ci, f".ci/run does not run README's {cmd!r}"


def test_user_docs_stay_short_and_their_links_resolve() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    assert len((ROOT / "CONTRIBUTING.md").read_text().splitlines()) <= 100
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "docs").glob("*.md"))]
    for doc in docs:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links to missing {target}"
