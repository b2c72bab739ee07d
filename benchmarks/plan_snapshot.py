"""Snapshot what ``superopt`` hands out, to show a refactor leaves plans unchanged.

For every catalog workload (at small shapes, to stay fast), a few graph files, and a few default-shape
cases the committed tuning database has measured, this runs the ``superopt`` command in-process with
``--top 3`` (the lowering check on), once with the tuning database absent (an empty
``SUPEROPT_TUNING_DIR``) and once present (the committed one), and writes per case the plans' JSON,
the notes the command printed and the rendered TileLang source of each plan::

    python benchmarks/plan_snapshot.py --out /tmp/snap-before
    ... change the code ...
    python benchmarks/plan_snapshot.py --out /tmp/snap-after
    diff -r /tmp/snap-before /tmp/snap-after

``--backward`` snapshots the derived graphs instead: per catalog workload (small shapes, bf16) the
forward with its saves (``superopt --with-saves``) and the backward (``superopt --backward``).
``--no-lower-check`` hands out the model's top plans without lowering them in TileLang (about 7x faster over
the corpus; the renders are still compared, and the check's verdict is a function of them).
``benchmarks/snapshot_compare.py BEFORE AFTER`` sorts the cases into identical, cost-only (same plans and
code, other predicted times: a cost-model change) and structural changes, where ``diff -r`` shows every
file of every plan once the cost model changed.

Outputs belong in /tmp, never in git.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = 256
"""Largest axis extent of a catalog workload in the snapshot."""
GRAPHS = ("tests/data/attention_alibi.json", "tests/data/gated_reglu.json",
          "tests/data/elementwise_where_softplus.json", "benchmarks/graphs/rmsnorm_gelu_up.json",
          "benchmarks/graphs/softmax_rows_odd_1000.json", "benchmarks/graphs/decode_matvec.json")
TUNED = (("RMSNorm", "fp16"), ("LayerNormMatmul", "bf16"), ("ScaledAttention", "bf16"))
"""Catalog workloads at their default sizes, where the committed tuning database has entries."""


CORPUS = ("tests/data", "benchmarks/graphs")
"""Folders of graph files ``--corpus`` adds (every one, at axes capped like ``GRAPHS``)."""


def cases(quick: bool, corpus: bool = False, backward: bool = False) -> list[tuple[str, list[str]]]:
    """(case name, superopt arguments) pairs (``backward``: the derived forward-with-saves and backward)."""
    from pyrunner.ir import catalog

    out: list[tuple[str, list[str]]] = []
    if backward:
        for name, make in catalog.CATALOG.items():
            shapes = [f"--shape={a}={min(n, SMALL)}" for a, n in make().sizes.items()]
            for flag in ("--with-saves", "--backward"):
                out.append((f"{name}-bf16-small{flag.removeprefix('-')}", [name, *shapes, "--dtype", "bf16", flag]))
        return out
    for name, make in catalog.CATALOG.items():
        shapes = [f"--shape={a}={min(n, SMALL)}" for a, n in make().sizes.items()]
        out.append((f"{name}-fp16-small", [name, *shapes, "--dtype", "fp16"]))
    paths = list(GRAPHS)
    if corpus:
        paths += [str(p.relative_to(ROOT)) for d in CORPUS for p in sorted((ROOT / d).glob("*.json"))
                  if str(p.relative_to(ROOT)) not in GRAPHS]
    for path in paths:
        g = json.loads((ROOT / path).read_text())
        shapes = [f"--shape={a}={min(n, 4 * SMALL)}" for a, n in g.get("axes", {}).items()]
        stem = Path(path).stem if path in GRAPHS else f"{Path(path).parent.name}-{Path(path).stem}"
        out.append((f"{stem}-bf16", ["--graph", str(ROOT / path), *shapes, "--dtype", "bf16"]))
    if not quick:
        out += [(f"{name}-{dtype}-default", [name, "--dtype", dtype]) for name, dtype in TUNED]
    return out


def snapshot(out: Path, only: str | None, quick: bool, corpus: bool = False, backward: bool = False,
             lower_check: bool = True) -> None:
    from pyrunner.backend.tilelang.render import render
    from pyrunner.cli import main
    from pyrunner.plan.validate import validate_plan

    empty = Path(tempfile.mkdtemp(prefix="snap-no-tuning-"))
    for tuning in ("no-tuning", "tuning"):
        for name, argv in cases(quick, corpus, backward):
            if only and only not in name:
                continue
            d = out / tuning / name
            d.mkdir(parents=True, exist_ok=True)
            plans_file = d / "plans.json"
            err = io.StringIO()
            saved = os.environ.get("SUPEROPT_TUNING_DIR")
            if tuning == "no-tuning":
                os.environ["SUPEROPT_TUNING_DIR"] = str(empty)
            try:
                with contextlib.redirect_stderr(err):
                    rc = main(["superopt", *argv, "--top", "3", "--out", str(plans_file),
                               *([] if lower_check else ["--no-lower-check"])])
            finally:
                if saved is None:
                    os.environ.pop("SUPEROPT_TUNING_DIR", None)
                else:
                    os.environ["SUPEROPT_TUNING_DIR"] = saved
            (d / "notes.txt").write_text(f"rc {rc}\n" + err.getvalue())
            if rc == 0:
                for i, doc in enumerate(json.loads(plans_file.read_text())):
                    (d / f"plan{i + 1}.py").write_text(render(validate_plan(doc)))
            print(f"{tuning}/{name}: rc {rc}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder to write the snapshot to (under /tmp)")
    ap.add_argument("--only", help="only the cases whose name contains this")
    ap.add_argument("--quick", action="store_true", help="leave out the default-shape tuned cases")
    ap.add_argument("--corpus", action="store_true",
                    help="also every graph file of tests/data and benchmarks/graphs (axes capped at 1024)")
    ap.add_argument("--backward", action="store_true",
                    help="the derived forward-with-saves and backward graphs of the catalog instead")
    ap.add_argument("--no-lower-check", dest="lower_check", action="store_false",
                    help="hand out the model's top plans without lowering them (superopt --no-lower-check)")
    args = ap.parse_args()
    snapshot(args.out, args.only, args.quick, args.corpus, args.backward, args.lower_check)


if __name__ == "__main__":
    main()
