"""Which GPU sweep cases a change re-renders: the cases to sweep again after a full sweep.

A full sweep costs most of a GPU session, so a change after one is swept on the cases whose
rendered TileLang it changes, and every other case is shown byte-identical. This script plans the
best plan of every case ``gpu_sweep.py`` would collect (same options), renders it with its default
config and hashes the source (plan hash, the config-space listing and the cost model's
estimate masked: none reaches the compiled kernel), once in a checkout of ``--base`` and once in
this tree, and writes the ids that differ, one per line, for ``gpu_sweep.py --cases @FILE``. Runs on the CPU:

    python benchmarks/changed_cases.py --base ff9bea0 --out /tmp/changed.txt -- --shapes small,real,odd --random 10

``--built`` hashes what each case's build functions make at its default config (TileLang's
TVMScript of every prim_func) instead of the source text: the kernels the GPU would compile. A
rendered branch the case's config does not take, such as the persistent form of a kernel whose
grid fits one wave, then changes nothing. It needs TileLang (no GPU) and takes a few times longer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def case_hashes(root: Path, sweep_args: argparse.Namespace, built: bool = False) -> dict[str, str]:
    """Case id -> hash of its rendered source, planned with the code under ``root``; ``built``: of the
    prim_funcs its build functions make at the default config instead (TileLang's TVMScript of each,
    needs TileLang but no GPU), so a branch of the source that config does not take changes nothing."""
    for p in (root, root / "benchmarks", root / "tests"):
        sys.path.insert(0, str(p))
    import gpu_sweep

    # the default device as the tree under ``root`` names it (``target.tuning`` re-exports it in every tree)
    from pyrunner.target.tuning import DEFAULT_DEVICE

    out: dict[str, str] = {}
    device = getattr(sweep_args, "device", None) or DEFAULT_DEVICE
    with tempfile.TemporaryDirectory(prefix="changed_cases_built_") as tmp:
        for n, case in enumerate(gpu_sweep.collect(sweep_args)):
            out[case.id] = _case_hash(case, built, Path(tmp) / f"case_{n}.py", device)
    return out


def _plan_and_source(case, device: str) -> tuple[object, str]:
    """The case's plan and rendered source as ``gpu_sweep --device`` plans and renders them: the backend of
    ``device`` with its committed tuning database."""
    from pyrunner.backend.tilelang.render import render
    from pyrunner.ir.graph_json import graph_from_json
    from pyrunner.pipeline import best_plan
    from pyrunner.target.tuning import DEFAULT_DEVICE, committed_tuning

    if getattr(case, "backward", False) or getattr(case, "saving", False):  # a training half, as gpu_sweep plans it
        import gpu_sweep

        from pyrunner.backend.tilelang.backend import backend_for

        backend = backend_for(device)
        plan, _ = gpu_sweep.plan_case(case, backend, {})
        return plan, render(plan, backend.target)
    graph = graph_from_json(case.graph)
    if device == DEFAULT_DEVICE:  # the default backend: also what a tree from before ``--device`` plans, renders
        (plan,) = best_plan(graph, case.dtype, tuning=committed_tuning())
        return plan, render(plan)
    from pyrunner.backend.tilelang.backend import backend_for

    backend = backend_for(device)
    (plan,) = best_plan(graph, case.dtype, backend=backend, tuning=committed_tuning(backend.device.name))
    return plan, render(plan, backend.target)


def masked(src: str) -> str:
    """Rendered source without what never reaches a compiled kernel: the config-space listing and the cost
    model's estimate (the caller replaces the plan hash)."""
    src = re.sub(r"CONFIG_SPACE = \{.*?\n\}", "", src, flags=re.S)
    return re.sub(r"^Cost model estimate:.*?(?=^Provenance:)", "", src, flags=re.S | re.M)


def _case_hash(case, built: bool, module_path: Path, device: str) -> str:
    """Hash of one case's rendered source (or built prim_funcs) for the backend of ``device``; an error counts
    as a change."""
    try:
        plan, src = _plan_and_source(case, device)
        src = src.replace(plan.provenance.plan_hash, "PLAN")
        if built:
            from pyrunner.backend.tilelang.compile import load_module

            module = load_module(src, module_path)
            src = "\n".join(f"{k}\n{f.script()}" for k, f in module.build_kernels().items())
        return hashlib.sha256(masked(src).encode()).hexdigest()[:16]
    except Exception as e:  # noqa: BLE001 - a case that no longer plans counts as changed
        return f"error: {e}"


def _hashes_in(roots: list[Path], sweep_args: dict, work: Path) -> list[dict[str, str]]:
    """``case_hashes`` of each tree, side by side in fresh interpreters, so each imports its own
    pyrunner (the sweep options travel parsed, as JSON: an older tree's gpu_sweep.py need only
    have ``collect``)."""
    options = work / "sweep_args.json"
    dests = [work / f"hashes_{i}.json" for i in range(len(roots))]
    built = ["--built"] if sweep_args.pop("_built", False) else []
    options.write_text(json.dumps(sweep_args, default=str))
    procs = [subprocess.Popen([sys.executable, __file__, "--hash-tree", str(root), str(options), str(dest), *built],
                              cwd=root) for root, dest in zip(roots, dests, strict=True)]
    # a tree that fails stops the other: the folder both write into goes when this returns
    while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs):
        time.sleep(0.5)
    if any(p.poll() for p in procs):
        for p in procs:
            if p.poll() is None:
                p.terminate()
            p.wait()
        raise SystemExit("changed_cases: error: hashing a tree failed (its output is above)")
    return [json.loads(d.read_text()) for d in dests]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    sweep_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="git revision the last full sweep ran on")
    ap.add_argument("--out", type=Path, help="file for the changed case ids (default: stdout)")
    ap.add_argument("--built", action="store_true",
                    help="compare the prim_funcs each case builds at its default config (needs TileLang; slower), "
                         "not the rendered text")
    ap.add_argument("--hash-tree", nargs=3, metavar=("ROOT", "OPTIONS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.hash_tree:
        root, options, dest = (Path(x) for x in args.hash_tree)
        sweep_args = argparse.Namespace(**json.loads(options.read_text()))
        dest.write_text(json.dumps(case_hashes(root, sweep_args, built=args.built), indent=1))
        return 0
    if not args.base:
        ap.error("--base REV is required")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_sweep

    sweep = {**vars(gpu_sweep.parser().parse_args(sweep_argv)), "_built": args.built}
    if sweep.get("switch"):
        ap.error("--switch is not compared across trees: benchmarks/switch_cases.py lists what a switch changes")
    with tempfile.TemporaryDirectory(prefix="changed_cases_") as tmp:
        work = Path(tmp)
        base_tree = work / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_tree), args.base],
                       check=True)
        try:
            before, after = _hashes_in([base_tree, ROOT], sweep, work)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)
    changed = [c for c in after if before.get(c) != after[c]]
    text = "".join(f"{c}\n" for c in changed)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    what = "build different prim_funcs" if args.built else "render differently"
    print(f"{len(changed)} of {len(after)} case(s) {what} from {args.base}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
