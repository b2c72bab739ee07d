"""Compare two ``plan_snapshot.py`` folders case by case: what changed in the plans handed out, and how.

A byte diff of two snapshots says little once the cost model changes: every plan carries the model's
constants and predicted times (``cost``) and a hash over the whole plan, which the rendered TileLang
quotes, so a refit changes every file. This sorts each case (per tuning pass) into

- ``identical``: plans' JSON and rendered TileLang equal, comments aside;
- ``cost-only``: the same plans (kernels, tensors, configs, certificate) and the same code, comments and
  the plan hash aside; only the predicted times and the model's constants differ;
- ``structural``: a plan of the top ones, or its code, differs (listed with the plan numbers);
- ``failed``: the ``superopt`` exit code differs.

``python benchmarks/snapshot_compare.py /tmp/snap-before /tmp/snap-after`` prints the counts, then one line
per case that is not identical or cost-only. To snapshot an older commit, run this checkout's
``plan_snapshot.py`` there (``git worktree add /tmp/before REV``; copy the script into its ``benchmarks/``).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tokenize
from pathlib import Path

PASSES = ("no-tuning", "tuning")


def without_comments(src: str) -> str:
    """Python source with its comments and blank lines removed (``tokenize``, so a ``#`` in a string stays)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type != tokenize.COMMENT]
    return "\n".join(line.rstrip() for line in tokenize.untokenize(tokens).splitlines() if line.strip())


def _structure(doc: dict) -> dict:
    """A plan without its cost and its plan hash (which covers the cost)."""
    out = {k: v for k, v in doc.items() if k != "cost"}
    out["provenance"] = {k: v for k, v in doc.get("provenance", {}).items() if k != "plan_hash"}
    return out


def _case(folder: Path) -> tuple[str, list[dict], list[dict], list[str]]:
    """(exit line, plan structures, plan costs, renders without comments and with the plan hash blanked)."""
    notes = folder / "notes.txt"
    rc = notes.read_text().splitlines()[0] if notes.exists() else "missing"
    plans_file = folder / "plans.json"
    plans = json.loads(plans_file.read_text()) if plans_file.exists() else []
    if isinstance(plans, dict):  # `superopt --top 1` writes the one plan, not a list of one
        plans = [plans]
    renders = []
    for i, doc in enumerate(plans):
        f = folder / f"plan{i + 1}.py"
        src = without_comments(f.read_text()) if f.exists() else ""
        h = doc.get("provenance", {}).get("plan_hash")
        renders.append(src.replace(h, "<plan hash>") if h else src)
    return rc, [_structure(d) for d in plans], [d.get("cost") for d in plans], renders


def classify(before: Path, after: Path) -> tuple[str, str]:
    """One case folder's class (``identical``, ``cost-only``, ``structural``, ``failed``) and what differs."""
    ra, sa, ca, xa = _case(before)
    rb, sb, cb, xb = _case(after)
    if ra != rb:
        return "failed", f"{ra} -> {rb}"
    n = max(len(sa), len(sb))
    changed = [i + 1 for i in range(n) if sa[i:i + 1] != sb[i:i + 1] or xa[i:i + 1] != xb[i:i + 1]]
    if changed:
        return "structural", f"plans {changed} of {len(sa)} -> {len(sb)}"
    return ("identical", "") if ca == cb else ("cost-only", "")


def compare(before: Path, after: Path) -> dict[str, list[tuple[str, str]]]:
    """Every case in both snapshots by class (``pass/case``, detail); cases in one snapshot only under ``missing``."""
    out: dict[str, list[tuple[str, str]]] = {k: [] for k in ("identical", "cost-only", "structural", "failed",
                                                             "missing")}
    for p in PASSES:
        a = {d.name for d in (before / p).iterdir()} if (before / p).is_dir() else set()
        b = {d.name for d in (after / p).iterdir()} if (after / p).is_dir() else set()
        out["missing"] += [(f"{p}/{c}", "before only" if c in a else "after only") for c in sorted(a ^ b)]
        for c in sorted(a & b):
            kind, detail = classify(before / p / c, after / p / c)
            out[kind].append((f"{p}/{c}", detail))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    for d in (args.before, args.after):
        if not d.is_dir():
            print(f"error: {d} is not a snapshot folder", file=sys.stderr)
            return 2
    res = compare(args.before, args.after)
    print(", ".join(f"{k} {len(v)}" for k, v in res.items()))
    for kind in ("failed", "structural", "missing"):
        for case, detail in res[kind]:
            print(f"{kind}: {case}: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
